"""The executor's collapse: one message runs its partition's due backlog as one batch.

A chunk handed to ``execute_chunk`` with its ``partition`` also runs every
other QUEUED payment of that partition that is due by the database clock and
not locked elsewhere (``locks.lock_due_queued``, SKIP LOCKED), up to
``PAYMENT_COLLAPSE_LIMIT`` more than the chunk's own. These tests pin what
that may and may not take:
never a payment not yet due, never one of another partition, never a stale
item of the chunk itself; each payment still moves money once, and the
messages that find their payments done write nothing.
"""

from datetime import timedelta

import pytest
from django.db import DataError, InternalError, OperationalError, transaction
from prometheus_client import REGISTRY

from ledger.models import Account, Hold, JournalEntry
from ledger.reconciliation import reconcile
from payments import locks, tasks
from payments.clock import db_now
from payments.engine import executor
from payments.models import Payment, PaymentAttempt, PaymentEvent
from payments.routing import partition_for
from tests.concurrency import in_other_connection
from tests.factories import AccountFactory, UserFactory
from tests.payments.engine.timer import in_another_transaction, queued_payment
from tests.payments.helpers import bulk_schedule, claim_batch, make_due, race_cancel, sweep
from tests.plans import explain_call, index_scan

pytestmark = pytest.mark.django_db


def schedule(client, n=1, **overrides):
    return [client.schedule(**overrides).json()["payment_id"] for _ in range(n)]


def claimed(client, n, monkeypatch):
    """``n`` due payments of ``client``, claimed: one message each (as a steady
    flow is published), returned as (messages, partition)."""
    ids = schedule(client, n, amount=10)
    make_due(*ids)
    _, published = sweep(monkeypatch)
    items = published.items()
    partition = Payment.objects.get(pk=ids[0]).partition
    return [[item] for item in items], partition


def entries(ids):
    return JournalEntry.objects.filter(reference__in=[f"payment:{p}" for p in ids]).count()


def test_a_lone_payment_goes_out_alone_at_once(alice, monkeypatch):
    (message,), partition = claimed(alice, 1, monkeypatch)
    outcome = executor.execute_chunk(message, partitions=[partition])
    assert outcome.completed == [message[0][0]] and outcome.collapsed == []


def test_the_first_message_runs_the_partitions_due_backlog_the_rest_find_it_done(
    alice, monkeypatch
):
    messages, partition = claimed(alice, 5, monkeypatch)
    ids = [m[0][0] for m in messages]
    first = executor.execute_chunk(messages[0], partitions=[partition])
    assert sorted(first.completed) == sorted(ids)
    assert sorted(first.collapsed) == sorted(ids[1:])
    for message in messages[1:]:  # each later message: its payment is done, nothing written
        before = (PaymentAttempt.objects.count(), PaymentEvent.objects.count())
        later = executor.execute_chunk(message, partitions=[partition])
        assert later.completed == [] and later.stale == [message[0][0]]
        assert (PaymentAttempt.objects.count(), PaymentEvent.objects.count()) == before
    assert entries(ids) == 5
    for pid in ids:  # each ran under its own claim's fence, once
        payment = Payment.objects.get(pk=pid)
        attempt = PaymentAttempt.objects.get(payment=payment)
        assert payment.status == "COMPLETED" and attempt.fence == payment.fence == 1
        assert attempt.outcome == "succeeded"
    assert Account.objects.get(pk=alice.account.pk).held == 0
    assert reconcile().ok


def test_without_a_partition_only_the_chunk_runs(alice, monkeypatch):
    """The operator's execute-now (and any message from before the collapse)."""
    messages, _ = claimed(alice, 3, monkeypatch)
    outcome = executor.execute_chunk(messages[0])
    assert outcome.completed == [messages[0][0][0]] and outcome.collapsed == []
    assert Payment.objects.filter(status="QUEUED").count() == 2


