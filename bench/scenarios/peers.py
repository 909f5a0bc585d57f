"""Peers on the same workload as the service (issue #7).

    .venv/bin/python bench/peers.py [--n 2000] [--future 10000] [--concurrency 2]

Two designs a team would ship without this service's sweep/lease/fence timer,
each one Celery task per payment (``bench/scenarios/peer_tasks.py``: a transfer with no
idempotency reference plus a row in ``bench_peer_execution``):

- ``celery_eta``   ``peer_transfer.apply_async(eta=due_at)`` per payment: the
  worker holds every ETA message in memory (Redis moves it to ``unacked``)
  until it is due;
- ``beat_clocked`` django-celery-beat: one ``ClockedSchedule`` + one-off
  ``PeriodicTask`` row per payment; ``DatabaseScheduler`` in ``celery beat``
  sends each when due.

Per peer: ``n`` payments due at one instant T0 (the drain scenario's shape):
lateness (``executed_at - due_at``, both from the database clock) and
throughput; the memory of the process that holds the schedule with ``future``
far-future payments pending; and lost / duplicate payments when the worker
(and, for beat, the beat process) is SIGKILLed mid-run and restarted.

Both run under the project's Celery settings (acks_late,
reject_on_worker_lost, prefetch 1); the kill phases lower the Redis
visibility timeout so unacknowledged messages come back within the run.
Lost and duplicate counts are findings, not failures. Each phase is capped
(``phase_limit``); a capped phase reports ``timed_out: true`` and what it
executed by then.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from datetime import datetime, timedelta

from bench.harness.clock import COMMITTED_AT_SQL
from bench.harness.clock import clock_timestamp as db_now
from bench.harness.db import prepare
from bench.harness.load import fund_accounts
from bench.harness.metrics import summarize, tree_cpu_seconds, tree_rss_mb
from bench.harness.processes import QUIET_WORKER, Service

DATABASE = "scheduler_bench_peers"
REDIS_DB = 12
AMOUNT = 3
# Unacknowledged messages come back after this in the kill phases (the project
# default, 3600 s, would leave a killed worker's messages stranded for an hour).
KILL_VISIBILITY_TIMEOUT = 30
KILL_AT_FRACTION = 0.4
FAR_FUTURE = timedelta(days=1)

EXECUTION_TABLE = """
CREATE TABLE IF NOT EXISTS bench_peer_execution (
    id bigserial PRIMARY KEY,
    peer text NOT NULL,
    payment_no bigint NOT NULL,
    due_at timestamptz NOT NULL,
    executed_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX IF NOT EXISTS bench_peer_execution_peer ON bench_peer_execution (peer, payment_no);
"""


# ---------------------------------------------------------------- plumbing
def counts(peer: str) -> tuple[int, int]:
    """(log rows, distinct payments) executed so far by ``peer``."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT count(*), count(DISTINCT payment_no) FROM bench_peer_execution WHERE peer = %s",
            [peer],
        )
        rows, distinct = cursor.fetchone()
    return rows, distinct


def first_executions(peer: str, *, committed: bool = False) -> list[tuple[datetime, datetime]]:
    """(due_at, first executed_at) per payment: lateness counts each payment once;
    ``committed``: the first execution's commit time instead (None where the server
    did not record it: ``bench.harness.clock.COMMITTED_AT_SQL``)."""
    from django.db import connection

    ran = COMMITTED_AT_SQL.format(table="bench_peer_execution") if committed else "executed_at"
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT min(due_at), min({ran}) FROM bench_peer_execution"  # a constant
            " WHERE peer = %s GROUP BY payment_no",
            [peer],
        )
        return cursor.fetchall()


def broker_backlog(r) -> tuple[int, int]:
    """(messages waiting in the ``peers`` queue, messages delivered but unacknowledged)."""
    return r.llen("peers"), r.hlen("unacked")


def wait_done(peer: str, target: int, r, deadline: float, settle: float) -> bool:
    """Wait until ``target`` distinct payments ran, the broker holds no message for
    them and no new execution appeared for ``settle`` s; False if ``deadline`` hit."""
    last, quiet_since = None, time.monotonic()
    while time.monotonic() < deadline:
        rows, distinct = counts(peer)
        if rows != last:
            last, quiet_since = rows, time.monotonic()
        if (
            distinct >= target
            and broker_backlog(r) == (0, 0)
            and time.monotonic() - quiet_since >= settle
        ):
            return True
        time.sleep(0.5)
    return False


