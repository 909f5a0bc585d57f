"""Chaos run: random crashes under load, then prove nothing was lost or paid twice.

    nice -n 10 .venv/bin/python bench/chaos.py --seed 1 --minutes 10 [--rate 50] [--workers 2]
                                               [--api-share 0.2] [--settle 180] [--out PATH]
    .venv/bin/python bench/chaos.py --seed 1 --minutes 10 --print-schedule

Runs the real service — ``--workers`` Celery workers, Celery beat, gunicorn —
on its own database ``scheduler_chaos`` and its own Redis server
(``redis-server`` on 127.0.0.1:6391, no persistence, a child of this script),
with ``PAYMENT_LEASE_SECONDS=5`` and a 30 s Redis visibility timeout so that
recovery is fast. For ``--minutes`` it

- creates ``--rate`` payments per second: most inserted directly (PENDING
  with their holds, like ``bench/run.py``), due now, in a few seconds or in
  up to 45 s; ``--api-share`` of them through the HTTP API with an
  ``Idempotency-Key`` (also copied into ``metadata.chaos_key``), retried with
  the same key on connection errors, 5xx and ``idempotency_key_in_use`` —
  some later cancelled or rescheduled / re-amounted through the API, some
  from an account without funds (must be refused), some to an account that
  is frozen before they are due (must end FAILED ``account_not_active``);
  two recurring schedules (every minute; one runs out of funds);
- injects faults on a schedule drawn from ``random.Random(seed)`` before the
  run starts (``--print-schedule`` shows it): SIGKILL of a worker's process
  group (a payment worker or the timer worker), of beat, of a gunicorn
  worker; Redis SIGKILL + restart on the same port; Redis FLUSHALL;
  ``pg_terminate_backend`` of all or some of the
  service's PostgreSQL backends, or for 3 s of every one caught inside a
  statement or transaction (only ``scheduler_chaos``'s, never this script's
  own connections, never another database). Killed processes are
  restarted after the scheduled downtime; a process that exits on its own is
  reported (``unexpected_exits``) and restarted, as a supervisor would.

Then it stops injecting and creating, brings everything up, waits (bounded:
the last due time plus ``--settle`` seconds) until no payment is open, stops
the service and checks: every payment terminal; none executed twice (one
journal entry, one succeeded attempt, one ``executed`` event per COMPLETED
payment); none executed early; none lost (every payment inserted, every API
request answered 201, exists; no Idempotency-Key produced two payments; a
refused request produced none); cancel / reschedule answers agree with the
final state; no FAILED payment without an expected reason; no active hold
left, holds captured or released consistently; every account's balance equals
its deposits plus completed payments; every payment's last audit event names its
status; recurring occurrences unique and without
gaps; ``manage.py reconcile_ledger`` clean. Dead-lettered payments (FAILED
``max_attempts_exceeded``) are listed with their history and fail the run
unless ``--allow-dead-letters``.

Prints a summary and writes it as JSON (``bench/results/chaos-<seed>-<time>.json``
or ``--out``). Exit status 0 when every check passes, 1 otherwise. Service
logs: ``var/bench-logs/chaos-*.log``. Every child runs in its own process group
under ``setpriv --pdeathsig KILL``; all are stopped on exit (normal, error,
Ctrl-C, SIGTERM/SIGHUP) and even when this script is SIGKILLed.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import heapq
import http.client
import itertools
import json
import os
import random
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import (
    LOG_DIR,
    OPEN_STATUSES,
    PG_SERVER,
    ROOT,
    Service,
    bulk_schedule,
    exactly_once_check,
    fund_accounts,
    prepare,
    summarize,
    wait_http,
)

DATABASE = "scheduler_chaos"
REDIS_PORT = 6391
WEB_PORT = 8791
REDIS_URL = f"redis://127.0.0.1:{REDIS_PORT}/0"
DRIVER_APP = "chaos-driver"  # application_name of this script's own connections: never killed
SERVICE_ENV = {
    "CELERY_BROKER_URL": REDIS_URL,
    "PAYMENT_LEASE_SECONDS": "5",
    "CELERY_VISIBILITY_TIMEOUT": "30",
}
# Kill-style faults with their relative weights; each is possible only while its
# target is up (the schedule tracks downtime).
FAULT_WEIGHTS = {
    "kill_worker": 3.0,
    "kill_beat": 2.0,
    "kill_web_worker": 1.0,
    "redis_restart": 1.5,
    "redis_flushall": 1.5,
    "pg_terminate": 2.5,
}
EXPECTED_FAILURE_CODES = {"account_not_active"}  # plus dead letters, reported apart
DEAD_LETTER = "max_attempts_exceeded"


def log(message: str, t0: float | None = None) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S.%f")[:-3]
    offset = f" +{time.monotonic() - t0:7.1f}s" if t0 is not None else ""
    print(f"[{stamp}{offset}] {message}", flush=True)


# ---------------------------------------------------------------- the fault schedule
def fault_schedule(seed: int, seconds: float, workers: int) -> list[dict]:
    """Every fault and restart of the run, as offsets from its start: a function of the seed.

    The first faults go through every kind once (in a seeded order), so even a
    short run sees each; then kinds are drawn by weight. A component is never
    killed while it is down; its restart is an event of its own.
    """
    rng = random.Random(seed)
    kinds = list(FAULT_WEIGHTS)
    first = rng.sample(kinds, len(kinds))
    down_until: dict[str, float] = {}
    events: list[dict] = []
    t = rng.uniform(4, 8)
    while t < seconds:

        def up(component: str, at: float = t) -> bool:
            return down_until.get(component, 0.0) <= at

        options: list[tuple[str, str]] = []
        for kind in kinds:
            if kind == "kill_worker":
                names = [f"worker{i}" for i in range(workers)] + ["timers", "recurring"]
                options += [(kind, name) for name in names if up(name)]
            elif kind == "kill_beat" and up("beat"):
                options.append((kind, "beat"))
            elif kind in ("redis_restart", "redis_flushall") and up("redis"):
                options.append((kind, "redis"))
            elif kind in ("kill_web_worker", "pg_terminate"):
                options.append((kind, "web" if kind == "kill_web_worker" else "postgres"))
        wanted = first.pop(0) if first else None
        candidates = [o for o in options if o[0] == wanted] or options
        weights = [
            FAULT_WEIGHTS[k] / (workers + 1 if k == "kill_worker" else 1) for k, _ in candidates
        ]
        kind, target = rng.choices(candidates, weights)[0]
        event = {"at": round(t, 2), "action": kind, "target": target}
        if kind in ("kill_worker", "kill_beat", "redis_restart"):
            down = round(
                rng.uniform(0.5, 10.0) if kind != "redis_restart" else rng.uniform(0, 5), 2
            )
            event["down_seconds"] = down
            down_until[target] = t + down
            events.append({"at": round(t + down, 2), "action": "start", "target": target})
        elif kind == "pg_terminate":
            event["mode"] = rng.choice(["any", "busy"])
            event["fraction"] = rng.choice([1.0, 1.0, 0.5, 0.25])
            event["pick_seed"] = rng.randrange(2**32)
        elif kind == "kill_web_worker":
            event["pick"] = rng.randrange(1000)
        events.append(event)
        t += rng.uniform(2.0, 12.0)
    events.sort(key=lambda e: (e["at"], e["action"] != "start"))
    return events


# ---------------------------------------------------------------- processes
def _port_in_use(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def _guarded(args: list[str]) -> list[str]:
    """Prefix ``args`` so the child is SIGKILLed if this script dies (Linux setpriv)."""
    if shutil.which("setpriv"):
        return ["setpriv", "--pdeathsig", "KILL", "--", *args]
    return args


class ChaosService(Service):
    """``Service`` whose children die with this script, and who remembers every group."""

    def __init__(self, env: dict[str, str], name: str) -> None:
        super().__init__(env, name)
        self.groups: set[int] = set()

    def start(self, role: str, args: list[str]) -> subprocess.Popen:
        proc = super().start(role, _guarded(args))
        self.groups.add(proc.pid)
        return proc

    def running(self, role: str) -> bool:
        proc = self.procs.get(role)
        return proc is not None and proc.poll() is None

    def kill_all_groups(self) -> None:
        for pgid in self.groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)


class RedisServer:
    """Our own redis-server (no persistence): a restart or FLUSHALL hurts nobody else."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.log_path = LOG_DIR / "chaos-redis.log"

    def start(self) -> None:
        log_file = open(self.log_path, "a")  # noqa: SIM115 - lives as long as the server
        self.proc = subprocess.Popen(
            _guarded(
                [
                    "redis-server",
                    "--port",
                    str(REDIS_PORT),
                    "--bind",
                    "127.0.0.1",
                    "--save",
                    "",
                    "--appendonly",
                    "no",
                ]
            ),
            stdout=log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        deadline = time.monotonic() + 15
        while not self.ping():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                raise RuntimeError(f"redis-server did not start (see {self.log_path})")
            time.sleep(0.05)

    def ping(self) -> bool:
        import redis

        try:
            return bool(redis.Redis.from_url(REDIS_URL, socket_timeout=1).ping())
        except redis.RedisError:
            return False

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self) -> None:
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def flushall(self) -> str:
        import redis

        client = redis.Redis.from_url(REDIS_URL, socket_timeout=2)
        before = client.dbsize()
        client.flushall()
        return f"flushed ({before} keys in db 0)"


