"""The sweeper (DESIGN §4.1): what a claim writes, never early, batches,
backpressure, catching up, the executors' state, and the messages it publishes.

Most tests run on both code paths of the timer (PostgreSQL's one
statement and the ORM path of the embedded default; see tests/payments/engine/timer.py).
On the ORM path the database clock is frozen, so boundaries are exact.
"""

import logging
import random
import time
import uuid
from datetime import UTC, datetime, timedelta
from datetime import timezone as dt_timezone
from itertools import accumulate

import pytest
from django.db import connection, transaction
from django.db.models import Case, Value, When
from django.test import override_settings
from django.utils import timezone
from hypothesis import given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st

from payments import routing, selectors, tasks, transitions
from payments.clock import db_now, spread_grid
from payments.clock import slot_start as start_of_slot
from payments.engine import executor, sweeper
from payments.models import Payment
from payments.routing import partition_for
from tests.factories import AccountFactory
from tests.payments.engine.timer import (
    CLOCK_READERS,
    in_another_transaction,
    queued_payment,
    sweep_due,
)
from tests.payments.helpers import bulk_schedule, capture_publish, make_due, slot_start, sweep

pytestmark = pytest.mark.django_db


def schedule(client, n=1, **overrides):
    return [client.schedule(**overrides).json()["payment_id"] for _ in range(n)]


def set_times(pid, *, due_at, run_at=None):
    Payment.objects.filter(pk=pid).update(due_at=due_at, run_at=run_at or due_at)


def queue_of(client):
    return routing.queue_name(partition_for(client.account.pk))


def test_a_claim_queues_the_payment_under_a_new_fence_with_a_lease(
    alice, monkeypatch, settings, frozen_clock
):
    settings.PAYMENT_LEASE_SECONDS = 45
    first, second = schedule(alice, 2)
    make_due(first, second, seconds_ago=5)
    Payment.objects.filter(pk=second).update(fence=4, attempts=2)  # reaped twice before
    before = frozen_clock or db_now()
    result, published = sweep(monkeypatch)
    after = frozen_clock or db_now()
    assert (result.claimed, result.messages, result.batches, result.batch_sizes) == (2, 1, 1, [2])
    assert not result.backpressure and result.lag == 0
    assert [(queue, countdown) for queue, _, countdown in published] == [(queue_of(alice), None)]
    assert sorted(published.items()) == sorted([(first, 1), (second, 5)])
    lease = timedelta(seconds=45)
    for pid, fence, attempts in ((first, 1, 1), (second, 5, 3)):
        payment = Payment.objects.get(pk=pid)
        assert (payment.status, payment.fence, payment.attempts) == ("QUEUED", fence, attempts)
        assert before + lease <= payment.lease_expires_at <= after + lease
        assert before <= payment.updated_at <= after
        event = payment.events.get(type="queued")
        assert (event.from_status, event.to_status, event.actor, event.fence, event.data) == (
            "PENDING",
            "QUEUED",
            "system",
            fence,
            {},
        )


@pytest.mark.parametrize(("lookahead", "spread_ms"), [(0.0, 200), (1.5, 0), (1.5, 200)])
def test_nothing_is_claimed_before_its_run_time_plus_the_lookahead(
    alice, monkeypatch, settings, frozen_clock, lookahead, spread_ms
):
    """Never early: the cutoff is the database clock plus the lookahead, inclusive
    — or, with a grid of spread slots (a lookahead of a slot or more), rounded
    down to the start of its slot, exclusive: a sweep claims whole slots. A
    payment claimed ahead is published with a countdown to its due time."""
    settings.PAYMENT_LOOKAHEAD_SECONDS = lookahead
    settings.PAYMENT_CHUNK_SPREAD_MS = spread_ms
    edge, late, cancelled = schedule(alice, 3)
    now = frozen_clock or db_now()
    cutoff = now + timedelta(seconds=lookahead)
    grid = spread_grid()
    assert (grid is not None) == (lookahead > 0 and spread_ms > 0)
    if grid:
        start = start_of_slot(cutoff, grid)
        assert cutoff - grid < start <= cutoff
        edge_due, late_due = start - timedelta(microseconds=1), start
    else:
        edge_due, late_due = cutoff, cutoff + timedelta(microseconds=1)
    set_times(edge, due_at=edge_due)
    # just past the cutoff on the frozen clock; on PostgreSQL's running clock,
    # far enough past it that the sweep cannot reach it
    set_times(late, due_at=late_due if frozen_clock else cutoff + timedelta(seconds=30))
    make_due(cancelled)
    assert alice.api.delete(f"/api/v1/payments/{cancelled}/cancel").status_code == 200
    result, published = sweep(monkeypatch)
    assert result.claimed == 1 and published.items() == [(edge, 1)]
    assert Payment.objects.get(pk=late).status == "PENDING"
    assert Payment.objects.get(pk=cancelled).status == "CANCELLED"
    ((_, _, countdown),) = published
    ahead = (edge_due - now).total_seconds()
    if frozen_clock:
        assert countdown == (ahead if ahead > 0 else None)
    elif ahead > 0:
        assert 0 < countdown <= ahead
    else:
        assert countdown is None


def test_a_claim_with_a_lookahead_under_a_slot_has_no_grid(alice, settings, timer_path):
    """The grid follows the lookahead the claim is given, not the configured
    one: a claim with none (an operator's or a test's) takes every payment due
    by now, even one due since the current slot began."""
    settings.PAYMENT_LOOKAHEAD_SECONDS = 1.0
    settings.PAYMENT_CHUNK_SPREAD_MS = 1000
    (pid,) = schedule(alice)
    just_due = db_now() - timedelta(milliseconds=1)
    set_times(pid, due_at=just_due)
    with transaction.atomic():
        claims = transitions.claim_due(limit=10, lookahead=0.0)
    assert [c.payment_id for c in claims] == [pid]


