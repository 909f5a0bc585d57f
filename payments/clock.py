"""The one clock: due-ness is decided by the database, never a worker's clock."""

from datetime import UTC, datetime

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


# The API's one way to write an instant: UTC, always six fractional digits, "Z".
# Also REST_FRAMEWORK["DATETIME_FORMAT"] (settings), so every timestamp a client
# sees — response fields, error details, event data, webhook bodies — has the
# same precision and shape (Python's isoformat() drops ".000000" and writes
# "+00:00").
ISO_TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def iso_timestamp(value: datetime) -> str:
    return value.astimezone(UTC).strftime(ISO_TIMESTAMP_FORMAT)
