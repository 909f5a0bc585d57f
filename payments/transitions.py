"""Every status change of a payment, in one place (DESIGN §4.1).

Each function here is one transition: it checks the current state (and the
fence, where a message carries one), sets status, fence and lease, builds the
``PaymentEvent`` and records the webhook. Nothing else in the code base
writes a payment's ``status`` or ``fence``. Where the hot path needs a
set-based form (the sweeper's claim, the reaper's requeue), the SQL sits next
to its Python twin, which the embedded SQLite default runs.

====================  ====================  ==========  ======  =============  =================
transition            from                  to          fence   event          webhook
====================  ====================  ==========  ======  =============  =================
``schedule``          (new)                 PENDING     0       scheduled      (none)
``claim_due``         PENDING, due          QUEUED      +1      queued         (none)
``claim_now``         PENDING, QUEUED       QUEUED      +1      queued         (none)
``complete``          QUEUED, same fence    COMPLETED   =       executed       payment.completed
``fail``              QUEUED, same fence    FAILED      =       failed         payment.failed
``requeue_expired``   QUEUED, lease over    PENDING     +1      lease_expired  (none)
``unclaim``           QUEUED, same fence    PENDING     +1      unqueued       (none)
``dead_letter``       QUEUED, lease over    FAILED      +1      dead_lettered  payment.failed
``cancel``            PENDING, QUEUED       CANCELLED   +1      cancelled      payment.cancelled
``reschedule``        PENDING, QUEUED       PENDING     +1 [1]  rescheduled    (none)
``retry``             FAILED (dead letter)  PENDING     +1      retried        (none)
====================  ====================  ==========  ======  =============  =================

[1] only when it was QUEUED: a message already published for it is fenced out.

Recurring schedules change status here too (``set_schedule_status``,
``advance_schedule``): active ⇄ paused, active or paused → cancelled, active →
ended once no occurrence is left.

Callers hold the payment's row lock (``payments.locks``) and own the
transaction; the SQL forms take their own row locks (``FOR NO KEY UPDATE
SKIP LOCKED``) inside the caller's transaction. Every fence bump makes any
message still carrying the old fence a stale delivery the executor skips.
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import connection
from django.db.models import F

from ledger.db import bulk_insert_rows
from ledger.models import Account, HoldStatus, JournalEntry
from ledger.services import LedgerBatch

from . import routing, webhooks
from .calendar import planned
from .clock import db_now, iso_timestamp, slot_start, spread_grid
from .exceptions import PaymentNotCancellable, PaymentNotModifiable, RecurringNotChangeable
from .models import (
    DEAD_LETTER_CODE,
    OPEN_STATUSES,
    Actor,
    Payment,
    PaymentEvent,
    PaymentStatus,
    RecurringPayment,
    RecurringStatus,
)


def event(
    payment: Payment,
    type: str,
    *,
    actor: str,
    from_status: str = "",
    actor_user: AbstractBaseUser | None = None,
    **data: Any,
) -> PaymentEvent:
    """The audit row of a change, stamped with the payment's status and fence *after* it.

    Unsaved: callers save it or collect several for one bulk insert.
    """
    return PaymentEvent(
        payment=payment,
        type=type,
        from_status=from_status,
        to_status=payment.status,
        actor=actor,
        actor_user=actor_user,
        fence=payment.fence,
        data=data,
    )


def system_events(type: str, from_status: str, to_status: str, rows, **data: Any) -> None:
    """One bulk insert of the system's audit rows for a set-based move: ``rows``
    are (payment id, fence after the move)."""
    PaymentEvent.objects.bulk_create(
        PaymentEvent(
            payment_id=pk,
            type=type,
            from_status=from_status,
            to_status=to_status,
            actor=Actor.SYSTEM,
            fence=fence,
            data=data,
        )
        for pk, fence in rows
    )


def release_hold(payment: Payment, batch: LedgerBatch | None = None) -> None:
    """Release the payment's hold if it is still active (cancel, failure, dead letter).

    With ``batch`` the release joins that batch (the executor's, which holds
    the account and hold locks and flushes once); without, a batch of its own
    locks the source account and the hold and writes at once.
    """
    if not payment.hold_id:
        return
    own = batch is None
    if batch is None:
        batch = LedgerBatch(account_ids=[payment.from_account_id], hold_ids=[payment.hold_id])
    hold = batch.holds.get(payment.hold_id)
    if hold is not None and hold.status == HoldStatus.ACTIVE:
        batch.release_hold(hold_id=hold.pk)
    if own:
        batch.flush()


# --- schedule ----------------------------------------------------------------------


def new_payment(
    batch: LedgerBatch,
    *,
    from_account_id: int,
    to_account_id: int,
    amount: int,
    due_at: datetime,
    now: datetime,
    description: str = "",
    metadata: dict | None = None,
    recurring_id: uuid.UUID | None = None,
    payment_id: uuid.UUID | None = None,
) -> Payment:
    """An unsaved PENDING payment with its hold placed in ``batch`` (caller flushes).

    The one place a payment and its hold are made: the API's schedule, the
    materialiser's occurrences, and bulk loads (tests, bench) all go through
    it. ``batch`` must hold the source account's lock, or take it in
    ``flush_balances`` (``lock_accounts_last``: the schedule request, which
    re-checks the funds under it); the hold raises ``InsufficientFunds`` if the
    available balance (as read) does not cover ``amount``.
    """
    payment_id = payment_id or uuid.uuid4()
    hold = batch.place_hold(
        account_id=from_account_id, amount=amount, reference=f"payment:{payment_id}"
    )
    return Payment(
        id=payment_id,
        from_account_id=from_account_id,
        to_account_id=to_account_id,
        owner_id=batch.accounts[from_account_id].owner_id,
        amount=amount,
        description=description,
        metadata=metadata or {},
        due_at=due_at,
        run_at=due_at,
        partition=routing.partition_for(from_account_id),
        hold=hold,
        recurring_id=recurring_id,
        # One instant for both: the column default (statement time) would
        # come after this transaction's clock reading, so created_at > updated_at.
        created_at=now,
        updated_at=now,
    )


def schedule(
    batch: LedgerBatch,
    *,
    actor: str,
    actor_user: AbstractBaseUser | None = None,
    event_data: dict | None = None,
    **fields: Any,
) -> Payment:
    """(new) → PENDING: place the hold, store the payment and its ``scheduled`` event.

    Each row in one statement of its own (``ledger.db.bulk_insert_rows``), as
    the executor writes, not ``Model.save``, which compiles its INSERT through
    the ORM on every call; with the request's account read as SQL of its own
    (``ledger.services.read_accounts_with_clock``) a schedule request costs
    15-18 % less CPU in process (docs/performance-history.md, session 20). The payment comes back
    as ``save`` leaves it (in the database); the event is not read back.
    Nothing listens to these models' save signals."""
    payment = new_payment(batch, **fields)
    batch.flush()
    bulk_insert_rows([payment])
    scheduled = event(
        payment, "scheduled", actor=actor, actor_user=actor_user, **(event_data or {})
    )
    bulk_insert_rows([scheduled], read_back=False)
    return payment