def test_nothing_not_yet_due_and_nothing_of_another_partition_is_collapsed(alice, monkeypatch):
    messages, partition = claimed(alice, 4, monkeypatch)
    _, later, other, gone = (m[0][0] for m in messages)
    soon = db_now() + timedelta(seconds=30)
    Payment.objects.filter(pk=later).update(due_at=soon, run_at=soon)
    Payment.objects.filter(pk=other).update(partition=(partition + 1) % 16)
    Payment.objects.filter(pk=gone).update(status="PENDING", lease_expires_at=None)
    outcome = executor.execute_chunk(messages[0], partitions=[partition])
    assert outcome.completed == [messages[0][0][0]] and outcome.collapsed == []
    statuses = dict(Payment.objects.filter(pk__in=[later, other, gone]).values_list("pk", "status"))
    assert {str(k): v for k, v in statuses.items()} == {
        later: "QUEUED",
        other: "QUEUED",
        gone: "PENDING",
    }
    assert entries([later, other, gone]) == 0


def test_only_a_queued_payment_is_collapsed_whatever_lease_it_still_carries(alice, monkeypatch):
    """QUEUED under the row lock is what makes a payment runnable (DESIGN §4.1), not
    its lease: every transition out of QUEUED clears the lease today, but one that
    forgot to must not let a cancelled or pending payment run."""
    messages, partition = claimed(alice, 3, monkeypatch)
    cancelled, pending = messages[1][0][0], messages[2][0][0]
    Payment.objects.filter(pk=cancelled).update(status="CANCELLED")  # lease left on
    Payment.objects.filter(pk=pending).update(status="PENDING")
    outcome = executor.execute_chunk(messages[0], partitions=[partition])
    assert outcome.completed == [messages[0][0][0]] and outcome.collapsed == []
    assert entries([cancelled, pending]) == 0


def test_a_payment_whose_lease_ran_out_is_left_to_the_reaper(alice, monkeypatch):
    messages, partition = claimed(alice, 2, monkeypatch)
    expired = messages[1][0][0]
    Payment.objects.filter(pk=expired).update(lease_expires_at=db_now() - timedelta(seconds=1))
    outcome = executor.execute_chunk(messages[0], partitions=[partition])
    assert outcome.collapsed == [] and Payment.objects.get(pk=expired).status == "QUEUED"


def test_a_payment_claimed_again_runs_only_in_its_own_message(alice, monkeypatch):
    """Its lease ran out once (a lost message, or a batch it kept failing): it is
    not carried into other messages' batches again."""
    messages, partition = claimed(alice, 2, monkeypatch)
    again = messages[1][0][0]
    Payment.objects.filter(pk=again).update(attempts=2)
    outcome = executor.execute_chunk(messages[0], partitions=[partition])
    assert outcome.collapsed == [] and Payment.objects.get(pk=again).status == "QUEUED"
    own = executor.execute_chunk(messages[1], partitions=[partition])
    assert own.completed == [again]


def test_a_retried_chunk_runs_only_its_own_items(monkeypatch, settings):
    """A transient failure may come from a payment the collapse took in: the
    retries and the split run without collapsing, so the chunk's own payments go
    out without it."""
    from django.db import OperationalError

    settings.PAYMENT_CHUNK_RETRIES = 2
    calls = []

    def flaky(chunk, *, partitions=(), **kwargs):
        calls.append(tuple(partitions))
        if partitions:  # the collapsed poison
            raise OperationalError("server closed the connection unexpectedly")
        return executor.ChunkResult(completed=[pid for pid, _ in chunk])

    monkeypatch.setattr(executor, "execute_chunk", flaky)
    monkeypatch.setattr(tasks, "backoff_seconds", lambda retries: 0)
    result = tasks.execute_chunk.apply(args=[[["a", 1], ["b", 1]]], kwargs={"partitions": [3, 5]})
    assert result.result == {"completed": 2, "failed": 0, "stale": 0, "busy": 0}
    assert calls == [(3, 5), ()]


