"""Celery tasks: thin wrappers that take ids, call the engine, and publish.

This is the only module that publishes messages: the engine and the
services return what should be sent (claimed chunks, early arrivals, webhook
events recorded in a transaction) and the functions here send it, after
commit.

Retry and split policy lives here (DESIGN §4.1, ``_chunk_failed``): a chunk
that hits a transient database error is retried with exponential backoff and
jitter; after ``PAYMENT_CHUNK_RETRIES`` (at once for any other error) it is
split in halves, so one poison payment cannot hold back the rest; a batch
that collapsed others' payments is first retried with its own alone. A single
payment that keeps failing is left QUEUED: its lease expires and the reaper
re-claims it, counting attempts, until it is dead-lettered.
"""

from __future__ import annotations

import logging
import random
import time
from datetime import datetime

from celery import shared_task
from django.conf import settings
from django.dispatch import receiver

from . import idempotency, metrics, routing, selectors, webhooks
from .clock import db_now
from .engine import executor, materializer, reaper, sweeper

logger = logging.getLogger(__name__)

# Retried with backoff: the database's or the host's passing trouble, and a
# batch cut short by the soft time limit (a stuck database); any other error
# will not go away on a retry (executor.NOT_A_PAYMENTS_FAULT has them all).
TRANSIENT = executor.NOT_A_PAYMENTS_FAULT


def backoff_seconds(retries: int) -> float:
    """Exponential backoff with full jitter: uniform in [0, min(30, 0.2 * 2^n)]."""
    return random.uniform(0, min(30.0, 0.2 * 2**retries))  # noqa: S311 - jitter, not crypto


# --- publishers ------------------------------------------------------------------------


def publish_chunks(chunks: list[sweeper.Chunk], now: datetime) -> int:
    """One ``execute_chunk`` message per chunk, on the queue of one of its
    partitions (``routing.chunk_partition``), with a countdown
    to the chunk's due time (database clock ``now``); returns how many."""
    for partitions, eta, claims in chunks:
        options = {"queue": routing.queue_name(routing.chunk_partition(claims))}
        if eta > now:
            options["countdown"] = (eta - now).total_seconds()
        execute_chunk.apply_async(
            args=[[[c.payment_id, c.fence] for c in claims]],
            kwargs={"partitions": list(partitions)},
            **options,
        )
    return len(chunks)


def republish_not_due(items: list[tuple[str, int, datetime]]) -> None:
    """Send early arrivals back with a countdown to their due time (DB clock)."""
    now = db_now()
    partitions = selectors.partitions_of([pid for pid, _, _ in items])
    for pid, fence, due_at in items:
        partition = partitions.get(pid, 0)
        execute_chunk.apply_async(
            args=[[[pid, fence]]],
            kwargs={"partitions": [partition]},
            queue=routing.queue_name(partition),
            countdown=max((due_at - now).total_seconds(), 0.0),
        )


# A message handed back this many times goes out once more without its
# partitions: that delivery waits for the rows, as a retry does (bounded by
# PAYMENT_BATCH_TIMEOUT_SECONDS), so no holder (a stuck session, an admin's
# open transaction) can keep it circling.
BUSY_HOPS = 3


def republish_busy(items: list[tuple[str, int, int]], hops: int = 0) -> None:
    """Hand back what another transaction held (``ChunkResult.busy``): one
    message per partition, same fences, after ``PAYMENT_BUSY_RETRY_MS`` doubled
    for each earlier hand-back (``hops``); after ``BUSY_HOPS`` one that waits."""
    by_partition: dict[int, list[list]] = {}
    for pid, fence, partition in items:
        by_partition.setdefault(partition, []).append([pid, fence])
    for partition, part in by_partition.items():
        execute_chunk.apply_async(
            args=[part],
            kwargs={} if hops >= BUSY_HOPS else {"partitions": [partition], "hops": hops + 1},
            queue=routing.queue_name(partition),
            countdown=settings.PAYMENT_BUSY_RETRY_MS * 2**hops / 1000,
        )


def _hand_back(busy: list[tuple[str, int, int]], hops: int) -> None:
    try:
        republish_busy(busy, hops)
    except Exception:  # the broker: wait for the rows here, as a retry would
        logger.warning(
            "could not hand back %s payments another transaction held; running them here",
            len(busy),
            exc_info=True,
        )
        try:
            executor.execute_chunk([(pid, fence) for pid, fence, _ in busy])
        except Exception:
            logger.exception("%s handed-back payments left to the lease reaper", len(busy))


DISPATCH_BATCH = 500


