"""Executor cost in-process: CPU time and statements per executed payment, by chunk size.

    .venv/bin/python bench/executor_cost.py [--payments 1000] [--sizes 200,100,20,1]
                                            [--endpoints 10] [--profile 100] [--top 30]
                                            [--collapse] [--pairs 1] [--dump FILE]

Recreates ``scheduler_bench_execcost`` and sets up the noisy-neighbours minute
in miniature: 10 clients with two funded accounts each; 5 of them have
``--endpoints`` webhook endpoints subscribed to ``payment.completed``. For each
chunk size it inserts ``--payments`` payments already due (an even share per
client, between each client's own two accounts, as the every-minute schedules
are; ``--pairs N`` gives each client N source and N target accounts, taken in
turn, so a small chunk's payments touch accounts of their own, as at a low
steady rate: the capacity scenario's 100/s chunk of ~45 payments reads ~90
accounts), claims them with the sweeper's claim statement, cuts the claims into
chunks of that size and runs ``execute_chunk`` on each in this process — no
broker round trip, no other load — so the numbers are the executor's own
cost: CPU (``time.process_time``; statements are counted by an execute
wrapper, not Django's debug cursor, whose timing and formatting cost ~0.04 ms a
statement) and SQL statements per payment, and the
CPU of this process's own PostgreSQL backend (read from the OS, so the
server's other sessions do not count; its background writers are not
included). ``--collapse`` hands each chunk its partition, as the sweeper
does: the first chunk of a partition collapses the partition's due backlog
into its batch and the later ones find their payments done, as when a worker
is behind its queue (stale deliveries and collapsed payments are counted).
``--profile SIZE`` runs cProfile
over the chunks of that size and prints the top functions by cumulative CPU
(``--dump FILE`` also writes its pstats file, to compare two sizes function
by function).
Writes ``bench/results/<date>-executor-cost/report.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import psutil

from bench.harness.api_load import create_client
from bench.harness.db import prepare
from bench.harness.load import bulk_schedule
from bench.harness.report import write_report

DATABASE = "scheduler_bench_execcost"
REDIS_DB = 8
CLIENTS = 10
CLIENTS_WITH_ENDPOINTS = 5


def setup_clients(endpoints: int, pairs: int = 1) -> list[tuple[list[int], list[int]]]:
    """The clients' (sources, targets): ``pairs`` of each per client."""
    from django.contrib.auth import get_user_model

    from bench.harness.app import WebhookEndpoint, encrypt_webhook_secret, new_secret

    accounts = []
    for n in range(CLIENTS):
        ids = create_client(f"exec-{n}", accounts=2 * pairs, balance=10**12)["account_ids"]
        accounts.append((ids[:pairs], ids[pairs:]))
        if n < CLIENTS_WITH_ENDPOINTS:
            owner = get_user_model().objects.get(username=f"exec-{n}")
            WebhookEndpoint.objects.bulk_create(
                WebhookEndpoint(
                    client=owner,
                    url=f"https://hooks.example.test/{n}/{e}",
                    event_types=["payment.completed"],
                    secret_ciphertext=encrypt_webhook_secret(new_secret()),
                )
                for e in range(endpoints)
            )
    return accounts


def _backend_pid(connection) -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT pg_backend_pid()")
        return cursor.fetchone()[0]