def wait_executed(peer: str, at_least: int, deadline: float, poll: float = 0.1) -> int:
    while True:
        _, distinct = counts(peer)
        if distinct >= at_least or time.monotonic() > deadline:
            return distinct
        time.sleep(poll)


def wait_quiet(pid: int, *, min_seconds: float, timeout: float, idle_cpu: float = 0.05) -> float:
    """Wait until the process tree used < ``idle_cpu`` CPU-seconds per second for 2 s
    (after at least ``min_seconds``); return the seconds waited."""
    started = time.monotonic()
    quiet = 0
    cpu = tree_cpu_seconds(pid)
    while time.monotonic() - started < timeout:
        time.sleep(1)
        now_cpu = tree_cpu_seconds(pid)
        quiet = quiet + 1 if now_cpu - cpu < idle_cpu else 0
        cpu = now_cpu
        if quiet >= 2 and time.monotonic() - started >= min_seconds:
            break
    return round(time.monotonic() - started, 1)


def plan(n: int, sources: list[int], targets: list[int], seed: int) -> list[tuple]:
    """``n`` payments (payment_no, source, target, amount) over the given accounts."""
    rng = random.Random(seed)
    return [(i, rng.choice(sources), rng.choice(targets), AMOUNT) for i in range(n)]


def start_worker(service: Service, role: str, concurrency: int):
    from bench.scenarios.peer_tasks import MODULE as PEER_TASKS

    return service.celery(
        role,
        "worker",
        "-c",
        str(concurrency),
        "-I",
        PEER_TASKS,
        "-Q",
        "peers",
        *QUIET_WORKER,
        "-n",
        f"{role}@%h",
    )


def lateness_result(peer: str, t0: datetime, scheduled: int) -> dict:
    rows = first_executions(peer)
    lateness = [(done - due).total_seconds() for due, done in rows]
    last = max((done for _, done in rows), default=None)
    span = (last - t0).total_seconds() if last else None
    total, distinct = counts(peer)
    return {
        "scheduled": scheduled,
        "executed": distinct,
        "duplicates": total - distinct,
        "lateness_seconds": summarize(lateness, digits=3),
        "drain_seconds": round(span, 2) if span else None,
        "throughput_per_second": round(distinct / span, 1) if span else None,
    }


def clear_broker(r) -> None:
    r.flushdb()


# ---------------------------------------------------------------- celery_eta
def publish_eta(peer: str, payments: list[tuple], due_at: datetime) -> float:
    from bench.scenarios.peer_tasks import QUEUE, peer_transfer

    started = time.monotonic()
    due_iso = due_at.isoformat()
    for no, source, target, amount in payments:
        peer_transfer.apply_async(
            args=[peer, no, source, target, amount, due_iso], eta=due_at, queue=QUEUE
        )
    return time.monotonic() - started


def publish_lead(n: int, r) -> float:
    """Seconds from now to T0 that leave room to publish ``n`` ETA messages first.

    The ETA goes into each message, so T0 is fixed before publishing: time 300
    publishes to an unconsumed queue, then allow twice that rate's estimate (the
    worker ingests the real messages while they are published) plus 5 s.
    """
    from bench.scenarios.peer_tasks import peer_transfer

    eta = db_now() + FAR_FUTURE
    started = time.monotonic()
    for i in range(300):
        peer_transfer.apply_async(
            args=["calibrate", i, 0, 0, AMOUNT, eta.isoformat()], eta=eta, queue="peers-calibrate"
        )
    per_message = (time.monotonic() - started) / 300
    r.delete("peers-calibrate")
    return 5 + 2 * n * per_message


def eta_main(env, payments, concurrency, limit, r) -> dict:
    peer = "celery_eta"
    n = len(payments)
    with Service(env, "peers") as service:
        worker = start_worker(service, "eta-worker", concurrency)
        wait_quiet(worker.pid, min_seconds=3, timeout=60)
        t0 = db_now() + timedelta(seconds=publish_lead(n, r))
        publish_seconds = publish_eta(peer, payments, t0)
        published_at = db_now()
        cpu0 = tree_cpu_seconds(worker.pid)
        wall0 = time.monotonic()
        done = wait_done(peer, n, r, time.monotonic() + limit, settle=3)
        cpu = tree_cpu_seconds(worker.pid) - cpu0
        wall = time.monotonic() - wall0
    out = lateness_result(peer, t0, n)
    out.update(
        publish_seconds=round(publish_seconds, 2),
        published_before_due=published_at < t0,
        timed_out=not done,
        cpu_seconds={"worker": round(cpu, 1), "wall": round(wall, 1)},
    )
    return out


