"""A sweeper's message never waits for a payment another transaction holds.

Two workers near capacity: one's collapse takes in payments whose own message
the other worker is about to run. Waiting for their row locks cost the second
worker the whole of the first one's batch, only to find them done. Now it
skips them (``SKIP LOCKED``) and hands back those still QUEUED with its fence
as last committed (``ChunkResult.busy``), re-published after
``PAYMENT_BUSY_RETRY_MS``: if the holder committed, the next delivery finds
them done; if it rolled back, the next delivery runs them — never left to the
reaper's lease. The operator's execute-now and a retried chunk (no
``partitions``) still wait.
"""

import threading

import pytest
from django.db import OperationalError, connection, transaction

from ledger.models import JournalEntry
from ledger.reconciliation import reconcile
from payments import locks, tasks
from payments.clock import db_now
from payments.engine import executor
from payments.models import Payment
from tests.concurrency import run_in_threads
from tests.factories import AccountFactory, UserFactory
from tests.payments.helpers import bulk_schedule, capture_publish, claim_batch

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture(autouse=True)
def short_batches(settings):
    """A delivery that waited for a held row instead of skipping it would hang
    until the batch's time limit in PostgreSQL: make that seconds, not 30."""
    settings.PAYMENT_BATCH_TIMEOUT_SECONDS = 5


class Rollback(Exception):
    pass


@pytest.fixture
def claimed():
    """Three due payments of one source account (one partition), claimed:
    (ids, fences, partition)."""
    source = AccountFactory(owner=UserFactory(), funded=10_000).pk
    target = AccountFactory().pk
    ids = bulk_schedule(sources=[source], targets=[target], count=3, amount=10, due_at=db_now())
    with transaction.atomic():
        fences = {c.payment_id: c.fence for c in claim_batch(10, 0.0)}
    return ids, fences, Payment.objects.get(pk=ids[0]).partition


def elsewhere(work):
    """``work()`` in a thread with its own connection; what it returned."""
    out = []
    assert run_in_threads(lambda _: out.append(work()), 1, timeout=30) == []
    return out[0]


def entries(pid):
    return JournalEntry.objects.filter(reference=f"payment:{pid}").count()


def test_a_payment_another_batch_took_in_is_handed_back_and_then_found_done(claimed, caplog):
    caplog.set_level("INFO", logger="payments.engine.executor")
    ids, fences, partition = claimed
    a, b = ids[0], ids[1]
    with transaction.atomic():
        # the first worker's batch: its chunk is ``a``; its collapse takes ``b``
        # (and the third) and holds them until it commits
        first = executor.execute_chunk([(a, fences[a])], partitions=[partition])
        assert b in first.collapsed
        second = elsewhere(lambda: executor.execute_chunk([(b, fences[b])], partitions=[partition]))
    assert second.busy == [(b, fences[b], partition)]
    assert (second.stale, second.completed, second.collapsed) == ([], [], [])
    assert "1 payments held by another transaction, handed back" in caplog.messages
    # handed back and delivered again after the holder committed: found done
    again = executor.execute_chunk([(b, fences[b])], partitions=[partition])
    assert (again.stale, again.busy, again.completed) == ([b], [], [])
    assert Payment.objects.get(pk=b).status == "COMPLETED"
    assert entries(b) == 1
    assert reconcile().ok


def test_a_payment_whose_holder_rolled_back_runs_in_the_next_delivery(claimed):
    ids, fences, partition = claimed
    a, b = ids[0], ids[1]
    with pytest.raises(Rollback), transaction.atomic():
        executor.execute_chunk([(a, fences[a])], partitions=[partition])
        second = elsewhere(lambda: executor.execute_chunk([(b, fences[b])], partitions=[partition]))
        raise Rollback  # the first worker's batch dies before COMMIT
    assert second.busy == [(b, fences[b], partition)]
    assert Payment.objects.get(pk=b).status == "QUEUED"  # not left for the reaper: handed back
    again = executor.execute_chunk([(b, fences[b])], partitions=[partition])
    assert b in again.completed
    assert (again.stale, again.busy) == ([], [])
    assert entries(b) == 1
    assert reconcile().ok


def test_only_an_item_still_queued_with_its_fence_is_handed_back(claimed):
    """Held items whose last committed state is not this message's (an old
    fence, or no longer QUEUED) are stale, as unheld ones are; an id with no
    row is stale too — nothing is handed back for ever."""
    ids, fences, partition = claimed
    a, b, c = ids
    Payment.objects.filter(pk=c).update(status="PENDING")  # the reaper gave it back
    ghost = "00000000-0000-4000-8000-000000000000"
    items = [(a, fences[a] + 1), (b, fences[b]), (c, fences[c]), (ghost, 1)]
    with transaction.atomic():
        with connection.cursor() as cursor:  # a cancel, the reaper, another batch…
            cursor.execute(
                "SELECT 1 FROM payments_payment WHERE id = ANY(%s::uuid[]) FOR NO KEY UPDATE",
                [[a, b, c]],
            )
        result = elsewhere(lambda: executor.execute_chunk(items, partitions=[partition]))
    assert result.busy == [(b, fences[b], partition)]
    assert sorted(result.stale) == sorted([a, c, ghost])