def schedule_many(batch: LedgerBatch, items: Iterable[dict], *, actor: str) -> list[Payment]:
    """``schedule`` for many payments at once: one flush, one insert of payments and events."""
    payments = [new_payment(batch, **item) for item in items]
    batch.flush()
    Payment.objects.bulk_create(payments)
    PaymentEvent.objects.bulk_create(event(p, "scheduled", actor=actor) for p in payments)
    return payments


# --- claim ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Claimed:
    payment_id: str
    fence: int
    partition: int
    due_at: datetime


_CLAIM_SQL_TEMPLATE = """
WITH due AS (
    SELECT id FROM payments_payment
     WHERE status = 'PENDING'
       AND {cutoff}
     ORDER BY run_at
     LIMIT %(limit)s
       FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE payments_payment p
       SET status = 'QUEUED',
           fence = p.fence + 1,
           attempts = p.attempts + 1,
           partition = p.partition %% %(partitions)s,
           lease_expires_at = clock_timestamp() + make_interval(secs => %(lease)s),
           updated_at = clock_timestamp()
      FROM due
     WHERE p.id = due.id
 RETURNING p.id, p.fence, p.partition, p.due_at
), events AS (
    INSERT INTO payments_paymentevent
           (payment_id, type, from_status, to_status, actor, fence, data, created_at)
    SELECT id, 'queued', 'PENDING', 'QUEUED', 'system', fence, '{{}}'::jsonb, clock_timestamp()
      FROM claimed
)
SELECT id, fence, partition, due_at FROM claimed
"""
_HORIZON = "statement_timestamp() + make_interval(secs => %(lookahead)s)"
_CLAIM_SQL = _CLAIM_SQL_TEMPLATE.format(cutoff=f"run_at <= {_HORIZON}")
# Whole slots of the spread grid only (clock.spread_grid): the horizon rounded
# down to a slot's start, whose payments belong to the next slot.
_CLAIM_SLOTS_SQL = _CLAIM_SQL_TEMPLATE.format(
    cutoff=f"run_at < date_bin(make_interval(secs => %(grid)s), {_HORIZON}, 'epoch')"
)


