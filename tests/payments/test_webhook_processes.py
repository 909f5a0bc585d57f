"""The webhook worker as deployed (threads pool) on the Redis broker: one client's
burst of deliveries against another client's one (DESIGN §8).

The queue is first in, first out: a dispatch of 1,000 deliveries for one client
put 1,000 messages ahead of every other client's next webhook, and each of them
took a thread only to be put off over the client's share (``client_busy``).
A reviewer found it by reading (session 44); ``webhooks.dispatch`` now sends a
client's share of a dispatch at the default priority and the rest behind.
"""

from __future__ import annotations

import threading

import pytest
import redis
from django.conf import settings

from payments import tasks
from payments.models import DeliveryStatus, WebhookDelivery
from payments.routing import WEBHOOK_QUEUE
from tests.payments.test_webhook_faults import events_of
from tests.payments.webhook_receivers import Receiver
from tests.processes import Processes, flush_broker, wait_until

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.slow]

BURST = 1_000


def waiting_in_the_broker(broker: redis.Redis) -> int:
    """Messages of the webhook queue not yet taken, at every priority."""
    keys = [key for key in broker.keys(f"{WEBHOOK_QUEUE}*") if broker.type(key) == b"list"]
    return sum(broker.llen(key) for key in keys)


def event_ids(client, count: int, url: str) -> list[str]:
    return [str(event.pk) for event in events_of(client, count, url=url)]


def test_one_clients_burst_waits_behind_another_clients_webhook(tmp_path, alice, bob):
    flush_broker()
    broker = redis.Redis.from_url(settings.CELERY_BROKER_URL)
    busy, quiet = Receiver(), Receiver()
    busy.hold = threading.Event()  # the burst's requests in flight stay there
    burst = event_ids(alice, BURST, busy.url)
    other = event_ids(bob, 1, quiet.url)
    # Both dispatched before any worker runs: the queue holds the burst's messages,
    # then the other client's one, as a payment batch's events followed by another's.
    assert tasks.dispatch_webhooks.run(burst) == BURST
    assert tasks.dispatch_webhooks.run(other) == 1
    assert waiting_in_the_broker(broker) == BURST + 1
    share = settings.WEBHOOK_MAX_IN_FLIGHT_PER_CLIENT
    processes = Processes(tmp_path)
    try:
        processes.worker(2 * share, queues=WEBHOOK_QUEUE, pool="threads", name="webhooks")
        wait_until(lambda: quiet.requests, 60, 0.002, "the other client's webhook")
        waiting = waiting_in_the_broker(broker)
        busy.hold.set()
        # The burst still waited in the broker when the other client's webhook
        # went out (first in, first out: all of it had been taken, and put off).
        assert waiting > BURST // 2, waiting
        assert len(busy.requests) <= share
        wait_until(
            lambda: WebhookDelivery.objects.filter(
                endpoint__client=bob.user, status=DeliveryStatus.SUCCEEDED
            ).exists(),
            30,
            0.05,
            "the other client's delivery recorded",
        )
    except BaseException:
        print(processes.tail())
        raise
    finally:
        busy.hold.set()
        processes.stop()
        busy.close()
        quiet.close()
        flush_broker()
    # what was put off over the share is in its client's line, not lost
    assert not WebhookDelivery.objects.filter(status=DeliveryStatus.FAILED).exists()
