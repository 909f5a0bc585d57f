"""Payment checks added to ``reconcile_ledger`` (DESIGN §3, invariant 3):
every COMPLETED payment has exactly one journal entry — its own
``payment:<id>`` — and no other payment has one; a payment's hold is active
while the payment may still run (PENDING, QUEUED) and only then."""

from django.db.models import OuterRef, Subquery, Value
from django.db.models.functions import Coalesce

from ledger.models import HoldStatus, JournalEntry
from ledger.reconciliation import Check, CheckResult, Mismatch, Progress, register_check

from .models import OPEN_STATUSES, Payment, PaymentStatus

PREFIX = "payment:"


def _check(result: CheckResult, progress: Progress) -> None:
    rows = Payment.objects.filter(status=PaymentStatus.COMPLETED).values_list(
        "pk", "journal_entry__reference"
    )
    for pid, reference in rows.iterator(chunk_size=5_000):
        result.rows_checked += 1
        if reference != f"{PREFIX}{pid}":
            result.add(
                Mismatch(
                    f"payment {pid}: COMPLETED but its entry is {reference!r}",
                    {"payment_id": str(pid), "reference": reference},
                )
            )
        if result.rows_checked % 5_000 == 0:
            progress.advance(5_000)
    progress.advance(result.rows_checked % 5_000)
    for entry_id, reference in orphan_entries().iterator():
        result.add(
            Mismatch(
                f"entry {entry_id} ({reference}) belongs to no COMPLETED payment",
                {"entry_id": entry_id, "reference": reference},
            )
        )


def orphan_entries():
    """``payment:`` entries that belong to no COMPLETED payment: (id, reference) rows.

    The payment is looked up by its unique ``journal_entry_id`` alone and its
    status compared outside the subquery. With ``AND status = 'COMPLETED'``
    inside, stale statistics right after a large drain (before autovacuum's
    ANALYZE) made PostgreSQL choose a nested-loop anti join over the status
    index: entries x payments comparisons, hours at 100,000 payments.

    An entry that no payment points at has no status: ``Coalesce`` makes that
    ``''``, so it is reported. (``NOT (NULL = 'COMPLETED')`` is NULL, not true:
    without it such an entry, the only kind of orphan the constraints allow,
    was never reported.)
    """
    payment_status = Payment.objects.filter(journal_entry=OuterRef("pk")).values("status")[:1]
    return (
        JournalEntry.objects.filter(reference__startswith=PREFIX)
        # An entry no payment points at has no status: NULL, and NOT (NULL =
        # 'COMPLETED') is not true, so without the COALESCE such an entry was
        # never reported — the only kind of orphan the constraints allow.
        .annotate(payment_status=Coalesce(Subquery(payment_status), Value("")))
        .exclude(payment_status=PaymentStatus.COMPLETED)
        .values_list("pk", "reference")
    )


register_check(
    Check(
        "payments_exactly_once",
        "every COMPLETED payment has exactly one journal entry (payment:<id>); no other has one",
        lambda: Payment.objects.filter(status=PaymentStatus.COMPLETED).count(),
        _check,
    )
)


def _check_holds(result: CheckResult, progress: Progress) -> None:
    """An active hold on a finished payment keeps its amount out of the payer's
    available funds for ever (nothing releases a COMPLETED, FAILED or
    CANCELLED payment's hold); an open payment without an active hold cannot
    run (the executor fails it). ``accounts_consistent`` cannot see either:
    ``held`` still equals the sum of active holds."""
    finished = (
        Payment.objects.filter(hold__status=HoldStatus.ACTIVE)
        .exclude(status__in=OPEN_STATUSES)
        .values_list("pk", "status", "hold_id")
    )
    for pid, status, hold_id in finished.iterator():
        result.add(
            Mismatch(
                f"payment {pid}: {status} but its hold {hold_id} is still active",
                {"payment_id": str(pid), "status": status, "hold_id": hold_id},
            )
        )
    open_rows = (
        Payment.objects.filter(status__in=OPEN_STATUSES)
        .values_list("pk", "status", "hold_id", "hold__status")
        .order_by()
    )
    for pid, status, hold_id, hold_status in open_rows.iterator(chunk_size=5_000):
        result.rows_checked += 1
        if hold_status != HoldStatus.ACTIVE:
            result.add(
                Mismatch(
                    f"payment {pid}: {status} but its hold is {hold_status or 'missing'}",
                    {"payment_id": str(pid), "status": status, "hold_id": hold_id},
                )
            )
    progress.advance(result.rows_checked)


register_check(
    Check(
        "payments_holds",
        "a payment's hold is active while it is PENDING or QUEUED, and only then",
        lambda: Payment.objects.filter(status__in=OPEN_STATUSES).count(),
        _check_holds,
    )
)
