"""A scenario's own database and Redis db, and Django set up in this process.

Each scenario gets its own PostgreSQL database (recreated and migrated) and
its own Redis database number, so scenarios never see each other's rows or
messages. Django is configured in-process (``prepare``) to load data and read
results; the service runs as the processes of ``bench.harness.processes``.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
import sys

from bench.harness.processes import PG_SERVER, ROOT, service_env


def recreate_database(name: str) -> str:
    """Drop and create database ``name``; return its URL."""
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{PG_SERVER}/{name}"


def prepare(database: str, redis_db: int, **extra: str) -> dict[str, str]:
    """Recreate + migrate ``database``, flush the Redis db, set up Django here.

    Must be called once per process before any Django import; returns the env
    to start service processes with.
    """
    env = service_env(database, redis_db, **extra)
    recreate_database(database)
    subprocess.run(
        [sys.executable, "manage.py", "migrate", "-v", "0"], cwd=ROOT, env=env, check=True
    )
    os.environ.update(env)
    import django

    django.setup()
    import redis

    redis.Redis.from_url(env["CELERY_BROKER_URL"]).flushdb()
    return env


_SETTING_SQL = """
SELECT current_setting(name), coalesce(sourcefile, '') LIKE '%%postgresql.auto.conf'
  FROM pg_settings WHERE name = %s
"""


def setting_switch(
    name: str, wanted: str | None, before: str, in_auto_conf: bool
) -> tuple[list[str], list[str]]:
    """The statements that set PostgreSQL's ``name`` to ``wanted`` for a run, and
    those that put the server back: nothing either way when ``wanted`` is
    ``None`` (leave the server as configured) or is already the server's value
    (``before``, as ``current_setting`` shows it). A value that ``ALTER SYSTEM``
    had set before (``in_auto_conf``) is set again; otherwise the run's is
    reset, so the configuration files decide again."""
    if wanted is None or wanted == before:
        return [], []
    reload = RELOAD
    if in_auto_conf:
        restore = f"ALTER SYSTEM SET {name} = '{before}'"
    else:
        restore = f"ALTER SYSTEM RESET {name}"
    return [f"ALTER SYSTEM SET {name} = '{wanted}'", reload], [restore, reload]


def autovacuum_switch(wanted: str, before: str, in_auto_conf: bool) -> tuple[list[str], list[str]]:
    """``setting_switch`` for autovacuum: ``"on"`` or ``"server"`` (as configured)."""
    if wanted not in ("on", "server"):
        raise ValueError(f"autovacuum: 'on' or 'server', not {wanted!r}")
    return setting_switch("autovacuum", None if wanted == "server" else "on", before, in_auto_conf)


def max_wal_size_switch(
    wanted: str, before: str, in_auto_conf: bool
) -> tuple[list[str], list[str]]:
    """``setting_switch`` for max_wal_size: a size such as ``"8GB"``, or ``"server"``."""
    if wanted != "server" and not re.fullmatch(r"\d+(MB|GB)", wanted):
        raise ValueError(f"max_wal_size: a size such as 8GB, or 'server', not {wanted!r}")
    return setting_switch(
        "max_wal_size", None if wanted == "server" else wanted, before, in_auto_conf
    )


RELOAD = "SELECT pg_reload_conf()"
# not SQL: ``server_settings`` restarts the server here (``restart_server``)
RESTART = "-- restart the server"


def commit_timestamps_switch(
    wanted: str, before: str, in_auto_conf: bool
) -> tuple[list[str], list[str]]:
    """``setting_switch`` for track_commit_timestamp, ``"on"`` or ``"server"``: a
    setting read only at server start, so the server restarts to take it and
    again to put it back (``RESTART`` where the others reload)."""
    if wanted not in ("on", "server"):
        raise ValueError(f"commit timestamps: 'on' or 'server', not {wanted!r}")
    enter, leave = setting_switch(
        "track_commit_timestamp", None if wanted == "server" else "on", before, in_auto_conf
    )
    return (
        [RESTART if s == RELOAD else s for s in enter],
        [RESTART if s == RELOAD else s for s in leave],
    )


SWITCHES = {
    "autovacuum": autovacuum_switch,
    "max_wal_size": max_wal_size_switch,
    "track_commit_timestamp": commit_timestamps_switch,
}


def local_cluster() -> list[str]:
    """``pg_ctlcluster``'s arguments for this host's Debian cluster (the one
    scripts/test starts), or a RuntimeError saying why the harness cannot
    restart the server it runs against."""
    import shutil
    from pathlib import Path

    versions = sorted(
        (p.name for p in Path("/etc/postgresql").glob("*") if p.name.isdigit()), key=int
    )
    if "127.0.0.1" not in PG_SERVER and "localhost" not in PG_SERVER:
        raise RuntimeError(f"the server at {PG_SERVER} is not this host's")
    if not shutil.which("pg_ctlcluster") or not versions:
        raise RuntimeError("no Debian PostgreSQL cluster (pg_ctlcluster) on this host")
    return ["pg_ctlcluster", "--skip-systemctl-redirect", versions[-1], "main"]


def restart_server(timeout: float = 60.0) -> None:
    """Restart this host's PostgreSQL (``local_cluster``) and wait until it answers."""
    import time

    import psycopg

    subprocess.run([*local_cluster(), "restart"], check=True, capture_output=True)
    deadline = time.monotonic() + timeout
    while True:
        try:
            psycopg.connect(f"{PG_SERVER}/postgres", connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _execute(statements: list[str]) -> None:
    """Run ``statements`` on the server, each ``RESTART`` restarting it."""
    import psycopg

    runs: list[list[str]] = [[]]  # the statements between restarts
    for statement in statements:
        if statement == RESTART:
            runs.append([])
        else:
            runs[-1].append(statement)
    for index, run in enumerate(runs):
        if index:
            restart_server()
        if run:
            with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
                for statement in run:
                    conn.execute(statement)


@contextlib.contextmanager
def server_settings(**wanted: str):
    """PostgreSQL's settings for the length of a run, each ``"server"`` (as
    configured) or its value for the run (``SWITCHES``), put back at the end.

    A production server runs autovacuum (the postgres image docker-compose
    starts does), but the CI server this box shares turns it off
    (``conf.d/90-ci.conf``), and with it off the payments table's dead row
    versions pile up inside a capacity step (docs/performance-history.md,
    session 24). The server's default ``max_wal_size`` (1GB) makes a checkpoint
    every ~20 s at 2,000 payments/s ("checkpoints are occurring too
    frequently", PostgreSQL's log), and after each one the first change to
    every page writes the whole page to the WAL again
    (docs/performance-history.md, session 27); docker-compose's server runs
    with the run's 8GB.
    """
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        switches = [
            SWITCHES[name](value, *conn.execute(_SETTING_SQL, [name]).fetchone())
            for name, value in wanted.items()
        ]
    if any(RESTART in enter for enter, _ in switches):
        local_cluster()  # says why not before anything is changed
    leave_all: list[str] = []
    try:
        for enter, leave in switches:
            # known before it is applied: a later setting that fails puts
            # this one back too
            leave_all = leave + leave_all
            _execute(enter)
        yield
    finally:
        # one restart for the lot, after the statements (a reload before it is moot)
        if RESTART in leave_all:
            leave_all = [s for s in leave_all if s not in (RESTART, RELOAD)] + [RESTART]
        _execute(leave_all)
