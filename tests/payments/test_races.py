"""Cancel racing execution, with real threads on PostgreSQL."""

import uuid

import pytest
from django.db import DataError, transaction

from ledger.models import Account, Hold, HoldStatus, JournalEntry
from ledger.reconciliation import reconcile
from payments import services
from payments.clock import db_now
from payments.engine import executor
from payments.models import Payment
from tests.concurrency import run_in_threads
from tests.factories import AccountFactory, UserFactory
from tests.payments.helpers import bulk_schedule, claim_batch, race_cancel

TRIALS = 60


@pytest.mark.django_db(transaction=True)
def test_cancel_racing_execution_is_one_or_the_other():
    owner = UserFactory()
    source = AccountFactory(owner=owner, funded=100_000).pk
    target = AccountFactory().pk
    ids = bulk_schedule(
        sources=[source], targets=[target], count=TRIALS, amount=10, due_at=db_now()
    )
    with transaction.atomic():
        claims = {c.payment_id: c.fence for c in claim_batch(TRIALS)}
    outcomes = {"cancelled": 0, "completed": 0}
    answers: dict[str, tuple[str, str]] = {}  # what cancel told its caller
    errors = []

    for pid in ids:
        failed, answers[pid] = race_cancel(
            lambda pid=pid: executor.execute_chunk([(pid, claims[pid])]), pid, owner
        )
        errors += failed

        payment = Payment.objects.get(pk=pid)
        entries = JournalEntry.objects.filter(reference=f"payment:{pid}").count()
        hold = Hold.objects.get(pk=payment.hold_id)
        # The answer is definite and true: a cancel that said yes won, one that
        # said no names the state that won instead.
        if payment.status == "CANCELLED":
            assert answers.get(pid) == ("cancelled", "CANCELLED"), answers.get(pid)
            assert (entries, hold.status, payment.journal_entry_id) == (0, "released", None)
            outcomes["cancelled"] += 1
        else:
            assert answers.get(pid) == ("refused", "COMPLETED"), answers.get(pid)
            assert payment.status == "COMPLETED"
            assert (entries, hold.status) == (1, "captured")
            outcomes["completed"] += 1

    assert errors == []
    assert sum(outcomes.values()) == TRIALS
    done = outcomes["completed"]
    assert Account.objects.get(pk=target).balance == 10 * done
    assert Account.objects.get(pk=source).held == 0
    assert reconcile().ok
    print(outcomes)


@pytest.mark.django_db
def test_transient_errors_retry_then_split_to_isolate_a_poison_payment(monkeypatch, settings):
    from django.db import OperationalError

    from payments import tasks

    settings.PAYMENT_CHUNK_RETRIES = 2
    good1, poison, good2, good3 = (str(uuid.uuid4()) for _ in range(4))
    items = [[good1, 1], [poison, 1], [good2, 1], [good3, 1]]
    calls = []

    def flaky(chunk, **kwargs):
        calls.append([pid for pid, _ in chunk])
        if any(pid == poison for pid, _ in chunk):
            raise OperationalError("server closed the connection unexpectedly")
        return executor.ChunkResult(completed=[pid for pid, _ in chunk])

    published = []
    monkeypatch.setattr(executor, "execute_chunk", flaky)
    monkeypatch.setattr(tasks, "backoff_seconds", lambda retries: 0)
    monkeypatch.setattr(
        tasks.execute_chunk, "apply_async", lambda args, queue, **kw: published.append(args[0])
    )
    result = tasks.execute_chunk.apply(args=[items])  # eager: retries run inline
    assert result.result == {"split": 4}
    assert len(calls) == 3  # first try + 2 retries
    assert published == [items[:2], items[2:]]
    # the half with the poison keeps splitting down to the poison alone
    published.clear()
    calls.clear()
    assert tasks.execute_chunk.apply(args=[items[:2]]).result == {"split": 2}
    assert published == [[items[0]], [items[1]]]
    assert tasks.execute_chunk.apply(args=[[items[1]]]).result == {"gave_up": poison}
    assert tasks.execute_chunk.apply(args=[items[2:]]).result["completed"] == 2


@pytest.mark.django_db
@pytest.mark.parametrize(
    "error",
    [KeyError("a bug one payment's data reaches"), DataError("integer out of range")],
    ids=["code", "data"],
)
@pytest.mark.parametrize("partitions", [None, [3]], ids=["alone", "collapsed-nothing"])
def test_any_other_error_splits_at_once_to_isolate_the_payment_it_comes_from(
    monkeypatch, error, partitions
):
    """An error that is not the database's passing trouble (the code, or a
    payment's data) will not go away on a retry: the chunk splits at once
    rather than wait a lease for the reaper with every good payment in it —
    also when its batch could have collapsed but took nothing in (only a batch
    that did is retried with its own items alone first)."""
    from payments import tasks

    good, poison = str(uuid.uuid4()), str(uuid.uuid4())
    items = [[good, 1], [poison, 1]]
    calls, published = [], []

    def broken(chunk, **kwargs):
        calls.append([pid for pid, _ in chunk])
        if any(pid == poison for pid, _ in chunk):
            raise error
        return executor.ChunkResult(completed=[pid for pid, _ in chunk])

    monkeypatch.setattr(executor, "execute_chunk", broken)
    monkeypatch.setattr(
        tasks.execute_chunk, "apply_async", lambda args, queue, **kw: published.append(args[0])
    )
    kwargs = {"partitions": partitions} if partitions else {}
    assert tasks.execute_chunk.apply(args=[items], kwargs=kwargs).result == {"split": 2}
    assert calls == [[good, poison]] and published == [[items[0]], [items[1]]]
    assert tasks.execute_chunk.apply(args=[[items[0]]]).result["completed"] == 1
    assert tasks.execute_chunk.apply(args=[[items[1]]]).result == {"gave_up": poison}


@pytest.mark.django_db(transaction=True)
def test_opposite_schedules_between_two_accounts_do_not_deadlock():
    """Scheduling A→B and B→A at once: each locks only its source account.

    The payment row's foreign keys are checked at COMMIT with ``FOR KEY
    SHARE`` on both accounts; with ``FOR UPDATE`` account locks the two
    COMMITs waited on each other and PostgreSQL killed one (a 500 seen in
    the API benchmark). ``FOR NO KEY UPDATE`` does not conflict with it.
    """
    owner = UserFactory()
    a = AccountFactory(owner=owner, funded=1_000_000).pk
    b = AccountFactory(owner=owner, funded=1_000_000).pk
    rounds = 40

    def schedule(index):
        source, target = (a, b) if index % 2 else (b, a)
        for _ in range(rounds):
            services.payment_schedule(
                client=owner,
                from_account_id=source,
                to_account_id=target,
                amount=1,
                delay_seconds=60,
            )

    errors = run_in_threads(schedule, 4)
    assert errors == []
    assert Payment.objects.count() == 4 * rounds
    assert Hold.objects.filter(status=HoldStatus.ACTIVE).count() == 4 * rounds
    assert reconcile().ok
