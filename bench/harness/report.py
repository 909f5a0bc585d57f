"""Reports: ``bench/results/<UTC date>-<name>/`` and the suite's Markdown.

Every bench writes into a dated run folder under ``bench/results/``, never
loose files: ``report.json`` (or a timestamped JSON when a run may repeat the
same day, e.g. chaos seeds), ``report.md`` beside it when there is one.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import time
from datetime import UTC, datetime
from pathlib import Path

from bench.harness.processes import PG_SERVER, REDIS_SERVER, ROOT

RESULTS = ROOT / "bench" / "results"


def results_dir(name: str, when: datetime | None = None) -> Path:
    """``bench/results/<date of when (UTC now)>-<name>/``, created."""
    out = RESULTS / f"{(when or datetime.now(UTC)):%Y-%m-%d}-{name}"
    out.mkdir(parents=True, exist_ok=True)
    return out


def write_report(
    name: str,
    report: dict,
    *,
    when: datetime | None = None,
    filename: str = "report.json",
    markdown: str | None = None,
    indent: int = 2,
) -> Path:
    """``bench/results/<date>-<name>/<filename>`` (and the ``.md`` beside it when
    ``markdown`` is given); prints and returns the JSON's path."""
    path = results_dir(name, when) / filename
    path.write_text(json.dumps(report, indent=indent, default=str))
    if markdown is not None:
        path.with_suffix(".md").write_text(markdown)
    print(f"report: {path}")
    return path


def git_revision() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()


def cpu_probe_ms() -> float:
    """CPU milliseconds a fixed pure-Python workload takes, the least of 5 tries:
    the host's speed at that moment. Hosts of the same kind drifted by a third
    within one session (docs/performance-history.md, session 16), so a run
    records it before and after each scenario, and a ratio is only read across
    a steady probe."""
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        counts: dict[int, int] = {}
        for i in range(300_000):
            counts[i % 1024] = counts.get(i % 1024, 0) + i * 3
        best = min(best, time.process_time() - started)
    return round(best * 1000, 1)


WAKE_PROBE_SLEEP = 0.3  # seconds: ``wake_charge_us``'s sleep, as the report names it


