"""Where work goes: payment partitions and the queues that carry them (DESIGN §2, §8).

The one place settings (queue declarations), the sweeper and the tasks ask.
Imported by settings, so it imports nothing from the app (``django.conf.settings``
is lazy: it is read only when a function runs).

One queue per payment partition, and workers can consume any subset of them
(``celery -A scheduler_project worker -Q payments.p00,payments.p01``). A chunk
holding several partitions goes on the queue of one of them, each about as
often as it has payments in such chunks (``chunk_partition``). Each
other kind of background work has a queue of its own (timers, recurring,
webhooks, default), consumed by a worker of its own in production.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Protocol

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
    return _spread(account_id, partitions)


def _spread(value: object, buckets: int) -> int:
    """A stable bucket of ``value``'s text, the same in every process."""
    return zlib.crc32(str(value).encode()) % buckets


class _Claim(Protocol):
    payment_id: str
    partition: int


def chunk_partition(claims: Sequence[_Claim]) -> int:
    """The partition whose queue carries a chunk: the partition of one of its
    payments, picked by a hash of the first one's id — so each partition's
    queue gets about its share of the chunks it is in, whatever its number.

    Under load a worker takes its queues in turn, one message each, so a
    queue that receives more messages than the others falls behind. Sent to
    its lowest partition's queue, every chunk holding partition 0 went on
    ``payments.p00`` — one message per claim slot there against one every few
    slots on the others: at 2,250/s partitions 0-3 ran 7-15 s late while
    12-15 were on time, later the lower their number (bench, session 18).
    """
    return claims[_spread(claims[0].payment_id, len(claims))].partition
