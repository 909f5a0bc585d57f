"""The durable timer: sweeper and lease reaper (DESIGN §4.1).

PostgreSQL holds every timer; Redis only carries "this chunk is due" hints.

- ``sweep_due`` claims due PENDING rows in one statement
  (``FOR NO KEY UPDATE SKIP LOCKED``, so several sweepers never claim the same row),
  sets them QUEUED with a new fence and a lease, commits, then publishes one
  message per (partition, chunk) with an ETA at the chunk's due time.
- ``reap_leases`` returns QUEUED rows whose lease expired to PENDING with a new
  fence (so a late copy of the old message is fenced out), or dead-letters
  them after ``PAYMENT_MAX_ATTEMPTS`` claims.

Due-ness is decided by the database clock. The cutoffs use
``statement_timestamp()`` (the start of the claiming statement): it is
*stable*, so PostgreSQL bounds the partial-index scan with it; the volatile
``clock_timestamp()`` can only be a filter, and an idle sweep then reads every
pending row — its cost would grow with the far-future backlog.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from django.db.models import F

from ledger.services import LedgerBatch

from . import webhooks
from .clock import db_now
from .models import DEAD_LETTER_CODE, Actor, Payment, PaymentEvent, PaymentStatus

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Claimed:
    payment_id: str
    fence: int
    partition: int
    due_at: datetime


@dataclass
class SweepResult:
    claimed: int = 0
    messages: int = 0
    batches: int = 0
    seconds: float = 0.0
    backpressure: bool = False
    lag: float = 0.0
    catching_up: bool = False
    batch_sizes: list[int] = field(default_factory=list)


_CLAIM_SQL = """
WITH due AS (
    SELECT id FROM payments_payment
     WHERE status = 'PENDING'
       AND run_at <= statement_timestamp() + make_interval(secs => %(lookahead)s)
     ORDER BY run_at
     LIMIT %(limit)s
       FOR NO KEY UPDATE SKIP LOCKED
), claimed AS (
    UPDATE payments_payment p
       SET status = 'QUEUED',
           fence = p.fence + 1,
           attempts = p.attempts + 1,
           lease_expires_at = clock_timestamp() + make_interval(secs => %(lease)s),
           updated_at = clock_timestamp()
      FROM due
     WHERE p.id = due.id
 RETURNING p.id, p.fence, p.partition, p.due_at
), events AS (
    INSERT INTO payments_paymentevent
           (payment_id, type, from_status, to_status, actor, fence, data, created_at)
    SELECT id, 'queued', 'PENDING', 'QUEUED', 'system', fence, '{}'::jsonb, clock_timestamp()
      FROM claimed
)
SELECT id, fence, partition, due_at FROM claimed
"""


def _claim_batch(limit: int, lookahead: float | None = None) -> list[Claimed]:
    """Claim up to ``limit`` payments due within ``lookahead`` seconds (default
    ``PAYMENT_LOOKAHEAD_SECONDS``); caller commits before publishing."""
    if lookahead is None:
        lookahead = settings.PAYMENT_LOOKAHEAD_SECONDS
    lease = settings.PAYMENT_LEASE_SECONDS
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_CLAIM_SQL, {"lookahead": lookahead, "limit": limit, "lease": lease})
            return [Claimed(str(r[0]), r[1], r[2], r[3]) for r in cursor.fetchall()]
    # SQLite (embedded default): one writer at a time, so no SKIP LOCKED needed.
    now = db_now()
    ids = list(
        Payment.objects.filter(
            status=PaymentStatus.PENDING, run_at__lte=now + timedelta(seconds=lookahead)
        )
        .order_by("run_at")
        .values_list("pk", flat=True)[:limit]
    )
    Payment.objects.filter(pk__in=ids, status=PaymentStatus.PENDING).update(
        status=PaymentStatus.QUEUED,
        fence=F("fence") + 1,
        attempts=F("attempts") + 1,
        lease_expires_at=now + timedelta(seconds=lease),
        updated_at=now,
    )
    rows = list(
        Payment.objects.filter(pk__in=ids).values_list("pk", "fence", "partition", "due_at")
    )
    PaymentEvent.objects.bulk_create(
        PaymentEvent(
            payment_id=pk,
            type="queued",
            from_status=PaymentStatus.PENDING,
            to_status=PaymentStatus.QUEUED,
            actor=Actor.SYSTEM,
            fence=fence,
        )
        for pk, fence, _, _ in rows
    )
    return [Claimed(str(pk), fence, part, due) for pk, fence, part, due in rows]


def chunk_claims(
    claims: list[Claimed], now: datetime | None = None
) -> list[tuple[int, datetime, list[Claimed]]]:
    """Group claims into (partition, eta, chunk): same partition, due close together.

    A chunk holds at most ``PAYMENT_CHUNK_SIZE`` payments due within
    ``PAYMENT_CHUNK_SPREAD_MS`` of each other; its ETA is its latest due time,
    so no payment in it is attempted early and none waits more than the spread.
    Payments already due at ``now`` wait for no one, so the spread does not
    split them: a backlog (the executors fell behind) is claimed in full-size
    chunks, and the executors catch up at their batched rate instead of
    paying one message per payment.
    """
    size = settings.PAYMENT_CHUNK_SIZE
    spread = timedelta(milliseconds=settings.PAYMENT_CHUNK_SPREAD_MS)
    by_partition: dict[int, list[Claimed]] = {}
    for claim in claims:
        by_partition.setdefault(claim.partition, []).append(claim)
    chunks = []
    for partition, items in sorted(by_partition.items()):
        items.sort(key=lambda c: c.due_at)
        current: list[Claimed] = []
        for claim in items:
            waits = now is None or claim.due_at > now  # would hold the chunk back
            if current and (
                len(current) >= size or (waits and claim.due_at - current[0].due_at > spread)
            ):
                chunks.append((partition, current[-1].due_at, current))
                current = []
            current.append(claim)
        if current:
            chunks.append((partition, current[-1].due_at, current))
    return chunks


def publish_claims(claims: list[Claimed]) -> int:
    """Publish one message per chunk to its partition queue; returns messages sent."""
    from .tasks import execute_chunk

    now = db_now()
    sent = 0
    for partition, eta, chunk in chunk_claims(claims, now):
        options = {"queue": queue_name(partition)}
        if eta > now:
            options["countdown"] = (eta - now).total_seconds()
        execute_chunk.apply_async(args=[[[c.payment_id, c.fence] for c in chunk]], **options)
        sent += 1
    return sent


def republish_not_due(items: list[tuple[str, int, datetime]]) -> None:
    """Send early arrivals back with a countdown to their due time (DB clock)."""
    from .tasks import execute_chunk

    now = db_now()
    partitions = partitions_of([pid for pid, _, _ in items])
    for pid, fence, due_at in items:
        execute_chunk.apply_async(
            args=[[[pid, fence]]],
            queue=queue_name(partitions.get(pid, 0)),
            countdown=max((due_at - now).total_seconds(), 0.0),
        )


def partitions_of(payment_ids: list[str]) -> dict[str, int]:
    rows = Payment.objects.filter(pk__in=payment_ids).values_list("pk", "partition")
    return {str(pk): partition for pk, partition in rows}


def queue_name(partition: int) -> str:
    return f"payments.p{partition:02d}"


def queued_count() -> int:
    return Payment.objects.filter(status=PaymentStatus.QUEUED).count()


@dataclass(frozen=True)
class ExecutorState:
    behind: bool = False  # stop claiming: claims would outlive their lease
    lag: float = 0.0  # seconds the executors run behind due time


_EXECUTOR_STATE_SQL = """
SELECT lease_expires_at - statement_timestamp(),
       greatest(extract(epoch FROM statement_timestamp() - greatest(
           lease_expires_at - make_interval(secs => %(lease)s), run_at)), 0)
  FROM payments_payment
 WHERE status = 'QUEUED'
 ORDER BY lease_expires_at
 OFFSET %(tolerated)s LIMIT 1
