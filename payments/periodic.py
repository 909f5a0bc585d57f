"""The beat schedule, stored in django-celery-beat's tables (visible and tunable in admin).

Installed by migration ``payments.0002_periodic_tasks`` and re-applied by
``manage.py install_periodic_tasks`` (idempotent: it resets interval and
queue, keeps the enabled flag staff may have changed).
"""

from __future__ import annotations

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
)


def install_periodic_tasks(interval_model=None, task_model=None) -> list[str]:
    if interval_model is None or task_model is None:
        interval_model, task_model = IntervalSchedule, PeriodicTask
    installed = []
    for name, task, every, expires, queue in PERIODIC_TASKS:
        interval, _ = interval_model.objects.get_or_create(every=every, period="seconds")
        task_model.objects.update_or_create(
            name=name,
            defaults={
                "task": task,
                "interval": interval,
                "queue": queue,
                "expire_seconds": expires,
            },
        )
        installed.append(name)
    return installed


def install_from_migration(apps, schema_editor) -> None:
    """RunPython entry point: use the historical models of the migration state."""
    install_periodic_tasks(
        apps.get_model("django_celery_beat", "IntervalSchedule"),
        apps.get_model("django_celery_beat", "PeriodicTask"),
    )