def last_error_line(path: Path) -> str | None:
    """Why a process exited: the most severe error line since its last start."""
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return None
    starts = [i for i, line in enumerate(lines) if "******* ----" in line]  # Celery's banner
    lines = lines[starts[-1] :] if starts else lines
    for needle in ("Unrecoverable error", "CRITICAL", "ERROR", "Error:"):
        for line in reversed(lines):
            if needle in line:
                return line.strip()[:300]
    return None


LOG_SIGNALS = {
    "worker_unrecoverable": ("worker", "Unrecoverable error"),
    "worker_broker_lost": ("worker", "Connection to broker lost"),
    "chunk_retries": ("worker", "; retry "),
    "chunk_splits": ("worker", "split in two"),
    "chunks_given_up": ("worker", "leaving it to the lease reaper"),
    "reaper_runs_with_work": ("timers", "reaper requeued"),
    "web_500": ("web", "Internal Server Error"),
    "beat_errors": ("beat", "ERROR"),
}


def log_signals() -> dict[str, int]:
    """Counts of telling lines in the service logs (what the faults did)."""
    counts = dict.fromkeys(LOG_SIGNALS, 0)
    for path in LOG_DIR.glob("chaos-*.log"):
        text = path.read_text(errors="replace")
        for name, (role, needle) in LOG_SIGNALS.items():
            if path.name.startswith(f"chaos-{role}"):
                counts[name] += text.count(needle)
    return counts


