"""capacity: the highest steady due rate kept on time, this service's and Celery ETA tasks'.

Steady due rates stepped up (default 100, 200, 350, 500, 750, 1000, 1500
payments/s, each for 120 s; ``--capacity-steps``, ``--capacity-seconds``):

- **this service**, started once for every step (payment worker ``-c N``, the
  timer worker, beat, gunicorn 2 x 4 at CPU weight ``--web-nice``, default 0)
  with ``PROMETHEUS_MULTIPROC_DIR`` set to a fresh directory. Before each
  step, while the service is idle, the step's ``rate x seconds`` payments are
  bulk-inserted due a day out and then re-timed in one UPDATE to fall due
  evenly at ``rate`` over the step's window ``[T0, T0 + seconds)``: no insert
  overlaps a measured window. Throughout the window the API takes 50
  schedules/s + 100 status reads/s through gunicorn (``run_load``, as in
  ``steady``). A step is measured from T0 until no payment is open (its own
  and the API's, whose delays reach 30 s past the window) or ``--timeout``.
- **the peer**, ``peer_tasks.peer_transfer.apply_async(eta=due_at)``: one
  Celery task per payment, same worker concurrency, each step's messages
  published before its T0, due at the same rate. No API load (the peer has
  no API); measured from T0 until every payment ran and the broker is empty.

Per step: lateness p50/p95/p99 of the step's own payments (``executed_at -
due_at``, both database clock; a payment still open at the timeout counts
with its lateness so far, a lower bound, and fails the step), API schedule
and status p95 (ms), payment-worker and PostgreSQL CPU per executed payment
(ms; the CPU used in the window ``[T0, T0 + seconds)`` over every payment
executed in it, the API's included — the API's tail after the window runs at
a falling rate, so it is left out (the JSON keeps the whole step's numbers as
``cpu_whole_step``); PostgreSQL is every server process on the host, so it
also carries the API's queries),
executed and open counts, the host's CPU over the window (busy share of every
core, and the seconds gunicorn and this process's load client took of it: they
share the 2 cores with the service, so near 100 % the host is the limit), and
the sweep interval p99: the upper bound of the
bucket of the service's ``payments_sweep_interval_seconds`` histogram holding
the 99th percentile of the step's observations ("≤ X s"), read from the
multiprocess directory at T0 and at the step's end; null when the service
does not export it; and the executor's batches in the window (from
``payments_executor_batch_size``: how many transactions ran payments, their
mean size, and the worker CPU per batch — what separates a step's cost per
payment from the drain's); and the window's contention: lock waits sampled
from ``pg_stat_activity`` four times a second (``bench.harness.lockwaits``:
the share of active backends waiting on a row lock, and the statements
waiting most) and the executor's chunk items counted stale, collapsed into
another message's batch, or busy (held by another transaction, handed back),
from its counters — not to be added up: a collapsed payment's own message
later finds it run and counts it stale, as does a handed-back one's that an
earlier batch took in.

Capacity at SLO: the highest step with p99 ≤ 1 s and p50 ≤ 250 ms; after
two failing steps the higher ones are skipped (ours and the peer's apart).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta

from bench.harness import dbwork
from bench.harness.api_load import create_client, run_load, start_web
from bench.harness.checks import exactly_once_check, wait_terminal
from bench.harness.clock import (
    clock_timestamp,
    commit_timestamps_on,
    committed_at,
    db_now,
    set_due_at,
)
from bench.harness.db import prepare
from bench.harness.load import bulk_schedule, fund_accounts
from bench.harness.lockwaits import LockWaitSampler
from bench.harness.metrics import (
    histogram_quantile_bound,
    histogram_window,
    host_busy_seconds,
    ms_each,
    multiprocess_counters,
    multiprocess_histogram,
    multiprocess_histogram_totals,
    multiprocess_snapshot,
    own_cpu_seconds,
    percentile,
    postgres_cpu,
    postgres_cpu_since,
    summarize,
    tree_cpu_seconds,
)
from bench.harness.processes import Service, cpu_weight
from bench.scenarios import peers

DATABASE = "scheduler_bench_capacity"
# Not 5-8 or 12 (the other scenarios) nor 1-14 (scripts/test picks one per checkout).
REDIS_DB = 15
WEB_PORT = 8767  # not api_load's default 8765: another scenario's gunicorn may hold it
DEFAULT_STEPS = (100, 200, 350, 500, 750, 1000, 1500)
DEFAULT_SECONDS = 120.0
QUICK_STEPS = (50, 100)
QUICK_SECONDS = 20.0
SLO_P99_SECONDS = 1.0
SLO_P50_SECONDS = 0.25
STOP_AFTER_FAILING_STEPS = 2
SWEEP_INTERVAL_METRIC = "payments_sweep_interval_seconds"
# Exported since before this scenario: its count says the metrics directory works
# even while the interval histogram is not there.
SWEEP_DURATION_METRIC = "payments_sweep_duration_seconds"
BATCH_SIZE_METRIC = "payments_executor_batch_size"
# The executor's counters of chunk items it did not run in their own message:
# stale (already run, or an old fence), collapsed (run by another message's
# batch) and busy (held by another transaction, handed back).
CONTENTION_COUNTERS = {
    "stale": "payments_stale_deliveries_total",
    "collapsed": "payments_collapsed_total",
    "busy": "payments_chunk_items_busy_total",
}
AMOUNT = 2
ACCOUNTS = 500  # sources and as many targets (steady's shape)
WARM_UP = 1.2  # run_load sends 1 s of warm-up schedules, then starts 0.2 s later
WARM_UP_SECONDS = 5.0  # of API load before the first step (its payments run before it)
# the payment workers watched with no load before the first step: what they are
# charged for their timers and wakes alone (docs/performance-history.md,
# session 31)
IDLE_SECONDS = 30.0


def parse_steps(text: str | None, quick: bool) -> list[float]:
    """``--capacity-steps`` (``"100,200"``) as sorted rates; the defaults when not given."""
    if not text:
        return [float(s) for s in (QUICK_STEPS if quick else DEFAULT_STEPS)]
    return sorted(float(s) for s in text.split(",") if s.strip())


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.monotonic()))


def slo_met(lateness: dict, censored: int) -> bool:
    return (
        censored == 0
        and lateness["count"] > 0
        and lateness["p99"] <= SLO_P99_SECONDS
        and lateness["p50"] <= SLO_P50_SECONDS
    )


def capacity_at_slo(steps: list[dict]) -> float | None:
    """The highest step that met the SLO (None: none did)."""
    return max((s["rate_per_second"] for s in steps if s.get("meets_slo")), default=None)


def lower_bound(steps: list[dict], capacity: float | None) -> bool:
    """True when no step above ``capacity`` ran and failed: the real capacity may be higher."""
    return capacity is not None and not any(
        s["rate_per_second"] > capacity and not s.get("skipped") for s in steps
    )


def stepped(steps: list[float], run_step) -> list[dict]:
    """``run_step(index, rate)`` for each step until two steps failed; the rest skipped."""
    out, failing = [], 0
    for index, rate in enumerate(steps):
        if failing >= STOP_AFTER_FAILING_STEPS:
            out.append({"rate_per_second": rate, "skipped": True})
            continue
        step = run_step(index, rate)
        out.append(step)
        failing += not step["meets_slo"]
        lat = step["lateness_seconds"]
        commit = step.get("lateness_to_commit_seconds")
        to_commit = f" (to commit: p50 {commit['p50']} s, p99 {commit['p99']} s)" if commit else ""
        print(
            f"   {rate:g}/s: p50 {lat['p50']} s, p99 {lat['p99']} s{to_commit}, "
            f"meets SLO: {step['meets_slo']}",
            flush=True,
        )
    return out


# ---------------------------------------------------------------- this service
@dataclass
class Ours:
    """What every step of this service's run shares."""

    seconds: float
    sources: list[int]
    targets: list[int]
    client: dict
    base: tuple[str, int]
    worker_pid: int
    timers_pid: int
    web_pid: int
    metrics_dir: str
    schedule_rate: float
    status_rate: float
    timeout: float
    # worker CPU a second with no load (``idle_worker_ms_per_second``); None: not measured
    idle_worker_ms_per_second: float | None = None


