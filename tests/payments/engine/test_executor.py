"""The executor: fence check, money moved once, failures isolated (payments.engine.executor)."""

from datetime import timedelta

import pytest
from django.utils import timezone

from ledger import services as ledger
from ledger.models import Account, JournalEntry
from ledger.reconciliation import reconcile
from payments import locks
from payments.engine import executor, reaper
from payments.models import Payment, PaymentAttempt
from tests.payments.engine.timer import _PortableConnection, queued_payment
from tests.payments.helpers import make_due, sweep

pytestmark = pytest.mark.django_db


def schedule(client, n=1, **overrides):
    return [client.schedule(**overrides).json()["payment_id"] for _ in range(n)]


def balances(client):
    return [Account.objects.get(pk=a.pk).balance for a in (client.account, client.other_account)]


def test_executor_moves_money_once_and_records_history(alice, monkeypatch):
    ids = schedule(alice, 3, amount=100)
    make_due(*ids)
    _, published = sweep(monkeypatch)
    outcome = executor.execute_chunk(published.items())
    assert sorted(outcome.completed) == sorted(ids)
    assert balances(alice) == [9_700, 300]
    assert Account.objects.get(pk=alice.account.pk).held == 0
    for pid in ids:
        payment = Payment.objects.get(pk=pid)
        assert payment.status == "COMPLETED" and payment.executed_at >= payment.due_at
        assert payment.journal_entry.reference == f"payment:{pid}"
        assert payment.hold.status == "captured"
        attempt = PaymentAttempt.objects.get(payment=payment)
        assert (attempt.number, attempt.fence, attempt.outcome) == (1, 1, "succeeded")
        types = list(payment.events.order_by("pk").values_list("type", flat=True))
        assert types == ["scheduled", "queued", "executed"]
    # the same chunk delivered again: stale, nothing moves
    again = executor.execute_chunk(published.items())
    assert again.completed == [] and sorted(again.stale) == sorted(ids)
    assert balances(alice) == [9_700, 300]
    assert reconcile().ok


def test_a_payment_due_at_the_clocks_very_instant_runs(alice, monkeypatch):
    """Due means due by the database clock, the boundary included: on the ORM
    path (SQLite's), whose clock can be stopped to the microsecond."""
    now = timezone.now().replace(microsecond=0)
    monkeypatch.setattr(locks, "connection", _PortableConnection())
    monkeypatch.setattr(locks, "db_now", lambda: now)
    payment = queued_payment(
        alice.account, alice.other_account, due_at=now, lease_expires_at=now + timedelta(minutes=5)
    )
    outcome = executor.execute_chunk([(str(payment.pk), 1)])
    assert outcome.completed == [str(payment.pk)] and outcome.not_due == []
    assert Payment.objects.get(pk=payment.pk).executed_at == now


def test_old_fence_after_reap_is_fenced_out(alice, monkeypatch):
    (pid,) = schedule(alice)
    make_due(pid)
    _, first = sweep(monkeypatch)
    Payment.objects.filter(pk=pid).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert reaper.reap_leases().requeued == 1
    payment = Payment.objects.get(pk=pid)
    assert (payment.status, payment.fence) == ("PENDING", 2)
    make_due(pid)
    _, second = sweep(monkeypatch)
    assert second.items() == [(pid, 3)]
    assert executor.execute_chunk(first.items()).stale == [pid]  # old message
    assert executor.execute_chunk(second.items()).completed == [pid]
    assert executor.execute_chunk(second.items()).stale == [pid]  # duplicate
    assert JournalEntry.objects.filter(reference=f"payment:{pid}").count() == 1


def test_business_failure_fails_one_payment_and_releases_its_hold(alice, bob, monkeypatch):
    good = schedule(alice, 2, amount=10)
    (bad,) = schedule(alice, 1, amount=20, to_account_id=bob.account.pk)
    ledger.account_set_status(account_id=bob.account.pk, status="frozen")
    make_due(*good, bad)
    _, published = sweep(monkeypatch)
    outcome = executor.execute_chunk(published.items())
    assert sorted(outcome.completed) == sorted(good) and outcome.failed == [bad]
    payment = Payment.objects.get(pk=bad)
    assert (payment.status, payment.error_code) == ("FAILED", "account_not_active")
    assert payment.hold.status == "released" and payment.journal_entry is None
    assert Account.objects.get(pk=alice.account.pk).held == 0
    assert balances(alice) == [9_980, 20]
    assert reconcile().ok


def test_cancelled_while_queued_is_skipped(alice, monkeypatch):
    (pid,) = schedule(alice)
    make_due(pid)
    _, published = sweep(monkeypatch)
    assert alice.api.delete(f"/api/v1/payments/{pid}/cancel").status_code == 200
    assert executor.execute_chunk(published.items()).stale == [pid]
    assert balances(alice) == [10_000, 0]
    assert Payment.objects.get(pk=pid).status == "CANCELLED"
