import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from ledger import services as ledger
from ledger.exceptions import (
    AccountNotActive,
    DuplicateReference,
    EntryAlreadyReversed,
    HoldMismatch,
    HoldNotActive,
    InsufficientFunds,
    InvalidAmount,
    SameAccount,
    StaleAccounts,
    SystemAccountProtected,
)
from ledger.models import Account, HoldStatus, JournalEntry, Posting
from tests.concurrency import key_share
from tests.factories import AccountFactory, UserFactory

pytestmark = pytest.mark.django_db


def balances(*accounts):
    return [Account.objects.get(pk=a.pk).balance for a in accounts]


def test_deposit_debits_issuance_and_credits_account():
    account = AccountFactory()
    entry = ledger.deposit(account_id=account.pk, amount=500)
    issuance = ledger.issuance_account()
    assert balances(account, issuance) == [500, -500]
    assert sorted(entry.postings.values_list("amount", flat=True)) == [-500, 500]
    assert Posting.objects.get(entry=entry, account=account).balance_after == 500


def test_transfer_moves_money_and_records_balance_after():
    a, b = AccountFactory(funded=1_000), AccountFactory(funded=10)
    ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=300)
    assert balances(a, b) == [700, 310]
    after = dict(
        Posting.objects.filter(account__in=[a, b])
        .order_by("-pk")[:2]
        .values_list("account_id", "balance_after")
    )
    assert after == {a.pk: 700, b.pk: 310}


def test_insufficient_funds_writes_nothing():
    a, b = AccountFactory(funded=100), AccountFactory()
    entries = JournalEntry.objects.count()
    with pytest.raises(InsufficientFunds) as exc:
        ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=101)
    assert exc.value.code == "insufficient_funds"
    assert exc.value.details == {"account_id": a.pk, "available": 100, "required": 101}
    assert JournalEntry.objects.count() == entries
    assert balances(a, b) == [100, 0]


@pytest.mark.parametrize("amount", [0, -5, 1.5, True, "10"])
def test_invalid_amounts_rejected(amount):
    a, b = AccountFactory(funded=100), AccountFactory()
    with pytest.raises(InvalidAmount):
        ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=amount)


def test_same_account_rejected():
    a = AccountFactory(funded=100)
    with pytest.raises(SameAccount):
        ledger.transfer_post(from_account_id=a.pk, to_account_id=a.pk, amount=1)


def test_hold_reserves_available_funds():
    a, b = AccountFactory(funded=100), AccountFactory()
    hold = ledger.hold_place(account_id=a.pk, amount=80)
    a.refresh_from_db()
    assert (a.balance, a.held, a.available) == (100, 80, 20)
    with pytest.raises(InsufficientFunds):
        ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=21)
    with pytest.raises(InsufficientFunds):
        ledger.hold_place(account_id=a.pk, amount=21)
    ledger.hold_release(hold_id=hold.pk)
    a.refresh_from_db()
    assert (a.balance, a.held) == (100, 0)
    hold.refresh_from_db()
    assert hold.status == HoldStatus.RELEASED
    with pytest.raises(HoldNotActive):
        ledger.hold_release(hold_id=hold.pk)


def test_hold_capture_transfers_reserved_funds_once():
    a, b = AccountFactory(funded=100), AccountFactory()
    hold = ledger.hold_place(account_id=a.pk, amount=100)
    entry = ledger.hold_capture(hold_id=hold.pk, to_account_id=b.pk, reference="payment:1")
    a.refresh_from_db()
    hold.refresh_from_db()
    assert (a.balance, a.held) == (0, 0)
    assert balances(b) == [100]
    assert hold.status == HoldStatus.CAPTURED and hold.entry_id == entry.pk
    with pytest.raises(HoldNotActive):
        ledger.hold_capture(hold_id=hold.pk, to_account_id=b.pk, reference="payment:2")


