"""The ledger services' contract, in the detail callers and operators see.

The message and ``details`` of every ``LedgerError`` reach API error bodies
(``payments.api.errors``), admin messages and payment attempts, so they are
pinned here as exactly as balances, journal rows, holds and account versions.
"""

import threading
import time

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.utils import OperationalError
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger import services as ledger
from ledger.exceptions import (
    AccountNotActive,
    AccountNotFound,
    DuplicateReference,
    EntryAlreadyReversed,
    HoldMismatch,
    HoldNotActive,
    InsufficientFunds,
    InvalidAmount,
    LedgerError,
    SameAccount,
    StaleAccounts,
    SystemAccountProtected,
)
from ledger.models import Account, Hold, HoldStatus, JournalEntry, Posting
from ledger.reconciliation import reconcile
from ledger.services import LedgerBatch, Leg
from tests.concurrency import commit_elsewhere, key_share, run_in_threads, share
from tests.factories import AccountFactory, UserFactory

pytestmark = pytest.mark.django_db

MISSING = 987_654_321  # an id no row has


def fresh(account):
    return Account.objects.get(pk=account.pk)


def postings(entry):
    return list(
        Posting.objects.filter(entry=entry).order_by("pk").values_list("account_id", "amount")
    )


def error(exc_info, cls):
    """The exception, checked to be exactly ``cls`` (not a subclass or base)."""
    assert type(exc_info.value) is cls
    return exc_info.value


# --- errors: message and details ---------------------------------------------


def test_unknown_account_is_reported_with_its_id():
    a = AccountFactory(funded=10)
    with pytest.raises(AccountNotFound) as exc:
        ledger.transfer_post(from_account_id=a.pk, to_account_id=MISSING, amount=1)
    assert exc.value.message == f"Account {MISSING} does not exist."
    assert exc.value.details == {"account_id": MISSING}
    with pytest.raises(AccountNotFound) as exc:
        ledger.hold_place(account_id=MISSING, amount=1)
    assert exc.value.details == {"account_id": MISSING}
    assert fresh(a).balance == 10


@pytest.mark.parametrize("amount", [0, -5, 1.5, True, "10"])
@pytest.mark.parametrize("operation", ["transfer", "hold"])
def test_invalid_amount_message_names_the_amount(operation, amount):
    a, b = AccountFactory(funded=100), AccountFactory()
    with pytest.raises(InvalidAmount) as exc:
        if operation == "transfer":
            ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=amount)
        else:
            ledger.hold_place(account_id=a.pk, amount=amount)
    assert exc.value.message == "Amount must be a positive integer."
    assert exc.value.details == {"amount": amount}
    assert (fresh(a).balance, fresh(a).held, fresh(b).balance) == (100, 0, 0)


def test_smallest_amounts_are_accepted():
    a, b = AccountFactory(funded=2), AccountFactory()
    ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=1)
    hold = ledger.hold_place(account_id=a.pk, amount=1)
    assert hold.amount == 1
    assert (fresh(a).balance, fresh(a).held, fresh(b).balance) == (1, 1, 1)


def test_same_account_message():
    a = AccountFactory(funded=10)
    with pytest.raises(SameAccount) as exc:
        ledger.transfer_post(from_account_id=a.pk, to_account_id=a.pk, amount=1)
    assert exc.value.message == "Source and destination accounts must differ."
    assert exc.value.details == {}


@pytest.mark.parametrize("status", ["frozen", "closed"])
def test_unusable_account_is_reported_with_its_status(status):
    a, b = AccountFactory(funded=10), AccountFactory()
    ledger.account_set_status(account_id=b.pk, status=status)
    with pytest.raises(AccountNotActive) as exc:
        ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=1)
    assert exc.value.message == f"Account {b.pk} is {status}."
    assert exc.value.details == {"account_id": b.pk, "status": status}
    assert (fresh(a).balance, fresh(b).balance) == (10, 0)


def test_insufficient_funds_messages():
    a, b = AccountFactory(funded=100), AccountFactory()
    with pytest.raises(InsufficientFunds) as exc:
        ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=101)
    assert exc.value.message == f"Account {a.pk} has 100 available; 101 needed."
    ledger.hold_place(account_id=a.pk, amount=30)
    with pytest.raises(InsufficientFunds) as exc:
        ledger.hold_place(account_id=a.pk, amount=71)
    assert exc.value.message == f"Account {a.pk} has 70 available; 71 needed."
    assert exc.value.details == {"account_id": a.pk, "available": 70, "required": 71}
    assert (fresh(a).balance, fresh(a).held) == (100, 30)


def test_whole_available_balance_can_be_moved_or_held():
    a, b = AccountFactory(funded=100), AccountFactory()
    ledger.hold_place(account_id=a.pk, amount=40)
    ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=60)
    assert (fresh(a).balance, fresh(a).held, fresh(b).balance) == (40, 40, 60)
    ledger.hold_place(account_id=b.pk, amount=60)
    assert (fresh(b).balance, fresh(b).held) == (60, 60)


def test_hold_mismatch_message():
    a, b = AccountFactory(funded=100), AccountFactory()
    hold = ledger.hold_place(account_id=a.pk, amount=50)
    with pytest.raises(HoldMismatch) as exc:
        ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=40, hold_id=hold.pk)
    assert exc.value.message == (
        f"Hold {hold.pk} (50 on account {a.pk}) does not match this entry."
    )
    assert exc.value.details == {"hold_id": hold.pk}
    hold.refresh_from_db()
    assert (hold.status, fresh(a).held, fresh(b).balance) == (HoldStatus.ACTIVE, 50, 0)


def test_hold_not_active_details_carry_the_hold_status():
    a, b = AccountFactory(funded=100), AccountFactory()
    released = ledger.hold_place(account_id=a.pk, amount=10)
    ledger.hold_release(hold_id=released.pk)
    captured = ledger.hold_place(account_id=a.pk, amount=20)
    ledger.hold_capture(hold_id=captured.pk, to_account_id=b.pk)

    with pytest.raises(HoldNotActive) as exc:
        ledger.hold_capture(hold_id=released.pk, to_account_id=b.pk)
    assert exc.value.message == f"Hold {released.pk} is not active."
    assert exc.value.details == {"hold_id": released.pk, "status": "released"}
    with pytest.raises(HoldNotActive) as exc:
        ledger.hold_release(hold_id=captured.pk)
    assert exc.value.details == {"hold_id": captured.pk, "status": "captured"}
    with pytest.raises(HoldNotActive) as exc:
        ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=5, hold_id=MISSING)
    assert exc.value.message == f"Hold {MISSING} is not active."
    assert exc.value.details == {"hold_id": MISSING, "status": None}
    assert (fresh(a).balance, fresh(a).held, fresh(b).balance) == (80, 0, 20)


