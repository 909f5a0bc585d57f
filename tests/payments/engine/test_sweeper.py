"""The sweeper: claims, chunks, back-pressure, ticks (DESIGN §4.1; payments.engine.sweeper)."""

import time
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.utils import timezone
from kombu.exceptions import OperationalError as KombuOperationalError

from ledger.models import JournalEntry
from payments import routing, tasks, transitions
from payments.clock import db_now
from payments.clock import slot_start as start_of_slot
from payments.engine import executor, reaper, sweeper
from payments.models import Payment
from tests.payments.helpers import capture_publish, claim_batch, make_due, slot_start, sweep
from tests.plans import explain, explain_call, index_scan

pytestmark = pytest.mark.django_db


def schedule(client, n=1, **overrides):
    return [client.schedule(**overrides).json()["payment_id"] for _ in range(n)]


def _claim_and_age(n, claimed_seconds_ago, settings):
    with transaction.atomic():
        claims = claim_batch(n)
    ids = [c.payment_id for c in claims]
    Payment.objects.filter(pk__in=ids).update(
        lease_expires_at=db_now()
        + timedelta(seconds=settings.PAYMENT_LEASE_SECONDS - claimed_seconds_ago),
        run_at=db_now() - timedelta(seconds=claimed_seconds_ago),
    )
    return ids


def test_sweep_claims_only_due_payments_and_publishes_to_partition_queue(alice, monkeypatch):
    due = schedule(alice, 3)
    future = schedule(alice, 1, delay_seconds=3600)
    make_due(*due)
    result, published = sweep(monkeypatch)
    assert result.claimed == 3
    partition = Payment.objects.get(pk=due[0]).partition
    assert {queue for queue, _, _ in published} == {f"payments.p{partition:02d}"}
    assert sorted(pid for pid, _ in published.items()) == sorted(due)
    for pid, fence in published.items():
        payment = Payment.objects.get(pk=pid)
        assert payment.status == "QUEUED" and payment.fence == fence == 1
        assert payment.attempts == 1 and payment.lease_expires_at > timezone.now()
        assert payment.events.filter(type="queued", actor="system").count() == 1
    assert Payment.objects.get(pk=future[0]).status == "PENDING"
    assert sweep(monkeypatch)[0].claimed == 0  # nothing twice


def test_lookahead_publishes_with_eta_not_early(alice, monkeypatch):
    (pid,) = schedule(alice)
    soon = timezone.now() + timedelta(milliseconds=600)
    Payment.objects.filter(pk=pid).update(due_at=soon, run_at=soon)
    result, published = sweep(monkeypatch)
    assert result.claimed == 1
    (_, _, countdown) = published[0]
    assert 0.3 < countdown <= 0.6
    # delivered now anyway (early): not executed, handed back
    outcome = executor.execute_chunk(published.items())
    assert outcome.completed == [] and [i[0] for i in outcome.not_due] == [pid]
    assert Payment.objects.get(pk=pid).status == "QUEUED"
    assert JournalEntry.objects.filter(reference=f"payment:{pid}").count() == 0


def test_chunking_by_partition_size_and_spread(settings):
    settings.PAYMENT_CHUNK_SIZE = 2
    settings.PAYMENT_CHUNK_SPREAD_MS = 50
    t0 = slot_start()
    claims = [
        transitions.Claimed("a", 1, 0, t0),
        transitions.Claimed("b", 1, 0, t0 + timedelta(milliseconds=10)),
        transitions.Claimed("c", 1, 0, t0 + timedelta(milliseconds=20)),
        transitions.Claimed("d", 1, 0, t0 + timedelta(milliseconds=500)),
        transitions.Claimed("e", 1, 3, t0),
    ]
    chunks = [
        (p, eta, [c.payment_id for c in chunk]) for p, eta, chunk in sweeper.chunk_claims(claims)
    ]
    # a, b, c and e are due within the spread: one window, cut at the size with
    # partition 0's claims first; d is a window of its own
    assert chunks == [
        ((0,), t0 + timedelta(milliseconds=10), ["a", "b"]),
        ((0, 3), t0 + timedelta(milliseconds=20), ["c", "e"]),
        ((0,), t0 + timedelta(milliseconds=500), ["d"]),
    ]