def claim_due(*, limit: int, lookahead: float) -> list[Claimed]:
    """PENDING → QUEUED for up to ``limit`` payments whose run time is within
    ``lookahead`` seconds (database clock): fence and attempts + 1, a lease of
    ``PAYMENT_LEASE_SECONDS``, a ``queued`` event each. Caller commits before
    anything is published.

    With a spread grid (``clock.spread_grid``) the horizon is rounded down
    to the start of a slot: a sweep claims whole slots, so the sweeper cuts a
    steady flow into one chunk per slot instead of a chunk and a fragment at
    every sweep (measured at 150/s: half the messages held one payment). A
    payment is then claimed between ``lookahead`` less one slot and
    ``lookahead`` ahead of its run time.

    The partition is taken modulo ``PAYMENT_PARTITIONS``: one stored when the
    setting was higher (a redeploy with fewer partitions) would be published
    to a queue no worker consumes any more, and be dead-lettered untried
    after five leases. Below the setting it is unchanged.

    The cutoff uses ``statement_timestamp()``: it is *stable*, so PostgreSQL
    bounds the partial-index scan with it; the volatile ``clock_timestamp()``
    can only be a filter, and an idle sweep then reads every pending row.
    """
    lease = settings.PAYMENT_LEASE_SECONDS
    grid = spread_grid(lookahead)
    if connection.vendor == "postgresql":
        params = {
            "lookahead": lookahead,
            "limit": limit,
            "lease": lease,
            "partitions": settings.PAYMENT_PARTITIONS,
        }
        sql = _CLAIM_SQL
        if grid is not None:
            sql, params["grid"] = _CLAIM_SLOTS_SQL, grid.total_seconds()
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return [Claimed(str(r[0]), r[1], r[2], r[3]) for r in cursor.fetchall()]
    # SQLite (embedded default): one writer at a time, so no SKIP LOCKED needed.
    now = db_now()
    horizon = {"run_at__lte": now + timedelta(seconds=lookahead)}
    if grid is not None:
        horizon = {"run_at__lt": slot_start(horizon["run_at__lte"], grid)}
    ids = list(
        Payment.objects.filter(status=PaymentStatus.PENDING, **horizon)
        .order_by("run_at")
        .values_list("pk", flat=True)[:limit]
    )
    Payment.objects.filter(pk__in=ids, status=PaymentStatus.PENDING).update(
        status=PaymentStatus.QUEUED,
        fence=F("fence") + 1,
        attempts=F("attempts") + 1,
        partition=F("partition") % settings.PAYMENT_PARTITIONS,
        lease_expires_at=now + timedelta(seconds=lease),
        updated_at=now,
    )
    rows = list(
        Payment.objects.filter(pk__in=ids).values_list("pk", "fence", "partition", "due_at")
    )
    system_events(
        "queued", PaymentStatus.PENDING, PaymentStatus.QUEUED, [(pk, f) for pk, f, _, _ in rows]
    )
    return [Claimed(str(pk), fence, part, due) for pk, fence, part, due in rows]


