"""The lease reaper: claims that outlived their lease (DESIGN §4.1).

A QUEUED payment whose lease expired was claimed but never executed (its
message lost, its worker killed). ``reap_leases`` returns it to PENDING with
a new fence (``transitions.requeue_expired``: a late copy of the old message
is then fenced out) and a back-off, or, once ``PAYMENT_MAX_ATTEMPTS`` claims
are used up, dead-letters it (``transitions.dead_letter``: FAILED
``max_attempts_exceeded``, hold released; staff can retry it). Runs on the
timer worker (``payments.reap_leases``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.conf import settings
from django.db import transaction

from .. import locks, transitions
from ..clock import db_now
from ..models import Payment, PaymentStatus

logger = logging.getLogger(__name__)


@dataclass
class ReapResult:
    requeued: int = 0
    dead_lettered: int = 0


def reap_leases(*, limit: int = 10_000) -> ReapResult:
    """One bounded reaper run: at most ``limit`` requeued and ``limit`` dead-lettered."""
    result = ReapResult()
    max_attempts = settings.PAYMENT_MAX_ATTEMPTS
    with transaction.atomic():
        result.requeued = transitions.requeue_expired(limit=limit, max_attempts=max_attempts)
    dead = list(
        Payment.objects.filter(
            status=PaymentStatus.QUEUED,
            lease_expires_at__lt=db_now(),
            attempts__gte=max_attempts,
        ).values_list("pk", flat=True)[:limit]
    )
    for payment_id in dead:
        if _dead_letter(payment_id):
            result.dead_lettered += 1
    if result.requeued or result.dead_lettered:
        logger.warning(
            "reaper requeued %s and dead-lettered %s payments",
            result.requeued,
            result.dead_lettered,
            extra={"requeued": result.requeued, "dead_lettered": result.dead_lettered},
        )
    return result


def _dead_letter(payment_id) -> bool:
    """Dead-letter one payment in a transaction of its own (one bad row cannot
    stop the others); False if it is busy or moved on meanwhile."""
    with transaction.atomic():
        payment = locks.lock_expired_claim(payment_id)
        if payment is None:
            return False
        return transitions.dead_letter(payment, now=db_now())