def test_overdue_claims_are_not_split_by_the_spread(settings):
    """A backlog (all already due) goes out in full-size chunks; payments not yet
    due still respect the spread, so none waits for a later one."""
    settings.PAYMENT_CHUNK_SIZE = 3
    settings.PAYMENT_CHUNK_SPREAD_MS = 50
    now = timezone.now()
    due = [now - timedelta(seconds=s) for s in (9, 6, 3, 1, 0)]
    claims = [transitions.Claimed(f"o{i}", 1, 0, d) for i, d in enumerate(due)]
    claims += [
        transitions.Claimed("f1", 1, 0, now + timedelta(milliseconds=100)),
        transitions.Claimed("f2", 1, 0, now + timedelta(milliseconds=400)),
    ]
    chunks = [[c.payment_id for c in chunk] for _, _, chunk in sweeper.chunk_claims(claims, now)]
    assert chunks == [["o0", "o1", "o2"], ["o3", "o4"], ["f1"], ["f2"]]
    # without "now" every gap counts, as before
    assert len(sweeper.chunk_claims(claims)) == 7


def test_sweep_holds_back_while_live_claims_are_past_half_their_lease(alice, monkeypatch, settings):
    """Overload: claims that would wait longer than their lease in the queue are
    not made; the backlog stays PENDING (no expiries, no attempts spent). The
    oldest PAYMENT_LOST_CLAIMS_TOLERATED claims may be lost messages waiting
    for the reaper: on their own they neither stall the sweep nor count as lag."""
    settings.PAYMENT_LEASE_SECONDS = 60
    settings.PAYMENT_LOST_CLAIMS_TOLERATED = 1
    ids = schedule(alice, 4)
    make_due(*ids)
    _claim_and_age(1, 40, settings)  # one lost message, claimed 40 s ago
    assert sweeper.executor_state() == sweeper.ExecutorState(behind=False, lag=0.0)
    (waiting,) = _claim_and_age(1, 40, settings)  # a second one: the executors are behind
    state = sweeper.executor_state()
    assert state.behind and 39 < state.lag < 45
    result, _ = sweep(monkeypatch)
    assert result.backpressure and result.claimed == 0
    assert Payment.objects.filter(status="PENDING").count() == 2
    Payment.objects.filter(pk=waiting).update(
        lease_expires_at=db_now() + timedelta(seconds=50),  # claimed 10 s ago
        run_at=db_now() - timedelta(seconds=10),
    )
    result, _ = sweep(monkeypatch)
    assert not result.backpressure and result.claimed == 2 and 9 < result.lag < 15
    settings.PAYMENT_LOST_CLAIMS_TOLERATED = 0  # now the lost one counts
    assert sweeper.executor_state().behind


def test_lagging_executors_change_nothing_the_sweeper_claims(alice, monkeypatch, settings):
    """No catch-up mode: however late the executors run, the sweeper claims what
    is due within the lookahead, spread into chunks as always, and reports the
    lag. (A mode switched on the lag made the lateness oscillate between ~1 s and
    ~8 s at 150/s; late executors now collapse due payments into one batch.)"""
    settings.PAYMENT_LOST_CLAIMS_TOLERATED = 0
    settings.PAYMENT_CHUNK_SPREAD_MS = 50
    waiting, *overdue = schedule(alice, 4)
    make_due(waiting, *overdue)
    ahead = schedule(alice, 2)
    soon = db_now() + timedelta(milliseconds=600)
    Payment.objects.filter(pk__in=ahead).update(due_at=soon, run_at=soon)
    Payment.objects.filter(pk=ahead[1]).update(
        due_at=soon + timedelta(milliseconds=200), run_at=soon + timedelta(milliseconds=200)
    )
    Payment.objects.filter(pk__in=overdue).update(run_at=db_now() + timedelta(hours=1))
    _claim_and_age(1, 2, settings)  # claimed 2 s ago, still waiting for a worker
    Payment.objects.filter(pk__in=overdue).update(run_at=db_now() - timedelta(seconds=1))
    result, published = sweep(monkeypatch)
    assert not result.backpressure and 1.9 < result.lag < 3
    assert sorted(p for p, _ in published.items()) == sorted(overdue + ahead)
    # overdue in one chunk; the two ahead 200 ms apart: one chunk each
    assert result.messages == 3
    assert published.partitions == [[Payment.objects.get(pk=waiting).partition]] * 3