def test_hold_capture_must_match_amount_and_account():
    a, b = AccountFactory(funded=100), AccountFactory(funded=100)
    hold = ledger.hold_place(account_id=a.pk, amount=50)
    with pytest.raises(HoldMismatch):
        ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=40, hold_id=hold.pk)
    with pytest.raises(HoldMismatch):
        ledger.transfer_post(from_account_id=b.pk, to_account_id=a.pk, amount=50, hold_id=hold.pk)


def test_duplicate_reference_rejected():
    a, b = AccountFactory(funded=100), AccountFactory()
    ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=1, reference="payment:x")
    with pytest.raises(DuplicateReference):
        ledger.transfer_post(
            from_account_id=a.pk, to_account_id=b.pk, amount=1, reference="payment:x"
        )
    assert balances(a, b) == [99, 1]


def test_frozen_account_cannot_pay_or_receive_but_can_be_adjusted():
    a, b = AccountFactory(funded=100), AccountFactory()
    ledger.account_set_status(account_id=b.pk, status="frozen")
    with pytest.raises(AccountNotActive):
        ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=1)
    staff = UserFactory(is_staff=True)
    entry = ledger.adjustment_post(
        account_id=b.pk, amount=7, description="goodwill", staff_user=staff
    )
    assert entry.created_by == staff
    assert balances(b) == [7]


def test_reversal_negates_entry_once():
    a, b = AccountFactory(funded=100), AccountFactory()
    entry = ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=30)
    reversal = ledger.entry_reverse(entry_id=entry.pk)
    assert reversal.reverses_id == entry.pk
    assert balances(a, b) == [100, 0]
    with pytest.raises(EntryAlreadyReversed):
        ledger.entry_reverse(entry_id=entry.pk)


def test_close_needs_zero_balance():
    a = AccountFactory(funded=1)
    with pytest.raises(ledger.LedgerError):
        ledger.account_set_status(account_id=a.pk, status="closed")


@pytest.mark.parametrize("status", ["frozen", "closed", "active"])
def test_system_accounts_status_cannot_be_changed(status):
    """A frozen issuance account would refuse every deposit and adjustment."""
    issuance = ledger.issuance_account()
    with pytest.raises(SystemAccountProtected) as exc:
        ledger.account_set_status(account_id=issuance.pk, status=status)
    assert exc.value.code == "system_account_protected"
    issuance.refresh_from_db()
    assert (issuance.status, issuance.version) == ("active", 0)
    ledger.deposit(account_id=AccountFactory().pk, amount=5)  # still works


# --- locking_accounts_last: the run-again shared by executor and schedule ----


class _Work:
    """A unit of work that raises StaleAccounts on its first ``stale`` calls."""

    def __init__(self, stale: int = 0):
        self.calls: list[object] = []
        self.stale = stale

    def __call__(self, lock_accounts_last):
        self.calls.append(lock_accounts_last)
        if len(self.calls) <= self.stale:
            raise StaleAccounts(f"call {len(self.calls)}")
        return f"result of call {len(self.calls)}"


def test_work_that_reads_nothing_changed_runs_once_locking_last():
    work, told = _Work(), []
    assert ledger.locking_accounts_last(work, on_stale=told.append) == "result of call 1"
    assert work.calls == [True]
    assert told == []


def test_stale_work_is_reported_then_run_again_locking_first():
    work, told = _Work(stale=1), []
    assert ledger.locking_accounts_last(work, on_stale=told.append) == "result of call 2"
    assert work.calls == [True, False]  # exactly the flag, not merely falsy
    assert [str(exc) for exc in told] == ["call 1"]


def test_without_a_listener_stale_work_still_runs_again():
    work = _Work(stale=1)
    assert ledger.locking_accounts_last(work) == "result of call 2"
    assert work.calls == [True, False]


def test_the_run_again_is_not_retried_a_second_time():
    work = _Work(stale=2)
    with pytest.raises(StaleAccounts, match="call 2"):
        ledger.locking_accounts_last(work)
    assert work.calls == [True, False]


# --- what a batch reads, and the locks it takes (PostgreSQL's reads: ``_read_batch``) ---


