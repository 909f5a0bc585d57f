"""Celery tasks: thin wrappers that take ids and call services.

Retry and split policy lives here (DESIGN §4.1): a chunk that hits a
transient database error is retried with exponential backoff and jitter; after
``PAYMENT_CHUNK_RETRIES`` it is split in halves, so one poison payment cannot
hold back the rest. A single payment that keeps failing is left QUEUED: its
lease expires and the reaper re-claims it, counting attempts, until it is
dead-lettered.
"""

from __future__ import annotations

import logging
import random
import time

from celery import shared_task
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError

from . import execution, metrics, scheduling

logger = logging.getLogger(__name__)

TRANSIENT = (OperationalError, InterfaceError, DatabaseError)


def backoff_seconds(retries: int) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(30, 0.2 * 2^n)]."""
    return random.uniform(0, min(30.0, 0.2 * 2**retries))  # noqa: S311 - jitter, not crypto


@shared_task(
    name="payments.execute_chunk",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=None,
    ignore_result=True,
)
def execute_chunk(self, items: list[list]) -> dict:
    try:
        result = execution.execute_chunk([(pid, fence) for pid, fence in items])
    except TRANSIENT as exc:
        metrics.chunk_retries.labels(error_class=type(exc).__name__).inc()
        retries = self.request.retries
        if retries < settings.PAYMENT_CHUNK_RETRIES:
            logger.warning(
                "chunk of %s failed (%s); retry %s", len(items), type(exc).__name__, retries + 1
            )
            raise self.retry(exc=exc, countdown=backoff_seconds(retries)) from exc
        if len(items) > 1:
            metrics.chunk_splits.inc()
            half = len(items) // 2
            queue = scheduling.queue_name(
                scheduling.partitions_of([items[0][0]]).get(items[0][0], 0)
            )
            for part in (items[:half], items[half:]):
                execute_chunk.apply_async(args=[part], queue=queue)
            logger.warning("chunk of %s kept failing; split in two", len(items))
            return {"split": len(items)}
        logger.error(
            "payment %s keeps failing (%s); leaving it to the lease reaper",
            items[0][0],
            type(exc).__name__,
        )
        return {"gave_up": items[0][0]}
    if result.not_due:
        # Arrived early (publisher or worker clock ahead of the database):
        # re-publish with the remaining time; same fence, still QUEUED.
        scheduling.republish_not_due(result.not_due)
    return {
        "completed": len(result.completed),
        "failed": len(result.failed),
        "stale": len(result.stale),
    }


@shared_task(name="payments.sweep", ignore_result=True, acks_late=False)
def sweep() -> dict:
    """One beat tick of the sweeper (beat fires it every second).

    While the executors are catching up the sweeper claims only payments that
    are already due (no lookahead), so it sweeps again every
    ``PAYMENT_SWEEP_TICK_MS`` within ``PAYMENT_SWEEP_WINDOW_SECONDS``: a payment
    falling due during a burst is claimed a tick after, not up to a second
    after (measured: payments due just after a 1,000-payment burst ran up to
    1.8 s late, most of it waiting for the next beat tick).
    """
    deadline = time.monotonic() + settings.PAYMENT_SWEEP_WINDOW_SECONDS
    tick = settings.PAYMENT_SWEEP_TICK_MS / 1000
    claimed = messages = 0
    while True:
        result = scheduling.sweep_due()
        metrics.sweep_runs.inc()
        metrics.sweep_duration.observe(result.seconds)
        metrics.executor_lag.set(result.lag)
        if result.backpressure:
            metrics.sweep_held_back.inc()
        for size in result.batch_sizes:
            metrics.sweep_batch_size.observe(size)
        claimed, messages = claimed + result.claimed, messages + result.messages
        # nothing is claimed ahead (no lookahead, or catching up): keep ticking
        ticking = result.catching_up or settings.PAYMENT_LOOKAHEAD_SECONDS <= 0
        if not ticking or time.monotonic() + tick > deadline:
            return {"claimed": claimed, "messages": messages}
        time.sleep(tick)


@shared_task(name="payments.reap_leases", ignore_result=True, acks_late=False)
def reap_leases() -> dict:
    result = scheduling.reap_leases()
    metrics.reaped.labels(outcome="requeued").inc(result.requeued)
    metrics.reaped.labels(outcome="dead_lettered").inc(result.dead_lettered)
    return {"requeued": result.requeued, "dead_lettered": result.dead_lettered}


@shared_task(name="payments.purge_idempotency_keys", ignore_result=True)
def purge_idempotency_keys() -> int:
    from .idempotency import idempotency_purge_expired

    return idempotency_purge_expired()


@shared_task(name="payments.deliver_webhook", ignore_result=True, acks_late=True)
def deliver_webhook(delivery_id: str) -> str | None:
    from . import webhooks

    status = webhooks.deliver(delivery_id)
    if status == "pending":  # a failed attempt with retries left: come back at its time
        delay = webhooks.retry_delay(delivery_id)
        deliver_webhook.apply_async(args=[delivery_id], queue="webhooks", countdown=delay)
    # None (deferred by an open circuit, or not due): the beat task resends it
    # when due, so a dead endpoint's backlog holds no countdown messages.
    return status


@shared_task(name="payments.dispatch_webhooks", ignore_result=True, acks_late=True)
def dispatch_webhooks(event_ids: list[str]) -> int:
    """Expand one transaction's events into deliveries and send them (webhook worker)."""
    from . import webhooks

    delivery_ids = webhooks.dispatch(event_ids)
    for delivery_id in delivery_ids:
        deliver_webhook.apply_async(args=[delivery_id])
    return len(delivery_ids)


@shared_task(name="payments.retry_webhooks", ignore_result=True)
def retry_webhooks() -> int:
    """Beat safety net: (re)send pending deliveries whose time has come."""
    from . import webhooks

    events = webhooks.undispatched_event_ids()
    if events:
        dispatch_webhooks.apply_async(args=[events])
    ids = webhooks.due_delivery_ids()
    for delivery_id in ids:
        deliver_webhook.apply_async(args=[delivery_id], queue="webhooks")
    return len(ids)


@shared_task(name="payments.materialize_recurring", ignore_result=True)
def materialize_recurring() -> dict:
    from . import recurring

    result = recurring.materialize_due()
    metrics.materialize_duration.observe(result.seconds)
    if result.budget_exhausted:
        metrics.materialize_budget_exhausted.inc()
    if result.scheduled or result.failed or result.skipped or result.paused_on_error:
        logger.info(
            "materialised %s occurrences (%s failed, %s skipped, %s schedules parked) in %.2fs",
            result.scheduled,
            result.failed,
            result.skipped,
            result.paused_on_error,
            result.seconds,
        )
    return {
        "scheduled": result.scheduled,
        "failed": result.failed,
        "skipped": result.skipped,
        "paused_on_error": result.paused_on_error,
        "budget_exhausted": result.budget_exhausted,
    }