@pytest.mark.parametrize("service", ["release", "capture"])
def test_missing_hold_message(service):
    b = AccountFactory()
    with pytest.raises(HoldNotActive) as exc:
        if service == "release":
            ledger.hold_release(hold_id=MISSING)
        else:
            ledger.hold_capture(hold_id=MISSING, to_account_id=b.pk)
    assert exc.value.message == f"Hold {MISSING} does not exist."
    assert exc.value.details == {"hold_id": MISSING}


def test_duplicate_reference_message():
    a, b = AccountFactory(funded=100), AccountFactory()
    ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=1, reference="pay:7")
    with pytest.raises(DuplicateReference) as exc:
        ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=1, reference="pay:7")
    assert exc.value.message == "An entry with reference 'pay:7' is already posted."
    assert exc.value.details == {"reference": "pay:7"}


def test_already_reversed_message():
    a, b = AccountFactory(funded=100), AccountFactory()
    entry = ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=30)
    ledger.entry_reverse(entry_id=entry.pk)
    with pytest.raises(EntryAlreadyReversed) as exc:
        ledger.entry_reverse(entry_id=entry.pk)
    assert exc.value.message == f"Entry {entry.pk} is already reversed."
    assert exc.value.details == {"entry_id": entry.pk}
    assert (fresh(a).balance, fresh(b).balance) == (100, 0)


@pytest.mark.parametrize("amount", [0, 1.5, True, "5"])
def test_adjustment_amount_must_be_a_non_zero_integer(amount):
    a = AccountFactory(funded=10)
    with pytest.raises(InvalidAmount) as exc:
        ledger.adjustment_post(
            account_id=a.pk, amount=amount, description="fix", staff_user=UserFactory()
        )
    assert exc.value.message == "Adjustment amount must be a non-zero integer."
    assert exc.value.details == {"amount": amount}
    assert fresh(a).balance == 10


@pytest.mark.parametrize("description", ["", "   "])
def test_adjustment_needs_a_reason(description):
    a = AccountFactory(funded=10)
    with pytest.raises(InvalidAmount) as exc:
        ledger.adjustment_post(
            account_id=a.pk, amount=5, description=description, staff_user=UserFactory()
        )
    assert exc.value.message == "An adjustment needs a reason."
    assert exc.value.details == {}
    assert fresh(a).balance == 10


# --- account status ----------------------------------------------------------


def test_unknown_status_is_refused():
    a = AccountFactory()
    with pytest.raises(LedgerError) as exc:
        ledger.account_set_status(account_id=a.pk, status="bogus")
    error(exc, LedgerError)
    assert exc.value.message == "Unknown account status 'bogus'."
    assert (fresh(a).status, fresh(a).version) == ("active", 0)


def test_status_of_missing_account():
    with pytest.raises(AccountNotFound) as exc:
        ledger.account_set_status(account_id=MISSING, status="frozen")
    assert exc.value.message == f"Account {MISSING} does not exist."
    assert exc.value.details == {"account_id": MISSING}


def test_system_account_message():
    issuance = ledger.issuance_account()
    with pytest.raises(SystemAccountProtected) as exc:
        ledger.account_set_status(account_id=issuance.pk, status="frozen")
    assert exc.value.message == (
        f"Account #{issuance.pk} Issuance is a system account; its status cannot be changed."
    )
    assert exc.value.details == {"account_id": issuance.pk}


def test_freeze_and_unfreeze_bump_version_each_time():
    a = AccountFactory(funded=10)  # the deposit made version 1
    before = timezone.now()
    frozen = ledger.account_set_status(account_id=a.pk, status="frozen")
    assert (frozen.status, frozen.version) == ("frozen", 2)
    stored = fresh(a)
    assert (stored.status, stored.version, stored.balance) == ("frozen", 2, 10)
    assert stored.updated_at >= before
    ledger.account_set_status(account_id=a.pk, status="active")
    assert (fresh(a).status, fresh(a).version) == ("active", 3)


@pytest.mark.parametrize("status", ["active", "frozen"])
def test_closed_account_cannot_be_reopened(status):
    a = AccountFactory()
    ledger.account_set_status(account_id=a.pk, status="closed")
    with pytest.raises(AccountNotActive) as exc:
        ledger.account_set_status(account_id=a.pk, status=status)
    assert exc.value.message == f"Account {a.pk} is closed."
    assert exc.value.details == {"account_id": a.pk}
    assert (fresh(a).status, fresh(a).version) == ("closed", 1)


def test_closing_a_closed_account_again_is_allowed():
    a = AccountFactory()
    ledger.account_set_status(account_id=a.pk, status="closed")
    closed = ledger.account_set_status(account_id=a.pk, status="closed")
    assert (closed.status, closed.version) == ("closed", 2)
    assert (fresh(a).status, fresh(a).version) == ("closed", 2)


def test_emptied_account_can_be_closed():
    a, b = AccountFactory(funded=10), AccountFactory()
    ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=10)
    ledger.account_set_status(account_id=a.pk, status="closed")
    assert (fresh(a).status, fresh(a).balance, fresh(a).version) == ("closed", 0, 3)


@pytest.mark.parametrize("hold", [0, 4])
def test_close_refused_while_money_or_holds_remain(hold):
    a = AccountFactory(funded=5)
    if hold:
        ledger.hold_place(account_id=a.pk, amount=hold)
    version = fresh(a).version
    with pytest.raises(LedgerError) as exc:
        ledger.account_set_status(account_id=a.pk, status="closed")
    error(exc, LedgerError)
    assert exc.value.message == f"Account {a.pk} must have zero balance and no holds to close."
    assert exc.value.details == {"account_id": a.pk}
    assert (fresh(a).status, fresh(a).version) == ("active", version)


# --- journal rows, balances, holds ---------------------------------------------


