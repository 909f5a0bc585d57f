"""API cost in-process: CPU time and queries of a schedule call and a status read.

    .venv/bin/python bench/api_cost.py [--n 500] [--profile schedule|schedule_key|status]
        [--top 25] [--name api-cost] [--served]

Recreates ``scheduler_bench_apicost``, creates a client with two funded
accounts, and sends ``--n`` ``POST /api/v1/payments/schedule``, ``--n`` more
with a fresh ``Idempotency-Key`` each (``schedule_key``: the claim and the
stored response on top) and ``--n`` ``GET /api/v1/payments/{id}`` through
Django's full request stack (middleware,
authentication, throttles, DRF, renderer) with ``django.test.Client`` in this
process — no HTTP server, no network, no other load — so the numbers are the
application's own cost. Reports per request: mean and p50 wall time, CPU time
(``time.process_time``), PostgreSQL's CPU (every server process, read from
the OS: the statements' own cost, plus the idle server's ~7 ms a second), and
the SQL statements run (each distinct statement
listed once with its count). ``--profile`` runs cProfile over one kind of
request and prints the top functions by cumulative CPU time (``--dump FILE``
also writes its pstats file, for callers/callees or a flame graph).

``--served`` calls the WSGI application as gunicorn does instead (a WSGI
environ per request, the response iterated and closed, so Django's
request_started/request_finished signals run and each request takes its
connection from the pool and gives it back), with gunicorn.conf.py's
``DB_POOL=true`` and a ``PROMETHEUS_MULTIPROC_DIR`` as docker-compose sets it:
the whole cost of a request as served, less gunicorn's own (HTTP parsing,
sockets, access log) — compared with ``bench/api_latency.py``'s web CPU per
request, the difference is gunicorn's.
Writes ``bench/results/<date>-api-cost/report.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
import json
import pstats
import shutil
import sys
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime

from bench.harness.api_load import create_client
from bench.harness.db import prepare
from bench.harness.metrics import percentile, postgres_cpu, postgres_cpu_since
from bench.harness.report import cpu_probe_ms, git_revision, write_report

DATABASE = "scheduler_bench_apicost"
REDIS_DB = 7


def measure(call, n: int) -> dict:
    """Wall and CPU time per call (ms) over ``n`` calls, after 20 warm-up calls."""
    for _ in range(20):
        call()
    walls = []
    pg_start = postgres_cpu()
    cpu_start = time.process_time()
    for _ in range(n):
        started = time.perf_counter()
        call()
        walls.append((time.perf_counter() - started) * 1000)
    cpu = (time.process_time() - cpu_start) * 1000 / n
    pg_cpu = postgres_cpu_since(pg_start) * 1000 / n
    walls.sort()
    return {
        "wall_ms_mean": round(sum(walls) / n, 3),
        "wall_ms_p50": round(percentile(walls, 50), 3),
        "cpu_ms_mean": round(cpu, 3),
        # every PostgreSQL process on the host, idle ones included (~7 ms a second)
        "postgres_cpu_ms_mean": round(pg_cpu, 3),
    }


def statements(call) -> tuple[int, list[tuple[int, str]]]:
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as ctx:
        call()
    shapes = Counter(q["sql"][:160] for q in ctx.captured_queries)
    return len(ctx.captured_queries), sorted(((c, s) for s, c in shapes.items()), reverse=True)


def profile(call, n: int, top: int, dump: str | None = None) -> str:
    profiler = cProfile.Profile(time.process_time)  # CPU time: robust to a busy host
    profiler.enable()
    for _ in range(n):
        call()
    profiler.disable()
    if dump:
        profiler.dump_stats(dump)
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(top)
    return out.getvalue()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=500)
    parser.add_argument("--profile", choices=["schedule", "schedule_key", "status"])
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--dump", help="also write the profile's pstats file here")
    parser.add_argument("--name", default="api-cost")
    parser.add_argument("--served", action="store_true", help="as gunicorn calls it (above)")
    args = parser.parse_args()

    served = {}
    if args.served:
        served = {"DB_POOL": "true", "PROMETHEUS_MULTIPROC_DIR": tempfile.mkdtemp()}
    try:
        return run(args, served)
    finally:
        if served:
            shutil.rmtree(served["PROMETHEUS_MULTIPROC_DIR"], ignore_errors=True)


class WsgiClient:
    """Requests straight into the WSGI application, environ as gunicorn builds it."""

    def __init__(self, authorization: str) -> None:
        from django.core.wsgi import get_wsgi_application

        self.app = get_wsgi_application()
        self.authorization = authorization

    def request(self, method: str, path: str, body: bytes = b"", headers=None):
        environ = {
            "REQUEST_METHOD": method,
            "SCRIPT_NAME": "",
            "PATH_INFO": path,
            "QUERY_STRING": "",
            "SERVER_NAME": "127.0.0.1",
            "SERVER_PORT": "8000",
            "SERVER_PROTOCOL": "HTTP/1.1",
            "REMOTE_ADDR": "127.0.0.1",
            "HTTP_HOST": "127.0.0.1",
            "HTTP_AUTHORIZATION": self.authorization,
            "HTTP_CONNECTION": "keep-alive",
            "wsgi.url_scheme": "http",
            "wsgi.input": io.BytesIO(body),
            "wsgi.errors": sys.stderr,
            "wsgi.version": (1, 0),
            "wsgi.multithread": True,
            "wsgi.multiprocess": True,
            "wsgi.run_once": False,
        }
        if body:
            environ["CONTENT_TYPE"] = "application/json"
            environ["CONTENT_LENGTH"] = str(len(body))
        for name, value in (headers or {}).items():
            environ["HTTP_" + name.upper().replace("-", "_")] = value
        status = []
        result = self.app(environ, lambda s, h, exc_info=None: status.append(s))
        try:
            content = b"".join(result)
        finally:
            result.close()  # request_finished: the connection goes back to the pool
        return _Response(int(status[0].split()[0]), content)


class _Response:
    def __init__(self, status_code: int, content: bytes) -> None:
        self.status_code = status_code
        self.content = content

    def json(self):
        return json.loads(self.content)


class TestClient:
    """django.test.Client (its handler keeps one connection across requests)."""

    def __init__(self, authorization: str) -> None:
        from django.test import Client

        self.http = Client(HTTP_AUTHORIZATION=authorization, HTTP_HOST="127.0.0.1")

    def request(self, method: str, path: str, body: bytes = b"", headers=None):
        if method == "GET":
            return self.http.get(path, headers=headers)
        return self.http.post(path, body, content_type="application/json", headers=headers)


def run(args, served: dict) -> int:
    prepare(DATABASE, REDIS_DB, API_THROTTLE_RATE="1000000/s", **served)  # never hit

    client_info = create_client("apicost", accounts=2, balance=10**12)
    source, target = client_info["account_ids"]
    http = (WsgiClient if served else TestClient)(f"Bearer {client_info['token']}")
    body = json.dumps(
        {"from_account_id": source, "to_account_id": target, "amount": 1, "delay_seconds": 3600}
    ).encode()

    def schedule():
        response = http.request("POST", "/api/v1/payments/schedule", body)
        assert response.status_code == 201, response.content
        return response

    keys = itertools.count()

    def schedule_key():
        response = http.request(
            "POST",
            "/api/v1/payments/schedule",
            body,
            headers={"Idempotency-Key": f"apicost-{next(keys)}"},
        )
        assert response.status_code == 201, response.content
        return response

    payment_id = schedule().json()["payment_id"]

    def status():
        response = http.request("GET", f"/api/v1/payments/{payment_id}")
        assert response.status_code == 200, response.content
        return response

    report = {
        "n": args.n,
        "at": datetime.now(UTC).isoformat(),
        "served": bool(served),
        # which code on which host: without them no two runs could be compared
        "git": git_revision(),
        "cpu_probe_ms": cpu_probe_ms(),
    }
    calls = {"schedule": schedule, "schedule_key": schedule_key, "status": status}
    for name, call in calls.items():
        count, shapes = statements(call)
        report[name] = measure(call, args.n) | {"queries": count, "statements": shapes}
        print(
            f"{name}: wall mean {report[name]['wall_ms_mean']} ms, "
            f"CPU {report[name]['cpu_ms_mean']} ms, PostgreSQL "
            f"{report[name]['postgres_cpu_ms_mean']} ms, {count} queries"
        )
        for times, sql in shapes:
            print(f"   {times} x {sql}")
    if args.profile:
        print(profile(calls[args.profile], args.n, args.top, args.dump))
    write_report(args.name, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