def test_backpressure_stops_claiming(alice, monkeypatch, settings):
    settings.PAYMENT_MAX_QUEUED = 2
    ids = schedule(alice, 3)
    make_due(*ids)
    result, _ = sweep(monkeypatch)
    assert result.claimed == 2
    assert sweep(monkeypatch)[0].backpressure


def test_backlog_is_topped_up_in_whole_batches(alice, monkeypatch, settings):
    """With a backlog QUEUED the sweeper waits until a whole batch fits: topping up
    the few claims that just freed up would cut the backlog into tiny chunks."""
    settings.PAYMENT_MAX_QUEUED = 5
    settings.PAYMENT_SWEEP_BATCH = 3
    ids = schedule(alice, 7)
    make_due(*ids)
    result, published = sweep(monkeypatch)
    assert result.claimed == 3 and result.backpressure  # 2 would fit, not a batch
    first = next(iter(published.items()))
    executor.execute_chunk([first])  # one done: 2 QUEUED, room 3
    result, _ = sweep(monkeypatch)
    assert result.claimed == 3 and result.backpressure


@pytest.mark.postgres
def test_idle_sweep_and_reaper_do_not_scan_far_future_rows(alice, settings):
    """The cutoff must be an index condition, not a filter over every pending row.

    ``clock_timestamp()`` is volatile, so PostgreSQL cannot use it to bound an
    index scan: an idle sweep read all pending rows (28 ms at 50,000, growing
    with the backlog). ``statement_timestamp()`` is stable and can.
    """
    from tests.payments.helpers import bulk_schedule

    far = timezone.now() + timedelta(days=30)
    bulk_schedule(
        sources=[alice.account.pk],
        targets=[alice.other_account.pk],
        count=500,
        amount=1,
        due_at=far,
    )
    # both claim statements: the plain one, and the whole-slots one production sends
    for spread_ms, claims_whole_slots in ((0, False), (400, True)):
        settings.PAYMENT_CHUNK_SPREAD_MS = spread_ms
        assert (transitions.spread_grid(1) is not None) == claims_whole_slots
        plan = explain_call(lambda: claim_batch(2000, lookahead=1), "payments_payment")
        scan = index_scan(plan, "payments_pending_run_at")
        assert scan is not None and "run_at" in scan.get("Index Cond", ""), scan
        assert scan.get("Rows Removed by Filter", 0) == 0 and scan["Actual Rows"] == 0

    Payment.objects.update(status="QUEUED", lease_expires_at=far)
    plan = explain(
        transitions._REQUEUE_SQL, "payments_payment", params={"max_attempts": 5, "limit": 10_000}
    )
    scan = index_scan(plan, "payments_queued_lease")
    assert scan is not None and "lease_expires_at" in scan.get("Index Cond", ""), scan
    assert scan.get("Rows Removed by Filter", 0) == 0 and scan["Actual Rows"] == 0
    assert Payment.objects.filter(status="QUEUED").count() == 500  # nothing claimed