def test_transfer_writes_entry_postings_and_bumps_versions():
    a, b = AccountFactory(funded=100), AccountFactory(funded=5)
    before = timezone.now()
    entry = ledger.transfer_post(
        from_account_id=a.pk, to_account_id=b.pk, amount=30, reference="pay:1", description="rent"
    )
    stored = JournalEntry.objects.get(pk=entry.pk)
    assert (stored.kind, stored.reference, stored.description) == ("transfer", "pay:1", "rent")
    assert (stored.created_by_id, stored.reverses_id) == (None, None)
    assert list(
        Posting.objects.filter(entry=entry)
        .order_by("pk")
        .values_list("account_id", "amount", "balance_after")
    ) == [(a.pk, -30, 70), (b.pk, 30, 35)]
    a_after, b_after = fresh(a), fresh(b)
    assert (a_after.balance, a_after.version, b_after.balance, b_after.version) == (70, 2, 35, 2)
    assert a_after.updated_at == b_after.updated_at >= before


def test_transfer_description_defaults_to_empty_and_is_cut_to_255():
    a, b = AccountFactory(funded=100), AccountFactory()
    plain = ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=1)
    long = ledger.transfer_post(
        from_account_id=a.pk, to_account_id=b.pk, amount=1, description="x" * 300
    )
    assert JournalEntry.objects.get(pk=plain.pk).description == ""
    assert long.description == JournalEntry.objects.get(pk=long.pk).description == "x" * 255


def test_deposit_entry_kind_reference_and_description():
    a = AccountFactory()
    default = ledger.deposit(account_id=a.pk, amount=5, reference="dep:1")
    named = ledger.deposit(account_id=a.pk, amount=7, description="Top-up")
    rows = JournalEntry.objects.in_bulk([default.pk, named.pk])
    assert (rows[default.pk].kind, rows[default.pk].reference) == ("deposit", "dep:1")
    assert rows[default.pk].description == "Deposit"
    assert (rows[named.pk].kind, rows[named.pk].description) == ("deposit", "Top-up")
    issuance = ledger.issuance_account()
    assert postings(named) == [(issuance.pk, -7), (a.pk, 7)]
    assert fresh(a).balance == 12


def test_issuance_account_is_created_once_as_a_negative_system_account():
    issuance = ledger.issuance_account()
    assert (issuance.system_code, issuance.name, issuance.allow_negative) == (
        "issuance",
        "Issuance",
        True,
    )
    assert ledger.issuance_account().pk == issuance.pk
    assert Account.objects.filter(system_code="issuance").count() == 1


def test_account_create_fields():
    user = UserFactory()
    plain = ledger.account_create(owner=user)
    limited = ledger.account_create(owner=user, name="savings", max_payment_amount=500)
    plain, limited = fresh(plain), fresh(limited)
    assert (plain.owner_id, plain.name, plain.max_payment_amount) == (user.pk, "", 1_000_000)
    assert (limited.owner_id, limited.name, limited.max_payment_amount) == (user.pk, "savings", 500)
    assert (plain.balance, plain.status) == (0, "active")


def test_holds_accumulate_and_release_returns_only_their_amount():
    a = AccountFactory(funded=100)
    first = ledger.hold_place(account_id=a.pk, amount=30, reference="pay:1")
    second = ledger.hold_place(account_id=a.pk, amount=20)
    assert (fresh(a).balance, fresh(a).held, fresh(a).version) == (100, 50, 3)
    stored = Hold.objects.get(pk=first.pk)
    assert (stored.account_id, stored.amount, stored.reference, stored.status) == (
        a.pk,
        30,
        "pay:1",
        "active",
    )
    assert (Hold.objects.get(pk=second.pk).reference, stored.resolved_at) == ("", None)

    ledger.hold_release(hold_id=second.pk)
    released, account = Hold.objects.get(pk=second.pk), fresh(a)
    assert (account.balance, account.held, account.version) == (100, 30, 4)
    assert released.status == HoldStatus.RELEASED
    assert released.resolved_at is not None
    assert released.resolved_at == account.updated_at


def test_hold_reference_is_cut_to_128():
    a = AccountFactory(funded=10)
    hold = ledger.hold_place(account_id=a.pk, amount=1, reference="r" * 200)
    assert hold.reference == Hold.objects.get(pk=hold.pk).reference == "r" * 128


def test_hold_on_frozen_account_is_refused():
    a = AccountFactory(funded=10)
    ledger.account_set_status(account_id=a.pk, status="frozen")
    with pytest.raises(AccountNotActive) as exc:
        ledger.hold_place(account_id=a.pk, amount=1)
    assert exc.value.details == {"account_id": a.pk, "status": "frozen"}
    assert (fresh(a).held, Hold.objects.filter(account=a).count()) == (0, 0)


def test_capture_pays_from_the_hold_and_leaves_other_holds():
    a, b = AccountFactory(funded=100), AccountFactory()
    other = ledger.hold_place(account_id=a.pk, amount=25)
    hold = ledger.hold_place(account_id=a.pk, amount=75)
    entry = ledger.hold_capture(
        hold_id=hold.pk, to_account_id=b.pk, reference="pay:9", description="invoice 9"
    )
    stored = JournalEntry.objects.get(pk=entry.pk)
    assert (stored.kind, stored.reference, stored.description) == (
        "transfer",
        "pay:9",
        "invoice 9",
    )
    assert postings(entry) == [(a.pk, -75), (b.pk, 75)]
    captured, account = Hold.objects.get(pk=hold.pk), fresh(a)
    assert (captured.status, captured.entry_id) == (HoldStatus.CAPTURED, entry.pk)
    assert captured.resolved_at is not None
    assert captured.resolved_at == account.updated_at
    assert (account.balance, account.held) == (25, 25)
    assert Hold.objects.get(pk=other.pk).status == HoldStatus.ACTIVE
    assert fresh(b).balance == 75


def test_capture_description_defaults_to_empty():
    a, b = AccountFactory(funded=10), AccountFactory()
    hold = ledger.hold_place(account_id=a.pk, amount=10)
    entry = ledger.hold_capture(hold_id=hold.pk, to_account_id=b.pk)
    assert (JournalEntry.objects.get(pk=entry.pk).description, entry.reference) == ("", None)