def pg_terminate(mode: str, fraction: float, pick_seed: int) -> str:
    """``pg_terminate_backend`` on the service's backends of DATABASE only.

    ``mode`` ``any``: a seeded ``fraction`` of them, whatever they are doing
    (mostly idle: it tests reconnection); ``busy``: for up to 3 s, every backend
    caught running a statement or inside a transaction (it tests rollback and
    retry of work in flight).
    """
    import psycopg

    query = """
        SELECT pid, state FROM pg_stat_activity
         WHERE datname = %s AND backend_type = 'client backend'
           AND pid <> pg_backend_pid() AND application_name NOT LIKE 'chaos-%%'
    """
    with psycopg.connect(
        f"{PG_SERVER}/{DATABASE}", autocommit=True, application_name=f"{DRIVER_APP}-killer"
    ) as conn:

        def terminate(pids) -> int:
            return sum(
                1
                for pid in pids
                if conn.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone()[0]
            )

        if mode == "any":
            pids = sorted(pid for pid, _ in conn.execute(query, [DATABASE]))
            count = max(1, round(len(pids) * fraction)) if pids else 0
            killed = terminate(random.Random(pick_seed).sample(pids, count))
            return f"terminated {killed} of {len(pids)} backends"
        killed, states = 0, Counter()
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline:
            busy = [(pid, st) for pid, st in conn.execute(query, [DATABASE]) if st != "idle"]
            if busy:
                states.update(st for _, st in busy)
                killed += terminate(pid for pid, _ in busy)
            time.sleep(0.02)
        return f"terminated {killed} busy backends {dict(states)}"


# ---------------------------------------------------------------- the API client
class Api:
    """One keep-alive connection; ``call`` retries until the answer is definite."""

    def __init__(self, token: str, budget: float, rng: random.Random) -> None:
        self.token = token
        self.budget = budget
        self.rng = rng
        self.conn: http.client.HTTPConnection | None = None

    def _send(self, method: str, path: str, body, key: str | None):
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", WEB_PORT, timeout=20)
        headers = {"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"}
        if key:
            headers["Idempotency-Key"] = key
        try:
            self.conn.request(
                method, path, body=None if body is None else json.dumps(body), headers=headers
            )
            response = self.conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            self.conn.close()
            self.conn = None
            return None, {"transport_error": type(exc).__name__}, False
        try:
            parsed = json.loads(data) if data else {}
        except ValueError:
            parsed = {"raw": data[:200].decode(errors="replace")}
        return response.status, parsed, response.getheader("Idempotent-Replayed") == "true"

    def call(self, method: str, path: str, body=None, key: str | None = None) -> dict:
        started = time.monotonic()
        deadline = started + self.budget
        retried: list = []
        while True:
            status, parsed, replayed = self._send(method, path, body, key)
            error = parsed.get("error") if isinstance(parsed, dict) else None
            code = error.get("code") if isinstance(error, dict) else None
            again = status is None or status >= 500 or status == 429
            again = again or code == "idempotency_key_in_use"
            if not again:
                return {
                    "status": status,
                    "code": code,
                    "body": parsed,
                    "outcome": "ok" if status < 300 else "refused",
                    "replayed": replayed,
                    "retried": retried,
                    "seconds": round(time.monotonic() - started, 3),
                }
            retried.append(status or parsed.get("transport_error", "error"))
            if time.monotonic() > deadline:
                return {
                    "status": status,
                    "code": code,
                    "outcome": "unknown",
                    "retried": retried,
                    "seconds": round(time.monotonic() - started, 3),
                }
            time.sleep(min(0.1 * 2 ** min(len(retried), 6), 5.0) * (0.5 + self.rng.random()))


