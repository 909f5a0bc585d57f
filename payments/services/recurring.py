"""Write side of recurring schedules: what the API and the admin call (DESIGN §4.2).

Create, change, pause, resume and cancel a schedule, each in one
transaction under the schedule's row lock. Turning occurrences into payments
is the materialiser's (``payments.engine.materializer``).
"""

from __future__ import annotations

import contextlib
import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from ledger.exceptions import AccountNotActive
from ledger.models import Account, AccountStatus

from .. import locks, transitions
from ..calendar import AMBIGUOUS_POLICIES, NONEXISTENT_POLICIES, planned, validate_cron, zone
from ..clock import db_now
from ..engine import materializer
from ..exceptions import (
    InvalidRequest,
    InvalidSchedule,
    LimitExceeded,
    NotFound,
    PaymentNotCancellable,
    RecurringNotChangeable,
)
from ..models import OPEN_STATUSES, Actor, Payment, RecurringPayment, RecurringStatus
from .payments import payment_cancel
from .rules import check_amount, check_distinct, payable_destination

logger = logging.getLogger(__name__)

MISSED_RUN_POLICIES = ("skip", "run_once", "run_all")


# What the API accepts, so every accepted schedule can be enumerated to its end
# without leaving the calendar (datetime stops at year 9999).
EARLIEST_START = datetime(2000, 1, 1, tzinfo=UTC)
LATEST_END = datetime(2200, 1, 1, tzinfo=UTC)
MAX_INTERVAL_SECONDS = 366 * 86400


ONE_OF_CRON_OR_INTERVAL = "Give exactly one of cron or interval_seconds."


def _invalid(field: str, message: str) -> InvalidRequest:
    return InvalidRequest.field(field, message)


def _validate(fields: dict, *, now: datetime | None = None) -> None:
    """Input rules of a schedule; with ``now``, also the bounds of a new ``start_time``."""
    try:
        if fields.get("cron"):
            fields["cron"] = validate_cron(fields["cron"])
    except InvalidSchedule as exc:
        raise _invalid("cron", str(exc)) from None
    try:
        zone(fields.get("timezone") or "UTC")
    except InvalidSchedule as exc:
        raise _invalid("timezone", str(exc)) from None
    if bool(fields.get("cron")) == bool(fields.get("interval_seconds")):
        raise _invalid("cron", ONE_OF_CRON_OR_INTERVAL)
    interval = fields.get("interval_seconds")
    if interval is not None and not 60 <= interval <= MAX_INTERVAL_SECONDS:
        raise _invalid(
            "interval_seconds", f"Must be between 60 and {MAX_INTERVAL_SECONDS} seconds."
        )
    if now is not None:
        latest_start = now + timedelta(seconds=settings.PAYMENT_MAX_DELAY_SECONDS)
        if not EARLIEST_START <= fields["start_time"] <= latest_start:
            raise _invalid(
                "start_time",
                f"Must be between {EARLIEST_START:%Y-%m-%dT%H:%M:%SZ} and "
                f"{settings.PAYMENT_MAX_DELAY_SECONDS} seconds from now.",
            )
    if fields.get("end_time"):
        if fields["end_time"] <= fields["start_time"]:
            raise _invalid("end_time", "Must be after start_time.")
        if fields["end_time"] >= LATEST_END:
            raise _invalid("end_time", f"Must be before {LATEST_END:%Y-%m-%dT%H:%M:%SZ}.")
    if (
        fields.get("dst_nonexistent", "shift") not in NONEXISTENT_POLICIES
        or fields.get("dst_ambiguous", "first") not in AMBIGUOUS_POLICIES
    ):
        raise _invalid("dst_policy", "Unknown DST policy.")
    if fields.get("missed_run_policy", "skip") not in MISSED_RUN_POLICIES:
        raise _invalid("missed_run_policy", "Must be skip, run_once or run_all.")