@pytest.mark.postgres  # SQLite has no FOR NO KEY UPDATE to look for
def test_capture_reads_the_hold_once_before_locking_it():
    a, b = AccountFactory(funded=10), AccountFactory()
    hold = ledger.hold_place(account_id=a.pk, amount=10)
    with CaptureQueriesContext(connection) as queries:
        ledger.hold_capture(hold_id=hold.pk, to_account_id=b.pk)
    reads = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("SELECT")]
    hold_reads = [sql for sql in reads if 'FROM "ledger_hold"' in sql]
    assert len(hold_reads) == 2  # the lookup, then the lock (FOR NO KEY UPDATE)
    assert "FOR NO KEY UPDATE" in hold_reads[1]


# --- adjustments and reversals -------------------------------------------------


@pytest.mark.parametrize("amount", [1, -1, 40, -60])
def test_adjustment_posts_against_issuance(amount):
    a, staff = AccountFactory(funded=60), UserFactory(is_staff=True)
    issuance_before = fresh(ledger.issuance_account()).balance
    entry = ledger.adjustment_post(
        account_id=a.pk, amount=amount, description="goodwill", staff_user=staff
    )
    stored = JournalEntry.objects.get(pk=entry.pk)
    assert (stored.kind, stored.description, stored.created_by_id) == (
        "adjustment",
        "goodwill",
        staff.pk,
    )
    issuance = ledger.issuance_account()
    assert postings(entry) == [(issuance.pk, -amount), (a.pk, amount)]
    assert fresh(a).balance == 60 + amount
    assert fresh(issuance).balance == issuance_before - amount


def test_adjustment_cannot_overdraw_or_touch_a_closed_account():
    a, staff = AccountFactory(funded=60), UserFactory(is_staff=True)
    with pytest.raises(InsufficientFunds) as exc:
        ledger.adjustment_post(account_id=a.pk, amount=-61, description="fix", staff_user=staff)
    assert exc.value.details == {"account_id": a.pk, "available": 60, "required": 61}
    closed = AccountFactory()
    ledger.account_set_status(account_id=closed.pk, status="closed")
    with pytest.raises(AccountNotActive) as exc:
        ledger.adjustment_post(account_id=closed.pk, amount=5, description="fix", staff_user=staff)
    assert exc.value.details == {"account_id": closed.pk, "status": "closed"}
    assert (fresh(a).balance, fresh(closed).balance) == (60, 0)


def test_reversal_entry_rows():
    a, b = AccountFactory(funded=100), AccountFactory()
    staff = UserFactory(is_staff=True)
    first = ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=30)
    second = ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=20)
    default = ledger.entry_reverse(entry_id=first.pk)
    named = ledger.entry_reverse(entry_id=second.pk, description="refund", staff_user=staff)
    rows = JournalEntry.objects.in_bulk([default.pk, named.pk])
    assert (rows[default.pk].kind, rows[default.pk].reverses_id) == ("reversal", first.pk)
    assert rows[default.pk].description == f"Reversal of entry {first.pk}"
    assert rows[default.pk].created_by_id is None
    assert (rows[named.pk].description, rows[named.pk].created_by_id) == ("refund", staff.pk)
    assert rows[named.pk].reverses_id == second.pk
    assert list(
        Posting.objects.filter(entry=named)
        .order_by("pk")
        .values_list("account_id", "amount", "balance_after")
    ) == [(a.pk, 20, 100), (b.pk, -20, 0)]
    assert (fresh(a).balance, fresh(b).balance) == (100, 0)


def test_reversal_applies_to_frozen_accounts():
    a, b = AccountFactory(funded=100), AccountFactory()
    entry = ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=30)
    ledger.account_set_status(account_id=a.pk, status="frozen")
    ledger.account_set_status(account_id=b.pk, status="frozen")
    ledger.entry_reverse(entry_id=entry.pk)
    assert (fresh(a).balance, fresh(b).balance) == (100, 0)


def test_reversal_cannot_overdraw_the_account_that_received_the_money():
    a, b, c = AccountFactory(funded=100), AccountFactory(), AccountFactory()
    entry = ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=30)
    ledger.transfer_post(from_account_id=b.pk, to_account_id=c.pk, amount=25)
    with pytest.raises(InsufficientFunds) as exc:
        ledger.entry_reverse(entry_id=entry.pk)
    assert exc.value.details == {"account_id": b.pk, "available": 5, "required": 30}
    assert not JournalEntry.objects.filter(reverses=entry).exists()
    assert (fresh(a).balance, fresh(b).balance) == (70, 5)


# --- LedgerBatch: the unit of work payments use ----------------------------------


@pytest.mark.parametrize(
    ("amounts", "message"),
    [
        ([5], "An entry needs two or more non-zero postings."),
        ([5, 0, -5], "An entry needs two or more non-zero postings."),
        ([-5, 4], "The postings of an entry must sum to zero."),
    ],
)
def test_entry_shape_is_checked_first(amounts, message):
    accounts = [AccountFactory(funded=10) for _ in amounts]
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk for a in accounts])
        with pytest.raises(InvalidAmount) as exc:
            batch.post_entry(
                kind="transfer",
                legs=[Leg(a.pk, amount) for a, amount in zip(accounts, amounts, strict=True)],
            )
        batch.flush()
    assert exc.value.message == message
    assert exc.value.details == {}
    assert [fresh(a).balance for a in accounts] == [10] * len(accounts)


def test_entry_defaults_and_legs_on_one_account_add_up():
    a, b = AccountFactory(funded=100), AccountFactory()
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk, b.pk])
        with pytest.raises(InsufficientFunds) as exc:
            batch.post_entry(kind="transfer", legs=[Leg(a.pk, -60), Leg(a.pk, -60), Leg(b.pk, 120)])
        entry = batch.post_entry(
            kind="transfer", legs=[Leg(a.pk, -50), Leg(a.pk, -50), Leg(b.pk, 100)]
        )
        batch.flush()
    assert exc.value.details == {"account_id": a.pk, "available": 100, "required": 120}
    stored = JournalEntry.objects.get(pk=entry.pk)
    assert (stored.description, stored.reference) == ("", None)
    assert list(
        Posting.objects.filter(entry=entry).order_by("pk").values_list("amount", "balance_after")
    ) == [(-50, 50), (-50, 0), (100, 100)]
    assert (fresh(a).balance, fresh(b).balance) == (0, 100)