def test_a_stale_item_of_the_chunk_is_not_run_by_its_own_collapse(alice, monkeypatch):
    """(pid, old fence) in the message, the payment QUEUED again under a newer
    fence (reaped and re-claimed): the old message must not run it, not even as
    a collapsed extra; its current message will."""
    messages, partition = claimed(alice, 1, monkeypatch)
    ((pid, fence),) = messages[0]
    Payment.objects.filter(pk=pid).update(fence=fence + 1)
    outcome = executor.execute_chunk(messages[0], partitions=[partition])
    assert outcome.stale == [pid] and outcome.completed == outcome.collapsed == []
    assert Payment.objects.get(pk=pid).status == "QUEUED"
    current = executor.execute_chunk([(pid, fence + 1)], partitions=[partition])
    assert current.completed == [pid]
    assert entries([pid]) == 1


def backlog(client, n, monkeypatch, settings, *, chunk, limit):
    """``n`` due payments of ``client`` claimed one message each, with the
    chunk size and the collapse limit set: their (id, fence) items, oldest
    claim first, and their partition."""
    settings.PAYMENT_CHUNK_SIZE = chunk
    settings.PAYMENT_COLLAPSE_LIMIT = limit
    messages, partition = claimed(client, n, monkeypatch)
    return [m[0] for m in messages], partition


def test_a_batch_holds_its_chunk_and_at_most_the_collapse_limit_more(alice, monkeypatch, settings):
    items, partition = backlog(alice, 7, monkeypatch, settings, chunk=2, limit=3)
    first = executor.execute_chunk(items[:2], partitions=[partition])
    assert len(first.completed) == 5 and len(first.collapsed) == 3
    assert set(pid for pid, _ in items[:2]) <= set(first.completed)
    second = executor.execute_chunk(items[6:], partitions=[partition])
    assert len(second.completed) == 2  # the two left, whether its own was one of them or not
    assert Payment.objects.filter(status="COMPLETED").count() == 7


def test_the_limit_is_not_the_chunk_size_and_a_full_chunk_still_takes_it(
    alice, monkeypatch, settings
):
    items, partition = backlog(alice, 6, monkeypatch, settings, chunk=2, limit=4)
    outcome = executor.execute_chunk(items[:2], partitions=[partition])
    assert sorted(outcome.completed) == sorted(pid for pid, _ in items)
    assert sorted(outcome.collapsed) == sorted(pid for pid, _ in items[2:])


def test_a_message_whose_own_payments_ran_already_still_runs_the_limit_of_the_backlog(
    alice, monkeypatch, settings
):
    """How a late group of partitions catches up. Under load the worker takes
    the queues in turn, so a group that fell behind is served about one
    message per message it receives, and the message before has usually run
    the next one's payments already. Each such message must still run the
    limit's worth of the backlog: capped at one chunk in all, a group whose
    messages carried ~180 payments caught up at a tenth of its arrival rate
    (bench, 2,250/s: 7-15 s late for minutes, the other groups on time)."""
    items, partition = backlog(alice, 8, monkeypatch, settings, chunk=2, limit=3)
    for age, (pid, _) in zip(range(20, 12, -1), items, strict=True):  # oldest due first
        Payment.objects.filter(pk=pid).update(due_at=db_now() - timedelta(seconds=age))
    first = executor.execute_chunk(items[:2], partitions=[partition])
    assert len(first.completed) == 5
    second = executor.execute_chunk(items[2:4], partitions=[partition])  # its own: done
    assert sorted(second.stale) == sorted(pid for pid, _ in items[2:4])
    assert sorted(second.completed) == sorted(second.collapsed)
    assert len(second.completed) == 3  # the rest of the backlog, though its own were done
    assert Payment.objects.filter(status="COMPLETED").count() == 8


def test_an_over_full_chunk_runs_whole_and_still_takes_at_most_the_limit_more(
    alice, monkeypatch, settings
):
    items, partition = backlog(alice, 5, monkeypatch, settings, chunk=3, limit=1)
    settings.PAYMENT_CHUNK_SIZE = 1  # lowered after the chunk was cut: it is over full
    outcome = executor.execute_chunk(items[:3], partitions=[partition])
    assert len(outcome.completed) == 4 and len(outcome.collapsed) == 1
    assert set(pid for pid, _ in items[:3]) <= set(outcome.completed)


