"""The benchmark harness: every scenario of issue #7 in one run, one report.

    .venv/bin/python bench/run.py [--name NAME] [--payments 100000] [--quick]
                                  [--only drain,hot,steady,scale,pglimit,peers]

Runs on PostgreSQL + Redis with real ``celery`` and ``gunicorn`` processes
and writes ``bench/results/<date>-<name>/``: ``report.json`` (every number
and the series behind the charts), ``report.md`` and ``*.png`` charts.
Each scenario runs in its own subprocess on its own freshly migrated
database (``scheduler_bench_<scenario>``) and Redis db:

- ``drain``   N payments (default 100,000) due at the same instant T0 across
  1,000 source and 1,000 target accounts: drain time, throughput, lateness,
  worker / database CPU;
- ``hot``     the same, every payment into one account;
- ``steady``  R payments/s (default 350) due continuously for S seconds
  (default 180) while the API takes schedule + status requests at a fixed
  rate: lateness per second and API latency under that load;
- ``scale``   sweep cost with 10,000 vs 1,000,000 pending far-future
  payments, worker memory with each, bytes per pending payment on disk;
- ``pglimit`` the physical limit on the same PostgreSQL: ``pgbench`` running a
  PL/pgSQL double-entry transfer (entry, two postings, two balance updates,
  under the same triggers), one per transaction and 200 per transaction;
- ``peers``   Celery ``apply_async(eta=…)`` and django-celery-beat
  ``ClockedSchedule`` one-off tasks on the same workload (``bench/peers.py``).

``--quick`` shrinks every size (a smoke run of the harness, not a result).
Lateness is ``executed_at - due_at``, both stamped by the database clock.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    ROOT,
    Service,
    bulk_schedule,
    exactly_once_check,
    fund_accounts,
    percentile,
    prepare,
    summarize,
    wait_terminal,
)

SCENARIOS = ("drain", "hot", "steady", "scale", "pglimit", "peers")
REDIS_DB = {"drain": 8, "hot": 8, "steady": 8, "scale": 8, "pglimit": 8}


# ---------------------------------------------------------------- measuring
def _tree(pid: int):
    import psutil

    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def tree_cpu_seconds(pid: int) -> float:
    total = 0.0
    for proc in _tree(pid):
        try:
            times = proc.cpu_times()
            total += times.user + times.system
        except Exception:  # noqa: S112 - a child that just exited
            continue
    return total


def tree_rss_mb(pid: int) -> float:
    total = 0
    for proc in _tree(pid):
        try:
            total += proc.memory_info().rss
        except Exception:  # noqa: S112
            continue
    return round(total / 2**20, 1)


def postgres_cpu() -> dict[int, float]:
    """CPU seconds used so far by each live PostgreSQL server process (all databases)."""
    import psutil

    out = {}
    for proc in psutil.process_iter(["name", "cpu_times"]):
        if proc.info["name"] in ("postgres", "postmaster") and proc.info["cpu_times"]:
            out[proc.pid] = proc.info["cpu_times"].user + proc.info["cpu_times"].system
    return out


def postgres_cpu_since(before: dict[int, float]) -> float:
    """CPU the server's processes used since ``before`` (a backend that exited meanwhile
    is not counted: the services keep their connections, so that undercounts little)."""
    return sum(now - before.get(pid, 0.0) for pid, now in postgres_cpu().items())


def cdf(values: list[float], points: int = 200) -> list[float]:
    """``points + 1`` evenly spaced quantiles of ``values`` (for CDF charts)."""
    ordered = sorted(values)
    return [percentile(ordered, 100 * i / points) for i in range(points + 1)] if ordered else []


def set_due_at(t0: datetime, rate: float | None = None) -> None:
    """Make every payment due at ``t0`` (or from ``t0`` on at ``rate`` per second)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if rate is None:
            cursor.execute("UPDATE payments_payment SET due_at = %s, run_at = %s", [t0, t0])
        else:
            cursor.execute(
                """
                UPDATE payments_payment p
                   SET due_at = %(t0)s + make_interval(secs => (o.n - 1) / %(rate)s),
                       run_at = %(t0)s + make_interval(secs => (o.n - 1) / %(rate)s)
                  FROM (SELECT id, row_number() OVER (ORDER BY id) AS n
                          FROM payments_payment) o
                 WHERE p.id = o.id
                """,
                {"t0": t0, "rate": float(rate)},
            )
        cursor.execute("VACUUM ANALYZE payments_payment")


