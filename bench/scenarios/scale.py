"""scale: sweep cost and worker memory with few vs many far-future pending payments.

Sweep cost (idle, and claiming 2,000 due payments) and worker memory with
10,000 vs 1,000,000 pending payments due in 30+ days; bytes per pending
payment on disk (payment, hold and event rows with their indexes).
"""

from __future__ import annotations

import time
from datetime import timedelta

from bench.harness.clock import db_now
from bench.harness.db import prepare
from bench.harness.load import bulk_schedule, fund_accounts
from bench.harness.metrics import tree_rss_mb
from bench.harness.processes import Service

DATABASE = "scheduler_bench_scale"
REDIS_DB = 8


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

    from bench.harness.app import partition_for

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

    from bench.harness.app import sweep_due

    idle = []
    for _ in range(repeats * 4):
        started = time.perf_counter()
        sweep_due()
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
        result = sweep_due(max_batches=1)
        claim.append(time.perf_counter() - started)
        claimed += result.claimed
        # Out of the way of the next round: not pending any more, not queued.
        from bench.harness.app import Payment

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


def run(args) -> dict:
    env = prepare(DATABASE, REDIS_DB)
    from django.db import connection

    from bench.harness.app import Payment

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