def test_a_business_failure_in_a_collapsed_batch_fails_only_that_payment(alice, monkeypatch):
    messages, partition = claimed(alice, 3, monkeypatch)
    ids = [m[0][0] for m in messages]
    doomed = Payment.objects.get(pk=ids[2])
    Hold.objects.filter(pk=doomed.hold_id).update(status="released")  # hold gone
    outcome = executor.execute_chunk(messages[0], partitions=[partition])
    assert sorted(outcome.completed) == sorted(ids[:2]) and outcome.failed == [ids[2]]
    assert Payment.objects.get(pk=ids[2]).status == "FAILED"
    assert entries(ids) == 2


def test_a_batch_that_dies_midway_leaves_every_payment_queued_for_the_next(alice, monkeypatch):
    """A worker killed (or a database error) after the collapse took its extras,
    before commit: the transaction rolls back, nothing of the batch is written —
    not the chunk's payments and not the collapsed ones — and the next message
    of the partition runs them all, once."""
    messages, partition = claimed(alice, 4, monkeypatch)
    ids = [m[0][0] for m in messages]
    calls = []

    def die(*args, **kwargs):
        calls.append(1)
        raise OSError("worker lost")

    monkeypatch.setattr(executor.LedgerBatch, "flush", die)
    with pytest.raises(OSError):
        executor.execute_chunk(messages[0], partitions=[partition])
    assert calls == [1]
    monkeypatch.undo()
    assert set(Payment.objects.filter(pk__in=ids).values_list("status", flat=True)) == {"QUEUED"}
    assert entries(ids) == 0 and PaymentAttempt.objects.count() == 0
    outcome = executor.execute_chunk(messages[3], partitions=[partition])
    assert sorted(outcome.completed) == sorted(ids)
    assert entries(ids) == 4 and reconcile().ok


def test_the_task_passes_its_partition_to_the_executor(alice, monkeypatch):
    messages, partition = claimed(alice, 3, monkeypatch)
    outcome = tasks.execute_chunk([list(messages[0][0])], partitions=[partition])
    assert outcome == {"completed": 3, "failed": 0, "stale": 0, "busy": 0}


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_cancels_racing_a_collapsed_batch_are_one_or_the_other():
    """Each trial: a message for payment ``a`` whose batch would collapse ``b``
    in, while a client cancels ``b``. Either the cancel wins (it held the row
    lock first: SKIP LOCKED leaves ``b`` out; CANCELLED, hold released, no
    entry) or the batch does (COMPLETED, and the cancel is refused naming it)
    — never both, never neither, and the answer the client got is the truth."""
    trials = 30
    owner = UserFactory()
    source = AccountFactory(owner=owner, funded=100_000).pk
    target = AccountFactory().pk
    ids = bulk_schedule(
        sources=[source], targets=[target], count=2 * trials, amount=10, due_at=db_now()
    )
    with transaction.atomic():
        fences = {c.payment_id: c.fence for c in claim_batch(2 * trials, 0.0)}
    partition = Payment.objects.get(pk=ids[0]).partition
    answers, errors, outcomes = {}, [], {"CANCELLED": 0, "COMPLETED": 0}
    for a, b in zip(ids[::2], ids[1::2], strict=True):
        failed, answers[b] = race_cancel(
            lambda a=a: executor.execute_chunk([(a, fences[a])], partitions=[partition]), b, owner
        )
        errors += failed
        assert Payment.objects.get(pk=a).status == "COMPLETED"
        payment = Payment.objects.get(pk=b)
        hold = Hold.objects.get(pk=payment.hold_id)
        if payment.status == "CANCELLED":
            assert answers.get(b) == ("cancelled", "CANCELLED")
            assert (entries([b]), hold.status) == (0, "released")
        else:
            # the batch took b before the cancel locked it
            assert payment.status == "COMPLETED", payment.status
            assert answers.get(b) == ("refused", "COMPLETED")
            assert (entries([b]), hold.status) == (1, "captured")
        outcomes[payment.status] += 1
    assert errors == []
    assert Account.objects.get(pk=target).balance == 10 * (trials + outcomes["COMPLETED"])
    assert Account.objects.get(pk=source).held == 0
    assert reconcile().ok
    print(outcomes)