def test_the_operator_s_execute_now_still_waits_for_the_holder(claimed):
    """Without ``partitions`` (execute-now, a retried chunk) the executor waits
    for the row as before: seen waiting on the lock in pg_stat_activity, it
    runs the payment once the holder lets go."""
    ids, fences, _ = claimed
    b = ids[1]
    outcome = []
    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM payments_payment WHERE id = %s FOR NO KEY UPDATE", [b])
            backend = connection.connection.info.backend_pid

        def execute_now():
            try:
                outcome.append(executor.execute_chunk([(b, fences[b])]))
            finally:
                connection.close()

        thread = threading.Thread(target=execute_now)
        thread.start()
        waiting = False
        for _ in range(300):
            with connection.cursor() as cursor:
                # a transaction sees one snapshot of pg_stat_activity unless cleared
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                    " AND %s = ANY(pg_blocking_pids(pid))",
                    [backend],
                )
                if cursor.fetchone()[0]:
                    waiting = True
                    break
            thread.join(0.1)
        assert waiting, "execute-now did not wait for the row lock"
        assert thread.is_alive()
    thread.join(30)
    assert not thread.is_alive()
    assert outcome[0].completed == [b] and outcome[0].busy == []
    assert entries(b) == 1


def test_the_task_hands_busy_items_back_to_their_partition_after_the_retry_delay(
    claimed, monkeypatch, settings
):
    settings.PAYMENT_BUSY_RETRY_MS = 300
    ids, fences, partition = claimed
    a, b, c = ids
    with transaction.atomic():
        executor.execute_chunk([(a, fences[a])], partitions=[partition])  # takes b and c in
        published = capture_publish(monkeypatch)
        answer = elsewhere(
            lambda: tasks.execute_chunk.apply(
                args=[[[b, fences[b]], [c, fences[c]]]], kwargs={"partitions": [partition]}
            ).get()
        )
    assert answer == {"completed": 0, "failed": 0, "stale": 0, "busy": 2}
    queue = tasks.routing.queue_name(partition)
    assert list(published) == [(queue, [[b, fences[b]], [c, fences[c]]], 0.3)]
    assert published.kwargs == [{"partitions": [partition], "hops": 1}]


def test_a_hand_back_goes_to_each_partition_s_queue_later_each_time_then_waits(
    monkeypatch, settings
):
    """One message per partition; the delay doubles with each hand-back; after
    ``BUSY_HOPS`` the message carries no partitions, so its delivery waits for
    the rows (bounded by the batch's time limit) instead of circling."""
    settings.PAYMENT_BUSY_RETRY_MS = 250
    published = capture_publish(monkeypatch)
    items = [("p1", 4, 3), ("p2", 5, 7), ("p3", 6, 3)]
    tasks.republish_busy(items, hops=2)
    q3, q7 = tasks.routing.queue_name(3), tasks.routing.queue_name(7)
    assert list(published) == [(q3, [["p1", 4], ["p3", 6]], 1.0), (q7, [["p2", 5]], 1.0)]
    assert published.kwargs == [{"partitions": [3], "hops": 3}, {"partitions": [7], "hops": 3}]
    published.clear()
    published.kwargs.clear()
    tasks.republish_busy(items[:1], hops=tasks.BUSY_HOPS)
    assert list(published) == [(q3, [["p1", 4]], 2.0)]
    assert published.kwargs == [{}]


def test_a_hand_back_the_broker_refuses_runs_here_waiting_for_the_rows(claimed, monkeypatch):
    ids, fences, partition = claimed
    b = ids[1]

    def refuse(*args, **kwargs):
        raise ConnectionError("broker down")

    monkeypatch.setattr(tasks.execute_chunk, "apply_async", refuse)
    tasks._hand_back([(b, fences[b], partition)], 0)
    assert Payment.objects.get(pk=b).status == "COMPLETED"
    assert entries(b) == 1


def test_lock_chunk_waits_for_a_held_row_unless_told_to_skip(claimed):
    """``locks.lock_chunk`` on its own: by default it waits (here until a lock
    timeout), with ``skip_locked`` it leaves the held row out at once."""
    ids, _, _ = claimed
    b = ids[1]

    def lock(**options):
        with transaction.atomic():
            with connection.cursor() as cursor:
                cursor.execute("SET LOCAL lock_timeout = '300ms'")
            try:
                return [str(p.pk) for p in locks.lock_chunk([b], **options)[1]]
            except OperationalError as exc:
                return type(exc.__cause__).__name__

    with transaction.atomic():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1 FROM payments_payment WHERE id = %s FOR NO KEY UPDATE", [b])
        assert elsewhere(lock) == "LockNotAvailable"
        assert elsewhere(lambda: lock(skip_locked=True)) == []
    assert elsewhere(lock) == [b]


def test_queued_in_flight_answers_for_the_ids_asked_only(claimed):
    ids, fences, partition = claimed
    _, b, c = ids  # all three QUEUED
    Payment.objects.filter(pk=c).update(status="PENDING")  # the reaper gave it back
    assert locks.queued_in_flight([b, c]) == {b: (fences[b], partition)}  # not the first, not c