@dataclass(frozen=True)
class CpuUsed:
    """CPU seconds the service's processes used, over ``wall`` seconds."""

    wall: float
    worker: float
    postgres: float
    timers: float
    web: float  # gunicorn, every worker
    client: float  # this process: the API load's client threads (and the idle harness)
    host_busy: float  # every process on the host, all cores (not idle, not iowait)


@dataclass(frozen=True)
class CpuMark:
    """Counters read at the start of a window (``cpu_mark``)."""

    wall: float
    worker: float
    postgres: dict
    timers: float
    web: float
    client: float
    host_busy: float


def cpu_mark(ctx: Ours) -> CpuMark:
    return CpuMark(
        wall=time.monotonic(),
        worker=tree_cpu_seconds(ctx.worker_pid),
        postgres=postgres_cpu(),
        timers=tree_cpu_seconds(ctx.timers_pid),
        web=tree_cpu_seconds(ctx.web_pid),
        client=own_cpu_seconds(),
        host_busy=host_busy_seconds(),
    )


def cpu_since(ctx: Ours, mark: CpuMark) -> CpuUsed:
    """What the service's processes, the load client and the host used since ``mark``."""
    return CpuUsed(
        wall=time.monotonic() - mark.wall,
        worker=tree_cpu_seconds(ctx.worker_pid) - mark.worker,
        postgres=postgres_cpu_since(mark.postgres),
        timers=tree_cpu_seconds(ctx.timers_pid) - mark.timers,
        web=tree_cpu_seconds(ctx.web_pid) - mark.web,
        client=own_cpu_seconds() - mark.client,
        host_busy=host_busy_seconds() - mark.host_busy,
    )