@pytest.mark.postgres
def test_the_collapse_reads_one_index_range_not_every_queued_payment(alice):
    """Among thousands QUEUED far in the future (another partition, or not yet
    due), the collapse's lock reads only the rows it may take: an index range on
    (partition, due_at) of QUEUED payments, not a scan of the QUEUED set."""
    far = db_now() + timedelta(days=1)
    source, target = alice.account.pk, alice.other_account.pk
    ids = bulk_schedule(sources=[source], targets=[target], count=2000, amount=1, due_at=far)
    Payment.objects.filter(pk__in=ids).update(  # as a first claim leaves them
        status="QUEUED", attempts=1, lease_expires_at=far + timedelta(minutes=1)
    )
    partition = Payment.objects.get(pk=ids[0]).partition
    Payment.objects.filter(pk__in=ids[:1000]).update(partition=(partition + 1) % 16)
    due = ids[1000:1003]
    Payment.objects.filter(pk__in=due).update(due_at=db_now() - timedelta(seconds=1))
    with transaction.atomic():
        plan = explain_call(
            lambda: locks.lock_due_queued([partition], now=db_now(), limit=200, exclude=[]),
            "payments_payment",
        )
    scan = index_scan(plan, "payments_queued_partition_due")
    assert scan is not None, plan
    assert "partition" in scan.get("Index Cond", "") and "due_at" in scan["Index Cond"]
    assert scan["Actual Rows"] == 3 and scan.get("Rows Removed by Filter", 0) == 0


def retries(error):
    labels = {"error_class": type(error).__name__}
    return REGISTRY.get_sample_value("payments_chunk_retries_total", labels) or 0.0


def poison(monkeypatch, pid, error):
    """Make every batch holding payment ``pid`` die of ``error`` (a payment whose
    data breaks a statement); returns the list of the batches it broke."""
    transfer = executor.LedgerBatch.transfer
    broken = []

    def breaks(batch, **kwargs):
        if kwargs["reference"] == f"payment:{pid}":
            broken.append(1)
            raise error
        return transfer(batch, **kwargs)

    monkeypatch.setattr(executor.LedgerBatch, "transfer", breaks)
    monkeypatch.setattr(tasks, "backoff_seconds", lambda retries: 0)
    return broken


@pytest.mark.parametrize(
    "error",
    [DataError("integer out of range"), ValueError("a bug one payment's data reaches")],
    ids=["database", "code"],
)
def test_a_poison_payment_breaks_one_collapsed_batch_not_every_batch_of_its_partition(
    alice, monkeypatch, settings, error, caplog
):
    """The poison is the oldest due, so every collapse takes it first. The batch
    it breaks is retried with its own items alone, which complete; what it
    collapsed (the poison and three good ones: which one broke it is not
    known) stays out of this process's later collapses, so the next messages'
    batches run at once and each runs its own — without this, every message
    of the partition failed its first batch until the reaper took the poison
    a lease later (DESIGN §8: one client's payment must not slow others)."""
    settings.PAYMENT_CHUNK_RETRIES = 2
    messages, partition = claimed(alice, 5, monkeypatch)
    ids = [m[0][0] for m in messages]
    bad = ids[1]
    Payment.objects.filter(pk=bad).update(due_at=db_now() - timedelta(seconds=5))
    broken = poison(monkeypatch, bad, error)
    retried_before = retries(error)

    first = tasks.execute_chunk.apply(args=[messages[0]], kwargs={"partitions": [partition]})
    assert first.result == {"completed": 1, "failed": 0, "stale": 0, "busy": 0}  # its own, alone
    assert len(broken) == 1
    assert sorted(executor.quarantine.ids()) == sorted(ids[1:])
    assert (  # what the operator reads
        f"a batch that collapsed 4 payments failed ({type(error).__name__}); they run only "
        "in their own messages until their lease ends"
    ) in caplog.messages

    for message in messages[2:]:
        later = tasks.execute_chunk.apply(args=[message], kwargs={"partitions": [partition]})
        assert later.result == {"completed": 1, "failed": 0, "stale": 0, "busy": 0}
    assert len(broken) == 1  # the poison was not taken in again
    assert set(Payment.objects.exclude(pk=bad).values_list("status", flat=True)) == {"COMPLETED"}
    assert retries(error) - retried_before == 1  # the first batch's, and no other

    own = tasks.execute_chunk.apply(args=[messages[1]], kwargs={"partitions": [partition]})
    assert own.result == {"gave_up": bad}  # its own message: left to the reaper
    payment = Payment.objects.get(pk=bad)
    assert (payment.status, entries([bad])) == ("QUEUED", 0)
    assert entries(ids) == 4 and reconcile().ok


