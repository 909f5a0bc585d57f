"""The recurring materialiser (payments.engine.materializer): holds and payments
made shortly before each occurrence, failures, missed runs, limits, concurrency.

The schedule API and the end-to-end cases (DST policies reaching payments,
resume, cancel) are in tests/payments/test_recurring.py.
"""

import threading
from datetime import timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.utils import timezone

from ledger.models import Account
from payments import calendar
from payments.engine import materializer
from payments.models import Payment, RecurringOccurrence
from tests.factories import AccountFactory, UserFactory
from tests.payments.helpers import make_schedule

pytestmark = pytest.mark.django_db


def test_materialiser_places_hold_and_creates_payment_shortly_before_due(accounts):
    source, target = accounts
    start = timezone.now() + timedelta(seconds=30)
    schedule = make_schedule(source, target, start=start, amount=70)
    result = materializer.materialize_due()
    assert (result.scheduled, result.failed, result.skipped) == (1, 0, 0)
    occurrence = RecurringOccurrence.objects.get(recurring=schedule)
    payment = occurrence.payment
    assert (
        payment.status == "PENDING" and payment.amount == 70 and payment.recurring_id == schedule.pk
    )
    assert abs((payment.due_at - start).total_seconds()) < 0.001
    assert Account.objects.get(pk=source).held == 70
    schedule.refresh_from_db()
    assert schedule.next_run_at == start + timedelta(hours=1)
    assert materializer.materialize_due().scheduled == 0  # next one is an hour away


def test_jitter_is_deterministic_and_bounded(accounts):
    source, target = accounts
    start = timezone.now() + timedelta(seconds=20)
    schedule = make_schedule(source, target, start=start, jitter_seconds=30)
    materializer.materialize_due()
    payment = Payment.objects.get(recurring=schedule)
    delay = (payment.due_at - start).total_seconds()
    assert 0 <= delay <= 30
    assert calendar.jitter_for(schedule, start).total_seconds() == pytest.approx(delay, abs=0.001)


def test_insufficient_funds_fails_the_occurrence_and_goes_on(accounts, settings):
    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 0
    source, target = accounts
    start = timezone.now() - timedelta(seconds=10)
    schedule = make_schedule(source, target, start=start, every=60, amount=5_000)
    materializer.materialize_due()
    occurrence = RecurringOccurrence.objects.get(recurring=schedule)
    assert (occurrence.status, occurrence.reason) == ("failed", "insufficient_funds")
    schedule.refresh_from_db()
    assert (schedule.status, schedule.consecutive_failures) == ("active", 1)
    assert schedule.next_run_at == start + timedelta(seconds=60)


def test_consecutive_failures_pause_the_schedule(accounts, settings):
    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 0
    source, target = accounts
    start = timezone.now() - timedelta(seconds=130)  # -130 s, -70 s (missed), -10 s
    schedule = make_schedule(
        source,
        target,
        start=start,
        every=60,
        amount=5_000,
        missed_run_policy="run_all",
        max_consecutive_failures=2,
    )
    result = materializer.materialize_due()
    assert (result.failed, result.scheduled) == (2, 0)
    schedule.refresh_from_db()
    assert schedule.status == "paused"
    assert "2 consecutive failed occurrences" in schedule.status_reason
    assert Account.objects.get(pk=source).held == 0
    assert Payment.objects.filter(recurring=schedule).count() == 0
    assert materializer.materialize_due().schedules == 0  # paused: nothing more


@pytest.mark.parametrize(
    ("policy", "catch_up", "scheduled", "skipped"),
    [
        ("skip", 10, 0, 5),
        ("run_once", 10, 1, 4),
        ("run_all", 3, 3, 2),
        ("run_all", 10, 5, 0),
    ],
)
def test_missed_run_policies_after_downtime(accounts, policy, catch_up, scheduled, skipped):
    source, target = accounts
    now = timezone.now()
    start = now - timedelta(hours=4, minutes=30)  # occurrences at -4.5h … -0.5h: 5 missed
    schedule = make_schedule(
        source, target, start=start, missed_run_policy=policy, max_catch_up=catch_up
    )
    result = materializer.materialize_due()
    assert (result.scheduled, result.skipped) == (scheduled, skipped)
    rows = list(RecurringOccurrence.objects.filter(recurring=schedule).order_by("scheduled_for"))
    assert [r.scheduled_for for r in rows] == [start + timedelta(hours=k) for k in range(5)]
    statuses = [r.status for r in rows]
    # skipped ones are the oldest; the ones that run are the most recent
    assert statuses == ["skipped"] * skipped + ["scheduled"] * scheduled
    assert all(r.reason == f"missed ({policy})" for r in rows if r.status == "skipped")
    payments = Payment.objects.filter(recurring=schedule)
    assert payments.count() == scheduled
    assert all(p.due_at >= now for p in payments)  # catch-up runs now, not in the past
    schedule.refresh_from_db()
    assert schedule.next_run_at == start + timedelta(hours=5)


def test_max_occurrences_ends_the_schedule(accounts):
    source, target = accounts
    start = timezone.now() - timedelta(seconds=5)
    schedule = make_schedule(source, target, start=start, every=60, max_occurrences=1)
    materializer.materialize_due()
    schedule.refresh_from_db()
    assert schedule.status == "ended" and schedule.next_run_at is None


def test_occurrence_unique_in_the_database(accounts):
    source, target = accounts
    schedule = make_schedule(source, target, start=timezone.now())
    RecurringOccurrence.objects.create(
        recurring=schedule, scheduled_for=schedule.start_time, status="skipped"
    )
    with pytest.raises(IntegrityError), transaction.atomic():
        RecurringOccurrence.objects.create(
            recurring=schedule, scheduled_for=schedule.start_time, status="skipped"
        )


@pytest.mark.django_db(transaction=True)
def test_two_materialisers_at_once_never_duplicate():
    owner = UserFactory()
    source = AccountFactory(owner=owner, funded=100_000).pk
    target = AccountFactory(owner=owner).pk
    start = timezone.now() - timedelta(minutes=30, seconds=30)
    schedules = [
        make_schedule(
            source, target, start=start, every=60, missed_run_policy="run_all", max_catch_up=40
        )
        for _ in range(5)
    ]
    barrier = threading.Barrier(2)
    errors = []

    def run():
        try:
            barrier.wait()
            for _ in range(3):
                materializer.materialize_due()
        except Exception as exc:
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=run) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert errors == []
    for schedule in schedules:
        times = list(
            RecurringOccurrence.objects.filter(recurring=schedule).values_list(
                "scheduled_for", flat=True
            )
        )
        # 31 missed (run_all) + 1 due within the 60 s materialise-ahead window
        assert len(times) == len(set(times)) == 32
        assert Payment.objects.filter(recurring=schedule).count() == 32
    assert Account.objects.get(pk=source).held == 5 * 32 * 10
