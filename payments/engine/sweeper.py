"""The sweeper: the durable timer's clock hand (DESIGN §4.1).

PostgreSQL holds every timer; Redis only carries "this chunk is due" hints.
``sweep_due`` claims due PENDING rows in one statement
(``transitions.claim_due``: ``FOR NO KEY UPDATE SKIP LOCKED``, so several
sweepers never claim the same row), which sets them QUEUED with a new fence
and a lease; it commits, then hands the claims, cut into chunks by due time and
size (``chunk_claims``), to ``publish`` — ``payments.tasks`` sends one message
per chunk with an ETA at its due time. Due-ness is decided by the database
clock. Runs on the timer worker (``payments.sweep``, every second).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from django.conf import settings
from django.db import connection, transaction
from kombu.exceptions import OperationalError as KombuOperationalError

from .. import metrics, transitions
from ..clock import db_now, same_slot, slot_start, spread, spread_grid
from ..models import Payment, PaymentStatus
from ..transitions import Claimed, claim_due

logger = logging.getLogger(__name__)


Chunk = tuple[tuple[int, ...], datetime, list[Claimed]]  # (partitions, eta, claims)


@dataclass
class SweepResult:
    claimed: int = 0
    messages: int = 0
    batches: int = 0
    seconds: float = 0.0
    backpressure: bool = False
    # nothing claimed, but the next slot of the spread grid holds work: the
    # sweep should look again within the slot, not at the next beat
    work_ahead: bool = False
    lag: float = 0.0
    batch_sizes: list[int] = field(default_factory=list)


def chunk_claims(claims: list[Claimed], now: datetime | None = None) -> list[Chunk]:
    """Cut claims into chunks, one message each: (partitions, eta, claims).

    First by time: a window holds the claims due within one slot of the
    ``PAYMENT_CHUNK_SPREAD_MS`` grid (``clock.same_slot``), whatever their
    partition; its chunks' ETA is their latest due time, so no payment in
    them is attempted early and none waits more than the spread. A window
    that holds many full chunks is cut again in time (``sub_slots``). The grid is
    the claim's too (``transitions.claim_due`` claims whole slots), so a
    steady flow is one window per slot, never a window and a fragment cut
    off by where the lookahead happened to end. Payments already due at
    ``now`` wait for no one, so the slots do not split them: a backlog is
    claimed in full-size chunks (its last two chunks' worth in halves,
    ``pack``).

    Then by size, adapting to the load: within a window each partition's
    claims stay together (up to ``PAYMENT_CHUNK_SIZE`` per chunk) and small
    partitions share a chunk until it is full, the last two chunks' worth
    in halves (``pack``). At a trickle a window is one
    message for every partition (one transaction for the lot, instead of one
    ~15-statement transaction per payment); in a burst each chunk is one
    partition's full chunk, so concurrent batches lock disjoint source
    accounts. The executor collapses into a chunk the other due payments of
    its partitions (``engine.executor``).
    """
    size = settings.PAYMENT_CHUNK_SIZE
    grid = spread_grid()
    windows: list[list[Claimed]] = []
    current: list[Claimed] = []
    for claim in sorted(claims, key=lambda c: c.due_at):
        waits = now is None or claim.due_at > now  # would hold the window back
        if current and waits and not same_slot(current[0].due_at, claim.due_at, grid):
            windows.extend(sub_slots(current, grid, now))
            current = []
        current.append(claim)
    if current:
        windows.extend(sub_slots(current, grid, now))
    chunks: list[Chunk] = []
    for window in windows:
        by_partition: dict[int, list[Claimed]] = {}
        for claim in window:
            by_partition.setdefault(claim.partition, []).append(claim)
        pieces = [
            group[start : start + size]
            for _, group in sorted(by_partition.items())
            for start in range(0, len(group), size)
        ]
        for batch in pack(pieces, size):
            partitions = tuple(sorted({c.partition for c in batch}))
            chunks.append((partitions, max(c.due_at for c in batch), batch))
    return chunks


def pack(pieces: list[list[Claimed]], size: int) -> list[list[Claimed]]:
    """Pack a window's pieces (each one partition's, at most ``size``, in
    partition order) into chunks of at most ``size``, a piece never split:
    full chunks while more than two chunks' worth is left, then the last two
    chunks' worth in halves.

    The chunks of a window come due together and run side by side on the
    payment workers, so the window is done when its largest chunk is. Packed
    greedily, a window of just over one chunk — 220 payments, a 400 ms slot
    at 550/s — became a full chunk and a remainder of 20: one worker ran 200
    payments while the other ran 20 and waited (session 36's batch sizes at
    500/s). Halved, the two workers run ~110 each for the same two
    transactions. A piece goes into the chunk being filled while its middle
    is within that chunk's share, so the halves come out as even as whole
    partitions allow; a window of one chunk or less is one chunk, as before,
    and a backlog's full chunks stay full up to its last two chunks' worth.
    A piece is never split, so halves need the window to span partitions: one
    partition's 220 claims stay 200 + 20 (halved, the two workers would wait
    on each other's source accounts).
    """
    chunks: list[list[Claimed]] = []
    batch: list[Claimed] = []
    left = sum(map(len, pieces))  # not in a closed chunk, the one being filled included
    for piece in pieces:
        share = left / 2 if size < left <= 2 * size else size
        if batch and (len(batch) + len(piece) > size or len(batch) + len(piece) / 2 > share):
            chunks.append(batch)
            left -= len(batch)
            batch = []
        batch.extend(piece)
    if batch:
        chunks.append(batch)
    return chunks


CHUNKS_PER_SUB_SLOT = 2  # the payment workers' batches that run at once (two processes)


def sub_slots(
    window: list[Claimed], grid: timedelta | None, now: datetime | None
) -> list[list[Claimed]]:
    """Cut a window that waits for its slot into equal parts of the slot, in
    time, one per ``CHUNKS_PER_SUB_SLOT`` full chunks it holds (rounded half
    up: from three full chunks on); a part holding less than a full chunk
    joins the next one (the last joins the one before).

    A window's chunks are due at its latest claim, so its first payments wait
    up to the whole slot: half of it on average, which at a high rate is
    lateness for nothing — the slot holds full chunks many times over. Each
    part is then cut by partition and size as a window is, so with an even
    flow its two or three chunks hold a full chunk's worth or most of one
    (a part of 1.5 chunks' worth is two of 0.75, ``pack``) and disjoint source
    partitions (the two that come due together run at once on the two
    payment workers without waiting on each other's payment rows) and are
    due within a fraction of the slot. At 2,000/s a 400 ms slot holds 800
    payments: two parts of 200 ms and ~6 chunks instead of ~5 (a part of
    just over two full chunks packs into three), the average wait for the
    slot 200 → 100 ms. A window of fewer than three full chunks keeps the
    whole slot, a window of payments already due is never cut (nothing to
    wait for), and an uneven slot (a burst at one instant and a light flow
    around it) is not cut into a small chunk spanning every partition: a
    part under a full chunk joins its neighbour. Cutting every slot's
    chunks by time instead of partition was tried and reverted in session
    22: chunks that span every partition serialise the two workers on each
    other's rows.
    """
    size = settings.PAYMENT_CHUNK_SIZE
    parts = (len(window) + size) // (CHUNKS_PER_SUB_SLOT * size)  # n / 2 chunks, half up
    first = window[0].due_at
    if grid is None:
        origin, length = first, spread()
    else:
        origin, length = slot_start(first, grid), grid
    if parts <= 1 or length <= timedelta(0) or (now is not None and first <= now):
        return [window]  # no spread (PAYMENT_CHUNK_SPREAD_MS=0): one instant, nothing to cut
    cut: list[list[Claimed]] = [[] for _ in range(parts)]
    for claim in window:  # in due order
        cut[min((claim.due_at - origin) * parts // length, parts - 1)].append(claim)
    joined: list[list[Claimed]] = []
    for part in cut:  # an empty part is filled by the next or dropped below
        if joined and len(joined[-1]) < size:
            joined[-1].extend(part)
        else:
            joined.append(part)
    if len(joined[-1]) < size:  # never the only part: that is the whole window
        joined[-2].extend(joined.pop())
    return joined


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
      PENDING instead and is claimed, in full-size chunks (``chunk_claims``),
      once the executors catch up.
    - ``lag``: how long that claim has waited since it should have run — since
      its run time, or since it was claimed if it was claimed late. It does
      not count the wait until a payment is due, so it is the executors' queue
      delay (exported as ``payments_executor_lag_seconds``; the sweeper itself
      needs no mode for it: a late executor collapses the partition's due
      payments into one batch, see ``engine.executor``).

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


_WORK_AHEAD_SQL = """
SELECT EXISTS (
    SELECT 1 FROM payments_payment
     WHERE status = 'PENDING'
       AND run_at < statement_timestamp() + make_interval(secs => %(ahead)s)
)
"""


def work_ahead() -> bool:
    """Whether a PENDING payment's run time falls within the lookahead plus one
    slot of the spread grid (``clock.spread_grid``; False without a grid).

    A sweep claims whole slots only, so one may find nothing to claim while
    the slot now entering the lookahead fills: the timer worker has to sweep
    again within the slot, not wait for beat's next tick, or the slot is
    claimed up to a second late and its payments run late. One probe of the
    partial index on PENDING run times.
    """
    grid = spread_grid()
    if grid is None:
        return False
    ahead = settings.PAYMENT_LOOKAHEAD_SECONDS + grid.total_seconds()
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(_WORK_AHEAD_SQL, {"ahead": ahead})
            return cursor.fetchone()[0]
    return Payment.objects.filter(
        status=PaymentStatus.PENDING, run_at__lt=db_now() + timedelta(seconds=ahead)
    ).exists()


# What publishing raises when the broker cannot be reached (kombu wraps the
# transport's connection errors in its OperationalError). Only then are the
# claims handed back: a failure of any other kind could repeat for the same
# claims, and handing them back would have every sweep claim and fail the same
# oldest batch for ever; those wait out their lease, as before.
BROKER_UNREACHABLE = (KombuOperationalError, OSError)


def _hand_back(claims: list[Claimed]) -> None:
    """A batch's messages could not all be published (the broker is down): its
    claims go back to PENDING with their attempt given back
    (``transitions.unclaim``), to be claimed again once the broker is back —
    a broker outage makes payments late, never dead letters. If the database
    is gone too, the leases run out as before and the reaper takes them back."""
    try:
        with transaction.atomic():
            handed_back = transitions.unclaim(claims)
    except Exception:
        logger.exception("could not hand back %s claims after a failed publish", len(claims))
        return
    metrics.claims_handed_back.inc(handed_back)
    logger.warning(
        "publish failed: %s of %s claims handed back",
        handed_back,
        len(claims),
        extra={"handed_back": handed_back},
    )


def sweep_due(
    *, publish: Callable[[list[Chunk], datetime], int], max_batches: int = 50
) -> SweepResult:
    """Claim and publish everything due (within the lookahead), batch by batch.

    ``publish(chunks, now)`` sends one message per chunk and returns how many
    it sent (``payments.tasks.publish_chunks``); it runs after each batch's
    commit. Safe to run on several nodes at once. If the process dies between
    commit and publish, the claimed rows simply wait for their lease to expire.
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
        with transaction.atomic():
            claims = claim_due(
                limit=min(batch_size, room), lookahead=settings.PAYMENT_LOOKAHEAD_SECONDS
            )
        if claims:
            now = db_now()
            try:
                result.messages += publish(chunk_claims(claims, now), now)
            except BROKER_UNREACHABLE:
                _hand_back(claims)
                raise
            result.claimed += len(claims)
            result.batches += 1
            result.batch_sizes.append(len(claims))
        if len(claims) < min(batch_size, room):
            break
    if not result.claimed and not result.backpressure:
        result.work_ahead = work_ahead()
    result.seconds = time.monotonic() - started
    if result.claimed:
        logger.info(
            "sweep claimed %s payments in %s messages",
            result.claimed,
            result.messages,
            extra={"claimed": result.claimed, "messages": result.messages},
        )
    return result