def claim_now(payment: Payment, *, now: datetime, execution_id: str) -> int:
    """PENDING/QUEUED → QUEUED for the operator's execute-now trigger; returns the new fence.

    Leased for ``PAYMENT_LEASE_SECONDS`` like a sweeper's claim: the execution
    follows in a transaction of its own, and a lease already over (it was
    ``now``) let the reaper take the payment back between the two — the
    execute-now answered PENDING without running it, or, on its last attempt,
    dead-lettered it untried. If the execution dies, the reaper takes the
    payment back when the lease ends. Caller holds the row lock and has checked
    that it is due.
    """
    if payment.status not in OPEN_STATUSES:
        raise PaymentNotModifiable(
            f"Payment {payment.pk} is {payment.status} and cannot be executed.",
            status=payment.status,
        )
    previous = payment.status
    payment.status = PaymentStatus.QUEUED
    payment.fence += 1
    payment.attempts += 1
    payment.lease_expires_at = now + timedelta(seconds=settings.PAYMENT_LEASE_SECONDS)
    payment.updated_at = now
    payment.save(update_fields=["status", "fence", "attempts", "lease_expires_at", "updated_at"])
    event(
        payment,
        "queued",
        actor=Actor.STAFF,
        from_status=previous,
        execution_id=execution_id,
        trigger="internal_api",
    ).save()
    return payment.fence


# --- execute -------------------------------------------------------------------------


def is_current(payment: Payment, fence: int) -> bool:
    """A delivery of ``(payment, fence)`` may run: still QUEUED with that fence.

    Anything else is a stale or duplicate message (cancelled, rescheduled,
    reaped, already executed): the executor records it and skips it.
    """
    return payment.status == PaymentStatus.QUEUED and payment.fence == fence


def _finish(payment: Payment, status: str, now: datetime) -> None:
    if payment.status != PaymentStatus.QUEUED:
        raise PaymentNotModifiable(
            f"Payment {payment.pk} is {payment.status}, not QUEUED.", status=payment.status
        )
    payment.status = status
    payment.lease_expires_at = None
    payment.updated_at = now


def complete(payment: Payment, *, entry: JournalEntry, now: datetime, worker: str) -> PaymentEvent:
    """QUEUED → COMPLETED with its journal entry. In memory: the executor writes
    the chunk's payments and events in bulk and calls ``notify_outcomes``."""
    _finish(payment, PaymentStatus.COMPLETED, now)
    payment.journal_entry = entry
    payment.executed_at = now
    return event(
        payment, "executed", actor=Actor.SYSTEM, from_status=PaymentStatus.QUEUED, worker=worker
    )


def fail(payment: Payment, *, code: str, message: str, now: datetime, worker: str) -> PaymentEvent:
    """QUEUED → FAILED by a business rule (frozen account, hold gone, …). In
    memory, like ``complete``; the caller releases the hold in its batch."""
    _finish(payment, PaymentStatus.FAILED, now)
    payment.error_code = code
    payment.error_message = message[:255]
    return event(
        payment,
        "failed",
        actor=Actor.SYSTEM,
        from_status=PaymentStatus.QUEUED,
        worker=worker,
        error_code=code,
    )


def notify_outcomes(payments: Iterable[Payment], owner_of: dict[int, int | None]) -> None:
    """The ``payment.completed`` / ``payment.failed`` webhooks of executed payments,
    recorded in one statement; ``owner_of`` maps source account id → client id."""
    webhooks.emit(
        (
            owner,
            "payment.completed" if p.status == PaymentStatus.COMPLETED else "payment.failed",
            functools.partial(webhooks.payment_data, p),
        )
        for p in payments
        if (owner := owner_of[p.from_account_id]) is not None
    )


