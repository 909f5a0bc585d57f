"""The capacity report's database-work table: PostgreSQL's own counters
(buffer accesses, WAL, commits) over a step's window, a payment executed.

CPU seconds move with the host; these counts do not, so a step that costs the
database more a payment can be told apart from a host that charged more. A
counter read from the wrong view, a delta taken the wrong way round or a table
that lost a column fails here, not as a plausible number in a report.
"""

from __future__ import annotations

import copy
import json

import pytest
from django.db import connection

from bench.harness import dbwork
from bench.harness.report import capacity_markdown, database_work_line, relation_lines
from tests.factories import AccountFactory
from tests.ops.test_bench_batches import REPORT, cells

postgresql_only = pytest.mark.skipif(
    connection.vendor != "postgresql", reason="PostgreSQL's statistics views"
)


def flush_stats() -> None:
    """This backend's pending statistics into the shared counters now (PostgreSQL
    15 reports them at most once a second otherwise)."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_stat_force_next_flush()")
        cursor.execute("SELECT 1")  # the flush happens at this statement's end


@postgresql_only
@pytest.mark.django_db(transaction=True)
def test_a_window_counts_the_commits_pages_and_wal_of_its_work():
    flush_stats()
    before = dbwork.mark()
    for _ in range(5):
        AccountFactory()  # five transactions, each writing rows (autocommit)
    flush_stats()
    after = dbwork.mark()
    work = dbwork.report(before, after, executed=5)
    assert work["commits"] >= 5
    tables = {name: heap + indexes for name, heap, indexes in work["tables_per_payment"]}
    assert tables.get("ledger_account", 0) > 0  # the five INSERTs' pages
    assert work["buffer_accesses"] > 0 and 0 <= work["buffer_reads"] <= work["buffer_accesses"]
    assert work["wal_records"] >= 5 and work["wal_mb"] >= 0
    assert work["buffers_per_payment"] == round(work["buffer_accesses"] / 5, 1)
    assert work["commits_per_payment"] == round(work["commits"] / 5, 4)
    sizes = dbwork.table_sizes()
    assert sizes["shared_buffers_mb"] > 0 and sizes["payment_heap_mb"] >= 0


def test_report_is_after_minus_before_per_payment():
    before = dbwork.Counters(100, 1, 1_000, 10, 50, 2, 8_192)
    after = dbwork.Counters(110, 3, 5_000, 410, 250, 22, 8_192 + 3 * dbwork.MB)
    assert dbwork.report(before, after, executed=200) == {
        "executed": 200,
        "commits": 10,
        "rollbacks": 2,
        "buffer_accesses": 4_400,
        "buffer_reads": 400,
        "read_share": 0.0909,
        "wal_records": 200,
        "wal_fpi": 20,
        "wal_mb": 3.0,
        "buffers_per_payment": 22.0,
        "reads_per_payment": 2.0,
        "wal_bytes_per_payment": 15_729.0,
        "wal_fpi_per_payment": 0.1,
        "commits_per_payment": 0.05,
        "tables_per_payment": [],
        "indexes_per_payment": [],
    }
    idle = dbwork.report(before, before, executed=0)
    assert idle["read_share"] is None and idle["buffers_per_payment"] is None


def test_the_busiest_relations_per_payment():
    before = dbwork.Counters(
        *(0,) * 7,
        tables={"payments_payment": (1_000, 2_000), "ledger_posting": (10, 10)},
        indexes={"payments_payment_pkey": 500},
    )
    after = dbwork.Counters(
        *(0,) * 7,
        tables={
            "payments_payment": (3_000, 8_000),  # 2,000 + 6,000
            "ledger_posting": (4_010, 4_010),  # 4,000 + 4,000: as many, ranked by name
            "ledger_account": (50, 0),  # new since before
        },
        indexes={"payments_payment_pkey": 4_500, "ledger_posting_pkey": 100},
    )
    work = dbwork.report(before, after, executed=100)
    assert work["tables_per_payment"] == [
        ["ledger_posting", 40.0, 40.0],
        ["payments_payment", 20.0, 60.0],
        ["ledger_account", 0.5, 0.0],
    ]
    assert work["indexes_per_payment"] == [
        ["payments_payment_pkey", 40.0],
        ["ledger_posting_pkey", 1.0],
    ]
    untouched = dbwork.Counters(*(0,) * 7, tables={"django_session": (5, 5)})
    assert dbwork.report(untouched, untouched, 1)["tables_per_payment"] == []
    many = {f"t{i}": (i, 0) for i in range(20)}
    ranked = dbwork.report(dbwork.Counters(*(0,) * 7), dbwork.Counters(*(0,) * 7, tables=many), 1)
    assert [name for name, *_ in ranked["tables_per_payment"]] == [
        f"t{i}" for i in range(19, 19 - dbwork.TOP, -1)
    ]
    assert dbwork.report(before, after, executed=0)["tables_per_payment"] == []
    assert relation_lines("1,000/s", work) == [
        "- 1,000/s, buffer accesses a payment by table (heap + indexes): ledger_posting 40 + 40, "
        "payments_payment 20 + 60, ledger_account 0.5 + 0",
        "- 1,000/s, by index: payments_payment_pkey 40, ledger_posting_pkey 1",
    ]
    assert relation_lines("1,000/s", {"tables_per_payment": [], "indexes_per_payment": []}) == []


def work_since_zero(after, executed, *, heap_mb, indexes_mb) -> dict:
    """A report's ``database_work`` as the scenarios build it: counters from zero to
    ``after``, and the table's sizes against 128 MB of shared_buffers."""
    return {
        **dbwork.report(dbwork.Counters(*(0,) * 7), after, executed),
        "payment_heap_mb": heap_mb,
        "payment_indexes_mb": indexes_mb,
        "shared_buffers_mb": 128.0,
    }


