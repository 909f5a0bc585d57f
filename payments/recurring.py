"""Recurring payments: schedule services and the materialiser (DESIGN §4.2).

The materialiser (beat, every few seconds) turns each occurrence into an
ordinary payment shortly before it is due — hold placed, PENDING, picked up by
the sweeper like any other. Per schedule, under its row lock
(``SKIP LOCKED``: concurrent materialisers work on different schedules):

1. enumerate occurrences after the cursor up to now + the materialise-ahead
   window (``payments.recurrence``);
2. occurrences already more than the grace in the past were *missed* (the
   service was down): the missed-run policy decides which run now —
   ``skip`` none, ``run_once`` the latest, ``run_all`` the latest
   ``max_catch_up`` — and every other one is recorded ``skipped``;
3. each occurrence that runs places its hold and creates its payment, or,
   when funds are short, is recorded ``failed`` (``insufficient_funds``) and
   the schedule goes on; after ``max_consecutive_failures`` in a row it is
   paused, with an event and a ``recurring.paused`` webhook;
4. the cursor advances; a schedule past its end or its ``max_occurrences``
   ends.

Every occurrence row is UNIQUE (schedule, instant), so even two materialisers
that both got hold of a schedule could not create an occurrence twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.contrib.auth.models import AbstractBaseUser
from django.db import transaction

from ledger.exceptions import AccountNotActive, AccountNotFound, LedgerError
from ledger.models import Account, AccountStatus
from ledger.services import LedgerBatch

from . import metrics, webhooks
from .clock import db_now
from .exceptions import InvalidRequest, NotFound, PaymentError, PaymentNotCancellable
from .models import (
    OPEN_STATUSES,
    Actor,
    OccurrenceStatus,
    Payment,
    PaymentEvent,
    PaymentStatus,
    RecurringOccurrence,
    RecurringPayment,
    RecurringStatus,
)
from .recurrence import (
    AMBIGUOUS_POLICIES,
    NONEXISTENT_POLICIES,
    InvalidSchedule,
    Spec,
    upcoming,
    validate_cron,
    zone,
)
from .services import partition_for, payment_cancel

logger = logging.getLogger(__name__)

MISSED_RUN_POLICIES = ("skip", "run_once", "run_all")
UPCOMING_COUNT = 5


class RecurringNotChangeable(PaymentError):
    """The schedule has ended or was cancelled."""

    code = "recurring_not_modifiable"


def spec_of(schedule: RecurringPayment) -> Spec:
    return Spec(
        cron=schedule.cron or None,
        interval_seconds=schedule.interval_seconds,
        timezone=schedule.timezone,
        start_time=schedule.start_time,
        end_time=schedule.end_time,
        nonexistent=schedule.dst_nonexistent,
        ambiguous=schedule.dst_ambiguous,
    )


def planned(schedule: RecurringPayment, count: int = UPCOMING_COUNT) -> list[datetime]:
    """The next planned occurrence instants (empty once ended or cancelled)."""
    if schedule.status in (RecurringStatus.ENDED, RecurringStatus.CANCELLED):
        return []
    remaining = None
    if schedule.max_occurrences is not None:
        remaining = schedule.max_occurrences - schedule.occurrences_run
        if remaining <= 0:
            return []
    times = upcoming(spec_of(schedule), after=schedule.last_occurrence_at, count=count)
    return times[:remaining] if remaining is not None else times


def jitter_for(schedule: RecurringPayment, instant: datetime) -> timedelta:
    """Deterministic spread in [0, jitter_seconds]: stable across retries and nodes."""
    if not schedule.jitter_seconds:
        return timedelta(0)
    digest = hashlib.sha256(f"{schedule.pk}:{instant.isoformat()}".encode()).digest()
    fraction = int.from_bytes(digest[:8], "big") / 2**64
    return timedelta(seconds=round(fraction * schedule.jitter_seconds, 3))


def _validate(fields: dict) -> None:
    try:
        if fields.get("cron"):
            fields["cron"] = validate_cron(fields["cron"])
        zone(fields.get("timezone") or "UTC")
    except InvalidSchedule as exc:
        raise InvalidRequest(str(exc), fields={"cron": str(exc)}) from None
    if bool(fields.get("cron")) == bool(fields.get("interval_seconds")):
        raise InvalidRequest(
            "Give exactly one of cron or interval_seconds.",
            fields={"cron": "exactly one of cron, interval_seconds"},
        )
    if fields.get("interval_seconds") is not None and fields["interval_seconds"] < 60:
        raise InvalidRequest(
            "interval_seconds must be at least 60.", fields={"interval_seconds": "at least 60"}
        )
    if fields.get("end_time") and fields["end_time"] <= fields["start_time"]:
        raise InvalidRequest(
            "end_time must be after start_time.", fields={"end_time": "after start_time"}
        )
    if (
        fields.get("dst_nonexistent", "shift") not in NONEXISTENT_POLICIES
        or fields.get("dst_ambiguous", "first") not in AMBIGUOUS_POLICIES
    ):
        raise InvalidRequest("Unknown DST policy.", fields={"dst_policy": "unknown policy"})
    if fields.get("missed_run_policy", "skip") not in MISSED_RUN_POLICIES:
        raise InvalidRequest(
            "Unknown missed-run policy.", fields={"missed_run_policy": "skip, run_once, run_all"}
        )


def recurring_create(*, client: AbstractBaseUser, **fields) -> RecurringPayment:
    """Create a schedule from an owned, active account to an existing active account."""
    if fields["from_account_id"] == fields["to_account_id"]:
        raise InvalidRequest(
            "from_account_id and to_account_id must differ.",
            fields={"to_account_id": "must differ from from_account_id"},
        )
    now = db_now()
    fields.setdefault("start_time", None)
    fields["start_time"] = fields["start_time"] or now
    _validate(fields)
    with transaction.atomic():
        source = Account.objects.filter(pk=fields["from_account_id"], owner=client).first()
        if source is None:
            raise NotFound(
                f"Account {fields['from_account_id']} not found.",
                account_id=fields["from_account_id"],
            )
        if fields["amount"] > source.max_payment_amount:
            raise InvalidRequest(
                f"amount exceeds this account's limit of {source.max_payment_amount}.",
                fields={"amount": f"at most {source.max_payment_amount}"},
            )
        target = Account.objects.filter(pk=fields["to_account_id"]).first()
        if target is None:
            raise AccountNotFound(
                f"Account {fields['to_account_id']} does not exist.",
                account_id=fields["to_account_id"],
            )
        for account in (source, target):
            if account.status != AccountStatus.ACTIVE:
                raise AccountNotActive(
                    f"Account {account.pk} is {account.status}.", account_id=account.pk
                )
        schedule = RecurringPayment(**fields)
        schedule.cron = schedule.cron or ""
        schedule.updated_at = now
        # The first occurrence is the first instant at or after start_time that
        # is not already in the past (a schedule does not back-fill history).
        first = planned(schedule, 1)
        if first and first[0] < now:
            schedule.last_occurrence_at = now - timedelta(microseconds=1)
            first = planned(schedule, 1)
        schedule.next_run_at = first[0] if first else None
        if schedule.next_run_at is None:
            raise InvalidRequest(
                "This schedule has no occurrence in the future.",
                fields={"end_time": "no occurrence before end_time"},
            )
        schedule.save()
    return schedule


def _lock(schedule_id, client) -> RecurringPayment:
    qs = RecurringPayment.objects.select_for_update(no_key=True, of=("self",))
    if client is not None:
        qs = qs.filter(from_account__owner=client)
    schedule = qs.filter(pk=schedule_id).first()
    if schedule is None:
        raise NotFound(
            f"Recurring payment {schedule_id} not found.", recurring_payment_id=str(schedule_id)
        )
    return schedule


def recurring_update(*, schedule_id, client, **changes) -> RecurringPayment:
    """Change amount, description, end, limits, jitter or policies of an open schedule."""
    with transaction.atomic():
        schedule = _lock(schedule_id, client)
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
            source = Account.objects.get(pk=schedule.from_account_id)
            if schedule.amount > source.max_payment_amount:
                raise InvalidRequest(
                    f"amount exceeds this account's limit of {source.max_payment_amount}.",
                    fields={"amount": f"at most {source.max_payment_amount}"},
                )
        nxt = planned(schedule, 1)
        schedule.next_run_at = nxt[0] if nxt else None
        if schedule.next_run_at is None and schedule.status == RecurringStatus.ACTIVE:
            schedule.status = RecurringStatus.ENDED
        schedule.updated_at = db_now()
        schedule.save()
    return schedule


def recurring_set_status(*, schedule_id, client, action: str) -> RecurringPayment:
    """pause / resume / cancel. Resuming does not run what fell due while paused.

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
        schedule = _lock(schedule_id, client)
        if schedule.status == target:
            return schedule
        if schedule.status not in sources:
            raise RecurringNotChangeable(
                f"Cannot {action} a schedule that is {schedule.status}.", status=schedule.status
            )
        now = db_now()
        schedule.status = target
        schedule.status_reason = ""
        if action == "resume":
            schedule.consecutive_failures = 0
            if schedule.next_run_at is not None and schedule.next_run_at < now:
                schedule.last_occurrence_at = now
            nxt = planned(schedule, 1)
            schedule.next_run_at = nxt[0] if nxt else None
        if action == "cancel":
            schedule.next_run_at = None
        schedule.updated_at = now
        schedule.save()
        if action == "cancel":
            open_ids = Payment.objects.filter(
                recurring=schedule, status__in=OPEN_STATUSES
            ).values_list("pk", flat=True)
            for payment_id in open_ids:
                # one executed meanwhile was due, and is done: leave it
                with contextlib.suppress(PaymentNotCancellable):
                    payment_cancel(
                        payment_id=payment_id,
                        client=client,
                        actor=Actor.CLIENT if client is not None else Actor.STAFF,
                        reason="recurring schedule cancelled",
                    )
    return schedule


