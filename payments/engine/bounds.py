"""Time bounds on the timer-side jobs' transactions (DESIGN §8).

The lease reaper and the recurring materialiser (and the executor, for its
row locks: ``PAYMENT_LOCK_TIMEOUT_SECONDS``) lock rows of one client at a
time — a hold's account, a schedule's source account — that any other session
may hold: a batch, a staff member's action, an operator's ``psql``
transaction left open, a stuck process. Without a bound, the job's run waits
for as long as that lock lasts, and every other client's work on that worker
waits with it (the reaper shares the timer worker with the sweeper, so no
payment was claimed meanwhile). ``bound_statements`` gives each statement of
the caller's transaction a limit; a statement past it fails with
``statement_timed_out`` true, and the job puts that item aside and goes on.
"""

from __future__ import annotations

from ledger.db import set_local, transaction_time_bound

QUERY_CANCELED_SQLSTATE = "57014"  # statement_timeout (or an operator's pg_cancel_backend)
LOCK_NOT_AVAILABLE_SQLSTATE = "55P03"  # lock_timeout


def milliseconds(seconds: float) -> str:
    """A PostgreSQL time limit in whole milliseconds, at least 1 (0 is none)."""
    return transaction_time_bound(seconds)["statement_timeout"]


def bound_statements(seconds: float) -> None:
    """No statement of the caller's transaction waits or runs longer than
    ``seconds`` (``statement_timeout``, local to the transaction; PostgreSQL
    only). The statement limit only: an idle-in-transaction limit would end the
    session, and the job's next items would find it closed."""
    set_local({"statement_timeout": milliseconds(seconds)})


def sqlstate(exc: BaseException) -> str | None:
    """The SQLSTATE of the driver's error behind a Django database error, if any."""
    return getattr(exc.__cause__, "sqlstate", None)


def statement_timed_out(exc: BaseException) -> bool:
    """Whether a database error is a statement cancelled by its time limit."""
    return sqlstate(exc) == QUERY_CANCELED_SQLSTATE


def lock_timed_out(exc: BaseException) -> bool:
    """Whether a database error is a row lock given up on past ``lock_timeout``."""
    return sqlstate(exc) == LOCK_NOT_AVAILABLE_SQLSTATE