@receiver(webhooks.events_recorded)
def publish_webhook_events(sender, event_ids: list[str], **kwargs) -> None:
    """Hand a transaction's webhook events to the webhook worker: one message per
    ``DISPATCH_BATCH`` events, never one per delivery (this runs after commit in
    the process that made the change — a payment worker for every chunk)."""
    for start in range(0, len(event_ids), DISPATCH_BATCH):
        batch = event_ids[start : start + DISPATCH_BATCH]
        try:
            dispatch_webhooks.apply_async(args=[batch])
        except Exception:  # broker down: the beat task dispatches them later
            logger.warning("could not enqueue %s webhook events", len(batch), exc_info=True)


# --- payment engine ----------------------------------------------------------------------


@shared_task(
    name="payments.execute_chunk",
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    max_retries=None,
    ignore_result=True,
)
def execute_chunk(
    self, items: list[list], partitions: list[int] | None = None, hops: int = 0
) -> dict:
    """Run a chunk and, with ``partitions`` (every message the sweeper sends),
    whatever else of those partitions is due and QUEUED (``engine.executor``);
    ``hops``: how many times its items were handed back (``republish_busy``)."""
    try:
        result = executor.execute_chunk(
            [(pid, fence) for pid, fence in items], partitions=partitions or ()
        )
    except Exception as exc:  # every failure is retried, split or left to the reaper
        return _chunk_failed(self, items, exc)
    if result.busy:
        _hand_back(result.busy, hops)
    if result.not_due:
        # Arrived early (publisher or worker clock ahead of the database):
        # re-publish with the remaining time; same fence, still QUEUED.
        republish_not_due(result.not_due)
    return {
        "completed": len(result.completed),
        "failed": len(result.failed),
        "stale": len(result.stale),
        "busy": len(result.busy),
    }


def _chunk_failed(task, items: list[list], exc: Exception) -> dict:
    """What a chunk does after its batch failed (DESIGN §4.1). Every retry and
    both halves of a split run only their own items, no collapse.

    - the batch collapsed others' payments (``exc.collapsed``, set by the
      executor): retry the chunk's own items — a payment the collapse took in
      may be what failed (the executor keeps them out of this process's later
      collapses); after a transient error with backoff, after any other at once;
    - a transient database error: retry with backoff, ``PAYMENT_CHUNK_RETRIES`` times;
    - then, or at once for any other error (a payment whose data breaks a
      statement, or the code): split in halves, so one payment cannot hold
      back the rest; a single payment that still fails is left QUEUED for the
      lease reaper, which re-claims it until it is dead-lettered.
    """
    transient = isinstance(exc, TRANSIENT)
    retries = task.request.retries
    if getattr(exc, "collapsed", 0) or (transient and retries < settings.PAYMENT_CHUNK_RETRIES):
        metrics.chunk_retries.labels(error_class=type(exc).__name__).inc()
        logger.warning(
            "chunk of %s failed (%s); retry %s", len(items), type(exc).__name__, retries + 1
        )
        countdown = backoff_seconds(retries) if transient else 0
        raise task.retry(exc=exc, countdown=countdown, kwargs={}) from exc
    if len(items) > 1:
        metrics.chunk_splits.inc()
        half = len(items) // 2
        # on the queue of the first item's partition
        partition = selectors.partitions_of([items[0][0]]).get(items[0][0], 0)
        for part in (items[:half], items[half:]):
            execute_chunk.apply_async(args=[part], queue=routing.queue_name(partition))
        logger.warning(
            "chunk of %s kept failing (%s); split in two", len(items), type(exc).__name__
        )
        return {"split": len(items)}
    logger.error(
        "payment %s keeps failing (%s); leaving it to the lease reaper",
        items[0][0],
        type(exc).__name__,
        exc_info=not transient,
    )
    return {"gave_up": items[0][0]}


_last_sweep_started: float | None = None


def sweep_once() -> sweeper.SweepResult:
    """One sweep (claim, commit, publish), with its metrics; the command runs it too."""
    global _last_sweep_started
    started = time.monotonic()
    if _last_sweep_started is not None:
        metrics.sweep_interval.observe(started - _last_sweep_started)
    _last_sweep_started = started
    result = sweeper.sweep_due(publish=publish_chunks)
    metrics.sweep_runs.inc()
    metrics.sweep_duration.observe(result.seconds)
    metrics.executor_lag.set(result.lag)
    if result.backpressure:
        metrics.sweep_held_back.inc()
    for size in result.batch_sizes:
        metrics.sweep_batch_size.observe(size)
    return result


