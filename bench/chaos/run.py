"""One chaos run: start everything, inject the seeded faults under load, settle, verify.

``bench/chaos.py`` (and ``python -m bench.chaos``) run :func:`main`; the run
is described in the package's docstring (``bench/chaos/__init__.py``).
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import json
import random
import shlex
import signal
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import bench.chaos
from bench.chaos.checks import verify
from bench.chaos.config import (
    DATABASE,
    DRIVER_APP,
    REDIS_PORT,
    REDIS_URL,
    SERVICE_ENV,
    WEB_PORT,
    log,
)
from bench.chaos.faults import (
    FAULT_WEIGHTS,
    ChaosService,
    RedisServer,
    fault_schedule,
    kill_web_worker,
    last_error_line,
    log_signals,
    pg_terminate,
    port_in_use,
)
from bench.chaos.workload import (
    Api,
    ApiLoad,
    brief,
    create_recurring,
    direct_load,
    load_data,
)
from bench.harness.clock import db_now
from bench.harness.db import prepare
from bench.harness.load import fund_accounts
from bench.harness.processes import LOG_DIR, wait_http
from bench.harness.report import write_report


# ---------------------------------------------------------------- the run
class Run:
    def __init__(self, args) -> None:
        self.args = args
        self.seconds = args.minutes * 60
        self.schedule = fault_schedule(args.seed, self.seconds, args.workers, args.faults)
        self.faults: list[dict] = []
        self.unexpected: list[dict] = []
        self.direct_ids: list[str] = []
        self.doomed: list[dict] = []
        self.recurring: list[dict] = []
        self.t0: float | None = None
        self.service: ChaosService | None = None
        self.redis = RedisServer()
        self.stop_api = threading.Event()
        self.streams: list[ApiLoad] = []
        self.down: set[str] = set()
        self.load_rng = random.Random(f"{args.seed}:load")
        self.cleaned = False

    # --- lifecycle
    def cleanup(self) -> None:
        if self.cleaned:
            return
        self.cleaned = True
        self.stop_api.set()
        if self.service is not None:
            with contextlib.suppress(Exception):
                self.service.stop()
            self.service.kill_all_groups()
        self.redis.kill()

    def roles(self) -> list[str]:
        return [f"worker{i}" for i in range(self.args.workers)] + [
            "timers",
            "recurring",
            "webhooks",
            "beat",
            "web",
        ]

    def start_role(self, role: str) -> None:
        if role == "redis":
            self.redis.start()
        elif role == "beat":
            self.service.beat()
        elif role == "web":
            self.service.gunicorn(WEB_PORT)
        elif role == "timers":
            self.service.timers()
        elif role == "recurring":
            self.service.recurring()
        elif role == "webhooks":
            self.service.webhooks(concurrency=4)
        else:
            self.service.worker(self.args.concurrency, role=role)

    def supervise(self) -> None:
        """Restart what died without being told to (and record it)."""
        for role in ["redis", *self.roles()]:
            if role in self.down:
                continue
            alive = self.redis.running() if role == "redis" else self.service.running(role)
            if not alive:
                proc = self.redis.proc if role == "redis" else self.service.procs.get(role)
                code = proc.poll() if proc is not None else None
                entry = {"role": role, "returncode": code, **self.stamp()}
                entry["last_error"] = last_error_line(
                    self.redis.log_path if role == "redis" else LOG_DIR / f"chaos-{role}.log"
                )
                self.unexpected.append(entry)
                log(f"UNEXPECTED EXIT of {role} (rc={code}); restarting", self.t0)
                try:
                    self.start_role(role)
                except Exception as exc:  # e.g. the port still taken: next round retries
                    entry["restart_error"] = f"{type(exc).__name__}: {exc}"

    def stamp(self) -> dict:
        return {
            "t": round(time.monotonic() - self.t0, 2) if self.t0 else None,
            "wall": datetime.now(UTC).isoformat(timespec="milliseconds"),
        }

    def apply(self, event: dict) -> None:
        action, target = event["action"], event["target"]
        try:
            if action == "start":
                self.down.discard(target)  # if the start fails, supervise() retries it
                self.start_role(target)
                result = "started"
            elif action in ("kill_worker", "kill_beat"):
                self.down.add(target)
                self.service.kill(target, signal.SIGKILL)
                result = "killed"
            elif action == "redis_restart":
                self.down.add("redis")
                self.redis.kill()
                result = "killed"
            elif action == "redis_flushall":
                result = self.redis.flushall()
            elif action == "pg_terminate":
                result = pg_terminate(event["mode"], event["fraction"], event["pick_seed"])
            elif action == "kill_web_worker":
                result = kill_web_worker(self.service, event["pick"])
            else:
                raise ValueError(action)
        except Exception as exc:
            result = f"error: {type(exc).__name__}: {exc}"
        entry = {**event, "planned_at": event["at"], **self.stamp(), "result": result}
        entry.pop("at")
        self.faults.append(entry)
        params = {k: v for k, v in event.items() if k not in ("at", "action", "target")}
        log(f"{action} {target} {params or ''} -> {result}", self.t0)

    # --- load
    def direct_load(self, count: int) -> None:
        direct_load(self.load_rng, self.setup, count, self.direct_ids)

    def doom_tick(self, elapsed: float, final: bool = False) -> None:
        """Every 30 s a fresh target account; frozen 8 s later (its payments must FAIL)."""
        from bench.harness.app import account_set_status

        for doomed in self.doomed:
            if doomed["frozen_at"] is None and (final or elapsed >= doomed["freeze_after"]):
                if self.shared.get("doomed") == doomed["account_id"]:
                    self.shared["doomed"] = None
                account_set_status(account_id=doomed["account_id"], status="frozen")
                doomed["frozen_at"] = db_now().isoformat()
                log(f"froze doomed account {doomed['account_id']}", self.t0)
        if final or elapsed < len(self.doomed) * 30 + 5 or elapsed > self.seconds - 10:
            return
        account = fund_accounts(1, 0, name="doomed")[0]
        self.doomed.append(
            {
                "account_id": account,
                "created_t": round(elapsed, 1),
                "freeze_after": elapsed + 8,
                "frozen_at": None,
            }
        )
        self.shared["doomed"] = account

    # --- main
    def execute(self) -> dict:
        args = self.args
        for port in (REDIS_PORT, WEB_PORT):
            if port_in_use(port):
                raise SystemExit(f"port {port} is in use (a previous chaos run?): not starting")
        LOG_DIR.mkdir(parents=True, exist_ok=True)
        for path in LOG_DIR.glob("chaos-*"):
            path.unlink()
        self.redis.start()
        log(f"redis-server on port {REDIS_PORT} (pid {self.redis.proc.pid})")
        env = prepare(DATABASE, 0, **SERVICE_ENV)
        from django.db import connection, connections

        connections["default"].settings_dict.setdefault("OPTIONS", {})["application_name"] = (
            DRIVER_APP
        )
        connection.close()
        self.setup = load_data(self.args.retry_budget)
        self.shared: dict = {"doomed": None}
        self.service = ChaosService(env, "chaos")
        for role in self.roles():
            self.start_role(role)
        wait_http(f"http://127.0.0.1:{WEB_PORT}/healthz", timeout=60)
        create_recurring(self.setup, self.recurring)
        time.sleep(3)  # let workers connect before the first fault
        api_rate = args.rate * args.api_share
        streams = args.api_streams if api_rate > 0 else 0
        for i in range(streams):
            self.streams.append(
                ApiLoad(i, args.seed, api_rate / streams, self.setup, self.shared, self.stop_api)
            )
        direct_rate = args.rate - api_rate
        self.t0 = time.monotonic()
        log(
            f"chaos for {self.seconds:.0f}s: {len(self.schedule)} scheduled events, "
            f"{direct_rate:g}/s direct + {api_rate:g}/s via API",
            self.t0,
        )
        for stream in self.streams:
            stream.start()
        pending = list(self.schedule)
        owed = 0.0
        next_tick = self.t0
        while (elapsed := time.monotonic() - self.t0) < self.seconds:
            while pending and pending[0]["at"] <= elapsed:
                self.apply(pending.pop(0))
            self.supervise()
            if time.monotonic() >= next_tick:
                owed += direct_rate
                self.direct_load(int(owed))
                owed -= int(owed)
                self.doom_tick(elapsed)
                next_tick += 1.0
            wake = min(next_tick, self.t0 + (pending[0]["at"] if pending else self.seconds))
            time.sleep(max(0.0, min(wake - time.monotonic(), 0.25)))
        return self.finish(pending)

    def finish(self, pending: list[dict]) -> dict:
        from bench.harness.app import OPEN_STATUSES, Payment

        t_end = time.monotonic() - self.t0
        log("injection over: stopping the load, bringing everything up", self.t0)
        self.stop_api.set()
        for event in pending:  # restarts still owed; further faults are dropped
            if event["action"] == "start":
                self.apply(event)
        skipped = [e for e in pending if e["action"] != "start"]
        for stream in self.streams:
            while stream.is_alive():
                stream.join(0.5)
                self.supervise()
        self.doom_tick(t_end, final=True)
        api = Api(self.setup["token"], self.args.retry_budget, random.Random(1))
        for schedule in self.recurring:
            result = api.call(
                "POST",
                f"/api/v1/recurring-payments/{schedule['id']}/cancel",
                None,
                f"chaos-rec-cancel-{schedule['id']}",
            )
            schedule["cancel"] = brief(result)
            schedule["cancelled_at"] = db_now().isoformat()
        last_due = Payment.objects.filter(status__in=OPEN_STATUSES).order_by("-due_at").first()
        horizon = max(0.0, (last_due.due_at - db_now()).total_seconds()) if last_due else 0.0
        budget = horizon + self.args.settle
        log(f"waiting up to {budget:.0f}s for every payment to be terminal", self.t0)
        started = time.monotonic()
        last_report = 0.0
        while True:
            self.supervise()
            open_counts = dict(
                Counter(
                    Payment.objects.filter(status__in=OPEN_STATUSES).values_list(
                        "status", flat=True
                    )
                )
            )
            waited = time.monotonic() - started
            if not open_counts:
                time.sleep(3)  # late deliveries land (and are fenced out) before we stop
                if not Payment.objects.filter(status__in=OPEN_STATUSES).exists():
                    break
            if waited > budget:
                log(f"gave up waiting: still open {open_counts}", self.t0)
                break
            if waited - last_report >= 10:
                log(f"open: {open_counts}", self.t0)
                last_report = waited
            time.sleep(1)
        drain_seconds = time.monotonic() - started
        log("stopping the service", self.t0)
        self.service.stop()
        return {
            "injection_seconds": round(t_end, 1),
            "drain_seconds": round(drain_seconds, 1),
            "drain_budget_seconds": round(budget, 1),
            "faults_not_reached": len(skipped),
        }


# ---------------------------------------------------------------- entry point
def _check_counts(check: dict) -> str:
    """A check's scalar details, ``key=value, …`` (its description left out)."""
    keys = [
        k
        for k in check
        if k not in ("name", "ok", "description") and not isinstance(check[k], list | dict)
    ]
    return ", ".join(f"{k}={check[k]}" for k in keys)