def test_a_busy_sweep_ticks_within_its_beat_interval(alice, monkeypatch, settings):
    """A sweep that claimed something sweeps again every tick, so a payment entering
    the lookahead 300 ms into the tick is claimed in the same run, not at beat's
    next tick; an idle sweep returns at once."""
    from payments import tasks

    settings.PAYMENT_LOOKAHEAD_SECONDS = 1.0
    settings.PAYMENT_CHUNK_SPREAD_MS = 300  # claimed by +0.6 s at the latest
    settings.PAYMENT_SWEEP_TICK_MS = 50
    settings.PAYMENT_SWEEP_WINDOW_SECONDS = 0.8
    now_due, later = schedule(alice, 2)
    make_due(now_due)
    due = db_now() + timedelta(milliseconds=1300)  # in the lookahead 300 ms from now
    Payment.objects.filter(pk=later).update(due_at=due, run_at=due)
    published = capture_publish(monkeypatch)
    started = time.monotonic()
    result = tasks.sweep()
    assert result["claimed"] == 2
    assert sorted(p for p, _ in published.items()) == sorted([now_due, later])
    assert time.monotonic() - started < 1.0  # within the beat interval
    assert Payment.objects.get(pk=later).executed_at is None  # claimed, not executed early
    # idle: one sweep and back
    runs = []
    real = tasks.sweep_once
    monkeypatch.setattr(tasks, "sweep_once", lambda: runs.append(1) or real())
    assert tasks.sweep()["claimed"] == 0
    assert runs == [1]


