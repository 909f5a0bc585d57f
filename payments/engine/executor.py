"""The executor: run a chunk of claimed payments in one transaction (DESIGN §4.1).

Runs on the payment workers (``payments.execute_chunk``).

For a chunk of ``(payment id, fence)`` pairs (and the partitions it holds):

1. lock the payment rows (id order); keep those still QUEUED *with the same
   fence* — anything else is a stale or duplicate delivery (or a payment an
   earlier batch already ran, see 3): recorded, skipped. A message with
   ``partitions`` (the sweeper's, and their hand-backs) does not wait for a
   row another transaction holds (``SKIP LOCKED``): usually the other
   worker's collapse took it in and will have run it by the time this batch
   could. Those still QUEUED with this message's fence as last committed
   are handed back (``busy``; ``tasks.republish_busy``, after
   ``PAYMENT_BUSY_RETRY_MS``, doubled each time, and after three hand-backs
   as a message that waits): the next delivery finds them done if the
   holder ran them, and runs them if it did not (rolled back, or changed
   something else) — not left for the reaper's lease. Waiting instead cost
   the waiting worker the whole of the other's batch, near capacity a sixth
   of the lock waits (bench, session 34). Without ``partitions`` (the
   operator's execute-now, a retry, a split half) it waits;
2. any not yet due by the database clock are left QUEUED and handed back to
   be re-published with a countdown (a payment never runs early);
3. **collapse**: add to the batch up to ``PAYMENT_COLLAPSE_LIMIT`` (600)
   more of the other QUEUED payments of the chunk's partitions that are due
   by the database clock, on their first claim with a live lease, and that
   nobody else has locked (``SKIP LOCKED``; a retried delivery of the chunk
   does not collapse), oldest due first. A lone payment still goes out alone
   at once; when messages queue up behind busy workers, the first one taken
   runs its partitions' due backlog as one batch and the rest find their
   payments done — so the cost per payment falls as load rises, instead of
   one ~15-statement transaction per payment, with no mode to switch. The
   limit does not shrink as the chunk's own items fill it, and it is larger
   than a chunk: under load the worker takes the queues in turn, so a group
   of partitions that fell behind is served about one message per message it
   receives, and each of those — whose own items the message before has
   usually run already — runs the limit's worth of its backlog. Capped at one
   chunk in all, a group whose messages carried ~180 payments caught up at a
   tenth of its arrival rate and ran 7-15 s late for minutes while the other
   groups were on time (bench, 2,250/s); at three chunks it catches up at
   about twice its arrival rate. Any QUEUED payment may run this way: QUEUED
   under a row lock is what makes it runnable; the fence only tells a
   message's own items apart. A batch that dies of anything but a lost
   connection, a lock conflict or a read-only server (``payments_fault``)
   may have died of one of the payments it collapsed, and one that waited
   for a row lock past ``PAYMENT_LOCK_TIMEOUT_SECONDS`` (``lock_timed_out``)
   may have waited for one of their accounts: those stay out of this process's
   collapses until their lease runs out (``Quarantine``), so a poison
   payment — the oldest due, taken first by every collapse — costs each
   worker process one batch, not every batch of its partitions until the
   reaper takes it (the task retries the chunk's own items alone); where
   more than a thousand of a chunk's partitions' payments are kept out so,
   the partitions with the most are left out of its collapse;
4. lock the holds, read every involved account (``LedgerBatch`` with
   ``lock_accounts_last``), apply each transfer capturing its hold; a payment
   that breaks a business rule (account frozen, hold gone…) is FAILED with its
   hold released, without disturbing the others;
5. write entries and holds with bulk statements, mark payments COMPLETED /
   FAILED, write attempts and events;
6. last, lock the changed accounts in ascending id order, carry the batch's
   changes onto the locked rows, write postings and balances, commit: an
   account stays locked for those statements only, not for the whole batch,
   so a schedule request placing a hold on it (or another batch) does not
   wait for the batch. If a locked account no longer satisfies a check the
   batch made on its unlocked read (frozen meanwhile…), the transaction rolls
   back and the chunk runs again with the accounts locked first, as in 4 of
   the single-operation services;
7. side effects (logs, metrics, webhooks) run after commit.

Exactly-once does not depend on the queue: the fence check under a row lock
turns duplicates away, and the journal entry's UNIQUE reference makes a
second posting impossible even if every other guard failed.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from datetime import datetime

from celery.exceptions import SoftTimeLimitExceeded
from django.conf import settings
from django.db import InterfaceError, OperationalError, transaction

from ledger.db import (
    CACHED_DATA_PLAN,
    pipelined,
    set_local,
    transaction_time_bound,
    write_rows,
)
from ledger.exceptions import AccountNotActive, DuplicateReference, LedgerError, StaleAccounts
from ledger.models import JournalEntry
from ledger.services import LedgerBatch, locking_accounts_last

from .. import locks, metrics, transitions
from ..models import AttemptOutcome, Payment, PaymentAttempt, PaymentEvent
from .bounds import lock_timed_out, milliseconds, sqlstate

logger = logging.getLogger(__name__)


def worker_name() -> str:
    """host:pid of the process running the chunk — read at call time: a module-level
    constant was computed in the Celery parent before it forked its pool, so every
    attempt named the parent's pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