def cpu_report(used: CpuUsed, executed: int) -> dict:
    cores = os.cpu_count() or 1
    return {
        "wall_seconds": round(used.wall, 1),
        "executed": executed,
        "worker_cpu_seconds": round(used.worker, 1),
        "timers_cpu_seconds": round(used.timers, 1),
        "postgres_cpu_seconds": round(used.postgres, 1),
        "web_cpu_seconds": round(used.web, 1),
        "load_client_cpu_seconds": round(used.client, 1),
        "host_busy_cpu_seconds": round(used.host_busy, 1),
        # the host's busy time no process above accounts for (kernel threads,
        # Redis, beat, other servers on the host)
        "other_cpu_seconds": round(
            used.host_busy - (used.worker + used.timers + used.postgres + used.web + used.client),
            1,
        ),
        # of every core over the window: near 1.0 the host, not the service, is the limit
        "host_busy_fraction": round(used.host_busy / (used.wall * cores), 3) if used.wall else None,
        "worker_ms_per_payment": ms_each(used.worker, executed),
        "postgres_ms_per_payment": ms_each(used.postgres, executed),
    }


def idle_worker_ms_per_second(worker_pid: int, seconds: float = IDLE_SECONDS) -> float:
    """CPU milliseconds a second the payment workers use with nothing to do: their
    event loops' timers and broker polls, and the OS's charge for each wake."""
    started, before = time.monotonic(), tree_cpu_seconds(worker_pid)
    time.sleep(seconds)
    return ms_per_second(tree_cpu_seconds(worker_pid) - before, time.monotonic() - started)


def ms_per_second(cpu_seconds: float, wall_seconds: float) -> float:
    return round(1000 * cpu_seconds / wall_seconds, 2)


def above_idle_ms_per_payment(
    worker_cpu: float, wall: float, idle_ms_per_second: float | None, executed: int
) -> float | None:
    """A window's worker CPU less what the workers used idle over as long, per payment:
    an estimate of the load's own cost (under load some of the idle wakes do not
    happen, so it can take off a little too much); None without an idle reading."""
    if idle_ms_per_second is None:
        return None
    return ms_each(worker_cpu - idle_ms_per_second * wall / 1000, executed)


