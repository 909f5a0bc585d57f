"""Noisy neighbours: one client's one-off payments stay on time while others misbehave.

    .venv/bin/python bench/noisy.py [--minutes 4] [--victim-rate 5] [--quiet] [--name noisy]

Runs the production topology (gunicorn 2 x 4 threads, a payment worker -c 2,
the timer worker, the recurring worker, the webhook worker on threads, beat)
on its own database (``scheduler_bench_noisy``) and Redis database, and adds
the noise DESIGN §8 says must not reach anyone else:

- 1,000 every-minute recurring schedules (10 clients x 100, the per-client
  limit) of 1 unit between each client's own two accounts;
- a yearly schedule (an annual fee) that comes due during the run;
- 50 webhook endpoints (5 clients x 10, the per-client limit) subscribed to
  ``payment.completed``, on a local server that accepts every connection
  and never answers — every occurrence of those clients queues deliveries
  to them;
- 24 threads scraping ``/metrics`` back to back.

gunicorn runs at CPU weight ``--web-nice`` (default 6: about the 1:4 weight
docker-compose's cpu_shares gives web), set on its session's autogroup
(``bench.harness.processes.weigh``; until session 16 a plain ``nice -n``,
which acted on nothing outside the web's own session).
Meanwhile the victim, another client, schedules one-off payments through the
API at ``--victim-rate`` per second, due 2-4 s later. The report gives the
victim's lateness (``executed_at - due_at``, both stamped by the database
clock), the API latency of its schedule calls, the noise's occurrences
(scheduled / skipped / failed) and their lateness, the webhook attempts, the
scrape latency, and the exactly-once checks. ``--quiet`` runs the victim
alone, as the baseline. Writes ``bench/results/<date>-<name>/report.{json,md}``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import socket
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

from bench.harness.api_load import Stream, create_client, start_web
from bench.harness.checks import exactly_once_check
from bench.harness.clock import db_now
from bench.harness.db import prepare
from bench.harness.metrics import postgres_cpu, postgres_cpu_since, summarize, tree_cpu_seconds
from bench.harness.processes import Service
from bench.harness.report import write_report

DATABASE = "scheduler_bench_noisy"
REDIS_DB = 6
PORT = 8766
SCRAPERS = 24
NOISY_CLIENTS = 10
SCHEDULES_PER_CLIENT = 100
ENDPOINT_CLIENTS = 5
ENDPOINTS_PER_CLIENT = 10


class Blackhole(threading.Thread):
    """Accepts TCP connections and never answers (the "dead endpoint")."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4096)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self.accepted = 0

    def run(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.held.append(conn)  # never read, never answered, never closed


class Scraper(threading.Thread):
    def __init__(self, port: int, stop: threading.Event, token: str) -> None:
        super().__init__(daemon=True)
        self.port, self.stop, self.token = port, stop, token
        self.latencies: list[float] = []
        self.errors: dict[str, int] = {}

    def run(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        while not self.stop.is_set():
            started = time.monotonic()
            try:
                conn.request("GET", "/metrics", headers={"Authorization": f"Bearer {self.token}"})
                response = conn.getresponse()
                response.read()
                status = response.status
            except OSError as exc:
                conn.close()
                status = type(exc).__name__
            if status == 200:
                self.latencies.append(time.monotonic() - started)
            else:
                self.errors[str(status)] = self.errors.get(str(status), 0) + 1


def cron_at(instant: datetime) -> str:
    return f"{instant.minute} {instant.hour} {instant.day} {instant.month} *"


def make_noise(blackhole_port: int, *, schedules_on: bool, endpoints_on: bool) -> dict:
    """The noisy clients, their schedules and their dead endpoints (through the services
    the API calls, so quotas and validation apply)."""
    from django.contrib.auth import get_user_model

    from bench.harness.app import endpoint_create, recurring_create

    User = get_user_model()
    schedules = endpoints = 0
    for n in range(NOISY_CLIENTS):
        noisy = create_client(f"noisy{n}", accounts=2, balance=10**9)
        user = User.objects.get(username=f"noisy{n}")
        source, target = noisy["account_ids"]
        for _ in range(SCHEDULES_PER_CLIENT if schedules_on else 0):
            recurring_create(
                client=user,
                from_account_id=source,
                to_account_id=target,
                amount=1,
                cron="* * * * *",
                timezone="UTC",
            )
            schedules += 1
        if endpoints_on and n < ENDPOINT_CLIENTS:
            for k in range(ENDPOINTS_PER_CLIENT):
                endpoint_create(
                    client=user,
                    url=f"http://127.0.0.1:{blackhole_port}/dead/{n}/{k}",
                    event_types=["payment.completed"],
                )
                endpoints += 1
    yearly_client = create_client("annual", accounts=2, balance=10**6)
    user = User.objects.get(username="annual")
    due = (db_now() + timedelta(seconds=150)).astimezone(UTC)
    yearly = recurring_create(
        client=user,
        from_account_id=yearly_client["account_ids"][0],
        to_account_id=yearly_client["account_ids"][1],
        amount=99,
        cron=cron_at(due),
        timezone="UTC",
    )
    return {
        "schedules": schedules,
        "endpoints": endpoints,
        "yearly_id": str(yearly.pk),
        "yearly_due": due.replace(second=0, microsecond=0).isoformat(),
    }


def victim_load(token: str, accounts: list[int], rate: float, seconds: float) -> dict:
    rng = random.Random(11)

    def schedule():
        body = {
            "from_account_id": accounts[0],
            "to_account_id": accounts[1],
            "amount": 1,
            "delay_seconds": rng.randint(2, 4),
        }
        return "POST", "/api/v1/payments/schedule", json.dumps(body)

    results: list = []
    start_at = time.monotonic() + 0.1
    Stream("127.0.0.1", PORT, token, rate, seconds, start_at, schedule, results).run()
    ids = [json.loads(data)["payment_id"] for _, _, code, data in results if code == 201]
    errors: dict[str, int] = {}
    for _, _, code, _ in results:
        if code != 201:
            errors[str(code)] = errors.get(str(code), 0) + 1
    return {
        "ids": ids,
        "requests": len(results),
        "errors": errors,
        "latency_ms": summarize([lat for _, lat, code, _ in results if code == 201], 1000, 2),
    }


def wait_victim(ids: list[str], timeout: float) -> None:
    """Until every victim payment is terminal (the noise goes on regardless)."""
    from bench.harness.app import OPEN_STATUSES, Payment

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not Payment.objects.filter(pk__in=ids, status__in=OPEN_STATUSES).exists():
            return
        time.sleep(0.5)


def lateness(queryset) -> dict:
    rows = queryset.filter(status="COMPLETED").values_list("executed_at", "due_at")
    return summarize([(e - d).total_seconds() for e, d in rows], 1, 3)


def collect(noise: dict | None, victim: dict, window: tuple[datetime, datetime]) -> dict:
    from django.db.models import Count

    from bench.harness.app import (
        Payment,
        RecurringOccurrence,
        RecurringPayment,
        WebhookAttempt,
        WebhookDelivery,
    )

    victim_payments = Payment.objects.filter(pk__in=victim["ids"])
    report = {
        "victim": {
            "scheduled": len(victim["ids"]),
            "statuses": dict(victim_payments.values_list("status").annotate(n=Count("pk"))),
            "lateness_seconds": lateness(victim_payments),
            "api_schedule_latency_ms": victim["latency_ms"],
            "api_errors": victim["errors"],
        }
    }
    if noise is not None:
        start, end = window
        occurrences = RecurringOccurrence.objects.filter(scheduled_for__range=(start, end))
        yearly = RecurringPayment.objects.get(pk=noise["yearly_id"])
        report["noise"] = {
            **{k: v for k, v in noise.items() if k != "yearly_id"},
            "occurrences_in_window": dict(
                occurrences.values_list("status").annotate(n=Count("pk"))
            ),
            "occurrence_payment_lateness_seconds": lateness(
                Payment.objects.filter(recurring__isnull=False, due_at__range=(start, end))
            ),
            "schedules_paused": RecurringPayment.objects.filter(status="paused").count(),
            "yearly": {
                "status": yearly.status,
                "payments": Payment.objects.filter(recurring=yearly).count(),
                "next_run_at": yearly.next_run_at.isoformat() if yearly.next_run_at else None,
            },
            "webhook_deliveries": dict(
                WebhookDelivery.objects.values_list("status").annotate(n=Count("pk"))
            ),
            "webhook_attempts": WebhookAttempt.objects.count(),
            "bursts": bursts(start, end),
        }
    report["victim"]["late_by_second_of_minute"] = late_by_second(victim_payments)
    return report


def late_by_second(payments) -> dict[int, dict]:
    """For each second of the minute a victim payment fell due in: how many fell due
    then, and their worst lateness — shows whether lateness gathers after :00."""
    by_second: dict[int, dict] = {}
    for due_at, executed_at in payments.exclude(executed_at=None).values_list(
        "due_at", "executed_at"
    ):
        row = by_second.setdefault(due_at.second, {"n": 0, "max_s": 0.0})
        row["n"] += 1
        row["max_s"] = round(max(row["max_s"], (executed_at - due_at).total_seconds()), 3)
    return dict(sorted(by_second.items()))


def bursts(start: datetime, end: datetime) -> list[dict]:
    """Per minute of the window: the occurrence payments due then, when the first and
    the last ran (seconds after due), and the claim-to-run spread."""
    from django.db.models import Count, Max, Min

    from bench.harness.app import Payment

    rows = (
        Payment.objects.filter(recurring__isnull=False, due_at__range=(start, end))
        .exclude(executed_at=None)
        .values("due_at")
        .annotate(n=Count("pk"), first=Min("executed_at"), last=Max("executed_at"))
        .order_by("due_at")
    )
    return [
        {
            "due_at": row["due_at"].isoformat(timespec="seconds"),
            "n": row["n"],
            "first_s": round((row["first"] - row["due_at"]).total_seconds(), 3),
            "last_s": round((row["last"] - row["due_at"]).total_seconds(), 3),
        }
        for row in rows
        if row["n"] > 1
    ]


def markdown(report: dict) -> str:
    v = report["victim"]
    lines = [
        f"# Noisy neighbours — {report['name']} ({report['started_at']})",
        "",
        f"Mode: **{'victim alone (baseline)' if report['quiet'] else 'with noise'}**, "
        f"{report['minutes']} min, victim {report['victim_rate']}/s through the API, "
        f"web at CPU weight nice {report['web_nice']} (its session's).",
        "",
        "| victim one-off payments | value |",
        "|---|---|",
        f"| scheduled | {v['scheduled']} |",
        f"| statuses | {v['statuses']} |",
        f"| lateness p50 / p95 / p99 / max (s) | {v['lateness_seconds']['p50']} / "
        f"{v['lateness_seconds']['p95']} / {v['lateness_seconds']['p99']} / "
        f"{v['lateness_seconds']['max']} |",
        f"| schedule API p50 / p95 / p99 (ms) | {v['api_schedule_latency_ms']['p50']} / "
        f"{v['api_schedule_latency_ms']['p95']} / {v['api_schedule_latency_ms']['p99']} |",
        f"| API errors | {v['api_errors'] or 'none'} |",
        "",
    ]
    if "noise" in report:
        n = report["noise"]
        lines += [
            "| noise | value |",
            "|---|---|",
            f"| every-minute schedules / dead endpoints | {n['schedules']} / {n['endpoints']} |",
            f"| occurrences in the window | {n['occurrences_in_window']} |",
            f"| occurrence payments' lateness p50 / p99 (s) | "
            f"{n['occurrence_payment_lateness_seconds']['p50']} / "
            f"{n['occurrence_payment_lateness_seconds']['p99']} |",
            f"| schedules paused | {n['schedules_paused']} |",
            f"| yearly schedule | {n['yearly']} |",
            f"| webhook deliveries / attempts | {n['webhook_deliveries']} / "
            f"{n['webhook_attempts']} |",
            f"| /metrics scrapes (24 threads) | {report['scrapes']['count']} ok, p50 "
            f"{report['scrapes']['latency_ms']['p50']} ms, p99 "
            f"{report['scrapes']['latency_ms']['p99']} ms, errors {report['scrapes']['errors']} |",
            f"| dead-endpoint connections accepted | {report['blackhole_connections']} |",
            "",
            "Every-minute bursts (occurrence payments due at one instant: "
            "first and last run, seconds after due):",
            "",
            *(
                f"- {b['due_at']}: {b['n']} payments, {b['first_s']} to {b['last_s']} s"
                for b in n["bursts"]
            ),
            "",
            "Victim payments by the second of the minute they fell due in "
            "(count / worst lateness s): "
            + ", ".join(
                f":{sec:02d} {row['n']}/{row['max_s']}"
                for sec, row in v["late_by_second_of_minute"].items()
            ),
            "",
        ]
    checks = report["exactly_once"]
    lines += [
        f"Noise: {report['noise_parts']}",
        "",
        f"CPU seconds during the {report['minutes']} min window, by process tree: "
        f"{report['cpu_seconds_in_window']}",
        "",
        f"Exactly once: {checks}",
        "",
        f"Target: victim p99 lateness ≤ 1 s — **{'met' if report['met'] else 'not met'}**.",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=4)
    parser.add_argument("--victim-rate", type=float, default=5)
    parser.add_argument("--quiet", action="store_true", help="the victim alone (baseline)")
    parser.add_argument("--name", default="noisy")
    parser.add_argument("--no-schedules", action="store_true", help="leave out the 1,000 schedules")
    parser.add_argument("--no-endpoints", action="store_true", help="leave out the dead endpoints")
    parser.add_argument("--no-scrapers", action="store_true", help="leave out the scrapers")
    parser.add_argument(
        "--background-nice",
        type=int,
        default=0,
        help="nice level of the recurring and webhook workers",
    )
    parser.add_argument(
        "--web-nice",
        type=int,
        default=6,
        help="gunicorn's nice level (default 6: the 1:4 CPU weight docker-compose gives web)",
    )
    args = parser.parse_args()

    env = prepare(
        DATABASE,
        REDIS_DB,
        WEBHOOK_ALLOW_HTTP="true",
        WEBHOOK_ALLOWED_HOSTS="127.0.0.1",
        METRICS_TOKEN="bench-metrics",  # noqa: S106 - a bench-only token
    )
    blackhole = Blackhole()
    blackhole.start()
    victim_client = create_client("victim", accounts=2, balance=10**9)
    noise = (
        None
        if args.quiet
        else make_noise(
            blackhole.port,
            schedules_on=not args.no_schedules,
            endpoints_on=not args.no_endpoints,
        )
    )
    started_at = datetime.now(UTC)
    stop = threading.Event()
    scrapers: list[Scraper] = []
    with Service(env, f"noisy-{args.name}") as service:
        start_web(service, PORT, nice=args.web_nice)
        service.background(nice=args.background_nice)
        service.worker(2)
        service.beat()
        if not args.quiet:
            # let the materialiser reach its steady state (one-minute occurrences flowing)
            time.sleep(70)
            if not args.no_scrapers:
                scrapers = [Scraper(PORT, stop, "bench-metrics") for _ in range(SCRAPERS)]
            for scraper in scrapers:
                scraper.start()
        cpu_before = {role: tree_cpu_seconds(proc.pid) for role, proc in service.procs.items()}
        pg_before = postgres_cpu()
        window_start = db_now()
        victim = victim_load(
            victim_client["token"],
            victim_client["account_ids"],
            args.victim_rate,
            args.minutes * 60,
        )
        window_end = db_now()
        cpu = {
            role: round(tree_cpu_seconds(proc.pid) - cpu_before[role], 1)
            for role, proc in service.procs.items()
        }
        cpu["postgres"] = round(postgres_cpu_since(pg_before), 1)
        stop.set()
        for scraper in scrapers:
            scraper.join(30)
        wait_victim(victim["ids"], 120)
        report = collect(noise, victim, (window_start, window_end))
    scrape_latencies = [lat for s in scrapers for lat in s.latencies]
    scrape_errors: dict[str, int] = {}
    for scraper in scrapers:
        for key, n in scraper.errors.items():
            scrape_errors[key] = scrape_errors.get(key, 0) + n
    checks = exactly_once_check()
    p99 = report["victim"]["lateness_seconds"]["p99"]
    report |= {
        "name": args.name,
        "started_at": started_at.isoformat(timespec="seconds"),
        "minutes": args.minutes,
        "victim_rate": args.victim_rate,
        "quiet": args.quiet,
        "scrapes": {
            "count": len(scrape_latencies),
            "latency_ms": summarize(scrape_latencies, 1000, 1),
            "errors": scrape_errors,
        },
        "blackhole_connections": blackhole.accepted,
        "noise_parts": {
            "schedules": not (args.quiet or args.no_schedules),
            "endpoints": not (args.quiet or args.no_endpoints),
            "scrapers": not (args.quiet or args.no_scrapers),
        },
        "cpu_seconds_in_window": cpu,
        "web_nice": args.web_nice,
        "background_nice": args.background_nice,
        "materialize_ahead_seconds": int(env.get("RECURRING_MATERIALIZE_AHEAD_SECONDS", "60")),
        "exactly_once": checks,
        "met": p99 is not None and p99 <= 1.0 and checks["duplicates"] == 0,
    }
    write_report(args.name, report, when=started_at, markdown=markdown(report))
    print(markdown(report))
    return 0 if report["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
