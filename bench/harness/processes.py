"""The service as real processes: gunicorn, celery workers and beat, and their environment.

Each scenario gets its own PostgreSQL database and Redis database number (see
``bench.harness.db``); the service itself runs as real ``celery`` /
``gunicorn`` processes started by ``Service``, each in its own process group.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PG_SERVER = os.environ.get("BENCH_PG_SERVER", "postgres://postgres@127.0.0.1:5432")
REDIS_SERVER = os.environ.get("BENCH_REDIS_SERVER", "redis://127.0.0.1:6379")
# The service's WSGI application, what gunicorn serves unless a scenario says otherwise.
SERVICE_WSGI = "scheduler_project.wsgi"
LOG_DIR = ROOT / "var" / "bench-logs"
# What payment workers leave to the other workers (Procfile: worker -X …).
NON_PAYMENT_QUEUES = "timers,recurring,webhooks,default"

if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


CELERY = [sys.executable, "-m", "celery", "-A", "scheduler_project"]
# As every worker of the Procfile: no worker events, gossip or start-up sync
# (nothing here uses them; the heartbeat woke each idle worker every 2 s).
QUIET_WORKER = ["--without-heartbeat", "--without-gossip", "--without-mingle"]


def payment_workers(
    count: int, role: str, log_level: str, guard: Callable[[list[str]], list[str]] = list
) -> list[str]:
    """A command that runs ``count`` payment workers as the Procfile does (one
    solo-pool process each, every partition's queue) as one role (``one_role``);
    ``guard`` prefixes each worker's own command (chaos: die with the harness)."""
    one = [*CELERY, "worker", "--pool", "solo", *QUIET_WORKER]
    one += ["-X", NON_PAYMENT_QUEUES, "-l", log_level]
    return one_role([guard([*one, "-n", f"{role}.{n}@%h"]) for n in range(1, count + 1)])


def one_role(commands: list[list[str]]) -> list[str]:
    """A command that runs ``commands`` side by side and stands for them as one
    process: a SIGTERM to the group stops them (warm shutdown) and it waits until
    they have exited; if one exits by itself it stops the others and exits with
    that one's status, so whoever watches the role (chaos's supervisor) sees it
    down and starts it again, instead of a role that looks alive at half strength.
    Linux, bash >= 4.3 (``wait -n``). A SIGTERM in the milliseconds while the
    commands are still starting reaches only those already started; the rest
    are killed by ``Service.stop`` after its 30 s wait."""
    script = ["trap 'stopping=1' TERM INT;"]
    script += [shlex.join(command) + " &" for command in commands]
    script += [
        "wait -n; status=$?;",
        '[ -n "$stopping" ] || kill -TERM $(jobs -p) 2>/dev/null;',
        "wait; wait; exit $status",
    ]
    return ["bash", "-c", " ".join(script)]


def service_env(database: str, redis_db: int, **extra: str) -> dict[str, str]:
    """Environment for the service's processes (and this one) in a scenario."""
    return {
        **os.environ,
        "DATABASE_URL": f"{PG_SERVER}/{database}",
        "CELERY_BROKER_URL": f"{REDIS_SERVER}/{redis_db}",
        "SECRET_KEY": "bench-only-not-secret",
        "DJANGO_SETTINGS_MODULE": "scheduler_project.settings.base",
        "ALLOWED_HOSTS": "127.0.0.1,localhost",
        "API_THROTTLE_RATE": "100000/s",
        # WARNING unless BENCH_LOG_LEVEL says otherwise: the runs of record so far
        # were taken so. The Procfile's default is INFO with JSON, which writes a
        # line per payment transition (README: "Benchmark log level").
        "LOG_LEVEL": os.environ.get("BENCH_LOG_LEVEL", "WARNING"),
        "LOG_FORMAT": os.environ.get("BENCH_LOG_FORMAT", "text"),
        "PYTHONUNBUFFERED": "1",
        **extra,
    }


class Service:
    """Real service processes (celery worker/beat, gunicorn) for one scenario."""

    def __init__(self, env: dict[str, str], name: str) -> None:
        self.env = env
        self.name = name
        self.procs: dict[str, subprocess.Popen] = {}
        LOG_DIR.mkdir(parents=True, exist_ok=True)

    @staticmethod
    def guard(args: list[str]) -> list[str]:
        """What every process's command runs under (here nothing; chaos: see there)."""
        return args

    def start(self, role: str, args: list[str], nice: int = 0, **env: str) -> subprocess.Popen:
        """``args`` as ``role`` in a session of its own at CPU weight ``nice`` (``weigh``)."""
        args = self.guard(args)
        log = open(LOG_DIR / f"{self.name}-{role}.log", "a")  # noqa: SIM115
        grouped = autogroups()
        if nice and not grouped:
            args = ["nice", "-n", str(nice), *args]
        proc = subprocess.Popen(
            args,
            cwd=ROOT,
            env={**self.env, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # own process group: a kill takes the pool too
        )
        if nice and grouped:
            weigh(proc.pid, nice)
        self.procs[role] = proc
        return proc

    def celery(self, role: str, *args: str, nice: int = 0) -> subprocess.Popen:
        # celery's -l sets the level of its workers' root logger (it takes the
        # logging over), so the service's LOG_LEVEL goes here as the Procfile's
        # --loglevel does
        return self.start(role, [*CELERY, *args, "-l", self.env["LOG_LEVEL"]], nice=nice)

    def worker(
        self,
        concurrency: int = 2,
        role: str = "worker",
        queues: str | None = None,
        pool: str | None = None,
        nice: int = 0,
    ):
        """A payment worker (every queue but the other workers', as in the Procfile)
        unless ``queues`` is given.

        The payment worker is ``concurrency`` solo-pool processes, as the
        Procfile runs it (``honcho start -c worker=2``): started as one process
        group under a shell (``one_role``), so that the returned process's tree
        holds them all (its CPU is theirs), a kill of the role takes every one,
        and the role ends when one of them does."""
        if queues is None and pool is None:
            level = self.env["LOG_LEVEL"]
            return self.start(
                role, payment_workers(concurrency, role, level, guard=self.guard), nice=nice
            )
        args = ["worker", "-c", str(concurrency), *QUIET_WORKER]
        args += ["-n", f"{role}@%h"]
        args += ["-Q", queues] if queues else ["-X", NON_PAYMENT_QUEUES]
        if pool:
            args += ["--pool", pool]
        return self.celery(role, *args, nice=nice)

    def timers(self, role: str = "timers"):
        """The timer worker (sweeper, lease reaper), as in the Procfile."""
        return self.worker(1, role=role, queues="timers")

    def recurring(self, role: str = "recurring", nice: int = 0):
        """The materialiser and maintenance worker, as in the Procfile."""
        return self.worker(2, role=role, queues="recurring,default", nice=nice)

    def webhooks(self, role: str = "webhooks", concurrency: int = 16, nice: int = 0):
        """The webhook worker (threads), as in the Procfile."""
        return self.worker(concurrency, role=role, queues="webhooks", pool="threads", nice=nice)

    def background(self, nice: int = 0) -> None:
        """Every non-payment worker of the production topology: timers, recurring,
        webhooks (the last two at ``nice``: their work has slack, the timer's has none)."""
        self.timers()
        self.recurring(nice=nice)
        self.webhooks(nice=nice)

    def beat(self, role: str = "beat"):
        return self.celery(
            role,
            "beat",
            "-S",
            "django_celery_beat.schedulers:DatabaseScheduler",
            "--pidfile=",
            "-s",
            str(LOG_DIR / f"{self.name}-{role}-schedule"),
        )

    def gunicorn(self, port: int, nice: int = 0, app: str = SERVICE_WSGI):
        """gunicorn as shipped: gunicorn.conf.py (2 workers x 4 threads; WEB_CONCURRENCY,
        WEB_THREADS in the environment change it) at CPU weight ``nice`` (``weigh``),
        serving ``app`` (the service unless told otherwise)."""
        return self.start(
            "web",
            [sys.executable, "-m", "gunicorn", app, "-b", f"127.0.0.1:{port}"],
            nice=nice,
            WEB_NICE="0",  # the weight is the session's (weigh), not a nice within it
        )

    def kill(self, role: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.get(role)
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, sig)
            proc.wait(30)

    def stop(self) -> None:
        for proc in self.procs.values():
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGTERM)
        for role, proc in self.procs.items():
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                self.kill(role)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


AUTOGROUP_SWITCH = Path("/proc/sys/kernel/sched_autogroup_enabled")


def autogroups() -> bool:
    """Whether the kernel schedules each session as one group (``sched(7)``, autogroup)."""
    try:
        return AUTOGROUP_SWITCH.read_text().strip() == "1"
    except OSError:
        return False


def weigh(pid: int, nice: int) -> None:
    """Give ``pid``'s session (each service process has its own) the CPU weight of
    ``nice`` against the other sessions: with autogroups, a process's own nice
    acts only inside its session, so ``nice -n`` on one service process changes
    nothing against the others (it did not, in every benchmark up to session 16).
    The session's autogroup nice is what docker-compose's ``cpu_shares`` is to
    a container: nice 6 is a weight of 1024 / 1.25**6 ~ 272 against 1024, about
    the 256 it gives web."""
    Path(f"/proc/{pid}/autogroup").write_text(str(nice))


def cpu_weight(pid: int) -> int:
    """The nice that ranks ``pid`` against the other service processes: its
    session's autogroup nice with autogroups, its own nice without."""
    if autogroups():
        return int(Path(f"/proc/{pid}/autogroup").read_text().split()[-1])
    return os.getpriority(os.PRIO_PROCESS, pid)


def wait_http(url: str, timeout: float = 30) -> None:
    import urllib.request

    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310
                if response.status < 500:
                    return
        except OSError:
            if time.monotonic() > deadline:
                raise
        time.sleep(0.2)
