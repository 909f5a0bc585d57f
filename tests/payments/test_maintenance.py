"""Management commands and the periodic-task schedule of the engine."""

from datetime import timedelta

import pytest
from django.utils import timezone

from payments.models import Payment, PaymentStatus
from tests.payments.helpers import capture_publish, make_due

pytestmark = pytest.mark.django_db


def schedule(client, n=1, **overrides):
    return [client.schedule(**overrides).json()["payment_id"] for _ in range(n)]


def test_management_commands(alice, monkeypatch):
    from io import StringIO

    from django.core.management import call_command

    capture_publish(monkeypatch)
    ids = schedule(alice, 2)
    make_due(*ids)
    out = StringIO()
    call_command("sweep_due", "--json", stdout=out)
    assert '"claimed": 2' in out.getvalue()
    Payment.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    out = StringIO()
    call_command("reap_leases", "--json", stdout=out)
    assert '"requeued": 2' in out.getvalue()
    assert set(Payment.objects.values_list("status", flat=True)) == {PaymentStatus.PENDING}


def test_periodic_tasks_installed_by_migration():
    from django_celery_beat.models import PeriodicTask

    tasks = dict(PeriodicTask.objects.values_list("task", "interval__every"))
    assert tasks["payments.sweep"] == 1 and tasks["payments.reap_leases"] == 5
    queues = dict(PeriodicTask.objects.values_list("task", "queue"))
    assert {task for task, queue in queues.items() if queue == "timers"} == {
        "payments.sweep",
        "payments.reap_leases",
    }
    assert queues["payments.materialize_recurring"] == "recurring"
    assert queues["payments.retry_webhooks"] == "webhooks"
