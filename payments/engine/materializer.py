"""The recurring materialiser (DESIGN §4.2); the schedule services are in
``payments.services.recurring``.

The materialiser (beat, every few seconds, on a worker of its own) turns each
occurrence into an ordinary payment shortly before it is due — hold placed,
PENDING, picked up by the sweeper like any other. Per schedule, under its row
lock (``SKIP LOCKED``: concurrent materialisers work on different schedules):

1. enumerate occurrences lazily from the cursor up to now + the
   materialise-ahead window (``payments.calendar``): only what the horizon
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
instants per schedule; each schedule is handled in transactions of its own
(at most ``RECURRING_OCCURRENCES_PER_TRANSACTION`` holds each, so no source
account stays locked long), and one that raises is parked (paused with a
reason) instead of stopping the run. No statement of those transactions runs
longer than ``RECURRING_STATEMENT_TIMEOUT_SECONDS``: a schedule whose source
account another session keeps locked is left for a later run instead of
holding this one, and later runs take it after every other (``Deferred``).

Every occurrence row is UNIQUE (schedule, instant), so even two materialisers
that both got hold of a schedule could not create an occurrence twice.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction
from django.db.models import Q

from ledger.exceptions import AccountNotActive, AmountOverLimit, LedgerError
from ledger.models import Account, AccountStatus
from ledger.services import LedgerBatch

from .. import locks, metrics, transitions, webhooks
from ..calendar import jitter_for, spec_of, upcoming
from ..calendar import occurrences as occurrence_times
from ..clock import db_now, iso_timestamp
from ..exceptions import InvalidSchedule
from ..models import (
    Actor,
    OccurrenceStatus,
    RecurringBacklog,
    RecurringOccurrence,
    RecurringPayment,
    RecurringStatus,
)
from .bounds import bound_statements, statement_timed_out

logger = logging.getLogger(__name__)


class Deferred:
    """Schedules whose transaction ran out of ``RECURRING_STATEMENT_TIMEOUT_SECONDS``
    lately — most often waiting for a source account another session holds — to
    be taken after every other schedule of a run for ``seconds``, so that one
    lock nobody releases costs each run at most one statement's wait, at its end,
    not the time box of every client behind it. Per process (the recurring
    worker), lost with it: at worst one more wait at the front of a run. Capped at
    ``limit`` ids, oldest dropped; a schedule that goes through leaves at once."""

    def __init__(self, seconds: float = 60.0, limit: int = 10_000, clock=time.monotonic) -> None:
        self.seconds = seconds
        self.limit = limit
        self.clock = clock
        self._until: dict = {}  # schedule id -> expiry by ``clock``, in insertion order

    def add(self, schedule_id) -> None:
        self._until.pop(schedule_id, None)
        self._until[schedule_id] = self.clock() + self.seconds
        while len(self._until) > self.limit:
            del self._until[next(iter(self._until))]

    def __contains__(self, schedule_id) -> bool:
        until = self._until.get(schedule_id)
        if until is None:
            return False
        if until <= self.clock():
            del self._until[schedule_id]
            return False
        return True

    def discard(self, schedule_id) -> None:
        self._until.pop(schedule_id, None)


deferred = Deferred()


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
    at most once per run, then the backlogs of stopped schedules; a schedule that
    lately ran out of its statement time limit (``Deferred``) comes after all of
    those, and the run tries no more of them once one fails again.

    Each schedule is handled in transactions of its own (``materialize_one``). A
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
    last: list = []  # deferred schedules found due, in the order found
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
                if row[1] in seen:
                    continue
                seen.add(row[1])
                if row[1] in deferred:
                    last.append(row[1])
                else:
                    _materialize_isolated(row[1], result)
            if len(rows) < batch:
                break
            after = rows[-1]
    backlog = RecurringBacklog.objects.order_by("pk").values_list("pk", flat=True)
    for backlog_id in list(backlog[:batch]):
        if time.monotonic() - started >= budget:
            result.budget_exhausted = True
            break
        _record_backlog_isolated(backlog_id, result)
    # Last, the deferred, until one of them fails again: a lock still held costs
    # the run one wait, whatever number of schedules wait for it (a client's
    # schedules paying from one locked account took the time box every run,
    # the backlog's recording with it: a reviewer's probe)
    for schedule_id in last:
        if time.monotonic() - started >= budget:
            result.budget_exhausted = True
            break
        _materialize_isolated(schedule_id, result)
        if schedule_id in deferred:  # not through (a success leaves the set)
            break
    result.seconds = time.monotonic() - started
    return result


def set_aside_unrecorded(schedule: RecurringPayment, now: datetime, *, reason: str) -> None:
    """A schedule stopping (paused or cancelled; the caller holds its row lock and
    saves it): the instants up to ``now`` not yet handled — a catch-up after
    downtime cut short, an occurrence still inside the missed-run grace — go to
    a ``RecurringBacklog`` row that the materialiser records ``skipped``
    (``reason``), and the cursor moves to ``now``. Without it a resume, which
    starts again from now, dropped them without a trace. O(1) here: however
    many there are, they are recorded a bounded number per run."""
    cursor = schedule.last_occurrence_at
    if cursor is not None and cursor >= now:
        return
    try:
        first = next(occurrence_times(spec_of(schedule), after=cursor), None)
    except InvalidSchedule:
        return  # its calendar cannot be read (a time zone dropped): nothing to record
    if first is None or first > now:
        return
    RecurringBacklog.objects.create(recurring=schedule, after=cursor, until=now, reason=reason)
    schedule.last_occurrence_at = now


def _record_backlog_isolated(backlog_id, result: MaterializeResult) -> None:
    """``record_backlog``, with a failure kept to this row: a database error leaves
    it for the next run; anything else (its calendar no longer readable) drops
    the row with a log line, since no later run could read it either."""
    try:
        record_backlog(backlog_id, result)
    except (OperationalError, InterfaceError):
        result.retry_later += 1
        metrics.recurring_errors.labels(outcome="retry").inc()
        logger.warning("recurring backlog %s: database error, retried next run", backlog_id)
    except Exception:
        metrics.recurring_errors.labels(outcome="dropped").inc()
        logger.exception("recurring backlog %s could not be recorded; dropped", backlog_id)
        RecurringBacklog.objects.filter(pk=backlog_id).delete()


def record_backlog(backlog_id, result: MaterializeResult | None = None) -> MaterializeResult:
    """Record up to ``RECURRING_MAX_OCCURRENCES_PER_RUN`` of a backlog's instants
    ``skipped``, in one transaction under the row's lock (``SKIP LOCKED``: two
    materialisers never record the same ones); the row moves on, or goes once
    it reaches ``until``."""
    result = result or MaterializeResult()
    with transaction.atomic():
        row = (
            RecurringBacklog.objects.select_for_update(skip_locked=True, of=("self",))
            .select_related("recurring")
            .filter(pk=backlog_id)
            .first()
        )
        if row is None:
            return result
        instants = []
        done = True
        for instant in occurrence_times(spec_of(row.recurring), after=row.after):
            if instant > row.until:
                break
            if len(instants) == settings.RECURRING_MAX_OCCURRENCES_PER_RUN:
                done = False
                break
            instants.append(instant)
        RecurringOccurrence.objects.bulk_create(
            [
                RecurringOccurrence(
                    recurring=row.recurring,
                    scheduled_for=instant,
                    status=OccurrenceStatus.SKIPPED,
                    reason=row.reason,
                )
                for instant in instants
            ],
            # a PATCHed dst_policy can name an instant the schedule had already handled
            ignore_conflicts=True,
        )
        if instants:
            metrics.recurring_occurrences.labels(status=OccurrenceStatus.SKIPPED).inc(len(instants))
            result.skipped += len(instants)
        if done:
            row.delete()
        else:
            row.after = instants[-1]
            row.save(update_fields=["after"])
    return result


def _materialize_isolated(schedule_id, result: MaterializeResult) -> None:
    """``materialize_one``, with this schedule's failure kept to this schedule."""
    try:
        materialize_one(schedule_id, result)
    except (OperationalError, InterfaceError) as exc:
        # The database, not the schedule: leave it as it was for the next run.
        result.retry_later += 1
        metrics.recurring_errors.labels(outcome="retry").inc()
        if statement_timed_out(exc):
            # another session holds its account (or a row it needs): not its
            # fault either, but later runs take it last (``Deferred``)
            deferred.add(schedule_id)
            logger.warning(
                "recurring %s: a statement ran out of its %s s limit (a row locked "
                "elsewhere?); retried next run, after the others",
                schedule_id,
                settings.RECURRING_STATEMENT_TIMEOUT_SECONDS,
            )
            return
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
            schedule = locks.lock_active_schedule(schedule_id)
            if schedule is None:
                return
            transitions.set_schedule_status(schedule, RecurringStatus.PAUSED, reason=reason)
            schedule.updated_at = db_now()
            try:
                with transaction.atomic():  # its calendar may be what failed
                    set_aside_unrecorded(schedule, schedule.updated_at, reason="paused")
            except Exception:
                logger.exception("recurring %s: occurrences left unrecorded", schedule_id)
            schedule.save(
                update_fields=["status", "status_reason", "updated_at", "last_occurrence_at"]
            )
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
    """Handle one schedule's occurrences up to the horizon.

    Occurrences are enumerated lazily from the cursor, so only what the
    horizon needs is computed. Missed occurrences (older than the grace) are
    streamed: all but the last ``keep`` of them (0 for ``skip``, 1 for
    ``run_once``, ``max_catch_up`` for ``run_all``) are recorded ``skipped``
    as soon as they are known not to be among the last ones. At most
    ``RECURRING_MAX_OCCURRENCES_PER_RUN`` instants are handled per call; the
    cursor then stops there and the schedule stays due for the next run.

    The occurrences that run are committed ``RECURRING_OCCURRENCES_PER_TRANSACTION``
    at a time (``_materialize_piece``, each under the schedule's row lock),
    the cursor advanced with each: placing a hold locks the source account
    until commit, and a catch-up of 200 held it for ~1.3 s in one transaction
    — every batch of the payment workers paying from or to that account, and
    the other clients' payments collapsed into those batches, waited for it.
    """
    result = result or MaterializeResult()
    left = settings.RECURRING_MAX_OCCURRENCES_PER_RUN
    while left > 0:
        piece = _materialize_piece(schedule_id, result, left)
        if piece is None:
            break  # another materialiser has it, or it is no longer active
        if left == settings.RECURRING_MAX_OCCURRENCES_PER_RUN:
            result.schedules += 1  # its first piece: the schedule was handled
            deferred.discard(schedule_id)
        handled, more = piece
        left -= handled
        if not (more and handled):
            break
    return result


