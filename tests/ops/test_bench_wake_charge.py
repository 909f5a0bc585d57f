"""The benchmark's wake probe (``bench.harness.report.wake_charge_us``): the CPU the
OS charges a thread for one sleep and wake, recorded beside the speed probe so a
low-rate step's worker CPU is read against it (docs/performance-history.md,
session 31)."""

from __future__ import annotations

import json
from pathlib import Path

import bench.harness.report as report_module
from bench.harness.report import suite_markdown, wake_charge_us

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "bench/results/2026-11-28-s30-batches/report.json"


class FakeTime:
    """A thread clock that advances by the next charge at each sleep."""

    def __init__(self, charges):
        self.charges = list(charges)
        self.now = 0.0
        self.slept = []

    def thread_time(self):
        return self.now

    def sleep(self, seconds):
        self.slept.append(seconds)
        self.now += self.charges.pop(0)


def test_the_probe_is_the_median_charge_of_its_sleeps_in_microseconds(monkeypatch):
    clock = FakeTime([0.004, 0.000010, 0.0021, 0.0009, 0.0030])
    monkeypatch.setattr(report_module, "time", clock)
    assert wake_charge_us() == 2100.0  # not the mean (1,804), not the first or last
    assert clock.slept == [0.3] * 5


def test_a_real_sleep_gives_a_number():
    charged = wake_charge_us(sleep=0.01, tries=3)
    assert isinstance(charged, float)
    assert charged >= 0


def test_the_suite_report_shows_the_probe_and_says_when_a_run_has_none():
    report = json.loads(REPORT.read_text())
    assert "not recorded" in suite_markdown(report).split("sleep and wake")[1].split("\n")[0]
    report["wake_charge_us"] = {"before": 812.5, "after capacity": 2231.0}
    line = next(line for line in suite_markdown(report).splitlines() if "sleep and wake" in line)
    assert line.endswith("before 812.5, after capacity 2231.0")


# --- the payment workers' idle CPU and each step's cost above it ---------------------


def test_a_step_above_idle_takes_off_the_idle_rate_over_its_window():
    from bench.scenarios.capacity import above_idle_ms_per_payment

    # 7.2 s of worker CPU in a 120 s window, idle 20 ms/s (2.4 s of it), 18,000 payments
    assert above_idle_ms_per_payment(7.2, 120.0, 20.0, 18_000) == round(4.8 * 1000 / 18_000, 3)
    assert above_idle_ms_per_payment(7.2, 120.0, None, 18_000) is None
    assert above_idle_ms_per_payment(7.2, 120.0, 20.0, 0) is None


def test_the_idle_reading_is_the_workers_cpu_over_the_wait(monkeypatch):
    import bench.scenarios.capacity as capacity

    class Clock:
        """Wall time that passes only in sleeps (what the wait measured)."""

        now = 500.0

        def monotonic(self):
            return self.now

        def sleep(self, seconds):
            self.now += seconds + 0.05  # a wait that ran a little long

    readings = iter([10.0, 10.006])  # 6 ms of CPU in the wait
    monkeypatch.setattr(capacity, "tree_cpu_seconds", lambda pid: next(readings))
    monkeypatch.setattr(capacity, "time", Clock())
    # over the wall time the wait took (0.25 s), not the 0.2 s it asked for
    assert capacity.idle_worker_ms_per_second(12345, seconds=0.2) == 24.0


def test_the_report_shows_the_idle_rate_and_each_steps_cost_above_it():
    from bench.harness.report import capacity_markdown

    cap = json.loads(REPORT.read_text())["results"]["capacity"]
    assert not [line for line in capacity_markdown(cap) if "idle" in line]  # older runs: none
    cap["idle_worker_ms_per_second"] = 21.5
    cap["ours"][0]["worker_ms_per_payment_above_idle"] = 0.21
    cap["ours"][1]["worker_ms_per_payment_above_idle"] = 0.19
    (line,) = [line for line in capacity_markdown(cap) if "idle" in line]
    assert "21.5 ms of CPU a second" in line
    assert "100/s 0.21, 2,000/s 0.19" in line


def test_the_report_shows_postgresql_s_idle_rate_when_measured():
    from bench.harness.report import capacity_markdown

    cap = json.loads(REPORT.read_text())["results"]["capacity"]
    cap["idle_worker_ms_per_second"] = 21.5
    assert not [line for line in capacity_markdown(cap) if "PostgreSQL over" in line]
    cap["idle_postgres_ms_per_second"] = 38.25
    (line,) = [line for line in capacity_markdown(cap) if "PostgreSQL over" in line]
    assert "38.25 ms of CPU a second" in line


def test_cpu_a_second():
    from bench.scenarios.capacity import ms_per_second

    assert ms_per_second(0.9, 30.0) == 30.0
    assert ms_per_second(0.0125, 2.0) == 6.25