def eta_memory(env, future, concurrency, limit, r) -> dict:
    """Worker RSS (main + pool) idle, then holding ``future`` ETA messages due in a day."""
    with Service(env, "peers") as service:
        worker = start_worker(service, "eta-memory-worker", concurrency)
        wait_quiet(worker.pid, min_seconds=3, timeout=60)
        idle = tree_rss_mb(worker.pid)
        payments = [(i, 0, 0, AMOUNT) for i in range(future)]
        publish_seconds = publish_eta("celery_eta_future", payments, db_now() + FAR_FUTURE)
        started = time.monotonic()
        deadline = started + limit
        while time.monotonic() < deadline and broker_backlog(r) != (0, future):
            time.sleep(0.5)
        held = broker_backlog(r)[1]
        ingest = time.monotonic() - started + publish_seconds
        wait_quiet(worker.pid, min_seconds=2, timeout=60)
        with_future = tree_rss_mb(worker.pid)
        service.kill("eta-memory-worker")  # a warm shutdown would requeue every held message
    clear_broker(r)
    return {
        "process": "worker (main + pool)",
        "idle": idle,
        "with_future": with_future,
        "future": future,
        "held_unacked": held,
        "kib_per_future_payment": round((with_future - idle) * 1024 / future, 2)
        if future
        else None,
        "publish_seconds": round(publish_seconds, 1),
        "publish_and_ingest_seconds": round(ingest, 1),
        "timed_out": held < future,
    }


def eta_kill(env, payments, concurrency, limit, r) -> dict:
    peer = "celery_eta_kill"
    k = len(payments)
    deadline = time.monotonic() + limit
    with Service(env, "peers") as service:
        worker = start_worker(service, "eta-kill-worker", concurrency)
        wait_quiet(worker.pid, min_seconds=3, timeout=60)
        t0 = db_now() + timedelta(seconds=publish_lead(k, r))
        publish_eta(peer, payments, t0)
        wait_executed(peer, int(k * KILL_AT_FRACTION), deadline)
        service.kill("eta-kill-worker")
        kill_time = time.monotonic()
        killed_at = counts(peer)[1]
        stranded = broker_backlog(r)
        start_worker(service, "eta-kill-worker-2", concurrency)  # restarted at once
        done = wait_done(peer, k, r, deadline, settle=5)
        recovered = time.monotonic() - kill_time
    return kill_result(peer, k, killed_at, stranded, done, recovered, role="worker")


def kill_result(peer, k, killed_at, stranded, done, recovered, role) -> dict:
    rows, distinct = counts(peer)
    return {
        "killed": f"{role} (SIGKILL to its process group), restarted at once",
        "scheduled": k,
        "killed_at_executed": killed_at,
        "broker_at_kill": {"queued": stranded[0], "unacked": stranded[1]},
        "executed_distinct": distinct,
        "lost": k - distinct,
        "duplicates": rows - distinct,
        "seconds_from_kill_to_settled": round(recovered, 1),
        "timed_out": not done,
    }


# ---------------------------------------------------------------- beat_clocked
def insert_clocked(peer: str, payments: list[tuple], when: datetime, queue: str) -> float:
    """One ClockedSchedule + one-off PeriodicTask per payment, due at ``when``."""
    from django_celery_beat.models import ClockedSchedule, PeriodicTask, PeriodicTasks

    from bench.scenarios.peer_tasks import TASK_NAME

    started = time.monotonic()
    when_iso = when.isoformat()
    for start in range(0, len(payments), 5_000):
        batch = payments[start : start + 5_000]
        clocks = ClockedSchedule.objects.bulk_create(
            [ClockedSchedule(clocked_time=when) for _ in batch]
        )
        PeriodicTask.objects.bulk_create(
            [
                PeriodicTask(
                    name=f"{peer}:{no}",
                    task=TASK_NAME,
                    clocked=clock,
                    one_off=True,
                    args=json.dumps([peer, no, source, target, amount, when_iso]),
                    queue=queue,
                )
                for (no, source, target, amount), clock in zip(batch, clocks, strict=True)
            ]
        )
    PeriodicTasks.update_changed()  # bulk_create sends no signal; beat polls this row
    return time.monotonic() - started


