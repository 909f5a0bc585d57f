"""steady: R payments/s due continuously for S seconds while the API takes load.

R payments/s (default 350) due continuously for S seconds (default 180) while
the API takes schedule + status requests at a fixed rate: lateness per second
and API latency under that load.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from bench.harness.api_load import create_client, run_load, start_web
from bench.harness.checks import exactly_once_check, wait_terminal
from bench.harness.clock import db_now, lateness_rows, set_due_at
from bench.harness.db import prepare
from bench.harness.load import bulk_schedule, fund_accounts
from bench.harness.metrics import (
    cdf,
    percentile,
    postgres_cpu,
    postgres_cpu_since,
    summarize,
    tree_cpu_seconds,
)
from bench.harness.processes import Service

DATABASE = "scheduler_bench_steady"
REDIS_DB = 8


def run(args) -> dict:
    env = prepare(DATABASE, REDIS_DB)
    from bench.harness.app import Payment

    rate, seconds = args.steady_rate, args.steady_seconds
    total = int(rate * seconds)
    sources = fund_accounts(500, total * 10)
    targets = fund_accounts(500, 0)
    bulk_schedule(
        sources=sources, targets=targets, count=total, amount=2, due_at=db_now() + timedelta(1)
    )
    preloaded = set(Payment.objects.values_list("pk", flat=True))
    client = create_client("bench-api", accounts=20, balance=10**12)
    lead = 20.0
    t0 = db_now() + timedelta(seconds=lead)
    set_due_at(t0, rate)
    t0_mono = time.monotonic() + (t0 - db_now()).total_seconds()
    api: dict = {}
    with Service(env, "steady") as service:
        base = start_web(service)
        worker = service.worker(args.concurrency)
        timers = service.timers()
        service.beat()
        time.sleep(max(0.0, t0_mono - time.monotonic()))
        cpu0 = (tree_cpu_seconds(worker.pid), postgres_cpu(), tree_cpu_seconds(timers.pid))

        def load():
            api.update(
                run_load(
                    base=base,
                    token=client["token"],
                    account_ids=client["account_ids"],
                    schedule_rate=args.api_schedule_rate,
                    status_rate=args.api_status_rate,
                    duration=seconds - 5,
                    streams=8,
                )
            )

        if args.api_schedule_rate > 0 and args.api_status_rate > 0:
            loader = threading.Thread(target=load)
            loader.start()
            loader.join()
        else:
            time.sleep(seconds)
        remaining = wait_terminal(args.timeout)
        cpu1 = (
            tree_cpu_seconds(worker.pid),
            postgres_cpu_since(cpu0[1]),
            tree_cpu_seconds(timers.pid),
        )
    rows = lateness_rows()
    steady = [(d, (e - d).total_seconds()) for d, e, pk in rows if pk in preloaded]
    lateness = [lat for _, lat in steady]
    per_second: dict[int, list[float]] = {}
    for due, lat in steady:
        per_second.setdefault(int((due - t0).total_seconds()), []).append(lat)
    timeline = [
        (sec, percentile(sorted(v), 50), percentile(sorted(v), 99))
        for sec, v in sorted(per_second.items())
    ]
    api_cdf = {k: cdf(v.pop("latencies_ms")) for k, v in api.items()}
    return {
        "rate_per_second": rate,
        "seconds": seconds,
        "payments": total,
        "still_open_at_timeout": remaining,
        "lateness_seconds": summarize(lateness, digits=3),
        "api": api,
        "api_rates": {"schedule": args.api_schedule_rate, "status": args.api_status_rate},
        "cpu": {
            "worker_cpu_seconds": round(cpu1[0] - cpu0[0], 1),
            "timers_cpu_seconds": round(cpu1[2] - cpu0[2], 1),
            "postgres_cpu_seconds": round(cpu1[1], 1),
        },
        "checks": exactly_once_check(),
        "series": {
            "lateness_per_second": timeline,
            "lateness_cdf": cdf(lateness),
            "api_latency_cdf_ms": api_cdf,
        },
    }
