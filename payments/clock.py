"""The one clock: due-ness is decided by the database, never a worker's clock."""

from datetime import datetime

from django.db import connection
from django.utils import timezone


def db_now() -> datetime:
    """The database's current time (``clock_timestamp()`` on PostgreSQL).

    ``clock_timestamp()`` rather than ``now()``: inside a long transaction
    ``now()`` is frozen at its start. SQLite, the single-host embedded default,
    shares the host clock, so the process time is the database time there.
    """
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute("SELECT clock_timestamp()")
            return cursor.fetchone()[0]
    return timezone.now()
