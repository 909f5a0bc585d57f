"""API clients and open-loop request streams against the service's gunicorn.

Latency is measured per request from the moment it was sent to the last byte
of the answer; a request sent more than 10 ms behind its slot is a late start
(the generator falling behind).
"""

from __future__ import annotations

import http.client
import io
import json
import random
import threading
import time
from contextlib import redirect_stdout

from bench.harness.metrics import summarize
from bench.harness.processes import SERVICE_WSGI, Service, wait_http

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


class Stream(threading.Thread):
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
    Stream(host, port, token, 20, 1, time.monotonic(), schedule, warm).run()
    created += [json.loads(d)["payment_id"] for _, _, s, d in warm if s == 201]
    if not created:
        raise RuntimeError(f"warm-up schedule requests failed: {warm[:1]}")

    start_at = time.monotonic() + 0.2
    sched_results: list = []
    status_results: list = []

    def turns(rate, make_request, results, phase):
        """``streams`` streams that take turns: stream k starts (k + phase) / rate
        after ``start_at``, so together they send one request every 1 / rate s,
        not all of theirs at the same instant (8 streams in lockstep were bursts
        of 8 every 8 / rate s, measured until session 12)."""
        return [
            Stream(
                host,
                port,
                token,
                rate / streams,
                duration,
                start_at + (k + phase) / rate,
                make_request,
                results,
            )
            for k in range(streams)
        ]

    # The status streams sit halfway between the schedule streams' turns.
    threads = turns(schedule_rate, schedule, sched_results, 0) + turns(
        status_rate, status, status_results, 0.5
    )
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
        # from the request's slot: a slow answer delays the next request on its
        # stream, and that wait is the client's too (timed from the send, it is
        # not counted; 103 schedule requests started late at 1,750/s in s37)
        from_slot = [max(lag, 0.0) + lat for lag, lat, code, _ in results if code == ok]
        return {
            "requests": len(results),
            "rate_per_second": round(len(results) / duration, 1),
            "latency_ms": summarize(latencies, scale=1000, digits=2),
            "latency_from_slot_ms": summarize(from_slot, scale=1000, digits=2),
            "errors": errors,
            "late_starts": sum(1 for lag, *_ in results if lag > 0.010),
            "latencies_ms": sorted(round(lat * 1000, 3) for lat in latencies),
        }

    return {"schedule": report(sched_results, 201), "status": report(status_results, 200)}


def start_web(
    service: Service, port: int = PORT, nice: int = 0, app: str = SERVICE_WSGI
) -> tuple[str, int]:
    """gunicorn (2 workers x 4 threads, CPU weight ``nice``: ``Service.start``) serving
    ``app`` on ``port``, once it answers ``/healthz``."""
    service.gunicorn(port, nice=nice, app=app)
    wait_http(f"http://127.0.0.1:{port}/healthz")
    return "127.0.0.1", port