def test_a_payment_due_at_a_slot_start_belongs_to_the_next_slot(alice, monkeypatch, settings):
    """PostgreSQL's claim statement rounds its horizon down to a slot's start and
    leaves a payment due exactly then to the sweep that claims that slot (the
    ORM path's boundary is in test_sweeper_contract, on a frozen clock). The
    database clock runs, so a try whose sweep straddled a slot boundary is
    repeated."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL's claim statement")
    settings.PAYMENT_LOOKAHEAD_SECONDS = 1.0
    settings.PAYMENT_CHUNK_SPREAD_MS = 200
    grid, lookahead = timedelta(milliseconds=200), timedelta(seconds=1)

    def slot(moment):  # the slot entering the lookahead at ``moment``
        return start_of_slot(moment + lookahead, grid)

    for _ in range(5):
        (pid,) = schedule(alice)  # a fresh one: a straddling try may have claimed the last
        before = db_now()
        start = slot(before)
        Payment.objects.filter(pk=pid).update(due_at=start, run_at=start)
        result, _ = sweep(monkeypatch)
        if slot(db_now()) != slot(before):
            # A slot ended during the sweep: its horizon may be the next one.
            # Out of the next try's way: left PENDING, due in a slot the next
            # try's horizon has passed, the next sweep would claim it (a flake
            # of this test: "claimed 1" where 0 was expected).
            later = start + timedelta(days=1)
            Payment.objects.filter(pk=pid).update(due_at=later, run_at=later)
            continue
        assert result.claimed == 0 and Payment.objects.get(pk=pid).status == "PENDING"
        just_before = start - timedelta(microseconds=1)
        Payment.objects.filter(pk=pid).update(due_at=just_before, run_at=just_before)
        result, published = sweep(monkeypatch)
        assert result.claimed == 1 and published.items() == [(pid, 1)]
        return
    pytest.fail("every sweep straddled a slot boundary")


def test_a_sweep_waiting_for_a_slot_to_fill_keeps_ticking(alice, monkeypatch, settings):
    """Sweeps claim whole slots of the spread grid: a payment in the slot now
    entering the lookahead is not claimed until the slot is whole. The sweep
    that found nothing yet keeps ticking (``work_ahead``) and claims it within
    the same beat interval — not a second later at beat's next tick, when its
    lookahead would have run out."""
    from payments import tasks

    settings.PAYMENT_LOOKAHEAD_SECONDS = 1.0
    settings.PAYMENT_CHUNK_SPREAD_MS = 200
    settings.PAYMENT_SWEEP_TICK_MS = 50
    settings.PAYMENT_SWEEP_WINDOW_SECONDS = 0.8
    grid = timedelta(milliseconds=200)
    (filling, far) = schedule(alice, 2)
    horizon = db_now() + timedelta(seconds=1.0)
    slot = start_of_slot(horizon, grid)  # the slot entering the lookahead
    if slot + grid - horizon < grid / 2:  # start early in a slot: room for the set-up
        time.sleep((slot + grid - horizon).total_seconds() + 0.01)
        horizon = db_now() + timedelta(seconds=1.0)
        slot = start_of_slot(horizon, grid)
    due = slot + grid - timedelta(milliseconds=1)  # past the lookahead, within the slot
    Payment.objects.filter(pk=filling).update(due_at=due, run_at=due)
    due_far = horizon + timedelta(seconds=30)
    Payment.objects.filter(pk=far).update(due_at=due_far, run_at=due_far)
    published = capture_publish(monkeypatch)
    runs = []
    real = tasks.sweep_once
    monkeypatch.setattr(tasks, "sweep_once", lambda: runs.append(real()) or runs[-1])
    started = time.monotonic()
    result = tasks.sweep()
    assert result["claimed"] == 1 and published.items()[0][0] == filling
    assert runs[0].claimed == 0 and runs[0].work_ahead  # the slot was not whole yet
    assert time.monotonic() - started < 1.0
    # only the far one left: nothing within the lookahead and a slot, one sweep
    runs.clear()
    assert tasks.sweep()["claimed"] == 0
    assert len(runs) == 1 and not runs[0].work_ahead
    settings.PAYMENT_CHUNK_SPREAD_MS = 0  # no grid: whatever is pending, nothing to wait for
    Payment.objects.filter(pk=far).update(due_at=horizon, run_at=horizon)
    assert not sweeper.work_ahead()


def test_the_sweep_interval_is_measured_between_sweep_starts(monkeypatch):
    from payments import metrics, tasks

    seen = []
    monkeypatch.setattr(metrics.sweep_interval, "observe", seen.append)
    monkeypatch.setattr(tasks, "_last_sweep_started", None)
    tasks.sweep_once()
    assert seen == []  # the first sweep of a process has no interval
    time.sleep(0.05)
    tasks.sweep_once()
    assert len(seen) == 1 and 0.05 <= seen[0] < 1


def test_without_lookahead_the_sweep_ticks_within_its_beat_interval(alice, monkeypatch, settings):
    """With no lookahead nothing is ever claimed ahead of its time, so the sweep task
    keeps ticking through its window: a payment falling due 300 ms in is claimed in
    the same run."""
    from payments import tasks

    settings.PAYMENT_LOOKAHEAD_SECONDS = 0
    settings.PAYMENT_SWEEP_TICK_MS = 50
    settings.PAYMENT_SWEEP_WINDOW_SECONDS = 0.8
    (soon,) = schedule(alice, 1)
    due = db_now() + timedelta(milliseconds=300)
    Payment.objects.filter(pk=soon).update(due_at=due, run_at=due)
    published = capture_publish(monkeypatch)
    runs = []
    real = tasks.sweep_once
    monkeypatch.setattr(tasks, "sweep_once", lambda: runs.append(1) or real())
    result = tasks.sweep()
    assert result["claimed"] == 1 and published.items()[0][0] == soon
    assert len(runs) > 1
    assert Payment.objects.get(pk=soon).executed_at is None  # claimed, not executed early


def test_timer_tasks_are_routed_to_their_own_queue():
    """The sweeper must not wait behind payment chunks, a materialiser run or a webhook:
    it and the reaper go to "timers", which the Procfile gives a worker of its own."""
    from scheduler_project.celery import app

    def queue(name):
        return app.amqp.router.route({}, name)["queue"].name

    assert queue("payments.sweep") == queue("payments.reap_leases") == "timers"
    assert queue("payments.materialize_recurring") == "recurring"
    assert queue("payments.retry_webhooks") == queue("payments.deliver_webhook") == "webhooks"
    assert queue("ledger.reconcile") == "default"


def test_a_sweep_sends_an_overdue_backlog_of_one_partition_in_one_message(
    alice, monkeypatch, settings
):
    """Through ``sweep_due`` itself: payments already due at the sweep's clock are
    chunked together however far apart their due times (the spread only holds
    back payments still to come)."""
    settings.PAYMENT_CHUNK_SPREAD_MS = 50
    ids = schedule(alice, 3)
    for pid, seconds in zip(ids, (3, 2, 1), strict=True):
        make_due(pid, seconds_ago=seconds)
    result, published = sweep(monkeypatch)
    assert (result.claimed, result.messages) == (3, 1)
    ((_queue, items, countdown),) = published
    assert sorted(pid for pid, _ in items) == sorted(ids) and countdown is None


# --- the broker down --------------------------------------------------------------


class BrokerDown(KombuOperationalError):
    """What kombu raises when Redis refuses the connection."""


def broker_fails_after(monkeypatch, sent_before_failing):
    """``execute_chunk.apply_async`` that sends ``sent_before_failing`` messages
    (captured) and then raises, as a broker going down mid-sweep does."""
    published = capture_publish(monkeypatch)
    send = tasks.execute_chunk.apply_async

    def apply_async(*args, **kwargs):
        if len(published) >= sent_before_failing:
            raise BrokerDown("Error 111 connecting to redis:6379. Connection refused.")
        send(*args, **kwargs)

    monkeypatch.setattr(tasks.execute_chunk, "apply_async", apply_async)
    return published


def test_a_broker_outage_makes_payments_late_never_dead_letters(alice, monkeypatch, settings):
    """A claim whose message could not be published went on counting as an
    attempt: after PAYMENT_MAX_ATTEMPTS sweeps of a broker outage (five
    leases, ~5 minutes) the reaper dead-lettered every due payment, though no
    worker had ever tried it. Handed back at once, it keeps its attempts and
    runs, once, when the broker is back."""
    (pid,) = schedule(alice, amount=500)
    make_due(pid)
    broker_fails_after(monkeypatch, 0)
    for _ in range(settings.PAYMENT_MAX_ATTEMPTS + 1):
        with pytest.raises(BrokerDown):
            sweeper.sweep_due(publish=tasks.publish_chunks)
        payment = Payment.objects.get(pk=pid)
        assert (payment.status, payment.attempts, payment.lease_expires_at) == ("PENDING", 0, None)
        Payment.objects.filter(pk=pid).update(lease_expires_at=timezone.now())  # (none to reap)
        reaper.reap_leases()
    payment = Payment.objects.get(pk=pid)
    assert payment.status == "PENDING" and payment.fence == 2 * (settings.PAYMENT_MAX_ATTEMPTS + 1)
    types = list(payment.events.order_by("pk").values_list("type", flat=True))
    assert types == ["scheduled"] + ["queued", "unqueued"] * (settings.PAYMENT_MAX_ATTEMPTS + 1)
    _, published = sweep(monkeypatch)  # the broker is back
    assert executor.execute_chunk(published.items()).completed == [pid]
    assert Payment.objects.get(pk=pid).attempts == 1
    assert JournalEntry.objects.filter(reference=f"payment:{pid}").count() == 1


def test_a_publish_failing_mid_batch_fences_out_what_was_already_sent(
    alice, bob, monkeypatch, settings
):
    """The broker goes down after the batch's first message: the whole batch is
    handed back (fence + 1), so that message, delivered later, is stale, and
    each payment runs once, from the next sweep's message."""
    settings.PAYMENT_CHUNK_SIZE = 4
    ids = schedule(alice, 6) + schedule(bob, 6)
    make_due(*ids)
    sent = broker_fails_after(monkeypatch, 1)
    with pytest.raises(BrokerDown):
        sweeper.sweep_due(publish=tasks.publish_chunks)
    assert len(sent) == 1 and len(sent.items()) == 4
    assert set(Payment.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"PENDING"}
    stale = executor.execute_chunk(sent.items()).stale
    assert sorted(stale) == sorted(pid for pid, _ in sent.items())
    _, published = sweep(monkeypatch)
    assert sorted(executor.execute_chunk(published.items()).completed) == sorted(ids)
    assert JournalEntry.objects.filter(reference__in=[f"payment:{p}" for p in ids]).count() == 12


