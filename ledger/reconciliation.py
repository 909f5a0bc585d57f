"""Reconciliation: re-derive every ledger invariant from the rows themselves.

The database already refuses most corruption (CHECK constraints, the zero-sum
trigger, append-only postings). Reconciliation is the independent audit on
top: it recomputes each invariant of DESIGN §3 from scratch and reports every
row that disagrees, so a bug, a manual SQL fix or a restored backup that broke
the books is found, named and counted.

Checks are registered in :data:`CHECKS`; other apps add their own (the
payments app registers "every completed payment has exactly one entry").
On PostgreSQL the whole run reads one REPEATABLE READ snapshot, so it can run
beside live traffic without reporting half-applied transfers.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from django.db import connection, models, transaction
from django.db.models import Count, OuterRef, Subquery, Sum, Value
from django.db.models.functions import Coalesce
from django.utils import timezone

from .models import Account, Hold, HoldStatus, JournalEntry, Posting, ReconciliationRun

CHUNK_SIZE = 5_000
MAX_REPORTED = 100  # mismatches listed per check; all are counted


@dataclass(frozen=True)
class Mismatch:
    message: str
    details: dict[str, Any] = field(default_factory=dict)


@dataclass
class CheckResult:
    name: str
    description: str
    rows_checked: int = 0
    mismatch_count: int = 0
    mismatches: list[Mismatch] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.mismatch_count == 0

    def add(self, mismatch: Mismatch) -> None:
        self.mismatch_count += 1
        if len(self.mismatches) < MAX_REPORTED:
            self.mismatches.append(mismatch)


@dataclass
class ReconciliationReport:
    started_at: Any
    duration_seconds: float = 0.0
    checks: list[CheckResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    @property
    def mismatch_count(self) -> int:
        return sum(c.mismatch_count for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "started_at": self.started_at.isoformat(),
            "duration_seconds": round(self.duration_seconds, 3),
            "mismatch_count": self.mismatch_count,
            "checks": [
                {
                    "name": c.name,
                    "description": c.description,
                    "ok": c.ok,
                    "rows_checked": c.rows_checked,
                    "mismatch_count": c.mismatch_count,
                    "mismatches": [{"message": m.message, **m.details} for m in c.mismatches],
                }
                for c in self.checks
            ],
        }


# A progress callback is told how many rows a check will visit, then each chunk done.
class Progress:
    def start(self, name: str, total: int) -> None: ...

    def advance(self, n: int) -> None: ...

    def finish(self) -> None: ...


@dataclass(frozen=True)
class Check:
    name: str
    description: str
    count: Callable[[], int]
    run: Callable[[CheckResult, Progress], None]


CHECKS: list[Check] = []


def register_check(check: Check) -> Check:
    """Add a check to every reconciliation run (idempotent by name)."""
    if all(c.name != check.name for c in CHECKS):
        CHECKS.append(check)
    return check


def id_ranges(queryset: models.QuerySet, chunk_size: int = CHUNK_SIZE) -> Iterator[tuple[int, int]]:
    """Half-open ``[lo, hi)`` primary-key ranges covering ``queryset``."""
    bounds = queryset.aggregate(lo=models.Min("pk"), hi=models.Max("pk"))
    if bounds["lo"] is None:
        return
    lo = bounds["lo"]
    while lo <= bounds["hi"]:
        yield lo, lo + chunk_size
        lo += chunk_size


# --- ledger checks ------------------------------------------------------------


def _check_entries(result: CheckResult, progress: Progress) -> None:
    for lo, hi in id_ranges(JournalEntry.objects.all()):
        rows = (
            JournalEntry.objects.filter(pk__gte=lo, pk__lt=hi)
            .annotate(total=Coalesce(Sum("postings__amount"), Value(0)), n=Count("postings"))
            .values_list("pk", "total", "n")
            .order_by("pk")  # mismatches reported in id order, whatever plan the GROUP BY takes
        )
        done = 0
        for entry_id, total, n in rows:
            done += 1
            if total != 0 or n < 2:
                result.add(
                    Mismatch(
                        f"entry {entry_id}: {n} postings summing to {total}",
                        {"entry_id": entry_id, "postings": n, "sum": total},
                    )
                )
        result.rows_checked += done
        progress.advance(done)


def _check_total(result: CheckResult, progress: Progress) -> None:
    total = Account.objects.aggregate(s=Coalesce(Sum("balance"), Value(0)))["s"]
    postings_total = Posting.objects.aggregate(s=Coalesce(Sum("amount"), Value(0)))["s"]
    result.rows_checked = 1
    if total != 0:
        result.add(
            Mismatch(f"sum of all account balances is {total}, not 0", {"sum_balances": total})
        )
    if postings_total != 0:
        result.add(
            Mismatch(
                f"sum of all postings is {postings_total}, not 0", {"sum_postings": postings_total}
            )
        )
    progress.advance(1)


def _check_accounts(result: CheckResult, progress: Progress) -> None:
    postings = Posting.objects.filter(account=OuterRef("pk"))
    posted = postings.order_by().values("account").annotate(s=Sum("amount")).values("s")
    last_after = postings.order_by("-pk").values("balance_after")[:1]
    active_held = (
        Hold.objects.filter(account=OuterRef("pk"), status=HoldStatus.ACTIVE)
        .order_by()
        .values("account")
        .annotate(s=Sum("amount"))
        .values("s")
    )
    for lo, hi in id_ranges(Account.objects.all()):
        rows = (
            Account.objects.filter(pk__gte=lo, pk__lt=hi)
            .annotate(
                posted=Coalesce(Subquery(posted), Value(0)),
                last_after=Subquery(last_after),
                active_held=Coalesce(Subquery(active_held), Value(0)),
            )
            .values_list(
                "pk", "balance", "held", "allow_negative", "posted", "last_after", "active_held"
            )
            .order_by("pk")
        )
        done = 0
        for aid, balance, held, allow_negative, posted_sum, last, held_sum in rows:
            done += 1
            ident = {"account_id": aid}
            if balance != posted_sum:
                result.add(
                    Mismatch(
                        f"account {aid}: balance {balance} != sum of postings {posted_sum}",
                        {**ident, "balance": balance, "sum_postings": posted_sum},
                    )
                )
            if last is not None and last != balance:
                result.add(
                    Mismatch(
                        f"account {aid}: balance {balance} != balance_after {last} "
                        "of its latest posting",
                        {**ident, "balance": balance, "last_balance_after": last},
                    )
                )
            if held != held_sum:
                result.add(
                    Mismatch(
                        f"account {aid}: held {held} != sum of active holds {held_sum}",
                        {**ident, "held": held, "sum_active_holds": held_sum},
                    )
                )
            if not allow_negative and balance - held < 0:
                result.add(
                    Mismatch(
                        f"account {aid}: available {balance - held} is negative",
                        {**ident, "balance": balance, "held": held},
                    )
                )
        result.rows_checked += done
        progress.advance(done)


register_check(
    Check(
        "entries_balanced",
        "every journal entry has two or more postings summing to zero",
        lambda: JournalEntry.objects.count(),
        _check_entries,
    )
)
register_check(
    Check(
        "books_balanced",
        "all account balances (issuance included) and all postings sum to zero",
        lambda: 1,
        _check_total,
    )
)
register_check(
    Check(
        "accounts_consistent",
        "balance = sum of postings = latest balance_after; held = sum of active holds; "
        "available >= 0 unless allow_negative",
        lambda: Account.objects.count(),
        _check_accounts,
    )
)


def reconcile(*, progress: Progress | None = None) -> ReconciliationReport:
    """Run every registered check and return the report (never raises on mismatch)."""
    progress = progress or Progress()
    report = ReconciliationReport(started_at=timezone.now())
    started = time.monotonic()
    outermost = not connection.in_atomic_block
    with transaction.atomic():
        if outermost and connection.vendor == "postgresql":
            with connection.cursor() as cursor:
                cursor.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        for check in CHECKS:
            result = CheckResult(check.name, check.description)
            progress.start(check.name, check.count())
            check.run(result, progress)
            progress.finish()
            report.checks.append(result)
    report.duration_seconds = time.monotonic() - started
    return report


def reconcile_and_record(*, trigger: str, progress: Progress | None = None) -> ReconciliationReport:
    """Run every check and keep the result as a ``ReconciliationRun``."""
    report = reconcile(progress=progress)
    ReconciliationRun.objects.create(
        started_at=report.started_at,
        duration_seconds=report.duration_seconds,
        ok=report.ok,
        mismatch_count=report.mismatch_count,
        trigger=trigger,
        report=report.as_dict(),
    )
    return report
