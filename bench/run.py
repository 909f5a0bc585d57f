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

Each scenario is a module of ``bench/scenarios/`` (``run(args) -> dict``) over
the shared harness ``bench/harness/`` (processes, metrics, the database clock,
data loading, reports and charts); this file runs them and writes the report.

``--quick`` shrinks every size (a smoke run of the harness, not a result).
Lateness is ``executed_at - due_at``, both stamped by the database clock.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness.charts import charts
from bench.harness.processes import ROOT
from bench.harness.report import git_revision, machine, results_dir, suite_markdown
from bench.scenarios import drain, peers, pglimit, scale, steady

# name -> the function a scenario's own process runs (its result is the report's entry)
SCENARIOS = {
    "drain": drain.run,
    "hot": drain.run_hot,
    "steady": steady.run,
    "scale": scale.run,
    "pglimit": pglimit.run,
    "peers": peers.run,
}


# ---------------------------------------------------------------- targets
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


# ---------------------------------------------------------------- running
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
        result = SCENARIOS[args.scenario](args)
        Path(args.scenario_out).write_text(json.dumps(result, default=str))
        return 0

    date = datetime.now(UTC)
    out = results_dir(args.name, date)
    child_argv = without_option(sys.argv[1:], "--only")
    selected = [s.strip() for s in args.only.split(",") if s.strip()]
    results = {name: run_scenario_subprocess(name, child_argv, out) for name in selected}
    report = {
        "name": args.name,
        "date": date.isoformat(timespec="seconds"),
        "command": "bench/run.py " + " ".join(sys.argv[1:]),
        "git": git_revision(),
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
    (out / "report.md").write_text(suite_markdown(report))
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
