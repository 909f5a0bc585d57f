"""The faults: a seeded schedule of them, and the processes and connections they hit."""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections import Counter
from pathlib import Path

from bench.chaos.config import DATABASE, DRIVER_APP, REDIS_PORT, REDIS_URL
from bench.harness.processes import LOG_DIR, PG_SERVER, Service

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


# ---------------------------------------------------------------- the fault schedule
def fault_schedule(
    seed: int, seconds: float, workers: int, kinds: list[str] | None = None
) -> list[dict]:
    """Every fault and restart of the run, as offsets from its start: a function of the seed.

    The first faults go through every kind once (in a seeded order), so even a
    short run sees each; then kinds are drawn by weight. A component is never
    killed while it is down; its restart is an event of its own. ``kinds``
    (default: all of ``FAULT_WEIGHTS``) narrows the draw, e.g. to replay only
    broker restarts; the same seed and kinds give the same schedule.
    """
    rng = random.Random(seed)
    kinds = list(kinds or FAULT_WEIGHTS)
    unknown = set(kinds) - set(FAULT_WEIGHTS)
    if unknown:
        raise ValueError(f"unknown fault kinds: {sorted(unknown)}")
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
        if not candidates:  # every allowed target is down: wait for one to come back
            t += rng.uniform(2.0, 12.0)
            continue
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
def port_in_use(port: int) -> bool:
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

    # every process, and each payment worker inside its role's shell (payment_workers)
    guard = staticmethod(_guarded)

    def start(self, role: str, args: list[str], nice: int = 0, **env: str) -> subprocess.Popen:
        proc = super().start(role, args, nice, **env)
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


def kill_web_worker(service: ChaosService, pick: int) -> str:
    """SIGKILL one gunicorn worker (the ``pick``-th, modulo how many there are)."""
    import psutil

    master = service.procs.get("web")
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
