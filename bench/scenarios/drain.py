"""drain: N payments due at one instant; hot: the same, every payment into one account.

N payments (default 100,000) due at the same instant T0 across 1,000 source
and 1,000 target accounts (``hot``: one target account): drain time,
throughput, lateness, worker / timer / beat / database CPU, worker memory.
"""

from __future__ import annotations

import time
from datetime import timedelta

from bench.harness import dbwork
from bench.harness.checks import exactly_once_check, wait_terminal
from bench.harness.clock import db_now, lateness_rows, set_due_at
from bench.harness.db import prepare
from bench.harness.load import bulk_schedule, fund_accounts
from bench.harness.metrics import (
    cdf,
    postgres_cpu,
    postgres_cpu_since,
    summarize,
    tree_cpu_seconds,
    tree_rss_mb,
)
from bench.harness.processes import Service

DATABASE = "scheduler_bench_drain"  # hot uses it too
REDIS_DB = 8


def run(args, hot: bool = False) -> dict:
    env = prepare(DATABASE, REDIS_DB)

    n = args.payments
    sources = fund_accounts(1000, n * 10)
    targets = fund_accounts(1 if hot else 1000, 0)
    started = time.monotonic()
    bulk_schedule(
        sources=sources,
        targets=targets,
        count=n,
        amount=3,
        due_at=db_now() + timedelta(days=1),
    )
    insert_seconds = time.monotonic() - started
    lead = 10.0
    t0 = db_now() + timedelta(seconds=lead)
    set_due_at(t0)
    offset = (t0 - db_now()).total_seconds()
    t0_mono = time.monotonic() + offset
    samples: list = []
    with Service(env, "hot" if hot else "drain") as service:
        worker = service.worker(args.concurrency)
        timers = service.timers()
        beat = service.beat()
        time.sleep(max(0.0, t0_mono - time.monotonic() - 0.5))
        cpu0 = (
            tree_cpu_seconds(worker.pid),
            tree_cpu_seconds(beat.pid),
            postgres_cpu(),
            tree_cpu_seconds(timers.pid),
        )
        work0 = dbwork.mark()
        wall0 = time.monotonic()
        # progress: (seconds since T0, payments finished), from wait_terminal's own
        # count of the open ones: no second query stream in the measured window
        remaining = wait_terminal(
            args.timeout,
            poll=0.25,
            on_poll=lambda left: samples.append((round(time.monotonic() - t0_mono, 2), n - left)),
        )
        wall = time.monotonic() - wall0
        cpu1 = (
            tree_cpu_seconds(worker.pid),
            tree_cpu_seconds(beat.pid),
            tree_cpu_seconds(timers.pid),
        )
        pg_cpu = postgres_cpu_since(cpu0[2])
        rss = tree_rss_mb(worker.pid)
        # the workers' last second of counts, reported once their backends idle
        work1 = dbwork.settled_mark()
    rows = lateness_rows()
    lateness = [(e - d).total_seconds() for d, e, _ in rows]
    last = max((e for _, e, _ in rows), default=None)
    drain = (last - t0).total_seconds() if last else None
    checks = exactly_once_check()
    from bench.harness.app import Account

    if hot:
        received = Account.objects.get(pk=targets[0]).balance
        checks["hot_account_balance_ok"] = received == 3 * checks["completed"]
    return {
        "payments": n,
        "source_accounts": len(sources),
        "target_accounts": len(targets),
        "worker_concurrency": args.concurrency,
        "insert_seconds": round(insert_seconds, 1),
        "still_open_at_timeout": remaining,
        "drain_seconds": round(drain, 2) if drain else None,
        "throughput_per_second": round(len(rows) / drain, 1) if drain else None,
        "lateness_seconds": summarize(lateness, digits=3),
        "cpu": {
            "wall_seconds": round(wall, 1),
            "worker_cpu_seconds": round(cpu1[0] - cpu0[0], 1),
            "timers_cpu_seconds": round(cpu1[2] - cpu0[3], 1),
            "beat_cpu_seconds": round(cpu1[1] - cpu0[1], 1),
            "postgres_cpu_seconds": round(pg_cpu, 1),
            "worker_rss_mb": rss,
        },
        # PostgreSQL's own counters from T0 to the last payment and the workers' idle
        # backends' last report (bench.harness.dbwork; wait_terminal's count of the
        # open rows every 0.25 s included, and a few idle sweeps)
        "database_work": {
            **dbwork.report(work0, work1, checks["completed"]),
            **dbwork.table_sizes(),
        },
        "checks": checks,
        "series": {"progress": samples, "lateness_cdf": cdf(lateness)},
    }


def run_hot(args) -> dict:
    return run(args, hot=True)
