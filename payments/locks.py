"""Row locks of the payments app, in one place (like Saleor's ``lock_objects.py``).

Lock order, everywhere: client user row (quota checks), recurring schedule,
payment row(s) in ascending id order, then the ledger's accounts in ascending
id order and their holds (``ledger.services.LedgerBatch``). A transaction
takes them in that order or not at all, so two of them cannot deadlock.
The executor may add more payment rows after its chunk's own
(``lock_due_queued``), but only with ``SKIP LOCKED``: a lock it never waits
for cannot close a cycle. A message with partitions locks even its own rows
with ``SKIP LOCKED`` (``lock_chunk(skip_locked=True)``) and hands back those
another transaction holds.

``FOR NO KEY UPDATE`` everywhere: it does not conflict with the ``FOR KEY
SHARE`` locks that inserts of referencing rows (events, attempts, postings)
take, so writing a payment's history never waits for its row lock. ``of
("self",)`` keeps a ``select_related`` join from locking the joined row too.
SQLite (the embedded default) ignores these clauses: it has one writer at a time.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Collection, Iterable
from datetime import datetime

from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection

from ledger.db import binary_cursor, instances, select_list

from .clock import db_now
from .exceptions import NotFound
from .models import Payment, PaymentStatus, RecurringPayment, RecurringStatus

# Columns the executor never reads (nor writes): left in the table, not parsed
# for 200 rows a chunk — ``metadata`` is a JSON document each.
EXECUTOR_UNREAD = ("metadata", "run_at", "created_at", "owner")


@functools.cache
def _executor_columns() -> frozenset[str]:
    return frozenset(
        f.attname for f in Payment._meta.concrete_fields if f.name not in EXECUTOR_UNREAD
    )


# The executor's two locks on PostgreSQL as SQL of their own (the querysets
# below are the SQLite form): compiling the two querysets took a tenth of a
# 45-payment chunk's CPU, and the clock costs no round trip of its own here.
_LOCK_CHUNK_SQL = """
SELECT clock_timestamp(), {columns}
  FROM "payments_payment"
 WHERE id = ANY(%b::uuid[])
 ORDER BY id
   FOR NO KEY UPDATE{skip}
"""
# status as a literal, so the partial index on QUEUED (partition, due_at) is
# provably usable whatever plan the statement gets
_LOCK_DUE_QUEUED_SQL = """
SELECT {columns}
  FROM "payments_payment"
 WHERE status = 'QUEUED'
   AND partition = ANY(%b::integer[])
   AND due_at <= %b
   AND lease_expires_at > %b
   AND attempts = 1
   AND NOT (id = ANY(%b::uuid[]))
 ORDER BY due_at
 LIMIT %b
   FOR NO KEY UPDATE SKIP LOCKED
