"""Accounts are locked last: by the executor (DESIGN §4.1, ``payments.engine.executor``
6) and by a schedule request (``payments.services.payments.payment_schedule``).

A batch reads its accounts, does everything else, and only then locks the
accounts it changes, for the postings, the balance UPDATE and COMMIT; a
schedule request reads its source, writes hold, payment and event, and only
then locks the source for the hold's UPDATE. These tests pin what that buys
and what it must not cost: a schedule request on the batch's source account
does not wait for the batch, money others moved on those accounts meanwhile is
kept, and an account frozen (or funds held) meanwhile is never relied on —
the work runs again with the account locked first and gets the answer it
would have got.
"""

import threading

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from prometheus_client import REGISTRY

from ledger import services as ledger
from ledger.models import Account, Hold, JournalEntry, Posting
from ledger.reconciliation import reconcile
from ledger.services import LedgerBatch
from payments.clock import db_now
from payments.engine import executor
from payments.models import Payment, PaymentEvent
from tests.concurrency import commit_elsewhere
from tests.factories import AccountFactory, UserFactory
from tests.payments.conftest import Client
from tests.payments.helpers import bulk_schedule, claim_batch

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

STALE = "payments_batch_stale_accounts_total"


def due_chunk(source, target, count, amount=10):
    """``count`` payments from source to target, due now and claimed: chunk items."""
    ids = bulk_schedule(
        sources=[source], targets=[target], count=count, amount=amount, due_at=db_now()
    )
    with transaction.atomic():
        fences = {c.payment_id: c.fence for c in claim_batch(count, 0.0)}
    return [(pid, fences[pid]) for pid in ids]


def before_the_account_locks(monkeypatch, work):
    """Run ``work()`` once, in another connection, when the executor's first batch
    has written everything but postings and balances (accounts not locked yet)."""
    real = LedgerBatch.flush_balances
    done = threading.Event()

    def flush_balances(self):
        if not done.is_set():
            done.set()
            commit_elsewhere(work)
        return real(self)

    monkeypatch.setattr(LedgerBatch, "flush_balances", flush_balances)
    return done


def stale_count():
    return REGISTRY.get_sample_value(STALE) or 0.0


def test_a_hold_on_the_source_does_not_wait_for_the_batch(monkeypatch):
    """While a batch of payments out of an account runs, the client schedules
    another out of it: the hold is placed at once (no lock wait), and the
    batch's capture lands on top of it — nothing lost, nothing held twice."""
    owner = UserFactory()
    source = AccountFactory(owner=owner, funded=10_000).pk
    target = AccountFactory().pk
    items = due_chunk(source, target, 5)
    placed = []
    ran = before_the_account_locks(
        monkeypatch,
        lambda: placed.append(ledger.hold_place(account_id=source, amount=70).pk),
    )
    result = executor.execute_chunk(items)
    assert ran.is_set() and len(result.completed) == 5
    account = Account.objects.get(pk=source)
    assert (account.balance, account.held) == (10_000 - 50, 70)
    assert Hold.objects.get(pk=placed[0]).status == "active"
    assert Account.objects.get(pk=target).balance == 50
    assert reconcile().ok


def test_money_moved_meanwhile_on_both_accounts_is_kept(monkeypatch):
    """Others pay into the target and out of the source while the batch runs;
    the batch's postings chain on from what they committed."""
    source = AccountFactory(funded=1_000).pk
    target = AccountFactory().pk
    other = AccountFactory(funded=1_000).pk
    items = due_chunk(source, target, 3, amount=100)

    def meanwhile():
        ledger.transfer_post(from_account_id=other, to_account_id=target, amount=11)
        ledger.transfer_post(from_account_id=source, to_account_id=other, amount=22)

    before_the_account_locks(monkeypatch, meanwhile)
    result = executor.execute_chunk(items)
    assert len(result.completed) == 3
    assert Account.objects.get(pk=source).balance == 1_000 - 300 - 22
    assert Account.objects.get(pk=target).balance == 300 + 11
    last = Posting.objects.filter(account_id=target).order_by("-pk").first()
    assert last.balance_after == 311
    assert reconcile().ok


