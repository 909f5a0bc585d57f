"""``scripts/dev`` as a newcomer runs it: the embedded default (SQLite + the atomic
file broker) under honcho with every real process, started twice.

Checks what the README promises of the first command: scheduled payments run
exactly once (balances move by exactly their sum) and never early, and the
ledger reconciles; ``/metrics`` adds up the workers' counters and the lateness
histogram with no setting made; a restart skips the package install and prints
the same demo token, which still works; an idle service writes no log line; the
``.env`` written on the first run is kept and lets a ``manage.py`` command in a
"second terminal" reach the same database.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from datetime import datetime
from pathlib import Path

import pytest

from tests.processes import ROOT, wait_until

pytestmark = pytest.mark.slow

# What scripts/test exports for the suite; the embedded default is what is left
# when none of them is set.
SUITE_ONLY = (
    "DATABASE_URL",
    "CELERY_BROKER_URL",
    "DJANGO_SETTINGS_MODULE",
    "SECRET_KEY",
    "DEBUG",
    "PROMETHEUS_MULTIPROC_DIR",
    "VAR_DIR",
    "ENV_FILE",
)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Dev:
    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.port = _free_port()
        self.env = {k: v for k, v in os.environ.items() if k not in SUITE_ONLY}
        self.env.update(
            VAR_DIR=str(tmp_path / "var"),
            ENV_FILE=str(tmp_path / ".env"),
            WEB_PORT=str(self.port),
            PYTHON=sys.executable,
            PYTHONUNBUFFERED="1",
        )
        self.proc: subprocess.Popen | None = None
        self.log: Path | None = None

    def start(self, run: int) -> None:
        self.log = self.tmp_path / f"dev-{run}.log"
        self.proc = subprocess.Popen(
            [str(ROOT / "scripts" / "dev")],
            cwd=ROOT,
            env=self.env,
            stdout=self.log.open("w"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(lambda: "Token:" in self.text(), 180, 0.5, "seed_demo's directions")
        wait_until(lambda: self.get("/healthz")[0] == 200, 60, 0.5, "the web server")

    def stop(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGINT)  # Ctrl-C: honcho stops every process
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log else ""

    def token(self) -> str:
        return re.search(r"^Token:\s+(\S+)", self.text(), re.M).group(1)

    def accounts(self) -> list[int]:
        return [int(a) for a in re.findall(r"^Account:\s+#(\d+)", self.text(), re.M)]

    def request(self, method: str, path: str, body: dict | None = None, token: str = ""):
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}",
            method=method,
            data=json.dumps(body).encode() if body is not None else None,
            headers={"Content-Type": "application/json"}
            | ({"Authorization": f"Bearer {token}"} if token else {}),
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
                return response.status, response.read().decode()
        except urllib.error.HTTPError as error:
            return error.code, error.read().decode()
        except OSError:
            return 0, ""

    def get(self, path: str, token: str = ""):
        return self.request("GET", path, token=token)


def _balances(dev: Dev, token: str) -> dict[int, int]:
    accounts = json.loads(dev.get("/api/v1/accounts", token)[1])["accounts"]
    return {a["account_id"]: a["balance"] for a in accounts}


def _metric(page: str, name: str) -> float:
    """Sum of a metric's samples (all label sets) on a Prometheus text page."""
    values = [
        float(line.rsplit(" ", 1)[1])
        for line in page.splitlines()
        if line.startswith(name) and line[len(name) : len(name) + 1] in ("", " ", "{")
    ]
    return sum(values)


def test_scripts_dev_runs_restarts_and_aggregates_metrics(tmp_path):
    dev = Dev(tmp_path)
    dev.start(1)
    try:
        token, (source, target) = dev.token(), dev.accounts()[:2]
        balances = _balances(dev, token)
        payments = []
        for i in range(30):  # exactly once and never early, on SQLite + the file broker
            status, body = dev.request(
                "POST",
                "/api/v1/payments/schedule",
                {
                    "from_account_id": source,
                    "to_account_id": target,
                    "amount": i + 1,
                    "delay_seconds": 1 + i % 3,
                },
                token,
            )
            assert status == 201, body
            payments.append(json.loads(body)["payment_id"])

        def details():
            return [json.loads(dev.get(f"/api/v1/payments/{p}", token)[1]) for p in payments]

        wait_until(
            lambda: all(d["status"] == "COMPLETED" for d in details()),
            120,
            1,
            "every payment to complete",
        )
        for payment in details():
            executed, due = (
                datetime.fromisoformat(payment[k]) for k in ("executed_at", "scheduled_time")
            )
            assert executed >= due, payment
        after = _balances(dev, token)
        total = sum(range(1, 31))  # each paid once: no more, no less
        assert after[source] == balances[source] - total
        assert after[target] == balances[target] + total
        # the web process's /metrics adds up the worker's files: no setting needed
        wait_until(
            lambda: _metric(dev.get("/metrics")[1], "payments_executed_total") >= 1,
            30,
            0.5,
            "the worker's counter on /metrics",
        )
        page = dev.get("/metrics")[1]
        assert _metric(page, "payments_lateness_seconds_count") >= 1
        assert _metric(page, "payments_scheduled_total") >= 1
        assert _metric(page, "payments_sweep_runs_total") >= 1  # the timer worker's
    finally:
        dev.stop()
    first = dev.text()
    assert "CRITICAL" not in first and "Traceback" not in first, first[-3000:]
    # the payment worker as scripts/dev runs it: two solo-pool processes, both up
    for n in (1, 2):
        assert re.search(rf"worker\.{n}@\S+ ready\.", first), first[-3000:]
    env_file = (tmp_path / ".env").read_text()
    assert "DEBUG=true" in env_file and re.search(r"^SECRET_KEY=\S{40,}$", env_file, re.M)
    assert (tmp_path / ".env").stat().st_mode & 0o077 == 0

    # a "second terminal": manage.py reads the same .env and database (and the
    # ledger reconciles: one journal entry per completed payment, balances agree)
    reconcile = subprocess.run(
        [sys.executable, "manage.py", "reconcile_ledger"],
        cwd=ROOT,
        env={k: v for k, v in dev.env.items() if k != "WEB_PORT"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert reconcile.returncode == 0, reconcile.stdout + reconcile.stderr

    dev.start(2)
    try:
        assert "Packages up to date" in dev.text()
        assert "Wrote" not in dev.text()  # the .env is written once
        assert dev.token() == token
        assert dev.get("/api/v1/accounts", token)[0] == 200
        # emptied at start: the first run's counters are gone
        assert _metric(dev.get("/metrics")[1], "payments_executed_total") == 0
        # quiet at idle: beat ticks every second, the sweeper and reaper run, and
        # none of it writes a line when there is nothing to do
        time.sleep(3)  # the requests above are logged by runserver; let them land
        before = dev.text()
        time.sleep(12)
        idle = dev.text()[len(before) :]
        assert idle == "", idle
    finally:
        dev.stop()
    assert (tmp_path / ".env").read_text() == env_file
    assert "CRITICAL" not in dev.text(), dev.text()[-3000:]