def unclaim(claims: list[Claimed]) -> int:
    """Hand back claims whose message could not be published (the broker is
    down): QUEUED with the claimed fence → PENDING, fence + 1, the claim's
    attempt given back, run time unchanged; an ``unqueued`` event each.
    Returns how many. Caller owns the transaction.

    Without it each claim waited out its lease and the reaper counted the
    lost message as a failed attempt: a broker outage of five leases
    dead-lettered every due payment that no worker had ever tried. A claim
    that moved on meanwhile (executed, cancelled, claimed again) is left as
    it is, and one an executor holds is skipped (``SKIP LOCKED``) — it is
    being run; the fence bump makes any message already sent for the others
    a stale delivery."""
    fences = {c.payment_id: c.fence for c in claims}
    rows = (
        Payment.objects.select_for_update(skip_locked=True, no_key=True)
        .filter(pk__in=list(fences), status=PaymentStatus.QUEUED)
        .order_by("pk")
        .values_list("pk", "fence")
    )
    ids = [pk for pk, fence in rows if fences.get(str(pk)) == fence]
    if not ids:
        return 0
    now = db_now()
    Payment.objects.filter(pk__in=ids).update(
        status=PaymentStatus.PENDING,
        fence=F("fence") + 1,
        attempts=F("attempts") - 1,  # the claim added it: at least 1
        lease_expires_at=None,
        updated_at=now,
    )
    system_events(
        "unqueued",
        PaymentStatus.QUEUED,
        PaymentStatus.PENDING,
        [(pk, fences[str(pk)] + 1) for pk in ids],
        reason="not published",
    )
    return len(ids)


# --- lease expiry --------------------------------------------------------------------

_REQUEUE_SQL = """
WITH expired AS (
    SELECT id FROM payments_payment
     WHERE status = 'QUEUED' AND lease_expires_at < statement_timestamp()
       AND attempts < %(max_attempts)s
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR NO KEY UPDATE SKIP LOCKED
), requeued AS (
    UPDATE payments_payment p
       SET status = 'PENDING',
           fence = p.fence + 1,
           lease_expires_at = NULL,
           run_at = greatest(p.due_at, clock_timestamp()
                    + make_interval(secs => least(power(2, p.attempts - 1), 60))),
           updated_at = clock_timestamp()
      FROM expired
     WHERE p.id = expired.id
 RETURNING p.id, p.fence, p.attempts
), events AS (
    INSERT INTO payments_paymentevent
           (payment_id, type, from_status, to_status, actor, fence, data, created_at)
    SELECT id, 'lease_expired', 'QUEUED', 'PENDING', 'system', fence,
           jsonb_build_object('attempts', attempts), clock_timestamp()
      FROM requeued
)
SELECT count(*) FROM requeued
"""


def retry_delay_seconds(attempts: int) -> float:
    """Back-off before a reaped payment is claimed again: 1, 2, 4, … 60 s (the SQL's twin)."""
    return min(2 ** max(attempts - 1, 0), 60)


def requeue_expired(*, limit: int, max_attempts: int) -> int:
    """QUEUED with an expired lease and attempts left → PENDING, fence + 1, run
    again after ``retry_delay_seconds`` (never before its due time); a
    ``lease_expired`` event each. Returns how many. Caller owns the transaction."""
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_REQUEUE_SQL, {"max_attempts": max_attempts, "limit": limit})
            return cursor.fetchone()[0]
    now = db_now()
    expired = Payment.objects.filter(
        status=PaymentStatus.QUEUED, lease_expires_at__lt=now, attempts__lt=max_attempts
    )[:limit]
    count = 0
    for payment in expired:
        payment.status = PaymentStatus.PENDING
        payment.fence += 1
        payment.lease_expires_at = None
        payment.run_at = max(
            payment.due_at, now + timedelta(seconds=retry_delay_seconds(payment.attempts))
        )
        payment.updated_at = now
        payment.save(update_fields=["status", "fence", "lease_expires_at", "run_at", "updated_at"])
        event(
            payment,
            "lease_expired",
            actor=Actor.SYSTEM,
            from_status=PaymentStatus.QUEUED,
            attempts=payment.attempts,
        ).save()
        count += 1
    return count