def lateness_rows():
    from payments.models import Payment

    return list(
        Payment.objects.filter(status="COMPLETED").values_list("due_at", "executed_at", "pk")
    )


def progress_sampler(t0_monotonic: float, samples: list, stop) -> None:
    """Every 0.5 s: (seconds since T0, completed) — run in a thread."""
    from django.db import connection

    from payments.models import Payment

    while not stop.is_set():
        samples.append(
            (
                round(time.monotonic() - t0_monotonic, 2),
                Payment.objects.filter(status="COMPLETED").count(),
            )
        )
        stop.wait(0.5)
    connection.close()


# ---------------------------------------------------------------- scenarios
def scenario_drain(args, hot: bool) -> dict:
    import threading

    env = prepare("scheduler_bench_drain", REDIS_DB["drain"])
    from payments.clock import db_now

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
    stop = threading.Event()
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
        wall0 = time.monotonic()
        sampler = threading.Thread(target=progress_sampler, args=(t0_mono, samples, stop))
        sampler.start()
        remaining = wait_terminal(args.timeout, poll=0.25)
        wall = time.monotonic() - wall0
        cpu1 = (
            tree_cpu_seconds(worker.pid),
            tree_cpu_seconds(beat.pid),
            tree_cpu_seconds(timers.pid),
        )
        pg_cpu = postgres_cpu_since(cpu0[2])
        rss = tree_rss_mb(worker.pid)
        stop.set()
        sampler.join()
    rows = lateness_rows()
    lateness = [(e - d).total_seconds() for d, e, _ in rows]
    last = max((e for _, e, _ in rows), default=None)
    drain = (last - t0).total_seconds() if last else None
    checks = exactly_once_check()
    from ledger.models import Account

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
        "checks": checks,
        "series": {"progress": samples, "lateness_cdf": cdf(lateness)},
    }


def scenario_steady(args) -> dict:
    import threading

    from bench.api_latency import create_client, run_load, start_web

    env = prepare("scheduler_bench_steady", REDIS_DB["steady"])
    from payments.clock import db_now
    from payments.models import Payment

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


_INSERT_PENDING_SQL = """
WITH src AS (
    SELECT gen_random_uuid() AS pid, g,
           (%(accounts)s::bigint[])[1 + g %% %(n_accounts)s] AS account_id,
           (%(partitions)s::int[])[1 + g %% %(n_accounts)s] AS part
      FROM generate_series(1, %(count)s) AS g
), holds AS (
    INSERT INTO ledger_hold (account_id, amount, status, reference)
    SELECT account_id, 1, 'active', 'payment:' || pid FROM src
    RETURNING id, reference
), payments AS (
    INSERT INTO payments_payment
           (id, from_account_id, to_account_id, amount, description, metadata, status,
            due_at, run_at, partition, fence, attempts, hold_id, error_code, error_message)
    SELECT src.pid, src.account_id, %(target)s, 1, '', '{}', 'PENDING',
           now() + interval '30 days' + g * interval '1 second',
           now() + interval '30 days' + g * interval '1 second',
           src.part, 0, 0, holds.id, '', ''
      FROM src JOIN holds ON holds.reference = 'payment:' || src.pid
    RETURNING id
)
INSERT INTO payments_paymentevent (payment_id, type, from_status, to_status, actor, data)
SELECT id, 'scheduled', '', 'PENDING', 'client', '{}' FROM payments
"""