def payment_dead_rows() -> int | None:
    """``n_dead_tup`` of payments_payment: what autovacuum (off on the CI server) would clean."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT n_dead_tup FROM pg_stat_user_tables WHERE relname = 'payments_payment'"
        )
        row = cursor.fetchone()
    return row[0] if row else None


def our_step(ctx: Ours, index: int, rate: float) -> dict:
    from bench.harness.app import OPEN_STATUSES, Payment

    seconds = ctx.seconds
    count = max(1, round(rate * seconds))
    # Inserted due a day out (the service ignores them), then re-timed to the step.
    placeholder = db_now() + timedelta(days=1, seconds=index)
    started = time.monotonic()
    bulk_schedule(
        sources=ctx.sources, targets=ctx.targets, count=count, amount=AMOUNT, due_at=placeholder
    )
    insert_seconds = time.monotonic() - started
    t0 = db_now() + timedelta(seconds=5 + count / 5_000)  # room for the UPDATE + VACUUM
    set_due_at(t0, rate, only_due_at=placeholder)
    margin = (t0 - db_now()).total_seconds()
    t0_mono = time.monotonic() + margin

    api: dict = {}
    with_api = ctx.schedule_rate > 0 and ctx.status_rate > 0

    def load():
        api.update(
            run_load(
                base=ctx.base,
                token=ctx.client["token"],
                account_ids=ctx.client["account_ids"],
                schedule_rate=ctx.schedule_rate,
                status_rate=ctx.status_rate,
                duration=seconds,
                streams=8,
            )
        )

    loader = threading.Thread(target=load)
    sleep_until(t0_mono - WARM_UP)
    if with_api:
        loader.start()
    sleep_until(t0_mono)
    cpu0 = cpu_mark(ctx)
    work0 = dbwork.mark()
    start = multiprocess_snapshot(ctx.metrics_dir)  # the service's metrics, read once an edge
    sweeps0 = multiprocess_histogram(start, SWEEP_INTERVAL_METRIC)
    runs0 = multiprocess_histogram(start, SWEEP_DURATION_METRIC)
    batches0 = multiprocess_histogram_totals(start, BATCH_SIZE_METRIC)
    sizes0 = multiprocess_histogram(start, BATCH_SIZE_METRIC)
    items0 = multiprocess_counters(start, list(CONTENTION_COUNTERS.values()))
    with LockWaitSampler() as lock_waits:
        if with_api:
            loader.join()
        sleep_until(t0_mono + seconds)
        # CPU per payment over the window only: after it the API's payments (due up
        # to 30 s past it) trickle out at a falling rate, which is not this step's.
        window_end = db_now()
        cpu_window = cpu_since(ctx, cpu0)
        work1 = dbwork.mark()
        window_edge = multiprocess_snapshot(ctx.metrics_dir)
        batches1 = multiprocess_histogram_totals(window_edge, BATCH_SIZE_METRIC)
        sizes1 = multiprocess_histogram(window_edge, BATCH_SIZE_METRIC)
        items1 = multiprocess_counters(window_edge, list(CONTENTION_COUNTERS.values()))
    lock_wait_summary = lock_waits.summary()
    mine = Payment.objects.filter(from_account__in=ctx.sources, due_at__gte=t0)
    open_at_window_end = mine.filter(status__in=OPEN_STATUSES).count()
    dead_rows = payment_dead_rows()
    sizes_at_end = dbwork.table_sizes()
    remaining = wait_terminal(ctx.timeout)
    end = db_now()
    cpu_step = cpu_since(ctx, cpu0)
    # sweeps over the step's window only: after it the API's tail leaves ~30 s of
    # light sweeping that diluted the step's intervals (~20 % of them at 1,750/s)
    sweeps1 = multiprocess_histogram(window_edge, SWEEP_INTERVAL_METRIC)
    runs1 = multiprocess_histogram(window_edge, SWEEP_DURATION_METRIC)

    lateness, to_commit, censored, failed = [], [], 0, 0
    per_second: dict[int, list[float]] = {}
    rows = mine.annotate(committed=committed_at("payments_payment")).values_list(
        "due_at", "executed_at", "committed", "status"
    )
    for due, executed_at, committed, status in rows:
        if status == "COMPLETED":
            late = (executed_at - due).total_seconds()
            if committed is not None:
                to_commit.append((committed - due).total_seconds())
        elif status in OPEN_STATUSES:
            censored += 1
            late = (end - due).total_seconds()  # at least this late
            to_commit.append(late)
        else:
            failed += 1
            continue
        lateness.append(late)
        per_second.setdefault(int((due - t0).total_seconds()), []).append(late)
    completed = Payment.objects.filter(status="COMPLETED", executed_at__gte=t0)
    executed = completed.filter(executed_at__lte=end).count()
    executed_window = completed.filter(executed_at__lte=window_end).count()
    summary = summarize(lateness, digits=3)
    # every payment's commit time known (the server recorded them through the step)
    from_commit = summarize(to_commit, digits=3) if len(to_commit) == len(lateness) else None
    sweeps = histogram_quantile_bound(sweeps0, sweeps1, 0.99)
    runs = histogram_quantile_bound(runs0, runs1, 0.99)
    api_summary = {
        kind: {k: v for k, v in data.items() if k != "latencies_ms"} for kind, data in api.items()
    }
    return {
        "rate_per_second": rate,
        "seconds": seconds,
        "payments": count,
        "insert_seconds": round(insert_seconds, 1),
        "setup_margin_seconds": round(margin, 2),  # < 0: the first payments came due in setup
        "lateness_seconds": summary,
        # to the commit of the payment's batch (None: track_commit_timestamp off):
        # ``executed_at`` is stamped when the executor locked the payment, before
        # the account locks and the commit; when recorded, the SLO is judged on it
        "lateness_to_commit_seconds": from_commit,
        "meets_slo": slo_met(from_commit or summary, censored) and failed == 0,
        "open_at_window_end": open_at_window_end,
        # dead row versions of payments_payment at the window's end (statistics
        # collector's estimate); the step began right after a VACUUM
        "payment_dead_rows_at_window_end": dead_rows,
        "still_open_at_timeout": remaining,
        "censored": censored,
        "failed": failed,
        "executed": executed,
        "executed_api": executed - (len(lateness) - censored),
        "api": api_summary,
        "schedule_p95_ms": api_summary.get("schedule", {}).get("latency_ms", {}).get("p95"),
        "status_p95_ms": api_summary.get("status", {}).get("latency_ms", {}).get("p95"),
        # over the window [T0, T0 + seconds): what the report's per-payment columns show
        "cpu": cpu_report(cpu_window, executed_window),
        # from T0 until every payment was terminal (the API's tail included)
        "cpu_whole_step": cpu_report(cpu_step, executed),
        # PostgreSQL's own counters over the window (bench.harness.dbwork): the
        # host-independent part of the database's cost a payment
        "database_work": {**dbwork.report(work0, work1, executed_window), **sizes_at_end},
        "worker_ms_per_payment_above_idle": above_idle_ms_per_payment(
            cpu_window.worker, cpu_window.wall, ctx.idle_worker_ms_per_second, executed_window
        ),
        "sweep_interval": sweeps,
        "sweep_interval_p99_le_seconds": sweeps["le_seconds"] if sweeps else None,
        "sweeps_in_window": runs["observations"] if runs else None,
        "batches": batch_report(batches0, batches1, cpu_window.worker),
        # how many of the window's batches ran up to each bucket's size (cumulative)
        "batch_sizes": bucket_counts(sizes0, sizes1),
        "contention": {
            "lock_waits": lock_wait_summary,
            "items": {
                kind: int(items1[name] - items0[name]) for kind, name in CONTENTION_COUNTERS.items()
            },
        },
        "lateness_per_second": [
            (sec, percentile(sorted(v), 50), percentile(sorted(v), 99))
            for sec, v in sorted(per_second.items())
        ],
    }


def bucket_counts(
    before: dict[float, float] | None, after: dict[float, float] | None
) -> dict[str, int] | None:
    """A histogram's cumulative bucket counts over a window, ``{"≤ 50": n, …}``
    (``"all"`` for ``+Inf``; ``histogram_window``); None when the service does
    not export it."""
    delta = histogram_window(before, after)
    if delta is None:
        return None
    return {("all" if le == float("inf") else f"≤ {le:g}"): int(n) for le, n in delta.items()}


def batch_report(
    before: tuple[float, float] | None, after: tuple[float, float] | None, worker_cpu: float
) -> dict | None:
    """The executor's batches in the window (``payments_executor_batch_size``: one
    observation per transaction that ran payments, its size): how many, their
    mean size, and the window's worker CPU over their number — a step's worker
    CPU per payment is about (cost per batch) / (payments per batch) + cost per
    payment, so this says which of the two moved. A message that ran nothing
    (its payments stale, or collapsed into an earlier batch) is not counted, but
    its CPU is in the worker's. None when the service does not export it."""
    if after is None:
        return None
    count = after[0] - (before[0] if before else 0.0)
    total = after[1] - (before[1] if before else 0.0)
    return {
        "count": int(count),
        "payments_per_batch": round(total / count, 1) if count else None,
        "worker_ms_per_batch": ms_each(worker_cpu, count),
    }