# --- materialiser --------------------------------------------------------------


@dataclass
class MaterializeResult:
    scheduled: int = 0
    failed: int = 0
    skipped: int = 0
    schedules: int = 0


def materialize_due(*, limit: int = 200) -> MaterializeResult:
    """Handle every active schedule whose next occurrence is within the window."""
    result = MaterializeResult()
    horizon = db_now() + timedelta(seconds=settings.RECURRING_MATERIALIZE_AHEAD_SECONDS)
    ids = list(
        RecurringPayment.objects.filter(status=RecurringStatus.ACTIVE, next_run_at__lte=horizon)
        .order_by("next_run_at")
        .values_list("pk", flat=True)[:limit]
    )
    for schedule_id in ids:
        materialize_one(schedule_id, result)
    return result


def materialize_one(schedule_id, result: MaterializeResult | None = None) -> MaterializeResult:
    result = result or MaterializeResult()
    with transaction.atomic():
        schedule = (
            RecurringPayment.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(pk=schedule_id, status=RecurringStatus.ACTIVE)
            .first()
        )
        if schedule is None:
            return result  # another materialiser has it, or it is no longer active
        now = db_now()
        horizon = now + timedelta(seconds=settings.RECURRING_MATERIALIZE_AHEAD_SECONDS)
        grace = timedelta(seconds=settings.RECURRING_MISSED_GRACE_SECONDS)
        instants = [t for t in planned(schedule, 10_000) if t <= horizon]
        missed = [t for t in instants if t < now - grace]
        on_time = [t for t in instants if t >= now - grace]
        policy = schedule.missed_run_policy
        run_missed = {
            "skip": [],
            "run_once": missed[-1:],
            "run_all": missed[-schedule.max_catch_up :] if schedule.max_catch_up else [],
        }[policy]
        occurrences: list[RecurringOccurrence] = []
        for instant in missed:
            if instant not in run_missed:
                occurrences.append(
                    RecurringOccurrence(
                        recurring=schedule,
                        scheduled_for=instant,
                        status=OccurrenceStatus.SKIPPED,
                        reason=f"missed ({policy})",
                    )
                )
        events = []
        for instant in [*run_missed, *on_time]:
            if schedule.status != RecurringStatus.ACTIVE:
                break
            due_at = max(instant + jitter_for(schedule, instant), now)
            occurrence, event = _run_occurrence(schedule, instant, due_at)
            occurrences.append(occurrence)
            events.extend(event)
        if occurrences:
            RecurringOccurrence.objects.bulk_create(occurrences)
            schedule.last_occurrence_at = max(o.scheduled_for for o in occurrences)
        for occurrence in occurrences:
            metrics.recurring_occurrences.labels(status=occurrence.status).inc()
            if occurrence.status == OccurrenceStatus.SCHEDULED:
                result.scheduled += 1
            elif occurrence.status == OccurrenceStatus.FAILED:
                result.failed += 1
            else:
                result.skipped += 1
        nxt = planned(schedule, 1)
        schedule.next_run_at = nxt[0] if nxt else None
        if schedule.next_run_at is None and schedule.status == RecurringStatus.ACTIVE:
            schedule.status = RecurringStatus.ENDED
        schedule.updated_at = now
        schedule.save()
        owner = (
            Account.objects.filter(pk=schedule.from_account_id)
            .values_list("owner_id", flat=True)
            .first()
        )
        if owner is not None:
            webhooks.emit((owner, event_type, data) for event_type, data in events)
        result.schedules += 1
    return result


