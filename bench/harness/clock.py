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


def set_due_at(t0: datetime, rate: float | None = None) -> None:
    """Make every payment due at ``t0`` (or from ``t0`` on at ``rate`` per second)."""
    from django.db import connection

    with connection.cursor() as cursor:
        if rate is None:
            cursor.execute("UPDATE payments_payment SET due_at = %s, run_at = %s", [t0, t0])
        else:
            cursor.execute(
                """
                UPDATE payments_payment p
                   SET due_at = %(t0)s + make_interval(secs => (o.n - 1) / %(rate)s),
                       run_at = %(t0)s + make_interval(secs => (o.n - 1) / %(rate)s)
                  FROM (SELECT id, row_number() OVER (ORDER BY id) AS n
                          FROM payments_payment) o
                 WHERE p.id = o.id
                """,
                {"t0": t0, "rate": float(rate)},
            )
        cursor.execute("VACUUM ANALYZE payments_payment")


def lateness_rows():
    """(due_at, executed_at, pk) of every COMPLETED payment."""
    from bench.harness.app import Payment

    return list(
        Payment.objects.filter(status="COMPLETED").values_list("due_at", "executed_at", "pk")
    )
