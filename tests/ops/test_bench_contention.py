"""The capacity report's contention column: lock waits sampled from
``pg_stat_activity`` over a step's window, and the executor's stale, collapsed
and busy chunk items from its counters.

Sessions 34 and 35 measured both with a script run beside the benchmark; the
column makes them part of every capacity run. A renamed counter, a sampler
that stopped seeing waits (a changed ``pg_stat_activity`` filter), or a
column that shifted the table fail here, not as a quiet zero in a report.
"""

from __future__ import annotations

import copy
import json
import threading
import time

import pytest
from django.db import connection, transaction

from bench.harness import lockwaits
from bench.harness.lockwaits import LockWaitSampler, statement_key
from bench.harness.metrics import multiprocess_counters
from bench.harness.report import capacity_markdown
from bench.scenarios.capacity import CONTENTION_COUNTERS
from tests.factories import AccountFactory
from tests.ops.test_bench_batches import REPORT, cells, record

NAMES = list(CONTENTION_COUNTERS.values())


def test_counters_add_up_every_worker_s_items(tmp_path):
    assert multiprocess_counters(str(tmp_path), NAMES) == dict.fromkeys(NAMES, 0.0)
    record(tmp_path, "40/2/3/5", "0/7/0/0")
    record(tmp_path, "10/0/1/11")
    assert multiprocess_counters(str(tmp_path), NAMES) == {
        "payments_stale_deliveries_total": 9,
        "payments_chunk_items_busy_total": 4,
        "payments_collapsed_total": 16,
    }


def test_statement_key_collapses_whitespace_and_cuts():
    query = "\n  SELECT id\n    FROM ledger_account   WHERE id = ANY($1) " + "x" * 100
    assert statement_key(query) == "SELECT id FROM ledger_account WHERE id = ANY($1) xxxxxxxxxxx"
    assert len(statement_key(query)) == lockwaits.STATEMENT_CHARS


def test_summary_of_samples():
    sampler = LockWaitSampler()
    assert sampler.summary() == {
        "samples": 0,
        "active_mean": None,
        "lock_waits_mean": None,
        "lock_wait_share": None,
        "top_waiters": [],
        "wait_events": [],
    }
    row = "Lock", "transactionid"
    sampler.record([(None, None, "SELECT 1"), (*row, "UPDATE a"), ("Lock", "tuple", "UPDATE  a")])
    sampler.record([(*row, "UPDATE b"), ("LWLock", "WALWrite", "COMMIT")])
    sampler.record([])
    sampler.record([(*row, "UPDATE a"), (*row, "UPDATE c"), (*row, "UPDATE d"), (*row, "x")])
    assert sampler.summary() == {
        "samples": 4,
        "active_mean": 2.25,
        "lock_waits_mean": 1.75,
        "lock_wait_share": round(7 / 9, 3),
        "top_waiters": [
            ["UPDATE a", round(3 / 7, 3)],
            ["UPDATE b", round(1 / 7, 3)],
            ["UPDATE c", round(1 / 7, 3)],
        ],
        "wait_events": [
            ["Lock:transactionid", round(6 / 9, 3)],
            ["running", round(1 / 9, 3)],
            ["Lock:tuple", round(1 / 9, 3)],
            ["LWLock:WALWrite", round(1 / 9, 3)],
        ],
    }