def _run_occurrence(schedule: RecurringPayment, instant: datetime, due_at: datetime):
    """Hold + payment for one occurrence, or a failed occurrence; caller holds the schedule lock."""
    events = []
    payment_id = uuid.uuid4()
    try:
        with transaction.atomic():  # savepoint: a refused hold leaves nothing behind
            target = Account.objects.filter(pk=schedule.to_account_id).only("status").first()
            if target is None or target.status != AccountStatus.ACTIVE:
                raise AccountNotActive(f"Account {schedule.to_account_id} is not active.")
            batch = LedgerBatch(account_ids=[schedule.from_account_id])
            hold = batch.place_hold(
                account_id=schedule.from_account_id,
                amount=schedule.amount,
                reference=f"payment:{payment_id}",
            )
            batch.flush()
            payment = Payment.objects.create(
                id=payment_id,
                from_account_id=schedule.from_account_id,
                to_account_id=schedule.to_account_id,
                owner_id=batch.accounts[schedule.from_account_id].owner_id,
                amount=schedule.amount,
                description=schedule.description,
                due_at=due_at,
                run_at=due_at,
                partition=partition_for(schedule.from_account_id),
                hold=hold,
                recurring=schedule,
                updated_at=db_now(),
            )
            PaymentEvent.objects.create(
                payment=payment,
                type="scheduled",
                to_status=PaymentStatus.PENDING,
                actor=Actor.SYSTEM,
                fence=0,
                data={"recurring_payment_id": str(schedule.pk), "occurrence": instant.isoformat()},
            )
    except LedgerError as exc:
        schedule.occurrences_run += 1
        schedule.consecutive_failures += 1
        data = {
            "recurring_payment_id": str(schedule.pk),
            "occurrence": instant.isoformat(),
            "error_code": exc.code,
            "consecutive_failures": schedule.consecutive_failures,
        }
        events.append(("recurring.occurrence_failed", data))
        if schedule.consecutive_failures >= schedule.max_consecutive_failures:
            schedule.status = RecurringStatus.PAUSED
            schedule.status_reason = (
                f"Paused after {schedule.consecutive_failures} consecutive failed occurrences "
                f"(last: {exc.code})."
            )
            events.append(("recurring.paused", {**data, "reason": "too many consecutive failures"}))
            logger.warning(
                "recurring %s paused after %s failures", schedule.pk, schedule.consecutive_failures
            )
        return (
            RecurringOccurrence(
                recurring=schedule,
                scheduled_for=instant,
                status=OccurrenceStatus.FAILED,
                reason=exc.code,
            ),
            events,
        )
    schedule.occurrences_run += 1
    schedule.consecutive_failures = 0
    return (
        RecurringOccurrence(
            recurring=schedule,
            scheduled_for=instant,
            status=OccurrenceStatus.SCHEDULED,
            payment=payment,
        ),
        events,
    )