def test_a_batch_takes_the_earliest_run_times_first(alice, monkeypatch, settings, timer_path):
    settings.PAYMENT_SWEEP_BATCH = 2
    ids = schedule(alice, 3)
    now = db_now()
    for i, pid in enumerate(ids):  # the first scheduled runs last
        set_times(pid, due_at=now - timedelta(seconds=40), run_at=now - timedelta(seconds=10 * i))
    published = capture_publish(monkeypatch)
    result = sweep_due(max_batches=1)
    assert (result.claimed, result.batches, result.batch_sizes) == (2, 1, [2])
    assert sorted(published.items()) == sorted([(ids[1], 1), (ids[2], 1)])
    assert Payment.objects.get(pk=ids[0]).status == "PENDING"
    assert sweep(monkeypatch)[1].items() == [(ids[0], 1)]


@pytest.mark.parametrize(
    ("due", "max_batches", "sizes"),
    [(5, None, [2, 2, 1]), (4, None, [2, 2]), (5, 2, [2, 2]), (1, None, [1]), (0, None, [])],
)
def test_the_sweep_loops_while_it_finds_full_batches(
    alice, monkeypatch, settings, timer_path, due, max_batches, sizes
):
    settings.PAYMENT_SWEEP_BATCH = 2
    ids = schedule(alice, due)
    make_due(*ids)
    published = capture_publish(monkeypatch)
    kwargs = {} if max_batches is None else {"max_batches": max_batches}
    result = sweep_due(**kwargs)
    assert result.batch_sizes == sizes
    assert (result.claimed, result.batches, result.messages) == (sum(sizes), len(sizes), len(sizes))
    assert len(published) == len(sizes) and len(published.items()) == sum(sizes)
    assert Payment.objects.filter(status="PENDING").count() == due - sum(sizes)
    assert not result.backpressure


def test_one_sweep_makes_at_most_50_batches(alice, monkeypatch, settings):
    settings.PAYMENT_SWEEP_BATCH = 1
    ids = bulk_schedule(
        sources=[alice.account.pk],
        targets=[alice.other_account.pk],
        count=51,
        amount=1,
        due_at=timezone.now() - timedelta(seconds=1),
    )
    result, published = sweep(monkeypatch)
    assert (result.claimed, result.batches, len(published)) == (50, 50, 50)
    assert Payment.objects.filter(pk__in=ids, status="PENDING").count() == 1


@pytest.mark.parametrize(
    ("max_queued", "batch", "queued", "sizes", "backpressure"),
    [
        (3, 5, 0, [3], True),  # a cap below the batch: claim up to the cap, then stop
        (1, 5, 0, [1], True),
        (5, 2, 3, [2], True),  # room for exactly one whole batch
        (5, 3, 3, [], True),  # room for 2 of a batch of 3 while a backlog is queued: wait
        (10, 2, 0, [2, 2], False),
    ],
)
def test_backpressure_claims_only_whole_batches_up_to_the_cap(
    alice, monkeypatch, settings, timer_path, max_queued, batch, queued, sizes, backpressure
):
    settings.PAYMENT_MAX_QUEUED = max_queued
    settings.PAYMENT_SWEEP_BATCH = batch
    lease = db_now() + timedelta(seconds=settings.PAYMENT_LEASE_SECONDS)
    for _ in range(queued):
        queued_payment(alice.account, alice.other_account, lease_expires_at=lease)
    ids = schedule(alice, 4)
    make_due(*ids)
    result, published = sweep(monkeypatch)
    assert (result.batch_sizes, result.backpressure) == (sizes, backpressure)
    assert result.claimed == sum(sizes) == len(published.items())
    assert sweeper.queued_count() == queued + sum(sizes)
    assert Payment.objects.filter(status="PENDING").count() == 4 - sum(sizes)


def _claimed_ago(client, now, seconds, *, lease_seconds=60, run_at=None):
    """A QUEUED claim made ``seconds`` ago (its lease runs from then)."""
    return queued_payment(
        client.account,
        client.other_account,
        lease_expires_at=now + timedelta(seconds=lease_seconds - seconds),
        due_at=run_at or now - timedelta(seconds=100),
    )


@pytest.mark.parametrize("lag_ms", [250, 251, 5000])
def test_executor_lag_is_reported_and_changes_nothing_claimed(
    alice, monkeypatch, settings, portable_clock, lag_ms
):
    settings.PAYMENT_LOST_CLAIMS_TOLERATED = 0
    settings.PAYMENT_LOOKAHEAD_SECONDS = 1.0
    now = portable_clock
    _claimed_ago(alice, now, lag_ms / 1000)
    overdue, ahead = schedule(alice, 2)
    set_times(overdue, due_at=now - timedelta(seconds=3))
    set_times(ahead, due_at=now + timedelta(milliseconds=500))
    result, published = sweep(monkeypatch)
    assert result.lag == lag_ms / 1000 and not result.backpressure
    assert sorted(pid for pid, _ in published.items()) == sorted([overdue, ahead])
    assert Payment.objects.get(pk=ahead).status == "QUEUED"


def test_executors_behind_hold_the_sweep_back(alice, monkeypatch, settings, frozen_clock):
    settings.PAYMENT_LOST_CLAIMS_TOLERATED = 0
    now = frozen_clock or db_now()
    _claimed_ago(alice, now, 40)
    (pid,) = schedule(alice)
    make_due(pid)
    result, published = sweep(monkeypatch)
    assert result.backpressure and result.claimed == 0 and published == []
    assert result.lag >= 40 and Payment.objects.get(pk=pid).status == "PENDING"