class ApiLoad(threading.Thread):
    """One stream of API traffic: schedules, and follow-up cancels / changes."""

    def __init__(self, index: int, seed: int, rate: float, setup: dict, shared: dict, stop):
        super().__init__(daemon=True, name=f"api-{index}")
        self.index = index
        self.rng = random.Random(f"{seed}:api:{index}")
        self.api = Api(
            setup["token"], setup["retry_budget"], random.Random(f"{seed}:retry:{index}")
        )
        self.interval = 1.0 / rate if rate > 0 else None
        self.setup = setup
        self.shared = shared
        self.stop = stop
        self.seed = seed
        self.ops: list[dict] = []
        self.followups: list = []
        self.n = 0
        self.error: str | None = None

    def key(self) -> str:
        self.n += 1
        return f"chaos-{self.seed}-{self.index}-{self.n}"

    def run(self) -> None:
        try:
            self._run()
        except Exception as exc:  # reported in the summary: a crashed stream is a finding
            self.error = f"{type(exc).__name__}: {exc}"
            raise

    def _run(self) -> None:
        if self.interval is None:
            return
        next_slot = time.monotonic() + self.rng.uniform(0, self.interval)
        while not self.stop.is_set():
            now = time.monotonic()
            if self.followups and self.followups[0][0] <= now:
                _, _, action, payment_id = heapq.heappop(self.followups)
                self.follow_up(action, payment_id)
                continue
            if now >= next_slot:
                self.schedule()
                next_slot = max(next_slot + self.interval, time.monotonic() - 5)
                continue
            wake = min(next_slot, self.followups[0][0] if self.followups else next_slot)
            self.stop.wait(max(0.0, min(wake - now, 0.5)))

    def schedule(self) -> None:
        rng, setup = self.rng, self.setup
        kind = rng.choices(
            ["plain", "at_time", "cancel", "change", "insufficient", "doomed"],
            [60, 5, 12, 12, 5, 6],
        )[0]
        source, target = rng.sample(setup["rich"], 2)
        if rng.random() < 0.5:
            target = rng.choice(setup["api_targets"])
        body: dict = {"from_account_id": source, "to_account_id": target}
        body["amount"] = rng.randint(1, 50)
        delay = rng.randint(1, 30)
        if kind == "at_time":
            when = datetime.now(UTC) + timedelta(seconds=rng.uniform(3, 20))
            body["scheduled_time"] = when.isoformat()
        elif kind in ("cancel", "change"):
            delay = rng.randint(5, 40)
        elif kind == "insufficient":
            body["from_account_id"] = setup["poor"]
            body["amount"] = 1000
        elif kind == "doomed":
            doomed = self.shared.get("doomed")
            if doomed is None:
                kind = "plain"
            else:
                body["to_account_id"] = doomed
                delay = rng.randint(25, 40)
        if "scheduled_time" not in body:
            body["delay_seconds"] = delay
        key = self.key()
        body["metadata"] = {"chaos_key": key, "kind": kind}
        result = self.api.call("POST", "/api/v1/payments/schedule", body, key)
        payment_id = (
            (result.get("body") or {}).get("payment_id") if result["status"] == 201 else None
        )
        self.ops.append(
            {"op": "schedule", "kind": kind, "key": key, "payment_id": payment_id, **_brief(result)}
        )
        if payment_id and kind in ("cancel", "change"):
            after = rng.uniform(1, delay + 10) if kind == "cancel" else rng.uniform(1, delay + 5)
            heapq.heappush(self.followups, (time.monotonic() + after, self.n, kind, payment_id))

    def follow_up(self, action: str, payment_id: str) -> None:
        key = self.key()
        if action == "cancel":
            result = self.api.call(
                "POST", f"/api/v1/payments/{payment_id}/cancel", {"reason": "chaos"}, key
            )
            body = result.get("body") or {}
            self.ops.append(
                {
                    "op": "cancel",
                    "key": key,
                    "payment_id": payment_id,
                    "answer_status": body.get("status"),
                    **_brief(result),
                }
            )
            return
        change: dict = {}
        if self.rng.random() < 0.7:
            change["delay_seconds"] = self.rng.randint(1, 30)
        if not change or self.rng.random() < 0.5:
            change["amount"] = self.rng.randint(1, 80)
        result = self.api.call("PATCH", f"/api/v1/payments/{payment_id}", change, key)
        body = result.get("body") or {}
        self.ops.append(
            {
                "op": "change",
                "key": key,
                "payment_id": payment_id,
                "change": change,
                "answer_scheduled_time": body.get("scheduled_time"),
                "answer_amount": body.get("amount"),
                **_brief(result),
            }
        )


def _brief(result: dict) -> dict:
    return {
        "status": result["status"],
        "code": result.get("code"),
        "outcome": result["outcome"],
        "replayed": result.get("replayed", False),
        "retries": len(result["retried"]),
        "seconds": result["seconds"],
        "retried_on": sorted({str(r) for r in result["retried"]}),
    }