def payer_message(payment: Payment, exc: LedgerError, batch: LedgerBatch) -> str:
    """The failure as the payer may read it (``error_message``, attempts).

    Scheduling answers alike for another client's frozen, closed or unknown
    account (``rules.payable_destination``), so the outcome must not say which
    either: "Account 7 is frozen." becomes "Account 7 is not active." when the
    account is not the payer's own (the code, ``account_not_active``, is the
    reason the payment failed and stays).
    """
    if isinstance(exc, AccountNotActive):
        accounts = batch.accounts or {}
        account = accounts.get(exc.details.get("account_id"))
        source = accounts.get(payment.from_account_id)
        if account is None or source is None or account.owner_id != source.owner_id:
            return f"Account {exc.details.get('account_id')} is not active."
    return exc.message


@dataclass
class ChunkResult:
    completed: list[str] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    failure_codes: list[str] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    collapsed: list[str] = field(default_factory=list)  # run without being in the chunk
    not_due: list[tuple[str, int, datetime]] = field(default_factory=list)
    busy: list[tuple[str, int, int]] = field(default_factory=list)  # (id, fence, partition)
    partitions_not_collapsed: int = 0  # kept out of the collapse (``Quarantine``)
    lateness_seconds: list[float] = field(default_factory=list)
    transitions: list[dict] = field(default_factory=list)


