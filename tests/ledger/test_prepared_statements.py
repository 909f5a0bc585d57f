"""Server-side prepared statements for the batch statements (settings:
``DB_PREPARE_THRESHOLD``; ``ledger.db.binary_cursor``).

A warm connection sends the executor's batch statements as prepared
statements, so PostgreSQL parses them once per connection; the query log
still shows what was sent; the generic plan PostgreSQL may settle on for a
batch update still fetches its rows by key; ``off`` turns it all off."""

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from ledger.db import bulk_update_rows, plan_for_cached_data
from ledger.models import Hold
from scheduler_project.settings.base import prepare_threshold
from tests.factories import AccountFactory
from tests.plans import index_scan, node_types

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]

HOLDS = 100_000
BATCH = 800  # a chunk (200) and the collapse limit (600)


@pytest.mark.parametrize(
    ("value", "expected"),
    [("5", 5), ("0", 0), (" 12 ", 12), ("off", None), ("OFF", None), ("none", None), ("", None)],
)
def test_the_threshold_setting(value, expected):
    assert prepare_threshold(value) == expected


@pytest.mark.parametrize("value", ["-1", "five", "1.5"])
def test_a_bad_threshold_stops_start_up(value):
    from django.core.exceptions import ImproperlyConfigured

    with pytest.raises(ImproperlyConfigured, match="DB_PREPARE_THRESHOLD"):
        prepare_threshold(value)


def test_the_suite_runs_what_production_runs():
    """The default (5) is what the suite's connections get."""
    connection.ensure_connection()
    assert connection.connection.prepare_threshold == 5


def prepared_statements() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def touch(holds) -> None:
    for hold in holds:
        hold.resolved_at = timezone.now()
    bulk_update_rows(holds, ["resolved_at"])


def test_a_warm_connection_prepares_the_batch_update_and_logs_its_sql():
    account = AccountFactory()
    holds = [Hold.objects.create(account=account, amount=1, reference=f"h{n}") for n in range(3)]
    runs = connection.connection.prepare_threshold + 1
    with CaptureQueriesContext(connection) as ctx:
        for _ in range(runs):
            touch(holds)
    updates = [s for s in prepared_statements() if s.startswith("UPDATE") and "ledger_hold" in s]
    assert len(updates) == 1, prepared_statements()
    sent = [q["sql"] for q in ctx.captured_queries]
    # every run is in the log with its text, the prepared ones too
    assert len(sent) == runs and all(sql and sql.startswith("UPDATE") for sql in sent), sent
    assert len(set(sent)) == 1 and "$1" in sent[-1]
    assert all(hold.resolved_at is not None for hold in Hold.objects.filter(account=account))


def test_with_the_threshold_off_nothing_is_prepared(monkeypatch):
    account = AccountFactory()
    holds = [Hold.objects.create(account=account, amount=1, reference="h")]
    connection.ensure_connection()
    monkeypatch.setattr(connection.connection, "prepare_threshold", None)
    before = set(prepared_statements())
    for _ in range(10):
        touch(holds)
    assert set(prepared_statements()) == before


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
        cursor.execute("ANALYZE ledger_hold")
    ids = list(Hold.objects.order_by("?").values_list("pk", flat=True)[:BATCH])
    return list(Hold.objects.filter(pk__in=ids))


def test_the_generic_plan_of_a_batch_update_fetches_its_rows_by_key(holds):
    """Once prepared, PostgreSQL may run a statement on a generic plan, made
    without the parameters' values (``plan_cache_mode`` auto switches after five
    executions if it looks no dearer), so its unnest is costed at a guess. The
    plan the executor's transaction would get is forced and explained here, on
    the very statement psycopg prepared, with a batch of 800 among 100,000."""
    sent = []

    def record(execute, sql, params, many, context):
        sent.append(params)
        return execute(sql, params, many, context)

    with connection.cursor() as cursor:  # as a server left at the default
        cursor.execute("SET LOCAL random_page_cost = 4")
    with transaction.atomic():
        plan_for_cached_data()
        with connection.cursor() as cursor:
            cursor.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        with connection.execute_wrapper(record):
            for _ in range(connection.connection.prepare_threshold + 1):
                touch(holds)
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT name FROM pg_prepared_statements"
                " WHERE statement LIKE 'UPDATE%%ledger_hold%%' AND generic_plans > 0"
            )
            (name,) = cursor.fetchone()
        # EXECUTE takes no bound parameters: the arrays go in as literals
        placeholders = ", ".join(["%s"] * len(sent[-1]))
        with connection.cursor() as cursor:
            cursor.execute(
                f"EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE {name}({placeholders})", sent[-1]
            )
            plan = cursor.fetchone()[0][0]["Plan"]
    scan = index_scan(plan, "ledger_hold_pkey")
    assert scan is not None and "Seq Scan" not in node_types(plan), plan
    assert scan["Actual Loops"] * scan["Actual Rows"] == BATCH
