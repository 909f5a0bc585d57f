"""The lease reaper: claims that outlived their lease (DESIGN §4.1).

A QUEUED payment whose lease expired was claimed but never executed (its
message lost, its worker killed). ``reap_leases`` returns it to PENDING with
a new fence (``transitions.requeue_expired``: a late copy of the old message
is then fenced out) and a back-off, or, once ``PAYMENT_MAX_ATTEMPTS`` claims
are used up, dead-letters it (``transitions.dead_letter``: FAILED
``max_attempts_exceeded``, hold released; staff can retry it). Runs on the
timer worker (``payments.reap_leases``), beside the sweeper, so its run is
bounded in time as well as in rows: the requeue is one statement, but each
dead letter is a transaction of its own (~10 ms), and a run of thousands
would hold up every client's sweeps. For the same reason no statement of a
dead letter waits longer than ``PAYMENT_REAPER_STATEMENT_TIMEOUT_SECONDS`` for
a lock (its hold's account, which another session may keep locked for as
long as it likes): that payment is put off, and the run goes on.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction

from .. import locks, transitions
from ..clock import db_now
from ..models import Payment, PaymentStatus
from .bounds import bound_statements, statement_timed_out

logger = logging.getLogger(__name__)

PUT_OFF_SECONDS = 60  # a dead letter that raised is looked at again after this


@dataclass
class ReapResult:
    requeued: int = 0
    dead_lettered: int = 0
    errors: int = 0  # dead letters that raised: logged, put off PUT_OFF_SECONDS (still QUEUED)
    timed_out: int = 0  # dead letters past their statement limit (a lock held): put off too
    budget_exhausted: bool = False


def reap_leases(*, limit: int = 10_000, budget_seconds: float | None = None) -> ReapResult:
    """One bounded reaper run: at most ``limit`` requeued (one statement) and at most
    ``limit`` dead-lettered, none started once ``budget_seconds``
    (``PAYMENT_REAPER_BUDGET_SECONDS``) have passed in the dead-letter loop; the
    next run, 5 s later, carries on with the oldest leases first.

    A dead letter that raises is logged (with the payment's id and the
    traceback), counted in ``errors`` and put off: its lease moved
    ``PUT_OFF_SECONDS`` on with a ``dead_letter_failed`` event
    (``transitions.dead_letter_put_off``), so neither this run nor the next
    ones spend their budget on it first; the others go on. So is one whose
    statement ran past ``PAYMENT_REAPER_STATEMENT_TIMEOUT_SECONDS``
    (``timed_out``; a WARNING line): the budget is checked between rows, and
    before that limit one dead letter waiting for a lock another session kept
    (its hold's account) held the run, and the timer worker's sweeps of every
    client, for as long as that lock lasted. Any other database error that may
    be transient (connection lost, server shutting down) ends the run: every
    other row would fail the same way.
    """
    result = ReapResult()
    max_attempts = settings.PAYMENT_MAX_ATTEMPTS
    budget = settings.PAYMENT_REAPER_BUDGET_SECONDS if budget_seconds is None else budget_seconds
    with transaction.atomic():
        result.requeued = transitions.requeue_expired(limit=limit, max_attempts=max_attempts)
    dead = list(
        Payment.objects.filter(
            status=PaymentStatus.QUEUED,
            lease_expires_at__lt=db_now(),
            attempts__gte=max_attempts,
        )
        .order_by("lease_expires_at", "pk")
        .values_list("pk", flat=True)[:limit]
    )
    started = time.monotonic()
    for payment_id in dead:
        if time.monotonic() - started >= budget:
            result.budget_exhausted = True
            break
        try:
            if _dead_letter(payment_id):
                result.dead_lettered += 1
        except (OperationalError, InterfaceError) as exc:
            if not statement_timed_out(exc):
                raise
            result.timed_out += 1
            logger.warning(
                "reaper: dead-lettering payment %s waited past %s s (a row locked "
                "elsewhere?); put off %s s",
                payment_id,
                settings.PAYMENT_REAPER_STATEMENT_TIMEOUT_SECONDS,
                PUT_OFF_SECONDS,
                extra={"payment_id": str(payment_id)},
            )
            _put_off(payment_id)
        except Exception:
            result.errors += 1
            logger.exception(
                "reaper could not dead-letter payment %s; put off %s s",
                payment_id,
                PUT_OFF_SECONDS,
                extra={"payment_id": str(payment_id)},
            )
            _put_off(payment_id)
    if result.requeued or result.dead_lettered:
        logger.warning(
            "reaper requeued %s and dead-lettered %s payments",
            result.requeued,
            result.dead_lettered,
            extra={"requeued": result.requeued, "dead_lettered": result.dead_lettered},
        )
    return result


def _put_off(payment_id) -> None:
    try:
        with transaction.atomic():
            bound_statements(settings.PAYMENT_REAPER_STATEMENT_TIMEOUT_SECONDS)
            payment = locks.lock_expired_claim(payment_id)
            if payment is not None:
                transitions.dead_letter_put_off(payment, now=db_now(), seconds=PUT_OFF_SECONDS)
    except (OperationalError, InterfaceError):
        raise  # its statements are bounded too: the run ends, the next one goes on
    except Exception:
        logger.exception("reaper could not put off payment %s either", payment_id)


def _dead_letter(payment_id) -> bool:
    """Dead-letter one payment in a transaction of its own (one bad row cannot
    stop the others); False if it is busy or moved on meanwhile."""
    with transaction.atomic():
        bound_statements(settings.PAYMENT_REAPER_STATEMENT_TIMEOUT_SECONDS)
        payment = locks.lock_expired_claim(payment_id)
        if payment is None:
            return False
        return transitions.dead_letter(payment, now=db_now())
