"""The lease reaper: requeue with back-off, dead letters (payments.engine.reaper)."""

from datetime import timedelta

import pytest
from django.test import override_settings
from django.utils import timezone

from ledger.models import Account
from payments.engine import reaper
from payments.models import Payment
from tests.payments.helpers import make_due, sweep

pytestmark = pytest.mark.django_db


def schedule(client, n=1, **overrides):
    return [client.schedule(**overrides).json()["payment_id"] for _ in range(n)]


@override_settings(PAYMENT_MAX_ATTEMPTS=2)
def test_dead_letter_after_max_attempts(alice, monkeypatch):
    (pid,) = schedule(alice, amount=500)
    for _ in range(2):
        make_due(pid)
        sweep(monkeypatch)
        Payment.objects.filter(pk=pid).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        reaper.reap_leases()
    payment = Payment.objects.get(pk=pid)
    assert (payment.status, payment.error_code, payment.attempts) == (
        "FAILED",
        "max_attempts_exceeded",
        2,
    )
    assert payment.hold.status == "released"
    assert Account.objects.get(pk=alice.account.pk).held == 0
    types = list(payment.events.order_by("pk").values_list("type", flat=True))
    assert types == ["scheduled", "queued", "lease_expired", "queued", "dead_lettered"]


def test_reaper_backs_off_repeated_failures(alice, monkeypatch):
    (pid,) = schedule(alice)
    make_due(pid, seconds_ago=100)
    sweep(monkeypatch)
    Payment.objects.filter(pk=pid).update(
        attempts=3, lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    reaper.reap_leases()
    payment = Payment.objects.get(pk=pid)
    assert payment.run_at > timezone.now() + timedelta(seconds=3)  # 2^(3-1) s
    assert payment.due_at < timezone.now()
