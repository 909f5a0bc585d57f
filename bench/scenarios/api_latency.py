"""API latency: schedule and status p50/p95/p99 at a fixed request rate.

    .venv/bin/python bench/api_latency.py [--rate 50] [--status-rate 100] [--duration 30]
                                          [--no-executions] [--bare]

Recreates the database ``scheduler_bench_api``, creates a client with
``create_api_client --json``, starts gunicorn (2 workers x 4 threads, the
shipped ``gunicorn.conf.py`` otherwise), a Celery worker and beat (so the
payments it schedules — due 1-30 s later — execute while it measures), and
drives an open-loop load: ``--rate`` ``POST /api/v1/payments/schedule`` per
second and ``--status-rate`` ``GET /api/v1/payments/{id}`` per second, each
from its own keep-alive connections. Latency is measured per request from the
moment it was sent to the last byte of the answer; ``late_starts`` counts
requests sent more than 10 ms behind their slot (the generator falling behind).
gunicorn runs with ``PROMETHEUS_MULTIPROC_DIR`` set, as docker-compose runs it,
and after a 5 s warm-up at the same rates the report gives the CPU seconds
gunicorn (every worker) and PostgreSQL took over the measured window and the
web CPU per request: the quick A/B for the web tier's cost (``--no-executions``
leaves PostgreSQL's share to the API alone). ``--bare`` serves
``bench.harness.bare_wsgi`` instead of the service — a WSGI application that
does nothing — with the same gunicorn settings and load, no worker and no
beat: its web CPU per request is gunicorn's own (HTTP parsing, the thread
pool, the access log, sockets), the part of the service's that no change to
the application removes (``bench/api_cost.py --served`` gives the
application's part, in-process).
Writes ``bench/results/<date>-api/api-<timestamp>.json``.

The load generator (``bench.harness.api_load.run_load``) is also what the
suite's steady-load scenario measures the API with while payments execute.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from datetime import UTC, datetime

from bench.harness.api_load import create_client, run_load, start_web
from bench.harness.db import prepare
from bench.harness.metrics import ms_each, postgres_cpu, postgres_cpu_since, tree_cpu_seconds
from bench.harness.processes import SERVICE_WSGI, Service
from bench.harness.report import write_report

DATABASE = "scheduler_bench_api"
BARE_APP = "bench.harness.bare_wsgi"
REDIS_DB = 5


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=50, help="schedule requests per second")
    parser.add_argument("--status-rate", type=float, default=100, help="status requests/s")
    parser.add_argument("--duration", type=float, default=30)
    parser.add_argument("--no-executions", action="store_true", help="no worker or beat")
    parser.add_argument(
        "--bare", action="store_true", help="serve a WSGI app that does nothing (gunicorn's cost)"
    )
    args = parser.parse_args()
    executions = not (args.no_executions or args.bare)
    app = BARE_APP if args.bare else SERVICE_WSGI

    env = prepare(DATABASE, REDIS_DB)
    if args.bare:  # nothing reads the token or the accounts; the bodies keep their shape
        client = {"token": "bare", "account_ids": [1, 2]}
    else:
        client = create_client("bench", accounts=20, balance=10**12)
    metrics_dir = tempfile.mkdtemp(prefix="bench-api-metrics-")
    load = {
        "token": client["token"],
        "account_ids": client["account_ids"],
        "schedule_rate": args.rate,
        "status_rate": args.status_rate,
    }
    try:
        with Service({**env, "PROMETHEUS_MULTIPROC_DIR": metrics_dir}, "api") as service:
            base = start_web(service, app=app)
            if executions:
                service.beat()
                service.timers()
                service.worker(2)
            run_load(base=base, duration=5, **load)  # warm-up: imports, pools, caches
            web_pid = service.procs["web"].pid
            web0, pg0 = tree_cpu_seconds(web_pid), postgres_cpu()
            result = run_load(base=base, duration=args.duration, **load)
            web_cpu, pg_cpu = tree_cpu_seconds(web_pid) - web0, postgres_cpu_since(pg0)
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)
    requests = result["schedule"]["requests"] + result["status"]["requests"]
    result["cpu"] = {
        "web_cpu_seconds": round(web_cpu, 2),
        "postgres_cpu_seconds": round(pg_cpu, 2),
        "requests": requests,
        "web_ms_per_request": ms_each(web_cpu, requests),
        "postgres_ms_per_request": ms_each(pg_cpu, requests),
    }
    from bench.harness.app import Payment

    for kind in ("schedule", "status"):
        result[kind].pop("latencies_ms")
    result |= {
        "benchmark": "api",
        "date": datetime.now(UTC).isoformat(),
        "duration_seconds": args.duration,
        "executions_running": executions,
        "app": app,
        "payments_completed_during_run": Payment.objects.filter(status="COMPLETED").count(),
        "gunicorn": (
            f"{os.environ.get('WEB_CONCURRENCY', '2')} workers x "
            f"{os.environ.get('WEB_THREADS', '4')} threads"
        ),  # gunicorn.conf.py's defaults unless the environment overrides them
    }
    now = datetime.now(UTC)
    print(json.dumps(result, indent=2))
    write_report("api", result, when=now, filename=f"api-{now:%Y%m%dT%H%M%S}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