def _materialize_piece(schedule_id, result: MaterializeResult, cap: int) -> tuple[int, bool] | None:
    """One transaction of ``materialize_one``: at most ``cap`` instants, of which at
    most ``RECURRING_OCCURRENCES_PER_TRANSACTION`` run. Returns the instants
    handled and whether occurrences to run were left for another piece; None
    when the schedule could not be locked. No statement of it waits or runs
    longer than ``RECURRING_STATEMENT_TIMEOUT_SECONDS`` (PostgreSQL's
    ``statement_timeout``, local to the transaction; an ``OperationalError``
    past it, which rolls the piece back)."""
    with transaction.atomic():
        bound_statements(settings.RECURRING_STATEMENT_TIMEOUT_SECONDS)
        schedule = locks.lock_active_schedule(schedule_id, skip_locked=True)
        if schedule is None:
            return None
        now = db_now()
        horizon = now + timedelta(seconds=settings.RECURRING_MATERIALIZE_AHEAD_SECONDS)
        cutoff = now - timedelta(seconds=settings.RECURRING_MISSED_GRACE_SECONDS)
        policy = schedule.missed_run_policy
        keep = {"skip": 0, "run_once": 1, "run_all": schedule.max_catch_up}[policy]
        if schedule.max_occurrences is not None:
            # the latest missed ones that can still run: with fewer occurrences
            # left than `keep`, the oldest kept ran and the rest were never recorded
            keep = min(keep, max(schedule.max_occurrences - schedule.occurrences_run, 0))
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
        piece = min(max(cap - len(occurrences), 0), settings.RECURRING_OCCURRENCES_PER_TRANSACTION)
        events = []
        for instant in to_run[:piece]:
            if schedule.status != RecurringStatus.ACTIVE or _used_up(schedule):
                break
            due_at = max(instant + jitter_for(schedule, instant), now)
            occurrence, event = _run_occurrence(schedule, instant, due_at)
            occurrences.append(occurrence)
            events.extend(event)
        if occurrences:
            RecurringOccurrence.objects.bulk_create(occurrences)
            schedule.last_occurrence_at = max(o.scheduled_for for o in occurrences)
        if schedule.status == RecurringStatus.PAUSED:  # consecutive failures paused it
            set_aside_unrecorded(schedule, now, reason="paused")
        for occurrence in occurrences:
            metrics.recurring_occurrences.labels(status=occurrence.status).inc()
            if occurrence.status == OccurrenceStatus.SCHEDULED:
                result.scheduled += 1
            elif occurrence.status == OccurrenceStatus.FAILED:
                result.failed += 1
            else:
                result.skipped += 1
        transitions.advance_schedule(schedule)
        schedule.updated_at = now
        schedule.save()
        owner = schedule.from_account.owner_id
        if owner is not None:
            webhooks.emit((owner, event_type, data) for event_type, data in events)
    return len(occurrences), len(to_run) > piece


