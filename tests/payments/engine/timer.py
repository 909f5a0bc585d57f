"""Shared fixtures of the sweeper and reaper tests (tests/payments/test_sweeper.py,
test_reaper.py): both code paths of the timer and a frozen database clock.

The timer (``payments.transitions``' claim and requeue, ``payments.engine.sweeper``'s
executor state) has two ways to claim, judge the executors and reap: one
statement each on PostgreSQL, and plain ORM queries for SQLite (the embedded
default, ``scripts/dev``). The ``timer_path`` fixture runs a test on both: on
``portable`` the module sees a connection whose vendor is not PostgreSQL, so it
takes the ORM path (on the SQLite run of the suite that is the only path).
"""

import threading
from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.utils import timezone

from ledger import services as ledger
from payments import tasks, transitions
from payments.engine import reaper, sweeper
from payments.models import Payment, PaymentStatus
from payments.routing import partition_for

# The modules with a PostgreSQL statement and an ORM twin (``connection``), and
# those that read the database clock (``db_now``) on the ORM path.
DUAL_PATH = (transitions, sweeper)
CLOCK_READERS = (transitions, sweeper, reaper)


def sweep_due(**kwargs):
    """One sweep as the timer worker runs it (``tasks.publish_chunks`` publishes)."""
    return sweeper.sweep_due(publish=tasks.publish_chunks, **kwargs)


class _PortableConnection:
    """The timer modules' connection as the SQLite branch sees it; every
    query still goes to the test database through the real connection."""

    vendor = "sqlite"

    def __getattr__(self, name):
        return getattr(connection, name)


@pytest.fixture(params=["postgresql", "portable"])
def timer_path(request, monkeypatch):
    if request.param == "portable":
        for module in DUAL_PATH:
            monkeypatch.setattr(module, "connection", _PortableConnection())
    elif connection.vendor != "postgresql":
        pytest.skip("the PostgreSQL statements need PostgreSQL")
    return request.param


@pytest.fixture
def frozen_clock(monkeypatch, timer_path):
    """The database clock as the timer modules read it, stopped at one
    instant (a whole second); ``None`` on the PostgreSQL path, whose
    statements read the clock themselves."""
    if timer_path != "portable":
        return None
    now = timezone.now().replace(microsecond=0)
    for module in CLOCK_READERS:
        monkeypatch.setattr(module, "db_now", lambda: now)
    return now


def queued_payment(
    account,
    to_account,
    *,
    lease_expires_at,
    due_at=None,
    run_at=None,
    attempts=1,
    fence=1,
    amount=100,
    hold=True,
    status=PaymentStatus.QUEUED,
    **fields,
):
    """A payment as the sweeper leaves it (QUEUED, leased, its hold active)."""
    due_at = due_at or timezone.now() - timedelta(seconds=1)
    return Payment.objects.create(
        from_account=account,
        to_account=to_account,
        owner_id=account.owner_id,
        amount=amount,
        due_at=due_at,
        run_at=run_at or due_at,
        partition=partition_for(account.pk),
        status=status,
        fence=fence,
        attempts=attempts,
        lease_expires_at=lease_expires_at,
        hold=ledger.hold_place(account_id=account.pk, amount=amount) if hold else None,
        **fields,
    )


@pytest.fixture
def portable_clock(monkeypatch):
    """The ORM path with the clock stopped: boundaries to the microsecond."""
    for module in DUAL_PATH:
        monkeypatch.setattr(module, "connection", _PortableConnection())
    now = timezone.now().replace(microsecond=0)
    for module in CLOCK_READERS:
        monkeypatch.setattr(module, "db_now", lambda: now)
    return now


def in_another_transaction(work, *, release_after=5.0):
    """Run ``work`` in a transaction of another connection and keep it open until
    the caller is done (or ``release_after`` seconds: a blocked caller gets on)."""
    started, finished = threading.Event(), threading.Event()
    errors = []

    def run():
        try:
            with transaction.atomic():
                work()
                started.set()
                finished.wait(timeout=release_after)
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
            started.set()
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    assert started.wait(timeout=30)

    def done():
        finished.set()
        thread.join()
        assert errors == []

    return done
