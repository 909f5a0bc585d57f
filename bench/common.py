"""Shared plumbing for the benchmark and chaos scripts in ``bench/``.

Each scenario gets its own PostgreSQL database (recreated and migrated) and
its own Redis database number, so scenarios never see each other's rows or
messages. Django is configured in-process (``setup_django``) to load data and
read results; the service itself runs as real ``celery`` / ``gunicorn``
processes started by ``Service``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PG_SERVER = os.environ.get("BENCH_PG_SERVER", "postgres://postgres@127.0.0.1:5432")
REDIS_SERVER = os.environ.get("BENCH_REDIS_SERVER", "redis://127.0.0.1:6379")
LOG_DIR = ROOT / "var" / "bench-logs"
OPEN_STATUSES = ("PENDING", "QUEUED", "EXECUTING")
# What payment workers leave to the other workers (Procfile: worker -X …).
NON_PAYMENT_QUEUES = "timers,recurring,webhooks,default"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def percentile(sorted_values: list[float], p: float) -> float | None:
    """Nearest-rank percentile of an already sorted list (None when empty)."""
    if not sorted_values:
        return None
    index = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[index]


def summarize(values: list[float], scale: float = 1.0, digits: int = 4) -> dict:
    """p50/p95/p99/max (and count) of ``values``, multiplied by ``scale``."""
    ordered = sorted(values)
    out: dict = {"count": len(ordered)}
    for name, p in (("p50", 50), ("p95", 95), ("p99", 99), ("max", 100)):
        value = percentile(ordered, p)
        out[name] = round(value * scale, digits) if value is not None else None
    return out


def write_report(name: str, report: dict) -> Path:
    """``bench/results/<UTC date>-<name>/report.json``; prints and returns its path."""
    out = ROOT / "bench" / "results" / f"{datetime.now(UTC):%Y-%m-%d}-{name}"
    out.mkdir(parents=True, exist_ok=True)
    path = out / "report.json"
    path.write_text(json.dumps(report, indent=2))
    print(f"report: {path}")
    return path


def recreate_database(name: str) -> str:
    """Drop and create database ``name``; return its URL."""
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{PG_SERVER}/{name}"


def service_env(database: str, redis_db: int, **extra: str) -> dict[str, str]:
    """Environment for the service's processes (and this one) in a scenario."""
    return {
        **os.environ,
        "DATABASE_URL": f"{PG_SERVER}/{database}",
        "CELERY_BROKER_URL": f"{REDIS_SERVER}/{redis_db}",
        "SECRET_KEY": "bench-only-not-secret",
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings.base",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "API_THROTTLE_RATE": "100000/s",
        "LOG_LEVEL": "WARNING",
        "LOG_FORMAT": "text",
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


def prepare(database: str, redis_db: int, **extra: str) -> dict[str, str]:
    """Recreate + migrate ``database``, flush the Redis db, set up Django here.

    Must be called once per process before any Django import; returns the env
    to start service processes with.
    """
    env = service_env(database, redis_db, **extra)
    recreate_database(database)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    os.environ.update(env)
    import django

    django.setup()
    import redis

    redis.Redis.from_url(env["CELERY_BROKER_URL"]).flushdb()
    return env


def fund_accounts(count: int, balance: int, *, owner=None, name: str = "bench") -> list[int]:
    """Create ``count`` active accounts, each funded with ``balance`` (0 → unfunded)."""
    from ledger import services as ledger

    ids = []
    for _ in range(count):
        account = ledger.account_create(owner=owner, name=name)
        if balance:
            ledger.deposit(account_id=account.pk, amount=balance)
        ids.append(account.pk)
    return ids


def bulk_schedule(*, sources, targets, count, amount, due_at, batch=5_000) -> list[str]:
    """Insert ``count`` PENDING payments with their holds, in batches (see the tests' helper)."""
    from tests.payments.engine import bulk_schedule as _bulk

    ids: list[str] = []
    for start in range(0, count, batch):
        ids += _bulk(
            sources=sources,
            targets=targets,
            count=min(batch, count - start),
            amount=amount,
            due_at=due_at,
        )
    return ids


class Service:
    """Real service processes (celery worker/beat, gunicorn) for one scenario."""

    def __init__(self, env: dict[str, str], name: str) -> None:
        self.env = env
        self.name = name
        self.procs: dict[str, subprocess.Popen] = {}
        LOG_DIR.mkdir(parents=True, exist_ok=True)

    def start(self, role: str, args: list[str]) -> subprocess.Popen:
        log = open(LOG_DIR / f"{self.name}-{role}.log", "a")  # noqa: SIM115
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: a kill takes the pool too
        )
        self.procs[role] = proc
        return proc

    def celery(self, role: str, *args: str, nice: int = 0) -> subprocess.Popen:
        command = [sys.executable, "-m", "celery", "-A", "scheduler_project"]
        if nice:
            command = ["nice", "-n", str(nice), *command]
        return self.start(role, [*command, *args, "-l", "WARNING"])

    def worker(
        self,
        concurrency: int = 2,
        role: str = "worker",
        queues: str | None = None,
        pool: str | None = None,
        nice: int = 0,
    ):
        """A payment worker (every queue but the other workers', as in the Procfile)
        unless ``queues`` is given."""
        args = ["worker", "-c", str(concurrency), "--without-mingle", "--without-gossip"]
        args += ["-n", f"{role}@%h"]
        args += ["-Q", queues] if queues else ["-X", NON_PAYMENT_QUEUES]
        if pool:
            args += ["--pool", pool]
        return self.celery(role, *args, nice=nice)

    def timers(self, role: str = "timers"):
        """The timer worker (sweeper, lease reaper), as in the Procfile."""
        return self.worker(1, role=role, queues="timers")

    def recurring(self, role: str = "recurring", nice: int = 0):
        """The materialiser and maintenance worker, as in the Procfile."""
        return self.worker(2, role=role, queues="recurring,default", nice=nice)

    def webhooks(self, role: str = "webhooks", concurrency: int = 16, nice: int = 0):
        """The webhook worker (threads), as in the Procfile."""
        return self.worker(concurrency, role=role, queues="webhooks", pool="threads", nice=nice)

    def background(self, nice: int = 0) -> None:
        """Every non-payment worker of the production topology: timers, recurring,
        webhooks (the last two at ``nice``: their work has slack, the timer's has none)."""
        self.timers()
        self.recurring(nice=nice)
        self.webhooks(nice=nice)

    def beat(self, role: str = "beat"):
        return self.celery(
            role,
            "beat",
            "-S",
            "django_celery_beat.schedulers:DatabaseScheduler",
            "--pidfile=",
            "-s",
            str(LOG_DIR / f"{self.name}-{role}-schedule"),
        )

    def gunicorn(self, port: int, workers: int = 2, threads: int = 4, nice: int = 0):
        return self.start(
            "web",
            [
                *(["nice", "-n", str(nice)] if nice else []),
                sys.executable,
                "-m",
                "gunicorn",
                "scheduler_project.wsgi",
                "-b",
                f"127.0.0.1:{port}",
                "-w",
                str(workers),
                "--threads",
                str(threads),
            ],
        )

    def kill(self, role: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(role)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            proc.wait(30)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for role, proc in self.procs.items():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill(role)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


def wait_terminal(timeout: float, poll: float = 0.5) -> int:
    """Wait until no payment is open; return how many are still open at the end."""
    from payments.models import Payment

    deadline = time.monotonic() + timeout
    while True:
        remaining = Payment.objects.filter(status__in=OPEN_STATUSES).count()
        if remaining == 0 or time.monotonic() > deadline:
            return remaining
        time.sleep(poll)


def wait_http(url: str, timeout: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310
                if response.status < 500:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)


def exactly_once_check() -> dict:
    """Counts that prove exactly-once against the ledger, plus reconciliation."""
    from django.db.models import Count, F

    from ledger.models import JournalEntry
    from ledger.reconciliation import reconcile
    from payments.models import Payment

    completed = Payment.objects.filter(status="COMPLETED").count()
    entries = JournalEntry.objects.filter(reference__startswith="payment:").count()
    duplicate_refs = (
        JournalEntry.objects.filter(reference__startswith="payment:")
        .values("reference")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .count()
    )
    report = reconcile()
    return {
        "completed": completed,
        "payment_entries": entries,
        "duplicates": max(0, entries - completed) + duplicate_refs,
        "completed_without_entry": Payment.objects.filter(
            status="COMPLETED", journal_entry__isnull=True
        ).count(),
        "executed_early": Payment.objects.filter(executed_at__lt=F("due_at")).count(),
        "open": Payment.objects.filter(status__in=OPEN_STATUSES).count(),
        # every bench payment is funded and valid: any FAILED one is a finding
        # (e.g. dead-lettered after its leases expired under overload)
        "failed": Payment.objects.filter(status="FAILED").count(),
        "reconcile_ok": report.ok,
    }