def dead_letter(payment: Payment, *, now: datetime) -> bool:
    """QUEUED with an expired lease and no attempts left → FAILED
    ``max_attempts_exceeded``, hold released, fence + 1; staff can ``retry`` it.

    Caller holds the row lock. Returns False (and changes nothing) if the
    payment moved on or its lease was renewed meanwhile.
    """
    if payment.status != PaymentStatus.QUEUED or payment.lease_expires_at >= now:
        return False
    release_hold(payment)
    payment.status = PaymentStatus.FAILED
    payment.error_code = DEAD_LETTER_CODE
    payment.error_message = f"Not executed after {payment.attempts} attempts."
    payment.fence += 1
    payment.lease_expires_at = None
    payment.updated_at = now
    payment.save(
        update_fields=[
            "status",
            "error_code",
            "error_message",
            "fence",
            "lease_expires_at",
            "updated_at",
        ]
    )
    event(
        payment,
        "dead_lettered",
        actor=Actor.SYSTEM,
        from_status=PaymentStatus.QUEUED,
        attempts=payment.attempts,
    ).save()
    owner = Account.objects.filter(pk=payment.from_account_id).values_list("owner_id", flat=True)
    notify_outcomes([payment], {payment.from_account_id: owner.first()})
    return True


def dead_letter_put_off(payment: Payment, *, now: datetime, seconds: int) -> bool:
    """A dead letter that raised: its lease moved ``seconds`` on, so the reaper's
    next runs reach the payments behind it (oldest lease first), and an event
    saying so. Still QUEUED, hold kept, fence unchanged.

    Caller holds the row lock. False (nothing changed) if it moved on meanwhile.
    """
    if payment.status != PaymentStatus.QUEUED or payment.lease_expires_at >= now:
        return False
    payment.lease_expires_at = now + timedelta(seconds=seconds)
    payment.updated_at = now
    payment.save(update_fields=["lease_expires_at", "updated_at"])
    event(
        payment,
        "dead_letter_failed",
        actor=Actor.SYSTEM,
        from_status=PaymentStatus.QUEUED,
        retry_in_seconds=seconds,
    ).save()
    return True


# --- client and staff changes ----------------------------------------------------------


def cancel(
    payment: Payment,
    *,
    now: datetime,
    actor: str,
    actor_user: AbstractBaseUser | None = None,
    reason: str = "",
) -> None:
    """PENDING/QUEUED → CANCELLED, hold released, fence + 1 (a message already on
    its way finds a stale fence). Caller holds the row lock, with ``from_account``
    selected (its owner gets the webhook)."""
    if payment.status not in OPEN_STATUSES:
        raise PaymentNotCancellable(
            f"Payment {payment.pk} is {payment.status} and can no longer be cancelled.",
            status=payment.status,
        )
    previous = payment.status
    release_hold(payment)
    payment.status = PaymentStatus.CANCELLED
    payment.cancelled_at = now
    payment.updated_at = now
    payment.lease_expires_at = None
    payment.fence += 1
    payment.save(
        update_fields=["status", "cancelled_at", "updated_at", "lease_expires_at", "fence"]
    )
    data = {"reason": reason} if reason else {}
    event(
        payment, "cancelled", actor=actor, from_status=previous, actor_user=actor_user, **data
    ).save()
    webhooks.emit(
        [(payment.from_account.owner_id, "payment.cancelled", webhooks.payment_data(payment))]
    )


def check_open(payment: Payment) -> None:
    """Refuse a change to a payment that is no longer PENDING or QUEUED."""
    if payment.status not in OPEN_STATUSES:
        raise PaymentNotModifiable(
            f"Payment {payment.pk} is {payment.status} and can no longer be changed.",
            status=payment.status,
        )


