"""Management commands and the periodic-task schedule of the engine."""

import json
from datetime import timedelta

import pytest
from django.utils import timezone

from payments.clock import db_now
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
    assert json.loads(out.getvalue()) == {
        "requeued": 2,
        "dead_lettered": 0,
        "errors": 0,
        "timed_out": 0,
        "budget_exhausted": False,
    }
    assert set(Payment.objects.values_list("status", flat=True)) == {PaymentStatus.PENDING}


def test_sweep_due_says_when_the_next_slot_is_still_filling(alice, monkeypatch, settings):
    from io import StringIO

    from django.core.management import call_command

    settings.PAYMENT_LOOKAHEAD_SECONDS = 1.0
    settings.PAYMENT_CHUNK_SPREAD_MS = 1000
    capture_publish(monkeypatch)
    (pid,) = schedule(alice, 1)
    # past the lookahead's horizon, inside the next slot (0.5 s of margin)
    due = db_now() + timedelta(seconds=1.5)
    Payment.objects.filter(pk=pid).update(due_at=due, run_at=due)
    out = StringIO()
    call_command("sweep_due", stdout=out)
    assert out.getvalue().startswith("Claimed 0 payments")
    assert "(the next slot is still filling)" in out.getvalue()
    out = StringIO()
    call_command("sweep_due", "--json", stdout=out)
    assert '"work_ahead": true' in out.getvalue()


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


@pytest.mark.django_db
def test_install_periodic_tasks_survives_a_duplicate_interval_made_in_the_admin():
    """IntervalSchedule has no unique (every, period): a second "every 5 seconds" made
    in the admin raised MultipleObjectsReturned half-way through, the tasks before
    it reset and the rest not (a reviewer's finding)."""
    import io

    from django.core.management import call_command
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    from payments.periodic import PERIODIC_TASKS

    first = IntervalSchedule.objects.filter(every=5, period="seconds").order_by("pk").first()
    IntervalSchedule.objects.create(every=5, period="seconds")
    PeriodicTask.objects.filter(name__startswith="payments:").update(queue="x")
    call_command("install_periodic_tasks", stdout=io.StringIO())
    for name, task, every, expires, queue in PERIODIC_TASKS:
        row = PeriodicTask.objects.get(name=name)
        assert (row.task, row.interval.every, row.interval.period) == (task, every, "seconds")
        assert (row.queue, row.expire_seconds) == (queue, expires)
    reaper = PeriodicTask.objects.get(name="payments: reap expired leases")
    assert first is None or reaper.interval == first  # the oldest of the two
