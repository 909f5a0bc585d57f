"""Drain benchmark: N payments due at the same instant, real worker + beat processes.

    .venv/bin/python bench/drain.py --payments 10000 [--hot] [--concurrency 2]

Recreates the database ``scheduler_bench`` (``BENCH_DATABASE_URL``), migrates,
funds accounts, inserts N PENDING payments (holds placed through the ledger)
all due at T0 = now + lead, starts ``celery beat`` and a worker, and waits
until every payment is terminal. Reports drain time (last executed_at - T0),
throughput, lateness percentiles (executed_at - due_at, both stamped by the
database clock), and checks exactly-once and a clean ``reconcile_ledger``.
Writes ``bench/results/drain-<timestamp>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_DB = "postgres://postgres@127.0.0.1:5432/scheduler_bench"


def percentile(sorted_values: list[float], p: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[index]


def recreate_database(url: str) -> None:
    import psycopg

    name = url.rsplit("/", 1)[1]
    admin = url.rsplit("/", 1)[0] + "/postgres"
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--payments", type=int, default=10_000)
    parser.add_argument("--sources", type=int, default=200)
    parser.add_argument("--targets", type=int, default=200)
    parser.add_argument("--hot", action="store_true", help="every payment into one account")
    parser.add_argument("--concurrency", type=int, default=2, help="worker pool processes")
    parser.add_argument("--lead", type=float, default=8.0, help="seconds until T0")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()

    url = os.environ.get("BENCH_DATABASE_URL", DEFAULT_DB)
    env = {
        **os.environ,
        "DATABASE_URL": url,
        "CELERY_BROKER_URL": os.environ.get("BENCH_BROKER_URL", "redis://127.0.0.1:6379/8"),
        "SECRET_KEY": "bench-only",
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings.base",
        "LOG_LEVEL": "WARNING",
        "LOG_FORMAT": "text",
    }
    os.environ.update(env)
    recreate_database(url)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
    )

    import django

    sys.path.insert(0, str(ROOT))
    django.setup()
    import redis
    from django.conf import settings
    from django.db.models import F, Max

    from ledger import services as ledger
    from ledger.models import Account, JournalEntry
    from ledger.reconciliation import reconcile
    from payments.clock import db_now
    from payments.models import Payment
    from tests.payments.engine import bulk_schedule

    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    per_source = args.payments // args.sources + 1
    sources = []
    for _ in range(args.sources):
        account = ledger.account_create(owner=None, name="bench source")
        ledger.deposit(account_id=account.pk, amount=per_source * 10)
        sources.append(account.pk)
    targets = [
        ledger.account_create(owner=None, name="bench target").pk
        for _ in range(1 if args.hot else args.targets)
    ]
    t0 = db_now() + timedelta(seconds=args.lead)
    created = time.monotonic()
    ids: list[str] = []
    for start in range(0, args.payments, 5_000):
        ids += bulk_schedule(
            sources=sources,
            targets=targets,
            count=min(5_000, args.payments - start),
            amount=1 + start % 7,
            due_at=t0,
        )
    print(f"inserted {len(ids)} payments in {time.monotonic() - created:.1f}s; T0 = {t0}")
    if db_now() > t0:
        print("warning: insert took longer than --lead; lateness includes insert time")

    procs = []
    logs = Path(ROOT / "var" / "bench-logs")
    logs.mkdir(parents=True, exist_ok=True)
    for name, cmd in (
        (
            "beat",
            [
                "beat",
                "-S",
                "django_celery_beat.schedulers:DatabaseScheduler",
                "--pidfile=",
                "-s",
                str(logs / "beat-schedule"),
            ],
        ),
        ("worker", ["worker", "-c", str(args.concurrency), "--without-mingle", "--without-gossip"]),
    ):
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "celery", "-A", "scheduler_project", *cmd, "-l", "WARNING"],
                cwd=ROOT,
                env=env,
                stdout=open(logs / f"{name}.log", "w"),  # noqa: SIM115
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    open_statuses = ("PENDING", "QUEUED", "EXECUTING")
    deadline = time.monotonic() + args.lead + args.timeout
    try:
        while time.monotonic() < deadline:
            remaining = Payment.objects.filter(status__in=open_statuses).count()
            if remaining == 0:
                break
            time.sleep(0.5)
    finally:
        for proc in procs:
            os.killpg(proc.pid, signal.SIGTERM)
        for proc in procs:
            proc.wait(30)

    rows = list(Payment.objects.filter(status="COMPLETED").values_list("executed_at", "due_at"))
    lateness = sorted((e - d).total_seconds() for e, d in rows)
    last = Payment.objects.aggregate(m=Max("executed_at"))["m"]
    drain = (last - t0).total_seconds() if last else float("nan")
    duplicates = JournalEntry.objects.filter(reference__startswith="payment:").count() - len(rows)
    early = Payment.objects.filter(executed_at__lt=F("due_at")).count()
    report = reconcile()
    result = {
        "benchmark": "drain-hot" if args.hot else "drain",
        "date": datetime.now(UTC).isoformat(),
        "payments": args.payments,
        "sources": args.sources,
        "targets": len(targets),
        "worker_concurrency": args.concurrency,
        "completed": len(rows),
        "not_completed": args.payments - len(rows),
        "drain_seconds": round(drain, 3),
        "throughput_per_second": round(len(rows) / drain, 1) if drain > 0 else None,
        "lateness_seconds": {
            "p50": round(percentile(lateness, 50), 4),
            "p95": round(percentile(lateness, 95), 4),
            "p99": round(percentile(lateness, 99), 4),
            "max": round(lateness[-1], 4) if lateness else None,
        },
        "executed_early": early,
        "duplicate_entries": duplicates,
        "reconcile_ok": report.ok,
        "cpus": os.cpu_count(),
        "hot_account_balance_ok": (
            Account.objects.get(pk=targets[0]).balance
            == sum(Payment.objects.filter(status="COMPLETED").values_list("amount", flat=True))
        )
        if args.hot
        else None,
    }
    out_dir = ROOT / "bench" / "results"
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{result['benchmark']}-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    path.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(f"written {path}")
    ok = result["not_completed"] == 0 and duplicates == 0 and early == 0 and report.ok
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