def _used_up(schedule: RecurringPayment) -> bool:
    """``max_occurrences`` counts occurrences that ran or failed, not skipped ones."""
    return (
        schedule.max_occurrences is not None
        and schedule.occurrences_run >= schedule.max_occurrences
    )


def _has_more(schedule: RecurringPayment, instant: datetime) -> bool:
    """Whether the schedule has an occurrence after ``instant`` (its end and
    ``max_occurrences`` counted)."""
    return not _used_up(schedule) and bool(upcoming(spec_of(schedule), after=instant, count=1))


def _run_occurrence(schedule: RecurringPayment, instant: datetime, due_at: datetime):
    """Hold + payment for one occurrence, or a failed occurrence; caller holds the schedule lock."""
    events = []
    try:
        with transaction.atomic():  # savepoint: a refused hold leaves nothing behind
            target = Account.objects.filter(pk=schedule.to_account_id).only("status").first()
            if target is None or target.status != AccountStatus.ACTIVE:
                raise AccountNotActive(f"Account {schedule.to_account_id} is not active.")
            batch = LedgerBatch(account_ids=[schedule.from_account_id])
            source = batch.accounts[schedule.from_account_id]
            if schedule.amount > source.max_payment_amount:
                # the limit as it is now, like a one-off payment created now
                # (checked at create and PATCH only, a lowered limit was never applied)
                raise AmountOverLimit(
                    f"Amount {schedule.amount} is over account {source.pk}'s "
                    f"max_payment_amount ({source.max_payment_amount}).",
                    account_id=source.pk,
                    max_payment_amount=source.max_payment_amount,
                )
            payment = transitions.schedule(
                batch,
                from_account_id=schedule.from_account_id,
                to_account_id=schedule.to_account_id,
                amount=schedule.amount,
                description=schedule.description,
                due_at=due_at,
                now=db_now(),
                recurring_id=schedule.pk,
                actor=Actor.SYSTEM,
                event_data={
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
        if schedule.consecutive_failures >= schedule.max_consecutive_failures and _has_more(
            schedule, instant
        ):
            # (the last occurrence it had failing ends it instead: paused, it
            # waited for a resume that could only end it, in the client's quota)
            transitions.set_schedule_status(
                schedule,
                RecurringStatus.PAUSED,
                reason=f"Paused after {schedule.consecutive_failures} consecutive failed "
                f"occurrences (last: {exc.code}).",
            )
            paused = {
                "reason": "too many consecutive failures",
                "status_reason": schedule.status_reason,
            }
            events.append(("recurring.paused", {**data, **paused}))
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
