"""Shared fixtures of the sweeper and reaper tests (tests/payments/test_sweeper.py,
test_reaper.py): both code paths of ``payments.scheduling`` and a frozen database clock.

``payments.scheduling`` has two ways to claim, judge the executors and reap: one
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
from payments import scheduling
from payments.models import Payment, PaymentStatus
from payments.services import partition_for


class _PortableConnection:
    """``payments.scheduling``'s connection as the SQLite branch sees it; every
    query still goes to the test database through the real connection."""

    vendor = "sqlite"

    def __getattr__(self, name):
        return getattr(connection, name)


@pytest.fixture(params=["postgresql", "portable"])
def timer_path(request, monkeypatch):
    if request.param == "portable":
        monkeypatch.setattr(scheduling, "connection", _PortableConnection())
    elif connection.vendor != "postgresql":
        pytest.skip("the PostgreSQL statements need PostgreSQL")
    return request.param


@pytest.fixture
def frozen_clock(monkeypatch, timer_path):
    """The database clock as ``payments.scheduling`` reads it, stopped at one
    instant (a whole second); ``None`` on the PostgreSQL path, whose
    statements read the clock themselves."""
    if timer_path != "portable":
        return None
    now = timezone.now().replace(microsecond=0)
    monkeypatch.setattr(scheduling, "db_now", lambda: now)
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
    monkeypatch.setattr(scheduling, "connection", _PortableConnection())
    now = timezone.now().replace(microsecond=0)
    monkeypatch.setattr(scheduling, "db_now", lambda: now)
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