def move_clocked(peer: str, old: datetime, new: datetime) -> None:
    """Re-time ``peer``'s rows from ``old`` to ``new`` (setup: T0 is fixed after inserting)."""
    from django.db import connection
    from django_celery_beat.models import PeriodicTasks

    with connection.cursor() as cursor:
        cursor.execute(
            "UPDATE django_celery_beat_clockedschedule c SET clocked_time = %s"
            "  FROM django_celery_beat_periodictask t"
            " WHERE t.clocked_id = c.id AND t.name LIKE %s",
            [new, f"{peer}:%"],
        )
        cursor.execute(
            "UPDATE django_celery_beat_periodictask SET args = replace(args, %s, %s)"
            " WHERE name LIKE %s",
            [old.isoformat(), new.isoformat(), f"{peer}:%"],
        )
    PeriodicTasks.update_changed()


def delete_clocked() -> None:
    from django.db import connection
    from django_celery_beat.models import PeriodicTasks

    with connection.cursor() as cursor:
        cursor.execute("DELETE FROM django_celery_beat_periodictask")
        cursor.execute("DELETE FROM django_celery_beat_clockedschedule")
    PeriodicTasks.update_changed()


def staged_clocked(peer: str, payments: list[tuple], lead: float) -> tuple[datetime, float]:
    """Insert rows a day out, then move them all to T0 = now + ``lead`` at once."""
    placeholder = db_now() + FAR_FUTURE
    insert_seconds = insert_clocked(peer, payments, placeholder, "peers")
    t0 = db_now() + timedelta(seconds=lead)
    move_clocked(peer, placeholder, t0)
    return t0, insert_seconds


def beat_main(env, payments, concurrency, limit, r) -> dict:
    peer = "beat_clocked"
    n = len(payments)
    with Service(env, "peers") as service:
        worker = start_worker(service, "beat-worker", concurrency)
        beat = service.beat("beat")
        wait_quiet(worker.pid, min_seconds=3, timeout=60)
        beat_cpu0 = tree_cpu_seconds(beat.pid)
        # Beat notices the change within its loop interval (5 s) and then
        # loads every row due within 5 minutes; give it time to do so.
        t0, insert_seconds = staged_clocked(peer, payments, lead=10 + n / 500)
        time.sleep(max(0.0, (t0 - db_now()).total_seconds()))
        cpu0 = (tree_cpu_seconds(worker.pid), tree_cpu_seconds(beat.pid))
        wall0 = time.monotonic()
        done = wait_done(peer, n, r, time.monotonic() + limit, settle=5)
        cpu = (tree_cpu_seconds(worker.pid) - cpu0[0], tree_cpu_seconds(beat.pid) - cpu0[1])
        wall = time.monotonic() - wall0
    delete_clocked()
    clear_broker(r)
    out = lateness_result(peer, t0, n)
    out.update(
        publish_seconds=round(insert_seconds, 2),
        timed_out=not done,
        cpu_seconds={
            "worker": round(cpu[0], 1),
            "beat": round(cpu[1], 1),
            "beat_before_t0": round(cpu0[1] - beat_cpu0, 1),
            "wall": round(wall, 1),
        },
    )
    return out


