"""Plan regression: an account statement page is one backward range of
``ledger_posting_statement`` (account, id) starting at the cursor, whatever
the depth, not a walk down the primary key filtering out other accounts.
Real rows and fresh statistics, no planner switches."""

import json

import pytest
from django.db import connection

from ledger.models import Posting
from ledger.selectors import account_statement
from tests.factories import AccountFactory
from tests.plans import captured_sql, explain, index_scan, node_types

pytestmark = pytest.mark.django_db

ENTRIES = 20_000
LIMIT = 100


def _insert_entries(pairs: list[tuple[int, int]]) -> None:
    """``ENTRIES`` balanced transfers cycling over ``pairs`` (two postings each).

    Raw SQL for speed; the test transaction never commits, so the deferred
    zero-sum trigger never runs (the entries are balanced anyway).
    """
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH entries AS (
                INSERT INTO ledger_journalentry (kind, reference, description, created_at)
                SELECT 'transfer', NULL, '', now() FROM generate_series(1, %(n)s)
                RETURNING id
            )
            INSERT INTO ledger_posting (entry_id, account_id, amount, balance_after)
            SELECT id, (%(debits)s::bigint[])[1 + id %% %(k)s], -1, 0 FROM entries
            UNION ALL
            SELECT id, (%(credits)s::bigint[])[1 + id %% %(k)s], 1, 0 FROM entries
            """,
            {
                "n": ENTRIES,
                "debits": [d for d, _ in pairs],
                "credits": [c for _, c in pairs],
                "k": len(pairs),
            },
        )


def _plan(**kwargs) -> dict:
    sql = captured_sql(lambda: account_statement(limit=LIMIT + 1, **kwargs))
    return explain(sql, "ledger_posting", "ledger_journalentry")


def _assert_reads_one_page(plan: dict) -> dict:
    assert "Sort" not in node_types(plan), json.dumps(plan, indent=1)
    scan = index_scan(plan, "ledger_posting_statement")
    assert scan is not None, json.dumps(plan, indent=1)
    assert scan["Node Type"] == "Index Scan" and scan["Scan Direction"] == "Backward", scan
    assert scan["Actual Rows"] == LIMIT + 1 and scan.get("Rows Removed by Filter", 0) == 0, scan
    return scan


def test_statement_page_1_and_deep_page_read_one_page_backward():
    """A busy account (one leg in five) among 20 others: a deep page must start
    at the cursor in the statement index, not scan the primary key down from
    the cursor discarding the other accounts' postings."""
    busy = AccountFactory().pk
    others = [AccountFactory().pk for _ in range(20)]
    pairs = [(busy if i % 5 == 0 else others[i], others[(i + 7) % 20]) for i in range(20)]
    _insert_entries(pairs)
    _assert_reads_one_page(_plan(account_id=busy))
    ids = list(
        Posting.objects.filter(account_id=busy)
        .order_by("-pk")
        .values_list("pk", flat=True)[3_000 : 3_000 + LIMIT + 1]
    )
    deep = _assert_reads_one_page(_plan(account_id=busy, before_posting_id=ids[0]))
    assert "id <" in deep["Index Cond"].replace('"', ""), deep
    rows = account_statement(account_id=busy, before_posting_id=ids[0], limit=LIMIT)
    assert [p.pk for p in rows] == ids[1:]
