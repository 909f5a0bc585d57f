"""The database clock: due times are set and lateness is read in the database's time.

Lateness is ``executed_at - due_at``, both stamped by the database clock, so a
scenario never compares two hosts' (or processes') clocks.
"""

from __future__ import annotations

from datetime import datetime


def db_now() -> datetime:
    """The service's own clock (``payments.clock.db_now``: ``clock_timestamp()``)."""
    from bench.harness.app import db_now as service_db_now

    return service_db_now()


def clock_timestamp() -> datetime:
    """``SELECT clock_timestamp()`` on the default connection, without the service's code
    (for the peers, which do not run the service)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT clock_timestamp()")
        return cursor.fetchone()[0]


def set_due_at(
    t0: datetime, rate: float | None = None, *, only_due_at: datetime | None = None
) -> None:
    """Make every payment due at ``t0`` (or from ``t0`` on at ``rate`` per second);
    with ``only_due_at``, only the payments now due at that instant (a placeholder
    one batch was inserted with)."""
    from django.db import connection

    where = "WHERE due_at = %(only)s" if only_due_at is not None else ""  # a constant
    params = {"t0": t0, "rate": float(rate or 0), "only": only_due_at}
    with connection.cursor() as cursor:
        if rate is None:
            cursor.execute(
                f"UPDATE payments_payment SET due_at = %(t0)s, run_at = %(t0)s {where}",
                params,
            )
        else:
            cursor.execute(
                f"""
                UPDATE payments_payment p
                   SET due_at = %(t0)s + make_interval(secs => (o.n - 1) / %(rate)s),
                       run_at = %(t0)s + make_interval(secs => (o.n - 1) / %(rate)s)
                  FROM (SELECT id, row_number() OVER (ORDER BY id) AS n
                          FROM payments_payment {where}) o
                 WHERE p.id = o.id
                """,
                params,
            )
        cursor.execute("VACUUM ANALYZE payments_payment")


def lateness_rows():
    """(due_at, executed_at, pk) of every COMPLETED payment."""
    from bench.harness.app import Payment

    return list(
        Payment.objects.filter(status="COMPLETED").values_list("due_at", "executed_at", "pk")
    )


# The commit time of the transaction that wrote a row's current version: what a
# caller sees as "the money moved". Needs PostgreSQL's track_commit_timestamp
# (a server-start setting: bench/run.py --commit-timestamps turns it on for a
# run); NULL for rows written while it was off.
COMMITTED_AT_SQL = "pg_xact_commit_timestamp({table}.xmin)"


def commit_timestamps_on() -> bool:
    """True when the server records commit times (``track_commit_timestamp``)."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('track_commit_timestamp')")
        return cursor.fetchone()[0] == "on"


def committed_at(table: str):
    """An ORM expression for the commit time of ``table``'s rows (``COMMITTED_AT_SQL``);
    NULL when the server records none (the function raises then)."""
    from django.db.models import DateTimeField, Value
    from django.db.models.expressions import RawSQL

    if not commit_timestamps_on():
        return Value(None, output_field=DateTimeField())
    sql = COMMITTED_AT_SQL.format(table=table)  # a table name from this code, no input
    return RawSQL(sql, [], output_field=DateTimeField())  # noqa: S611
