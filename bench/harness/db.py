"""A scenario's own database and Redis db, and Django set up in this process.

Each scenario gets its own PostgreSQL database (recreated and migrated) and
its own Redis database number, so scenarios never see each other's rows or
messages. Django is configured in-process (``prepare``) to load data and read
results; the service runs as the processes of ``bench.harness.processes``.
"""

from __future__ import annotations

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