def markdown(summary: dict) -> str:
    """The run in short, and every check by name with its result and counts."""
    lat = summary["lateness_seconds"]
    lines = [
        f"# Chaos run, seed {summary['seed']} ({summary['started_at']})",
        "",
        f"Replay: `{summary['replay']}`",
        "",
        f"- {summary['payments']:,} payments {summary['by_status']}, by origin "
        f"{summary['by_origin']}",
        f"- faults {summary['faults']}; unexpected exits {len(summary['unexpected_exits'])}",
        f"- lateness p50 {lat['p50']} s, p99 {lat['p99']} s, max {lat['max']} s",
        "",
        f"**{'Every check passes' if summary['ok'] else 'FAILED'}**",
        "",
        "| check | result | mismatches | what it proves | counts |",
        "|---|---|---|---|---|",
    ]
    for c in summary["checks"]:
        counts = _check_counts({k: v for k, v in c.items() if k != "mismatches"})
        lines.append(
            f"| {c['name']} | {'pass' if c['ok'] else '**FAIL**'} | {c['mismatches']} "
            f"| {c['description']} | {counts} |"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=bench.chaos.__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True, help="replay a run with its seed")
    parser.add_argument(
        "--minutes", type=float, default=10.0, help="chaos duration (fractional ok)"
    )
    parser.add_argument("--rate", type=float, default=50.0, help="payments created per second")
    parser.add_argument("--api-share", type=float, default=0.2, help="share created via the API")
    parser.add_argument("--api-streams", type=int, default=4, help="concurrent API clients")
    parser.add_argument(
        "--workers", type=int, default=2, help="payment workers (each killed as one)"
    )
    parser.add_argument(
        "--concurrency", type=int, default=2, help="solo-pool processes of each payment worker"
    )
    parser.add_argument("--settle", type=float, default=180.0, help="extra drain wait (s)")
    parser.add_argument(
        "--retry-budget", type=float, default=150.0, help="how long an API client retries (s)"
    )
    parser.add_argument("--allow-dead-letters", action="store_true")
    parser.add_argument(
        "--faults",
        type=lambda text: [k.strip() for k in text.split(",") if k.strip()],
        help=f"comma-separated fault kinds to draw from (default: {','.join(FAULT_WEIGHTS)})",
    )
    parser.add_argument("--out", type=Path, help="summary JSON path")
    parser.add_argument("--print-schedule", action="store_true", help="print the faults, exit")
    args = parser.parse_args()
    if not 0 <= args.api_share <= 1 or args.workers < 1 or args.minutes <= 0:
        parser.error("need 0 <= --api-share <= 1, --workers >= 1, --minutes > 0")

    run = Run(args)
    if args.print_schedule:
        for event in run.schedule:
            print(json.dumps(event))
        return 0

    def terminate(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, terminate)
    atexit.register(run.cleanup)
    started = datetime.now(UTC)
    summary: dict = {
        "benchmark": "chaos",
        "seed": args.seed,
        "replay": "nice -n 10 .venv/bin/python bench/chaos.py "
        + " ".join(shlex.quote(a) for a in sys.argv[1:]),
        "started_at": started.isoformat(timespec="seconds"),
        "config": {
            "minutes": args.minutes,
            "rate_per_second": args.rate,
            "api_share": args.api_share,
            "api_streams": args.api_streams,
            "workers": args.workers,
            "concurrency": args.concurrency,
            "service_env": SERVICE_ENV,
            "redis": REDIS_URL,
            "database": DATABASE,
        },
    }
    try:
        summary["phases"] = run.execute()
        checks, stats = verify(run)
    except KeyboardInterrupt as exc:
        log(f"interrupted ({exc}); cleaning up")
        run.cleanup()
        return 130
    finally:
        run.cleanup()
    summary.update(stats)
    summary["faults"] = dict(Counter(f["action"] for f in run.faults if f["action"] != "start"))
    summary["fault_errors"] = [f for f in run.faults if str(f["result"]).startswith("error")]
    summary["unexpected_exits"] = run.unexpected
    summary["log_signals"] = log_signals()
    summary["doomed_accounts"] = run.doomed
    summary["checks"] = checks
    summary["ok"] = all(c["ok"] for c in checks)
    summary["fault_log"] = run.faults
    if args.out:
        out = args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(summary, indent=2, default=str))
    else:
        out = write_report(
            f"chaos-{args.seed}",
            summary,
            when=started,
            filename=f"chaos-{args.seed}-{started:%Y%m%dT%H%M%S}.json",
            markdown=markdown(summary),
        )

    print()
    print(f"chaos seed {args.seed}: {summary['payments']} payments {summary['by_status']}")
    print(f"  by origin {summary['by_origin']}; faults {summary['faults']}")
    for exit_ in run.unexpected:
        print(f"  unexpected exit: {exit_['role']} rc={exit_['returncode']} at +{exit_['t']}s")
        print(f"    {exit_['last_error']}")
    lat = summary["lateness_seconds"]
    print(f"  lateness s: p50 {lat['p50']} p99 {lat['p99']} max {lat['max']}")
    print(f"  api: {summary['api']['outcomes']}")
    print(f"  logs: {summary['log_signals']}")
    for c in checks:
        print(f"  {'PASS' if c['ok'] else 'FAIL'} {c['name']}: {_check_counts(c)}")
    print(f"summary: {out}")
    print(f"replay:  {summary['replay']}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
