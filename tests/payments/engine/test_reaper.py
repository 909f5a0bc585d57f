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


@pytest.mark.parametrize("path", ["task", "command"])
def test_a_dead_letter_is_counted_as_a_failed_payment(alice, monkeypatch, settings, path):
    """payments_failed_total counted only the executor's failures (the failure-rate
    alert read 0 % while payments dead-lettered), and ``manage.py reap_leases``
    counted nothing at all (a reviewer's finding)."""
    import io

    from django.core.management import call_command
    from prometheus_client import REGISTRY

    from payments import tasks

    def sample(name, **labels):
        return REGISTRY.get_sample_value(name, labels) or 0.0

    settings.PAYMENT_MAX_ATTEMPTS = 1
    pid = alice.schedule(amount=10).json()["payment_id"]
    make_due(pid)
    sweep(monkeypatch)
    Payment.objects.filter(pk=pid).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    failed = ("payments_failed_total", {"error_code": "max_attempts_exceeded"})
    reaped = ("payments_reaped_leases_total", {"outcome": "dead_lettered"})
    before = [sample(name, **labels) for name, labels in (failed, reaped)]
    if path == "task":
        tasks.reap_leases()
    else:
        call_command("reap_leases", stdout=io.StringIO())
    assert Payment.objects.get(pk=pid).error_code == "max_attempts_exceeded"
    after = [sample(name, **labels) for name, labels in (failed, reaped)]
    assert after == [before[0] + 1, before[1] + 1]