"""


def executor_state() -> ExecutorState:
    """How far behind the executors are, judged by the oldest live claims.

    The oldest ``PAYMENT_LOST_CLAIMS_TOLERATED`` QUEUED claims are skipped:
    those may be messages that were lost (a SIGKILLed worker, a Redis
    restart) and wait for the reaper, not for a worker; counting them would
    stall every other payment until their lease expired. Past them:

    - ``behind`` when the next oldest claim has waited more than half its
      lease. Claiming more would only publish leases that expire before a
      worker reaches them, and every expiry costs the payment an attempt and
      the queue a duplicate message: under sustained overload that fed on
      itself until healthy payments were dead-lettered. The backlog waits as
      PENDING instead and is claimed, in full-size chunks, once the executors
      catch up.
    - ``lag``: how long that claim has waited since it should have run — since
      its run time, or since it was claimed if it was claimed late. It does
      not count the wait until a payment is due, so it is the executors' queue
      delay; above ``PAYMENT_CATCH_UP_LAG_MS`` the sweeper claims only
      payments already due (see ``sweep_due``).

    One short scan of the partial index on QUEUED leases.
    """
    tolerated = settings.PAYMENT_LOST_CLAIMS_TOLERATED
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(
                _EXECUTOR_STATE_SQL,
                {"tolerated": tolerated, "lease": settings.PAYMENT_LEASE_SECONDS},
            )
            row = cursor.fetchone()
        if row is None:
            return ExecutorState()
        remaining, lag = row[0], float(row[1])
    else:  # SQLite (embedded default)
        rows = list(
            Payment.objects.filter(status=PaymentStatus.QUEUED)
            .order_by("lease_expires_at")
            .values_list("lease_expires_at", "run_at")[tolerated : tolerated + 1]
        )
        if not rows:
            return ExecutorState()
        (expires, run_at), now = rows[0], db_now()
        claimed_at = expires - timedelta(seconds=settings.PAYMENT_LEASE_SECONDS)
        remaining = expires - now
        lag = max((now - max(claimed_at, run_at)).total_seconds(), 0.0)
    half_lease = timedelta(seconds=settings.PAYMENT_LEASE_SECONDS / 2)
    return ExecutorState(behind=remaining < half_lease, lag=lag)


def sweep_due(*, max_batches: int = 50) -> SweepResult:
    """Claim and publish everything due (within the lookahead), batch by batch.

    Safe to run on several nodes at once. If the process dies between commit
    and publish, the claimed rows simply wait for their lease to expire.
    """
    started = time.monotonic()
    result = SweepResult()
    batch_size = settings.PAYMENT_SWEEP_BATCH
    for _ in range(max_batches):
        queued = queued_count()
        room = settings.PAYMENT_MAX_QUEUED - queued
        executors = executor_state()
        result.lag = executors.lag
        # Top up in whole batches: claiming the few hundred that just freed up
        # every second would cut a backlog into chunks of a dozen per
        # partition (measured: half the drain throughput).
        if room < min(batch_size, settings.PAYMENT_MAX_QUEUED) and queued:
            room = 0
        if room <= 0 or executors.behind:
            result.backpressure = True
            break
        # Catching up: the executors run late, so claiming ahead would only
        # cut the next second into many small chunks (one message per
        # payment or so, several times the work of a full chunk) that queue
        # behind the backlog anyway. Claim only what is due: overdue payments
        # go out in full chunks and the executors catch up at their batched
        # rate; the lookahead resumes once the lag is gone.
        lookahead = None
        if executors.lag * 1000 > settings.PAYMENT_CATCH_UP_LAG_MS:
            lookahead, result.catching_up = 0.0, True
        with transaction.atomic():
            claims = _claim_batch(min(batch_size, room), lookahead)
        if claims:
            result.messages += publish_claims(claims)
            result.claimed += len(claims)
            result.batches += 1
            result.batch_sizes.append(len(claims))
        if len(claims) < min(batch_size, room):
            break
    result.seconds = time.monotonic() - started
    if result.claimed:
        logger.info(
            "sweep claimed %s payments in %s messages",
            result.claimed,
            result.messages,
            extra={"claimed": result.claimed, "messages": result.messages},
        )
    return result


# --- lease reaper --------------------------------------------------------------

_REQUEUE_SQL = """
WITH expired AS (
    SELECT id FROM payments_payment
     WHERE status = 'QUEUED' AND lease_expires_at < statement_timestamp()
       AND attempts < %(max_attempts)s
     ORDER BY lease_expires_at
     LIMIT %(limit)s
       FOR NO KEY UPDATE SKIP LOCKED
), requeued AS (
    UPDATE payments_payment p
       SET status = 'PENDING',
           fence = p.fence + 1,
           lease_expires_at = NULL,
           run_at = greatest(p.due_at, clock_timestamp()
                    + make_interval(secs => least(power(2, p.attempts - 1), 60))),
           updated_at = clock_timestamp()
      FROM expired
     WHERE p.id = expired.id
 RETURNING p.id, p.fence, p.attempts
), events AS (
    INSERT INTO payments_paymentevent
           (payment_id, type, from_status, to_status, actor, fence, data, created_at)
    SELECT id, 'lease_expired', 'QUEUED', 'PENDING', 'system', fence,
           jsonb_build_object('attempts', attempts), clock_timestamp()
      FROM requeued
)
SELECT count(*) FROM requeued
"""


@dataclass
class ReapResult:
    requeued: int = 0
    dead_lettered: int = 0


def retry_delay_seconds(attempts: int) -> float:
    return min(2 ** max(attempts - 1, 0), 60)


def reap_leases(*, limit: int = 10_000) -> ReapResult:
    result = ReapResult()
    max_attempts = settings.PAYMENT_MAX_ATTEMPTS
    with transaction.atomic():
        if connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute(_REQUEUE_SQL, {"max_attempts": max_attempts, "limit": limit})
                result.requeued = cursor.fetchone()[0]
        else:
            now = db_now()
            expired = Payment.objects.filter(
                status=PaymentStatus.QUEUED, lease_expires_at__lt=now, attempts__lt=max_attempts
            )[:limit]
            for payment in expired:
                payment.status = PaymentStatus.PENDING
                payment.fence += 1
                payment.lease_expires_at = None
                payment.run_at = max(
                    payment.due_at, now + timedelta(seconds=retry_delay_seconds(payment.attempts))
                )
                payment.updated_at = now
                payment.save(
                    update_fields=["status", "fence", "lease_expires_at", "run_at", "updated_at"]
                )
                PaymentEvent.objects.create(
                    payment=payment,
                    type="lease_expired",
                    from_status=PaymentStatus.QUEUED,
                    to_status=PaymentStatus.PENDING,
                    actor=Actor.SYSTEM,
                    fence=payment.fence,
                    data={"attempts": payment.attempts},
                )
                result.requeued += 1
    dead = list(
        Payment.objects.filter(
            status=PaymentStatus.QUEUED,
            lease_expires_at__lt=db_now(),
            attempts__gte=max_attempts,
        ).values_list("pk", flat=True)[:limit]
    )
    for payment_id in dead:
        if _dead_letter(payment_id):
            result.dead_lettered += 1
    if result.requeued or result.dead_lettered:
        logger.warning(
            "reaper requeued %s and dead-lettered %s payments",
            result.requeued,
            result.dead_lettered,
            extra={"requeued": result.requeued, "dead_lettered": result.dead_lettered},
        )
    return result


def _dead_letter(payment_id) -> bool:
    """FAILED ``max_attempts_exceeded`` with the hold released; staff can retry it."""
    with transaction.atomic():
        payment = (
            Payment.objects.select_for_update(no_key=True, skip_locked=True)
            .filter(pk=payment_id, status=PaymentStatus.QUEUED)
            .first()
        )
        if payment is None or payment.lease_expires_at >= db_now():
            return False
        if payment.hold_id:
            batch = LedgerBatch(account_ids=[payment.from_account_id], hold_ids=[payment.hold_id])
            if batch.holds.get(payment.hold_id) and batch.holds[payment.hold_id].status == "active":
                batch.release_hold(hold_id=payment.hold_id)
                batch.flush()
        now = db_now()
        payment.status = PaymentStatus.FAILED
        payment.error_code = DEAD_LETTER_CODE
        payment.error_message = f"Not executed after {payment.attempts} attempts."
        payment.fence += 1
        payment.lease_expires_at = None
        payment.updated_at = now
        payment.save(
            update_fields=[
                "status",
                "error_code",
                "error_message",
                "fence",
                "lease_expires_at",
                "updated_at",
            ]
        )
        PaymentEvent.objects.create(
            payment=payment,
            type="dead_lettered",
            from_status=PaymentStatus.QUEUED,
            to_status=PaymentStatus.FAILED,
            actor=Actor.SYSTEM,
            fence=payment.fence,
            data={"attempts": payment.attempts},
        )
        owner = payment.from_account.owner_id
        if owner is not None:
            webhooks.emit([(owner, "payment.failed", webhooks.payment_data(payment))])
    return True