@pytest.mark.parametrize("lock_last", [False, True], ids=["locked-first", "read-unlocked"])
def test_a_batch_reads_whole_accounts_it_locks_and_the_batch_fields_of_those_it_does_not(
    lock_last,
):
    """Locked first, an account is the whole row (a caller may read any column
    without another query); read unlocked, only ``BATCH_ACCOUNT_FIELDS`` — what
    ``flush_balances`` checks again under the lock — as ``read_accounts``."""
    account = AccountFactory(funded=10)
    with transaction.atomic():
        batch = ledger.LedgerBatch(account_ids=[account.pk], lock_accounts_last=lock_last)
        read = batch.accounts[account.pk]
    every = {f.attname for f in Account._meta.concrete_fields}
    expected = every - set(ledger.BATCH_ACCOUNT_FIELDS) if lock_last else set()
    assert read.get_deferred_fields() == expected
    assert (read.balance, read.owner_id) == (10, account.owner_id)


@pytest.mark.postgres
def test_accounts_and_the_database_clock_are_read_in_one_statement():
    """``read_accounts_with_clock`` (the schedule request's read): the accounts as
    ``read_accounts`` gives them, and ``clock_timestamp()`` as they are read."""
    first, second = AccountFactory(funded=10), AccountFactory()
    missing = second.pk + 1000

    def clock():
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            return cursor.fetchone()[0]

    with transaction.atomic():
        before = clock()
        with CaptureQueriesContext(connection) as queries:
            now, accounts = ledger.read_accounts_with_clock(
                [second.pk, first.pk, first.pk, missing]
            )
        after = clock()
    assert len(queries) == 1
    assert before <= now <= after  # the statement's own clock, not the transaction's
    assert accounts.keys() == {first.pk, second.pk}
    assert ledger.read_accounts([first.pk, second.pk]).keys() == accounts.keys()
    every = {f.attname for f in Account._meta.concrete_fields}
    for account in accounts.values():
        assert account.get_deferred_fields() == every - set(ledger.BATCH_ACCOUNT_FIELDS)
    assert (accounts[first.pk].balance, accounts[first.pk].owner_id) == (10, first.owner_id)
    assert ledger.read_accounts_with_clock([missing]) == (None, {})
    alone, found = ledger.read_accounts_with_clock([second.pk])  # one row: its own clock
    assert alone > now and found.keys() == {second.pk}


def test_a_batch_of_no_account_still_reads_its_holds_and_references():
    source, target = AccountFactory(funded=50), AccountFactory()
    hold = ledger.hold_place(account_id=source.pk, amount=20, reference="hold-ref")
    ledger.transfer_post(
        from_account_id=source.pk, to_account_id=target.pk, amount=1, reference="taken"
    )
    with transaction.atomic():
        batch = ledger.LedgerBatch(account_ids=[], hold_ids=[hold.pk], references=["taken", "free"])
        assert batch.accounts == {}
        assert list(batch.holds) == [hold.pk]
        with pytest.raises(DuplicateReference):
            batch._check_reference("taken")
        batch._check_reference("free")  # not posted: no error


@pytest.mark.postgres
def test_a_batchs_reads_go_out_in_one_pipeline(monkeypatch):
    """Accounts, holds and references: one round trip (``ledger.db.pipelined``),
    not one each; a batch with one read sends it alone."""
    entered = []
    real = ledger.pipelined

    def spy():
        entered.append(True)
        return real()

    monkeypatch.setattr(ledger, "pipelined", spy)
    account = AccountFactory(funded=10)
    with transaction.atomic():
        ledger.LedgerBatch(account_ids=[account.pk], references=["r"])
    assert entered == [True]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_lock_accounts_leaves_rows_that_reference_the_account_free():
    """``FOR NO KEY UPDATE``: while a batch holds an account, another transaction
    may still insert rows that refer to it (a hold, a posting: their foreign-key
    checks take ``FOR KEY SHARE``) without waiting for the batch to commit."""
    account = AccountFactory()
    with transaction.atomic():
        assert list(ledger.lock_accounts([account.pk])) == [account.pk]
        assert key_share("ledger_account", account.pk) is None
