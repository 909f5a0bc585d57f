"""Plan regression: a batch's ``UPDATE … FROM unnest(…)`` (``ledger.db.bulk_update_rows``)
fetches its rows by primary key inside the executor's transaction, not by
hashing the whole table (``ledger.db.CACHED_DATA_PLAN``).

Costed with PostgreSQL's default ``random_page_cost`` (4), a batch of 800
holds against a table of 100,000 is planned as a sequential scan of the table
into a hash: 26-29 ms against 6.5-7 ms by the key (measured on the bench's
drain database). Real rows and fresh statistics."""

import pytest
from django.db import connection, transaction
from django.utils import timezone

from ledger.db import CACHED_DATA_PLAN, bulk_update_rows, set_local
from ledger.models import Hold
from tests.factories import AccountFactory
from tests.plans import explain_call, index_scan, node_types

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

HOLDS = 100_000
BATCH = 800  # a chunk (200) and the collapse limit (600)


@pytest.fixture
def holds():
    """``HOLDS`` released holds on one account (raw SQL for speed; never committed)."""
    account = AccountFactory()
    with connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ledger_hold (account_id, amount, status, reference, resolved_at)"
            " SELECT %s, 1, 'released', '', now() FROM generate_series(1, %s)",
            [account.pk, HOLDS],
        )
    ids = list(Hold.objects.order_by("?").values_list("pk", flat=True)[:BATCH])
    return list(Hold.objects.filter(pk__in=ids))


def update(holds):
    for hold in holds:
        hold.resolved_at = timezone.now()
    return lambda: bulk_update_rows(holds, ["resolved_at"])


def test_the_executors_batch_update_fetches_its_rows_by_key(holds):
    with connection.cursor() as cursor:  # as a server left at the default
        cursor.execute("SET LOCAL random_page_cost = 4")
    with transaction.atomic():
        set_local(CACHED_DATA_PLAN)
        plan = explain_call(update(holds), "ledger_hold")
    scan = index_scan(plan, "ledger_hold_pkey")
    assert scan is not None and "Seq Scan" not in node_types(plan), plan
    assert scan["Actual Loops"] * scan["Actual Rows"] == BATCH


@pytest.mark.django_db(transaction=True)
def test_the_setting_ends_with_the_transaction():
    """``SET LOCAL``: a connection the pool hands on plans as it did."""
    with connection.cursor() as cursor:
        cursor.execute("SET random_page_cost = 4")  # as a server left at the default
        cursor.execute("SHOW random_page_cost")
        before = cursor.fetchone()[0]
        with transaction.atomic():
            set_local(CACHED_DATA_PLAN)
            cursor.execute("SHOW random_page_cost")
            assert cursor.fetchone()[0] == "1.1"
        cursor.execute("SHOW random_page_cost")
        assert cursor.fetchone()[0] == before
        cursor.execute("RESET random_page_cost")
