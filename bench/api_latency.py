"""API latency: schedule and status p50/p95/p99 at a fixed request rate.

    .venv/bin/python bench/api_latency.py [--rate 50] [--status-rate 100] [--duration 30]

Recreates the database ``scheduler_bench_api``, creates a client with
``create_api_client --json``, starts gunicorn (2 workers x 4 threads, the
shipped ``gunicorn.conf.py`` otherwise), a Celery worker and beat (so the
payments it schedules — due 1-30 s later — execute while it measures), and
drives an open-loop load: ``--rate`` ``POST /api/v1/payments/schedule`` per
second and ``--status-rate`` ``GET /api/v1/payments/{id}`` per second, each
from its own keep-alive connections. Latency is measured per request from the
moment it was sent to the last byte of the answer; ``late_starts`` counts
requests sent more than 10 ms behind their slot (the generator falling behind).
Writes ``bench/results/api-<timestamp>.json``.

``run_load`` is also used by ``bench/run.py`` to measure the API while the
steady-load scenario executes payments.
"""

from __future__ import annotations

import argparse
import http.client
import io
import json
import random
import sys
import threading
import time
from contextlib import redirect_stdout
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import ROOT, Service, prepare, summarize, wait_http

PORT = 8765


def create_client(name: str, accounts: int, balance: int) -> dict:
    """``create_api_client NAME --json`` in-process; returns its JSON object."""
    from django.core.management import call_command

    out = io.StringIO()
    with redirect_stdout(out):
        call_command(
            "create_api_client", name, accounts=accounts, balance=balance, json=True, stdout=out
        )
    return json.loads(out.getvalue())


class _Stream(threading.Thread):
    """One open-loop request stream: ``rate`` requests/s for ``duration`` s."""

    def __init__(self, host, port, token, rate, duration, start_at, make_request, results):
        super().__init__(daemon=True)
        self.conn = http.client.HTTPConnection(host, port, timeout=30)
        self.headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
        self.interval = 1.0 / rate
        self.count = int(rate * duration)
        self.start_at = start_at
        self.make_request = make_request
        self.results = results

    def run(self):
        for i in range(self.count):
            slot = self.start_at + i * self.interval
            delay = slot - time.monotonic()
            if delay > 0:
                time.sleep(delay)
            method, path, body = self.make_request()
            sent = time.monotonic()
            try:
                self.conn.request(method, path, body=body, headers=self.headers)
                response = self.conn.getresponse()
                data = response.read()
                status = response.status
            except OSError as exc:
                self.conn.close()
                status, data = 0, str(exc).encode()
            done = time.monotonic()
            self.results.append((sent - slot, done - sent, status, data))


def run_load(
    *,
    base: tuple[str, int],
    token: str,
    account_ids: list[int],
    schedule_rate: float,
    status_rate: float,
    duration: float,
    streams: int = 2,
) -> dict:
    """Drive schedule + status requests at fixed rates; return latency summaries (ms)."""
    host, port = base
    created: list[str] = []
    rng = random.Random(7)

    def schedule():
        source, target = rng.sample(account_ids, 2)
        body = {
            "from_account_id": source,
            "to_account_id": target,
            "amount": rng.randint(1, 50),
            "delay_seconds": rng.randint(1, 30),
        }
        return "POST", "/api/v1/payments/schedule", json.dumps(body)

    def status():
        return "GET", f"/api/v1/payments/{rng.choice(created)}", None

    # Seed the status stream with a few payments first.
    warm: list = []
    _Stream(host, port, token, 20, 1, time.monotonic(), schedule, warm).run()
    created += [json.loads(d)["payment_id"] for _, _, s, d in warm if s == 201]
    if not created:
        raise RuntimeError(f"warm-up schedule requests failed: {warm[:1]}")

    start_at = time.monotonic() + 0.2
    sched_results: list = []
    status_results: list = []
    threads = [
        _Stream(host, port, token, schedule_rate / streams, duration, start_at, schedule, r)
        for r in [sched_results] * streams
    ] + [
        _Stream(host, port, token, status_rate / streams, duration, start_at, status, r)
        for r in [status_results] * streams
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for _, _, code, data in sched_results:
        if code == 201:
            created.append(json.loads(data)["payment_id"])

    def report(results, ok):
        latencies = [lat for _, lat, code, _ in results if code == ok]
        errors: dict[str, int] = {}
        for _, _, code, _ in results:
            if code != ok:
                errors[str(code)] = errors.get(str(code), 0) + 1
        return {
            "requests": len(results),
            "rate_per_second": round(len(results) / duration, 1),
            "latency_ms": summarize(latencies, scale=1000, digits=2),
            "errors": errors,
            "late_starts": sum(1 for lag, *_ in results if lag > 0.010),
            "latencies_ms": sorted(round(lat * 1000, 3) for lat in latencies),
        }

    return {"schedule": report(sched_results, 201), "status": report(status_results, 200)}


def start_web(service: Service, port: int = PORT, nice: int = 0) -> tuple[str, int]:
    service.gunicorn(port, nice=nice)
    wait_http(f"http://127.0.0.1:{port}/healthz")
    return "127.0.0.1", port


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rate", type=float, default=50, help="schedule requests per second")
    parser.add_argument("--status-rate", type=float, default=100, help="status requests/s")
    parser.add_argument("--duration", type=float, default=30)
    parser.add_argument("--no-executions", action="store_true", help="no worker or beat")
    args = parser.parse_args()

    env = prepare("scheduler_bench_api", 5)
    client = create_client("bench", accounts=20, balance=10**12)
    with Service(env, "api") as service:
        base = start_web(service)
        if not args.no_executions:
            service.beat()
            service.timers()
            service.worker(2)
        result = run_load(
            base=base,
            token=client["token"],
            account_ids=client["account_ids"],
            schedule_rate=args.rate,
            status_rate=args.status_rate,
            duration=args.duration,
        )
    from payments.models import Payment

    for kind in ("schedule", "status"):
        result[kind].pop("latencies_ms")
    result |= {
        "benchmark": "api",
        "date": datetime.now(UTC).isoformat(),
        "duration_seconds": args.duration,
        "executions_running": not args.no_executions,
        "payments_completed_during_run": Payment.objects.filter(status="COMPLETED").count(),
        "gunicorn": "2 workers x 4 threads",
    }
    out = ROOT / "bench" / "results" / f"api-{datetime.now(UTC):%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    print(f"written {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
