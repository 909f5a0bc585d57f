"""One client's schedule can never stop, slow or starve the materialiser for others (DESIGN §8).

Each test here failed on the materialiser that enumerated 10,000 future
instants per schedule, ran schedules in due order without a time box and let
one schedule's exception end the whole run.
"""

import logging
import time
from datetime import UTC, datetime, timedelta
from itertools import groupby

import pytest
from django.db import OperationalError, connection
from django.utils import timezone

from ledger.models import Account
from payments import calendar, metrics
from payments.engine import materializer
from payments.models import (
    Payment,
    RecurringBacklog,
    RecurringOccurrence,
    RecurringPayment,
    RecurringStatus,
    WebhookDelivery,
    WebhookEndpoint,
)
from tests.concurrency import in_other_connection, run_in_threads
from tests.factories import AccountFactory, UserFactory
from tests.payments.conftest import Client, dispatched
from tests.payments.engine.timer import in_another_transaction
from tests.payments.test_api import error
from tests.payments.test_recurring import create as create_schedule
from tests.payments.test_recurring import make_schedule

pytestmark = pytest.mark.django_db


def create(client, **overrides):
    """``test_recurring.create``; a field given as None is left out (``cron=None`` for an
    interval schedule)."""
    omit = [name for name, value in overrides.items() if value is None]
    return create_schedule(
        client, omit=omit, **{k: v for k, v in overrides.items() if v is not None}
    )


def cron_at(instant: datetime) -> str:
    """A yearly cron expression firing at ``instant``'s minute (UTC)."""
    instant = instant.astimezone(UTC)
    return f"{instant.minute} {instant.hour} {instant.day} {instant.month} *"


def counter(metric, **labels) -> float:
    return (metric.labels(**labels) if labels else metric)._value.get()


@pytest.fixture
def accounts(db):
    owner = UserFactory()
    return AccountFactory(owner=owner, funded=100_000).pk, AccountFactory(owner=owner).pk


def test_a_yearly_schedule_next_to_an_every_minute_one_both_keep_running(alice, bob, settings):
    """The yearly fee (an ordinary cron) comes due: it runs, and so does everyone else."""
    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 180
    due = timezone.now() + timedelta(seconds=90)
    yearly = create(alice, cron=cron_at(due), timezone="UTC", amount=7)
    assert yearly.status_code == 201, yearly.content
    assert len(yearly.json()["upcoming"]) == 5  # five years ahead, no overflow
    minutely = create(bob, cron="* * * * *", timezone="UTC", amount=1)
    assert minutely.status_code == 201, minutely.content
    yearly_id = yearly.json()["recurring_payment_id"]
    minutely_id = minutely.json()["recurring_payment_id"]

    result = materializer.materialize_due()
    assert result.paused_on_error == 0
    yearly_schedule = RecurringPayment.objects.get(pk=yearly_id)
    minutely_schedule = RecurringPayment.objects.get(pk=minutely_id)
    assert yearly_schedule.status == minutely_schedule.status == "active"
    assert Payment.objects.filter(recurring_id=yearly_id).count() == 1
    assert Payment.objects.filter(recurring_id=minutely_id).count() >= 1
    # the yearly schedule's cursor moved a year on; the minute one a minute at a time
    assert yearly_schedule.next_run_at > due + timedelta(days=360)
    assert minutely_schedule.next_run_at - minutely_schedule.last_occurrence_at == timedelta(
        minutes=1
    )


