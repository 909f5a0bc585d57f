"""The executor's statements are never server-side prepared statements.

Tried in session 20 (psycopg's ``prepare_threshold`` 5, 1eadfea, reverted):
once prepared, PostgreSQL ran the collapse's lock of due payments
(``payments.locks.lock_due_queued``) on a generic plan through the
(status, due_at) index, 37 ms against 0.4 ms with the values planned in, and
the 600/s capacity step went from p99 2.0 s to 7-33 s
(``bench/results/2026-11-27-s20-cap600-*``); forcing custom plans made
PostgreSQL's CPU per payment about twice as high in ``bench/executor_cost.py``.
Django leaves ``prepare_threshold`` unset (off): this holds it there, so
turning it on is a measured decision, not a side effect of a settings change.
"""

import pytest
from django.db import connection, transaction
from django.utils import timezone

from ledger.db import CACHED_DATA_PLAN, set_local
from payments.locks import lock_due_queued

pytestmark = [pytest.mark.postgres, pytest.mark.django_db]


def test_connections_prepare_nothing():
    connection.ensure_connection()
    assert connection.connection.prepare_threshold is None


def test_the_collapse_runs_unprepared_however_often_it_runs():
    with transaction.atomic():
        set_local(CACHED_DATA_PLAN)
        for _ in range(20):
            lock_due_queued([1, 2], now=timezone.now(), limit=600, exclude=[])
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_prepared_statements")
        assert cursor.fetchone()[0] == 0
