"""Where work goes: payment partitions and the queues that carry them (DESIGN §2, §8).

The one place settings (queue declarations), the sweeper and the tasks ask.
Imported by settings, so it imports nothing from the app (``django.conf.settings``
is lazy: it is read only when a function runs).

One queue per payment partition: payments of one source account are always
on one queue, and workers can consume any subset of them
(``celery -A scheduler_project worker -Q payments.p00,payments.p01``). Each
other kind of background work has a queue of its own (timers, recurring,
webhooks, default), consumed by a worker of its own in production.
"""

from __future__ import annotations

import zlib

from django.conf import settings

TIMER_QUEUE = "timers"
RECURRING_QUEUE = "recurring"
WEBHOOK_QUEUE = "webhooks"
DEFAULT_QUEUE = "default"
PAYMENT_EXCHANGE = "payments"


def queue_name(partition: int) -> str:
    """The queue of a payment partition: ``payments.p07``."""
    return f"{PAYMENT_EXCHANGE}.p{partition:02d}"


def payment_queues(partitions: int) -> dict[str, dict[str, str]]:
    """Celery queue declarations of the payment partitions."""
    return {
        queue_name(n): {"exchange": PAYMENT_EXCHANGE, "routing_key": queue_name(n)}
        for n in range(partitions)
    }


def partition_for(account_id: int, partitions: int | None = None) -> int:
    """Stable partition of a source account: same account, same queue, every process."""
    if partitions is None:
        partitions = settings.PAYMENT_PARTITIONS
    return zlib.crc32(str(account_id).encode()) % partitions