def beat_memory(env, future, limit, r) -> dict:
    """Beat RSS idle, with ``future`` rows a day out, and with them inside beat's 5-minute window.

    django-celery-beat only loads clocked rows due within
    ``SCHEDULE_SYNC_MAX_INTERVAL`` (300 s), so rows a day out cost a query, not
    memory; the second figure is what the same rows cost once they come due.
    No worker consumes here, and the rows go to an unconsumed queue and are
    removed before they are due.
    """
    with Service(env, "peers") as service:
        beat = service.beat("beat-memory")
        wait_quiet(beat.pid, min_seconds=5, timeout=60)
        idle = tree_rss_mb(beat.pid)
        far = db_now() + FAR_FUTURE
        payments = [(i, 0, 0, AMOUNT) for i in range(future)]
        insert_seconds = insert_clocked("beat_future", payments, far, "peers-discard")
        wait_quiet(beat.pid, min_seconds=8, timeout=min(limit, 300))
        with_future = tree_rss_mb(beat.pid)
        cpu0, started = tree_cpu_seconds(beat.pid), time.monotonic()
        move_clocked("beat_future", far, db_now() + timedelta(seconds=280))
        load_wait = wait_quiet(beat.pid, min_seconds=8, timeout=min(limit, 240))
        in_window = tree_rss_mb(beat.pid)
        load_cpu = tree_cpu_seconds(beat.pid) - cpu0
        loaded = time.monotonic() - started < 270  # else the rows may already be firing
        service.kill("beat-memory")
    delete_clocked()
    clear_broker(r)
    return {
        "process": "beat",
        "idle": idle,
        "with_future": with_future,
        "future": future,
        "with_future_within_5_min": in_window,
        "kib_per_payment_within_5_min": round((in_window - idle) * 1024 / future, 2)
        if future
        else None,
        "load_seconds_within_5_min": load_wait,
        "load_cpu_seconds_within_5_min": round(load_cpu, 1),
        "insert_seconds": round(insert_seconds, 1),
        "timed_out": not loaded,
    }


def beat_kill_worker(env, payments, concurrency, limit, r) -> dict:
    peer = "beat_clocked_kill_worker"
    k = len(payments)
    deadline = time.monotonic() + limit
    with Service(env, "peers") as service:
        worker = start_worker(service, "beat-kill-worker", concurrency)
        service.beat("beat-kw")
        wait_quiet(worker.pid, min_seconds=3, timeout=60)
        staged_clocked(peer, payments, lead=10 + k / 500)
        wait_executed(peer, int(k * KILL_AT_FRACTION), deadline)
        service.kill("beat-kill-worker")
        kill_time = time.monotonic()
        killed_at = counts(peer)[1]
        stranded = broker_backlog(r)
        start_worker(service, "beat-kill-worker-2", concurrency)
        done = wait_done(peer, k, r, deadline, settle=10)
        recovered = time.monotonic() - kill_time
    delete_clocked()
    clear_broker(r)
    return kill_result(peer, k, killed_at, stranded, done, recovered, role="worker")


def beat_kill_beat(env, payments, concurrency, limit, r) -> dict:
    peer = "beat_clocked_kill_beat"
    k = len(payments)
    deadline = time.monotonic() + limit
    with Service(env, "peers") as service:
        worker = start_worker(service, "beat-kb-worker", concurrency)
        service.beat("beat-kb")
        wait_quiet(worker.pid, min_seconds=3, timeout=60)
        staged_clocked(peer, payments, lead=10 + k / 500)
        wait_executed(peer, int(k * KILL_AT_FRACTION), deadline)
        service.kill("beat-kb")
        kill_time = time.monotonic()
        killed_at = counts(peer)[1]
        stranded = broker_backlog(r)
        service.beat("beat-kb-2")
        done = wait_done(peer, k, r, deadline, settle=15)
        recovered = time.monotonic() - kill_time
    delete_clocked()
    clear_broker(r)
    return kill_result(peer, k, killed_at, stranded, done, recovered, role="beat")


# ---------------------------------------------------------------- entry point
def settings_note(env_kill: dict) -> dict:
    from celery.beat import Scheduler
    from django.conf import settings
    from django_celery_beat import schedulers

    from scheduler_project.celery import app

    return {
        "celery": (
            f"acks_late={settings.CELERY_TASK_ACKS_LATE}, "
            f"reject_on_worker_lost={settings.CELERY_TASK_REJECT_ON_WORKER_LOST}, "
            f"prefetch_multiplier={settings.CELERY_WORKER_PREFETCH_MULTIPLIER}, "
            f"visibility_timeout={settings.CELERY_BROKER_TRANSPORT_OPTIONS['visibility_timeout']}"
            f" s (kill phases: {env_kill['CELERY_VISIBILITY_TIMEOUT']} s), Redis broker"
        ),
        "beat": (
            "DatabaseScheduler as shipped: max loop interval "
            f"{app.conf.beat_max_loop_interval or schedulers.DEFAULT_MAX_INTERVAL} s, "
            f"sync every {Scheduler.sync_every} s, full reload every "
            f"{schedulers.SCHEDULE_SYNC_MAX_INTERVAL} s, clocked rows due later than that "
            "are not loaded"
        ),
    }