def insert_far_future(count: int, accounts: list[int], target: int) -> None:
    """Add ``count`` PENDING payments due in 30+ days (holds and events too), in SQL."""
    from django.db import connection, transaction

    from payments.services import partition_for

    partitions = [partition_for(a) for a in accounts]
    step = 100_000
    for start in range(0, count, step):
        with transaction.atomic(), connection.cursor() as cursor:
            n = min(step, count - start)
            cursor.execute(
                _INSERT_PENDING_SQL,
                {
                    "accounts": accounts,
                    "partitions": partitions,
                    "n_accounts": len(accounts),
                    "count": n,
                    "target": target,
                },
            )
            cursor.execute(
                """
                UPDATE ledger_account a SET held = a.held + c.n
                  FROM (SELECT (%(accounts)s::bigint[])[1 + g %% %(n_accounts)s] AS id,
                               count(*) AS n
                          FROM generate_series(1, %(count)s) g GROUP BY 1) c
                 WHERE a.id = c.id
                """,
                {"accounts": accounts, "n_accounts": len(accounts), "count": n},
            )
    with connection.cursor() as cursor:
        cursor.execute("VACUUM ANALYZE payments_payment")
        cursor.execute("VACUUM ANALYZE ledger_hold")


def measure_sweep(sources, target, repeats: int) -> dict:
    """Median wall time of an idle sweep and of a sweep that claims 2,000 due payments."""
    import statistics

    import redis
    from django.conf import settings

    from payments import scheduling
    from payments.clock import db_now

    idle = []
    for _ in range(repeats * 4):
        started = time.perf_counter()
        scheduling.sweep_due()
        idle.append(time.perf_counter() - started)
    claim = []
    claimed = 0
    for _ in range(repeats):
        bulk_schedule(
            sources=sources,
            targets=[target],
            count=settings.PAYMENT_SWEEP_BATCH,
            amount=1,
            due_at=db_now() - timedelta(seconds=1),
        )
        started = time.perf_counter()
        result = scheduling.sweep_due(max_batches=1)
        claim.append(time.perf_counter() - started)
        claimed += result.claimed
        # Out of the way of the next round: not pending any more, not queued.
        from payments.models import Payment

        Payment.objects.filter(status="QUEUED").update(status="CANCELLED")
    redis.Redis.from_url(settings.CELERY_BROKER_URL).flushdb()
    return {
        "idle_sweep_ms": round(statistics.median(idle) * 1000, 2),
        "claim_2000_ms": round(statistics.median(claim) * 1000, 2),
        "claimed": claimed,
    }


def measure_worker_memory(env, name: str, seconds: float) -> dict:
    with Service(env, name) as service:
        worker = service.worker(2)
        service.timers()
        service.beat()
        time.sleep(seconds / 2)
        first = tree_rss_mb(worker.pid)
        time.sleep(seconds / 2)
        return {"rss_mb_start": first, "rss_mb_end": tree_rss_mb(worker.pid)}


def scenario_scale(args) -> dict:
    env = prepare("scheduler_bench_scale", REDIS_DB["scale"])
    from django.db import connection

    from payments.models import Payment

    sources = fund_accounts(100, 10**10)
    target = fund_accounts(1, 0)[0]
    out: dict = {"sizes": {}}
    have = 0
    for size in (args.scale_small, args.scale_large):
        insert_far_future(size - have, sources, target)
        have = size
        pending = Payment.objects.filter(status="PENDING").count()
        entry = {"pending": pending, **measure_sweep(sources, target, repeats=5)}
        entry["worker_memory"] = measure_worker_memory(env, f"scale-{size}", args.memory_seconds)
        with connection.cursor() as cursor:
            cursor.execute(
                """SELECT pg_total_relation_size('payments_payment'),
                          pg_total_relation_size('ledger_hold'),
                          pg_total_relation_size('payments_paymentevent'),
                          (SELECT count(*) FROM payments_payment),
                          (SELECT count(*) FROM ledger_hold),
                          (SELECT count(*) FROM payments_paymentevent)"""
            )
            pay, hold, event, n_pay, n_hold, _ = cursor.fetchone()
        entry["bytes_per_payment"] = {
            "payment_row_and_indexes": round(pay / n_pay),
            "hold_row_and_indexes": round(hold / n_hold),
            "events": round(event / n_pay),
            "total": round((pay + hold + event) / n_pay),
        }
        out["sizes"][str(size)] = entry
    small, large = (out["sizes"][str(s)] for s in (args.scale_small, args.scale_large))
    out["claim_cost_ratio"] = round(large["claim_2000_ms"] / small["claim_2000_ms"], 2)
    out["idle_sweep_ratio"] = round(large["idle_sweep_ms"] / small["idle_sweep_ms"], 2)
    return out


