"""The bench's payment-worker role: several processes that stand or fall as one
(``bench.harness.processes.one_role``), each guarded in chaos runs."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time

import pytest

from bench.harness.processes import one_role, payment_workers


def _start(commands, tmp_path):
    return subprocess.Popen(one_role(commands), cwd=tmp_path, start_new_session=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as stat:  # a zombie is not alive
        return stat.read().split(") ")[1][0] != "Z"


def _children(tmp_path, count, deadline=10.0):
    """PIDs the commands wrote (each ``echo $$ > N.pid`` before its exec)."""
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        files = sorted(tmp_path.glob("*.pid"))
        if len(files) == count and all(f.read_text().strip() for f in files):
            return [int(f.read_text()) for f in files]
        time.sleep(0.02)
    raise AssertionError("the role's processes did not start")


def _sleeper(n: int, then: str = "exec sleep 60") -> list[str]:
    return ["sh", "-c", f"echo $$ > {n}.pid; {then}"]


def test_when_one_process_exits_the_role_ends_with_its_status(tmp_path):
    """A payment worker that dies is seen: the role exits (chaos restarts it)
    instead of running on at half strength while it looks alive."""
    role = _start([_sleeper(1), _sleeper(2, "sleep 0.5; exit 3")], tmp_path)
    survivor, _ = _children(tmp_path, 2)
    assert role.wait(20) == 3
    assert not _alive(survivor)


def test_a_sigterm_to_the_group_stops_every_process_and_the_role(tmp_path):
    role = _start([_sleeper(1), _sleeper(2)], tmp_path)
    pids = _children(tmp_path, 2)
    os.killpg(role.pid, signal.SIGTERM)
    role.wait(20)
    assert not any(_alive(pid) for pid in pids)


@pytest.mark.skipif(not shutil.which("setpriv"), reason="setpriv (util-linux) not installed")
def test_guarded_workers_die_with_their_shell(tmp_path):
    """Chaos guards every process with a parent-death signal. Inside the role each
    worker is guarded itself: if the shell is killed alone (its harness died and
    the guard killed it), the workers go too, not on as orphans."""
    from bench.chaos.faults import _guarded

    role = _start([_guarded(_sleeper(1)), _guarded(_sleeper(2))], tmp_path)
    pids = _children(tmp_path, 2)
    os.kill(role.pid, signal.SIGKILL)  # the shell alone, not its group
    role.wait(10)
    end = time.monotonic() + 10
    while any(_alive(pid) for pid in pids) and time.monotonic() < end:
        time.sleep(0.05)
    assert not any(_alive(pid) for pid in pids)


def test_each_payment_worker_runs_under_the_guard():
    def guard(args):
        return ["guard", *args]

    script = payment_workers(2, "worker", "INFO", guard=guard)[-1]
    assert script.count("guard ") == 2
    assert script.count("--pool solo") == 2
    assert "-n worker.1@%h" in script and "-n worker.2@%h" in script