def test_a_schedule_that_raises_is_parked_and_the_others_run(alice, bob, caplog):
    """A fault in one schedule (here a row whose time zone no longer exists) pauses that
    schedule with a reason, a webhook, a metric and a log line — and nothing else."""
    broken = make_schedule(
        alice.account.pk,
        alice.other_account.pk,
        start=timezone.now() - timedelta(seconds=20),
        every=60,
    )
    RecurringPayment.objects.filter(pk=broken.pk).update(
        cron="0 9 * * *", interval_seconds=None, timezone="Mars/Base"
    )
    healthy = make_schedule(
        bob.account.pk, bob.other_account.pk, start=timezone.now() + timedelta(seconds=10)
    )
    WebhookEndpoint.objects.create(
        client=alice.user, url="https://hooks.example.com/", event_types=["recurring.paused"]
    )
    paused_before = counter(metrics.recurring_errors, outcome="paused")
    with caplog.at_level(logging.ERROR, logger="payments.engine.materializer"):
        result = materializer.materialize_due()
    assert (result.paused_on_error, result.scheduled) == (1, 1)
    broken.refresh_from_db()
    assert broken.status == "paused"
    assert "could not be processed" in broken.status_reason
    assert RecurringOccurrence.objects.filter(recurring=broken).count() == 0  # rolled back
    assert Payment.objects.filter(recurring=healthy).count() == 1
    healthy.refresh_from_db()
    assert healthy.status == "active"
    dispatched()
    delivery = WebhookDelivery.objects.get(event_type="recurring.paused")
    assert delivery.payload["data"]["recurring_payment_id"] == str(broken.pk)
    assert delivery.payload["data"]["reason"] == "error"
    assert counter(metrics.recurring_errors, outcome="paused") == paused_before + 1
    assert any(str(broken.pk) in r.getMessage() for r in caplog.records)
    # the client sees why through the API
    body = alice.api.get(f"/api/v1/recurring-payments/{broken.pk}").json()
    assert body["status"] == "paused" and "could not be processed" in body["status_reason"]
    assert materializer.materialize_due().paused_on_error == 0  # parked: not retried every run


def test_a_database_error_leaves_the_schedule_for_the_next_run(accounts, monkeypatch):
    source, target = accounts
    flaky = make_schedule(source, target, start=timezone.now() + timedelta(seconds=5))
    make_schedule(source, target, start=timezone.now() + timedelta(seconds=6))
    real = materializer.materialize_one

    def materialize_one(schedule_id, result=None):
        if schedule_id == flaky.pk:
            raise OperationalError("server closed the connection unexpectedly")
        return real(schedule_id, result)

    monkeypatch.setattr(materializer, "materialize_one", materialize_one)
    retry_before = counter(metrics.recurring_errors, outcome="retry")
    result = materializer.materialize_due()
    assert (result.retry_later, result.scheduled, result.paused_on_error) == (1, 1, 0)
    flaky.refresh_from_db()
    assert flaky.status == "active" and flaky.status_reason == ""
    assert counter(metrics.recurring_errors, outcome="retry") == retry_before + 1
    monkeypatch.setattr(materializer, "materialize_one", real)
    assert materializer.materialize_due().scheduled == 1  # the next run handles it


def test_a_parked_catch_up_records_the_rest_and_an_unreadable_backlog_stops_nothing(
    alice, bob, monkeypatch, settings
):
    """A schedule parked mid catch-up leaves its unreached missed occurrences to
    the backlog like a client's pause; a backlog whose calendar can no longer be
    read (time zone dropped since) is dropped with a metric and a log line, and
    the others in the same run are recorded."""
    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 0
    start = timezone.now() - timedelta(minutes=40, seconds=30)
    parked = make_schedule(
        alice.account.pk, alice.other_account.pk, start=start, every=60, last_occurrence_at=start
    )
    unreadable = make_schedule(bob.account.pk, bob.other_account.pk, start=start, every=60)

    def materialize_one(schedule_id, result=None):
        raise RuntimeError("a bug")

    monkeypatch.setattr(materializer, "materialize_one", materialize_one)
    materializer.materialize_due()  # parks both; their backlogs are recorded in the same run
    assert RecurringOccurrence.objects.filter(recurring=parked, reason="paused").count() == 40
    assert RecurringOccurrence.objects.filter(recurring=unreadable, reason="paused").count() == 41
    # again, with a backlog whose calendar breaks before the materialiser reaches it
    for schedule in (parked, unreadable):
        RecurringOccurrence.objects.filter(recurring=schedule).delete()
        materializer.RecurringBacklog.objects.create(
            recurring=schedule, after=None, until=timezone.now(), reason="paused"
        )
    RecurringPayment.objects.filter(pk=unreadable.pk).update(
        cron="0 9 * * *", interval_seconds=None, timezone="Mars/Base"
    )
    dropped_before = counter(metrics.recurring_errors, outcome="dropped")
    result = materializer.materialize_due()
    assert result.skipped == 41
    assert RecurringOccurrence.objects.filter(recurring=parked, reason="paused").count() == 41
    assert counter(metrics.recurring_errors, outcome="dropped") == dropped_before + 1
    assert not materializer.RecurringBacklog.objects.exists()


