"""The database's work over a scenario's window, counted by PostgreSQL itself.

CPU seconds on these VMs move with the host (a busy or drifting host charges
the same statements more, README "Machine and method"); the server's own
counters do not. ``mark()`` reads them at a window's start and end, and
``report(before, after, executed)`` gives the window's work, per executed
payment:

- buffer accesses (``pg_stat_database.blks_hit + blks_read``) and the share
  that missed ``shared_buffers`` (``blks_read``: a copy from the OS's page
  cache, or a disk read) — the work the statements did, in 8 KB pages;
- WAL records, bytes and full-page images (``pg_stat_wal``): an FPI is a
  whole page written again on its first change after a checkpoint, so more
  distinct pages touched between checkpoints show up here;
- commits and rollbacks (``pg_stat_database``);
- the same accesses by table (heap and its indexes) and by index, the
  ``TOP`` busiest of each (``pg_statio_user_tables``/``_indexes``): which
  relation's pages the payments cost;
- and, at the window's end, the size of ``payments_payment`` (heap and
  indexes) against ``shared_buffers``.

The database counters are the scenario's database only; the WAL's are the
server's (every database: the bench runs nothing else). A backend reports
its counters at the end of a transaction at most once a second, and an idle
one within ~10 s (PostgreSQL 15's ``pgstat_report_stat``), so a capacity
window's edges are blurred by a second or so of the steady load on each side
— alike at both edges, the same at every step; the drain, after which the
load stops, reads its end once the idle backends have reported
(``settled_mark``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

DATABASE_SQL = """
SELECT xact_commit, xact_rollback, blks_hit, blks_read
  FROM pg_stat_database
 WHERE datname = current_database()
"""
WAL_SQL = "SELECT wal_records, wal_fpi, wal_bytes FROM pg_stat_wal"
SIZE_SQL = """
SELECT pg_relation_size('payments_payment'),
       pg_indexes_size('payments_payment'),
       pg_size_bytes(current_setting('shared_buffers'))
"""
TABLES_SQL = """
SELECT relname,
       heap_blks_hit + heap_blks_read
         + coalesce(toast_blks_hit, 0) + coalesce(toast_blks_read, 0),
       coalesce(idx_blks_hit, 0) + coalesce(idx_blks_read, 0)
         + coalesce(tidx_blks_hit, 0) + coalesce(tidx_blks_read, 0)
  FROM pg_statio_user_tables
"""
INDEXES_SQL = "SELECT indexrelname, idx_blks_hit + idx_blks_read FROM pg_statio_user_indexes"
MB = 1024 * 1024
TOP = 8


@dataclass(frozen=True)
class Counters:
    commits: int
    rollbacks: int
    hits: int
    reads: int
    wal_records: int
    wal_fpi: int
    wal_bytes: int
    tables: dict[str, tuple[int, int]] = field(default_factory=dict)  # (heap, indexes)
    indexes: dict[str, int] = field(default_factory=dict)


def mark() -> Counters:
    """The counters now (a Django connection of the calling thread)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(DATABASE_SQL)
        commits, rollbacks, hits, reads = cursor.fetchone()
        cursor.execute(WAL_SQL)
        records, fpi, wal_bytes = cursor.fetchone()
        cursor.execute(TABLES_SQL)
        tables = {name: (heap, indexes) for name, heap, indexes in cursor.fetchall()}
        cursor.execute(INDEXES_SQL)
        indexes = dict(cursor.fetchall())
    return Counters(commits, rollbacks, hits, reads, records, fpi, int(wal_bytes), tables, indexes)


# PostgreSQL 15 reports an idle backend's pending counts within 10 s
# (PGSTAT_IDLE_INTERVAL); a busy one at most once a second.
SETTLE_SECONDS = 11.0


def settled_mark() -> Counters:
    """``mark()`` once every backend that just went idle has reported: the end of
    a run after which the load stops (the drain), not of a window the load runs
    through (a capacity step, whose edges blur alike)."""
    time.sleep(SETTLE_SECONDS)
    return mark()


def table_sizes() -> dict:
    """payments_payment's heap and indexes against shared_buffers, in MB."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(SIZE_SQL)
        heap, indexes, buffers = cursor.fetchone()
    return {
        "payment_heap_mb": round(heap / MB, 1),
        "payment_indexes_mb": round(indexes / MB, 1),
        "shared_buffers_mb": round(buffers / MB, 1),
    }


def per_payment(value: int, executed: int, digits: int = 2) -> float | None:
    return round(value / executed, digits) if executed else None


def report(before: Counters, after: Counters, executed: int) -> dict:
    """The window's database work, in total and per executed payment."""
    hits, reads = after.hits - before.hits, after.reads - before.reads
    accesses = hits + reads
    fpi = after.wal_fpi - before.wal_fpi
    wal_bytes = after.wal_bytes - before.wal_bytes
    commits = after.commits - before.commits
    return {
        "executed": executed,
        "commits": commits,
        "rollbacks": after.rollbacks - before.rollbacks,
        "buffer_accesses": accesses,
        "buffer_reads": reads,  # of the accesses, those that missed shared_buffers
        "read_share": round(reads / accesses, 4) if accesses else None,
        "wal_records": after.wal_records - before.wal_records,
        "wal_fpi": fpi,
        "wal_mb": round(wal_bytes / MB, 1),
        "buffers_per_payment": per_payment(accesses, executed, 1),
        "reads_per_payment": per_payment(reads, executed),
        "wal_bytes_per_payment": per_payment(wal_bytes, executed, 0),
        "wal_fpi_per_payment": per_payment(fpi, executed, 3),
        "commits_per_payment": per_payment(commits, executed, 4),
        # [name, heap, indexes] a payment, the TOP tables by the two together
        "tables_per_payment": top(
            {
                name: [a - b for a, b in zip(counts, before.tables.get(name, (0, 0)), strict=True)]
                for name, counts in after.tables.items()
            },
            executed,
        ),
        # [name, accesses] a payment, the TOP indexes
        "indexes_per_payment": top(
            {name: [count - before.indexes.get(name, 0)] for name, count in after.indexes.items()},
            executed,
        ),
    }


def top(deltas: dict[str, list[int]], executed: int) -> list[list]:
    """The ``TOP`` relations by their summed accesses, each ``[name, *per payment]``;
    relations the window did not touch left out; empty without payments."""
    if not executed:
        return []
    touched = {name: values for name, values in deltas.items() if sum(values)}
    ranked = sorted(touched.items(), key=lambda item: (-sum(item[1]), item[0]))[:TOP]
    return [[name, *(per_payment(v, executed, 1) for v in values)] for name, values in ranked]
