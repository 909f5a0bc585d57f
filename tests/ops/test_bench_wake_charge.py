"""The benchmark's wake probe (``bench.harness.report.wake_charge_us``): the CPU the
OS charges a thread for one sleep and wake, recorded beside the speed probe so a
low-rate step's worker CPU is read against it (README, session 31)."""

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


def test_a_real_sleep_is_charged_less_than_it_lasts():
    assert 0 <= wake_charge_us(sleep=0.01, tries=3) < 10_000


def test_the_suite_report_shows_the_probe_and_says_when_a_run_has_none():
    report = json.loads(REPORT.read_text())
    assert "not recorded" in suite_markdown(report).split("sleep and wake")[1].split("\n")[0]
    report["wake_charge_us"] = {"before": 812.5, "after capacity": 2231.0}
    line = next(line for line in suite_markdown(report).splitlines() if "sleep and wake" in line)
    assert line.endswith("before 812.5, after capacity 2231.0")
