"""Multiprocess metric files named per host and process (``scheduler_project.metrics_files``)."""

import os

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, multiprocess, values

from scheduler_project import metrics_files


@pytest.fixture
def metrics_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    monkeypatch.setattr(values, "ValueClass", values.ValueClass)  # restored afterwards
    return tmp_path


def _as_host(monkeypatch, host):
    monkeypatch.setattr(metrics_files, "_HOST", metrics_files._file_safe(host))
    metrics_files.use_host_scoped_files()  # a new process on that host, same PID


def _collect(path):
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry, path=str(path))
    return {s.name: s for m in registry.collect() for s in m.samples}


def test_two_containers_with_one_pid_write_files_of_their_own(metrics_dir, monkeypatch):
    """Both replicas are PID 1 in their containers: their counts add up instead of
    the second overwriting the first's file."""
    for host, amount in (("c0ffee", 3), ("beef_42", 4)):
        _as_host(monkeypatch, host)
        Counter("chunks", "test", registry=None).inc(amount)

    pid = os.getpid()
    assert sorted(p.name for p in metrics_dir.iterdir()) == [
        f"counter_beef-42-{pid}.db",
        f"counter_c0ffee-{pid}.db",
    ]
    assert _collect(metrics_dir)["chunks_total"].value == 7


def test_a_gauge_keeps_its_process_label_and_goes_when_its_process_dies(metrics_dir, monkeypatch):
    _as_host(monkeypatch, "c0ffee")
    Gauge("busy", "test", registry=None, multiprocess_mode="liveall").set(1)
    sample = _collect(metrics_dir)["busy"]
    assert sample.labels == {"pid": f"c0ffee-{os.getpid()}"}

    metrics_files.mark_process_dead(os.getpid())

    assert "busy" not in _collect(metrics_dir)


def test_outside_multiprocess_mode_nothing_changes(monkeypatch):
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    before = values.ValueClass
    metrics_files.use_host_scoped_files()
    metrics_files.mark_process_dead(os.getpid())  # no directory to touch: no error
    assert values.ValueClass is before