def blocked_backends() -> int:
    """Backends of this database waiting on a lock, as the test's own connection sees them."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND wait_event_type = 'Lock'"
        )
        return cursor.fetchone()[0]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_backend_waiting_on_a_held_row_is_seen_with_its_statement():
    account = AccountFactory().pk
    held, release, waiting_done = threading.Event(), threading.Event(), threading.Event()

    def holder():
        try:
            with transaction.atomic():
                with connection.cursor() as cursor:
                    cursor.execute(
                        "SELECT id FROM ledger_account WHERE id = %s FOR UPDATE", [account]
                    )
                held.set()
                release.wait(30)
        finally:
            connection.close()

    def waiter():
        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "UPDATE ledger_account SET updated_at = updated_at WHERE id = %s", [account]
                )
        finally:
            waiting_done.set()
            connection.close()

    threads = [threading.Thread(target=holder)]
    threads[0].start()
    assert held.wait(10)
    threads.append(threading.Thread(target=waiter))
    threads[1].start()
    deadline = time.monotonic() + 10
    while not blocked_backends() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert blocked_backends() == 1
    sampler = LockWaitSampler(interval=0.02)
    sampler.start()
    try:
        deadline = time.monotonic() + 10
        while sampler.samples < 20 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert not waiting_done.is_set()  # still blocked while sampled
        summary = sampler.stop()
    finally:
        release.set()
        for thread in threads:
            thread.join(30)
    assert waiting_done.is_set()
    assert "error" not in summary
    assert summary["samples"] >= 20
    # the waiter in every sample (the holder is idle in transaction, not active)
    assert summary["lock_waits_mean"] == 1.0
    assert summary["lock_wait_share"] == 1.0
    assert summary["wait_events"] == [["Lock:transactionid", 1.0]]
    (statement, share), *_ = summary["top_waiters"]
    assert statement.startswith("UPDATE ledger_account SET updated_at = updated_at WHERE id")
    assert share == 1.0


@pytest.mark.django_db(transaction=True)
def test_a_failing_sample_ends_the_sampling_and_is_reported(monkeypatch):
    monkeypatch.setattr(lockwaits, "SAMPLE_SQL", "SELECT * FROM no_such_table")
    with LockWaitSampler(interval=0.01) as sampler:
        sampler.join(10)
        assert not sampler.is_alive()  # ended by itself, before stop()
    summary = sampler.summary()
    assert summary["samples"] == 0
    assert "no_such_table" in summary["error"]


def test_the_contention_cell_of_a_step_and_of_a_report_older_than_it():
    cap = json.loads(REPORT.read_text())["results"]["capacity"]
    step, old = cap["ours"]
    step = copy.deepcopy(step)
    step["contention"] = {
        "lock_waits": {
            "samples": 480,
            "active_mean": 3.1,
            "lock_waits_mean": 0.4,
            "lock_wait_share": 0.1294,
            "top_waiters": [["SELECT id FROM ledger_account WHERE id = ANY(x) ORDER BY id", 0.81]],
        },
        "items": {"stale": 48_702, "collapsed": 45_210, "busy": 3_485},
    }
    quiet = copy.deepcopy(step)
    quiet["contention"]["lock_waits"] |= {"lock_wait_share": None, "top_waiters": []}
    failed = copy.deepcopy(step)
    failed["contention"]["lock_waits"] |= {"samples": 1_312, "error": "OperationalError: x"}
    cap["ours"] = [step, old, quiet, failed]
    lines = capacity_markdown(cap)
    header = lines.index(next(line for line in lines if line.startswith("| due rate")))
    table = lines[header : lines.index("", header)]
    assert len({len(cells(row)) for row in table}) == 1
    column = cells(table[0]).index("lock waits (top waiter); items stale / collapsed / busy")
    top = "12.9 % (`SELECT id FROM ledger_account WHERE id =` 81 %)"
    assert [cells(row)[column] for row in table[2:]] == [
        f"{top}; 48,702 / 45,210 / 3,485",
        "-",
        "-; 48,702 / 45,210 / 3,485",
        f"{top} **sampler failed after 1,312 samples**; 48,702 / 45,210 / 3,485",
    ]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_the_sampler_stops_when_its_window_raises():
    with pytest.raises(RuntimeError), LockWaitSampler(interval=0.01) as sampler:
        time.sleep(0.1)
        raise RuntimeError("the step failed")
    assert not sampler.is_alive()
    assert sampler.samples > 0 and "error" not in sampler.summary()


def test_the_wait_events_line():
    cap = json.loads(REPORT.read_text())["results"]["capacity"]
    first, _ = cap["ours"]
    assert not [line for line in capacity_markdown(cap) if "by wait event" in line]
    first["contention"] = {
        "lock_waits": {"wait_events": [["running", 0.7], ["LWLock:WALWrite", 0.13]]},
        "items": {"stale": 0, "collapsed": 0, "busy": 0},
    }
    (line,) = [line for line in capacity_markdown(cap) if "by wait event" in line]
    assert line.endswith(": 100/s running 70 %, LWLock:WALWrite 13 %")