def wake_charge_us(sleep: float = WAKE_PROBE_SLEEP, tries: int = 5) -> float:
    """CPU microseconds this thread is charged for sleeping ``sleep`` seconds and
    waking once, the median of ``tries``: what the OS accounts for a wake, which
    a process at a low rate pays on every message and an idle one on every
    timer. Expected to be a few µs on bare metal (not measured here); on this
    project's benchmark VMs (Firecracker) one host read 0.1-0.45 ms in one run
    and 0.7-2.1 ms in a loop of its own an hour earlier, cause unknown
    (docs/performance-history.md, session 31). The 100/s step's worker CPU
    carries it on every wake; the drain's, whose processes seldom sleep,
    hardly at all — so a run records it beside the speed probe."""
    charged = []
    for _ in range(tries):
        started = time.thread_time()
        time.sleep(sleep)
        charged.append(time.thread_time() - started)
    return round(sorted(charged)[tries // 2] * 1e6, 1)


def machine() -> dict:
    import psutil
    import psycopg
    import redis

    with psycopg.connect(f"{PG_SERVER}/postgres") as conn:
        pg = conn.execute("SHOW server_version").fetchone()[0]
        # Settings that change what a long run measures: with autovacuum off (the
        # CI server's conf.d/90-ci.conf) dead row versions of payments_payment
        # pile up within a step (each payment is updated twice); scenarios VACUUM
        # between steps themselves. A production server runs autovacuum.
        # max_wal_size: at 1GB a steady 2,000/s checkpoints every ~20 s (session 27).
        pg_settings = dict(
            conn.execute(
                "SELECT name, current_setting(name) FROM pg_settings WHERE name = ANY(%s)",
                [
                    [
                        "autovacuum",
                        "fsync",
                        "synchronous_commit",
                        "shared_buffers",
                        "max_wal_size",
                        "track_commit_timestamp",
                    ]
                ],
            ).fetchall()
        )
    return {
        "cpus": os.cpu_count(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "postgres": pg,
        "postgres_settings": pg_settings,
        "redis": redis.Redis.from_url(REDIS_SERVER).info()["redis_version"],
    }


def fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.3f}".rstrip("0").rstrip(".") if abs(value) < 100 else f"{value:,.0f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def suite_markdown(report: dict) -> str:
    r = report["results"]
    lines = [
        f"# Benchmark report: {report['name']}",
        "",
        f"{report['date']} · {report['machine']['cpus']} CPUs · "
        f"{report['machine']['memory_gb']} GiB · {report['machine']['platform']} · "
        f"PostgreSQL {report['machine']['postgres']} · Redis {report['machine']['redis']} · "
        f"git {report['git']}",
        "",
        "PostgreSQL settings: "
        + (
            ", ".join(f"{k}={v}" for k, v in report["machine"].get("postgres_settings", {}).items())
            or "not recorded"
        ),
        "",
        f"Command: `{report['command']}`",
        "",
        "Host speed (CPU ms of a fixed Python workload, lower is faster; "
        "`cpu_probe_ms`): "
        + (
            ", ".join(f"{k} {v}" for k, v in report.get("cpu_probe_ms", {}).items())
            or "not recorded"
        ),
        "",
        f"CPU charged for one {WAKE_PROBE_SLEEP:g} s sleep and wake (`wake_charge_us`, µs): "
        + (
            ", ".join(f"{k} {v}" for k, v in report.get("wake_charge_us", {}).items())
            or "not recorded"
        ),
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
        if row["met"] is None and row.get("note"):
            met = "n/a"
        note = f" ({row['note']})" if row.get("note") else ""
        lines.append(
            f"| {row['target']} | {fmt(row['limit'])} | {fmt(row['value'])}{note} | {met} |"
        )
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
            *database_work_line(d.get("database_work"), f"the {name}"),
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
    cap = r.get("capacity")
    if cap and "error" not in cap:
        lines += capacity_markdown(cap)
    peers = r.get("peers")
    if peers and "error" not in peers:
        lines += ["", "## peers (same workload)", "", "```json", json.dumps(peers, indent=2), "```"]
    errors = {k: v["error"] for k, v in r.items() if isinstance(v, dict) and "error" in v}
    if errors:
        lines += ["", "## scenarios that failed to run", ""]
        lines += [f"- {k}: {v}" for k, v in errors.items()]
    lines += ["", "## Charts", ""] + [f"![{c}]({c})" for c in report["charts"]]
    return "\n".join(lines) + "\n"


def _host_busy(cpu: dict) -> str:
    """The host's CPU over the window: busy share of every core, and what the
    API's gunicorn, the load client (which share the cores) and no process the
    step names (the kernel, Redis, beat...) took of it."""
    if cpu.get("host_busy_fraction") is None:
        return "-"
    return (
        f"{cpu['host_busy_fraction'] * 100:.0f} % ({fmt(cpu['web_cpu_seconds'])}, "
        f"{fmt(cpu['load_client_cpu_seconds'])}, {fmt(cpu.get('other_cpu_seconds'))})"
    )


def _batches(step: dict) -> str:
    batches = step.get("batches")
    if not batches:
        return "-"
    return (
        f"{batches['count']:,} ({fmt(batches['payments_per_batch'])}, "
        f"{fmt(batches['worker_ms_per_batch'])})"
    )


def _contention(step: dict) -> str:
    """Lock-wait share of the window's active backends (the statement waiting
    most, its share of the waits); stale / collapsed / busy chunk items."""
    contention = step.get("contention")
    if not contention:
        return "-"
    waits, items = contention["lock_waits"], contention["items"]
    share = waits.get("lock_wait_share")
    text = "-" if share is None else f"{share * 100:.1f} %"
    if waits.get("top_waiters"):
        statement, part = waits["top_waiters"][0]
        text += f" (`{statement[:40]}` {part * 100:.0f} %)"
    if waits.get("error"):  # what it saw before it failed: part of the window
        text += f" **sampler failed after {waits['samples']:,} samples**"
    return f"{text}; {items['stale']:,} / {items['collapsed']:,} / {items['busy']:,}"


def _lateness(step: dict) -> str:
    """A capacity step's lateness quantiles; to the commit in brackets where the
    server recorded commit times (``lateness_to_commit_seconds``), which then
    decides the SLO."""
    lat = step["lateness_seconds"]
    text = f"{fmt(lat['p50'])} / {fmt(lat['p95'])} / {fmt(lat['p99'])}"
    commit = step.get("lateness_to_commit_seconds")
    if commit:
        text += f" [{fmt(commit['p50'])} / {fmt(commit['p95'])} / {fmt(commit['p99'])}]"
    return text


def _sweep_bound(step: dict) -> str:
    sweeps = step.get("sweep_interval")
    if not sweeps:
        return "-" if step.get("sweeps_in_window") is None else "not exported"
    if sweeps.get("le_seconds") is not None:
        return f"≤ {fmt(sweeps['le_seconds'])} s"
    if sweeps.get("above_seconds") is not None:
        return f"> {fmt(sweeps['above_seconds'])} s"
    return "no sweeps"


def idle_lines(cap: dict) -> list[str]:
    """The payment workers' idle CPU, and each step's worker CPU a payment above it."""
    idle = cap.get("idle_worker_ms_per_second")
    if idle is None:
        return []
    above = ", ".join(
        f"{fmt(step['rate_per_second'])}/s {fmt(step.get('worker_ms_per_payment_above_idle'))}"
        for step in cap["ours"]
        if not step.get("skipped")
    )
    lines = [
        f"- payment workers idle (no load, before the first step): {fmt(idle)} ms of CPU a "
        f"second; worker ms/payment less that rate over each window: {above} (an estimate: "
        "under load some idle wakes do not happen)"
    ]
    idle_pg = cap.get("idle_postgres_ms_per_second")
    if idle_pg is not None:
        lines.append(
            f"- PostgreSQL over the same idle seconds: {fmt(idle_pg)} ms of CPU a second (every "
            "server process: the idle service's sweeps, beat, checks and autovacuum)"
        )
    return lines


def wait_event_lines(cap: dict) -> list[str]:
    """What each step's active database backends were doing, by wait event."""
    steps = [
        (step["rate_per_second"], step["contention"]["lock_waits"].get("wait_events"))
        for step in cap["ours"]
        if step.get("contention")
    ]
    if not any(events for _, events in steps):
        return []
    parts = [
        f"{fmt(rate)}/s " + ", ".join(f"{event} {share * 100:.0f} %" for event, share in events)
        for rate, events in steps
        if events
    ]
    return [
        "- active database backends by wait event (share of the samples; `running`: no "
        "wait — on a CPU or queued for one): " + "; ".join(parts)
    ]


def database_work_line(work: dict | None, label: str = "the drain") -> list[str]:
    """A drain's (or hot's) PostgreSQL counters a payment (``bench.harness.dbwork``),
    if measured."""
    if not work:
        return []
    return [
        f"- PostgreSQL a payment: {fmt(work['buffers_per_payment'])} buffer accesses "
        f"({fmt(work['reads_per_payment'])} missed shared_buffers), "
        f"{fmt(work['wal_bytes_per_payment'])} WAL bytes, {fmt(work['wal_fpi_per_payment'])} "
        f"full-page images, {fmt(work['commits_per_payment'])} commits; payments_payment "
        f"{fmt(work['payment_heap_mb'])} + {fmt(work['payment_indexes_mb'])} MB (heap + indexes) "
        f"against shared_buffers {fmt(work['shared_buffers_mb'])} MB",
        *relation_lines(label, work),
    ]


def database_work_lines(cap: dict) -> list[str]:
    """PostgreSQL's own counters a payment, by step (``bench.harness.dbwork``)."""
    steps = [
        (s["rate_per_second"], s["database_work"]) for s in cap["ours"] if s.get("database_work")
    ]
    if not steps:
        return []
    lines = [
        "",
        "PostgreSQL's own counters over each step's window, a payment executed "
        "(host-independent; `bench.harness.dbwork`):",
        "",
        "| due rate (/s) | buffer accesses | of them missed shared_buffers | WAL bytes "
        "| full-page images | commits | payments heap + indexes at window end (MB) "
        "| shared_buffers (MB) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for rate, work in steps:
        share = work["read_share"]
        lines.append(
            f"| {fmt(rate)} | {fmt(work['buffers_per_payment'])} "
            f"| {fmt(work['reads_per_payment'])} "
            f"({'-' if share is None else f'{share * 100:.1f} %'}) "
            f"| {fmt(work['wal_bytes_per_payment'])} | {fmt(work['wal_fpi_per_payment'])} "
            f"| {fmt(work['commits_per_payment'])} "
            f"| {fmt(work['payment_heap_mb'])} + {fmt(work['payment_indexes_mb'])} "
            f"| {fmt(work['shared_buffers_mb'])} |"
        )
    for rate, work in steps:
        lines += relation_lines(f"{fmt(rate)}/s", work)
    return lines


def relation_lines(label: str, work: dict) -> list[str]:
    """The busiest tables (heap + indexes) and indexes a payment, if measured."""
    lines = []
    if work.get("tables_per_payment"):
        lines.append(
            f"- {label}, buffer accesses a payment by table (heap + indexes): "
            + ", ".join(f"{n} {fmt(h)} + {fmt(i)}" for n, h, i in work["tables_per_payment"])
        )
    if work.get("indexes_per_payment"):
        lines.append(
            f"- {label}, by index: "
            + ", ".join(f"{n} {fmt(v)}" for n, v in work["indexes_per_payment"])
        )
    return lines


def capacity_markdown(cap: dict) -> list[str]:
    """The capacity scenario: one row per step, this service's and the peer's."""
    slo = cap["slo"]
    api = cap["api_rates"]

    def rate(value, at_least):
        if value is None:
            return "**none** (no step met it)"
        return f"**{'≥ ' if at_least else ''}{fmt(value)}/s**"

    lines = [
        "",
        f"## capacity: steady due rates, {fmt(cap['seconds_per_step'])} s per step",
        "",
        f"- capacity at SLO (p99 lateness ≤ {fmt(slo['p99_seconds'])} s and "
        f"p50 ≤ {fmt(slo['p50_seconds'] * 1000)} ms): this service "
        f"{rate(cap['capacity_at_slo'], cap.get('capacity_is_lower_bound'))}"
        f" with the API taking {fmt(api['schedule'])} schedules/s + {fmt(api['status'])} status "
        f"reads/s throughout; Celery `apply_async(eta=…)` peer "
        f"{rate(cap['peer_capacity_at_slo'], cap.get('peer_capacity_is_lower_bound'))}"
        " with no API load (it has no API)",
        f"- worker `-c {cap['worker_concurrency']}` for both; after "
        f"{slo['stop_after_failing_steps']} failing steps the higher ones are skipped",
        "",
        "| due rate (/s) | payments | lateness p50 / p95 / p99 (s) [to the commit] | SLO "
        "| schedule p95 (ms) "
        "| status p95 (ms) | worker ms/payment | PostgreSQL ms/payment | executed (API's) "
        "| open at window end / at timeout | sweep interval p99 "
        "| batches (payments each, worker ms each) "
        "| lock waits (top waiter); items stale / collapsed / busy "
        "| host CPU busy (web, load client, other, s) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for step in cap["ours"]:
        if step.get("skipped"):
            lines.append(f"| {fmt(step['rate_per_second'])} | skipped |" + " |" * 12)
            continue
        cpu = step["cpu"]
        lines.append(
            f"| {fmt(step['rate_per_second'])} | {step['payments']:,} "
            f"| {_lateness(step)} "
            f"| {'met' if step['meets_slo'] else '**missed**'} "
            f"| {fmt(step['schedule_p95_ms'])} | {fmt(step['status_p95_ms'])} "
            f"| {fmt(cpu['worker_ms_per_payment'])} | {fmt(cpu['postgres_ms_per_payment'])} "
            f"| {step['executed']:,} ({step['executed_api']:,}) "
            f"| {step['open_at_window_end']:,} / {step['still_open_at_timeout']:,} "
            f"| {_sweep_bound(step)} | {_batches(step)} | {_contention(step)} "
            f"| {_host_busy(cpu)} |"
        )
    lines += database_work_lines(cap)
    lines += [
        "",
        "Celery ETA peer, same steps, no API load:",
        "",
        "| due rate (/s) | payments | lateness p50 / p95 / p99 (s) [to the commit] | SLO "
        "| executed "
        "| duplicates | never ran (timeout) | worker ms/payment | published ahead (s) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for step in cap["peer"]:
        if step.get("skipped"):
            lines.append(f"| {fmt(step['rate_per_second'])} | skipped |" + " |" * 7)
            continue
        lines.append(
            f"| {fmt(step['rate_per_second'])} | {step['payments']:,} "
            f"| {_lateness(step)} "
            f"| {'met' if step['meets_slo'] else '**missed**'} | {step['executed']:,} "
            f"| {step['duplicates']:,} | {step['censored']:,} "
            f"| {fmt(step['cpu']['worker_ms_per_payment'])} "
            f"| {fmt(step['setup_margin_seconds'])} |"
        )
    lines += ["", f"- checks: {json.dumps(cap['checks'])}"]
    lines += idle_lines(cap)
    lines += wait_event_lines(cap)
    lines += [f"- {note}" for note in cap.get("notes", [])]
    return lines
