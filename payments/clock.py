"""The one clock: due-ness is decided by the database, never a worker's clock."""

from datetime import UTC, datetime, timedelta

from django.conf import settings
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


EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def spread() -> timedelta:
    """``PAYMENT_CHUNK_SPREAD_MS`` as a length: a slot of the grid, or with no
    grid how far apart a chunk's due times may lie."""
    return timedelta(milliseconds=settings.PAYMENT_CHUNK_SPREAD_MS)


def spread_grid(lookahead: float | None = None) -> timedelta | None:
    """The grid the sweeper claims and cuts chunks on: slots of
    ``PAYMENT_CHUNK_SPREAD_MS`` counted from the Unix epoch (as PostgreSQL's
    ``date_bin(…, 'epoch')``). None when there is no spread, or when the
    lookahead is shorter than a slot: then the claim cannot wait for a slot
    to end without running its payments late. ``lookahead``: the claim's,
    by default ``PAYMENT_LOOKAHEAD_SECONDS``."""
    if lookahead is None:
        lookahead = settings.PAYMENT_LOOKAHEAD_SECONDS
    length = spread()
    if length <= timedelta(0) or lookahead < length.total_seconds():
        return None
    return length


def slot_start(moment: datetime, grid: timedelta) -> datetime:
    """The start of the slot of ``grid`` that ``moment`` falls in (``date_bin``'s
    answer with the Unix epoch as origin)."""
    return EPOCH + (moment - EPOCH) // grid * grid


def same_slot(first: datetime, later: datetime, grid: timedelta | None) -> bool:
    """Whether ``later`` may share a chunk with ``first`` (due no earlier): the
    same slot of ``grid`` (``spread_grid()``) or, with no grid, due within the
    spread of it."""
    if grid is None:
        return later - first <= spread()
    return slot_start(first, grid) == slot_start(later, grid)


# The API's one way to write an instant: UTC, always six fractional digits, "Z".
# Also REST_FRAMEWORK["DATETIME_FORMAT"] (settings), so every timestamp a client
# sees — response fields, error details, event data, webhook bodies — has the
# same precision and shape (Python's isoformat() drops ".000000" and writes
# "+00:00").
ISO_TIMESTAMP_FORMAT = "%Y-%m-%dT%H:%M:%S.%fZ"


def iso_timestamp(value: datetime) -> str:
    return value.astimezone(UTC).strftime(ISO_TIMESTAMP_FORMAT)