def _check_quota(client: AbstractBaseUser) -> None:
    """At most ``RECURRING_MAX_ACTIVE_PER_CLIENT`` active or paused schedules per client.

    Locks the client's user row first, so two concurrent creations of one
    client are counted one after the other and cannot both take the last place.
    """
    locks.lock_client(client)
    limit = settings.RECURRING_MAX_ACTIVE_PER_CLIENT
    count = RecurringPayment.objects.filter(
        from_account__owner=client, status__in=(RecurringStatus.ACTIVE, RecurringStatus.PAUSED)
    ).count()
    if count >= limit:
        raise LimitExceeded(
            f"At most {limit} active or paused recurring payments per client; "
            "cancel one to create another.",
            limit=limit,
        )


def recurring_create(*, client: AbstractBaseUser, **fields) -> RecurringPayment:
    """Create a schedule from an owned, active account to an existing active account."""
    check_distinct(fields["from_account_id"], fields["to_account_id"])
    now = db_now()
    fields.setdefault("start_time", None)
    fields["start_time"] = fields["start_time"] or now
    _validate(fields, now=now)
    with transaction.atomic():
        source = Account.objects.filter(pk=fields["from_account_id"], owner=client).first()
        if source is None:
            raise NotFound(
                f"Account {fields['from_account_id']} not found.",
                account_id=fields["from_account_id"],
            )
        _check_quota(client)
        check_amount(fields["amount"], source)
        if source.status != AccountStatus.ACTIVE:
            raise AccountNotActive(
                f"Account {source.pk} is {source.status}.",
                account_id=source.pk,
                status=source.status,
            )
        # the same rule and the same answers as a one-off payment (DESIGN §8)
        payable_destination(client=client, account_id=fields["to_account_id"])
        schedule = RecurringPayment(**fields)
        schedule.cron = schedule.cron or ""
        schedule.created_at = schedule.updated_at = now
        # The first occurrence is the first instant at or after start_time that
        # is not already in the past (a schedule does not back-fill history).
        first = planned(schedule, 1)
        if first and first[0] < now:
            schedule.last_occurrence_at = now - timedelta(microseconds=1)
            first = planned(schedule, 1)
        schedule.next_run_at = first[0] if first else None
        if schedule.next_run_at is None:
            if schedule.end_time is not None:
                raise _invalid("end_time", "This schedule has no occurrence before end_time.")
            raise _invalid("cron", "This cron expression never matches a future date.")
        schedule.save()
    return schedule


def recurring_update(*, schedule_id, client, **changes) -> RecurringPayment:
    """Change amount, description, end, limits, jitter or policies of an open schedule."""
    with transaction.atomic():
        schedule = locks.lock_schedule(schedule_id, client)
        if schedule.status in (RecurringStatus.ENDED, RecurringStatus.CANCELLED):
            raise RecurringNotChangeable(
                f"Recurring payment {schedule_id} is {schedule.status}.", status=schedule.status
            )
        for name, value in changes.items():
            setattr(schedule, name, value)
        _validate(
            {
                "cron": schedule.cron,
                "interval_seconds": schedule.interval_seconds,
                "timezone": schedule.timezone,
                "start_time": schedule.start_time,
                "end_time": schedule.end_time,
                "dst_nonexistent": schedule.dst_nonexistent,
                "dst_ambiguous": schedule.dst_ambiguous,
                "missed_run_policy": schedule.missed_run_policy,
            }
        )
        if "amount" in changes:
            check_amount(schedule.amount, Account.objects.get(pk=schedule.from_account_id))
        if schedule.max_occurrences is not None and schedule.max_occurrences < (
            schedule.occurrences_run
        ):
            raise _invalid(
                "max_occurrences",
                f"{schedule.occurrences_run} occurrences have already run or been scheduled; "
                "max_occurrences cannot be lower.",
            )
        transitions.advance_schedule(schedule)
        schedule.updated_at = db_now()
        schedule.save()
        if changes.get("end_time") is not None:
            # an occurrence already materialised (a PENDING payment with its hold)
            # for an instant past the new end must not take money (an end not
            # changed here was already respected when it was materialised)
            _cancel_open_occurrences(
                schedule,
                client,
                after=schedule.end_time,
                reason="after the recurring schedule's end_time",
            )
    return schedule


