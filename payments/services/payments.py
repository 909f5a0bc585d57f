"""Write side of one-off payments: what the API, the admin and operators call.

Each service owns its transaction and changes a payment only through
``payments.transitions`` under the payment's row lock (``payments.locks``),
so its answer is definite: the change happened, or the payment had already
moved on and the caller is told its current status. Lock order, everywhere:
payment row, then accounts in ascending id order (``LedgerBatch``), then holds
(the executor's batches take their holds before their accounts, which they
lock last: ARCHITECTURE.md, *Lock order*).
"""

from __future__ import annotations

import logging
import uuid
from datetime import datetime
from typing import Any

from django.contrib.auth.models import AbstractBaseUser
from django.db import connection, transaction

from ledger.models import Account
from ledger.services import (
    LedgerBatch,
    locking_accounts_last,
    read_accounts,
    read_accounts_with_clock,
)

from .. import locks, metrics, transitions
from ..clock import db_now, iso_timestamp
from ..engine import executor
from ..exceptions import InvalidRequest, NotFound, PaymentNotDue
from ..models import OPEN_STATUSES, Actor, Payment, PaymentEvent
from .rules import (
    check_amount,
    check_distinct,
    check_payable,
    payable_destination,
    resolve_due_at,
)

logger = logging.getLogger(__name__)


def _log(payment: Payment, transition: str, **extra: Any) -> None:
    logger.info(
        "payment %s %s",
        payment.pk,
        transition,
        extra={
            "payment_id": str(payment.pk),
            "status": payment.status,
            "fence": payment.fence,
            "attempt": payment.attempts,
            "due_at": payment.due_at.isoformat(),
            **extra,
        },
    )


def _owned_source(batch: LedgerBatch, account_id: int, client: AbstractBaseUser):
    account = batch.accounts.get(account_id)
    if account is None or account.owner_id != client.pk:
        raise NotFound(f"Account {account_id} not found.", account_id=account_id)
    return account


def _read_with_clock(account_ids: list[int]) -> tuple[datetime, dict[int, Account]]:
    """The database clock (``clock.db_now``) and these accounts, unlocked, in one
    query on PostgreSQL (the clock read by itself when no account exists)."""
    if connection.vendor != "postgresql":
        return db_now(), read_accounts(account_ids)
    now, accounts = read_accounts_with_clock(account_ids)
    return (now if now is not None else db_now()), accounts


def payment_schedule(
    *,
    client: AbstractBaseUser,
    from_account_id: int,
    to_account_id: int,
    amount: int,
    delay_seconds: int | None = None,
    scheduled_time: datetime | None = None,
    description: str = "",
    metadata: dict | None = None,
) -> Payment:
    """Store a payment and reserve its funds with a hold, or write nothing.

    The caller must own the source account (otherwise it does not exist for
    them; a system account has no owner, so it is never a source). The
    destination must pass ``payable_destination``. Insufficient available
    funds raise ``InsufficientFunds`` at once.
    """
    check_distinct(from_account_id, to_account_id)

    def attempt(lock_accounts_last: bool) -> Payment:
        with transaction.atomic():
            # Locked last, the source is read with the destination and the
            # database clock in one query; locked first, each has its own.
            now, read = (
                _read_with_clock([from_account_id, to_account_id])
                if lock_accounts_last
                else (db_now(), None)
            )
            due_at = resolve_due_at(
                now=now, delay_seconds=delay_seconds, scheduled_time=scheduled_time
            )
            # Only the source is locked: payments into a popular account must not
            # queue behind each other at scheduling time. And it is locked last,
            # for the hold's UPDATE and COMMIT only (``lock_accounts_last``): a
            # request does not hold it while the rest of it runs, so requests on
            # one account and the executor's batches wait for each other briefly.
            batch = LedgerBatch(
                account_ids=[from_account_id],
                lock_accounts_last=lock_accounts_last,
                read=read,
            )
            source = _owned_source(batch, from_account_id, client)
            if read is not None:
                check_payable(
                    client=client, account_id=to_account_id, account=read.get(to_account_id)
                )
            else:
                payable_destination(client=client, account_id=to_account_id)
            check_amount(amount, source)
            payment = transitions.schedule(
                batch,
                from_account_id=from_account_id,
                to_account_id=to_account_id,
                amount=amount,
                description=description,
                metadata=metadata,
                due_at=due_at,
                now=now,
                actor=Actor.CLIENT,
                actor_user=client,
                event_data={"amount": amount},
            )
            batch.flush_balances()  # the source's lock: funds and status checked again under it
            transaction.on_commit(metrics.scheduled.inc)
            transaction.on_commit(lambda: _log(payment, "scheduled"))
        return payment

    # The source is read, then locked last; if it changed in between (funds held
    # by a payment scheduled meanwhile, frozen…), the request runs again locking
    # it first, so the answer is the one a locked read gives (InsufficientFunds…).
    return locking_accounts_last(attempt)