def _cpu(process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def run_size(clients, payments: int, size: int, profiler=None, collapse: bool = False) -> dict:
    from django.db import connection, transaction

    from bench.harness.app import Payment, PaymentStatus, claim_batch, execute_chunk

    per_client = payments // len(clients)
    due = datetime.now(UTC) - timedelta(seconds=1)
    for sources, targets in clients:
        bulk_schedule(sources=sources, targets=targets, count=per_client, amount=1, due_at=due)
    with transaction.atomic():
        claims = claim_batch(payments * 2, 0.0)
    by_partition: dict[int, list] = {}
    for claim in claims:
        by_partition.setdefault(claim.partition, []).append((claim.payment_id, claim.fence))
    chunks = [
        (partition, items[i : i + size])
        for partition, items in by_partition.items()
        for i in range(0, len(items), size)
    ]
    backend = psutil.Process(_backend_pid(connection))
    pg_started = _cpu(backend)
    wall_started, cpu_started = time.perf_counter(), time.process_time()
    stale = collapsed = 0
    shapes: Counter = Counter()

    def count(execute, sql, params, many, context):
        shapes[sql[:100]] += 1
        return execute(sql, params, many, context)

    with connection.execute_wrapper(count):
        if profiler:
            profiler.enable()
        for partition, chunk in chunks:
            result = execute_chunk(chunk, partitions=(partition,) if collapse else ())
            stale += len(result.stale)
            collapsed += len(result.collapsed)
        if profiler:
            profiler.disable()
    cpu = time.process_time() - cpu_started
    wall = time.perf_counter() - wall_started
    pg_cpu = _cpu(backend) - pg_started
    done = Payment.objects.filter(pk__in=[c.payment_id for c in claims])
    completed = done.filter(status=PaymentStatus.COMPLETED).count()
    assert completed == len(claims), (completed, len(claims))
    return {
        "chunk_size": size,
        "payments": len(claims),
        "chunks": len(chunks),
        "cpu_ms_per_payment": round(cpu * 1000 / len(claims), 3),
        "wall_ms_per_payment": round(wall * 1000 / len(claims), 3),
        "postgres_cpu_ms_per_payment": round(pg_cpu * 1000 / len(claims), 3),
        "statements_per_chunk": round(sum(shapes.values()) / len(chunks), 1),
        "collapse": collapse,
        "stale_deliveries": stale,
        "collapsed": collapsed,
        "statements": sorted(((c, s) for s, c in shapes.items()), reverse=True)[:12],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--payments", type=int, default=1000)
    parser.add_argument("--sizes", default="200,100,20,1")
    parser.add_argument("--endpoints", type=int, default=10)
    parser.add_argument("--profile", type=int, help="chunk size to profile")
    parser.add_argument("--dump", help="also write the profile's pstats file here")
    parser.add_argument("--top", type=int, default=30)
    parser.add_argument(
        "--collapse",
        action="store_true",
        help="hand each chunk its partition, as the sweeper does: the first chunk of a "
        "partition collapses the partition's due backlog into its batch and the later "
        "ones find their payments done (a worker behind its queue)",
    )
    parser.add_argument(
        "--pairs",
        type=int,
        default=1,
        help="source and target accounts per client, taken in turn (default 1: each "
        "client's payments between its own two accounts)",
    )
    parser.add_argument("--name", default="executor-cost")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    if args.dump and args.profile not in sizes:
        parser.error("--dump writes the profile of --profile SIZE, one of --sizes")

    prepare(DATABASE, REDIS_DB, LOG_LEVEL="WARNING")
    clients = setup_clients(args.endpoints, args.pairs)
    run_size(clients, 200, 100)  # warm-up: imports, connections, statement caches
    report = {
        "at": datetime.now(UTC).isoformat(),
        "endpoints": args.endpoints,
        "collapse": args.collapse,
        "pairs": args.pairs,
        "runs": [],
    }
    profile_text = ""
    for size in sizes:
        profiler = cProfile.Profile(time.process_time) if size == args.profile else None
        row = run_size(clients, args.payments, size, profiler, collapse=args.collapse)
        report["runs"].append(row)
        print(
            f"chunk {size:>4}: {row['chunks']} chunks, CPU {row['cpu_ms_per_payment']} ms/payment, "
            f"wall {row['wall_ms_per_payment']} ms/payment, "
            f"PostgreSQL {row['postgres_cpu_ms_per_payment']} ms/payment, "
            f"{row['statements_per_chunk']} statements/chunk, "
            f"{row['stale_deliveries']} stale, {row['collapsed']} collapsed"
        )
        if profiler:
            out = io.StringIO()
            pstats.Stats(profiler, stream=out).sort_stats("cumulative").print_stats(args.top)
            if args.dump:
                profiler.dump_stats(args.dump)
            profile_text = out.getvalue()
    if profile_text:
        print(profile_text)
        report["profile"] = profile_text
    write_report(args.name, report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