def test_a_publish_failing_for_another_reason_leaves_the_claims_to_their_lease(alice, monkeypatch):
    """Only an unreachable broker hands claims back: a failure that could repeat
    for the same claims would have every sweep claim and fail the same oldest
    batch for ever, stopping everything behind it. Those wait out their lease
    (the reaper counts the attempt), as before."""
    (pid,) = schedule(alice)
    make_due(pid)

    def publish(chunks, now):
        raise TypeError("a bug in building the message")

    with pytest.raises(TypeError):
        sweeper.sweep_due(publish=publish)
    payment = Payment.objects.get(pk=pid)
    assert (payment.status, payment.attempts) == ("QUEUED", 1)
    assert not payment.events.filter(type="unqueued").exists()


def test_a_hand_back_leaves_a_claim_that_moved_on(alice, monkeypatch):
    """Between the claim and the hand-back a claim may have been claimed again, or
    run (COMPLETED keeps the fence it ran under): only a claim still QUEUED with
    its fence goes back."""
    moved, ran, kept = schedule(alice, 3)
    make_due(moved, ran, kept)
    with transaction.atomic():
        claims = claim_batch(10)
    Payment.objects.filter(pk=moved).update(fence=F("fence") + 1)  # claimed again since
    (ran_claim,) = [c for c in claims if c.payment_id == ran]
    assert executor.execute_chunk([(ran, ran_claim.fence)]).completed == [ran]
    with transaction.atomic():
        assert transitions.unclaim(claims) == 1
        assert transitions.unclaim(claims) == 0  # nothing left to hand back
    statuses = dict(Payment.objects.filter(pk__in=[moved, ran, kept]).values_list("pk", "status"))
    assert {str(k): v for k, v in statuses.items()} == {
        moved: "QUEUED",
        ran: "COMPLETED",
        kept: "PENDING",
    }


