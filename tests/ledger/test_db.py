"""The bulk writers of ``ledger.db`` on PostgreSQL: what comes back on the objects,
and what the rows hold (the executor and the ledger flush write through them)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger.db import bulk_insert_rows
from ledger.models import EntryKind, JournalEntry, Posting
from payments.models import IdempotencyKey, IdempotencyStatus
from tests.factories import AccountFactory, UserFactory

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def entry(reference, **fields):
    return JournalEntry(kind=EntryKind.TRANSFER, reference=reference, **fields)


@pytest.fixture(autouse=True)
def balanced():
    """Give every entry a test writes two postings (the balance check runs at the
    test's end), with the same writer."""
    yield
    a, b = AccountFactory(), AccountFactory()
    bare = JournalEntry.objects.filter(postings__isnull=True)
    bulk_insert_rows(
        [
            Posting(entry=e, account=account, amount=amount, balance_after=0)
            for e in bare
            for account, amount in ((a, -1), (b, 1))
        ],
        read_back=False,
    )


@pytest.mark.parametrize("n", [1, 3])
def test_new_rows_come_back_saved_with_their_ids_and_database_defaults(n):
    entries = [entry(f"db:{i}") for i in range(n)]
    bulk_insert_rows(entries)
    stored = dict(
        JournalEntry.objects.filter(reference__startswith="db:").values_list("pk", "created_at")
    )
    assert {e.pk: e.created_at for e in entries} == stored
    assert None not in stored.values()
    assert [(e._state.adding, e._state.db) for e in entries] == [(False, "default")] * n


def test_a_batch_mixing_defaults_and_given_values_keeps_both():
    """Where some objects leave a database default and others give the value,
    each row gets its own (Django's bulk_create path)."""
    when = timezone.now() - timedelta(days=1)
    bulk_insert_rows([entry("mix:given", created_at=when), entry("mix:default")])
    stored = dict(
        JournalEntry.objects.filter(reference__startswith="mix:").values_list(
            "reference", "created_at"
        )
    )
    assert stored["mix:given"] == when
    assert stored["mix:default"] > when


def test_a_json_none_is_stored_as_sql_null():
    now = timezone.now()
    key = IdempotencyKey(
        client=UserFactory(),
        key="k",
        fingerprint="f",
        status=IdempotencyStatus.IN_FLIGHT,
        response_body=None,
        locked_at=now,
        created_at=now,
    )
    bulk_insert_rows([key], read_back=False)
    assert IdempotencyKey.objects.filter(response_body__isnull=True).count() == 1
