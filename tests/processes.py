"""Real Celery worker, beat and gunicorn processes against the test database and Redis."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import redis
from django.conf import settings
from django.db import connection

from bench.harness.processes import QUIET_WORKER

ROOT = Path(__file__).resolve().parent.parent


def process_env(**extra: str) -> dict[str, str]:
    db = connection.settings_dict
    password = f":{db['PASSWORD']}" if db.get("PASSWORD") else ""
    return {
        **os.environ,
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings.test",
        "DATABASE_URL": f"postgres://{db['USER']}{password}@{db['HOST']}:{db['PORT']}/{db['NAME']}",
        "CELERY_BROKER_URL": settings.CELERY_BROKER_URL,
        "LOG_FORMAT": "text",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def flush_broker() -> None:
    """FLUSHDB on the broker's own database number (one per checkout in scripts/test), never
    FLUSHALL: other databases on the same Redis — a developer's, a parallel run's —
    are left alone."""
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()


class Processes:
    def __init__(self, tmp_path: Path, **env: str) -> None:
        self.tmp_path = tmp_path
        self.env = process_env(**env)
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def _start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.tmp_path / f"{name}-{len(self.procs)}.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(
            [sys.executable, "-m", "celery", "-A", "scheduler_project", *args],
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group: kill -9 takes the pool too
        )
        self.procs.append((name, proc))
        return proc

    def worker(
        self,
        concurrency: int = 2,
        queues: str | None = None,
        exclude: str | None = None,
        pool: str | None = None,
        name: str = "worker",
    ) -> subprocess.Popen:
        args = [
            "worker",
            "--loglevel",
            "INFO",
            "--concurrency",
            str(concurrency),
            *QUIET_WORKER,
            "-n",
            f"{name}{len(self.procs)}@%h",
        ]
        if queues:
            args += ["-Q", queues]
        if exclude:
            args += ["-X", exclude]
        if pool:
            args += ["--pool", pool]
        return self._start(name, args)

    def payment_workers(
        self, pool: str = "solo", exclude: str | None = None
    ) -> list[subprocess.Popen]:
        """The payment worker as shipped: two solo-pool processes (Procfile,
        ``scripts/dev``); or, with ``pool="prefork"``, one prefork pool of two."""
        if pool == "solo":
            return [self.worker(1, exclude=exclude, pool="solo") for _ in range(2)]
        return [self.worker(exclude=exclude)]

    def production_topology(self) -> int:
        """The Procfile's workers: payments (two solo-pool processes, as
        ``scripts/dev`` runs them), timers, recurring (+ maintenance), webhooks.

        Returns how many worker nodes were started (to wait for their pings).
        """
        self.payment_workers(exclude="timers,recurring,webhooks,default")
        self.worker(1, queues="timers", name="timers")
        self.worker(2, queues="recurring,default", name="recurring")
        self.worker(4, queues="webhooks", pool="threads", name="webhooks")
        return 5

    def beat(self) -> subprocess.Popen:
        schedule = self.tmp_path / "beat-schedule"
        return self._start(
            "beat",
            [
                "beat",
                "--loglevel",
                "INFO",
                "--scheduler",
                "django_celery_beat.schedulers:DatabaseScheduler",
                "--pidfile=",
                "-s",
                str(schedule),
            ],
        )

    @staticmethod
    def kill9(proc: subprocess.Popen) -> None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def stop(self) -> None:
        for _, proc in self.procs:
            if proc.poll() is None:
                try:
                    os.killpg(proc.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + 15
        for _, proc in self.procs:
            try:
                proc.wait(max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)

    def logs(self) -> str:
        """Every process's whole log: what assertions read (a deadlock or an
        OperationalError early in a long log must still be found)."""
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text()}" for p in sorted(self.tmp_path.glob("*.log"))
        )

    def tail(self, chars: int = 3000) -> str:
        """The last ``chars`` characters of each log: for printing, never for assertions."""
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text()[-chars:]}"
            for p in sorted(self.tmp_path.glob("*.log"))
        )


class PrivateRedis:
    """A ``redis-server`` of the test's own on a free port, to kill and restart at will.

    No persistence, as the CI Redis: a restart empties it, as a crashed broker
    without AOF would. Other tests' and developers' databases are never touched.
    """

    def __init__(self, tmp_path: Path) -> None:
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.log_path = tmp_path / "redis-server.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        with open(self.log_path, "a") as log:  # the child keeps its own copy of the handle
            self.proc = subprocess.Popen(
                [
                    *("redis-server", "--bind", "127.0.0.1", "--port", str(self.port)),
                    *("--save", "", "--appendonly", "no"),
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        wait_until(self.ping, 15, interval=0.05, message="redis-server to answer")

    def ping(self) -> bool:
        try:
            return bool(redis.Redis.from_url(self.url, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def kill(self) -> None:
        """SIGKILL: a crash, not a shutdown; clients see their sockets reset."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def wait_until(predicate, timeout: float, interval: float = 0.2, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Gunicorn:
    """``gunicorn scheduler_project.wsgi`` as the Procfile runs it, on a free local port.

    The access log records the worker pid and status of every request, so a
    test can see which worker process answered.
    """

    def __init__(self, tmp_path: Path, workers: int, **env: str) -> None:
        self.port = free_port()
        self.access_log = tmp_path / "access.log"
        self.log_path = tmp_path / "gunicorn.log"
        log = open(self.log_path, "w")  # noqa: SIM115
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "gunicorn",
                "scheduler_project.wsgi",
                "--access-logfile",
                str(self.access_log),
                "--access-logformat",
                "%(p)s %(s)s %(U)s",
            ],
            cwd=ROOT,
            env=process_env(
                GUNICORN_BIND=f"127.0.0.1:{self.port}", WEB_CONCURRENCY=str(workers), **env
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_until(self._up, 60, message="gunicorn to answer /healthz")

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"gunicorn exited:\n{self.logs()}")
        try:
            return self.request("GET", "/healthz")[0] == 200
        except OSError:
            return False

    def request(self, method, path, body=None, headers=None) -> tuple[int, dict, bytes]:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            payload = None if body is None else json.dumps(body)
            all_headers = {"Content-Type": "application/json"} if body is not None else {}
            conn.request(method, path, payload, all_headers | (headers or {}))
            response = conn.getresponse()
            return response.status, dict(response.getheaders()), response.read()
        finally:
            conn.close()

    def access(self) -> list[tuple[str, int, str]]:
        """(worker pid, status, path) of every request answered so far."""
        text = self.access_log.read_text() if self.access_log.exists() else ""
        return [(pid, int(status), path) for pid, status, path in map(str.split, text.splitlines())]

    def answered_by(self, path: str) -> Counter:
        """Requests for ``path`` answered so far, by worker pid."""
        return Counter(pid for pid, _, p in self.access() if p == path)

    def logs(self) -> str:
        return self.log_path.read_text()[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
