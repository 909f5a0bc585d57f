"""Idempotency-Key with Stripe's semantics, backed by a UNIQUE (client, key) row.

1. ``idempotency_begin`` claims the key in a short committed transaction:
   a new key is stored IN_FLIGHT; a completed one with the same request
   fingerprint is replayed; a different fingerprint is refused
   (``idempotency_key_reused``, 422); an IN_FLIGHT one is refused
   (``idempotency_key_in_use``, 409) unless its claim is older than
   ``IDEMPOTENCY_IN_FLIGHT_TIMEOUT`` (the process died: nothing it did
   committed, see 2), in which case this request takes it over.
2. The request's own work and ``idempotency_complete`` commit in one
   transaction, so a stored response always matches what was written.
3. On an unexpected error ``idempotency_release`` deletes the claim, so the
   client can simply retry.

Keys are kept ``IDEMPOTENCY_TTL`` (24 h); an expired key starts afresh.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import IntegrityError, transaction
from django.utils import timezone

from .exceptions import IdempotencyKeyInUse, IdempotencyKeyReused
from .models import IdempotencyKey, IdempotencyStatus


def request_fingerprint(method: str, path: str, body: Any) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{method} {path}\n{canonical}".encode()).hexdigest()


@dataclass
class Claim:
    record: IdempotencyKey
    replay: bool


def idempotency_begin(*, client: AbstractBaseUser, key: str, fingerprint: str) -> Claim:
    now = timezone.now()
    for _ in range(2):
        try:
            with transaction.atomic():
                record = (
                    IdempotencyKey.objects.select_for_update(no_key=True)
                    .filter(client=client, key=key)
                    .first()
                )
                if record is None:
                    record = IdempotencyKey.objects.create(
                        client=client,
                        key=key,
                        fingerprint=fingerprint,
                        status=IdempotencyStatus.IN_FLIGHT,
                        locked_at=now,
                        created_at=now,
                    )
                    return Claim(record, replay=False)
                if record.created_at < now - timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS):
                    _restart(record, fingerprint, now)
                    return Claim(record, replay=False)
                if record.fingerprint != fingerprint:
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
        except IntegrityError:
            continue  # a concurrent request inserted the key first: read it
    raise IdempotencyKeyInUse("A request with this Idempotency-Key is in progress.", key=key)


def _restart(record: IdempotencyKey, fingerprint: str, now) -> None:
    record.fingerprint = fingerprint
    record.status = IdempotencyStatus.IN_FLIGHT
    record.response_status = None
    record.response_body = None
    record.locked_at = now
    record.created_at = now
    record.save()


def idempotency_complete(*, record: IdempotencyKey, status: int, body: Any) -> None:
    """Store the response; call inside the transaction that did the request's work."""
    record.status = IdempotencyStatus.COMPLETED
    record.response_status = status
    record.response_body = body
    record.save(update_fields=["status", "response_status", "response_body"])


def idempotency_release(*, record: IdempotencyKey) -> None:
    IdempotencyKey.objects.filter(pk=record.pk, status=IdempotencyStatus.IN_FLIGHT).delete()


def idempotency_purge_expired() -> int:
    cutoff = timezone.now() - timedelta(seconds=settings.IDEMPOTENCY_TTL_SECONDS)
    deleted, _ = IdempotencyKey.objects.filter(created_at__lt=cutoff).delete()
    return deleted
