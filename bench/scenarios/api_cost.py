"""API cost in-process: CPU time and queries of a schedule call and a status read.

    .venv/bin/python bench/api_cost.py [--n 500] [--profile schedule|schedule_key|status]
        [--top 25] [--name api-cost]

Recreates ``scheduler_bench_apicost``, creates a client with two funded
accounts, and sends ``--n`` ``POST /api/v1/payments/schedule``, ``--n`` more
with a fresh ``Idempotency-Key`` each (``schedule_key``: the claim and the
stored response on top) and ``--n`` ``GET /api/v1/payments/{id}`` through
Django's full request stack (middleware,
authentication, throttles, DRF, renderer) with ``django.test.Client`` in this
process — no HTTP server, no network, no other load — so the numbers are the
application's own cost. Reports per request: mean and p50 wall time, CPU time
(``time.process_time``), and the SQL statements run (each distinct statement
listed once with its count). ``--profile`` runs cProfile over one kind of
request and prints the top functions by cumulative CPU time.
Writes ``bench/results/<date>-api-cost/report.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import pstats
import sys
import time
from collections import Counter
from datetime import UTC, datetime

from bench.harness.api_load import create_client
from bench.harness.db import prepare
from bench.harness.metrics import percentile
from bench.harness.report import write_report

DATABASE = "scheduler_bench_apicost"
REDIS_DB = 7


def measure(call, n: int) -> dict:
    """Wall and CPU time per call (ms) over ``n`` calls, after 20 warm-up calls."""
    for _ in range(20):
        call()
    walls = []
    cpu_start = time.process_time()
    for _ in range(n):
        started = time.perf_counter()
        call()
        walls.append((time.perf_counter() - started) * 1000)
    cpu = (time.process_time() - cpu_start) * 1000 / n
    walls.sort()
    return {
        "wall_ms_mean": round(sum(walls) / n, 3),
        "wall_ms_p50": round(percentile(walls, 50), 3),
        "cpu_ms_mean": round(cpu, 3),
    }


def statements(call) -> tuple[int, list[tuple[int, str]]]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        call()
    shapes = Counter(q["sql"][:160] for q in ctx.captured_queries)
    return len(ctx.captured_queries), sorted(((c, s) for s, c in shapes.items()), reverse=True)


def profile(call, n: int, top: int) -> str:
    profiler = cProfile.Profile(time.process_time)  # CPU time: robust to a busy host
    profiler.enable()
    for _ in range(n):
        call()
    profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--profile", choices=["schedule", "schedule_key", "status"])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--name", default="api-cost")
    args = parser.parse_args()

    prepare(DATABASE, REDIS_DB, API_THROTTLE_RATE="1000000/s")  # measured, never hit
    from django.test import Client

    client_info = create_client("apicost", accounts=2, balance=10**12)
    source, target = client_info["account_ids"]
    http = Client(HTTP_AUTHORIZATION=f"Bearer {client_info['token']}", HTTP_HOST="127.0.0.1")
    body = json.dumps(
        {"from_account_id": source, "to_account_id": target, "amount": 1, "delay_seconds": 3600}
    )

    def schedule():
        response = http.post("/api/v1/payments/schedule", body, content_type="application/json")
        assert response.status_code == 201, response.content
        return response

    keys = itertools.count()

    def schedule_key():
        response = http.post(
            "/api/v1/payments/schedule",
            body,
            content_type="application/json",
            headers={"Idempotency-Key": f"apicost-{next(keys)}"},
        )
        assert response.status_code == 201, response.content
        return response

    payment_id = schedule().json()["payment_id"]

    def status():
        response = http.get(f"/api/v1/payments/{payment_id}")
        assert response.status_code == 200, response.content
        return response

    report = {"n": args.n, "at": datetime.now(UTC).isoformat()}
    calls = {"schedule": schedule, "schedule_key": schedule_key, "status": status}
    for name, call in calls.items():
        count, shapes = statements(call)
        report[name] = measure(call, args.n) | {"queries": count, "statements": shapes}
        print(
            f"{name}: wall mean {report[name]['wall_ms_mean']} ms, "
            f"CPU {report[name]['cpu_ms_mean']} ms, {count} queries"
        )
        for times, sql in shapes:
            print(f"   {times} x {sql}")
    if args.profile:
        print(profile(calls[args.profile], args.n, args.top))
    write_report(args.name, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
