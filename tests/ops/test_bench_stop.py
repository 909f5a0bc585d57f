"""A benchmark run stopped with SIGTERM puts back what it changed.

``bench/run.py`` changes the shared PostgreSQL server's settings for the run
(``server_settings``) and each scenario, in a child process, starts the
service's processes (``Service``); both are undone on the way out. A plain
``kill`` of the run skipped that: the server kept the run's autovacuum and WAL
size (seen: the CI suite then ran against them) and the child was killed
before it could stop its services.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from bench import run as bench_run

# A stand-in scenario: says it started, then waits; on SIGTERM (as the real
# scenario process does, through ``stop_on_sigterm``) its cleanup runs.
FAKE_SCENARIO = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from bench.run import stop_on_sigterm

    stop_on_sigterm()
    folder = Path(sys.argv[-1])
    (folder / "started").write_text("")
    try:
        time.sleep(60)
    finally:
        (folder / "cleaned up").write_text("")
    """
)


@pytest.fixture
def sigterm_handler_restored():
    before = signal.getsignal(signal.SIGTERM)
    yield
    signal.signal(signal.SIGTERM, before)


def _wait_for(path: Path, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


def test_sigterm_runs_the_cleanup_of_a_run(tmp_path, sigterm_handler_restored):
    script = tmp_path / "stopped.py"
    script.write_text(FAKE_SCENARIO)
    proc = subprocess.Popen(
        [sys.executable, str(script), str(tmp_path)],
        cwd=bench_run.ROOT,
        env={**os.environ, "PYTHONPATH": str(bench_run.ROOT)},
    )
    _wait_for(tmp_path / "started")
    proc.terminate()
    assert proc.wait(30) == 128 + signal.SIGTERM
    assert (tmp_path / "cleaned up").exists()


def test_a_stopped_run_stops_its_scenario_process_gently(
    tmp_path, monkeypatch, sigterm_handler_restored
):
    """The run's SIGTERM reaches the scenario as a SIGTERM (not a SIGKILL), so
    the scenario stops the services it started."""
    _stop_the_run_once_the_scenario_started(tmp_path, monkeypatch, FAKE_SCENARIO)
    assert (tmp_path / "cleaned up").exists()


def _stop_the_run_once_the_scenario_started(tmp_path, monkeypatch, scenario: str) -> None:
    """Run ``scenario`` as the run's scenario process and, once it is under way,
    send the run its own SIGTERM: the run stops as SIGTERM stops it."""
    script = tmp_path / "scenario.py"
    script.write_text(scenario)
    monkeypatch.setattr(bench_run, "__file__", str(script))
    monkeypatch.setenv("PYTHONPATH", str(bench_run.ROOT))
    bench_run.stop_on_sigterm()
    sender = threading.Thread(
        target=lambda: (_wait_for(tmp_path / "started"), os.kill(os.getpid(), signal.SIGTERM)),
        daemon=True,
    )
    sender.start()
    with pytest.raises(SystemExit) as stopped:
        bench_run.run_scenario_subprocess("scenario", [str(tmp_path)], tmp_path)
    sender.join(5)
    assert stopped.value.code == 128 + signal.SIGTERM


# A scenario that does not stop when asked (its cleanup hangs, say).
STUBBORN_SCENARIO = textwrap.dedent(
    """
    import os, signal, sys, time
    from pathlib import Path

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    folder = Path(sys.argv[-1])
    (folder / "started").write_text(str(os.getpid()))
    time.sleep(120)
    """
)


def test_a_scenario_that_does_not_stop_is_killed_and_the_stop_still_raised(
    tmp_path, monkeypatch, sigterm_handler_restored
):
    monkeypatch.setattr(bench_run, "SCENARIO_STOP_SECONDS", 1)
    _stop_the_run_once_the_scenario_started(tmp_path, monkeypatch, STUBBORN_SCENARIO)
    pid = int((tmp_path / "started").read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # killed and reaped, not left running