def reschedule(
    payment: Payment,
    *,
    due_at: datetime,
    actor: str,
    actor_user: AbstractBaseUser | None = None,
) -> tuple[set[str], PaymentEvent]:
    """A new due time for an open payment; a QUEUED one goes back to PENDING with
    fence + 1 (a message already published for it is fenced out).

    In memory: ``payment_update`` saves all of a request's changes at once.
    Returns the fields changed and the unsaved ``rescheduled`` event.
    """
    check_open(payment)
    previous, old_due = payment.status, payment.due_at
    payment.due_at = payment.run_at = due_at
    fields = {"due_at", "run_at"}
    if payment.status == PaymentStatus.QUEUED:
        payment.status = PaymentStatus.PENDING
        payment.fence += 1
        payment.lease_expires_at = None
        fields |= {"status", "fence", "lease_expires_at"}
    rescheduled = event(
        payment,
        "rescheduled",
        actor=actor,
        from_status=previous,
        actor_user=actor_user,
        old=iso_timestamp(old_due),
        new=iso_timestamp(due_at),
    )
    return fields, rescheduled


def retry(payment: Payment, *, now: datetime, staff_user: AbstractBaseUser) -> None:
    """Dead letter (FAILED ``max_attempts_exceeded``) → PENDING with a fresh hold,
    attempts reset, due at once. Caller holds the row lock. If the funds are
    gone the hold raises ``InsufficientFunds`` and nothing changes."""
    if payment.status != PaymentStatus.FAILED or payment.error_code != DEAD_LETTER_CODE:
        raise PaymentNotModifiable(
            f"Payment {payment.pk} is {payment.status} and is not a dead letter.",
            status=payment.status,
        )
    batch = LedgerBatch(account_ids=[payment.from_account_id])
    hold = batch.place_hold(
        account_id=payment.from_account_id, amount=payment.amount, reference=payment.reference
    )
    batch.flush()
    payment.status = PaymentStatus.PENDING
    payment.hold = hold
    payment.attempts = 0
    payment.fence += 1
    payment.run_at = now
    payment.error_code = payment.error_message = ""
    payment.updated_at = now
    payment.save(
        update_fields=[
            "status",
            "hold",
            "attempts",
            "fence",
            "run_at",
            "error_code",
            "error_message",
            "updated_at",
        ]
    )
    event(
        payment,
        "retried",
        actor=Actor.STAFF,
        from_status=PaymentStatus.FAILED,
        actor_user=staff_user,
    ).save()


# --- recurring schedules -----------------------------------------------------------------

SCHEDULE_MOVES = {
    RecurringStatus.ACTIVE: {
        RecurringStatus.PAUSED,
        RecurringStatus.ENDED,
        RecurringStatus.CANCELLED,
    },
    RecurringStatus.PAUSED: {RecurringStatus.ACTIVE, RecurringStatus.CANCELLED},
}


def set_schedule_status(schedule: RecurringPayment, status: str, *, reason: str = "") -> None:
    """Move a schedule to ``status`` with the ``status_reason`` the client reads. In
    memory; the caller holds the schedule's row lock and saves. An ended or
    cancelled schedule never moves again (``RecurringNotChangeable``)."""
    if status not in SCHEDULE_MOVES.get(schedule.status, set()):
        raise RecurringNotChangeable(
            f"Recurring payment {schedule.pk} is {schedule.status}; it cannot become {status}.",
            status=schedule.status,
        )
    schedule.status = status
    schedule.status_reason = reason[:255]


def advance_schedule(schedule: RecurringPayment) -> None:
    """Recompute ``next_run_at`` from the calendar; an active schedule with no
    occurrence left (past its end or its ``max_occurrences``) ends. In memory."""
    upcoming = planned(schedule, 1)
    schedule.next_run_at = upcoming[0] if upcoming else None
    if schedule.next_run_at is None and schedule.status == RecurringStatus.ACTIVE:
        set_schedule_status(schedule, RecurringStatus.ENDED)
