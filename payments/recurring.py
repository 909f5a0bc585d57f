"""Recurring payments: schedule services and the materialiser (DESIGN §4.2).

The materialiser (beat, every few seconds, on a worker of its own) turns each
occurrence into an ordinary payment shortly before it is due — hold placed,
PENDING, picked up by the sweeper like any other. Per schedule, under its row
lock (``SKIP LOCKED``: concurrent materialisers work on different schedules):

1. enumerate occurrences lazily from the cursor up to now + the
   materialise-ahead window (``payments.recurrence``): only what the horizon
   needs is computed, however far the schedule reaches;
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

Isolation (DESIGN §8): a run is time-boxed and handles a bounded number of
instants per schedule; each schedule is its own transaction, and one that
raises is parked (paused with a reason) instead of stopping the run.

Every occurrence row is UNIQUE (schedule, instant), so even two materialisers
that both got hold of a schedule could not create an occurrence twice.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
import uuid
from collections import deque
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.contrib.auth import get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Q

from ledger.exceptions import AccountNotActive, LedgerError
from ledger.models import Account, AccountStatus
from ledger.services import LedgerBatch

from . import metrics, webhooks
from .clock import db_now, iso_timestamp
from .exceptions import (
    InvalidRequest,
    LimitExceeded,
    NotFound,
    PaymentError,
    PaymentNotCancellable,
    amount_over_limit,
)
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
from .recurrence import occurrences as occurrence_times
from .services import SAME_ACCOUNT, partition_for, payable_destination, payment_cancel

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
    get_user_model().objects.select_for_update(no_key=True).filter(pk=client.pk).first()
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
    if fields["from_account_id"] == fields["to_account_id"]:
        raise InvalidRequest.field("to_account_id", SAME_ACCOUNT)
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
        if fields["amount"] > source.max_payment_amount:
            raise amount_over_limit(account_id=source.pk, limit=source.max_payment_amount)
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
                raise amount_over_limit(account_id=source.pk, limit=source.max_payment_amount)
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
    paused_on_error: int = 0
    retry_later: int = 0
    budget_exhausted: bool = False
    seconds: float = 0.0


def materialize_due(
    *, budget_seconds: float | None = None, batch: int | None = None
) -> MaterializeResult:
    """One bounded run of the materialiser over the schedules that have work.

    Bounded three ways, so no client's schedules can make it slow for others:
    schedules are read ``batch`` at a time, each is handled for at most
    ``RECURRING_MAX_OCCURRENCES_PER_RUN`` instants, and no schedule is started
    once ``budget_seconds`` (``RECURRING_MATERIALIZE_BUDGET_SECONDS``) have
    passed; the next run, a few seconds later, carries on. Schedules whose
    next occurrence is on time come first (most urgent first), then those
    catching up on occurrences missed while the service was down, each schedule
    at most once per run.

    Each schedule is handled in its own transaction (``materialize_one``). A
    schedule that raises is parked — paused with a ``status_reason``, a
    ``recurring.paused`` webhook, a metric and a log line — and the run goes
    on with the others; a database error that may be transient leaves the
    schedule untouched for the next run.
    """
    started = time.monotonic()
    budget = (
        settings.RECURRING_MATERIALIZE_BUDGET_SECONDS if budget_seconds is None else budget_seconds
    )
    batch = batch or settings.RECURRING_MATERIALIZE_BATCH
    result = MaterializeResult()
    now = db_now()
    horizon = now + timedelta(seconds=settings.RECURRING_MATERIALIZE_AHEAD_SECONDS)
    cutoff = now - timedelta(seconds=settings.RECURRING_MISSED_GRACE_SECONDS)
    seen: set = set()
    for window in (Q(next_run_at__gte=cutoff, next_run_at__lte=horizon), Q(next_run_at__lt=cutoff)):
        after = None
        while not result.budget_exhausted:
            due = RecurringPayment.objects.filter(window, status=RecurringStatus.ACTIVE)
            if after is not None:
                due = due.filter(
                    Q(next_run_at__gt=after[0]) | Q(next_run_at=after[0], pk__gt=after[1])
                )
            rows = list(due.order_by("next_run_at", "pk").values_list("next_run_at", "pk")[:batch])
            for row in rows:
                if time.monotonic() - started >= budget:
                    result.budget_exhausted = True
                    break
                if row[1] not in seen:
                    seen.add(row[1])
                    _materialize_isolated(row[1], result)
            if len(rows) < batch:
                break
            after = rows[-1]
    result.seconds = time.monotonic() - started
    return result


def _materialize_isolated(schedule_id, result: MaterializeResult) -> None:
    """``materialize_one``, with this schedule's failure kept to this schedule."""
    try:
        materialize_one(schedule_id, result)
    except (OperationalError, InterfaceError):
        # The database, not the schedule: leave it as it was for the next run.
        result.retry_later += 1
        metrics.recurring_errors.labels(outcome="retry").inc()
        logger.warning("recurring %s: database error, retried next run", schedule_id, exc_info=True)
    except Exception as exc:
        result.paused_on_error += 1
        recurring_park(schedule_id=schedule_id, error=exc)


