"""Correctness the suite checks after every scenario: exactly once, nothing left open."""

from __future__ import annotations

import time


def wait_terminal(timeout: float, poll: float = 0.5, on_poll=None) -> int:
    """Wait until no payment is open; return how many are still open at the end.

    ``on_poll(remaining)`` is called with each count (the drain's progress
    series): the open rows are counted through their partial indexes, cheaper
    than counting the finished ones, which scans the table.
    """
    from bench.harness.app import OPEN_STATUSES, Payment

    deadline = time.monotonic() + timeout
    while True:
        remaining = Payment.objects.filter(status__in=OPEN_STATUSES).count()
        if on_poll is not None:
            on_poll(remaining)
        if remaining == 0 or time.monotonic() > deadline:
            return remaining
        time.sleep(poll)


def exactly_once_check() -> dict:
    """Counts that prove exactly-once against the ledger, plus reconciliation."""
    from django.db.models import Count, F

    from bench.harness.app import OPEN_STATUSES, JournalEntry, Payment, reconcile

    completed = Payment.objects.filter(status="COMPLETED").count()
    entries = JournalEntry.objects.filter(reference__startswith="payment:").count()
    duplicate_refs = (
        JournalEntry.objects.filter(reference__startswith="payment:")
        .values("reference")
        .annotate(n=Count("id"))
        .filter(n__gt=1)
        .count()
    )
    report = reconcile()
    return {
        "completed": completed,
        "payment_entries": entries,
        "duplicates": max(0, entries - completed) + duplicate_refs,
        "completed_without_entry": Payment.objects.filter(
            status="COMPLETED", journal_entry__isnull=True
        ).count(),
        "executed_early": Payment.objects.filter(executed_at__lt=F("due_at")).count(),
        "open": Payment.objects.filter(status__in=OPEN_STATUSES).count(),
        # every bench payment is funded and valid: any FAILED one is a finding
        # (e.g. dead-lettered after its leases expired under overload)
        "failed": Payment.objects.filter(status="FAILED").count(),
        "reconcile_ok": report.ok,
    }