def run_peers(
    *,
    n: int,
    sources: int,
    targets: int,
    concurrency: int,
    kill: bool,
    future: int,
    phase_limit: float = 600,
    kill_batch: int = 5_000,
) -> dict:
    env = prepare(DATABASE, REDIS_DB)
    env_kill = {**env, "CELERY_VISIBILITY_TIMEOUT": str(KILL_VISIBILITY_TIMEOUT)}
    import redis
    from django.db import connection
    from django_celery_beat.models import PeriodicTask, PeriodicTasks

    from bench.harness.app import reconcile

    with connection.cursor() as cursor:
        cursor.execute(EXECUTION_TABLE)
    # The service's own periodic tasks (sweeper, reaper, ...) would share beat
    # with the peer's rows; the peer's beat runs only the peer's schedule.
    PeriodicTask.objects.all().delete()
    PeriodicTasks.update_changed()
    r = redis.Redis.from_url(env["CELERY_BROKER_URL"])
    source_ids = fund_accounts(sources, 10**12)
    target_ids = fund_accounts(targets, 0)
    payments = plan(n, source_ids, target_ids, seed=7)
    k = min(n, kill_batch)
    kill_payments = plan(k, source_ids, target_ids, seed=8)

    eta = eta_main(env, payments, concurrency, phase_limit, r)
    eta["worker_rss_mb"] = eta_memory(env, future, concurrency, phase_limit, r)
    beat = beat_main(env, payments, concurrency, phase_limit, r)
    beat["worker_rss_mb"] = beat_memory(env, future, phase_limit, r)
    if kill:
        eta["kill"] = eta_kill(env_kill, kill_payments, concurrency, phase_limit, r)
        beat["kill"] = beat_kill_worker(env_kill, kill_payments, concurrency, phase_limit, r)
        beat["kill_beat"] = beat_kill_beat(env_kill, kill_payments, concurrency, phase_limit, r)
    eta["notes"] = (
        "one apply_async(eta=T0) per payment, all due at T0; the worker holds each ETA "
        "message unacknowledged until it is due, so a message held longer than the "
        "visibility timeout is re-delivered while the worker still holds it (duplicate). "
        "No idempotency reference: a re-delivered message pays again."
    )
    beat["notes"] = (
        "one ClockedSchedule + one-off PeriodicTask per payment (bulk-inserted), all due at "
        "T0; celery beat (DatabaseScheduler) sends one due entry per tick and records runs "
        "in memory until its next sync, so a restarted beat re-sends what it sent since. "
        "worker_rss_mb is beat's memory (beat holds this peer's schedule)."
    )
    return {
        "workload": {
            "payments": n,
            "source_accounts": sources,
            "target_accounts": targets,
            "amount": AMOUNT,
            "worker_concurrency": concurrency,
            "due": "all at one instant T0 (the drain scenario's shape)",
            "kill_batch": k if kill else None,
            "kill_at_fraction": KILL_AT_FRACTION if kill else None,
            "phase_limit_seconds": phase_limit,
            "work_per_payment": "ledger transfer_post (no reference) + one log row, "
            "one transaction",
        },
        "settings": settings_note(env_kill),
        "celery_eta": eta,
        "beat_clocked": beat,
        "reconcile_ok": reconcile().ok,
    }


def run(args) -> dict:
    """The suite's ``peers`` scenario (``bench/run.py``): 200 → 200 accounts, kills on."""
    return run_peers(
        n=args.peer_payments,
        sources=200,
        targets=200,
        concurrency=args.concurrency,
        kill=True,
        future=args.peer_future,
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=2_000, help="payments due at T0")
    parser.add_argument("--future", type=int, default=10_000, help="far-future payments")
    parser.add_argument("--sources", type=int, default=200)
    parser.add_argument("--targets", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--phase-limit", type=float, default=600)
    parser.add_argument("--kill-batch", type=int, default=5_000)
    parser.add_argument("--no-kill", action="store_true")
    args = parser.parse_args(argv)
    result = run_peers(
        n=args.n,
        sources=args.sources,
        targets=args.targets,
        concurrency=args.concurrency,
        kill=not args.no_kill,
        future=args.future,
        phase_limit=args.phase_limit,
        kill_batch=args.kill_batch,
    )
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