def test_no_claims_means_no_backlog(db, timer_path):
    assert sweeper.executor_state() == sweeper.ExecutorState(behind=False, lag=0.0)


@pytest.mark.parametrize(
    ("remaining", "run_at", "behind", "lag"),
    [
        # claimed 30 s ago, due 40 s ago: waited half its lease, not more
        (30, -40, False, 30.0),
        (29.999999, -40, True, 30.000001),
        # claimed 10 s ago, due 5 s ago: queue delay counts from the due time
        (50, -5, False, 5.0),
        # claimed ahead, not yet due: no delay
        (55, 3, False, 0.0),
    ],
)
def test_executor_state_judges_the_oldest_claim_past_the_tolerated_ones(
    alice, settings, portable_clock, remaining, run_at, behind, lag
):
    settings.PAYMENT_LEASE_SECONDS = 60
    settings.PAYMENT_LOST_CLAIMS_TOLERATED = 1
    now = portable_clock
    # created out of lease order, so only the lease order finds the right one
    _claimed_ago(alice, now, 60 - remaining, run_at=now + timedelta(seconds=run_at))  # judged
    _claimed_ago(alice, now, 59, run_at=now - timedelta(seconds=200))  # a lost message
    _claimed_ago(alice, now, 1, run_at=now - timedelta(seconds=1))
    state = sweeper.executor_state()
    assert state == sweeper.ExecutorState(behind=behind, lag=pytest.approx(lag, abs=1e-9))
    settings.PAYMENT_LOST_CLAIMS_TOLERATED = 3
    assert sweeper.executor_state() == sweeper.ExecutorState()


def test_executor_state_on_postgresql_matches_the_orm_path(alice, settings, timer_path):
    settings.PAYMENT_LEASE_SECONDS = 60
    settings.PAYMENT_LOST_CLAIMS_TOLERATED = 1
    now = db_now()
    _claimed_ago(alice, now, 59, run_at=now - timedelta(seconds=200))  # a lost message
    _claimed_ago(alice, now, 10, run_at=now - timedelta(seconds=5))
    state = sweeper.executor_state()
    assert not state.behind and 5 <= state.lag < 8
    _claimed_ago(alice, now, 45, run_at=now - timedelta(seconds=100))
    state = sweeper.executor_state()
    assert state.behind and 45 <= state.lag < 48


def test_publish_claims_one_message_per_partition_chunk_eta_by_the_database_clock(
    monkeypatch, settings
):
    settings.PAYMENT_CHUNK_SPREAD_MS = 50
    now = timezone.now()
    published = capture_publish(monkeypatch)
    claims = [
        transitions.Claimed("late", 7, 12, now + timedelta(milliseconds=200)),
        transitions.Claimed("overdue", 2, 3, now - timedelta(seconds=1)),
        transitions.Claimed("now", 1, 3, now),
    ]
    assert tasks.publish_chunks(sweeper.chunk_claims(claims, now), now) == 2
    # overdue payments wait for no one: one chunk however far apart, sent without delay
    assert published == [
        ("payments.p03", [["overdue", 2], ["now", 1]], None),
        ("payments.p12", [["late", 7]], 0.2),
    ]


def ids(seed):
    rng = random.Random(seed)
    while True:
        yield str(uuid.UUID(int=rng.getrandbits(128)))


def test_a_chunk_goes_on_the_queue_of_one_of_its_partitions_as_often_as_its_share(settings):
    """Not always its lowest partition's: under load the worker takes its
    queues in turn, one message each, so the queue of a partition first in
    every chunk it is in would get more messages than the others and fall
    behind (bench, 2,250/s: partitions 0-3 ran 7-15 s late, 12-15 on time)."""
    settings.PAYMENT_CHUNK_SPREAD_MS = 300
    settings.PAYMENT_CHUNK_SIZE = 200
    base = timezone.now().replace(microsecond=0) + timedelta(seconds=10)
    names = ids(19)
    shares = {0: 30, 1: 60, 2: 45, 3: 45}  # a quarter, half again, ...
    queues = []
    for slot in range(400):
        start = base + timedelta(milliseconds=300 * slot)
        claims = [
            transitions.Claimed(next(names), 1, p, start + timedelta(microseconds=1 + k))
            for p, n in shares.items()
            for k in range(n)
        ]
        (chunk,) = sweeper.chunk_claims(claims, base - timedelta(seconds=1))
        queues.append(routing.chunk_partition(chunk[2]))
    for p, n in shares.items():  # about n / 180 of the 400 chunks each
        assert abs(queues.count(p) - 400 * n / 180) < 40


def test_publish_sends_a_chunk_to_the_queue_chunk_partition_names(monkeypatch):
    now = timezone.now()
    published = capture_publish(monkeypatch)
    names = ids(7)
    claims = [transitions.Claimed(next(names), 1, p, now) for p in (0, 5, 5, 9, 9, 9)]
    tasks.publish_chunks([((0, 5, 9), now, claims)], now)
    assert published[0][0] == routing.queue_name(routing.chunk_partition(claims))
    seen = {routing.chunk_partition([claims[0], *claims[n:]]) for n in range(1, 6)}
    assert seen <= {0, 5, 9}


def cut(claims, now):
    """``chunk_claims`` as (partitions, eta, payment ids) per chunk."""
    return [
        (partitions, eta, [c.payment_id for c in chunk])
        for partitions, eta, chunk in sweeper.chunk_claims(claims, now)
    ]


