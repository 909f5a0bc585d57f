"""The database itself refuses to break the books, whatever the Python code does.

Each test bypasses the services with raw SQL and expects PostgreSQL to refuse.
``transaction=True``: the zero-sum trigger is deferred to COMMIT, which a
test wrapped in a never-committed transaction would never reach.
"""

import pytest
from django.db import IntegrityError, connection, transaction

from ledger import services as ledger
from ledger.models import Account, JournalEntry, Posting
from tests.factories import AccountFactory

# The triggers and constraints under test are PostgreSQL's (migration ledger 0002).
pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.postgres]


def sql(statement, params=()):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall() if cursor.description else None


def insert_entry(reference):
    return sql(
        "INSERT INTO ledger_journalentry (kind, reference, description, created_at)"
        " VALUES ('transfer', %s, '', now()) RETURNING id",
        [reference],
    )[0][0]


def insert_posting(entry_id, account_id, amount, balance_after=0):
    sql(
        "INSERT INTO ledger_posting (entry_id, account_id, amount, balance_after)"
        " VALUES (%s, %s, %s, %s)",
        [entry_id, account_id, amount, balance_after],
    )


def test_unbalanced_entry_rejected_at_commit():
    a, b = AccountFactory(), AccountFactory()
    with pytest.raises(IntegrityError, match="unbalanced"), transaction.atomic():
        entry_id = insert_entry("raw:unbalanced")
        insert_posting(entry_id, a.pk, -10)
        insert_posting(entry_id, b.pk, 9)
    assert not JournalEntry.objects.filter(reference="raw:unbalanced").exists()


def test_single_posting_entry_rejected():
    a = AccountFactory()
    with pytest.raises(IntegrityError, match="unbalanced"), transaction.atomic():
        insert_posting(insert_entry("raw:single"), a.pk, 5)


def test_entry_without_postings_rejected():
    with pytest.raises(IntegrityError, match="unbalanced"), transaction.atomic():
        insert_entry("raw:empty")


def test_balanced_raw_entry_commits():
    """The trigger is not simply rejecting everything."""
    a, b = AccountFactory(), AccountFactory()
    with transaction.atomic():
        entry_id = insert_entry("raw:balanced")
        insert_posting(entry_id, a.pk, -10)
        insert_posting(entry_id, b.pk, 10)
    assert Posting.objects.filter(entry_id=entry_id).count() == 2


def test_unbalanced_entry_rejected_immediately_when_constraints_immediate():
    a = AccountFactory()
    with pytest.raises(IntegrityError, match="unbalanced"), transaction.atomic():
        entry_id = insert_entry("raw:immediate")
        insert_posting(entry_id, a.pk, -10)
        sql("SET CONSTRAINTS ALL IMMEDIATE")
        pytest.fail("SET CONSTRAINTS ALL IMMEDIATE should have fired the trigger")


@pytest.fixture
def posted_entry():
    a, b = AccountFactory(funded=100), AccountFactory()
    return ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=40)


def test_editing_a_posting_is_rejected(posted_entry):
    posting = posted_entry.postings.first()
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        sql("UPDATE ledger_posting SET amount = amount * 2 WHERE id = %s", [posting.pk])
    assert Posting.objects.get(pk=posting.pk).amount == posting.amount


def test_deleting_a_posting_is_rejected(posted_entry):
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        sql("DELETE FROM ledger_posting WHERE entry_id = %s", [posted_entry.pk])
    assert posted_entry.postings.count() == 2


def test_editing_or_deleting_an_entry_is_rejected(posted_entry):
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        sql("UPDATE ledger_journalentry SET reference = 'x' WHERE id = %s", [posted_entry.pk])
    with pytest.raises(IntegrityError, match="append-only"), transaction.atomic():
        sql("DELETE FROM ledger_journalentry WHERE id = %s", [posted_entry.pk])


def test_negative_balance_rejected():
    a = AccountFactory(funded=100)
    with (
        pytest.raises(IntegrityError, match="ledger_account_available_nonnegative"),
        transaction.atomic(),
    ):
        sql("UPDATE ledger_account SET balance = -1 WHERE id = %s", [a.pk])
    assert Account.objects.get(pk=a.pk).balance == 100


def test_held_beyond_balance_rejected():
    a = AccountFactory(funded=100)
    with (
        pytest.raises(IntegrityError, match="ledger_account_available_nonnegative"),
        transaction.atomic(),
    ):
        sql("UPDATE ledger_account SET held = 101 WHERE id = %s", [a.pk])
    with (
        pytest.raises(IntegrityError, match="ledger_account_held_nonnegative"),
        transaction.atomic(),
    ):
        sql("UPDATE ledger_account SET held = -1 WHERE id = %s", [a.pk])


def test_only_system_accounts_may_go_negative():
    a = AccountFactory()
    with (
        pytest.raises(IntegrityError, match="ledger_account_negative_only_system"),
        transaction.atomic(),
    ):
        sql("UPDATE ledger_account SET allow_negative = true WHERE id = %s", [a.pk])


def test_reference_is_unique_in_the_database():
    a, b = AccountFactory(), AccountFactory()
    with transaction.atomic():
        entry_id = insert_entry("payment:dup")
        insert_posting(entry_id, a.pk, -1)
        insert_posting(entry_id, b.pk, 1)
    with pytest.raises(IntegrityError, match="reference"), transaction.atomic():
        insert_entry("payment:dup")


def test_system_accounts_are_always_active():
    issuance = ledger.issuance_account()
    for status in ("frozen", "closed"):
        with (
            pytest.raises(IntegrityError, match="ledger_account_system_active"),
            transaction.atomic(),
        ):
            sql("UPDATE ledger_account SET status = %s WHERE id = %s", [status, issuance.pk])
    a = AccountFactory()
    sql("UPDATE ledger_account SET status = 'frozen' WHERE id = %s", [a.pk])  # clients may be


def test_an_existing_account_is_never_saved_whole_nor_its_money():
    """The admin's change form once saved an Account whole and wrote back a stale
    balance: the model refuses any save of an existing account that could."""
    account = AccountFactory(funded=100)
    stale = Account.objects.get(pk=account.pk)
    for kwargs in ({}, {"update_fields": ["name", "balance"]}, {"update_fields": ["held"]}):
        with pytest.raises(ValueError, match="update_fields"):
            stale.save(**kwargs)
    stale.name = "renamed"
    stale.save(update_fields=["name"])
    assert Account.objects.values_list("name", "balance").get(pk=account.pk) == (
        "renamed",
        100,
    )