def test_entry_refuses_frozen_accounts_unless_allowed():
    a, b = AccountFactory(funded=10), AccountFactory()
    ledger.account_set_status(account_id=b.pk, status="frozen")
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk, b.pk])
        with pytest.raises(AccountNotActive):
            batch.post_entry(kind="transfer", legs=[Leg(a.pk, -1), Leg(b.pk, 1)])
        batch.post_entry(kind="adjustment", legs=[Leg(a.pk, -2), Leg(b.pk, 2)], allow_frozen=True)
        batch.flush()
    assert (fresh(a).balance, fresh(b).balance) == (8, 2)


def test_capture_in_a_multi_leg_entry_needs_the_hold_account_as_only_debit():
    a, b, c = AccountFactory(funded=50), AccountFactory(), AccountFactory(funded=10)
    hold = ledger.hold_place(account_id=a.pk, amount=50)
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk, b.pk, c.pk], hold_ids=[hold.pk])
        with pytest.raises(HoldMismatch):  # c is debited too
            batch.post_entry(
                kind="transfer",
                legs=[Leg(a.pk, -50), Leg(c.pk, -10), Leg(b.pk, 60)],
                hold_id=hold.pk,
            )
        # c nets to zero: not a debit.
        entry = batch.post_entry(
            kind="transfer",
            legs=[Leg(a.pk, -50), Leg(c.pk, -10), Leg(c.pk, 10), Leg(b.pk, 50)],
            hold_id=hold.pk,
        )
        batch.flush()
    assert Hold.objects.get(pk=hold.pk).entry_id == entry.pk
    assert [(fresh(x).balance, fresh(x).held) for x in (a, b, c)] == [(0, 0), (50, 0), (10, 0)]


def test_batch_transfer_and_hold_defaults():
    a, b = AccountFactory(funded=10), AccountFactory()
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk, b.pk])
        entry = batch.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=3)
        hold = batch.place_hold(account_id=a.pk, amount=2)
        batch.flush()
    stored = JournalEntry.objects.get(pk=entry.pk)
    assert (stored.kind, stored.description, stored.reference) == ("transfer", "", None)
    assert Hold.objects.get(pk=hold.pk).reference == ""
    assert (fresh(a).balance, fresh(a).held, fresh(b).balance) == (7, 2, 3)


def test_batch_finds_taken_references_without_spoiling_the_batch():
    """A duplicate is refused by the operation itself, declared or not, so the
    batch's other operations still flush."""
    a, b = AccountFactory(funded=100), AccountFactory()
    ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=1, reference="pay:1")
    with transaction.atomic():
        declared = LedgerBatch(account_ids=[a.pk, b.pk], references=["pay:1", "pay:2"])
        with pytest.raises(DuplicateReference) as exc:
            declared.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=1, reference="pay:1")
        declared.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=2, reference="pay:2")
        declared.flush()
    assert exc.value.details == {"reference": "pay:1"}
    with transaction.atomic():
        undeclared = LedgerBatch(account_ids=[a.pk, b.pk])
        with pytest.raises(DuplicateReference):
            undeclared.transfer(
                from_account_id=a.pk, to_account_id=b.pk, amount=1, reference="pay:1"
            )
        undeclared.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=4, reference="pay:3")
        with pytest.raises(DuplicateReference):  # posted earlier in this batch
            undeclared.transfer(
                from_account_id=a.pk, to_account_id=b.pk, amount=1, reference="pay:3"
            )
        undeclared.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=8)
        undeclared.flush()
    assert sorted(
        JournalEntry.objects.filter(reference__startswith="pay:").values_list(
            "reference", flat=True
        )
    ) == ["pay:1", "pay:2", "pay:3"]
    assert (fresh(a).balance, fresh(b).balance) == (85, 15)


def test_batch_looks_each_reference_up_once():
    a, b = AccountFactory(funded=100), AccountFactory()
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk, b.pk])
        batch.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=1, reference="pay:1")
        with CaptureQueriesContext(connection) as queries, pytest.raises(DuplicateReference):
            batch.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=1, reference="pay:1")
        batch.flush()
    assert queries.captured_queries == []


@pytest.mark.postgres
def test_flush_writes_one_statement_per_table():
    """Module docstring: one INSERT for entries, one for postings (nothing read
    back: postings get their ids from the table's default), one UPDATE per table."""
    a, b = AccountFactory(funded=100), AccountFactory()
    hold = ledger.hold_place(account_id=a.pk, amount=10)
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk, b.pk], hold_ids=[hold.pk])
        batch.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=10, hold_id=hold.pk)
        batch.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=5)
        with CaptureQueriesContext(connection) as queries:
            batch.flush()
    statements = [" ".join(q["sql"].split()[:3]) for q in queries.captured_queries]
    assert statements == [
        # the two entries' ids first, so postings and the hold can refer to them
        "SELECT nextval(pg_get_serial_sequence('ledger_journalentry', 'id'))",
        'INSERT INTO "ledger_journalentry"',
        'UPDATE "ledger_hold" AS',
        # postings and balances last (with lock_accounts_last, after the locks)
        'INSERT INTO "ledger_posting"',
        'UPDATE "ledger_account" AS',
    ]
    assert (fresh(a).balance, fresh(a).held, fresh(b).balance) == (85, 0, 15)


@pytest.mark.postgres
def test_one_new_row_takes_its_id_from_its_insert():
    """A lone new entry or hold needs no sequence round trip: its INSERT's RETURNING
    gives its id (and database defaults), and the rows written after it refer to it."""
    a, b = AccountFactory(funded=100), AccountFactory()
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk, b.pk])
        entry = batch.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=10)
        hold = batch.place_hold(account_id=a.pk, amount=5, reference="lone")
        with CaptureQueriesContext(connection) as queries:
            batch.flush()
    statements = [" ".join(q["sql"].split()[:3]) for q in queries.captured_queries]
    assert statements == [
        'INSERT INTO "ledger_journalentry"',
        'INSERT INTO "ledger_hold"',
        'INSERT INTO "ledger_posting"',
        'UPDATE "ledger_account" AS',
    ]
    stored = JournalEntry.objects.get(pk=entry.pk)
    assert entry.created_at == stored.created_at is not None
    assert sorted(p.amount for p in stored.postings.all()) == [-10, 10]
    assert Hold.objects.get(pk=hold.pk).reference == "lone"
    assert (entry._state.adding, hold._state.adding) == (False, False)