def test_the_table_has_a_row_per_measured_step():
    cap = json.loads(REPORT.read_text())["results"]["capacity"]
    assert not any("database_work" in step for step in cap["ours"])
    assert "shared_buffers (MB)" not in "\n".join(capacity_markdown(cap))  # older reports
    run, _ = cap["ours"]
    measured = copy.deepcopy(run)
    measured["database_work"] = work_since_zero(
        dbwork.Counters(50, 0, 9_000, 1_000, 700, 30, 600_000), 100, heap_mb=210.5, indexes_mb=97.25
    )
    cap["ours"] += [{"rate_per_second": 3000, "skipped": True}, measured]
    lines = capacity_markdown(cap)
    header = lines.index(next(line for line in lines if "shared_buffers (MB)" in line))
    table = lines[header : lines.index("", header)]
    assert len(table) == 3  # header, rule, the one measured step
    assert len(cells(table[2])) == len(cells(table[0]))
    assert cells(table[2]) == [
        *("100", "100", "10 (10.0 %)", "6,000", "0.3", "0.5", "210 + 97.25", "128")
    ]


def test_the_drain_s_line():
    assert database_work_line(None) == []
    work = work_since_zero(
        dbwork.Counters(600, 0, 3_975_000, 25_000, 900_000, 1_000, 500_000_000),
        100_000,
        heap_mb=61.0,
        indexes_mb=30.5,
    )
    assert database_work_line(work) == [
        "- PostgreSQL a payment: 40 buffer accesses (0.25 missed shared_buffers), 5,000 WAL "
        "bytes, 0.01 full-page images, 0.006 commits; payments_payment 61 + 30.5 MB (heap + "
        "indexes) against shared_buffers 128 MB"
    ]
    work["tables_per_payment"] = [["payments_payment", 37.0, 45.7]]
    assert database_work_line(work, "the hot")[1:] == [
        "- the hot, buffer accesses a payment by table (heap + indexes): payments_payment 37 + 45.7"
    ]


@postgresql_only
@pytest.mark.django_db
def test_api_cost_counts_the_server_s_cpu_a_call():
    """bench/api_cost.py's PostgreSQL column: the server's CPU over the measured
    calls, per call — work done in the database shows there, not in the
    calling process's own CPU."""
    from bench.scenarios.api_cost import measure

    def heavy():
        with connection.cursor() as cursor:
            cursor.execute("SELECT count(*) FROM generate_series(1, 300000)")

    def light():
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")

    busy, idle = measure(heavy, 10), measure(light, 10)
    assert busy["postgres_cpu_ms_mean"] >= 5 * max(idle["postgres_cpu_ms_mean"], 1)
    assert busy["postgres_cpu_ms_mean"] > 3 * busy["cpu_ms_mean"]