_PG_FUNCTIONS = """
CREATE OR REPLACE FUNCTION bench_transfer(a bigint, b bigint, amt bigint) RETURNS void AS $$
DECLARE eid bigint; ba bigint; bb bigint;
BEGIN
    PERFORM 1 FROM ledger_account WHERE id IN (a, b) ORDER BY id FOR NO KEY UPDATE;
    UPDATE ledger_account SET balance = balance - amt, version = version + 1,
           updated_at = now() WHERE id = a RETURNING balance INTO ba;
    UPDATE ledger_account SET balance = balance + amt, version = version + 1,
           updated_at = now() WHERE id = b RETURNING balance INTO bb;
    INSERT INTO ledger_journalentry (kind, reference, description)
         VALUES ('transfer', 'pgbench:' || gen_random_uuid(), 'pgbench') RETURNING id INTO eid;
    INSERT INTO ledger_posting (entry_id, account_id, amount, balance_after)
         VALUES (eid, a, -amt, ba), (eid, b, amt, bb);
END $$ LANGUAGE plpgsql;

CREATE OR REPLACE FUNCTION bench_transfer_batch(lo bigint, hi bigint, n int) RETURNS void AS $$
DECLARE a bigint[]; b bigint[]; i int;
BEGIN
    -- n random distinct pairs; lock every account of the batch in id order
    -- first (as the service's executor does), so batches never deadlock.
    SELECT array_agg(x), array_agg(lo + ((x - lo + 1 + floor(random() * (hi - lo))::bigint)
                                        % (hi - lo + 1)))
      INTO a, b
      FROM (SELECT lo + floor(random() * (hi - lo + 1))::bigint AS x
              FROM generate_series(1, n)) s;
    PERFORM 1 FROM ledger_account WHERE id = ANY(a || b) ORDER BY id FOR NO KEY UPDATE;
    FOR i IN 1..n LOOP
        PERFORM bench_transfer(a[i], b[i], 1);
    END LOOP;
END $$ LANGUAGE plpgsql;
"""