def run_ours(
    env: dict, steps: list[float], args, sources, targets
) -> tuple[list[dict], int, float, float]:
    """Every step of ours, the nice level gunicorn ran at, the payment workers'
    CPU a second idle (``idle_worker_ms_per_second``) and PostgreSQL's over the
    same seconds (every server process: what the idle service's sweeps, beat
    and checks, and autovacuum cost it with no payment and no request)."""
    metrics_dir = tempfile.mkdtemp(prefix="bench-capacity-metrics-")
    try:
        client = create_client("bench-capacity", accounts=20, balance=10**12)
        service_env = {**env, "PROMETHEUS_MULTIPROC_DIR": metrics_dir}
        with Service(service_env, "capacity") as service:
            base = start_web(service, port=WEB_PORT, nice=getattr(args, "web_nice", 0))
            web_pid = service.procs["web"].pid
            web_nice = cpu_weight(web_pid)
            worker = service.worker(args.concurrency)
            timers = service.timers()
            service.beat()
            for pid in (worker.pid, timers.pid):
                peers.wait_quiet(pid, min_seconds=3, timeout=60)
            if args.api_schedule_rate > 0 and args.api_status_rate > 0:
                # Warm-up: no step pays for gunicorn's, Django's and the workers'
                # first requests and chunks; its payments are done before step 1.
                run_load(
                    base=base,
                    token=client["token"],
                    account_ids=client["account_ids"],
                    schedule_rate=args.api_schedule_rate,
                    status_rate=args.api_status_rate,
                    duration=WARM_UP_SECONDS,
                    streams=8,
                )
                wait_terminal(args.timeout)
            pg0, started = postgres_cpu(), time.monotonic()
            idle = idle_worker_ms_per_second(worker.pid)
            idle_pg = ms_per_second(postgres_cpu_since(pg0), time.monotonic() - started)
            print(f"   payment workers idle: {idle} ms of CPU a second; PostgreSQL {idle_pg}")
            ctx = Ours(
                seconds=args.capacity_seconds,
                sources=sources,
                targets=targets,
                client=client,
                base=base,
                worker_pid=worker.pid,
                timers_pid=timers.pid,
                web_pid=web_pid,
                metrics_dir=metrics_dir,
                schedule_rate=args.api_schedule_rate,
                status_rate=args.api_status_rate,
                timeout=args.timeout,
                idle_worker_ms_per_second=idle,
            )
            ours = stepped(steps, lambda index, rate: our_step(ctx, index, rate))
            return ours, web_nice, idle, idle_pg
    finally:
        shutil.rmtree(metrics_dir, ignore_errors=True)