@shared_task(name="payments.sweep", ignore_result=True, acks_late=False)
def sweep() -> dict:
    """One beat tick of the sweeper (beat fires it every second).

    Once it finds work — it claimed something, held back for the
    executors, or the next slot of the spread grid holds payments
    (``sweeper.work_ahead``) — it sweeps again every ``PAYMENT_SWEEP_TICK_MS`` within
    ``PAYMENT_SWEEP_WINDOW_SECONDS`` (under beat's 1 s interval): under load a
    payment is claimed within a tick of entering the lookahead, and the gap
    between sweeps does not depend on how punctually beat fires (exported as
    ``payments_sweep_interval_seconds``). An idle sweep returns at once, so an
    idle service sweeps once a second (with ``PAYMENT_LOOKAHEAD_SECONDS`` 0 it
    always ticks: nothing is claimed ahead of its time then).
    """
    deadline = time.monotonic() + settings.PAYMENT_SWEEP_WINDOW_SECONDS
    tick = settings.PAYMENT_SWEEP_TICK_MS / 1000
    claimed = messages = 0
    # without a lookahead nothing is claimed ahead: keep ticking regardless
    busy = settings.PAYMENT_LOOKAHEAD_SECONDS <= 0
    while True:
        result = sweep_once()
        claimed, messages = claimed + result.claimed, messages + result.messages
        busy = busy or bool(result.claimed) or result.backpressure or result.work_ahead
        if not busy or time.monotonic() + tick > deadline:
            return {"claimed": claimed, "messages": messages}
        time.sleep(tick)


@shared_task(name="payments.reap_leases", ignore_result=True, acks_late=False)
def reap_leases() -> dict:
    result = reaper.reap_leases()
    metrics.record_reap(result)
    return {
        "requeued": result.requeued,
        "dead_lettered": result.dead_lettered,
        "errors": result.errors,
        "timed_out": result.timed_out,
        "budget_exhausted": result.budget_exhausted,
    }


@shared_task(name="payments.materialize_recurring", ignore_result=True)
def materialize_recurring() -> dict:
    result = materializer.materialize_due()
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


# --- maintenance and webhooks -----------------------------------------------------------


@shared_task(name="payments.purge_idempotency_keys", ignore_result=True)
def purge_idempotency_keys() -> int:
    return idempotency.idempotency_purge_expired()


@shared_task(name="payments.purge_webhooks", ignore_result=True)
def purge_webhooks() -> int:
    return webhooks.purge_finished()


@shared_task(name="payments.deliver_webhook", ignore_result=True, acks_late=True)
def deliver_webhook(delivery_id: str) -> str | None:
    status = webhooks.deliver(delivery_id)
    if status == "pending":  # a failed attempt with retries left: come back at its time
        delay = webhooks.retry_delay(delivery_id)
        deliver_webhook.apply_async(
            args=[delivery_id], queue=routing.WEBHOOK_QUEUE, countdown=delay
        )
    # client_busy: put off in its client's line; a request of the client that
    # ends hands it its turn (webhooks.turn_came, below).
    # None (deferred by an open circuit, or not due): the beat task resends it
    # when due, so a dead endpoint's backlog holds no countdown messages.
    return status


@receiver(webhooks.turn_came)
def publish_turn(sender, delivery_id: str, **kwargs) -> None:
    """A put-off delivery's turn came (its client's request ended here): send it now.
    Lost (broker down), it is due again and the beat's scan sends it."""
    try:
        deliver_webhook.apply_async(args=[delivery_id], queue=routing.WEBHOOK_QUEUE)
    except Exception:
        logger.warning("could not enqueue webhook delivery %s", delivery_id, exc_info=True)


@shared_task(name="payments.dispatch_webhooks", ignore_result=True, acks_late=True)
def dispatch_webhooks(event_ids: list[str]) -> int:
    """Expand one transaction's events into deliveries and send them (webhook worker):
    each client's free share first, the rest behind every other client's."""
    return _send(webhooks.dispatch(event_ids))


def _send(offers: list[webhooks.Offer]) -> int:
    """One ``deliver_webhook`` message an offer; ``behind`` at ``BEHIND_PRIORITY``."""
    for offer in offers:
        behind = {"priority": webhooks.BEHIND_PRIORITY} if offer.behind else {}
        deliver_webhook.apply_async(args=[offer.delivery_id], queue=routing.WEBHOOK_QUEUE, **behind)
    return len(offers)


@shared_task(name="payments.retry_webhooks", ignore_result=True)
def retry_webhooks() -> int:
    """Beat safety net: (re)send pending deliveries whose time has come."""
    webhooks.hand_on_lapsed()
    events = webhooks.undispatched_event_ids()
    if events:
        dispatch_webhooks.apply_async(args=[events])
    return _send(webhooks.due_offers())
