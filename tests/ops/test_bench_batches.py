"""The capacity report's batch column: how many transactions ran payments in a
step's window, their mean size, and the worker CPU each.

A step's worker CPU per payment is about (cost per batch) / (payments per
batch) + (cost per payment); this column is what tells the two apart when a
step costs more per payment than the drain. It is read from the Prometheus
multiprocess directory, written here by the service's own ``record_chunk`` in
processes of their own, as the payment workers write it: a renamed metric or a
``record_chunk`` that stopped observing fails here, not as a silent "-" in the
next report.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

from bench.harness.metrics import multiprocess_histogram_totals
from bench.harness.report import capacity_markdown
from bench.scenarios.capacity import BATCH_SIZE_METRIC, batch_report

ROOT = Path(__file__).resolve().parents[2]
# a capacity run's report (two steps, with the batch column) to render
REPORT = ROOT / "bench/results/2026-11-28-s30-batches/report.json"

RECORD = """
import sys
from types import SimpleNamespace
from payments.metrics import record_chunk
for chunk in sys.argv[1:]:
    size, stale, busy, collapsed = map(int, (chunk + "/1/0/0").split("/")[:4])
    record_chunk(SimpleNamespace(
        completed=["p"] * size, failed=[], failure_codes=[], lateness_seconds=[],
        stale=["s"] * stale, busy=["b"] * busy, collapsed=["c"] * collapsed,
        partitions_not_collapsed=0,
    ))
"""


def record(tmp_path, *chunks: int | str) -> None:
    """One worker-like process recording chunks: each a number of payments (0: a
    message whose payments were all stale) with one stale item, or
    ``"payments/stale/busy/collapsed"``."""
    subprocess.run(
        [sys.executable, "-c", RECORD, *map(str, chunks)],
        env={**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
        cwd=ROOT,
        check=True,
    )


def test_totals_add_up_every_worker_s_batches_and_skip_empty_messages(tmp_path):
    assert multiprocess_histogram_totals(str(tmp_path), BATCH_SIZE_METRIC) is None
    record(tmp_path, 40, 45)
    assert multiprocess_histogram_totals(str(tmp_path), BATCH_SIZE_METRIC) == (2, 85)
    record(tmp_path, 200, 0)
    assert multiprocess_histogram_totals(str(tmp_path), BATCH_SIZE_METRIC) == (3, 285)
    assert multiprocess_histogram_totals(str(tmp_path), "payments_other_histogram") is None


def test_a_window_s_batches_are_the_difference_between_its_ends():
    assert batch_report((10, 400), (30, 1300), worker_cpu=0.9) == {
        "count": 20,
        "payments_per_batch": 45.0,
        "worker_ms_per_batch": 45.0,
    }


def test_before_the_first_batch_and_without_batches():
    assert batch_report(None, (4, 100), worker_cpu=0.2) == {
        "count": 4,
        "payments_per_batch": 25.0,
        "worker_ms_per_batch": 50.0,
    }
    assert batch_report((4, 100), (4, 100), worker_cpu=0.2) == {
        "count": 0,
        "payments_per_batch": None,
        "worker_ms_per_batch": None,
    }
    assert batch_report((4, 100), None, worker_cpu=0.2) is None


def cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def test_every_row_of_the_table_has_the_header_s_columns():
    """A run's steps, a skipped step, and a step from a report older than the column."""
    cap = json.loads(REPORT.read_text())["results"]["capacity"]
    run, _ = cap["ours"]
    old = copy.deepcopy(run)
    del old["batches"]
    cap["ours"] += [{"rate_per_second": 3000, "skipped": True}, old]
    lines = capacity_markdown(cap)
    header = lines.index(next(line for line in lines if line.startswith("| due rate")))
    table = lines[header : lines.index("", header)]
    width = len(cells(table[0]))
    assert [len(cells(row)) for row in table] == [width] * 6
    column = cells(table[0]).index("batches (payments each, worker ms each)")
    assert [cells(row)[column] for row in table[2:]] == [
        "400 (43.1, 15.675)",
        "1,421 (172, 39.697)",
        "",
        "-",
    ]


def test_the_window_s_batch_sizes_by_bucket(tmp_path):
    from bench.harness.metrics import multiprocess_histogram
    from bench.scenarios.capacity import bucket_counts

    before = multiprocess_histogram(str(tmp_path), BATCH_SIZE_METRIC)
    assert before is None and bucket_counts(None, None) is None
    record(tmp_path, 200)
    before = multiprocess_histogram(str(tmp_path), BATCH_SIZE_METRIC)
    record(tmp_path, 3, 40, 45, 180, 0)
    sizes = bucket_counts(before, multiprocess_histogram(str(tmp_path), BATCH_SIZE_METRIC))
    assert sizes["≤ 2"] == 0 and sizes["≤ 5"] == 1 and sizes["≤ 50"] == 3
    assert sizes["≤ 200"] == 4 and sizes["all"] == 4  # the 200 before the window left out


def test_a_snapshot_reads_as_the_directory_did_when_it_was_taken(tmp_path):
    """One read of the multiprocess directory a window edge (``multiprocess_snapshot``)
    gives each reader what reading the directory itself gave at that moment."""
    from bench.harness.metrics import (
        multiprocess_counters,
        multiprocess_histogram,
        multiprocess_snapshot,
    )
    from bench.scenarios.capacity import CONTENTION_COUNTERS

    path, counters = str(tmp_path), list(CONTENTION_COUNTERS.values())
    record(tmp_path, 40, "45/2/3/5")
    snapshot = multiprocess_snapshot(path)
    readers = [
        lambda source: multiprocess_histogram_totals(source, BATCH_SIZE_METRIC),
        lambda source: multiprocess_histogram(source, BATCH_SIZE_METRIC),
        lambda source: multiprocess_counters(source, counters),
    ]
    then = [read(path) for read in readers]
    assert then[0] == (2, 85) and then[2]["payments_collapsed_total"] == 5
    assert [read(snapshot) for read in readers] == then
    record(tmp_path, 200)
    assert [read(snapshot) for read in readers] == then  # a copy, not a view
    assert multiprocess_histogram_totals(path, BATCH_SIZE_METRIC) == (3, 285)
    assert multiprocess_histogram(snapshot, "payments_other_histogram") is None


def test_the_lateness_cell_shows_the_commit_s_where_recorded():
    """Lateness to the commit (track_commit_timestamp on) beside lateness to the
    lock; a step of a run without commit times shows the lock's alone."""
    cap = json.loads(REPORT.read_text())["results"]["capacity"]
    run, _ = cap["ours"]
    with_commit = copy.deepcopy(run)
    with_commit["lateness_to_commit_seconds"] = {"p50": 0.2, "p95": 0.5, "p99": 0.95}
    cap["ours"] = [run, with_commit]
    lines = capacity_markdown(cap)
    header = lines.index(next(line for line in lines if line.startswith("| due rate")))
    column = cells(lines[header]).index("lateness p50 / p95 / p99 (s) [to the commit]")
    without, recorded = (cells(row)[column] for row in lines[header + 2 : header + 4])
    assert "[" not in without
    assert recorded == without + " [0.2 / 0.5 / 0.95]"