# ---------------------------------------------------------------- the Celery ETA peer
def publish_steady(peer: str, payments: list[tuple], t0: datetime, rate: float) -> None:
    """One ``apply_async(eta=due_at)`` per payment, due from ``t0`` on at ``rate``/s."""
    from bench.scenarios.peer_tasks import QUEUE, peer_transfer

    for no, source, target, amount in payments:
        due = t0 + timedelta(seconds=no / rate)
        peer_transfer.apply_async(
            args=[peer, no, source, target, amount, due.isoformat()], eta=due, queue=QUEUE
        )


def peer_step(index, rate, *, seconds, sources, targets, worker_pid, r, timeout) -> dict:
    peer = f"capacity_eta_{index}"
    count = max(1, round(rate * seconds))
    payments = peers.plan(count, sources, targets, seed=100 + index)
    t0 = clock_timestamp() + timedelta(seconds=peers.publish_lead(count, r))
    started = time.monotonic()
    publish_steady(peer, payments, t0, rate)
    publish_seconds = time.monotonic() - started
    margin = (t0 - clock_timestamp()).total_seconds()
    time.sleep(max(0.0, margin))
    cpu0 = (tree_cpu_seconds(worker_pid), postgres_cpu())
    wall0 = time.monotonic()
    done = peers.wait_done(peer, count, r, time.monotonic() + timeout, settle=3)
    end = clock_timestamp()
    worker_cpu = tree_cpu_seconds(worker_pid) - cpu0[0]
    pg_cpu = postgres_cpu_since(cpu0[1])
    wall = time.monotonic() - wall0

    rows = peers.first_executions(peer)
    lateness = [(ran - due).total_seconds() for due, ran in rows]
    # the peer stamps executed_at after its transfer, inside its transaction
    commits = peers.first_executions(peer, committed=True) if commit_timestamps_on() else []
    to_commit = [(ran - due).total_seconds() for due, ran in commits if ran is not None]
    censored = count - len(rows)
    if censored > 0:  # never ran within the timeout: at least this late
        ran = {no for (no,) in _executed_numbers(peer)}
        never = [
            (end - (t0 + timedelta(seconds=no / rate))).total_seconds()
            for no in range(count)
            if no not in ran
        ]
        lateness += never
        to_commit += never
    summary = summarize(lateness, digits=3)
    from_commit = summarize(to_commit, digits=3) if len(to_commit) == len(lateness) else None
    rows_total, distinct = peers.counts(peer)
    return {
        "rate_per_second": rate,
        "seconds": seconds,
        "payments": count,
        "publish_seconds": round(publish_seconds, 1),
        "setup_margin_seconds": round(margin, 2),  # < 0: published past the first due time
        "lateness_seconds": summary,
        "lateness_to_commit_seconds": from_commit,
        "meets_slo": slo_met(from_commit or summary, censored),
        "executed": distinct,
        "duplicates": rows_total - distinct,
        "censored": censored,
        "timed_out": not done,
        "cpu": {
            "wall_seconds": round(wall, 1),
            "worker_cpu_seconds": round(worker_cpu, 1),
            "postgres_cpu_seconds": round(pg_cpu, 1),
            "worker_ms_per_payment": ms_each(worker_cpu, distinct),
            "postgres_ms_per_payment": ms_each(pg_cpu, distinct),
        },
    }


