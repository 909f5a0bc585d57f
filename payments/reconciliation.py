"""Payment checks added to ``reconcile_ledger`` (DESIGN §3, invariant 3):
every COMPLETED payment has exactly one journal entry — its own
``payment:<id>`` — and no other payment has one."""

from django.db.models import OuterRef, Subquery, Value
from django.db.models.functions import Coalesce

from ledger.models import JournalEntry
from ledger.reconciliation import Check, CheckResult, Mismatch, Progress, register_check

from .models import Payment, PaymentStatus

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