"""


def lock_chunk(
    payment_ids: Iterable[str], *, skip_locked: bool = False
) -> tuple[datetime, list[Payment]]:
    """The database clock, and a chunk's payments locked in id order (the
    executor); missing ids are left out.

    First in the executor's order: payments, then the accounts and holds of
    all of them (``LedgerBatch``). On PostgreSQL one statement: the clock is
    the first row's ``clock_timestamp()`` (read by itself when no row is
    found), taken as the rows are locked — any reading within the
    transaction serves, since a payment runs only if due by it.

    ``skip_locked``: a row another transaction holds (usually another
    worker's collapse, which took it in) is left out like a missing one
    instead of waited for; ``queued_in_flight`` tells the two apart. SQLite
    has one writer at a time and nothing to skip.
    """
    ids = list(payment_ids)
    if connection.vendor != "postgresql":
        now = db_now()
        return now, list(
            Payment.objects.select_for_update(no_key=True, of=("self",))
            .defer(*EXECUTOR_UNREAD)
            .filter(pk__in=ids)
            .order_by("pk")
        )
    columns = _executor_columns()
    sql = _LOCK_CHUNK_SQL.format(
        columns=select_list(Payment, columns), skip=" SKIP LOCKED" if skip_locked else ""
    )
    with binary_cursor(binary_results=True) as cursor:
        cursor.execute(sql, [ids])
        rows = cursor.fetchall()
    if not rows:
        return db_now(), []
    return rows[0][0], instances(Payment, columns, (row[1:] for row in rows))


def queued_in_flight(payment_ids: Collection[str]) -> dict[str, tuple[int, int]]:
    """Of ``payment_ids``, those still QUEUED as the last commit left them:
    id → (fence, partition). No lock: read for the ids ``lock_chunk`` skipped,
    a row held by a transaction not yet committed shows its state before it."""
    rows = Payment.objects.filter(
        pk__in=list(payment_ids), status=PaymentStatus.QUEUED
    ).values_list("pk", "fence", "partition")
    return {str(pk): (fence, partition) for pk, fence, partition in rows}


def lock_due_queued(
    partitions: Collection[int], *, now: datetime, limit: int, exclude: Iterable[str] = ()
) -> list[Payment]:
    """Lock up to ``limit`` more QUEUED payments of ``partitions`` that are due at
    ``now`` (database clock), on their first claim and with a live lease,
    oldest due first — the executor's collapse (DESIGN §4.1).

    ``SKIP LOCKED``: a row another executor (or a cancel) holds is left to it,
    never waited for. ``exclude`` are the chunk's own ids, locked already. An
    expired lease is the reaper's. The operator's execute-now claim has a full
    lease and may be collapsed like a sweeper's (its own call then finds it
    done: the fence and the UNIQUE reference keep it to once). A payment claimed again
    (its lease ran out: a lost message, or a payment that kept failing its
    batch) runs only in its own message: one that breaks every transaction
    it is in must not be carried into other clients' batches claim after
    claim. One range of the partial index on QUEUED ``(partition, due_at)``.
    """
    if connection.vendor == "postgresql":
        columns = _executor_columns()
        sql = _LOCK_DUE_QUEUED_SQL.format(columns=select_list(Payment, columns))
        with binary_cursor(binary_results=True) as cursor:
            cursor.execute(sql, [list(partitions), now, now, list(exclude), limit])
            return instances(Payment, columns, cursor.fetchall())
    return list(
        Payment.objects.select_for_update(no_key=True, skip_locked=True, of=("self",))
        .defer(*EXECUTOR_UNREAD)
        .filter(
            status=PaymentStatus.QUEUED,
            partition__in=list(partitions),
            due_at__lte=now,
            lease_expires_at__gt=now,
            attempts=1,
        )
        .exclude(pk__in=list(exclude))
        .order_by("due_at")[:limit]
    )


def lock_payment(payment_id: uuid.UUID, client: AbstractBaseUser | None = None) -> Payment:
    """Lock one payment, with its source account read (not locked) for the owner.

    ``client`` restricts the lookup to that client's payments (the API);
    staff and operators pass ``None``. Raises ``NotFound`` either way, so a
    payment of another client looks exactly like one that does not exist.
    The caller then takes the account locks it needs (``LedgerBatch``).
    """
    qs = Payment.objects.select_for_update(no_key=True, of=("self",)).select_related("from_account")
    if client is not None:
        qs = qs.filter(owner=client)
    payment = qs.filter(pk=payment_id).first()
    if payment is None:
        raise NotFound(f"Payment {payment_id} not found.", payment_id=str(payment_id))
    return payment


def lock_expired_claim(payment_id: uuid.UUID) -> Payment | None:
    """Lock a QUEUED payment for the reaper, or ``None`` if it is busy or moved on.

    ``SKIP LOCKED``: a payment an executor holds right now is being executed,
    not lost; the reaper leaves it and looks again next run.
    """
    return (
        Payment.objects.select_for_update(no_key=True, skip_locked=True)
        .filter(pk=payment_id, status=PaymentStatus.QUEUED)
        .first()
    )


def lock_schedule(schedule_id: uuid.UUID, client: AbstractBaseUser | None) -> RecurringPayment:
    """Lock a recurring schedule for a change by its client (or staff with ``None``).

    Before any payment of the schedule (cancelling a schedule cancels its
    open occurrence under this lock).
    """
    qs = RecurringPayment.objects.select_for_update(no_key=True, of=("self",))
    if client is not None:
        qs = qs.filter(from_account__owner=client)
    schedule = qs.filter(pk=schedule_id).first()
    if schedule is None:
        raise NotFound(
            f"Recurring payment {schedule_id} not found.", recurring_payment_id=str(schedule_id)
        )
    return schedule


def lock_active_schedule(
    schedule_id: uuid.UUID, *, skip_locked: bool = False
) -> RecurringPayment | None:
    """Lock an ACTIVE schedule for the materialiser, with its source account read.

    ``skip_locked``: concurrent materialisers work on different schedules (a
    schedule another one holds is its for this run). ``None`` if it is
    locked elsewhere or no longer active.
    """
    return (
        RecurringPayment.objects.select_for_update(
            no_key=True, skip_locked=skip_locked, of=("self",)
        )
        .select_related("from_account")
        .filter(pk=schedule_id, status=RecurringStatus.ACTIVE)
        .first()
    )


def lock_client(client: AbstractBaseUser) -> None:
    """Lock the client's user row: per-client quotas are counted one request at a time.

    First in the lock order: two concurrent creations of one client are
    counted one after the other and cannot both take the last place.
    """
    get_user_model().objects.select_for_update(no_key=True).filter(pk=client.pk).first()
