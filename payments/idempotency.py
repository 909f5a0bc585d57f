"""Idempotency-Key with Stripe's semantics, backed by a UNIQUE (client, key) row.

1. ``idempotency_begin`` claims the key, committed before the request's work:
   a new key is stored IN_FLIGHT (one ``INSERT … ON CONFLICT DO NOTHING``,
   the common case); an existing one is read under its row lock in a short
   transaction: a completed one with the same request fingerprint is
   replayed; a different fingerprint is refused (``idempotency_key_reused``,
   422); an IN_FLIGHT one is refused (``idempotency_key_in_use``, 409) unless
   its claim is older than ``IDEMPOTENCY_IN_FLIGHT_TIMEOUT`` (the process
   died: nothing it did committed, see 2), in which case this request takes
   it over.
2. The request's own work and ``idempotency_complete`` commit in one
   transaction, so a stored response always matches what was written.
3. On an unexpected error ``idempotency_release`` deletes the claim, so the
   client can simply retry.

Keys are kept ``IDEMPOTENCY_TTL`` (24 h); an expired key starts afresh.
"""

from __future__ import annotations

import functools
import hashlib
import json
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connections, router, transaction
from django.utils import timezone

from .batches import in_batches
from .exceptions import IdempotencyClaimLost, IdempotencyKeyInUse, IdempotencyKeyReused
from .models import IdempotencyKey, IdempotencyStatus


def request_fingerprint(method: str, path: str, body: Any) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{method} {path}\n{canonical}".encode()).hexdigest()


@dataclass
class Claim:
    record: IdempotencyKey
    replay: bool


@functools.cache
def _insert_sql(using: str) -> tuple[str, tuple]:
    """The claim's ``INSERT … ON CONFLICT (client, key) DO NOTHING RETURNING id`` and
    the fields it writes, built once per database from the model's metadata."""
    quote = connections[using].ops.quote_name
    meta = IdempotencyKey._meta
    fields = tuple(f for f in meta.concrete_fields if not f.primary_key)
    columns = ", ".join(quote(f.column) for f in fields)
    conflict = ", ".join(quote(meta.get_field(name).column) for name in ("client", "key"))
    sql = (
        f"INSERT INTO {quote(meta.db_table)} ({columns}) "  # noqa: S608 - names from _meta
        f"VALUES ({', '.join(['%s'] * len(fields))}) "
        f"ON CONFLICT ({conflict}) DO NOTHING RETURNING {quote(meta.pk.column)}"
    )
    return sql, fields


def _insert_in_flight(record: IdempotencyKey) -> bool:
    """INSERT the new claim ``record`` unless its (client, key) exists; True (and
    ``record.pk`` set) if this call inserted it.

    One statement in the caller's transaction (autocommit in the API), so the
    claim is committed before the request's work starts, as a transaction of
    its own would. ``ON CONFLICT DO NOTHING`` waits for a concurrent insert of
    the same key to commit or roll back and then reports the conflict without
    an error (PostgreSQL and SQLite ≥ 3.35).
    """
    using = router.db_for_write(IdempotencyKey)
    connection = connections[using]
    sql, fields = _insert_sql(using)
    params = [f.get_db_prep_save(getattr(record, f.attname), connection) for f in fields]
    with connection.cursor() as cursor:
        cursor.execute(sql, params)
        row = cursor.fetchone()
    if row is None:
        return False
    record.pk = row[0]
    record._state.adding = False
    record._state.db = using
    return True


