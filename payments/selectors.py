"""Read side of payments. Every client-facing read is scoped to the client's accounts."""

from __future__ import annotations

import base64
import binascii
import uuid
from datetime import UTC, datetime

from django.contrib.auth.models import AbstractBaseUser
from django.db import connections
from django.db.models import CharField, DateTimeField, F, Field, Func, QuerySet, UUIDField, Value
from django.db.models.lookups import LessThan

from ledger.models import Account
from scheduler_project.rows import RowReader

from .exceptions import InvalidRequest, NotFound
from .models import Payment


def partitions_of(payment_ids: list[str]) -> dict[str, int]:
    """Payment id → partition, for re-publishing chunk items to their queues."""
    rows = Payment.objects.filter(pk__in=payment_ids).values_list("pk", "partition")
    return {str(pk): partition for pk, partition in rows}


def payments_for_client(client: AbstractBaseUser) -> QuerySet[Payment]:
    """The client's payments: those from accounts it owns (``Payment.owner``, no join)."""
    return Payment.objects.filter(owner=client)


_CLIENT_PAYMENT = RowReader(
    Payment, sql="FROM {0} WHERE {0.pk} = %s AND {0.owner} = %s", params=["id", "owner"]
)


def payment_get(*, client: AbstractBaseUser, payment_id: uuid.UUID) -> Payment:
    """The client's payment ``payment_id`` (``payments_for_client``), else ``NotFound``.

    The status read of every client, so a ``RowReader`` (one fixed SELECT by
    primary key and owner) rather than a queryset compiled per request.
    """
    row = _CLIENT_PAYMENT.one(payment_id, client.pk)
    if row is None:
        raise NotFound(f"Payment {payment_id} not found.", payment_id=str(payment_id))
    return row[0]


def encode_cursor(*parts: object) -> str:
    raw = "|".join(p.isoformat() if isinstance(p, datetime) else str(p) for p in parts)
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, count: int) -> list[str]:
    try:
        raw = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raw = ""
    parts = raw.split("|")
    if len(parts) != count:
        raise InvalidRequest("Invalid cursor.", fields={"cursor": "not a cursor from this API"})
    return parts


def decode_id_cursor(cursor: str) -> int:
    """The integer id carried by a cursor from ``encode_cursor(id)``."""
    (raw,) = decode_cursor(cursor, 1)
    if not (raw.isascii() and raw.isdigit()):  # "²".isdigit(), yet int("²") raises
        raise InvalidRequest("Invalid cursor.", fields={"cursor": "not a cursor from this API"})
    return int(raw)


def payment_list(
    *,
    client: AbstractBaseUser,
    account_id: int | None = None,
    status: str | None = None,
    limit: int = 20,
    cursor: str | None = None,
) -> tuple[list[Payment], str | None]:
    """A page of the client's payments, newest first, and the cursor of the next page.

    Keyset pagination on ``(created_at, id)``: stable while payments are
    added or change state, and as cheap on page 1,000 as on page 1. Each
    filter combination has an index that yields rows in page order, starting
    at the cursor: ``payments_by_owner``, ``payments_by_owner_status`` and,
    with ``account_id``, ``payments_by_account``.
    """
    qs = payments_for_client(client)
    if account_id is not None:
        if not Account.objects.filter(pk=account_id, owner=client).exists():
            # Not the client's (or no such account): nothing to list, and no
            # scan — filtered on the owner's index, another client's account
            # read every payment of the caller to return an empty page
            return [], None
        qs = qs.filter(from_account_id=account_id)
    if status:
        qs = qs.filter(status=status)
    return newest_first_page(qs, cursor=cursor, limit=limit)


class _Row(Func):
    """A row value ``(a, b)``, compared column by column (PostgreSQL and SQLite)."""

    template = "(%(expressions)s)"
    output_field = Field()


SQLITE_TIME_TEXT = "%Y-%m-%d %H:%M:%f"  # strftime: seconds with milliseconds (SS.SSS)


def _sqlite_normal(value) -> Func:
    """``strftime(SQLITE_TIME_TEXT, value)``: the one text form (milliseconds, as
    SQLite's own ``%f`` rounds them) a datetime column and a cursor are compared in."""
    return Func(Value(SQLITE_TIME_TEXT), value, function="strftime", output_field=CharField())


def newest_first_page(qs: QuerySet, *, cursor: str | None, limit: int) -> tuple[list, str | None]:
    """Keyset page on ``(created_at, id)`` descending (UUID primary keys).

    The cursor condition is the row comparison ``(created_at, id) < (c, i)``,
    which PostgreSQL uses as an index condition on ``(…, created_at DESC, id
    DESC)``: the scan starts at the cursor. The equivalent ``created_at < c OR
    (created_at = c AND id < i)`` is only a filter, so a deep page read and
    discarded every row before it.

    SQLite keeps datetimes as text and compares them as text, in whatever
    format each row was written: ``YYYY-MM-DD HH:MM:SS.fff`` by the database
    (``db_default=Now()``), ``….ffffff`` by Django for a Python datetime (the
    services stamp ``created_at`` themselves), no fraction at all for a whole
    second. Compared as written, a row could sort after its own cursor and
    rows of one instant came back on the next page, or not at all. There
    both the order and the cursor condition use one normal form,
    ``strftime(SQLITE_TIME_TEXT, …)`` of the column and of the cursor's time alike
    (milliseconds, rounded by SQLite itself; ties go by id).
    """
    sqlite = connections[qs.db].vendor == "sqlite"
    created = "created_at"
    if sqlite:
        qs = qs.annotate(created_text=_sqlite_normal(F("created_at")))
        created = "created_text"
    if cursor:
        created_raw, id_raw = decode_cursor(cursor, 2)
        try:
            created_at = datetime.fromisoformat(created_raw)
            last_id = uuid.UUID(id_raw)
            if created_at.tzinfo is None:  # ours always carry their offset
                raise ValueError(created_raw)
            # in range once in UTC: year 1 at +14:00 is not (SQLite's path raised
            # OverflowError from Django's conversion: a 500)
            created_at = created_at.astimezone(UTC)
        except (ValueError, OverflowError):
            raise InvalidRequest(
                "Invalid cursor.", fields={"cursor": "not a cursor from this API"}
            ) from None
        bound = Value(created_at, output_field=DateTimeField())
        if sqlite:
            bound = _sqlite_normal(bound)
        qs = qs.filter(
            LessThan(
                _Row(F(created), F("id")),
                _Row(bound, Value(last_id, output_field=UUIDField())),
            )
        )
    rows = list(qs.order_by(f"-{created}", "-id")[: limit + 1])
    return cut_page(rows, limit, lambda row: (row.created_at, row.pk))


def id_page(
    qs: QuerySet, *, cursor: str | None, limit: int, oldest_first: bool = False
) -> tuple[list, str | None]:
    """Keyset page on an integer id, newest first (or ``oldest_first``); the
    cursor is ``encode_cursor(id)``."""
    if cursor:
        after = decode_id_cursor(cursor)
        qs = qs.filter(pk__gt=after) if oldest_first else qs.filter(pk__lt=after)
    rows = list(qs.order_by("pk" if oldest_first else "-pk")[: limit + 1])
    return cut_page(rows, limit, lambda row: (row.pk,))


def cut_page(rows: list, limit: int, key) -> tuple[list, str | None]:
    """``limit + 1`` rows read → the page and the cursor after its last row
    (``encode_cursor(*key(row))``), or ``None`` when nothing follows. Every
    keyset page of the API ends here."""
    if len(rows) > limit:
        return rows[:limit], encode_cursor(*key(rows[limit - 1]))
    return rows, None