def _executed_numbers(peer: str):
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT DISTINCT payment_no FROM bench_peer_execution WHERE peer = %s", [peer]
        )
        return cursor.fetchall()


def run_peer(env: dict, steps: list[float], args, sources, targets) -> list[dict]:
    import redis
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(peers.EXECUTION_TABLE)
    r = redis.Redis.from_url(env["CELERY_BROKER_URL"])
    r.flushdb()  # the service's leftovers (beat's expired sweeps) are no peer's work
    try:
        with Service(env, "capacity-peer") as service:
            worker = peers.start_worker(service, "capacity-eta-worker", args.concurrency)
            peers.wait_quiet(worker.pid, min_seconds=3, timeout=60)
            return stepped(
                steps,
                lambda index, rate: peer_step(
                    index,
                    rate,
                    seconds=args.capacity_seconds,
                    sources=sources,
                    targets=targets,
                    worker_pid=worker.pid,
                    r=r,
                    timeout=args.timeout,
                ),
            )
    finally:
        with contextlib.suppress(Exception):
            r.flushdb()


# ---------------------------------------------------------------- the scenario
def run(args) -> dict:
    env = prepare(DATABASE, REDIS_DB)
    steps = list(args.capacity_steps)  # parsed by bench/run.py (parse_steps)
    total = sum(round(rate * args.capacity_seconds) for rate in steps)
    sources = fund_accounts(ACCOUNTS, max(total, 1) * 10)
    targets = fund_accounts(ACCOUNTS, 0)

    print(f"   this service: steps {steps} payments/s, {args.capacity_seconds:g} s each")
    ours, web_nice, idle, idle_pg = run_ours(env, steps, args, sources, targets)
    checks = exactly_once_check()  # before the peer: its transfers carry no payment
    peer_steps = steps
    if getattr(args, "capacity_peer_steps", None):
        chosen = args.capacity_peer_steps.strip().lower()
        peer_steps = [] if chosen == "none" else [float(s) for s in chosen.split(",")]
    peer = []
    if peer_steps:
        print(f"   Celery ETA peer, steps {peer_steps}")
        peer = run_peer(env, peer_steps, args, sources, targets)
        checks["reconcile_ok_after_peer"] = exactly_once_check()["reconcile_ok"]

    capacity = capacity_at_slo(ours)
    peer_capacity = capacity_at_slo(peer)
    at = next((s for s in ours if s["rate_per_second"] == capacity), None)
    lowest = next((s for s in ours if not s.get("skipped")), None)
    sweep_exported = any(s.get("sweep_interval") for s in ours)
    return {
        "steps": steps,
        "seconds_per_step": args.capacity_seconds,
        "worker_concurrency": args.concurrency,
        "slo": {
            "p99_seconds": SLO_P99_SECONDS,
            "p50_seconds": SLO_P50_SECONDS,
            "stop_after_failing_steps": STOP_AFTER_FAILING_STEPS,
        },
        "api_rates": {"schedule": args.api_schedule_rate, "status": args.api_status_rate},
        "web_nice": web_nice,
        "capacity_at_slo": capacity,
        "peer_capacity_at_slo": peer_capacity,
        # the highest step run met the SLO: the capacity is at least this
        "capacity_is_lower_bound": lower_bound(ours, capacity),
        "peer_capacity_is_lower_bound": lower_bound(peer, peer_capacity),
        "at_capacity": {
            "rate_per_second": capacity,
            "lateness_seconds": at["lateness_seconds"] if at else None,
            "schedule_p95_ms": at["schedule_p95_ms"] if at else None,
            "status_p95_ms": at["status_p95_ms"] if at else None,
            "sweep_interval_p99_le_seconds": at["sweep_interval_p99_le_seconds"] if at else None,
            # the p99 lay above the histogram's last finite bucket (le is None then)
            "sweep_interval_p99_above_seconds": (
                (at.get("sweep_interval") or {}).get("above_seconds") if at else None
            ),
            "worker_ms_per_payment": at["cpu"]["worker_ms_per_payment"] if at else None,
        },
        "lowest_step": {
            "rate_per_second": lowest["rate_per_second"] if lowest else None,
            "worker_ms_per_payment": lowest["cpu"]["worker_ms_per_payment"] if lowest else None,
        },
        "sweep_interval_metric": SWEEP_INTERVAL_METRIC if sweep_exported else None,
        "idle_worker_ms_per_second": idle,
        "idle_postgres_ms_per_second": idle_pg,
        "ours": ours,
        "peer": peer,
        "checks": checks,
        "notes": [
            "this service: API load (schedule + status through gunicorn) throughout each "
            f"step, after {WARM_UP_SECONDS:g} s of it as a warm-up before the first, gunicorn "
            f"at CPU weight nice {web_nice} (its session's); the peer: no API load (it has "
            "none), worker alone",
            "lateness: the step's own preloaded payments only; CPU per payment: every "
            "payment executed in the step's window (the API's too); PostgreSQL CPU is "
            "every server process on the host (the API's queries included)",
            "sweep interval p99: upper bound of the histogram bucket holding the step's "
            "99th percentile (≤ X s); null when the service does not export "
            f"{SWEEP_INTERVAL_METRIC}",
            "batches: the transactions in the window that ran payments "
            f"({BATCH_SIZE_METRIC}), their mean size, and the window's worker CPU over "
            "their number — a message that found its payments already run (stale, or "
            "collapsed into an earlier batch) is not a batch, but its CPU is in the total",
            "lock waits: pg_stat_activity sampled four times a second over the window, "
            "the share of active client backends waiting on a heavyweight lock and the "
            "statements waiting most; items: the executor's stale, collapsed and busy "
            "(handed back) chunk items in the window — overlapping counts: a collapsed "
            "payment's own message later counts it stale",
        ],
    }
