"""Write side of payments: schedule, change and cancel, each in one transaction.

Lock order, everywhere (the executor included): payment row, then accounts in
ascending id order (``LedgerBatch``), then holds. Cancel and update lock the
payment row exactly like the executor does, so their answer is definite: the
change happened, or the payment had already moved on and the caller is told
its current status.
"""

from __future__ import annotations

import logging
import uuid
import zlib
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from ledger.exceptions import AccountNotActive, AccountNotFound
from ledger.models import Account, AccountStatus
from ledger.services import LedgerBatch

from . import metrics, webhooks
from .clock import db_now, iso_timestamp
from .exceptions import (
    InvalidRequest,
    NotFound,
    PaymentNotCancellable,
    PaymentNotModifiable,
    amount_over_limit,
)
from .models import (
    DEAD_LETTER_CODE,
    OPEN_STATUSES,
    Actor,
    Payment,
    PaymentEvent,
    PaymentStatus,
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


def partition_for(account_id: int) -> int:
    """Stable partition of a source account: same account, same queue, every process."""
    return zlib.crc32(str(account_id).encode()) % settings.PAYMENT_PARTITIONS


def delay_seconds_rule() -> str:
    """The one wording of the ``delay_seconds`` bounds (API input check and service)."""
    low, high = settings.PAYMENT_MIN_DELAY_SECONDS, settings.PAYMENT_MAX_DELAY_SECONDS
    return f"Must be between {low} and {high} seconds."


ONE_OF_DELAY_OR_TIME = "Give exactly one of delay_seconds or scheduled_time."
SAME_ACCOUNT = "Must differ from from_account_id."


def resolve_due_at(
    *, now: datetime, delay_seconds: int | None = None, scheduled_time: datetime | None = None
) -> datetime:
    """Turn ``delay_seconds`` or ``scheduled_time`` into a due instant, within bounds."""
    if (delay_seconds is None) == (scheduled_time is None):
        raise InvalidRequest.field("delay_seconds", ONE_OF_DELAY_OR_TIME)
    min_delay = settings.PAYMENT_MIN_DELAY_SECONDS
    max_delay = settings.PAYMENT_MAX_DELAY_SECONDS
    if delay_seconds is not None:
        if not min_delay <= delay_seconds <= max_delay:
            raise InvalidRequest.field("delay_seconds", delay_seconds_rule())
        return now + timedelta(seconds=delay_seconds)
    assert scheduled_time is not None
    if scheduled_time < now:
        raise InvalidRequest.field(
            "scheduled_time", "Must not be in the past.", now=iso_timestamp(now)
        )
    if scheduled_time > now + timedelta(seconds=max_delay):
        raise InvalidRequest.field("scheduled_time", f"Must be at most {max_delay} seconds ahead.")
    return scheduled_time


def _event(
    payment: Payment,
    type: str,
    *,
    from_status: str = "",
    actor: str = Actor.CLIENT,
    actor_user: AbstractBaseUser | None = None,
    **data: Any,
) -> PaymentEvent:
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


def _check_amount(amount: int, account: Account) -> None:
    if amount > account.max_payment_amount:
        raise amount_over_limit(account_id=account.pk, limit=account.max_payment_amount)


def _owned_account(batch: LedgerBatch, account_id: int, client: AbstractBaseUser) -> Account:
    account = batch.accounts.get(account_id)
    if account is None or account.owner_id != client.pk:
        raise NotFound(f"Account {account_id} not found.", account_id=account_id)
    return account


def payable_destination(*, client: AbstractBaseUser, account_id: int) -> Account:
    """The account ``client`` may pay into, or the one refusal the API answers.

    The client's own account only has to be active, and if it is not the
    client is told its status (``account_not_active``): it is theirs to know.
    Any other account must exist, be a client account (no ``system_code``:
    issuance and other system accounts are not payable) and be active.
    Unknown, system, frozen and closed all raise the same ``AccountNotFound``
    with the same message apart from the id, so scheduling cannot be used to
    learn anything about another client's account or about system accounts.

    An unlocked read: the executor checks the destination again under its
    row lock, so a destination frozen after scheduling fails the payment then.
    """
    account = (
        Account.objects.filter(pk=account_id)
        .only("pk", "owner_id", "system_code", "status")
        .first()
    )
    if account is not None and account.owner_id is not None and account.owner_id == client.pk:
        if account.status != AccountStatus.ACTIVE:
            raise AccountNotActive(
                f"Account {account_id} is {account.status}.",
                account_id=account_id,
                status=account.status,
            )
        return account
    if account is None or account.system_code is not None or account.status != AccountStatus.ACTIVE:
        raise AccountNotFound(
            f"Account {account_id} does not exist or cannot receive payments.",
            account_id=account_id,
        )
    return account


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
    if from_account_id == to_account_id:
        raise InvalidRequest.field("to_account_id", SAME_ACCOUNT)
    with transaction.atomic():
        now = db_now()
        due_at = resolve_due_at(now=now, delay_seconds=delay_seconds, scheduled_time=scheduled_time)
        # Only the source is locked: payments into a popular account must not
        # queue behind each other at scheduling time.
        batch = LedgerBatch(account_ids=[from_account_id])
        source = _owned_account(batch, from_account_id, client)
        payable_destination(client=client, account_id=to_account_id)
        _check_amount(amount, source)
        payment_id = uuid.uuid4()
        hold = batch.place_hold(
            account_id=from_account_id, amount=amount, reference=f"payment:{payment_id}"
        )
        batch.flush()
        payment = Payment.objects.create(
            id=payment_id,
            from_account_id=from_account_id,
            to_account_id=to_account_id,
            owner_id=source.owner_id,
            amount=amount,
            description=description,
            metadata=metadata or {},
            due_at=due_at,
            run_at=due_at,
            partition=partition_for(from_account_id),
            hold=hold,
            # One instant for both: the column default (statement time) would
            # come after this transaction's clock reading, so created_at > updated_at.
            created_at=now,
            updated_at=now,
        )
        _event(payment, "scheduled", actor_user=client, amount=amount).save()
        transaction.on_commit(metrics.scheduled.inc)
        transaction.on_commit(lambda: _log(payment, "scheduled"))
    return payment


def _lock_open_payment(payment_id: uuid.UUID, client: AbstractBaseUser | None) -> Payment:
    qs = Payment.objects.select_for_update(no_key=True, of=("self",)).select_related("from_account")
    if client is not None:
        qs = qs.filter(owner=client)
    payment = qs.filter(pk=payment_id).first()
    if payment is None:
        raise NotFound(f"Payment {payment_id} not found.", payment_id=str(payment_id))
    return payment


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
        payment = _lock_open_payment(payment_id, client)
        if payment.status not in OPEN_STATUSES:
            raise PaymentNotCancellable(
                f"Payment {payment_id} is {payment.status} and can no longer be cancelled.",
                status=payment.status,
            )
        previous = payment.status
        if payment.hold_id:
            batch = LedgerBatch(account_ids=[payment.from_account_id], hold_ids=[payment.hold_id])
            batch.release_hold(hold_id=payment.hold_id)
            batch.flush()
        now = db_now()
        payment.status = PaymentStatus.CANCELLED
        payment.cancelled_at = now
        payment.updated_at = now
        payment.lease_expires_at = None
        payment.fence += 1
        payment.save(
            update_fields=["status", "cancelled_at", "updated_at", "lease_expires_at", "fence"]
        )
        data = {"reason": reason} if reason else {}
        _event(
            payment, "cancelled", from_status=previous, actor=actor, actor_user=actor_user, **data
        ).save()
        webhooks.emit(
            [(payment.from_account.owner_id, "payment.cancelled", webhooks.payment_data(payment))]
        )
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
        payment = _lock_open_payment(payment_id, client)
        if payment.status not in OPEN_STATUSES:
            raise PaymentNotModifiable(
                f"Payment {payment_id} is {payment.status} and can no longer be changed.",
                status=payment.status,
            )
        now = db_now()
        previous = payment.status
        events: list[PaymentEvent] = []
        fields = {"updated_at"}
        if amount is not None and amount != payment.amount:
            batch = LedgerBatch(
                account_ids=[payment.from_account_id],
                hold_ids=[payment.hold_id] if payment.hold_id else [],
            )
            _check_amount(amount, batch.account(payment.from_account_id))
            if payment.hold_id:
                batch.release_hold(hold_id=payment.hold_id)
            hold = batch.place_hold(
                account_id=payment.from_account_id, amount=amount, reference=payment.reference
            )
            batch.flush()
            events.append(
                _event(
                    payment,
                    "amount_changed",
                    from_status=previous,
                    actor=actor,
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
            old_due = payment.due_at
            payment.due_at = payment.run_at = due_at
            fields |= {"due_at", "run_at"}
            if payment.status == PaymentStatus.QUEUED:
                payment.status = PaymentStatus.PENDING
                payment.fence += 1
                payment.lease_expires_at = None
                fields |= {"status", "fence", "lease_expires_at"}
            events.append(
                _event(
                    payment,
                    "rescheduled",
                    from_status=previous,
                    actor=actor,
                    actor_user=actor_user,
                    old=iso_timestamp(old_due),
                    new=iso_timestamp(due_at),
                )
            )
        if description is not None and description != payment.description:
            events.append(
                _event(
                    payment,
                    "description_changed",
                    from_status=previous,
                    actor=actor,
                    actor_user=actor_user,
                )
            )
            payment.description = description
            fields.add("description")
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
        payment = _lock_open_payment(payment_id, None)
        if payment.status != PaymentStatus.FAILED or payment.error_code != DEAD_LETTER_CODE:
            raise PaymentNotModifiable(
                f"Payment {payment_id} is {payment.status} and is not a dead letter.",
                status=payment.status,
            )
        batch = LedgerBatch(account_ids=[payment.from_account_id])
        hold = batch.place_hold(
            account_id=payment.from_account_id, amount=payment.amount, reference=payment.reference
        )
        batch.flush()
        now = db_now()
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
        _event(
            payment,
            "retried",
            from_status=PaymentStatus.FAILED,
            actor=Actor.STAFF,
            actor_user=staff_user,
        ).save()
    return payment