class Quarantine:
    """Payments a failed batch collapsed, kept out of this process's collapses
    until their lease runs out (step 3 of the module docstring).

    Which payment broke the batch is not known, so all it took beyond its own
    chunk are suspects; they lose nothing but the shortcut — each still runs
    in its own message, whose retries and split find the poison (DESIGN §4.1),
    and after the lease the collapse would not take them anyway. Not a
    database fact: per process, and lost with it, which costs at most one
    more failed batch per process. Capped at ``limit`` ids, oldest dropped.
    Not thread-safe: payment workers run the solo pool, one task at a time (``Procfile``).

    Kept by partition, and bounded in what it costs a batch (DESIGN §8: a
    storm of one client's bad payments must not slow the others'): a
    collapse excludes only the suspects of its own partitions, and where
    those are more than ``exclude_max`` it leaves the partitions with the
    most suspects out of the collapse until the rest fit (``collapsible``):
    the others still collapse, and the batch runs its message's own
    payments whatever their partition. A suspect that completes (in its own
    message) leaves at once (``discard``). Sending every suspect with every
    collapse made the collapse's statement cost 28 ms of wall time and 9 ms
    of the worker's CPU (ids listed included) at 20,000 of them, against
    0.3 / 0.2 ms with none; at the bound ~1.2 / 0.45 ms
    (``bench/results/2026-11-27-s22-quarantine/``).

    Expiry and the cap go by insertion order, which is expiry order because
    every ``add`` passes the same ``seconds`` (the lease); an ``add`` with a
    shorter one would only keep its ids out longer than it says.
    """

    def __init__(self, limit: int = 20_000, exclude_max: int = 1_000) -> None:
        self.limit = limit
        self.exclude_max = exclude_max
        # payment id -> partition, the soonest expiry first (an id added
        # again moves to the end; see the docstring's last paragraph)
        self._order: dict[str, int] = {}
        self._by_partition: dict[int, dict[str, float]] = {}  # partition -> id -> expiry

    def add(self, payments: Iterable[tuple[str, int]], seconds: float) -> None:
        """Quarantine ``(payment id, partition)`` pairs for ``seconds``."""
        until = time.monotonic() + seconds
        for pid, partition in payments:
            self._forget(pid)
            self._order[pid] = partition
            self._by_partition.setdefault(partition, {})[pid] = until
        while len(self._order) > self.limit:
            self._forget(next(iter(self._order)))

    def collapsible(self, partitions: Collection[int]) -> tuple[list[int], list[str]]:
        """The partitions of ``partitions`` a collapse may take from, and their
        suspects it leaves out (at most ``exclude_max``): those with the most
        suspects are dropped first until the rest fit."""
        self._expire()
        counts = sorted(((len(self._by_partition.get(p, ())), p) for p in partitions), reverse=True)
        total = sum(count for count, _ in counts)
        dropped = set()
        for count, partition in counts:
            if total <= self.exclude_max:
                break
            dropped.add(partition)
            total -= count
        kept = [p for p in partitions if p not in dropped]
        return kept, [pid for p in kept for pid in self._by_partition.get(p, ())]

    def discard(self, payment_ids: Iterable[str]) -> None:
        """Let ``payment_ids`` go (they completed: no longer a suspect)."""
        if not self._order:  # the usual case: every batch's completions pass here
            return
        for pid in payment_ids:
            self._forget(pid)

    def ids(self) -> list[str]:
        """Every suspect, the soonest to leave first."""
        self._expire()
        return list(self._order)

    def clear(self) -> None:
        self._order.clear()
        self._by_partition.clear()

    def _expire(self) -> None:
        now = time.monotonic()
        while self._order:
            pid, partition = next(iter(self._order.items()))
            if self._by_partition[partition][pid] > now:
                return
            self._forget(pid)

    def _forget(self, pid: str) -> None:
        partition = self._order.pop(pid, None)
        if partition is not None:
            group = self._by_partition[partition]
            del group[pid]
            if not group:
                del self._by_partition[partition]


quarantine = Quarantine()

# A batch that dies of these did not die of a payment in it: the connection
# or the host failed, or a lock or serialization conflict with another
# transaction, or the task's soft time limit (90 s: a stuck database or
# network, as every statement is cut at PAYMENT_BATCH_TIMEOUT_SECONDS first).
# The task retries these with backoff (``tasks.TRANSIENT``);
# anything else — a payment's data breaking a statement (DataError,
# IntegrityError…), a bug one payment reaches — splits the chunk at once.
NOT_A_PAYMENTS_FAULT = (OperationalError, InterfaceError, OSError, SoftTimeLimitExceeded)
READ_ONLY_SQLSTATE = "25006"  # a failover's read-only standby: an InternalError
# A batch that gave up waiting for a row lock (``lock_timed_out``,
# PAYMENT_LOCK_TIMEOUT_SECONDS) is not a payment's fault either, and is retried
# like any transient error; but the row it waited for may be one a collapsed
# payment brought in — its account another session keeps locked (a staff
# member's or an operator's open transaction, a stuck process) — so what the
# batch collapsed is kept out of later collapses, as after a payment's fault
# (``Quarantine``). Before the limit, every batch of that partition that
# collapsed such a payment waited for the lock up to the batch's 30 s, the other
# clients' payments in it with it, for as long as the lock lasted.


def payments_fault(exc: BaseException) -> bool:
    """Whether ``exc`` may have come from a payment in the batch (see above)."""
    if isinstance(exc, NOT_A_PAYMENTS_FAULT):
        return False
    return sqlstate(exc) != READ_ONLY_SQLSTATE