def account_statements(queries):
    """What each statement on ledger_account was: a read, a LOCK, an UPDATE or
    flush_balances' CHECK+UPDATE (check and write, after its LOCK: the CTE, or
    for one account its UPDATE by key)."""
    kinds = []
    for sql in (q["sql"] for q in queries.captured_queries):
        if sql.lstrip().startswith(("WITH", "UPDATE ledger_account a")) and (
            "UPDATE ledger_account" in sql
        ):
            kinds.append("CHECK+UPDATE")
        elif sql.startswith('SELECT "ledger_account"') or "FROM ledger_account" in sql:
            kinds.append("LOCK" if "FOR NO KEY UPDATE" in sql else "SELECT")
        elif sql.startswith('UPDATE "ledger_account"'):
            kinds.append("UPDATE")
    return kinds


@pytest.mark.parametrize("frozen", ["source", "target"])
def test_an_account_frozen_meanwhile_fails_its_payments_as_if_locked_first(
    monkeypatch, caplog, frozen
):
    """Frozen after the batch read it, before it locked it: the first run is
    rolled back (``StaleAccounts``, counted and logged), the second locks first
    and finds the account frozen — the payment FAILED, its hold released, no
    entry; payments between other accounts in the same chunk still complete."""
    source, target = AccountFactory(funded=1_000).pk, AccountFactory().pk
    bystander_source, bystander_target = AccountFactory(funded=1_000).pk, AccountFactory().pk
    items = due_chunk(source, target, 2) + due_chunk(bystander_source, bystander_target, 1)
    victim = source if frozen == "source" else target
    stale = stale_count()
    before_the_account_locks(
        monkeypatch, lambda: ledger.account_set_status(account_id=victim, status="frozen")
    )
    with (
        caplog.at_level("INFO", logger="payments.engine.executor"),
        CaptureQueriesContext(connection) as queries,
    ):
        result = executor.execute_chunk(items)
    assert stale_count() == stale + 1
    assert [r.getMessage() for r in caplog.records if "again" in r.getMessage()] == [
        "batch read a changed account; running it again locked first: "
        f"Account {victim} changed status while the batch ran."
    ]
    # read, then lock last (stale: nothing written); the run again: lock first,
    # then the UPDATE
    assert account_statements(queries) == ["SELECT", "LOCK", "CHECK+UPDATE", "LOCK", "UPDATE"]
    assert sorted(result.failed) == sorted(pid for pid, _ in items[:2])
    assert result.failure_codes == ["account_not_active", "account_not_active"]
    assert result.completed == [items[2][0]]
    for pid, _ in items[:2]:
        payment = Payment.objects.get(pk=pid)
        assert (payment.status, payment.error_code) == ("FAILED", "account_not_active")
        assert Hold.objects.get(pk=payment.hold_id).status == "released"
        assert not JournalEntry.objects.filter(reference=f"payment:{pid}").exists()
    assert Payment.objects.get(pk=items[2][0]).status == "COMPLETED"
    assert (Account.objects.get(pk=source).balance, Account.objects.get(pk=source).held) == (
        1_000,
        0,
    )
    assert Account.objects.get(pk=bystander_target).balance == 10
    assert reconcile().ok


def test_a_failing_payment_does_not_lock_its_accounts_early():
    """A payment the batch fails (destination frozen) releases its hold within the
    batch: the accounts are still read once and locked once, last."""
    source, target = AccountFactory(funded=1_000).pk, AccountFactory().pk
    items = due_chunk(source, target, 2)
    ledger.account_set_status(account_id=target, status="frozen")
    with CaptureQueriesContext(connection) as queries:
        result = executor.execute_chunk(items)
    assert result.failure_codes == ["account_not_active", "account_not_active"]
    assert account_statements(queries) == ["SELECT", "LOCK", "CHECK+UPDATE"]
    assert Account.objects.get(pk=source).held == 0
    assert reconcile().ok