def test_a_batch_lost_to_the_connection_keeps_nothing_out_of_the_next_collapse(alice, monkeypatch):
    """A lost connection (or a deadlock, a serialization failure) is no payment's
    fault: after a database blip the next batch collapses the whole backlog again,
    which is what lets the partition catch up."""
    messages, partition = claimed(alice, 4, monkeypatch)
    ids = [m[0][0] for m in messages]
    poison(monkeypatch, ids[2], OperationalError("server closed the connection unexpectedly"))
    with pytest.raises(OperationalError):
        executor.execute_chunk(messages[0], partitions=[partition])
    assert executor.quarantine.ids() == []
    monkeypatch.undo()
    outcome = executor.execute_chunk(messages[3], partitions=[partition])
    assert sorted(outcome.completed) == sorted(ids)


def test_a_failover_to_a_read_only_standby_keeps_nothing_out_either(alice, monkeypatch):
    """Writes refused by a read-only server come as an ``InternalError`` (SQLSTATE
    25006), not a connection error: still no payment's fault."""

    class ReadOnly(Exception):
        sqlstate = "25006"

    refused = InternalError("cannot execute UPDATE in a read-only transaction")
    refused.__cause__ = ReadOnly()
    messages, partition = claimed(alice, 3, monkeypatch)
    poison(monkeypatch, messages[1][0][0], refused)
    with pytest.raises(InternalError):
        executor.execute_chunk(messages[0], partitions=[partition])
    assert executor.quarantine.ids() == []