# --- concurrency (PostgreSQL, real transactions) -----------------------------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_locks_leave_rows_referable():
    """Locked accounts, holds and reversed entries can still be referenced by new
    rows (payments, postings) from other transactions: ``FOR NO KEY UPDATE``,
    not ``FOR UPDATE``, which made opposite payments deadlock in COMMIT."""
    a, b = AccountFactory(funded=100), AccountFactory()
    hold = ledger.hold_place(account_id=a.pk, amount=10)
    entry = ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=5)
    with transaction.atomic():
        LedgerBatch(account_ids=[a.pk], hold_ids=[hold.pk])
        assert share("ledger_account", a.pk) == "LockNotAvailable"  # locked...
        assert key_share("ledger_account", a.pk) is None  # ...but referable
        assert share("ledger_hold", hold.pk) == "LockNotAvailable"
        assert key_share("ledger_hold", hold.pk) is None
    with transaction.atomic():
        ledger.entry_reverse(entry_id=entry.pk)
        assert share("ledger_journalentry", entry.pk) == "LockNotAvailable"
        assert key_share("ledger_journalentry", entry.pk) is None
    assert (fresh(a).balance, fresh(b).balance) == (100, 0)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_reference_committed_by_a_concurrent_transaction_is_a_duplicate():
    """The second insert waits on the unique index, then fails: reported as
    ``DuplicateReference``, not as a database error."""
    a, b = AccountFactory(funded=100), AccountFactory()
    c, d = AccountFactory(funded=100), AccountFactory()
    outcome = []

    def racer():
        try:
            ledger.transfer_post(
                from_account_id=c.pk, to_account_id=d.pk, amount=7, reference="pay:race"
            )
            outcome.append(None)
        except Exception as exc:  # reported to the test thread
            outcome.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=racer)
    with transaction.atomic():
        ledger.transfer_post(
            from_account_id=a.pk, to_account_id=b.pk, amount=5, reference="pay:race"
        )
        thread.start()
        deadline = time.monotonic() + 60
        while True:  # until the racer waits for this transaction
            with connection.cursor() as cursor:
                cursor.execute("SELECT pg_stat_clear_snapshot()")
                cursor.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND wait_event_type = 'Lock'"
                    " AND query LIKE 'INSERT INTO \"ledger_journalentry\"%%'"
                )
                if cursor.fetchone()[0]:
                    break
            assert time.monotonic() < deadline, "the racer never waited on the reference"
            time.sleep(0.05)
    thread.join(60)
    assert not thread.is_alive()
    [exc] = outcome
    assert type(exc) is DuplicateReference
    assert exc.message == "An entry with reference 'pay:race' is already posted."
    assert exc.details == {"reference": "pay:race"}
    assert isinstance(exc.__cause__, IntegrityError)
    assert (fresh(c).balance, fresh(d).balance, fresh(a).balance) == (100, 0, 95)


def test_other_integrity_errors_are_not_reported_as_duplicates():
    a, b = AccountFactory(funded=100), AccountFactory()
    with pytest.raises(IntegrityError):
        ledger.transfer_post(
            from_account_id=a.pk, to_account_id=b.pk, amount=5, reference="pay:1", kind="bogus"
        )


# --- lock_accounts_last: accounts read first, locked in flush_balances ----------------


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_lock_accounts_last_carries_the_batch_onto_what_others_committed_meanwhile():
    """Until ``flush_balances`` the batch holds no account lock: others move money
    on its accounts and commit. Then it locks them and applies its own changes on
    top: balances, held amounts and every posting's ``balance_after`` follow the
    locked rows, not the batch's first read, and the ledger reconciles."""
    a, b, c = AccountFactory(funded=100), AccountFactory(), AccountFactory(funded=50)
    hold = ledger.hold_place(account_id=a.pk, amount=10)
    version = fresh(a).version
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk, b.pk], hold_ids=[hold.pk], lock_accounts_last=True)
        batch.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=10, hold_id=hold.pk)
        batch.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=5)
        batch.flush()
        assert share("ledger_account", a.pk) is None  # not locked yet

        def meanwhile():
            ledger.hold_place(account_id=a.pk, amount=20)
            ledger.transfer_post(from_account_id=c.pk, to_account_id=b.pk, amount=7)

        commit_elsewhere(meanwhile)
        batch.flush_balances()
        assert share("ledger_account", a.pk) == "LockNotAvailable"
        assert share("ledger_account", b.pk) == "LockNotAvailable"
        assert share("ledger_account", c.pk) is None  # not in the batch's changes
    assert (fresh(a).balance, fresh(a).held, fresh(b).balance) == (85, 20, 22)
    assert fresh(a).version == version + 3  # theirs, then our two operations
    afters = list(
        Posting.objects.filter(account__in=[a, b])
        .order_by("pk")
        .values_list("account_id", "amount", "balance_after")
    )
    assert afters[-4:] == [(a.pk, -10, 90), (b.pk, 10, 17), (a.pk, -5, 85), (b.pk, 5, 22)]
    assert reconcile().ok


@pytest.fixture(params=["committed elsewhere", "in the same transaction"])
def between(request):
    """How the change reaches the batch between its read and its ``flush_balances``:
    committed by another connection (PostgreSQL: SQLite's write lock keeps other
    writers out for the whole transaction), or made in the batch's own transaction
    — which also reaches the re-checks of SQLite's ``flush_balances`` path."""
    if request.param == "committed elsewhere":
        if connection.vendor != "postgresql":
            pytest.skip("needs PostgreSQL: another connection commits while the batch runs")
        return commit_elsewhere
    return lambda change: change()


def transfer_with_change_between(a, b, amount, meanwhile, between, hold=None):
    """One ``lock_accounts_last`` transfer a → b in its own transaction, with
    ``meanwhile()`` applied (``between``) after the batch's read and before its
    ``flush_balances`` (an exception from it rolls the transaction back)."""
    with transaction.atomic():
        batch = LedgerBatch(
            account_ids=[a.pk, b.pk],
            hold_ids=[hold.pk] if hold else [],
            lock_accounts_last=True,
        )
        batch.transfer(
            from_account_id=a.pk, to_account_id=b.pk, amount=amount, hold_id=hold and hold.pk
        )
        batch.flush()
        between(meanwhile)
        batch.flush_balances()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("status", ["frozen", "closed"])
