"""The capacity report's batch column: how many transactions ran payments in a
step's window, their mean size, and the worker CPU each.

A step's worker CPU per payment is about (cost per batch) / (payments per
batch) + (cost per payment); this column is what tells the two apart when a
step costs more per payment than the drain. It is read from the service's own
``payments_executor_batch_size`` histogram in the Prometheus multiprocess
directory, written here by real processes as the workers write it.
"""

from __future__ import annotations

import subprocess
import sys

from bench.harness.metrics import multiprocess_histogram_totals
from bench.harness.report import _batches
from bench.scenarios.capacity import BATCH_SIZE_METRIC, batch_report

OBSERVE = """
import sys
from prometheus_client import Histogram
h = Histogram(sys.argv[1], "test", buckets=(1, 10, 100))
for size in map(int, sys.argv[2:]):
    h.observe(size)
"""


def observe(tmp_path, *sizes: int) -> None:
    """One process (its own multiprocess file) observing ``sizes``."""
    subprocess.run(
        [sys.executable, "-c", OBSERVE, BATCH_SIZE_METRIC, *map(str, sizes)],
        env={"PROMETHEUS_MULTIPROC_DIR": str(tmp_path)},
        check=True,
    )


def test_totals_add_up_every_process_s_observations(tmp_path):
    assert multiprocess_histogram_totals(str(tmp_path), BATCH_SIZE_METRIC) is None
    observe(tmp_path, 40, 45)
    assert multiprocess_histogram_totals(str(tmp_path), BATCH_SIZE_METRIC) == (2, 85)
    observe(tmp_path, 200)
    assert multiprocess_histogram_totals(str(tmp_path), BATCH_SIZE_METRIC) == (3, 285)
    assert multiprocess_histogram_totals(str(tmp_path), "payments_other_histogram") is None


def test_a_window_s_batches_are_the_difference_between_its_ends():
    report = batch_report((10, 400), (30, 1300), worker_cpu=0.9)
    assert report == {"count": 20, "payments_per_batch": 45.0, "worker_ms_per_batch": 45.0}
    assert _batches({"batches": report}) == "20 (45, 45)"


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
    assert _batches({"batches": None}) == "-"