def test_the_grid_needs_a_spread_and_a_lookahead_of_a_slot_or_more(settings):
    settings.PAYMENT_CHUNK_SPREAD_MS = 200
    settings.PAYMENT_LOOKAHEAD_SECONDS = 0.2
    assert spread_grid() == timedelta(milliseconds=200)  # exactly one slot is enough
    assert spread_grid(0.199) is None  # a claim's own, shorter lookahead
    assert spread_grid(5.0) == timedelta(milliseconds=200)
    settings.PAYMENT_LOOKAHEAD_SECONDS = 0.199
    assert spread_grid() is None
    settings.PAYMENT_LOOKAHEAD_SECONDS = 1.0
    settings.PAYMENT_CHUNK_SPREAD_MS = 0
    assert spread_grid() is None


def test_chunks_close_at_the_size_and_at_the_end_of_a_slot(settings):
    """With a lookahead of a slot or more, a window is one slot of the spread
    grid: whole slots are what a sweep claims, so where one sweep's claims end
    never cuts a window in two."""
    settings.PAYMENT_CHUNK_SIZE = 3
    settings.PAYMENT_CHUNK_SPREAD_MS = 50
    settings.PAYMENT_LOOKAHEAD_SECONDS = 1.0
    now = slot_start() + timedelta(milliseconds=10)

    def at(ms):
        return now + timedelta(milliseconds=ms)

    claims = [
        transitions.Claimed("b3", 1, 5, at(89)),  # the last instant of slot [40, 90)
        transitions.Claimed("b1", 1, 5, at(40)),  # the first instant of that slot
        transitions.Claimed("b4", 1, 5, at(90)),  # the next slot
        transitions.Claimed("b2", 1, 5, at(60)),
        transitions.Claimed("c1", 1, 5, at(100)),  # 10 ms after b4: still its slot
        transitions.Claimed("c2", 1, 5, at(140)),  # the next
        transitions.Claimed("a1", 1, 1, at(0)),  # due exactly now: waits for no one
        transitions.Claimed("a0", 1, 1, at(-1000)),
    ]
    assert cut(claims, now) == [
        ((1,), at(0), ["a0", "a1"]),
        ((5,), at(89), ["b1", "b2", "b3"]),
        ((5,), at(100), ["b4", "c1"]),
        ((5,), at(140), ["c2"]),
    ]


def test_without_a_grid_chunks_close_past_the_spread_from_their_first(settings):
    """A lookahead shorter than a slot (or no spread) has no grid: waiting for a
    slot to end would run its payments late. A window then holds what is due
    within the spread of its first claim."""
    settings.PAYMENT_CHUNK_SIZE = 3
    settings.PAYMENT_CHUNK_SPREAD_MS = 50
    settings.PAYMENT_LOOKAHEAD_SECONDS = 0.04
    now = timezone.now()

    def at(ms):
        return now + timedelta(milliseconds=ms)

    claims = [
        transitions.Claimed("b3", 1, 5, at(100)),  # 50 ms after the chunk's first: same chunk
        transitions.Claimed("b1", 1, 5, at(50)),
        transitions.Claimed("b4", 1, 5, at(101)),  # 51 ms after b1: a new chunk
        transitions.Claimed("b2", 1, 5, at(60)),
        transitions.Claimed("c1", 1, 5, at(152)),  # 51 ms after b4: a new chunk
        transitions.Claimed("a1", 1, 1, at(0)),  # due exactly now: waits for no one
        transitions.Claimed("a0", 1, 1, at(-1000)),
    ]
    assert cut(claims, now) == [
        ((1,), at(0), ["a0", "a1"]),
        ((5,), at(100), ["b1", "b2", "b3"]),
        ((5,), at(101), ["b4"]),
        ((5,), at(152), ["c1"]),
    ]
    # measured from the window's first claim, not from the one before: a chain
    # of claims 40 ms apart does not stretch a window past the spread
    settings.PAYMENT_CHUNK_SIZE = 10
    chain = [transitions.Claimed(f"d{ms}", 1, 5, at(ms)) for ms in (200, 240, 280)]
    assert [ids for _, _, ids in cut(chain, now)] == [["d200", "d240"], ["d280"]]


def test_chunks_adapt_to_the_load_small_partitions_share_full_ones_stand_alone(settings):
    """At a trickle one window is one message for every partition in it; in a
    burst each partition's claims fill chunks of their own (concurrent batches
    then lock disjoint source accounts); a partition's claims are kept together
    and a chunk is never over the size."""
    settings.PAYMENT_CHUNK_SIZE = 4
    settings.PAYMENT_CHUNK_SPREAD_MS = 200
    now = slot_start()

    def at(ms):
        return now + timedelta(milliseconds=ms)

    trickle = [transitions.Claimed(f"t{p}", 1, p, at(10 * p)) for p in (9, 2, 14)]
    assert cut(trickle, now) == [((2, 9, 14), at(140), ["t2", "t9", "t14"])]
    burst = [transitions.Claimed(f"{p}-{i}", 1, p, at(-100)) for p in (3, 1) for i in range(4)]
    assert cut(burst, now) == [
        ((1,), at(-100), ["1-0", "1-1", "1-2", "1-3"]),
        ((3,), at(-100), ["3-0", "3-1", "3-2", "3-3"]),
    ]
    mixed = [transitions.Claimed(f"{p}-{i}", 1, p, at(5)) for p in (1, 2, 7) for i in range(3)]
    mixed += [transitions.Claimed("9-0", 1, 9, at(6))]
    assert cut(mixed, now) == [
        ((1,), at(5), ["1-0", "1-1", "1-2"]),
        ((2,), at(5), ["2-0", "2-1", "2-2"]),
        ((7, 9), at(6), ["7-0", "7-1", "7-2", "9-0"]),
    ]
    big = [transitions.Claimed(f"5-{i}", 1, 5, at(0)) for i in range(6)]
    big += [transitions.Claimed("8-0", 1, 8, at(0))]
    assert [ids for _, _, ids in cut(big, now)] == [
        ["5-0", "5-1", "5-2", "5-3"],
        ["5-4", "5-5", "8-0"],
    ]