def payment_cancel(
    *,
    payment_id: uuid.UUID,
    client: AbstractBaseUser | None = None,
    actor: str = Actor.CLIENT,
    actor_user: AbstractBaseUser | None = None,
    reason: str = "",
) -> Payment:
    """Cancel a PENDING or QUEUED payment and release its hold.

    ``client`` restricts the lookup to that client's payments (the API);
    staff pass ``client=None`` and ``actor=staff``. The fence is bumped, so a
    message already on its way to a worker finds a stale fence and skips.
    """
    with transaction.atomic():
        payment = locks.lock_payment(payment_id, client)
        transitions.cancel(payment, now=db_now(), actor=actor, actor_user=actor_user, reason=reason)
        transaction.on_commit(lambda: metrics.cancelled.labels(actor=actor).inc())
        transaction.on_commit(lambda: _log(payment, "cancelled", actor=actor))
    return payment


def payment_update(
    *,
    payment_id: uuid.UUID,
    client: AbstractBaseUser | None,
    delay_seconds: int | None = None,
    scheduled_time: datetime | None = None,
    amount: int | None = None,
    description: str | None = None,
    actor: str = Actor.CLIENT,
    actor_user: AbstractBaseUser | None = None,
) -> Payment:
    """Reschedule, change the amount or the description of an open payment.

    A new amount swaps the hold (release the old, place the new) in the same
    transaction: if the account cannot cover it, nothing changes. A new time
    on a QUEUED payment returns it to PENDING with a new fence.
    """
    reschedule = delay_seconds is not None or scheduled_time is not None
    if not reschedule and amount is None and description is None:
        raise InvalidRequest(
            "Nothing to change: give delay_seconds, scheduled_time, amount or description.",
            fields={"non_field_errors": "no changes given"},
        )
    with transaction.atomic():
        payment = locks.lock_payment(payment_id, client)
        transitions.check_open(payment)
        now = db_now()
        previous = payment.status
        events: list[PaymentEvent] = []
        fields = {"updated_at"}
        if amount is not None and amount != payment.amount:
            batch = LedgerBatch(
                account_ids=[payment.from_account_id],
                hold_ids=[payment.hold_id] if payment.hold_id else [],
            )
            check_amount(amount, batch.account(payment.from_account_id))
            if payment.hold_id:
                batch.release_hold(hold_id=payment.hold_id)
            hold = batch.place_hold(
                account_id=payment.from_account_id, amount=amount, reference=payment.reference
            )
            batch.flush()
            events.append(
                transitions.event(
                    payment,
                    "amount_changed",
                    actor=actor,
                    from_status=previous,
                    actor_user=actor_user,
                    old=payment.amount,
                    new=amount,
                )
            )
            payment.amount, payment.hold = amount, hold
            fields |= {"amount", "hold"}
        if reschedule:
            due_at = resolve_due_at(
                now=now, delay_seconds=delay_seconds, scheduled_time=scheduled_time
            )
            changed, rescheduled = transitions.reschedule(
                payment, due_at=due_at, actor=actor, actor_user=actor_user
            )
            fields |= changed
            events.append(rescheduled)
        if description is not None and description != payment.description:
            events.append(
                transitions.event(
                    payment,
                    "description_changed",
                    actor=actor,
                    from_status=previous,
                    actor_user=actor_user,
                )
            )
            payment.description = description
            fields.add("description")
        if not events:
            # the same amount or description again: nothing changed, nothing to
            # write (updated_at moved without an event: a review, session 42)
            return payment
        payment.updated_at = now
        payment.save(update_fields=sorted(fields))
        PaymentEvent.objects.bulk_create(events)
    return payment


def payment_retry_dead_letter(*, payment_id: uuid.UUID, staff_user: AbstractBaseUser) -> Payment:
    """Give a dead-lettered payment a fresh hold and send it back to the sweeper.

    Only payments FAILED with ``max_attempts_exceeded`` qualify: a business
    failure (frozen account, …) is final and needs a new payment. The funds
    are reserved again now; if they are gone, ``InsufficientFunds`` and
    nothing changes.
    """
    with transaction.atomic():
        payment = locks.lock_payment(payment_id, None)
        transitions.retry(payment, now=db_now(), staff_user=staff_user)
    return payment


def payment_execute_now(*, payment_id: uuid.UUID, execution_id: str) -> Payment:
    """Operator trigger: claim a due open payment and execute it at once.

    Harmless to repeat: a payment already terminal is returned as it is, and
    one claimed again meanwhile runs once (the fence; ``execution_id`` is
    recorded in the ``queued`` event, not looked up). A payment not yet due is
    left alone (``payment_not_due``): nothing runs before its time.
    """
    with transaction.atomic():
        payment = locks.lock_payment(payment_id, None)
        if payment.status not in OPEN_STATUSES:
            return payment
        now = db_now()
        if payment.due_at > now:
            raise PaymentNotDue(
                f"Payment {payment_id} is not due until {iso_timestamp(payment.due_at)}.",
                due_at=iso_timestamp(payment.due_at),
            )
        fence = transitions.claim_now(payment, now=now, execution_id=execution_id)
    executor.execute_chunk([(str(payment.pk), fence)], worker=f"internal:{execution_id}"[:128])
    return Payment.objects.get(pk=payment.pk)