def test_the_quarantine_lets_a_payment_go_when_its_lease_would_have_ended(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(executor.time, "monotonic", lambda: clock[0])
    quarantine = executor.Quarantine(limit=3)
    quarantine.add([("a", 1), ("b", 2)], seconds=60)
    clock[0] += 30
    quarantine.add([("c", 1), ("a", 3)], seconds=60)  # a again: its later expiry counts
    assert quarantine.ids() == ["b", "c", "a"]
    assert quarantine.collapsible([1, 2]) == ([1, 2], ["c", "b"])  # a moved to partition 3
    clock[0] += 30
    assert quarantine.ids() == ["c", "a"]  # b's lease is over
    assert quarantine.collapsible([2]) == ([2], [])
    quarantine.add([("d", 2), ("e", 2)], seconds=60)
    assert quarantine.ids() == ["a", "d", "e"]  # capped at 3: the oldest, c, dropped
    assert quarantine.collapsible([1, 2, 3]) == ([1, 2, 3], ["d", "e", "a"])
    quarantine.discard(["e", "zz"])  # e completed; zz was never there
    assert quarantine.ids() == ["a", "d"]
    clock[0] += 60
    assert quarantine.ids() == [] and quarantine.collapsible([1, 2, 3]) == ([1, 2, 3], [])


def test_a_collapse_leaves_out_only_its_own_partitions_suspects_and_a_bounded_number():
    """What every collapse sends to the database stays small however many
    suspects a storm of failed batches leaves (DESIGN §8): those of the
    chunk's partitions only, at most ``exclude_max``: past it the partitions
    with the most suspects are left out of the collapse until the rest fit."""
    quarantine = executor.Quarantine(exclude_max=3)
    quarantine.add([(f"p0-{n}", 0) for n in range(3)], seconds=60)
    quarantine.add([(f"p1-{n}", 1) for n in range(4)], seconds=60)
    assert quarantine.collapsible([0]) == ([0], ["p0-0", "p0-1", "p0-2"])  # at the bound
    assert quarantine.collapsible([1]) == ([], [])
    assert quarantine.collapsible([1, 0]) == ([0], ["p0-0", "p0-1", "p0-2"])
    assert quarantine.collapsible([2, 5]) == ([2, 5], [])


def test_a_collapse_leaves_out_up_to_a_thousand_suspects_of_its_partitions():
    """The bound the README and the metric's help name."""
    quarantine = executor.Quarantine()
    quarantine.add([(f"s{n}", 4) for n in range(1_000)], seconds=60)
    assert len(quarantine.collapsible([4])[1]) == 1_000
    quarantine.add([("one-more", 4)], seconds=60)
    assert quarantine.collapsible([4]) == ([], [])


def skipped():
    return REGISTRY.get_sample_value("payments_collapse_skipped_total") or 0.0


def suspects(partition, tag, n=3):
    """``n`` made-up payment ids quarantined under ``partition``."""
    executor.quarantine.add(
        [(f"00000000-0000-0000-0000-0000000000{tag}{k}", partition) for k in range(n)], 60
    )


def across_two_partitions(client, monkeypatch):
    """Three claimed payments, one message each; the third moved to the next
    partition: (messages, ids, partition, other)."""
    messages, partition = claimed(client, 3, monkeypatch)
    ids = [m[0][0] for m in messages]
    other = (partition + 1) % 16
    Payment.objects.filter(pk=ids[2]).update(partition=other)
    return messages, ids, partition, other


def test_a_batch_whose_partitions_hold_too_many_suspects_runs_only_its_own(
    alice, monkeypatch, django_capture_on_commit_callbacks
):
    messages, partition = claimed(alice, 3, monkeypatch)
    ids = [m[0][0] for m in messages]
    monkeypatch.setattr(executor.quarantine, "exclude_max", 2)
    suspects(partition, 0)
    before = skipped()
    with django_capture_on_commit_callbacks(execute=True):  # after-commit work too
        outcome = executor.execute_chunk(messages[0], partitions=[partition])
    assert outcome.completed == [ids[0]] and outcome.collapsed == []
    assert skipped() - before == 1
    assert Payment.objects.filter(pk__in=ids[1:], status="QUEUED").count() == 2
    # the others' messages run them; suspects of another partition stop nothing
    executor.quarantine.clear()
    other = (partition + 1) % 16
    suspects(other, 1)
    sent = []
    lock = locks.lock_due_queued

    def spy(partitions, *, now, limit, exclude=()):
        sent.append(list(exclude))
        return lock(partitions, now=now, limit=limit, exclude=exclude)

    monkeypatch.setattr(locks, "lock_due_queued", spy)
    outcome = executor.execute_chunk(messages[1], partitions=[partition])
    assert sorted(outcome.completed) == sorted(ids[1:]) and outcome.collapsed == [ids[2]]
    assert sent == [[ids[1]]]  # the chunk's own item, no other partition's suspect
    assert skipped() - before == 1
    assert entries(ids) == 3 and reconcile().ok


def test_a_partition_over_the_bound_is_left_out_the_others_still_collapse(
    alice, monkeypatch, django_capture_on_commit_callbacks
):
    messages, ids, partition, other = across_two_partitions(alice, monkeypatch)
    monkeypatch.setattr(executor.quarantine, "exclude_max", 2)
    suspects(partition, 2)
    before = skipped()
    with django_capture_on_commit_callbacks(execute=True):  # after-commit work too
        outcome = executor.execute_chunk(messages[0], partitions=[partition, other])
    assert sorted(outcome.completed) == sorted([ids[0], ids[2]]) and outcome.collapsed == [ids[2]]
    assert skipped() - before == 1  # one partition left out, counted once committed
    assert Payment.objects.get(pk=ids[1]).status == "QUEUED"


def test_a_failed_batch_quarantines_each_payment_under_its_own_partition(
    alice, monkeypatch, django_capture_on_commit_callbacks
):
    messages, ids, partition, other = across_two_partitions(alice, monkeypatch)
    poison(monkeypatch, ids[1], DataError("integer out of range"))
    with pytest.raises(DataError):
        executor.execute_chunk(messages[0], partitions=[partition, other])
    assert executor.quarantine.collapsible([partition]) == ([partition], [ids[1]])
    assert executor.quarantine.collapsible([other]) == ([other], [ids[2]])
    monkeypatch.undo()
    with django_capture_on_commit_callbacks(execute=True):  # after-commit work too
        own = executor.execute_chunk(messages[2])
    assert own.completed == [ids[2]]
    assert executor.quarantine.ids() == [ids[1]]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_account_locked_elsewhere_stalls_one_batch_briefly_not_every_batch_of_its_partition(
    settings, monkeypatch
):
    """DESIGN §8: one client's account locked by another session (an open staff or
    psql transaction, a stuck process) for as long as it likes. A batch that
    collapsed that client's payment waited for the lock — up to the batch's 30 s —
    with the other clients' payments in it, and so did every later batch of the
    partition that collapsed it again. Now no row lock is waited for past
    PAYMENT_LOCK_TIMEOUT_SECONDS: that batch is retried with its own payments alone,
    and what it collapsed stays out of this worker's later collapses, so the next
    messages of the partition run at once; the locked client's payment runs once
    the lock goes."""
    settings.PAYMENT_LOCK_TIMEOUT_SECONDS = 0.3
    settings.PAYMENT_CHUNK_RETRIES = 2
    monkeypatch.setattr(executor, "quarantine", executor.Quarantine())
    locked = AccountFactory(owner=UserFactory(), funded=1_000)
    partition = partition_for(locked.pk)
    others = []
    while len(others) < 3:
        account = AccountFactory(owner=UserFactory(), funded=1_000)
        if partition_for(account.pk) == partition:
            others.append(account)
    lease = db_now() + timedelta(seconds=60)
    stuck = queued_payment(
        locked, AccountFactory(), lease_expires_at=lease, due_at=db_now() - timedelta(seconds=2)
    )
    first, second = (
        queued_payment(a, AccountFactory(), lease_expires_at=lease) for a in others[:2]
    )
    timed_out = OperationalError("canceling statement due to lock timeout")
    retried_before = retries(timed_out)

    def message(payment):
        return tasks.execute_chunk.apply(
            args=[[(str(payment.pk), payment.fence)]], kwargs={"partitions": [partition]}
        ).result

    release = in_another_transaction(
        lambda: Account.objects.select_for_update().filter(pk=locked.pk).first(),
        release_after=20,
    )
    try:
        assert message(first) == {"completed": 1, "failed": 0, "stale": 0, "busy": 0}
        assert retries(timed_out) == retried_before + 1  # its batch gave up once
        # it collapsed the stuck payment and the second: which one it waited for is
        # not known, both stay out of this worker's collapses
        assert sorted(executor.quarantine.ids()) == sorted([str(stuck.pk), str(second.pk)])
        third = queued_payment(others[2], AccountFactory(), lease_expires_at=lease)
        for payment in (third, second):  # the next messages: no wait, no retry
            assert message(payment) == {"completed": 1, "failed": 0, "stale": 0, "busy": 0}
        assert retries(timed_out) == retried_before + 1
        lock = "SELECT 1 FROM ledger_account WHERE id = %s FOR UPDATE NOWAIT"
        assert in_other_connection(lock, [locked.pk]) == "LockNotAvailable"  # all the while
    finally:
        release()
    statuses = dict(Payment.objects.values_list("pk", "status"))
    assert list(statuses.values()).count("COMPLETED") == 3 and statuses[stuck.pk] == "QUEUED"
    # the lock gone, its own message runs it
    outcome = executor.execute_chunk([(str(stuck.pk), stuck.fence)], partitions=[partition])
    assert outcome.completed == [str(stuck.pk)]
    assert reconcile().ok