def execute_chunk(
    items: list[tuple[str, int]],
    *,
    partitions: Collection[int] = (),
    worker: str | None = None,
) -> ChunkResult:
    """Execute the due payments of a chunk; see the module docstring. Owns its transaction.

    With ``partitions`` the batch collapses their other due QUEUED payments
    into it (step 3); without (the operator's execute-now), only the chunk's
    own payments run.
    """
    worker = worker or worker_name()
    taken: list[tuple[str, int]] = []  # what the last try collapsed, in case it dies
    try:
        return locking_accounts_last(
            lambda last: _execute(items, partitions, worker, taken, lock_accounts_last=last),
            on_stale=_ran_stale,
        )
    except Exception as exc:
        exc.collapsed = len(taken)  # the task retries a batch that collapsed with its own alone
        if taken and (payments_fault(exc) or lock_timed_out(exc)):
            quarantine.add(taken, settings.PAYMENT_LEASE_SECONDS)
            metrics.collapse_quarantined.inc(len(taken))
            logger.warning(
                "a batch that collapsed %s payments failed (%s); they run only in their "
                "own messages until their lease ends",
                len(taken),
                type(exc).__name__,
            )
        raise


def _ran_stale(exc: StaleAccounts) -> None:
    logger.info("batch read a changed account; running it again locked first: %s", exc)
    metrics.stale_account_reads.inc()


def _execute(items, partitions, worker, taken, *, lock_accounts_last: bool) -> ChunkResult:
    fences = {str(pid): int(fence) for pid, fence in items}
    with transaction.atomic():
        # One pipeline for the transaction's statements (COMMIT aside, so the
        # after-commit work runs outside it): a write goes out with the next
        # read instead of in a round trip of its own — 9 round trips for a
        # 45-payment chunk with its collapse, 18 without (counted with strace:
        # 10 before the entries' ids came from their INSERT's RETURNING).
        # Nothing in it may read a row count (see ``pipelined``).
        with pipelined():
            # One statement: batch UPDATEs by key, not a hash of the table
            # (``CACHED_DATA_PLAN``), and the batch's time limit in the
            # database (``transaction_time_bound``, settings'
            # PAYMENT_BATCH_TIMEOUT_SECONDS), below the task's own limits
            # (scheduler_project.task_watchdog in the solo payment workers)
            # and no row lock waited for longer than PAYMENT_LOCK_TIMEOUT_SECONDS
            # (``lock_timed_out``)
            set_local(
                CACHED_DATA_PLAN
                | transaction_time_bound(settings.PAYMENT_BATCH_TIMEOUT_SECONDS)
                | {"lock_timeout": milliseconds(settings.PAYMENT_LOCK_TIMEOUT_SECONDS)}
            )
            result = _statements(fences, partitions, worker, taken, lock_accounts_last)
        transaction.on_commit(lambda: _after_commit(result))
    if result.stale:
        logger.info("skipped %s stale deliveries", len(result.stale), extra={"stale": result.stale})
    if result.busy:
        logger.info("%s payments held by another transaction, handed back", len(result.busy))
    return result


def _statements(fences, partitions, worker, taken, lock_accounts_last) -> ChunkResult:
    """Steps 1 to 6 of the module docstring, in the caller's transaction."""
    result = ChunkResult()
    taken.clear()  # a re-run (StaleAccounts) starts over
    # a sweeper's message (``partitions``) never waits for a row another
    # transaction holds (step 1); the operator's execute-now and a retry do
    now, payments = locks.lock_chunk(fences, skip_locked=bool(partitions))
    found = {str(p.pk) for p in payments}
    missing = [pid for pid in fences if pid not in found]
    # held by another transaction, or no such row (waiting: only the latter)
    queued = locks.queued_in_flight(missing) if missing else {}
    for pid in missing:
        fence, partition = queued.get(pid, (None, None))
        if fence == fences[pid]:
            result.busy.append((pid, fence, partition))
        else:
            result.stale.append(pid)
    attempts: list[PaymentAttempt] = []
    events: list[PaymentEvent] = []
    due: list[Payment] = []
    for payment in payments:
        pid = str(payment.pk)
        if not transitions.is_current(payment, fences[pid]):
            result.stale.append(pid)
            continue
        if payment.due_at > now:
            result.not_due.append((pid, payment.fence, payment.due_at))
            continue
        due.append(payment)
    if partitions:  # step 3: however full the chunk itself
        kept, suspects = quarantine.collapsible(partitions)
        result.partitions_not_collapsed = len(partitions) - len(kept)
        if kept:
            more = locks.lock_due_queued(
                kept,
                now=now,
                limit=settings.PAYMENT_COLLAPSE_LIMIT,
                exclude=[*fences, *suspects],
            )
            result.collapsed.extend(str(p.pk) for p in more)
            taken[:] = [(str(p.pk), p.partition) for p in more]
            due.extend(more)
    batch = _run(due, now, worker, result, attempts, events, lock_accounts_last) if due else None
    # the payments' outcomes, attempts and events: one statement (``write_rows``)
    write_rows(updates=[(due, OUTCOME_FIELDS)], inserts=[attempts, events])
    if batch is not None:
        batch.flush_balances()  # the account locks: last, held until COMMIT
    return result