def idempotency_begin(
    *, client: AbstractBaseUser, key: str, fingerprint: str, also: str | None = None
) -> Claim:
    """Claim ``key`` for a request with ``fingerprint``, or say what to answer.

    ``also``: a fingerprint the same request may have been stored under by an
    earlier release (``payments.api.views._fingerprinted``), taken as the same
    request, so a retry across a deploy replays instead of answering 422.
    """
    now = timezone.now()
    for _ in range(2):
        record = IdempotencyKey(
            client=client,
            key=key,
            fingerprint=fingerprint,
            status=IdempotencyStatus.IN_FLIGHT,
            locked_at=now,
            created_at=now,
        )
        if _insert_in_flight(record):
            return Claim(record, replay=False)
        with transaction.atomic():
            record = (
                IdempotencyKey.objects.select_for_update(no_key=True)
                .filter(client=client, key=key)
                .first()
            )
            if record is None:
                continue  # released (or purged) since the insert saw it: insert again
            if record.created_at < now - timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS):
                _restart(record, fingerprint, now)
                return Claim(record, replay=False)
            if record.fingerprint not in (fingerprint, also):
                raise IdempotencyKeyReused(
                    "This Idempotency-Key was already used with a different request.",
                    key=key,
                )
            if record.status == IdempotencyStatus.COMPLETED:
                return Claim(record, replay=True)
            stale = now - timedelta(seconds=settings.IDEMPOTENCY_IN_FLIGHT_TIMEOUT)
            if record.locked_at < stale:
                _restart(record, fingerprint, now)
                return Claim(record, replay=False)
            raise IdempotencyKeyInUse(
                "A request with this Idempotency-Key is in progress; retry later.", key=key
            )
    raise IdempotencyKeyInUse("A request with this Idempotency-Key is in progress.", key=key)


def _restart(record: IdempotencyKey, fingerprint: str, now) -> None:
    record.fingerprint = fingerprint
    record.status = IdempotencyStatus.IN_FLIGHT
    record.response_status = None
    record.response_body = None
    record.locked_at = now
    record.created_at = now
    record.save()


def _own_claim(record: IdempotencyKey):
    """The claim ``record`` as this request took it: still IN_FLIGHT under the
    ``locked_at`` it was taken with. A request still running after
    ``IDEMPOTENCY_IN_FLIGHT_TIMEOUT`` may have been taken over by a retry
    (``_restart`` sets a new ``locked_at``); it then owns nothing."""
    return IdempotencyKey.objects.filter(
        pk=record.pk, status=IdempotencyStatus.IN_FLIGHT, locked_at=record.locked_at
    )


def idempotency_complete(*, record: IdempotencyKey, status: int, body: Any) -> None:
    """Store the response; call inside the transaction that did the request's work.

    Raises ``IdempotencyClaimLost`` if the claim is no longer this request's (a
    retry took it over): the caller's transaction then rolls back, so one key
    never carries out its request twice.
    """
    stored = _own_claim(record).update(
        status=IdempotencyStatus.COMPLETED, response_status=status, response_body=body
    )
    if not stored:
        raise IdempotencyClaimLost(
            "A request with this Idempotency-Key is in progress; retry later.", key=record.key
        )
    record.status = IdempotencyStatus.COMPLETED
    record.response_status = status
    record.response_body = body


def idempotency_release(*, record: IdempotencyKey) -> None:
    """Free the key for a retry, unless a retry already took the claim over."""
    _own_claim(record).delete()


def idempotency_purge_expired(*, batch: int = 5000, budget_seconds: float = 5.0) -> int:
    """Delete the keys older than ``IDEMPOTENCY_TTL_SECONDS``, oldest first,
    ``batch`` a transaction, until none is left or ``budget_seconds`` have passed
    (the next hourly run goes on); returns how many went. Bounded (DESIGN §8):
    the purge shares its worker with the recurring materialiser, and one
    ``DELETE`` of every expired key — a million took 3.4 s, a backlog after a
    long outage more, up to the task's time limit — held it up that long."""
    cutoff = timezone.now() - timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS)
    expired = (
        IdempotencyKey.objects.filter(created_at__lt=cutoff)
        .order_by("created_at")
        .values_list("pk", flat=True)
    )
    deleted = 0

    def step() -> int:
        nonlocal deleted
        ids = list(expired[:batch])
        # the age again: a key reused since it was read (``_restart`` gives the
        # row a new created_at) is a live key, and deleting it let the client's
        # retry run its request a second time (a reviewer's probe)
        gone, _ = IdempotencyKey.objects.filter(pk__in=ids, created_at__lt=cutoff).delete()
        deleted += gone
        return len(ids)

    in_batches(step, batch, time.monotonic() + budget_seconds)
    return deleted
