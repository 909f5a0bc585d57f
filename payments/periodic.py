"""The beat schedule, stored in django-celery-beat's tables (visible and tunable in admin).

Installed by migration ``payments.0002_periodic_tasks`` and re-applied by
``manage.py install_periodic_tasks`` (idempotent: it resets interval and
queue, keeps the enabled flag staff may have changed).
"""

from __future__ import annotations

from django.db import transaction
from django_celery_beat.models import IntervalSchedule, PeriodicTask

from . import routing

TIMERS = routing.TIMER_QUEUE
RECURRING = routing.RECURRING_QUEUE
WEBHOOKS = routing.WEBHOOK_QUEUE

# name, task, every (seconds), expires (seconds), queue: a beat message that
# could not be consumed in time is dropped rather than piling up behind a busy
# worker. Each kind of work goes to the queue of its own worker (see
# CELERY_TASK_QUEUES): the sweeper never waits behind payment chunks, the
# materialiser or a webhook.
PERIODIC_TASKS = (
    ("payments: sweep due payments", "payments.sweep", 1, 5, TIMERS),
    ("payments: reap expired leases", "payments.reap_leases", 5, 10, TIMERS),
    (
        "payments: materialise recurring occurrences",
        "payments.materialize_recurring",
        5,
        10,
        RECURRING,
    ),
    ("payments: retry due webhooks", "payments.retry_webhooks", 10, 20, WEBHOOKS),
    ("ledger: reconcile", "ledger.reconcile", 3600, 600, "default"),
    (
        "payments: purge expired idempotency keys",
        "payments.purge_idempotency_keys",
        3600,
        600,
        "default",
    ),
    (
        # the webhook worker's (16 threads), not default's: the recurring worker
        # consumes default, and a purge of up to a minute must not hold it
        "payments: purge old webhook deliveries",
        "payments.purge_webhooks",
        3600,
        600,
        WEBHOOKS,
    ),
)


def install_periodic_tasks(interval_model=None, task_model=None) -> list[str]:
    if interval_model is None or task_model is None:
        interval_model, task_model = IntervalSchedule, PeriodicTask
    installed = []
    with transaction.atomic():  # all of the beat's schedule or none of it
        for name, task, every, expires, queue in PERIODIC_TASKS:
            _install(interval_model, task_model, name, task, every, expires, queue)
            installed.append(name)
    return installed


def _install(interval_model, task_model, name, task, every, expires, queue) -> None:
    # IntervalSchedule has no unique (every, period): staff may add a second
    # "every 5 seconds" in the admin, and get_or_create then raised
    # MultipleObjectsReturned half-way through (django-celery-beat copes the same way)
    same = interval_model.objects.filter(every=every, period="seconds").order_by("pk")
    interval = same.first() or interval_model.objects.create(every=every, period="seconds")
    task_model.objects.update_or_create(
        name=name,
        defaults={
            "task": task,
            "interval": interval,
            "queue": queue,
            "expire_seconds": expires,
        },
    )


def install_from_migration(apps, schema_editor) -> None:
    """RunPython entry point: use the historical models of the migration state."""
    install_periodic_tasks(
        apps.get_model("django_celery_beat", "IntervalSchedule"),
        apps.get_model("django_celery_beat", "PeriodicTask"),
    )
