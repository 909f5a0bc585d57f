"""``django_db_setup`` for ``scripts/mutation`` (tests/conftest.py uses it when
``MUTATION_SESSION`` is set).

mutmut tests each mutant in its own pytest session, forked from a process that
has already set Django up. Two things must not leak from one session into the
next, or a mutant is "killed" by the previous one:

- The database. A transactional test ends with a flush, which also deletes
  the rows the migrations insert (periodic tasks, the Support group); with
  ``--reuse-db`` the next session would start without them. So every session
  gets a fresh copy of a migrated template (``CREATE DATABASE … TEMPLATE``,
  about 0.1 s); the template is rebuilt when a migration changes.
- With two mutants tested at once, the database and the throttle cache. Each
  session takes a free slot (a lock file held until it exits): its database
  is ``test_<name>_<slot>`` and its cache keys are prefixed by the slot.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import time
from pathlib import Path

import pytest

_slot_file = None  # held open (and locked) for the whole session


def _take_slot() -> int:
    global _slot_file
    for slot in range(64):
        handle = open(f".mutation-slot-{slot}.lock", "w")  # noqa: SIM115 (held until exit)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.close()
            continue
        _slot_file = handle
        return slot
    raise RuntimeError("no free mutation slot")


def _migrations_digest() -> str:
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parent.parent
    for path in sorted(root.glob("*/migrations/*.py")):
        digest.update(path.name.encode() + path.read_bytes())
    return digest.hexdigest()[:10]


def _exists(cursor, name: str) -> bool:
    cursor.execute("SELECT 1 FROM pg_database WHERE datname = %s", [name])
    return cursor.fetchone() is not None


def _template(connection, base: str) -> str:
    """A migrated database to copy, named after the migrations it has."""
    template = f"test_{base}_template_{_migrations_digest()}"
    with connection._nodb_cursor() as cursor:
        if _exists(cursor, template):
            return template
    connection.settings_dict["TEST"]["NAME"] = template
    connection.creation.create_test_db(verbosity=0, autoclobber=True, serialize=False)
    connection.close()
    connection.settings_dict["NAME"] = base
    connection.settings_dict["TEST"]["NAME"] = None
    with connection._nodb_cursor() as cursor:
        cursor.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s AND datname <> %s",
            [f"test_{base}_template_%", template],
        )
        for (stale,) in cursor.fetchall():
            cursor.execute(f'DROP DATABASE IF EXISTS "{stale}"')
    return template


def _copy(connection, template: str, name: str) -> None:
    with connection._nodb_cursor() as cursor:
        cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        for attempt in range(50):
            try:
                cursor.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
                return
            except Exception as exc:  # the other slot is copying the template right now
                if "being accessed by other users" not in str(exc) or attempt == 49:
                    raise
                time.sleep(0.1)


@pytest.fixture(scope="session")
def django_db_setup(django_test_environment, django_db_blocker):
    from django.conf import settings
    from django.db import connections
    from django.test.signals import setting_changed

    slot = _take_slot()
    cache = settings.CACHES["default"]
    cache["KEY_PREFIX"] = f"{cache.get('KEY_PREFIX', '')}mutation{slot}"
    setting_changed.send(sender=None, setting="CACHES", value=settings.CACHES, enter=True)

    connection = connections["default"]
    assert connection.vendor == "postgresql", "scripts/mutation runs on PostgreSQL"
    connection.close()
    base = os.environ["DATABASE_URL"].rsplit("/", 1)[1]
    name = f"test_{base}_{slot}"
    with django_db_blocker.unblock():
        _copy(connection, _template(connection, base), name)
    connection.settings_dict["NAME"] = settings.DATABASES["default"]["NAME"] = name
    yield
    with django_db_blocker.unblock():
        connection.close()
        connection.settings_dict["NAME"] = settings.DATABASES["default"]["NAME"] = base
        with connection._nodb_cursor() as cursor:
            cursor.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