def test_the_run_again_still_collapses_its_partitions(monkeypatch):
    """The second run is the same batch: the chunk's partitions' other due QUEUED
    payments are still taken in."""
    source, target = AccountFactory(funded=1_000).pk, AccountFactory().pk
    items = due_chunk(source, target, 3)
    partition = Payment.objects.get(pk=items[0][0]).partition
    witness = AccountFactory().pk
    before_the_account_locks(
        monkeypatch, lambda: ledger.account_set_status(account_id=witness, status="frozen")
    )
    # a change the batch relies on: the witness is a destination of the collapsed ones
    Payment.objects.filter(pk__in=[pid for pid, _ in items[1:]]).update(to_account_id=witness)
    result = executor.execute_chunk(items[:1], partitions=[partition])
    assert sorted(result.collapsed) == sorted(pid for pid, _ in items[1:])
    assert result.completed == [items[0][0]]
    assert result.failure_codes == ["account_not_active", "account_not_active"]


# --- a schedule request ---------------------------------------------------------------


def test_a_schedule_locks_its_source_after_writing_hold_payment_and_event():
    client = Client("carol", balance=1_000)
    with CaptureQueriesContext(connection) as queries:
        response = client.schedule(amount=100)
    assert response.status_code == 201, response.json()
    sent = [q["sql"] for q in queries.captured_queries]
    lock = next(i for i, sql in enumerate(sent) if "FOR NO KEY UPDATE" in sql)
    # lock the source, then check and write it (ledger.services: one round trip,
    # two statements), then COMMIT
    assert "FROM ledger_account" in sent[lock] and "UPDATE ledger_account" not in sent[lock]
    assert "UPDATE ledger_account" in sent[lock + 1]
    written = [sql.split('"')[1] for sql in sent[:lock] if sql.startswith("INSERT")]
    assert written == ["ledger_hold", "payments_payment", "payments_paymentevent"]
    # the event is not read back (nothing refers to it): no RETURNING to wait for
    (event_insert,) = [sql for sql in sent if sql.startswith('INSERT INTO "payments_paymentevent"')]
    assert "RETURNING" not in event_insert
    assert sent[lock + 2 :] == ["COMMIT"]
    # before it, one read of source, destination and database clock together
    reads = [sql for sql in sent[:lock] if "ledger_account" in sql or "clock_timestamp" in sql]
    assert len(reads) == 1 and "clock_timestamp()" in reads[0], reads
    account = Account.objects.get(pk=client.account.pk)
    assert (account.balance, account.held) == (1_000, 100)


def test_funds_held_meanwhile_refuse_the_schedule_as_a_locked_read_would(monkeypatch):
    """Read with 1,000 available; before the source is locked another payment holds
    950 of it: the request runs again locking first and is refused (insufficient
    funds) with nothing of its own written — no payment, no hold, no event."""
    client = Client("carol", balance=1_000)
    other = []
    before_the_account_locks(
        monkeypatch,
        lambda: other.append(ledger.hold_place(account_id=client.account.pk, amount=950)),
    )
    stale = stale_count()
    response = client.schedule(amount=100)
    assert response.status_code == 422, response.json()
    assert response.json()["error"]["code"] == "insufficient_funds"
    assert stale_count() == stale  # the executor's counter only
    assert not Payment.objects.exists() and not PaymentEvent.objects.exists()
    assert list(Hold.objects.values_list("pk", flat=True)) == [other[0].pk]
    account = Account.objects.get(pk=client.account.pk)
    assert (account.balance, account.held) == (1_000, 950)
    assert reconcile().ok


def test_funds_held_meanwhile_that_leave_enough_do_not_refuse(monkeypatch):
    client = Client("carol", balance=1_000)
    before_the_account_locks(
        monkeypatch, lambda: ledger.hold_place(account_id=client.account.pk, amount=900)
    )
    response = client.schedule(amount=100)
    assert response.status_code == 201, response.json()
    account = Account.objects.get(pk=client.account.pk)
    assert (account.balance, account.held) == (1_000, 1_000)


def test_a_source_frozen_meanwhile_refuses_the_schedule(monkeypatch):
    client = Client("carol", balance=1_000)
    before_the_account_locks(
        monkeypatch,
        lambda: ledger.account_set_status(account_id=client.account.pk, status="frozen"),
    )
    response = client.schedule(amount=100)
    assert response.status_code == 422, response.json()
    assert response.json()["error"]["code"] == "account_not_active"
    assert not Payment.objects.exists() and not Hold.objects.exists()