# What running a payment changes on its row (``transitions.complete``/``fail``).
OUTCOME_FIELDS = (
    "status",
    "journal_entry",
    "executed_at",
    "error_code",
    "error_message",
    "lease_expires_at",
    "updated_at",
)


def _run(due, now, worker, result, attempts, events, lock_accounts_last) -> LedgerBatch:
    batch = LedgerBatch(
        account_ids={p.from_account_id for p in due} | {p.to_account_id for p in due},
        hold_ids=[p.hold_id for p in due if p.hold_id],
        references=[p.reference for p in due],
        lock_accounts_last=lock_accounts_last,
    )
    worker = worker[:128]
    for payment in due:
        pid = str(payment.pk)
        attempt = PaymentAttempt(
            payment=payment,
            number=payment.attempts,
            fence=payment.fence,
            worker=worker,
            started_at=now,
            finished_at=now,
        )
        try:
            if payment.hold_id is None:
                raise LedgerError("Payment has no hold.")
            try:
                entry = batch.transfer(
                    from_account_id=payment.from_account_id,
                    to_account_id=payment.to_account_id,
                    amount=payment.amount,
                    reference=payment.reference,
                    description=payment.description or f"Payment {pid}",
                    hold_id=payment.hold_id,
                )
            except DuplicateReference:
                # Posted before (cannot happen while fences hold; the UNIQUE
                # reference is the last line). The money moved once: record
                # that, the payment COMPLETED with that entry. (Once a sibling
                # of the ``LedgerError`` branch, it skipped the completion and
                # left the payment QUEUED without a lease, out of the reaper's
                # reach.) Its hold is not captured by this attempt: released
                # here if still active, or it held the amount for ever (a
                # COMPLETED payment is out of every release's reach).
                entry = JournalEntry.objects.get(reference=payment.reference)
                transitions.release_hold(payment, batch)
        except LedgerError as exc:
            transitions.release_hold(payment, batch)
            message = payer_message(payment, exc, batch)
            events.append(
                transitions.fail(payment, code=exc.code, message=message, now=now, worker=worker)
            )
            attempt.outcome = AttemptOutcome.FAILED
            attempt.error_code, attempt.error_message = exc.code, message[:255]
            result.failed.append(pid)
            result.failure_codes.append(exc.code)
            entry = None
        if entry is not None:
            events.append(transitions.complete(payment, entry=entry, now=now, worker=worker))
            attempt.outcome = AttemptOutcome.SUCCEEDED
            result.completed.append(pid)
            result.lateness_seconds.append((now - payment.due_at).total_seconds())
        result.transitions.append(
            {
                "payment_id": pid,
                "status": payment.status,
                "fence": payment.fence,
                "attempt": payment.attempts,
                "lateness_seconds": round((now - payment.due_at).total_seconds(), 4),
                "error_code": payment.error_code or None,
            }
        )
        attempts.append(attempt)
    batch.flush()
    transitions.notify_outcomes(
        due, {account_id: account.owner_id for account_id, account in batch.accounts.items()}
    )
    return batch


def _after_commit(result: ChunkResult) -> None:
    quarantine.discard(result.completed)
    metrics.record_chunk(result)
    # One structured line per transition (JSON in production): payment id,
    # fence, attempt, lateness.
    for transition in result.transitions:
        logger.info(
            "payment %s %s", transition["payment_id"], transition["status"], extra=transition
        )