class FakeClock:
    """monotonic() that advances one second per call: a run's time box, deterministically."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        self.now += 1.0
        return self.now


def test_a_run_is_time_boxed_and_the_next_run_carries_on(accounts, monkeypatch):
    source, target = accounts
    soon = timezone.now() + timedelta(seconds=20)
    schedules = [make_schedule(source, target, start=soon) for _ in range(6)]
    monkeypatch.setattr(materializer.time, "monotonic", FakeClock())
    first = materializer.materialize_due(budget_seconds=3.5)
    assert first.budget_exhausted and 0 < first.scheduled < 6
    handled = first.scheduled
    while handled < 6:
        run = materializer.materialize_due(budget_seconds=3.5)
        assert run.scheduled > 0
        handled += run.scheduled
    assert handled == 6
    for schedule in schedules:
        assert Payment.objects.filter(recurring=schedule).count() == 1


def test_schedules_due_on_time_come_before_catch_up(accounts, monkeypatch):
    """A schedule catching up after downtime (oldest next_run_at) must not take the time
    box from another client's occurrence that is due now."""
    source, target = accounts
    now = timezone.now()
    catching_up = make_schedule(
        source, target, start=now - timedelta(hours=5), missed_run_policy="run_once"
    )
    on_time = make_schedule(source, target, start=now + timedelta(seconds=30))
    monkeypatch.setattr(materializer.time, "monotonic", FakeClock())
    result = materializer.materialize_due(budget_seconds=1.5)  # room for one schedule
    assert result.budget_exhausted and result.schedules == 1
    assert Payment.objects.filter(recurring=on_time).count() == 1
    assert not RecurringOccurrence.objects.filter(recurring=catching_up).exists()


@pytest.mark.parametrize(
    ("policy", "catch_up", "ran"),
    [("skip", 10, 0), ("run_once", 10, 1), ("run_all", 3, 3)],
)
def test_a_long_catch_up_is_spread_over_runs_and_records_every_instant(
    accounts, settings, policy, catch_up, ran
):
    """500 missed minutes: at most RECURRING_MAX_OCCURRENCES_PER_RUN instants per run,
    each recorded exactly once, and the policy still picks the *latest* ones to run."""
    settings.RECURRING_MAX_OCCURRENCES_PER_RUN = 200
    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 0
    source, target = accounts
    now = timezone.now()
    start = now - timedelta(minutes=500, seconds=30)
    schedule = make_schedule(
        source, target, start=start, every=60, missed_run_policy=policy, max_catch_up=catch_up
    )
    runs = 0
    while True:
        result = materializer.materialize_one(schedule.pk)
        runs += 1
        assert result.scheduled + result.skipped + result.failed <= 200
        schedule.refresh_from_db()
        if schedule.next_run_at > now:
            break
        assert runs < 10
    assert runs >= 3
    rows = list(RecurringOccurrence.objects.filter(recurring=schedule).order_by("scheduled_for"))
    assert [r.scheduled_for for r in rows] == [start + timedelta(minutes=k) for k in range(501)]
    statuses = [r.status for r in rows]
    # 500 missed, of which the policy runs the latest `ran`; the 501st (30 s ago) is on time
    assert statuses == ["skipped"] * (500 - ran) + ["scheduled"] * (ran + 1)
    assert Payment.objects.filter(recurring=schedule).count() == ran + 1


