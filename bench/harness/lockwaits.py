"""Lock waits sampled from ``pg_stat_activity`` while a scenario's window runs.

Four times a second (``interval``) one query lists the active client backends
of the scenario's database (this sampler's own left out): how many there
are, and which of them wait on a heavyweight lock (``wait_event_type =
'Lock'``: a row held by another transaction, ``transactionid`` or ``tuple``),
by statement; and, for every active backend, its wait event (none: running
or queued for a CPU; an LWLock such as ``WALWrite``; IO…). Summed over the
window, the lock-wait share (waiting samples over active samples) says how
much of the database work in flight was queued behind another transaction,
and the statements say whose: the
executor locking its chunk's payment rows, the ledger locking account rows,
a schedule request's hold… — what sessions 34 and 35 measured with a script
beside the run (``bench/results/2026-11-29-s35-pair-busy/sampler.py``).

A sample is a glimpse, not a trace: a wait shorter than the interval is seen
in proportion to its length, so the counts are a time-weighted estimate.
The query costs the bench process ~1 ms of CPU a sample (counted in the
capacity report's load-client column) and its backend a little more (in the
PostgreSQL column: ~480 queries in a 120 s step).
"""

from __future__ import annotations

import threading
import time
from collections import Counter

SAMPLE_SQL = """
SELECT wait_event_type, wait_event, query
  FROM pg_stat_activity
 WHERE datname = current_database()
   AND backend_type = 'client backend'
   AND state = 'active'
   AND pid <> pg_backend_pid()
"""
STATEMENT_CHARS = 60  # of the statement, whitespace collapsed: enough to tell them apart
TOP_STATEMENTS = 3
TOP_WAIT_EVENTS = 6
RUNNING = "running"  # an active backend with no wait event: on a CPU, or queued for one


def statement_key(query: str) -> str:
    """The first ``STATEMENT_CHARS`` characters of ``query``, whitespace collapsed."""
    return " ".join(query.split())[:STATEMENT_CHARS]


class LockWaitSampler(threading.Thread):
    """``start()``, then ``stop()`` returns the window's summary (``summary``);
    or ``with LockWaitSampler() as sampler:`` — stopped however the block ends.

    Uses a Django database connection of its own (one per thread), closed
    when it ends; a failed sample ends the sampling and is reported, never
    raised into the scenario."""

    def __init__(self, interval: float = 0.25) -> None:
        super().__init__(daemon=True, name="lock-wait-sampler")
        self.interval = interval
        self._stop_event = threading.Event()
        self.samples = 0
        self.active = 0
        self.waiting: Counter[str] = Counter()
        self.events: Counter[str] = Counter()
        self.error: str | None = None

    def run(self) -> None:
        from django.db import connection

        try:
            with connection.cursor() as cursor:
                next_at = time.monotonic()
                while not self._stop_event.is_set():
                    cursor.execute(SAMPLE_SQL)
                    self.record(cursor.fetchall())
                    next_at += self.interval
                    self._stop_event.wait(max(0.0, next_at - time.monotonic()))
        except Exception as exc:  # a measuring aid: report it, never fail the run
            self.error = f"{type(exc).__name__}: {exc}"[:200]
        finally:
            connection.close()

    def record(self, rows: list[tuple[str | None, str | None, str]]) -> None:
        """One sample: ``(wait_event_type, wait_event, statement)`` per active backend."""
        self.samples += 1
        self.active += len(rows)
        self.events.update(f"{kind}:{event}" if kind else RUNNING for kind, event, _ in rows)
        self.waiting.update(statement_key(query) for kind, _, query in rows if kind == "Lock")

    def __enter__(self) -> LockWaitSampler:
        self.start()
        return self

    def __exit__(self, *exc_info) -> None:
        self.stop()

    def stop(self) -> dict:
        self._stop_event.set()
        self.join()
        return self.summary()

    def summary(self) -> dict:
        """Samples taken; active backends and lock waiters per sample (means);
        the lock-wait share (waiting samples over active samples); the
        statements seen waiting most, with their share of the waits; and what
        the active backends were doing, by wait event (``running``: none —
        on a CPU or queued for one; ``LWLock:WALWrite``, ``IO:…``…), each
        with its share of the active samples."""
        waits = sum(self.waiting.values())
        out = {
            "samples": self.samples,
            "active_mean": round(self.active / self.samples, 2) if self.samples else None,
            "lock_waits_mean": round(waits / self.samples, 3) if self.samples else None,
            "lock_wait_share": round(waits / self.active, 3) if self.active else None,
            "top_waiters": [
                [statement, round(count / waits, 3)]
                for statement, count in self.waiting.most_common(TOP_STATEMENTS)
            ],
            "wait_events": [
                [event, round(count / self.active, 3)]
                for event, count in self.events.most_common(TOP_WAIT_EVENTS)
            ],
        }
        if self.error:
            out["error"] = self.error
        return out