def _pgbench(url: str, script: str, seconds: int, clients: int) -> float:
    """Run pgbench with ``script``; return transactions per second (excluding connect)."""
    import re
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".sql", delete=False) as handle:
        handle.write(script)
    out = subprocess.run(
        [
            "pgbench",
            "-n",
            "-c",
            str(clients),
            "-j",
            str(clients),
            "-T",
            str(seconds),
            "-f",
            handle.name,
            url,
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    os.unlink(handle.name)
    return float(re.search(r"tps = ([\d.]+)", out).group(1))


def scenario_pglimit(args) -> dict:
    prepare("scheduler_bench_pglimit", REDIS_DB["pglimit"])
    from django.db import connection

    accounts = fund_accounts(1000, 10**12)
    with connection.cursor() as cursor:
        cursor.execute(_PG_FUNCTIONS)
    url = os.environ["DATABASE_URL"].replace("postgres://", "postgresql://")
    lo, hi = min(accounts), max(accounts)
    single = _pgbench(
        url,
        f"\\set a random({lo}, {hi})\n\\set b random({lo}, {hi})\n"
        f"SELECT bench_transfer(:a, CASE WHEN :a = :b THEN {lo} + ((:b - {lo} + 1) % {hi - lo + 1})"
        " ELSE :b END, 1);\n",
        args.pgbench_seconds,
        clients=2,
    )
    batch = 200
    batched = _pgbench(
        url, f"SELECT bench_transfer_batch({lo}, {hi}, {batch});\n", args.pgbench_seconds, 2
    )
    from ledger.reconciliation import reconcile

    return {
        "clients": 2,
        "seconds": args.pgbench_seconds,
        "single_transfers_per_second": round(single, 1),
        "batched_transfers_per_second": round(batched * batch, 1),
        "batch_size": batch,
        "work_per_transfer": "lock 2 accounts, 2 balance updates, 1 entry, 2 postings "
        "(same tables, constraints and balance triggers as the service)",
        "reconcile_ok": reconcile().ok,
    }


def scenario_peers(args) -> dict:
    from bench.peers import run_peers

    return run_peers(
        n=args.peer_payments,
        sources=200,
        targets=200,
        concurrency=args.concurrency,
        kill=True,
        future=args.peer_future,
    )


# ---------------------------------------------------------------- reporting
TARGETS = [
    ("drain: 100k due at once, drain seconds", "drain", "drain_seconds", 60, "<="),
    ("hot account: 100k, drain seconds", "hot", "drain_seconds", 60, "<="),
    ("steady: p99 lateness (s)", "steady", "lateness_seconds.p99", 0.25, "<="),
    ("API under load: schedule p95 (ms)", "steady", "api.schedule.latency_ms.p95", 20, "<="),
    ("API under load: status p95 (ms)", "steady", "api.status.latency_ms.p95", 5, "<="),
    ("scale: idle sweep cost 1M / 10k", "scale", "idle_sweep_ratio", 1.2, "<="),
    ("scale: claim-2,000 cost 1M / 10k", "scale", "claim_cost_ratio", 1.2, "<="),
]


def dig(data: dict, path: str):
    for key in path.split("."):
        if not isinstance(data, dict) or key not in data:
            return None
        data = data[key]
    return data


def target_rows(results: dict) -> list[dict]:
    rows = []
    for label, scenario, path, limit, op in TARGETS:
        if scenario not in results or "error" in results[scenario]:
            continue
        value = dig(results[scenario], path)
        met = value is not None and (value <= limit if op == "<=" else value >= limit)
        if scenario in ("drain", "hot") and results[scenario].get("payments", 0) < 100_000:
            met = None  # a smaller run cannot show the 100k target
        rows.append({"target": label, "limit": limit, "value": value, "met": met})
    if "scale" in results and "sizes" in results["scale"]:
        sizes = list(results["scale"]["sizes"].values())
        growth = sizes[-1]["worker_memory"]["rss_mb_end"] - sizes[0]["worker_memory"]["rss_mb_end"]
        rows.append(
            {
                "target": "worker RSS growth 10k -> 1M pending (MB)",
                "limit": 10,
                "value": round(growth, 1),
                "met": growth <= 10,
            }
        )
    return rows


def charts(results: dict, out: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    made = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(out / name, dpi=110)
        plt.close(fig)
        made.append(name)

    drains = [(k, results[k]) for k in ("drain", "hot") if "series" in results.get(k, {})]
    if drains:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, data in drains:
            xs, ys = zip(*data["series"]["progress"], strict=True)
            ax.plot(xs, ys, label=f"{name} ({data['payments']:,})")
        ax.set_xlabel("seconds since T0")
        ax.set_ylabel("payments completed")
        ax.set_title("Drain: payments due at the same instant")
        ax.axvline(60, color="grey", linestyle="--", linewidth=0.8)
        ax.legend()
        save(fig, "drain_progress.png")

    cdfs = [
        (k, results[k]["series"]["lateness_cdf"])
        for k in ("drain", "hot", "steady")
        if results.get(k, {}).get("series", {}).get("lateness_cdf")
    ]
    if cdfs:
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, values in cdfs:
            ax.plot(values, [i / (len(values) - 1) for i in range(len(values))], label=name)
        ax.set_xscale("symlog", linthresh=0.01)
        ax.set_xlabel("lateness, executed_at - due_at (s)")
        ax.set_ylabel("fraction of payments")
        ax.set_title("Lateness CDF")
        ax.legend()
        save(fig, "lateness_cdf.png")

    steady = results.get("steady", {})
    if steady.get("series", {}).get("lateness_per_second"):
        sec, p50, p99 = zip(*steady["series"]["lateness_per_second"], strict=True)
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.plot(sec, [v * 1000 for v in p50], label="p50")
        ax.plot(sec, [v * 1000 for v in p99], label="p99")
        ax.axhline(250, color="grey", linestyle="--", linewidth=0.8, label="target p99 250 ms")
        ax.set_xlabel("due second since T0")
        ax.set_ylabel("lateness (ms)")
        ax.set_title(f"Steady load: {steady['rate_per_second']}/s due continuously")
        ax.legend()
        save(fig, "steady_lateness.png")
        fig, ax = plt.subplots(figsize=(7, 4))
        for name, values in steady["series"]["api_latency_cdf_ms"].items():
            if values:
                ax.plot(values, [i / (len(values) - 1) for i in range(len(values))], label=name)
        ax.set_xscale("log")
        ax.set_xlabel("latency (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_title("API latency under steady load")
        ax.legend()
        save(fig, "api_latency_cdf.png")

    peers = results.get("peers", {})
    rows = [("this service (drain)", results.get("drain", {}))]
    rows += [(k, v) for k, v in peers.items() if isinstance(v, dict) and "lateness_seconds" in v]
    rows = [(k, v) for k, v in rows if v.get("throughput_per_second")]
    if len(rows) > 1:
        fig, (left, right) = plt.subplots(1, 2, figsize=(9, 4))
        names = [k for k, _ in rows]
        left.bar(names, [v["throughput_per_second"] for _, v in rows])
        left.set_title("throughput (payments/s)")
        right.bar(names, [v["lateness_seconds"]["p99"] for _, v in rows])
        right.set_title("p99 lateness (s)")
        for ax in (left, right):
            ax.tick_params(axis="x", rotation=20)
        save(fig, "peers.png")
    return made


def fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def markdown(report: dict) -> str:
    r = report["results"]
    lines = [
        f"# Benchmark report: {report['name']}",
        "",
        f"{report['date']} · {report['machine']['cpus']} CPUs · "
        f"{report['machine']['memory_gb']} GiB · {report['machine']['platform']} · "
        f"PostgreSQL {report['machine']['postgres']} · Redis {report['machine']['redis']} · "
        f"git {report['git']}",
        "",
        f"Command: `{report['command']}`",
        "",
        "Service settings: defaults"
        + "".join(f", {k}={v}" for k, v in report.get("env_overrides", {}).items()),
        "",
        "## Targets",
        "",
        "| target | limit | measured | met |",
        "|---|---|---|---|",
    ]
    for row in report["targets"]:
        met = {True: "yes", False: "**no**", None: "n/a (smaller run)"}[row["met"]]
        lines.append(f"| {row['target']} | {fmt(row['limit'])} | {fmt(row['value'])} | {met} |")
    for name in ("drain", "hot"):
        d = r.get(name)
        if not d or "error" in d:
            continue
        lat, cpu = d["lateness_seconds"], d["cpu"]
        lines += [
            "",
            f"## {name}: {d['payments']:,} payments due at T0 "
            f"({d['source_accounts']} sources → {d['target_accounts']} targets)",
            "",
            f"- drained in **{fmt(d['drain_seconds'])} s**, "
            f"**{fmt(d['throughput_per_second'])} payments/s** "
            f"(worker `-c {d['worker_concurrency']}`)",
            f"- lateness p50 {fmt(lat['p50'])} s, p95 {fmt(lat['p95'])} s, "
            f"p99 {fmt(lat['p99'])} s, max {fmt(lat['max'])} s",
            f"- CPU over {fmt(cpu['wall_seconds'])} s: worker {fmt(cpu['worker_cpu_seconds'])} s, "
            f"beat {fmt(cpu['beat_cpu_seconds'])} s, PostgreSQL "
            f"{fmt(cpu['postgres_cpu_seconds'])} s; worker RSS {fmt(cpu['worker_rss_mb'])} MB",
            f"- checks: {json.dumps(d['checks'])}",
        ]
    s = r.get("steady")
    if s and "error" not in s:
        lat = s["lateness_seconds"]
        lines += [
            "",
            f"## steady: {s['rate_per_second']} payments/s due for {s['seconds']} s, "
            "API under load",
            "",
            f"- lateness p50 {fmt(lat['p50'])} s, p95 {fmt(lat['p95'])} s, "
            f"p99 {fmt(lat['p99'])} s, max {fmt(lat['max'])} s over {lat['count']:,} payments",
        ]
        for kind in ("schedule", "status"):
            a = s["api"].get(kind, {})
            if a:
                ms = a["latency_ms"]
                lines.append(
                    f"- API {kind} at {a['rate_per_second']}/s: p50 {fmt(ms['p50'])} ms, "
                    f"p95 {fmt(ms['p95'])} ms, p99 {fmt(ms['p99'])} ms "
                    f"(errors {a['errors'] or 0}, late starts {a['late_starts']})"
                )
        lines.append(f"- checks: {json.dumps(s['checks'])}")
    sc = r.get("scale")
    if sc and "error" not in sc:
        lines += [
            "",
            "## scale: pending far-future payments",
            "",
            "| pending | idle sweep (ms) | claim 2,000 due (ms) | worker RSS (MB) "
            "| bytes/payment (payment + hold + event) |",
            "|---|---|---|---|---|",
        ]
        for entry in sc["sizes"].values():
            b = entry["bytes_per_payment"]
            lines.append(
                f"| {entry['pending']:,} | {fmt(entry['idle_sweep_ms'])} "
                f"| {fmt(entry['claim_2000_ms'])} | {fmt(entry['worker_memory']['rss_mb_end'])} "
                f"| {b['total']:,} ({b['payment_row_and_indexes']:,} + "
                f"{b['hold_row_and_indexes']:,} + {b['events']:,}) |"
            )
        lines.append(
            f"\nClaim cost ratio {fmt(sc['claim_cost_ratio'])}, "
            f"idle sweep ratio {fmt(sc['idle_sweep_ratio'])}."
        )
    p = r.get("pglimit")
    if p and "error" not in p:
        ours = r.get("drain", {}).get("throughput_per_second")
        lines += [
            "",
            "## physical limit (pgbench, same PostgreSQL)",
            "",
            f"- PL/pgSQL transfer, one per transaction, {p['clients']} clients: "
            f"**{fmt(p['single_transfers_per_second'])}/s**",
            f"- {p['batch_size']} per transaction: **{fmt(p['batched_transfers_per_second'])}/s**",
            f"- work per transfer: {p['work_per_transfer']}",
        ]
        if ours:
            lines.append(
                f"- this service's drain throughput is "
                f"**{ours / p['batched_transfers_per_second']:.0%}** of the batched limit and "
                f"{ours / p['single_transfers_per_second']:.0%} of the single-transfer one "
                "(the service also captures a hold, updates the payment and writes an attempt "
                "and an event per payment)"
            )
    peers = r.get("peers")
    if peers and "error" not in peers:
        lines += ["", "## peers (same workload)", "", "```json", json.dumps(peers, indent=2), "```"]
    errors = {k: v["error"] for k, v in r.items() if isinstance(v, dict) and "error" in v}
    if errors:
        lines += ["", "## scenarios that failed to run", ""]
        lines += [f"- {k}: {v}" for k, v in errors.items()]
    lines += ["", "## Charts", ""] + [f"![{c}]({c})" for c in report["charts"]]
    return "\n".join(lines) + "\n"


def machine() -> dict:
    import psutil
    import psycopg
    import redis

    from bench.common import PG_SERVER, REDIS_SERVER

    with psycopg.connect(f"{PG_SERVER}/postgres") as conn:
        pg = conn.execute("SHOW server_version").fetchone()[0]
    return {
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "postgres": pg,
        "redis": redis.Redis.from_url(REDIS_SERVER).info()["redis_version"],
    }


def without_option(argv: list[str], option: str) -> list[str]:
    """``argv`` minus ``option`` and its value (``--x v`` or ``--x=v``)."""
    out, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg == option:
            skip = True
        elif not arg.startswith(option + "="):
            out.append(arg)
    return out


def run_scenario_subprocess(name: str, argv: list[str], out: Path) -> dict:
    path = out / f"{name}.json"
    started = time.monotonic()
    print(f"== {name} …", flush=True)
    proc = subprocess.run(
        [sys.executable, __file__, "--scenario", name, "--scenario-out", str(path), *argv],
        cwd=ROOT,
    )
    if proc.returncode != 0 or not path.exists():
        return {"error": f"exit {proc.returncode}; see output above"}
    data = json.loads(path.read_text())
    data["elapsed_seconds"] = round(time.monotonic() - started, 1)
    print(f"== {name} done in {data['elapsed_seconds']} s", flush=True)
    return data


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--name", default="full")
    parser.add_argument("--only", default=",".join(SCENARIOS))
    parser.add_argument("--quick", action="store_true", help="small sizes: a smoke run")
    parser.add_argument("--payments", type=int, default=100_000)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--steady-rate", type=float, default=350)
    parser.add_argument("--steady-seconds", type=float, default=180)
    parser.add_argument("--api-schedule-rate", type=float, default=50)
    parser.add_argument("--api-status-rate", type=float, default=100)
    parser.add_argument("--scale-small", type=int, default=10_000)
    parser.add_argument("--scale-large", type=int, default=1_000_000)
    parser.add_argument("--memory-seconds", type=float, default=20)
    parser.add_argument("--pgbench-seconds", type=int, default=20)
    parser.add_argument("--peer-payments", type=int, default=10_000)
    parser.add_argument("--peer-future", type=int, default=100_000)
    parser.add_argument("--timeout", type=float, default=900)
    parser.add_argument("--scenario", help=argparse.SUPPRESS)
    parser.add_argument("--scenario-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.payments, args.steady_seconds, args.steady_rate = 5_000, 30, 100
        args.scale_large, args.memory_seconds, args.pgbench_seconds = 50_000, 6, 5
        args.peer_payments, args.peer_future = 1_000, 5_000
    return args


def main() -> int:
    args = parse_args()
    if args.scenario:  # child: one scenario, JSON to --scenario-out
        runner = {
            "drain": lambda: scenario_drain(args, hot=False),
            "hot": lambda: scenario_drain(args, hot=True),
            "steady": lambda: scenario_steady(args),
            "scale": lambda: scenario_scale(args),
            "pglimit": lambda: scenario_pglimit(args),
            "peers": lambda: scenario_peers(args),
        }[args.scenario]
        Path(args.scenario_out).write_text(json.dumps(runner(), default=str))
        return 0

    date = datetime.now(UTC)
    out = ROOT / "bench" / "results" / f"{date:%Y-%m-%d}-{args.name}"
    out.mkdir(parents=True, exist_ok=True)
    child_argv = without_option(sys.argv[1:], "--only")
    selected = [s.strip() for s in args.only.split(",") if s.strip()]
    results = {name: run_scenario_subprocess(name, child_argv, out) for name in selected}
    git = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    report = {
        "name": args.name,
        "date": date.isoformat(timespec="seconds"),
        "command": "bench/run.py " + " ".join(sys.argv[1:]),
        "git": git,
        "machine": machine(),
        # service settings differing from the defaults in settings/base.py
        "env_overrides": {
            k: v for k, v in sorted(os.environ.items()) if k.startswith(("PAYMENT_", "CELERY_"))
        },
        "results": results,
        "targets": target_rows(results),
    }
    report["charts"] = charts(results, out)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str))
    (out / "report.md").write_text(markdown(report))
    for name in selected:
        (out / f"{name}.json").unlink(missing_ok=True)
    print((out / "report.md").read_text())
    print(f"written {out}")
    failed_checks = [
        name
        for name, data in results.items()
        if "error" in data
        or (
            "checks" in data
            and (
                data["checks"].get("duplicates")
                or data["checks"].get("open")
                or data["checks"].get("failed")
                or not data["checks"].get("reconcile_ok")
            )
        )
    ]
    if failed_checks:
        print(f"scenarios with errors or failed correctness checks: {failed_checks}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