def test_the_last_two_chunks_worth_of_a_window_are_halved_by_partition(settings):
    """A window's chunks come due together and run side by side, so a window
    of just over one chunk is two halves, not a full chunk and a small
    remainder (one worker running 200 payments while the other ran 20 and
    waited, session 36's 500/s step); whole partitions still, and a window of
    one chunk or less stays one chunk."""
    settings.PAYMENT_CHUNK_SIZE = 10
    settings.PAYMENT_CHUNK_SPREAD_MS = 400
    now = slot_start()

    def at(ms):
        return now + timedelta(milliseconds=ms)

    def claims_of(counts):
        """``n`` claims of each ``(partition, n)``, in that order."""
        return [transitions.Claimed(f"{p}-{i}", 1, p, at(i)) for p, n in counts for i in range(n)]

    def window(per_partition, partitions):
        return claims_of((p, per_partition) for p in range(partitions))

    def shape(claims):
        return [(partitions, len(ids)) for partitions, _, ids in cut(claims, now)]

    assert shape(window(2, 6)) == [((0, 1, 2), 6), ((3, 4, 5), 6)]  # greedy: 10 and 2
    assert shape(window(2, 5)) == [((0, 1, 2, 3, 4), 10)]  # exactly a chunk: one
    assert shape(window(1, 11)) == [(tuple(range(6)), 6), (tuple(range(6, 11)), 5)]
    assert shape(window(2, 10)) == [((0, 1, 2, 3, 4), 10), ((5, 6, 7, 8, 9), 10)]
    # more than two chunks' worth: full chunks first, then the rest in halves
    assert [n for _, n in shape(window(1, 25))] == [10, 8, 7]
    # a piece goes where its middle falls: 5 | 1 1 | 5 is cut 6 / 6, not 7 / 5
    assert shape(claims_of(((0, 5), (1, 1), (2, 1), (3, 5)))) == [((0, 1), 6), ((2, 3), 6)]
    # 5 | 3 4: the 3's middle is past the halfway mark, so 5 / 7, not 8 / 4
    assert shape(claims_of(((0, 5), (1, 3), (2, 4)))) == [((0,), 5), ((1, 2), 7)]
    # the slot that showed it: 200-payment chunks, 16 partitions of 13-14, 220 due
    settings.PAYMENT_CHUNK_SIZE = 200
    slot = [transitions.Claimed(f"s{n}", 1, n % 16, at(n * 399 // 220)) for n in range(220)]
    assert [len(ids) for _, _, ids in cut(slot, now)] == [112, 108]  # 8 + 8 partitions
    # one partition's 220 stay a full chunk and the rest: a piece is never
    # split (two halves of one partition would lock the same source accounts)
    hot = [transitions.Claimed(f"h{n}", 1, 3, at(n)) for n in range(220)]
    assert [len(ids) for _, _, ids in cut(hot, now)] == [200, 20]


pieces_of = st.lists(st.integers(1, 12), min_size=1, max_size=10)


@hypothesis_settings(max_examples=300, deadline=None)
@given(lengths=pieces_of, size=st.integers(1, 12))
def test_packing_halves_the_tail_without_more_or_larger_chunks_than_greedy(lengths, size):
    """Against filling each chunk until the next piece would not fit: never
    more chunks, never a larger one; pieces kept whole and in order; and a
    window of one to two chunks' worth packed into two is cut where moving
    the piece on either side of the cut would not bring the halves closer."""
    lengths = [min(n, size) for n in lengths]
    names = iter(range(10_000))
    base = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)
    pieces = [
        [transitions.Claimed(f"c{next(names)}", 1, p, base) for _ in range(n)]
        for p, n in enumerate(lengths)
    ]
    total = sum(lengths)
    chunks = sweeper.pack(pieces, size)
    greedy: list[list] = [[]]
    for piece in pieces:
        if len(greedy[-1]) + len(piece) > size:
            greedy.append([])
        greedy[-1].extend(piece)
    assert [c for chunk in chunks for c in chunk] == [c for piece in pieces for c in piece]
    for chunk in chunks:  # whole pieces: a chunk starts where a piece starts
        assert 0 < len(chunk) <= size
        assert any(chunk[0] is piece[0] for piece in pieces)
    assert len(chunks) <= len(greedy)  # pieces are never over the size: no empty chunk
    assert max(map(len, chunks)) <= max(map(len, greedy))
    if total <= size:
        assert len(chunks) == 1
    elif total <= 2 * size and len(chunks) == 2:
        # as even as whole pieces allow: moving the piece on either side of
        # the cut across it (where it fits) would not make the halves closer
        a, b = len(chunks[0]), len(chunks[1])
        cut_at = list(accumulate(lengths)).index(a)
        last, first = lengths[cut_at], lengths[cut_at + 1]
        assert b + last > size or abs(a - b) <= abs(a - b - 2 * last)
        assert a + first > size or abs(a - b) <= abs(a - b + 2 * first)


def flow_of(times, partitions, at):
    """One claim per (time, partition), in due order: ``"<partition>-<ms>"``."""
    return [transitions.Claimed(f"{p}-{t}", 1, p, at(t)) for t in times for p in partitions]


def test_a_slot_of_many_full_chunks_is_cut_in_time_into_sub_slots(settings):
    """A window holding three full chunks or more is cut into equal parts of
    its slot, as many as it holds pairs of full chunks (rounded half up); each
    part is cut by partition and size as a window is, so an even flow's chunks
    stay near full and hold disjoint partitions but are due within their
    part, not at the slot's end."""
    settings.PAYMENT_CHUNK_SIZE = 4
    settings.PAYMENT_CHUNK_SPREAD_MS = 400
    settings.PAYMENT_LOOKAHEAD_SECONDS = 1.0
    now = slot_start()

    def at(ms):
        return now + timedelta(milliseconds=ms)

    # four small partitions, 16 claims: uncut, each chunk would span the slot
    flow = flow_of((10, 199, 200, 399), (1, 2, 3, 4), at)  # 200: the second part's first instant
    assert cut(flow, now) == [
        ((1, 2), at(199), ["1-10", "1-199", "2-10", "2-199"]),
        ((3, 4), at(199), ["3-10", "3-199", "4-10", "4-199"]),
        ((1, 2), at(399), ["1-200", "1-399", "2-200", "2-399"]),
        ((3, 4), at(399), ["3-200", "3-399", "4-200", "4-399"]),
    ]
    assert cut(flow, None) == cut(flow, now)  # without "now" every claim waits
    # already due, or the window's first claim due at "now": never cut
    for late in (at(400), at(10)):
        assert cut(flow, late) == [
            ((p,), at(399), [f"{p}-{t}" for t in (10, 199, 200, 399)]) for p in (1, 2, 3, 4)
        ]
    # the same when the window is followed by the next slot's (closed mid-way)
    later = transitions.Claimed("1-450", 1, 1, at(450))
    assert cut([*flow, later], now) == [*cut(flow, now), ((1,), at(450), ["1-450"])]
    assert cut([*flow, later], at(400)) == [*cut(flow, at(400)), ((1,), at(450), ["1-450"])]
    # 12 claims = 3 full chunks, 1.5 pairs: two parts; 11 claims: kept whole
    assert cut(flow[:12], now) == [
        ((1, 2), at(199), ["1-10", "1-199", "2-10", "2-199"]),
        ((3, 4), at(199), ["3-10", "3-199", "4-10", "4-199"]),
        ((1, 2, 3, 4), at(200), ["1-200", "2-200", "3-200", "4-200"]),
    ]
    assert [(p, eta) for p, eta, _ in cut(flow[:11], now)] == [
        ((1,), at(200)),
        ((2,), at(200)),
        ((3,), at(200)),
        ((4,), at(199)),
    ]
    # 20 claims = 2.5 pairs: three parts of 133 ms
    twenty = flow_of(range(10, 400, 20), (3,), at)
    assert [eta for _, eta, _ in cut(twenty, now)] == [
        at(ms) for ms in (70, 130, 210, 250, 330, 390)
    ]


def test_a_part_under_a_full_chunk_joins_its_neighbour(settings):
    """An uneven slot — a burst at one instant and a few claims around it — is
    not cut into a small chunk of its own: a part under a full chunk joins the
    next part, or the one before when it is the last."""
    settings.PAYMENT_CHUNK_SIZE = 4
    settings.PAYMENT_CHUNK_SPREAD_MS = 400
    settings.PAYMENT_LOOKAHEAD_SECONDS = 1.0
    now, grid = slot_start(), spread_grid()

    def at(ms):
        return now + timedelta(milliseconds=ms)

    def claims(name, ms, n, partition=None):
        return [
            transitions.Claimed(f"{name}{i}", 1, partition or i % 4 + 1, at(ms + i))
            for i in range(n)
        ]

    burst, late_burst = claims("b", 10, 10), claims("l", 300, 10)
    head, tail = claims("h", 10, 2, 9), claims("t", 300, 2, 9)
    assert sweeper.sub_slots([*burst, *tail], grid, now) == [[*burst, *tail]]
    assert sweeper.sub_slots([*head, *late_burst], grid, now) == [[*head, *late_burst]]
    # 20 claims, three parts of 133 ms: the small middle one joins the last
    first, middle, last = claims("f", 10, 9), claims("m", 200, 2, 9), claims("z", 300, 9)
    assert sweeper.sub_slots([*first, *middle, *last], grid, now) == [first, [*middle, *last]]
    # exactly a full chunk stays a part of its own; an empty part is dropped
    full, full_first = claims("u", 300, 4, 9), claims("v", 10, 4, 9)
    assert sweeper.sub_slots([*burst, *full], grid, now) == [burst, full]
    assert sweeper.sub_slots([*full_first, *late_burst], grid, now) == [full_first, late_burst]
    early, later = claims("e", 10, 12), claims("w", 390, 9)
    assert sweeper.sub_slots([*early, *later], grid, now) == [early, later]


def test_without_a_spread_a_burst_at_one_future_instant_is_one_window(settings):
    """``PAYMENT_CHUNK_SPREAD_MS=0`` (no grid, a window is one instant): a
    window of many full chunks has no slot to cut, so it is packed whole —
    sub-slots once divided by the zero length and failed the sweep."""
    settings.PAYMENT_CHUNK_SIZE = 4
    settings.PAYMENT_CHUNK_SPREAD_MS = 0
    settings.PAYMENT_LOOKAHEAD_SECONDS = 1.0
    now = timezone.now()
    due = now + timedelta(milliseconds=300)
    flow = flow_of((0, 1, 2), (1, 2, 3, 4), lambda ms: due)  # 12 at one instant: 3 full chunks
    assert [(p, eta, len(ids)) for p, eta, ids in cut(flow, now)] == [
        ((1,), due, 3),
        ((2,), due, 3),
        ((3,), due, 3),
        ((4,), due, 3),
    ]


claim_sets = st.lists(
    st.tuples(st.sampled_from((0, 1, 199, 200, 399, 400, 401, 800, 1500)), st.integers(0, 5)),
    max_size=60,
)


@hypothesis_settings(max_examples=300, deadline=None)
@given(
    claims=claim_sets,
    size=st.integers(1, 6),
    spread_ms=st.sampled_from((0, 1, 50, 200, 400)),
    lookahead=st.sampled_from((0.1, 1.0)),
    now_ms=st.one_of(st.none(), st.integers(-100, 1600)),
)
def test_every_claim_goes_out_once_in_a_chunk_never_early_nor_held_past_its_spread(
    claims, size, spread_ms, lookahead, now_ms
):
    """Whatever the claims, the chunk size, the spread (none included) and
    the lookahead: each claim is in exactly one chunk, no chunk holds more
    than a chunk's size, a chunk's partitions are its claims' and its ETA its
    latest due time (so none runs early), and no claim waits for its chunk
    past its own due time plus the spread — or past now, for a claim already
    due."""
    base = datetime(2026, 11, 29, 12, 0, 0, tzinfo=UTC)

    def at(ms):
        return base + timedelta(milliseconds=ms)

    flow = [transitions.Claimed(f"c{i}", 1, p, at(ms)) for i, (ms, p) in enumerate(claims)]
    now = None if now_ms is None else at(now_ms)
    spread = timedelta(milliseconds=spread_ms)
    with override_settings(
        PAYMENT_CHUNK_SIZE=size,
        PAYMENT_CHUNK_SPREAD_MS=spread_ms,
        PAYMENT_LOOKAHEAD_SECONDS=lookahead,
    ):
        chunks = sweeper.chunk_claims(flow, now)
    seen = [c.payment_id for _, _, chunk in chunks for c in chunk]
    assert sorted(seen) == sorted(c.payment_id for c in flow)
    for partitions, eta, chunk in chunks:
        assert 0 < len(chunk) <= size
        assert partitions == tuple(sorted({c.partition for c in chunk}))
        assert eta == max(c.due_at for c in chunk)
        for c in chunk:
            assert eta <= max(c.due_at + spread, now or c.due_at)


def test_without_a_grid_sub_slots_count_from_the_window_s_first_claim(settings):
    settings.PAYMENT_CHUNK_SIZE = 4
    settings.PAYMENT_CHUNK_SPREAD_MS = 400
    settings.PAYMENT_LOOKAHEAD_SECONDS = 0.2  # shorter than a slot: no grid
    now = timezone.now()

    def at(ms):
        return now + timedelta(milliseconds=ms)

    flow = flow_of((10, 209, 210, 410), (1, 2, 3, 4), at)  # 410: the spread's last instant
    assert [(p, eta) for p, eta, _ in cut(flow, now)] == [
        ((1, 2), at(209)),
        ((3, 4), at(209)),
        ((1, 2), at(410)),
        ((3, 4), at(410)),
    ]


def test_republished_early_arrivals_wait_for_their_due_time_on_their_queue(
    alice, monkeypatch, settings
):
    (pid,) = schedule(alice)
    now = timezone.now()
    monkeypatch.setattr(tasks, "db_now", lambda: now)
    published = capture_publish(monkeypatch)
    unknown = str(uuid.uuid4())
    tasks.republish_not_due(
        [
            (pid, 3, now + timedelta(seconds=2.5)),
            (unknown, 1, now + timedelta(seconds=1)),
            (pid, 4, now - timedelta(seconds=1)),  # due by now: at once
        ]
    )
    assert published == [
        (queue_of(alice), [[pid, 3]], 2.5),
        ("payments.p00", [[unknown, 1]], 1.0),
        (queue_of(alice), [[pid, 4]], 0.0),
    ]


def test_partitions_of_names_each_known_payment_by_its_id_string(alice, bob):
    (a,) = schedule(alice)
    (b,) = schedule(bob)
    found = selectors.partitions_of([a, b, str(uuid.uuid4())])
    assert found == {a: partition_for(alice.account.pk), b: partition_for(bob.account.pk)}


def test_an_early_delivery_is_sent_back_to_its_queue_with_the_remaining_time(
    alice, monkeypatch, settings
):
    """The executor task, handed a chunk before its due time (a publisher's clock
    ahead of the database), executes nothing and re-publishes it, same fence."""
    settings.PAYMENT_LOOKAHEAD_SECONDS = 2
    (pid,) = schedule(alice)
    set_times(pid, due_at=db_now() + timedelta(seconds=1.5))
    _, first = sweep(monkeypatch)
    again = capture_publish(monkeypatch)
    outcome = tasks.execute_chunk([[pid, 1]])
    assert outcome == {"completed": 0, "failed": 0, "stale": 0, "busy": 0}
    ((queue, items, countdown),) = again
    assert (queue, items) == (queue_of(alice), [[pid, 1]]) and 0 < countdown <= 1.5
    assert Payment.objects.get(pk=pid).status == "QUEUED"
    assert executor.execute_chunk(first.items()).completed == []


def test_a_sweep_reports_its_duration_and_logs_what_it_claimed(
    alice, monkeypatch, caplog, timer_path
):
    ticks = iter([100.0, 102.5])

    class Clock:
        @staticmethod
        def monotonic():
            return next(ticks)

    monkeypatch.setattr(sweeper, "time", Clock)
    ids = schedule(alice, 3)
    make_due(*ids)
    with caplog.at_level(logging.INFO, logger="payments.engine.sweeper"):
        result, _ = sweep(monkeypatch)
    assert result.seconds == 2.5
    (record,) = [r for r in caplog.records if r.name == "payments.engine.sweeper"]
    assert record.levelno == logging.INFO
    assert record.getMessage() == "sweep claimed 3 payments in 1 messages"
    assert (record.claimed, record.messages) == (3, 1)


def test_an_idle_sweep_logs_nothing(db, monkeypatch, caplog, timer_path):
    with caplog.at_level(logging.DEBUG, logger="payments.engine.sweeper"):
        result, published = sweep(monkeypatch)
    assert (result.claimed, result.messages, result.batches, published) == (0, 0, 0, [])
    assert [r for r in caplog.records if r.name == "payments.engine.sweeper"] == []


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_sweepers_never_claim_or_publish_the_same_payment(monkeypatch):
    """Sweepers on several nodes: rows another sweeper is claiming are skipped,
    not claimed again once it commits (no second fence, event or message)."""
    source = AccountFactory(funded=1_000)
    ids = bulk_schedule(
        sources=[source.pk],
        targets=[AccountFactory().pk],
        count=3,
        amount=1,
        due_at=db_now() - timedelta(seconds=1),
    )
    published = capture_publish(monkeypatch)
    first = []
    done = in_another_transaction(lambda: first.append(sweep_due()))
    try:
        second = sweep_due()
    finally:
        done()
    assert (first[0].claimed, second.claimed, second.messages) == (3, 0, 0)
    assert sorted(published.items()) == sorted((pid, 1) for pid in ids)
    for payment in Payment.objects.filter(pk__in=ids):
        assert (payment.status, payment.fence, payment.attempts) == ("QUEUED", 1, 1)
        types = payment.events.order_by("pk").values_list("type", flat=True)
        assert list(types) == ["scheduled", "queued"]  # claimed once


def test_a_steady_flow_is_one_message_per_slot_whenever_the_sweeps_run(
    alice, monkeypatch, settings, timer_path
):
    """Sweeps at irregular moments each claim whole slots of the spread grid, so
    a steady flow goes out as one message per slot: no slot is cut in two by
    where a sweep's lookahead happened to end (before the grid, half the
    messages of a 150/s flow held a single payment)."""
    settings.PAYMENT_LOOKAHEAD_SECONDS = 1.0
    settings.PAYMENT_CHUNK_SPREAD_MS = 200
    grid = timedelta(milliseconds=200)
    ids = bulk_schedule(
        sources=[alice.account.pk],
        targets=[alice.other_account.pk],
        count=150,
        amount=1,
        due_at=db_now() + timedelta(hours=1),
    )
    # the clock is read after the set-up and the times are set in one statement:
    # on the real clock a slow set-up (150 single-row updates took over 300 ms on
    # a loaded CI host) left the first payments due before the first sweep, and
    # payments already due go out together whatever their slot — by design, not
    # what this test is about
    start = db_now()
    clock = [start]
    if timer_path == "portable":  # a database clock that moves only when told to
        for module in CLOCK_READERS:
            monkeypatch.setattr(module, "db_now", lambda: clock[0])
    due = {pid: start + timedelta(milliseconds=500 + 11 * n) for n, pid in enumerate(ids)}
    at = Case(*(When(pk=pid, then=Value(when)) for pid, when in due.items()))
    Payment.objects.filter(pk__in=ids).update(due_at=at, run_at=at)
    published = capture_publish(monkeypatch)
    for pause in (0.0, 0.13, 0.29, 0.07, 0.33, 0.21, 0.17, 0.4, 0.5):
        if timer_path == "portable":
            clock[0] += timedelta(seconds=pause)
        else:
            time.sleep(pause)
        sweeper.sweep_due(publish=tasks.publish_chunks)
    slots_of = [{start_of_slot(due[pid], grid) for pid, _ in items} for _, items, _ in published]
    assert all(len(slots) == 1 for slots in slots_of), slots_of
    slots = [slots.pop() for slots in slots_of]
    assert len(slots) == len(set(slots)), "a slot went out in two messages"
    assert sorted(pid for _, items, _ in published for pid, _ in items) == sorted(ids)


def test_the_one_clock_is_the_database_s(monkeypatch):
    """Due-ness is decided by the database clock: on PostgreSQL ``db_now`` asks
    the server, whatever this process's clock says; on SQLite (one host) the
    process clock is the database's."""
    from payments import clock

    far_off = datetime(2001, 1, 1, tzinfo=UTC)
    monkeypatch.setattr(clock.timezone, "now", lambda: far_off)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")  # connected before the clock is asked
    if connection.vendor == "postgresql":
        assert abs(clock.db_now() - datetime.now(UTC)) < timedelta(minutes=5)
    else:
        assert clock.db_now() == far_off


def test_timestamps_are_written_in_utc_whatever_the_process_time_zone(monkeypatch):
    from payments.clock import iso_timestamp

    monkeypatch.setenv("TZ", "Asia/Tokyo")
    time.tzset()
    try:
        moment = datetime(2026, 1, 1, 12, 0, 0, 5, tzinfo=dt_timezone(timedelta(hours=2)))
        assert iso_timestamp(moment) == "2026-01-01T10:00:00.000005Z"
    finally:
        monkeypatch.undo()
        time.tzset()


def test_work_ahead_is_looked_for_only_when_a_sweep_found_nothing(
    alice, monkeypatch, settings, timer_path
):
    """A sweep that claimed something ticks again anyway, so it does not spend a
    query on the next slot; one that claimed nothing says whether the next slot
    holds work."""
    settings.PAYMENT_LOOKAHEAD_SECONDS = 1.0
    settings.PAYMENT_CHUNK_SPREAD_MS = 1000
    now_due, next_slot = schedule(alice, 2)
    make_due(now_due)
    # past the horizon (now + 1 s, rounded down), within the slot after it
    set_times(next_slot, due_at=db_now() + timedelta(seconds=1.5))
    result, _ = sweep(monkeypatch)
    assert result.claimed == 1 and not result.work_ahead
    result, _ = sweep(monkeypatch)
    assert result.claimed == 0 and result.work_ahead