def catch_up_of_twelve(accounts, settings):
    """A run_all schedule 11.5 minutes behind: 11 missed minutes and one on time run."""
    settings.RECURRING_OCCURRENCES_PER_TRANSACTION = 5
    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 0
    source, target = accounts
    start = timezone.now() - timedelta(minutes=11, seconds=30)
    return make_schedule(
        source, target, start=start, every=60, missed_run_policy="run_all", max_catch_up=20
    )


def test_a_catch_up_commits_its_holds_a_few_at_a_time(accounts, settings, monkeypatch):
    """A hold locks the source account until commit; a catch-up of 200 occurrences
    in one transaction held it ~1.3 s, and every payment batch touching that
    account (other clients' payments collapsed with it) waited. The occurrences
    that run go RECURRING_OCCURRENCES_PER_TRANSACTION to a transaction, the
    cursor advanced with each, and the call still handles them all."""
    schedule = catch_up_of_twelve(accounts, settings)
    blocks = []  # the transaction each occurrence ran in (kept alive: distinct ids)
    real = materializer._run_occurrence

    def run_occurrence(schedule, instant, due_at):
        blocks.append(connection.atomic_blocks[-1])
        return real(schedule, instant, due_at)

    monkeypatch.setattr(materializer, "_run_occurrence", run_occurrence)
    result = materializer.materialize_one(schedule.pk)
    assert [len(list(group)) for _, group in groupby(blocks, key=id)] == [5, 5, 2]
    assert (result.scheduled, result.skipped, result.failed, result.schedules) == (12, 0, 0, 1)
    rows = RecurringOccurrence.objects.filter(recurring=schedule).order_by("scheduled_for")
    assert [r.scheduled_for for r in rows] == [
        schedule.start_time + timedelta(minutes=k) for k in range(12)
    ]
    assert Payment.objects.filter(recurring=schedule).count() == 12
    schedule.refresh_from_db()
    assert schedule.last_occurrence_at == schedule.start_time + timedelta(minutes=11)
    assert materializer.materialize_one(schedule.pk).scheduled == 0  # nothing twice