# ---------------------------------------------------------------- the run
class Run:
    def __init__(self, args) -> None:
        self.args = args
        self.seconds = args.minutes * 60
        self.schedule = fault_schedule(args.seed, self.seconds, args.workers)
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
            self.service.gunicorn(WEB_PORT, workers=2, threads=4)
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
                result = self.kill_web_worker(event["pick"])
            else:
                raise ValueError(action)
        except Exception as exc:
            result = f"error: {type(exc).__name__}: {exc}"
        entry = {**event, "planned_at": event["at"], **self.stamp(), "result": result}
        entry.pop("at")
        self.faults.append(entry)
        params = {k: v for k, v in event.items() if k not in ("at", "action", "target")}
        log(f"{action} {target} {params or ''} -> {result}", self.t0)

    def kill_web_worker(self, pick: int) -> str:
        import psutil

        master = self.service.procs.get("web")
        if master is None or master.poll() is not None:
            return "web not running"
        children = sorted(
            p.pid
            for p in psutil.Process(master.pid).children(recursive=True)
            if "gunicorn" in " ".join(p.cmdline())
        )
        # setpriv execs gunicorn in place, so the master's children are its workers.
        if not children:
            return "no gunicorn workers"
        victim = children[pick % len(children)]
        os.kill(victim, signal.SIGKILL)
        return f"killed web worker {victim} (1 of {len(children)})"

    # --- load
    def direct_load(self, count: int) -> None:
        from payments.clock import db_now

        if count <= 0:
            return
        rng = self.load_rng
        now = db_now()
        classes = [(0.0, 0.0), (1.0, 10.0), (10.0, 45.0)]
        picks = Counter(rng.choices(range(3), [30, 50, 20], k=count))
        for cls, n in sorted(picks.items()):
            low, high = classes[cls]
            sources = rng.sample(self.setup["direct_sources"], min(n, 8))
            targets = rng.sample(self.setup["direct_targets"], min(n, 8))
            self.direct_ids += bulk_schedule(
                sources=sources,
                targets=targets,
                count=n,
                amount=rng.randint(1, 20),
                due_at=now + timedelta(seconds=rng.uniform(low, high)),
            )

    def doom_tick(self, elapsed: float, final: bool = False) -> None:
        """Every 30 s a fresh target account; frozen 8 s later (its payments must FAIL)."""
        from ledger.services import account_set_status
        from payments.clock import db_now

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
            if _port_in_use(port):
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
        self.setup = self.load_data()
        self.shared: dict = {"doomed": None}
        self.service = ChaosService(env, "chaos")
        for role in self.roles():
            self.start_role(role)
        wait_http(f"http://127.0.0.1:{WEB_PORT}/healthz", timeout=60)
        self.create_recurring()
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

    def load_data(self) -> dict:
        from django.contrib.auth import get_user_model

        from bench.api_latency import create_client
        from ledger import services as ledger

        client = create_client("chaos-api", accounts=8, balance=10**9)
        user = get_user_model().objects.get(username="chaos-api")
        poor = ledger.account_create(owner=user, name="chaos poor")
        ledger.deposit(account_id=poor.pk, amount=5)
        poor_recurring = ledger.account_create(owner=user, name="chaos poor recurring")
        ledger.deposit(account_id=poor_recurring.pk, amount=4)
        return {
            "token": client["token"],
            "rich": client["account_ids"],
            "poor": poor.pk,
            "poor_recurring": poor_recurring.pk,
            "api_targets": fund_accounts(10, 0, name="chaos api target"),
            "direct_sources": fund_accounts(40, 10**9, name="chaos source"),
            "direct_targets": fund_accounts(40, 0, name="chaos target"),
            "retry_budget": self.args.retry_budget,
        }

    def create_recurring(self) -> None:
        api = Api(self.setup["token"], 60, random.Random(0))
        for label, body in (
            (
                "every_minute",
                {
                    "from_account_id": self.setup["rich"][0],
                    "to_account_id": self.setup["api_targets"][0],
                    "amount": 3,
                    "cron": "* * * * *",
                    "timezone": "Europe/Paris",
                    "missed_run_policy": "run_all",
                    "max_catch_up": 5,
                    "description": "chaos recurring",
                },
            ),
            (
                "underfunded",
                {
                    "from_account_id": self.setup["poor_recurring"],
                    "to_account_id": self.setup["api_targets"][1],
                    "amount": 2,
                    "interval_seconds": 60,
                    "description": "chaos recurring, runs out of funds",
                },
            ),
        ):
            result = api.call("POST", "/api/v1/recurring-payments", body, f"chaos-rec-{label}")
            if result["status"] != 201:
                raise RuntimeError(f"recurring create failed: {result}")
            self.recurring.append({"label": label, "id": result["body"]["recurring_payment_id"]})

    def finish(self, pending: list[dict]) -> dict:
        from payments.clock import db_now
        from payments.models import Payment

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
            schedule["cancel"] = _brief(result)
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


# ---------------------------------------------------------------- verification
def check(name: str, ok: bool, **detail) -> dict:
    return {"name": name, "ok": bool(ok), **detail}


def _payment_story(pids: list[str], limit: int = 20) -> list[dict]:
    from payments.models import Payment, PaymentAttempt, PaymentEvent

    stories = []
    for payment in Payment.objects.filter(pk__in=pids[:limit]):
        stories.append(
            {
                "payment_id": str(payment.pk),
                "status": payment.status,
                "error_code": payment.error_code or None,
                "attempts": payment.attempts,
                "fence": payment.fence,
                "due_at": payment.due_at.isoformat(),
                "run_at": payment.run_at.isoformat(),
                "lease_expires_at": payment.lease_expires_at.isoformat()
                if payment.lease_expires_at
                else None,
                "events": [
                    f"{e.created_at:%H:%M:%S.%f} {e.type} {e.from_status}->{e.to_status} "
                    f"f={e.fence}"
                    for e in PaymentEvent.objects.filter(payment=payment).order_by("id")
                ],
                "tries": [
                    f"#{a.number} f={a.fence} {a.outcome} {a.error_code} {a.worker}"
                    for a in PaymentAttempt.objects.filter(payment=payment).order_by("id")
                ],
            }
        )
    return stories


