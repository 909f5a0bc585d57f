"""Real Celery worker and beat processes against the test database and Redis."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import redis
from django.conf import settings
from django.db import connection

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
            "--without-mingle",
            "--without-gossip",
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

    def production_topology(self) -> int:
        """The Procfile's workers: payments, timers, recurring (+ maintenance), webhooks.

        Returns how many worker nodes were started (to wait for their pings).
        """
        self.worker(exclude="timers,recurring,webhooks,default")
        self.worker(1, queues="timers", name="timers")
        self.worker(2, queues="recurring,default", name="recurring")
        self.worker(4, queues="webhooks", pool="threads", name="webhooks")
        return 4

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
        return "\n".join(
            f"--- {p.name} ---\n{p.read_text()[-3000:]}"
            for p in sorted(self.tmp_path.glob("*.log"))
        )


def wait_until(predicate, timeout: float, interval: float = 0.2, message: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {message}")