def test_a_hand_back_gives_back_the_claims_attempt_and_says_so(alice):
    """A payment on its third claim (two leases lost before) goes back with two
    attempts counted, its fence moved on, its run time kept, and an event."""
    (pid,) = schedule(alice)
    make_due(pid)
    Payment.objects.filter(pk=pid).update(attempts=2, fence=4)
    before = Payment.objects.get(pk=pid)
    with transaction.atomic():
        (claim,) = claim_batch(10)
    claimed = Payment.objects.get(pk=pid)
    assert (claim.fence, claimed.attempts) == (5, 3)
    with transaction.atomic():
        assert transitions.unclaim([claim]) == 1
    after = Payment.objects.get(pk=pid)
    assert (after.status, after.fence, after.attempts) == ("PENDING", 6, 2)
    assert (after.run_at, after.lease_expires_at) == (before.run_at, None)
    assert after.updated_at > claimed.updated_at
    event = after.events.order_by("pk").last()
    assert (event.type, event.from_status, event.to_status, event.actor, event.fence) == (
        "unqueued",
        "QUEUED",
        "PENDING",
        "system",
        6,
    )
    assert event.data == {"reason": "not published"}


def test_payments_stored_under_more_partitions_go_to_a_consumed_queue(
    alice, bob, monkeypatch, settings
):
    """PAYMENT_PARTITIONS lowered on a redeploy: a payment keeps the partition
    stored when it was scheduled, and was published to a queue no worker
    consumes any more (then dead-lettered untried after five leases). The claim
    maps it into the current range; one already in range keeps its own."""
    settings.PAYMENT_PARTITIONS = 16
    ids = schedule(alice, 1) + schedule(bob, 1)
    Payment.objects.filter(pk=ids[0]).update(partition=13)
    Payment.objects.filter(pk=ids[1]).update(partition=2)
    make_due(*ids)
    settings.PAYMENT_PARTITIONS = 8
    _, published = sweep(monkeypatch)
    consumed = set(routing.payment_queues(settings.PAYMENT_PARTITIONS))
    assert published and {queue for queue, _, _ in published} <= consumed
    stored = dict(Payment.objects.filter(pk__in=ids).values_list("pk", "partition"))
    assert {str(k): v for k, v in stored.items()} == {ids[0]: 5, ids[1]: 2}
    assert sorted(executor.execute_chunk(published.items()).completed) == sorted(ids)