def recurring_park(*, schedule_id, error: BaseException) -> None:
    """Pause a schedule the materialiser cannot handle, so it cannot stop the others.

    The client sees ``status: paused`` with a ``status_reason`` and gets a
    ``recurring.paused`` webhook; operators get
    ``payments_recurring_errors_total{outcome="paused"}`` and the traceback in
    the log. Resuming it retries; if the fault is still there it is parked again.
    """
    metrics.recurring_errors.labels(outcome="paused").inc()
    logger.error(
        "recurring %s paused: the materialiser failed on it",
        schedule_id,
        exc_info=(type(error), error, error.__traceback__),
        extra={"recurring_payment_id": str(schedule_id), "error_class": type(error).__name__},
    )
    reason = (
        f"Paused: this schedule could not be processed ({type(error).__name__}); "
        "operators have been alerted. Resume it to retry."
    )
    try:
        with transaction.atomic():
            schedule = (
                RecurringPayment.objects.select_for_update(no_key=True, of=("self",))
                .select_related("from_account")
                .filter(pk=schedule_id, status=RecurringStatus.ACTIVE)
                .first()
            )
            if schedule is None:
                return
            schedule.status = RecurringStatus.PAUSED
            schedule.status_reason = reason[:255]
            schedule.updated_at = db_now()
            schedule.save(update_fields=["status", "status_reason", "updated_at"])
            owner = schedule.from_account.owner_id
            if owner is not None:
                data = {
                    "recurring_payment_id": str(schedule.pk),
                    "reason": "error",
                    "status_reason": schedule.status_reason,
                }
                webhooks.emit([(owner, "recurring.paused", data)])
    except Exception:  # the database is gone too: the next run tries again
        logger.exception("could not pause recurring %s", schedule_id)


def materialize_one(schedule_id, result: MaterializeResult | None = None) -> MaterializeResult:
    """Handle one schedule's occurrences up to the horizon, under its row lock.

    Occurrences are enumerated lazily from the cursor, so only what the
    horizon needs is computed. Missed occurrences (older than the grace) are
    streamed: all but the last ``keep`` of them (0 for ``skip``, 1 for
    ``run_once``, ``max_catch_up`` for ``run_all``) are recorded ``skipped``
    as soon as they are known not to be among the last ones. At most
    ``RECURRING_MAX_OCCURRENCES_PER_RUN`` instants are handled per call; the
    cursor then stops there and the schedule stays due for the next run.
    """
    result = result or MaterializeResult()
    with transaction.atomic():
        schedule = (
            RecurringPayment.objects.select_for_update(no_key=True, skip_locked=True, of=("self",))
            .select_related("from_account")
            .filter(pk=schedule_id, status=RecurringStatus.ACTIVE)
            .first()
        )
        if schedule is None:
            return result  # another materialiser has it, or it is no longer active
        now = db_now()
        horizon = now + timedelta(seconds=settings.RECURRING_MATERIALIZE_AHEAD_SECONDS)
        cutoff = now - timedelta(seconds=settings.RECURRING_MISSED_GRACE_SECONDS)
        cap = settings.RECURRING_MAX_OCCURRENCES_PER_RUN
        policy = schedule.missed_run_policy
        keep = {"skip": 0, "run_once": 1, "run_all": schedule.max_catch_up}[policy]
        occurrences: list[RecurringOccurrence] = []
        missed: deque[datetime] = deque()
        on_time: list[datetime] = []
        past_missed = True
        for instant in occurrence_times(spec_of(schedule), after=schedule.last_occurrence_at):
            if instant > horizon:
                break
            if len(occurrences) + len(on_time) >= cap:
                past_missed = bool(on_time)
                break
            if instant >= cutoff:
                on_time.append(instant)
                continue
            missed.append(instant)
            if len(missed) > keep:  # not among the last `keep`: it will not run
                occurrences.append(
                    RecurringOccurrence(
                        recurring=schedule,
                        scheduled_for=missed.popleft(),
                        status=OccurrenceStatus.SKIPPED,
                        reason=f"missed ({policy})",
                    )
                )
        # The last `keep` missed ones run only once it is known they are the last.
        to_run = [*missed, *on_time] if past_missed else []
        events = []
        for instant in to_run[: max(cap - len(occurrences), 0)]:
            if schedule.status != RecurringStatus.ACTIVE or _used_up(schedule):
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
        owner = schedule.from_account.owner_id
        if owner is not None:
            webhooks.emit((owner, event_type, data) for event_type, data in events)
        result.schedules += 1
    return result


def _used_up(schedule: RecurringPayment) -> bool:
    """``max_occurrences`` counts occurrences that ran or failed, not skipped ones."""
    return (
        schedule.max_occurrences is not None
        and schedule.occurrences_run >= schedule.max_occurrences
    )


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
            created = db_now()
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
                created_at=created,
                updated_at=created,
            )
            PaymentEvent.objects.create(
                payment=payment,
                type="scheduled",
                to_status=PaymentStatus.PENDING,
                actor=Actor.SYSTEM,
                fence=0,
                data={
                    "recurring_payment_id": str(schedule.pk),
                    "occurrence": iso_timestamp(instant),
                },
            )
    except LedgerError as exc:
        schedule.occurrences_run += 1
        schedule.consecutive_failures += 1
        data = {
            "recurring_payment_id": str(schedule.pk),
            "occurrence": iso_timestamp(instant),
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