def verify(run: Run) -> tuple[list[dict], dict]:
    from django.db import connection
    from django.db.models import Count, F, Q

    from ledger.models import Account, Hold
    from payments.models import (
        TERMINAL_STATUSES,
        OccurrenceStatus,
        Payment,
        PaymentAttempt,
        PaymentEvent,
        RecurringOccurrence,
    )

    checks: list[dict] = []
    # pk -> (status, error_code, due_at, executed_at, to_account_id, chaos_key, recurring_id)
    rows = Payment.objects.values_list(
        "pk",
        "status",
        "error_code",
        "due_at",
        "executed_at",
        "to_account_id",
        "metadata__chaos_key",
        "recurring_id",
    )
    payments = {str(row[0]): row[1:] for row in rows}

    # 1. every payment terminal
    open_ids = [pid for pid, row in payments.items() if row[0] not in TERMINAL_STATUSES]
    checks.append(
        check("all_terminal", not open_ids, open=len(open_ids), stuck=_payment_story(open_ids))
    )

    # 2. exactly once: ledger entries, attempts, events
    eo = exactly_once_check()
    succeeded = dict(
        PaymentAttempt.objects.filter(outcome="succeeded")
        .values("payment_id")
        .annotate(n=Count("id"))
        .values_list("payment_id", "n")
    )
    executed_events = dict(
        PaymentEvent.objects.filter(type="executed")
        .values("payment_id")
        .annotate(n=Count("id"))
        .values_list("payment_id", "n")
    )
    completed = {pid for pid, row in payments.items() if row[0] == "COMPLETED"}
    bad_attempts = [
        pid
        for pid in payments
        if succeeded.get(_uuid(pid), 0) != (1 if pid in completed else 0)
        or executed_events.get(_uuid(pid), 0) != (1 if pid in completed else 0)
    ]
    checks.append(
        check(
            "no_duplicate_execution",
            eo["duplicates"] == 0
            and eo["completed_without_entry"] == 0
            and eo["completed"] == eo["payment_entries"]
            and not bad_attempts,
            completed=eo["completed"],
            payment_entries=eo["payment_entries"],
            duplicate_entries=eo["duplicates"],
            attempt_or_event_mismatch=len(bad_attempts),
            examples=_payment_story(bad_attempts),
        )
    )

    # 3. never early
    checks.append(
        check("none_executed_early", eo["executed_early"] == 0, early=eo["executed_early"])
    )

    # 4. none lost: direct inserts and API answers
    missing_direct = [pid for pid in run.direct_ids if pid not in payments]
    by_key = Counter(row[5] for row in payments.values() if row[5])
    ops = [op for stream in run.streams for op in stream.ops]
    schedule_ops = [op for op in ops if op["op"] == "schedule"]
    lost, phantom, duplicated = [], [], []
    for op in schedule_ops:
        n = by_key.get(op["key"], 0)
        if n > 1:
            duplicated.append(op["key"])
        if op["outcome"] == "ok" and (op["payment_id"] not in payments or n != 1):
            lost.append(op)
        if op["outcome"] == "refused" and n:
            phantom.append(op)
    unknown = [op for op in schedule_ops if op["outcome"] == "unknown"]
    checks.append(
        check(
            "none_lost",
            not missing_direct and not lost and not phantom,
            direct_inserted=len(run.direct_ids),
            direct_missing=len(missing_direct),
            api_acknowledged=sum(op["outcome"] == "ok" for op in schedule_ops),
            api_acknowledged_missing=lost[:20],
            api_refused_but_created=phantom[:20],
            api_unknown_outcome=len(unknown),
            api_unknown_created=sum(by_key.get(op["key"], 0) for op in unknown),
        )
    )
    checks.append(
        check(
            "one_payment_per_idempotency_key",
            not duplicated and all(n == 1 for n in by_key.values()),
            keys_with_payments=len(by_key),
            duplicated=duplicated[:20],
        )
    )
    expected_refusals = [
        op for op in schedule_ops if op["kind"] == "insufficient" and op["outcome"] != "unknown"
    ]
    checks.append(
        check(
            "underfunded_requests_refused",
            all(op["code"] == "insufficient_funds" for op in expected_refusals),
            requests=len(expected_refusals),
            wrong=[op for op in expected_refusals if op["code"] != "insufficient_funds"][:10],
        )
    )

    # 5. cancel / change answers agree with the final state
    cancel_wrong, change_wrong = [], []
    for op in ops:
        row = payments.get(op["payment_id"])
        if op["op"] == "cancel" and row is not None:
            if op["status"] == 200 and (
                row[0] != "CANCELLED" or op["answer_status"] != "CANCELLED"
            ):
                cancel_wrong.append({**op, "final": row[0]})
            if op["code"] == "payment_not_cancellable" and row[0] == "CANCELLED":
                cancel_wrong.append({**op, "final": row[0]})
        if op["op"] == "change" and row is not None and op["status"] == 200:
            payment = Payment.objects.get(pk=op["payment_id"])
            answered = datetime.fromisoformat(op["answer_scheduled_time"])
            if abs((payment.due_at - answered).total_seconds()) > 0.001 or (
                payment.amount != op["answer_amount"]
            ):
                change_wrong.append({**op, "final_due": payment.due_at.isoformat()})
    cancels = [op for op in ops if op["op"] == "cancel"]
    changes = [op for op in ops if op["op"] == "change"]
    checks.append(
        check(
            "cancel_answers_hold",
            not cancel_wrong,
            requests=len(cancels),
            by_answer=dict(Counter(str(op["code"] or op["status"]) for op in cancels)),
            wrong=cancel_wrong[:20],
        )
    )
    checks.append(
        check(
            "change_answers_hold",
            not change_wrong,
            requests=len(changes),
            by_answer=dict(Counter(str(op["code"] or op["status"]) for op in changes)),
            wrong=change_wrong[:20],
        )
    )

    # 6. failures only for expected reasons; doomed payments did not complete
    doomed = {d["account_id"]: datetime.fromisoformat(d["frozen_at"]) for d in run.doomed}
    unexpected_failures = [
        pid
        for pid, row in payments.items()
        if row[0] == "FAILED" and row[1] not in EXPECTED_FAILURE_CODES | {DEAD_LETTER}
    ]
    wrong_reason = [
        pid
        for pid, row in payments.items()
        if row[0] == "FAILED" and row[1] == "account_not_active" and row[4] not in doomed
    ]
    doomed_completed = [
        pid
        for pid, row in payments.items()
        if row[4] in doomed and row[2] > doomed[row[4]] and row[0] == "COMPLETED"
    ]
    checks.append(
        check(
            "failures_expected",
            not unexpected_failures and not wrong_reason and not doomed_completed,
            failed_by_code=dict(Counter(row[1] for row in payments.values() if row[0] == "FAILED")),
            unexpected=_payment_story(unexpected_failures + wrong_reason),
            paid_into_frozen_account=_payment_story(doomed_completed),
            doomed_due_after_freeze=sum(
                1 for row in payments.values() if row[4] in doomed and row[2] > doomed[row[4]]
            ),
        )
    )
    dead = [pid for pid, row in payments.items() if row[0] == "FAILED" and row[1] == DEAD_LETTER]
    checks.append(
        check(
            "no_dead_letters",
            not dead or run.args.allow_dead_letters,
            dead_letters=len(dead),
            allowed=run.args.allow_dead_letters,
            examples=_payment_story(dead, 10),
        )
    )

    # 7. holds: none active, captured by its own entry / released
    active_holds = Hold.objects.filter(status="active").count()
    holds_wrong = Payment.objects.filter(
        (Q(status="COMPLETED") & (~Q(hold__status="captured") | ~Q(hold__entry=F("journal_entry"))))
        | (Q(status__in=["FAILED", "CANCELLED"]) & ~Q(hold__status="released"))
    ).count()
    held = Account.objects.exclude(held=0).count()
    checks.append(
        check(
            "holds_settled",
            active_holds == 0 and holds_wrong == 0 and held == 0,
            active_holds=active_holds,
            payments_with_wrong_hold=holds_wrong,
            accounts_with_held_funds=held,
        )
    )

    # 8. money: every balance = deposits + completed payments in - out; amounts match
    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH flows AS (
                SELECT from_account_id AS account_id, -amount AS delta
                  FROM payments_payment WHERE status = 'COMPLETED'
                UNION ALL
                SELECT to_account_id, amount FROM payments_payment WHERE status = 'COMPLETED'
                UNION ALL
                SELECT p.account_id, p.amount
                  FROM ledger_posting p JOIN ledger_journalentry e ON e.id = p.entry_id
                 WHERE e.kind = 'deposit'
            )
            SELECT a.id, a.balance, coalesce(sum(f.delta), 0)
              FROM ledger_account a LEFT JOIN flows f ON f.account_id = a.id
             GROUP BY a.id, a.balance
            HAVING a.balance <> coalesce(sum(f.delta), 0)
            """
        )
        balance_wrong = cursor.fetchall()
        cursor.execute(
            """
            SELECT count(*) FROM payments_payment pay
             WHERE pay.status = 'COMPLETED' AND NOT EXISTS (
                   SELECT 1 FROM ledger_posting d, ledger_posting c
                    WHERE d.entry_id = pay.journal_entry_id AND c.entry_id = pay.journal_entry_id
                      AND d.account_id = pay.from_account_id AND d.amount = -pay.amount
                      AND c.account_id = pay.to_account_id AND c.amount = pay.amount)
            """
        )
        entry_wrong = cursor.fetchone()[0]
    checks.append(
        check(
            "balances_match_payments",
            not balance_wrong and entry_wrong == 0,
            accounts_wrong=[list(r) for r in balance_wrong[:20]],
            entries_not_matching_payment=entry_wrong,
        )
    )

    # 9. the audit trail ends where the payment is
    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT p.id, p.status, e.type, e.to_status
              FROM payments_payment p
              LEFT JOIN LATERAL (
                   SELECT type, to_status FROM payments_paymentevent
                    WHERE payment_id = p.id ORDER BY id DESC LIMIT 1) e ON true
             WHERE e.to_status IS DISTINCT FROM p.status
            """
        )
        trail_wrong = cursor.fetchall()
    checks.append(
        check(
            "audit_trail_matches_status",
            not trail_wrong,
            mismatched=len(trail_wrong),
            examples=[[str(r[0]), r[1], r[2], r[3]] for r in trail_wrong[:20]],
        )
    )

    # 10. recurring: unique, contiguous occurrences, one payment each
    recurring_detail = []
    recurring_ok = True
    for schedule in run.recurring:
        occurrences = list(
            RecurringOccurrence.objects.filter(recurring_id=schedule["id"])
            .order_by("scheduled_for")
            .values_list("scheduled_for", "status", "payment_id")
        )
        instants = [o[0] for o in occurrences]
        gaps = [
            f"{a.isoformat()} -> {b.isoformat()}"
            for a, b in itertools.pairwise(instants)
            if (b - a) != timedelta(seconds=60)
        ]
        scheduled = [o for o in occurrences if o[1] == OccurrenceStatus.SCHEDULED]
        paid = Payment.objects.filter(recurring_id=schedule["id"]).count()
        ok = (
            not gaps
            and len(set(instants)) == len(instants)
            and all(o[2] for o in scheduled)
            and paid == len(scheduled)
            and schedule.get("cancel", {}).get("status") == 200
        )
        recurring_ok &= ok
        recurring_detail.append(
            {
                **schedule,
                "occurrences": dict(Counter(o[1] for o in occurrences)),
                "first": instants[0].isoformat() if instants else None,
                "last": instants[-1].isoformat() if instants else None,
                "gaps": gaps,
                "payments": paid,
                "payments_by_status": dict(
                    Counter(
                        Payment.objects.filter(recurring_id=schedule["id"]).values_list(
                            "status", flat=True
                        )
                    )
                ),
            }
        )
    checks.append(
        check(
            "recurring_occurrences",
            recurring_ok,
            occurrences=sum(sum(d["occurrences"].values()) for d in recurring_detail),
            schedules=recurring_detail,
        )
    )

    # 11. the operator's reconciliation, as a separate process
    reconcile = subprocess.run(
        [sys.executable, "manage.py", "reconcile_ledger", "--json"],
        cwd=ROOT,
        env=run.service.env,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        report = json.loads(reconcile.stdout)
    except ValueError:
        report = {"stdout": reconcile.stdout[-2000:], "stderr": reconcile.stderr[-2000:]}
    failing = [c for c in report.get("checks", []) if c.get("mismatch_count")]
    checks.append(
        check(
            "reconcile_ledger",
            reconcile.returncode == 0 and report.get("ok") is True,
            exit_code=reconcile.returncode,
            mismatch_count=report.get("mismatch_count"),
            failing_checks=failing,
        )
    )

    # the numbers
    lateness = [
        (row[3] - row[2]).total_seconds() for row in payments.values() if row[0] == "COMPLETED"
    ]
    origin = Counter(
        "recurring" if row[6] else "api" if row[5] else "direct" for row in payments.values()
    )
    stats = {
        "payments": len(payments),
        "by_origin": dict(origin),
        "by_status": dict(Counter(row[0] for row in payments.values())),
        "lateness_seconds": summarize(lateness, digits=3),
        "api": {
            "requests": dict(Counter(op["op"] for op in ops)),
            "schedule_by_kind": dict(Counter(op["kind"] for op in schedule_ops)),
            "outcomes": dict(Counter(f"{op['op']}:{op['outcome']}" for op in ops)),
            "retried_requests": sum(1 for op in ops if op["retries"]),
            "replayed_answers": sum(1 for op in ops if op["replayed"]),
            "retried_on": dict(Counter(r for op in ops for r in op["retried_on"])),
            "seconds_per_request": {
                name: summarize([op["seconds"] for op in ops if op["op"] == name], digits=3)
                for name in ("schedule", "cancel", "change")
            },
            "stream_errors": [s.error for s in run.streams if s.error],
        },
    }
    return checks, stats


def _uuid(pid: str):
    import uuid

    return uuid.UUID(pid)


# ---------------------------------------------------------------- entry point
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, required=True, help="replay a run with its seed")
    parser.add_argument(
        "--minutes", type=float, default=10.0, help="chaos duration (fractional ok)"
    )
    parser.add_argument("--rate", type=float, default=50.0, help="payments created per second")
    parser.add_argument("--api-share", type=float, default=0.2, help="share created via the API")
    parser.add_argument("--api-streams", type=int, default=4, help="concurrent API clients")
    parser.add_argument("--workers", type=int, default=2, help="Celery worker processes")
    parser.add_argument("--concurrency", type=int, default=2, help="pool size of each worker")
    parser.add_argument("--settle", type=float, default=180.0, help="extra drain wait (s)")
    parser.add_argument(
        "--retry-budget", type=float, default=150.0, help="how long an API client retries (s)"
    )
    parser.add_argument("--allow-dead-letters", action="store_true")
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
    out = args.out or ROOT / "bench" / "results" / f"chaos-{args.seed}-{started:%Y%m%dT%H%M%S}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(summary, indent=2, default=str))

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
        keys = [k for k in c if k not in ("name", "ok") and not isinstance(c[k], list | dict)]
        brief = ", ".join(f"{k}={c[k]}" for k in keys)
        print(f"  {'PASS' if c['ok'] else 'FAIL'} {c['name']}: {brief}")
    print(f"summary: {out}")
    print(f"replay:  {summary['replay']}")
    return 0 if summary["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