def test_lock_accounts_last_refuses_an_account_whose_status_changed(status, between):
    """Checked against an active account, written to a frozen one: never —
    ``StaleAccounts``, and flush_balances writes nothing."""
    a, b = AccountFactory(funded=100), AccountFactory()
    postings = Posting.objects.count()
    with pytest.raises(StaleAccounts, match=f"^Account {b.pk} changed status"):
        transfer_with_change_between(
            a, b, 10, lambda: ledger.account_set_status(account_id=b.pk, status=status), between
        )
    assert Posting.objects.count() == postings
    kept = between is commit_elsewhere  # else rolled back with the batch
    assert (fresh(a).balance, fresh(b).balance) == (100, 0)
    assert fresh(b).status == (status if kept else "active")


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_lock_accounts_last_writes_no_account_when_one_is_stale():
    """The accounts are locked, checked and written in one statement: when the
    destination turned frozen, the source is not debited either — even before
    the caller rolls back (the transaction is still usable: nothing failed in SQL)."""
    a, b = AccountFactory(funded=100), AccountFactory()
    version = fresh(a).version
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk, b.pk], lock_accounts_last=True)
        batch.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=10)
        batch.flush()
        commit_elsewhere(lambda: ledger.account_set_status(account_id=b.pk, status="frozen"))
        with pytest.raises(StaleAccounts, match=f"Account {b.pk} changed status"):
            batch.flush_balances()
        assert (fresh(a).balance, fresh(a).version, fresh(b).balance) == (100, version, 0)
        assert not Posting.objects.filter(account_id__in=[a.pk, b.pk], entry__kind="transfer")
        transaction.set_rollback(True)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_lock_accounts_last_names_an_account_deleted_meanwhile():
    """An account the batch read and that is gone when it locks: ``StaleAccounts``
    naming it (the executor logs the message), and the other account is not written."""
    a, b = AccountFactory(funded=100), AccountFactory()
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk, b.pk], lock_accounts_last=True)
        batch.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=10)
        commit_elsewhere(lambda: Account.objects.filter(pk=b.pk).delete())
        with pytest.raises(StaleAccounts, match=f"^Account {b.pk} no longer exists"):
            batch.flush_balances()
        assert fresh(a).balance == 100
        transaction.set_rollback(True)


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_lock_accounts_last_locks_in_ascending_id_order():
    """flush_balances takes its account locks in ascending id order, whatever plan
    PostgreSQL picks for the UPDATE: while it waits for the middle account (locked
    elsewhere), it already holds the lowest and not yet the highest — so two
    batches wait for each other instead of deadlocking."""
    a, b, c = (AccountFactory(funded=100) for _ in range(3))
    blocker_ready, release, flushed = threading.Event(), threading.Event(), threading.Event()

    def hold_middle():
        with transaction.atomic():
            Account.objects.select_for_update().get(pk=b.pk)
            blocker_ready.set()
            assert release.wait(30)

    def flush():
        assert blocker_ready.wait(30)
        with transaction.atomic():
            batch = LedgerBatch(account_ids=[a.pk, b.pk, c.pk], lock_accounts_last=True)
            batch.transfer(from_account_id=c.pk, to_account_id=b.pk, amount=10)
            batch.transfer(from_account_id=b.pk, to_account_id=a.pk, amount=5)
            batch.flush()
            batch.flush_balances()
        flushed.set()

    def probe(account):
        """Whether another transaction could lock ``account`` now (NOWAIT)."""
        with transaction.atomic():
            try:
                Account.objects.select_for_update(nowait=True).get(pk=account.pk)
            except OperationalError:
                return False
            transaction.set_rollback(True)
            return True

    def observe():
        assert blocker_ready.wait(30)
        deadline = time.monotonic() + 20
        while probe(a) and time.monotonic() < deadline:  # until the batch holds a
            time.sleep(0.02)
        try:
            assert not flushed.is_set()  # it waits for b…
            assert not probe(a), "the batch never locked the lowest id"
            assert probe(c), "the batch locked the highest id before the middle one"
        finally:
            release.set()

    errors = run_in_threads(lambda i: [hold_middle, flush, observe][i](), 3)
    assert errors == []
    assert flushed.is_set()
    assert (fresh(a).balance, fresh(b).balance, fresh(c).balance) == (105, 105, 90)


@pytest.mark.django_db(transaction=True)
def test_lock_accounts_last_refuses_funds_that_went_meanwhile(between):
    """A debit checked against 100 available, when a hold placed meanwhile left 20:
    ``StaleAccounts`` (not the CHECK constraint's IntegrityError at the UPDATE)."""
    a, b = AccountFactory(funded=100), AccountFactory()
    with pytest.raises(StaleAccounts, match=f"^Account {a.pk} no longer has the funds"):
        transfer_with_change_between(
            a, b, 50, lambda: ledger.hold_place(account_id=a.pk, amount=80), between
        )
    kept = between is commit_elsewhere  # else rolled back with the batch
    assert (fresh(a).balance, fresh(a).held, fresh(b).balance) == (100, 80 if kept else 0, 0)


@pytest.mark.django_db(transaction=True)
def test_lock_accounts_last_keeps_funds_the_batch_does_not_lower(between):
    """What the batch pays out of a captured hold or into an account does not lower
    its available funds: a hold placed meanwhile that takes all of them is no reason
    to refuse (nor is an overdraft-allowed account's negative balance)."""
    a, b = AccountFactory(funded=100), AccountFactory()
    hold = ledger.hold_place(account_id=a.pk, amount=30)
    transfer_with_change_between(
        a, b, 30, lambda: ledger.hold_place(account_id=a.pk, amount=70), between, hold=hold
    )
    assert (fresh(a).balance, fresh(a).held, fresh(b).balance) == (70, 70, 30)
    assert reconcile().ok


