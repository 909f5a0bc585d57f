"""A scenario's own database and Redis db, and Django set up in this process.

Each scenario gets its own PostgreSQL database (recreated and migrated) and
its own Redis database number, so scenarios never see each other's rows or
messages. Django is configured in-process (``prepare``) to load data and read
results; the service runs as the processes of ``bench.harness.processes``.
"""

from __future__ import annotations

import contextlib
import os
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


_AUTOVACUUM_SOURCE_SQL = """
SELECT setting, coalesce(sourcefile, '') LIKE '%postgresql.auto.conf'
  FROM pg_settings WHERE name = 'autovacuum'
"""


def autovacuum_switch(wanted: str, before: str, in_auto_conf: bool) -> tuple[list[str], list[str]]:
    """The statements that turn autovacuum as ``wanted`` for a run, and those that
    put the server back: nothing either way unless ``wanted`` is ``"on"`` and
    the server's setting (``before``) is not. A value that ``ALTER SYSTEM`` had
    set before (``in_auto_conf``) is set again; otherwise the run's is reset, so
    the configuration files decide again."""
    if wanted not in ("on", "server"):
        raise ValueError(f"autovacuum: 'on' or 'server', not {wanted!r}")
    if wanted == "server" or before == "on":
        return [], []
    reload = "SELECT pg_reload_conf()"
    if in_auto_conf:
        restore = f"ALTER SYSTEM SET autovacuum = {before}"
    else:
        restore = "ALTER SYSTEM RESET autovacuum"
    return ["ALTER SYSTEM SET autovacuum = on", reload], [restore, reload]


@contextlib.contextmanager
def server_autovacuum(wanted: str):
    """PostgreSQL's autovacuum for the length of a run: ``"on"`` or ``"server"``.

    A production server runs autovacuum (the postgres image docker-compose
    starts does), but the CI server this box shares turns it off
    (``conf.d/90-ci.conf``), and with it off the payments table's dead row
    versions pile up inside a capacity step (README, session 24). ``"on"``
    turns it on for the run (``ALTER SYSTEM`` and a reload) and puts the
    server back as it was at the end (``autovacuum_switch``); ``"server"``
    leaves it as configured.
    """
    import psycopg

    with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
        before, in_auto_conf = conn.execute(_AUTOVACUUM_SOURCE_SQL).fetchone()
        enter, leave = autovacuum_switch(wanted, before, in_auto_conf)
        for statement in enter:
            conn.execute(statement)
    try:
        yield
    finally:
        if leave:
            with psycopg.connect(f"{PG_SERVER}/postgres", autocommit=True) as conn:
                for statement in leave:
                    conn.execute(statement)