@pytest.mark.django_db(transaction=True)
def test_between_pieces_the_source_account_is_free(accounts, settings, monkeypatch):
    """Committed, not just saved: at the start of each piece another connection
    can lock the source account at once (the executor's batch would get in)."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    schedule = catch_up_of_twelve(accounts, settings)
    source = schedule.from_account_id
    free = []
    real = materializer._run_occurrence
    count = iter(range(100))

    def run_occurrence(schedule, instant, due_at):
        if next(count) % 5 == 0:  # the first occurrence of a piece: no hold placed yet
            free.append(
                in_other_connection(
                    "SELECT 1 FROM ledger_account WHERE id = %s FOR UPDATE NOWAIT", [source]
                )
            )
        return real(schedule, instant, due_at)

    monkeypatch.setattr(materializer, "_run_occurrence", run_occurrence)
    assert materializer.materialize_one(schedule.pk).scheduled == 12
    assert free == [None, None, None]


def test_far_future_instants_are_never_computed(accounts, monkeypatch):
    """Work per schedule is what the horizon needs, not thousands of future instants."""
    source, target = accounts
    # starts now: its first minute boundary is always inside the 60 s horizon
    # (starting 5 s ahead missed the horizon whenever the test ran after :55)
    schedule = make_schedule(source, target, start=timezone.now())
    RecurringPayment.objects.filter(pk=schedule.pk).update(cron="* * * * *", interval_seconds=None)
    calls = []
    real = calendar.croniter.get_next

    def get_next(self, *args, **kwargs):
        calls.append(1)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(calendar.croniter, "get_next", get_next)
    assert materializer.materialize_due().scheduled >= 1
    assert len(calls) <= 10  # one or two occurrences in the 60 s window, plus next_run_at


# --- what the API accepts ----------------------------------------------------------


@pytest.mark.parametrize(
    "overrides",
    [
        {"cron": "43 15 23 11 *"},  # a yearly fee
        {"cron": "0 0 29 2 *"},  # leap days only
        {"cron": None, "interval_seconds": 366 * 86400},  # the longest interval accepted
        {"cron": None, "interval_seconds": 60},
        {"start_time": "2000-01-01T00:00:00Z", "cron": None, "interval_seconds": 3600},
        {"end_time": "2199-12-31T23:59:59Z"},
        {"max_occurrences": 1_000_000},
    ],
)
def test_schedules_at_the_edges_of_what_is_accepted_work(alice, overrides, settings):
    from payments.clock import db_now

    response = create(alice, **overrides)
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["upcoming"] and body["next_run_at"] == body["upcoming"][0]
    # its first occurrence comes due: widen the window to reach it
    first = datetime.fromisoformat(body["next_run_at"])
    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = (first - db_now()).total_seconds() + 1
    result = materializer.materialize_due()
    assert result.paused_on_error == 0 and result.scheduled >= 1
    schedule = RecurringPayment.objects.get(pk=body["recurring_payment_id"])
    assert schedule.status in ("active", "ended")
    assert alice.api.get("/api/v1/recurring-payments").status_code == 200


def test_the_latest_start_time_accepted_works(alice):
    from payments.clock import db_now

    start = db_now() + timedelta(days=364)
    response = create(alice, start_time=start.isoformat().replace("+00:00", "Z"))
    assert response.status_code == 201, response.content
    assert response.json()["next_run_at"] >= start.isoformat().replace("+00:00", "Z")[:19]


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"cron": "0 0 30 2 *"}, "cron"),  # 30 February: never fires
        ({"cron": "0 0 31 4 *"}, "cron"),
        ({"cron": None, "interval_seconds": 366 * 86400 + 1}, "interval_seconds"),
        ({"start_time": "0001-01-01T00:00:00Z"}, "start_time"),
        ({"start_time": "1999-12-31T23:59:59Z"}, "start_time"),
        ({"start_time": "9999-12-31T23:59:59Z"}, "start_time"),
        ({"start_time": "2099-01-01T00:00:00Z"}, "start_time"),
        ({"end_time": "9999-12-31T23:59:59Z"}, "end_time"),
        ({"end_time": "2200-01-01T00:00:00Z"}, "end_time"),
    ],
)
def test_schedules_beyond_the_edges_are_refused_with_nothing_written(alice, overrides, field):
    err = error(create(alice, **overrides), 400, "validation_error")
    assert field in err["details"]["fields"], err
    assert RecurringPayment.objects.count() == 0
    listed = alice.api.get("/api/v1/recurring-payments")
    assert listed.status_code == 200 and listed.json()["recurring_payments"] == []


# --- per-client quota --------------------------------------------------------------


def test_active_schedules_per_client_are_limited(alice, bob, settings):
    settings.RECURRING_MAX_ACTIVE_PER_CLIENT = 2
    first = create(alice).json()["recurring_payment_id"]
    second = create(alice).json()["recurring_payment_id"]
    alice.api.post(f"/api/v1/recurring-payments/{second}/pause")  # paused still counts
    err = error(create(alice), 422, "limit_exceeded")
    assert err["details"]["limit"] == 2 and "2" in err["message"]
    assert RecurringPayment.objects.filter(from_account__owner=alice.user).count() == 2
    assert create(bob).status_code == 201  # another client's quota is its own
    alice.api.post(f"/api/v1/recurring-payments/{first}/cancel")
    assert create(alice).status_code == 201  # a cancelled one frees its place


@pytest.mark.django_db(transaction=True)
def test_concurrent_creations_cannot_exceed_the_limit(settings):
    settings.RECURRING_MAX_ACTIVE_PER_CLIENT = 3
    client = Client("carol")
    statuses = []
    errors = run_in_threads(lambda i: statuses.append(create(client).status_code), 6)
    assert errors == []
    assert sorted(statuses) == [201] * 3 + [422] * 3
    assert RecurringPayment.objects.count() == 3


def test_a_schedule_refuses_destinations_like_a_one_off_payment(alice, bob):
    """Unknown, system, frozen or closed accounts of others: one identical answer, as for
    payments (no schedule can be used to learn about another client's account)."""
    from ledger import services as ledger
    from ledger.models import Account

    frozen = AccountFactory(owner=bob.user)
    ledger.account_set_status(account_id=frozen.pk, status="frozen")
    closed = AccountFactory(owner=bob.user)
    ledger.account_set_status(account_id=closed.pk, status="closed")
    issuance = ledger.issuance_account()
    unknown = Account.objects.order_by("-pk").first().pk + 1000
    bodies = []
    for target in (unknown, issuance.pk, frozen.pk, closed.pk):
        err = error(create(alice, to_account_id=target), 422, "account_not_found")
        bodies.append((err["code"], err["message"].replace(str(target), "N"), err["details"]))
    assert len({(code, message) for code, message, _ in bodies}) == 1
    assert RecurringPayment.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_a_locked_source_account_holds_up_no_other_clients_schedule(settings, monkeypatch):
    """DESIGN §8: one client's source account locked by another session for as long as
    it likes (here a transaction left open) must not stop the materialiser for the
    others. Each statement of a schedule's transaction waits at most
    RECURRING_STATEMENT_TIMEOUT_SECONDS; the schedule is left for a later run
    (retry, not parked: not its fault), the run goes on, and later runs take such a
    schedule after every other, so it cannot take their time box either. Once the
    lock goes, it runs. Before, the run waited on the lock as long as it was held."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    settings.RECURRING_STATEMENT_TIMEOUT_SECONDS = 0.2
    monkeypatch.setattr(materializer, "deferred", materializer.Deferred())
    real_clock = time.monotonic
    first, second = UserFactory(), UserFactory()
    source = AccountFactory(owner=first, funded=100_000).pk
    others = [AccountFactory(owner=second, funded=100_000).pk for _ in range(2)]
    soon = timezone.now() + timedelta(seconds=20)
    # the stuck one is the most urgent: first in every run's order but for the fix
    stuck = make_schedule(source, AccountFactory(owner=first).pk, start=soon)
    other = make_schedule(others[0], others[1], start=soon + timedelta(seconds=1))
    retry_before = counter(metrics.recurring_errors, outcome="retry")
    release = in_another_transaction(
        lambda: Account.objects.select_for_update().filter(pk=source).first(), release_after=20
    )
    try:
        result = materializer.materialize_due()
        assert (result.retry_later, result.scheduled, result.paused_on_error) == (1, 1, 0)
        assert counter(metrics.recurring_errors, outcome="retry") == retry_before + 1
        assert Payment.objects.filter(recurring=other).count() == 1
        assert not Payment.objects.filter(recurring=stuck).exists()
        stuck.refresh_from_db()
        assert (stuck.status, stuck.status_reason) == ("active", "")
        # the next run, its time box read twice (one second a reading): a schedule
        # that came due meanwhile goes first, though the stuck one is still the
        # most urgent, which waits for the end of the run and finds it over
        later = make_schedule(others[1], others[0], start=soon + timedelta(seconds=2))
        monkeypatch.setattr(materializer.time, "monotonic", FakeClock())
        run = materializer.materialize_due(budget_seconds=2.5)
        assert (run.schedules, run.scheduled, run.retry_later) == (1, 1, 0)
        assert run.budget_exhausted
        assert Payment.objects.filter(recurring=later).count() == 1
        # all of it while the lock was held
        lock = "SELECT 1 FROM ledger_account WHERE id = %s FOR UPDATE NOWAIT"
        assert in_other_connection(lock, [source]) == "LockNotAvailable"
    finally:
        release()
    monkeypatch.setattr(materializer.time, "monotonic", real_clock)
    run = materializer.materialize_due()  # the lock gone: it runs, after the others
    assert (run.scheduled, run.retry_later) == (1, 0)
    assert Payment.objects.filter(recurring=stuck).count() == 1


@pytest.mark.django_db(transaction=True)
def test_schedules_deferred_on_one_lock_cost_a_run_one_wait_after_the_backlog(
    settings, monkeypatch
):
    """Two of one client's schedules pay from an account another session keeps
    locked. Once deferred, they were retried before the backlogs of stopped
    schedules, each with its own wait: two waits filled the time box every run,
    and another client's paused schedule never had its missed instants recorded
    while the lock lasted (a reviewer's probe). The backlog comes first now, and
    a run tries no more deferred schedules once one fails again."""
    if connection.vendor != "postgresql":
        pytest.skip("row locks: PostgreSQL")
    settings.RECURRING_STATEMENT_TIMEOUT_SECONDS = 0.3
    monkeypatch.setattr(materializer, "deferred", materializer.Deferred())
    first, second = UserFactory(), UserFactory()
    source = AccountFactory(owner=first, funded=100_000).pk
    soon = timezone.now() + timedelta(seconds=20)
    for k in range(2):
        make_schedule(source, AccountFactory(owner=first).pk, start=soon + timedelta(seconds=k))
    payer, payee = (AccountFactory(owner=second, funded=100_000).pk for _ in range(2))
    paused = make_schedule(
        payer, payee, start=timezone.now() - timedelta(hours=5), status=RecurringStatus.PAUSED
    )
    RecurringBacklog.objects.create(
        recurring=paused, after=None, until=timezone.now(), reason="paused"
    )
    release = in_another_transaction(
        lambda: Account.objects.select_for_update().filter(pk=source).first(), release_after=30
    )
    try:
        # a time box of one wait and a bit: the first run meets the two unknown
        # (in their order, both tried while its time lasts) and defers them
        first_run = materializer.materialize_due(budget_seconds=0.5)
        assert first_run.retry_later >= 1
        runs = [materializer.materialize_due(budget_seconds=0.5) for _ in range(2)]
    finally:
        release()
    # then: the backlog first (five hours of an hourly schedule, recorded at once),
    # and one wait for the two deferred a run
    assert [(r.skipped, r.retry_later) for r in runs] == [(6, 1), (0, 1)]
    assert not RecurringBacklog.objects.exists()
    assert RecurringOccurrence.objects.filter(recurring=paused, status="skipped").count() == 6
    assert materializer.materialize_due().scheduled == 2  # the lock gone: both run


def test_a_deferred_schedule_leaves_when_it_runs_when_its_time_is_up_or_past_the_cap(
    accounts, monkeypatch
):
    now = [100.0]
    deferred = materializer.Deferred(seconds=60, limit=2, clock=lambda: now[0])
    deferred.add("a")
    now[0] += 59.9
    assert "a" in deferred
    now[0] += 0.1
    assert "a" not in deferred  # its minute is up
    for name in ("a", "b", "c"):
        deferred.add(name)
    assert [n in deferred for n in ("a", "b", "c")] == [False, True, True]  # the oldest went
    deferred.add("b")  # again: now the newest
    deferred.add("d")
    assert [n in deferred for n in ("b", "c", "d")] == [True, False, True]
    # a schedule that goes through is no longer taken last
    source, target = accounts
    schedule = make_schedule(source, target, start=timezone.now() + timedelta(seconds=5))
    monkeypatch.setattr(materializer, "deferred", deferred)
    deferred.add(schedule.pk)
    assert materializer.materialize_one(schedule.pk).scheduled == 1
    assert schedule.pk not in deferred and "d" in deferred