@pytest.mark.django_db(transaction=True)
def test_lock_accounts_last_may_use_the_last_unit_left(between):
    """A hold placed meanwhile leaves exactly what the batch pays out: available
    ends at 0, which is allowed — no ``StaleAccounts``."""
    a, b = AccountFactory(funded=100), AccountFactory()
    version = fresh(a).version
    transfer_with_change_between(
        a, b, 50, lambda: ledger.hold_place(account_id=a.pk, amount=50), between
    )
    assert (fresh(a).balance, fresh(a).held, fresh(a).available) == (50, 50, 0)
    assert fresh(a).version == version + 2  # the hold's change, then the batch's


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("other_hold, refused", [(80, True), (70, False)])
def test_lock_accounts_last_counts_a_hold_it_places_against_the_funds_left(
    other_hold, refused, between
):
    """A batch that places a hold of 30 lowers available funds by 30: after another
    hold of 80 took all but 20, ``StaleAccounts``; after one of 70, exactly enough."""
    a = AccountFactory(funded=100)
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk], lock_accounts_last=True)
        batch.place_hold(account_id=a.pk, amount=30)
        batch.flush()
        between(lambda: ledger.hold_place(account_id=a.pk, amount=other_hold))
        if refused:
            with pytest.raises(StaleAccounts, match=f"^Account {a.pk} no longer has the funds"):
                batch.flush_balances()
            transaction.set_rollback(True)
        else:
            batch.flush_balances()
    if not refused:
        assert (fresh(a).balance, fresh(a).held, fresh(a).available) == (100, 100, 0)


def one_account_hold_with_change_between(a, amount, meanwhile, between):
    """A ``lock_accounts_last`` batch that changes one account only (a hold on
    ``a``, as a schedule does), with ``meanwhile()`` applied (``between``) after
    its read and before its ``flush_balances``; returns flush_balances' SQL."""
    with transaction.atomic(), CaptureQueriesContext(connection) as ctx:
        batch = LedgerBatch(account_ids=[a.pk], lock_accounts_last=True)
        batch.place_hold(account_id=a.pk, amount=amount)
        batch.flush()
        between(meanwhile)
        start = len(ctx)
        batch.flush_balances()
    return [q["sql"] for q in ctx.captured_queries[start:]]


def overdraft_account(funded=100):
    """A system account (only those may go negative) allowed an overdraft."""
    return AccountFactory(owner=None, system_code="overdraft", allow_negative=True, funded=funded)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "make, meanwhile, message, held_meanwhile",
    [
        (
            lambda: AccountFactory(funded=100),
            lambda a: ledger.account_set_status(account_id=a.pk, status="frozen"),
            "changed status",
            0,
        ),
        (
            overdraft_account,
            lambda a: Account.objects.filter(pk=a.pk).update(allow_negative=False),
            "changed status",
            0,
        ),
        (
            lambda: AccountFactory(funded=100),
            lambda a: ledger.hold_place(account_id=a.pk, amount=80),
            "no longer has the funds",
            80,
        ),
    ],
    ids=["frozen", "overdraft withdrawn", "funds gone"],
)
def test_lock_accounts_last_checks_one_account_as_it_checks_several(
    make, meanwhile, message, held_meanwhile, between
):
    """A batch that changed one account refuses what a batch of several refuses,
    with the same ``StaleAccounts`` message; of its hold nothing is written."""
    a = make()
    with pytest.raises(StaleAccounts, match=f"^Account {a.pk} {message}"):
        one_account_hold_with_change_between(a, 30, lambda: meanwhile(a), between)
    kept = between is commit_elsewhere  # else rolled back with the batch
    assert (fresh(a).balance, fresh(a).held) == (100, held_meanwhile if kept else 0)


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("make", [lambda: AccountFactory(funded=100), overdraft_account])
def test_lock_accounts_last_writes_one_account_by_its_key(make, between):
    """One changed account is checked and written by a plain UPDATE of its row
    (PostgreSQL), from the row it locked: a hold of 40 placed meanwhile is counted,
    and the balance, held amount and version all carry on from it."""
    a = make()
    version = fresh(a).version
    sql = one_account_hold_with_change_between(
        a, 60, lambda: ledger.hold_place(account_id=a.pk, amount=40), between
    )
    assert (fresh(a).balance, fresh(a).held, fresh(a).version) == (100, 100, version + 2)
    if connection.vendor == "postgresql":
        assert [q.split()[0] for q in sql] == ["SELECT", "UPDATE"], sql


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_lock_accounts_last_lets_an_overdraft_account_use_more_than_it_has():
    """allow_negative: a hold that takes more than is left after one placed
    meanwhile is no reason to refuse, for one account as for several."""
    a = overdraft_account()
    version = fresh(a).version
    sql = one_account_hold_with_change_between(
        a, 90, lambda: ledger.hold_place(account_id=a.pk, amount=80), commit_elsewhere
    )
    assert (fresh(a).balance, fresh(a).held, fresh(a).version) == (100, 170, version + 2)
    assert [q.split()[0] for q in sql] == ["SELECT", "UPDATE"], sql


def test_flush_balances_does_nothing_without_lock_accounts_last(django_assert_num_queries):
    """Even called before flush: a batch that locked its accounts up front writes
    its balances in flush and nowhere else."""
    a, b = AccountFactory(funded=100), AccountFactory()
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk, b.pk])
        batch.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=10)
        with django_assert_num_queries(0):
            batch.flush_balances()
        assert (fresh(a).balance, fresh(b).balance) == (100, 0)
        batch.flush()
    assert (fresh(a).balance, fresh(b).balance) == (90, 10)


def test_flush_balances_without_lock_accounts_last_writes_nothing_more(django_assert_num_queries):
    """The default batch locked its accounts up front and wrote everything in flush."""
    a, b = AccountFactory(funded=100), AccountFactory()
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk, b.pk])
        batch.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=10)
        batch.flush()
        with django_assert_num_queries(0):
            batch.flush_balances()
    assert (fresh(a).balance, fresh(b).balance) == (90, 10)


def test_a_batch_locked_up_front_goes_on_after_a_flush():
    """``flush`` writes what was applied so far and leaves the batch usable: the
    next operations and the next ``flush`` write only themselves, on top."""
    a, b = AccountFactory(funded=100), AccountFactory()
    with transaction.atomic():
        batch = LedgerBatch(account_ids=[a.pk, b.pk])
        first = batch.transfer(from_account_id=a.pk, to_account_id=b.pk, amount=10)
        batch.flush()
        second = batch.transfer(from_account_id=b.pk, to_account_id=a.pk, amount=4)
        batch.flush()
    assert (fresh(a).balance, fresh(b).balance) == (94, 6)
    assert postings(first) == [(a.pk, -10), (b.pk, 10)]
    assert postings(second) == [(b.pk, -4), (a.pk, 4)]
    after = Posting.objects.filter(entry__in=[first, second]).order_by("pk")
    assert list(after.values_list("balance_after", flat=True)) == [90, 10, 6, 94]
    assert reconcile().ok