def _cancel_open_occurrences(schedule, client, *, after=None, reason: str) -> None:
    """Cancel the schedule's materialised occurrences not yet executed (PENDING or
    QUEUED; those past ``after`` only) and release their holds. One executed
    meanwhile was due, and is done: it is left as it is."""
    open_payments = Payment.objects.filter(recurring=schedule, status__in=OPEN_STATUSES)
    if after is not None:
        open_payments = open_payments.filter(occurrence__scheduled_for__gt=after)
    for payment_id in open_payments.values_list("pk", flat=True):
        with contextlib.suppress(PaymentNotCancellable):
            payment_cancel(
                payment_id=payment_id,
                client=client,
                actor=Actor.CLIENT if client is not None else Actor.STAFF,
                reason=reason,
            )


def recurring_set_status(*, schedule_id, client, action: str) -> RecurringPayment:
    """pause / resume / cancel. Resuming does not run what fell due while paused.

    Occurrences already due when an active schedule is paused or cancelled but
    not yet handled (a catch-up after downtime cut short) never run either:
    they are recorded ``skipped`` by the materialiser (``set_aside_unrecorded``).

    Cancelling also cancels the occurrence already materialised (PENDING or
    QUEUED, at most the materialise-ahead window before it is due) and
    releases its hold: after a cancel no more money leaves on the schedule's
    behalf. One that is already executing or done is left as it is.
    """
    allowed = {
        "pause": ({RecurringStatus.ACTIVE}, RecurringStatus.PAUSED),
        "resume": ({RecurringStatus.PAUSED}, RecurringStatus.ACTIVE),
        "cancel": ({RecurringStatus.ACTIVE, RecurringStatus.PAUSED}, RecurringStatus.CANCELLED),
    }
    sources, target = allowed[action]
    with transaction.atomic():
        schedule = locks.lock_schedule(schedule_id, client)
        if schedule.status == target:
            return schedule
        if schedule.status not in sources:
            raise RecurringNotChangeable(
                f"Cannot {action} a schedule that is {schedule.status}.", status=schedule.status
            )
        now = db_now()
        was_active = schedule.status == RecurringStatus.ACTIVE
        transitions.set_schedule_status(schedule, target)
        if was_active:  # pause, or cancel of an active one: what was due is recorded
            materializer.set_aside_unrecorded(schedule, now, reason=str(target.value))
        if action == "pause":
            # the next instant after the cursor; a calendar no longer readable (a
            # time zone tzdata dropped) keeps the old one: the pause must not fail
            with contextlib.suppress(InvalidSchedule):
                transitions.advance_schedule(schedule)
        if action == "resume":
            schedule.consecutive_failures = 0
            if schedule.next_run_at is not None and schedule.next_run_at < now:
                schedule.last_occurrence_at = now
            # the same rule as every other move: no occurrence left (its end
            # passed while it was paused) ends it, instead of leaving it active
            # with nothing to run and counting against the client's quota
            try:
                transitions.advance_schedule(schedule)
            except InvalidSchedule:
                # parked for data no longer valid (a time zone tzdata dropped):
                # nothing can run it again, and a 500 told the client nothing
                raise RecurringNotChangeable(
                    f"Recurring payment {schedule_id} cannot run again "
                    f"({schedule.status_reason or 'its schedule is no longer valid'}); "
                    "cancel it and create a new one.",
                    status=RecurringStatus.PAUSED,
                ) from None
        if action == "cancel":
            schedule.next_run_at = None
        schedule.updated_at = now
        schedule.save()
        if action == "cancel":
            _cancel_open_occurrences(schedule, client, reason="recurring schedule cancelled")
    return schedule
