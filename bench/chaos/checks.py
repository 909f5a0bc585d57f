"""What a chaos run must prove afterwards, as registered checks reported one by one.

The pattern of ``ledger/reconciliation.py``: every check is a named function
registered in :data:`CHECKS` (``@check(name, description)``) that fills a
:class:`CheckResult` — ``mismatch_count``, how many things it found wrong (a
check passes when it counted none), and the details to read them by. ``verify``
runs every registered check, in registration order, over one :class:`Context`
(the run's own record — direct inserts, API operations, frozen accounts,
recurring schedules — and the payments as the database has them at the end),
and returns each result and the run's numbers.

In the summary each check is ``{"name", "ok", "mismatches", "description",
**details}``.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cached_property
from typing import Any

from bench.harness.checks import exactly_once_check
from bench.harness.metrics import summarize
from bench.harness.processes import ROOT

EXPECTED_FAILURE_CODES = {"account_not_active"}  # plus dead letters, reported apart


@dataclass
class CheckResult:
    name: str
    description: str
    mismatch_count: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.mismatch_count == 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "ok": self.ok,
            "mismatches": self.mismatch_count,
            "description": self.description,
            **self.details,
        }


@dataclass(frozen=True)
class Check:
    name: str
    description: str
    run: Callable[[Context, CheckResult], None]


CHECKS: list[Check] = []


def check(name: str, description: str):
    """Register the decorated function as a check (idempotent by name)."""

    def register(function: Callable[[Context, CheckResult], None]):
        if all(c.name != name for c in CHECKS):
            CHECKS.append(Check(name, description, function))
        return function

    return register


class Context:
    """What the checks read: the run's record and the final payments (read once)."""

    def __init__(self, run) -> None:
        from bench.harness.app import Payment

        self.run = run
        # pk -> (status, error_code, due_at, executed_at, to_account_id, chaos_key, recurring_id)
        rows = Payment.objects.values_list(
            "pk",
            "status",
            "error_code",
            "due_at",
            "executed_at",
            "to_account_id",
            "metadata__chaos_key",
            "recurring_id",
        )
        self.payments = {str(row[0]): row[1:] for row in rows}
        self.ops = [op for stream in run.streams for op in stream.ops]
        self.schedule_ops = [op for op in self.ops if op["op"] == "schedule"]

    @cached_property
    def exactly_once(self) -> dict:
        return exactly_once_check()

    @cached_property
    def by_key(self) -> Counter:
        """Payments per Idempotency-Key (``metadata.chaos_key``)."""
        return Counter(row[5] for row in self.payments.values() if row[5])


def verify(run) -> tuple[list[dict], dict]:
    """Run every registered check; return their results (as dicts) and the run's numbers."""
    context = Context(run)
    results = []
    for registered in CHECKS:
        result = CheckResult(registered.name, registered.description)
        registered.run(context, result)
        results.append(result.as_dict())
    return results, stats(context)


# ---------------------------------------------------------------- helpers
def _payment_story(pids: list[str], limit: int = 20) -> list[dict]:
    from bench.harness.app import Payment, PaymentAttempt, PaymentEvent

    stories = []
    for payment in Payment.objects.filter(pk__in=pids[:limit]):
        stories.append(
            {
                "payment_id": str(payment.pk),
                "status": payment.status,
                "error_code": payment.error_code or None,
                "attempts": payment.attempts,
                "fence": payment.fence,
                "due_at": payment.due_at.isoformat(),
                "run_at": payment.run_at.isoformat(),
                "lease_expires_at": payment.lease_expires_at.isoformat()
                if payment.lease_expires_at
                else None,
                "events": [
                    f"{e.created_at:%H:%M:%S.%f} {e.type} {e.from_status}->{e.to_status} "
                    f"f={e.fence}"
                    for e in PaymentEvent.objects.filter(payment=payment).order_by("id")
                ],
                "tries": [
                    f"#{a.number} f={a.fence} {a.outcome} {a.error_code} {a.worker}"
                    for a in PaymentAttempt.objects.filter(payment=payment).order_by("id")
                ],
            }
        )
    return stories


def _uuid(pid: str):
    import uuid

    return uuid.UUID(pid)


# ---------------------------------------------------------------- the checks
@check("all_terminal", "every payment is terminal (COMPLETED, FAILED or CANCELLED)")
def _all_terminal(ctx: Context, result: CheckResult) -> None:
    from bench.harness.app import TERMINAL_STATUSES

    open_ids = [pid for pid, row in ctx.payments.items() if row[0] not in TERMINAL_STATUSES]
    result.mismatch_count = len(open_ids)
    result.details = {"open": len(open_ids), "stuck": _payment_story(open_ids)}


@check(
    "no_duplicate_execution",
    "one journal entry, one succeeded attempt and one executed event per COMPLETED payment",
)
def _no_duplicate_execution(ctx: Context, result: CheckResult) -> None:
    from django.db.models import Count

    from bench.harness.app import PaymentAttempt, PaymentEvent

    eo = ctx.exactly_once
    succeeded = dict(
        PaymentAttempt.objects.filter(outcome="succeeded")
        .values("payment_id")
        .annotate(n=Count("id"))
        .values_list("payment_id", "n")
    )
    executed_events = dict(
        PaymentEvent.objects.filter(type="executed")
        .values("payment_id")
        .annotate(n=Count("id"))
        .values_list("payment_id", "n")
    )
    completed = {pid for pid, row in ctx.payments.items() if row[0] == "COMPLETED"}
    bad_attempts = [
        pid
        for pid in ctx.payments
        if succeeded.get(_uuid(pid), 0) != (1 if pid in completed else 0)
        or executed_events.get(_uuid(pid), 0) != (1 if pid in completed else 0)
    ]
    result.mismatch_count = (
        eo["duplicates"]
        + eo["completed_without_entry"]
        + abs(eo["completed"] - eo["payment_entries"])
        + len(bad_attempts)
    )
    result.details = {
        "completed": eo["completed"],
        "payment_entries": eo["payment_entries"],
        "duplicate_entries": eo["duplicates"],
        "attempt_or_event_mismatch": len(bad_attempts),
        "examples": _payment_story(bad_attempts),
    }


@check("none_executed_early", "no payment executed before its due time (database clock)")
def _none_executed_early(ctx: Context, result: CheckResult) -> None:
    early = ctx.exactly_once["executed_early"]
    result.mismatch_count = early
    result.details = {"early": early}


@check(
    "none_lost",
    "every direct insert and every API 201 exists; no refused request created a payment",
)
def _none_lost(ctx: Context, result: CheckResult) -> None:
    missing_direct = [pid for pid in ctx.run.direct_ids if pid not in ctx.payments]
    lost, phantom = [], []
    for op in ctx.schedule_ops:
        n = ctx.by_key.get(op["key"], 0)
        if op["outcome"] == "ok" and (op["payment_id"] not in ctx.payments or n != 1):
            lost.append(op)
        if op["outcome"] == "refused" and n:
            phantom.append(op)
    unknown = [op for op in ctx.schedule_ops if op["outcome"] == "unknown"]
    result.mismatch_count = len(missing_direct) + len(lost) + len(phantom)
    result.details = {
        "direct_inserted": len(ctx.run.direct_ids),
        "direct_missing": len(missing_direct),
        "api_acknowledged": sum(op["outcome"] == "ok" for op in ctx.schedule_ops),
        "api_acknowledged_missing": lost[:20],
        "api_refused_but_created": phantom[:20],
        "api_unknown_outcome": len(unknown),
        "api_unknown_created": sum(ctx.by_key.get(op["key"], 0) for op in unknown),
    }


@check("one_payment_per_idempotency_key", "no Idempotency-Key produced two payments")
def _one_payment_per_key(ctx: Context, result: CheckResult) -> None:
    duplicated = [op["key"] for op in ctx.schedule_ops if ctx.by_key.get(op["key"], 0) > 1]
    keys_wrong = {key for key, n in ctx.by_key.items() if n != 1} | set(duplicated)
    result.mismatch_count = len(keys_wrong)
    result.details = {"keys_with_payments": len(ctx.by_key), "duplicated": duplicated[:20]}


@check("underfunded_requests_refused", "every request from an account without funds refused")
def _underfunded_refused(ctx: Context, result: CheckResult) -> None:
    expected_refusals = [
        op for op in ctx.schedule_ops if op["kind"] == "insufficient" and op["outcome"] != "unknown"
    ]
    wrong = [op for op in expected_refusals if op["code"] != "insufficient_funds"]
    result.mismatch_count = len(wrong)
    result.details = {"requests": len(expected_refusals), "wrong": wrong[:10]}


@check("cancel_answers_hold", "a cancel answered 200 ended CANCELLED; one refused did not")
def _cancel_answers_hold(ctx: Context, result: CheckResult) -> None:
    wrong = []
    for op in ctx.ops:
        row = ctx.payments.get(op["payment_id"])
        if op["op"] != "cancel" or row is None:
            continue
        if op["status"] == 200 and (row[0] != "CANCELLED" or op["answer_status"] != "CANCELLED"):
            wrong.append({**op, "final": row[0]})
        if op["code"] == "payment_not_cancellable" and row[0] == "CANCELLED":
            wrong.append({**op, "final": row[0]})
    cancels = [op for op in ctx.ops if op["op"] == "cancel"]
    result.mismatch_count = len(wrong)
    result.details = {
        "requests": len(cancels),
        "by_answer": dict(Counter(str(op["code"] or op["status"]) for op in cancels)),
        "wrong": wrong[:20],
    }


@check("change_answers_hold", "a change answered 200 is the payment's final due time and amount")
def _change_answers_hold(ctx: Context, result: CheckResult) -> None:
    from bench.harness.app import Payment

    wrong = []
    for op in ctx.ops:
        row = ctx.payments.get(op["payment_id"])
        if op["op"] == "change" and row is not None and op["status"] == 200:
            payment = Payment.objects.get(pk=op["payment_id"])
            answered = datetime.fromisoformat(op["answer_scheduled_time"])
            if abs((payment.due_at - answered).total_seconds()) > 0.001 or (
                payment.amount != op["answer_amount"]
            ):
                wrong.append({**op, "final_due": payment.due_at.isoformat()})
    changes = [op for op in ctx.ops if op["op"] == "change"]
    result.mismatch_count = len(wrong)
    result.details = {
        "requests": len(changes),
        "by_answer": dict(Counter(str(op["code"] or op["status"]) for op in changes)),
        "wrong": wrong[:20],
    }


@check(
    "failures_expected",
    "FAILED only for an expected reason; nothing paid into an account after it was frozen",
)
def _failures_expected(ctx: Context, result: CheckResult) -> None:
    from bench.harness.app import DEAD_LETTER_CODE

    payments = ctx.payments
    doomed = {d["account_id"]: datetime.fromisoformat(d["frozen_at"]) for d in ctx.run.doomed}
    unexpected_failures = [
        pid
        for pid, row in payments.items()
        if row[0] == "FAILED" and row[1] not in EXPECTED_FAILURE_CODES | {DEAD_LETTER_CODE}
    ]
    wrong_reason = [
        pid
        for pid, row in payments.items()
        if row[0] == "FAILED" and row[1] == "account_not_active" and row[4] not in doomed
    ]
    doomed_completed = [
        pid
        for pid, row in payments.items()
        if row[4] in doomed and row[2] > doomed[row[4]] and row[0] == "COMPLETED"
    ]
    result.mismatch_count = len(unexpected_failures) + len(wrong_reason) + len(doomed_completed)
    result.details = {
        "failed_by_code": dict(Counter(row[1] for row in payments.values() if row[0] == "FAILED")),
        "unexpected": _payment_story(unexpected_failures + wrong_reason),
        "paid_into_frozen_account": _payment_story(doomed_completed),
        "doomed_due_after_freeze": sum(
            1 for row in payments.values() if row[4] in doomed and row[2] > doomed[row[4]]
        ),
    }


@check("no_dead_letters", "no payment dead-lettered (unless --allow-dead-letters)")
def _no_dead_letters(ctx: Context, result: CheckResult) -> None:
    from bench.harness.app import DEAD_LETTER_CODE

    dead = [
        pid
        for pid, row in ctx.payments.items()
        if row[0] == "FAILED" and row[1] == DEAD_LETTER_CODE
    ]
    allowed = ctx.run.args.allow_dead_letters
    result.mismatch_count = 0 if allowed else len(dead)
    result.details = {
        "dead_letters": len(dead),
        "allowed": allowed,
        "examples": _payment_story(dead, 10),
    }


@check(
    "holds_settled",
    "no active hold or held funds left; holds captured by their own entry or released",
)
def _holds_settled(ctx: Context, result: CheckResult) -> None:
    from django.db.models import F, Q

    from bench.harness.app import Account, Hold, Payment

    active_holds = Hold.objects.filter(status="active").count()
    holds_wrong = Payment.objects.filter(
        (Q(status="COMPLETED") & (~Q(hold__status="captured") | ~Q(hold__entry=F("journal_entry"))))
        | (Q(status__in=["FAILED", "CANCELLED"]) & ~Q(hold__status="released"))
    ).count()
    held = Account.objects.exclude(held=0).count()
    result.mismatch_count = active_holds + holds_wrong + held
    result.details = {
        "active_holds": active_holds,
        "payments_with_wrong_hold": holds_wrong,
        "accounts_with_held_funds": held,
    }


@check(
    "balances_match_payments",
    "every balance = deposits + completed payments in - out; entries match their payments",
)
def _balances_match_payments(ctx: Context, result: CheckResult) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            WITH flows AS (
                SELECT from_account_id AS account_id, -amount AS delta
                  FROM payments_payment WHERE status = 'COMPLETED'
                UNION ALL
                SELECT to_account_id, amount FROM payments_payment WHERE status = 'COMPLETED'
                UNION ALL
                SELECT p.account_id, p.amount
                  FROM ledger_posting p JOIN ledger_journalentry e ON e.id = p.entry_id
                 WHERE e.kind = 'deposit'
            )
            SELECT a.id, a.balance, coalesce(sum(f.delta), 0)
              FROM ledger_account a LEFT JOIN flows f ON f.account_id = a.id
             GROUP BY a.id, a.balance
            HAVING a.balance <> coalesce(sum(f.delta), 0)
            """
        )
        balance_wrong = cursor.fetchall()
        cursor.execute(
            """
            SELECT count(*) FROM payments_payment pay
             WHERE pay.status = 'COMPLETED' AND NOT EXISTS (
                   SELECT 1 FROM ledger_posting d, ledger_posting c
                    WHERE d.entry_id = pay.journal_entry_id AND c.entry_id = pay.journal_entry_id
                      AND d.account_id = pay.from_account_id AND d.amount = -pay.amount
                      AND c.account_id = pay.to_account_id AND c.amount = pay.amount)
            """
        )
        entry_wrong = cursor.fetchone()[0]
    result.mismatch_count = len(balance_wrong) + entry_wrong
    result.details = {
        "accounts_wrong": [list(r) for r in balance_wrong[:20]],
        "entries_not_matching_payment": entry_wrong,
    }


@check("audit_trail_matches_status", "every payment's last audit event names its status")
def _audit_trail_matches_status(ctx: Context, result: CheckResult) -> None:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            """
            SELECT p.id, p.status, e.type, e.to_status
              FROM payments_payment p
              LEFT JOIN LATERAL (
                   SELECT type, to_status FROM payments_paymentevent
                    WHERE payment_id = p.id ORDER BY id DESC LIMIT 1) e ON true
             WHERE e.to_status IS DISTINCT FROM p.status
            """
        )
        trail_wrong = cursor.fetchall()
    result.mismatch_count = len(trail_wrong)
    result.details = {
        "mismatched": len(trail_wrong),
        "examples": [[str(r[0]), r[1], r[2], r[3]] for r in trail_wrong[:20]],
    }


@check(
    "recurring_occurrences",
    "recurring occurrences unique, a minute apart, one payment each; schedules cancelled",
)
def _recurring_occurrences(ctx: Context, result: CheckResult) -> None:
    from bench.harness.app import OccurrenceStatus, Payment, RecurringOccurrence

    recurring_detail = []
    schedules_wrong = 0
    for schedule in ctx.run.recurring:
        occurrences = list(
            RecurringOccurrence.objects.filter(recurring_id=schedule["id"])
            .order_by("scheduled_for")
            .values_list("scheduled_for", "status", "payment_id")
        )
        instants = [o[0] for o in occurrences]
        gaps = [
            f"{a.isoformat()} -> {b.isoformat()}"
            for a, b in itertools.pairwise(instants)
            if (b - a) != timedelta(seconds=60)
        ]
        scheduled = [o for o in occurrences if o[1] == OccurrenceStatus.SCHEDULED]
        paid = Payment.objects.filter(recurring_id=schedule["id"]).count()
        ok = (
            not gaps
            and len(set(instants)) == len(instants)
            and all(o[2] for o in scheduled)
            and paid == len(scheduled)
            and schedule.get("cancel", {}).get("status") == 200
        )
        schedules_wrong += not ok
        recurring_detail.append(
            {
                **schedule,
                "occurrences": dict(Counter(o[1] for o in occurrences)),
                "first": instants[0].isoformat() if instants else None,
                "last": instants[-1].isoformat() if instants else None,
                "gaps": gaps,
                "payments": paid,
                "payments_by_status": dict(
                    Counter(
                        Payment.objects.filter(recurring_id=schedule["id"]).values_list(
                            "status", flat=True
                        )
                    )
                ),
            }
        )
    result.mismatch_count = schedules_wrong
    result.details = {
        "occurrences": sum(sum(d["occurrences"].values()) for d in recurring_detail),
        "schedules": recurring_detail,
    }


@check("reconcile_ledger", "manage.py reconcile_ledger, as a separate process, is clean")
def _reconcile_ledger(ctx: Context, result: CheckResult) -> None:
    reconcile = subprocess.run(
        [sys.executable, "manage.py", "reconcile_ledger", "--json"],
        cwd=ROOT,
        env=ctx.run.service.env,
        capture_output=True,
        text=True,
        check=False,
    )
    try:
        report = json.loads(reconcile.stdout)
    except ValueError:
        report = {"stdout": reconcile.stdout[-2000:], "stderr": reconcile.stderr[-2000:]}
    failing = [c for c in report.get("checks", []) if c.get("mismatch_count")]
    clean = reconcile.returncode == 0 and report.get("ok") is True
    # its own count of mismatched rows; at least 1 when it failed without counting any
    result.mismatch_count = 0 if clean else max(1, report.get("mismatch_count") or 0)
    result.details = {
        "exit_code": reconcile.returncode,
        "mismatch_count": report.get("mismatch_count"),
        "failing_checks": failing,
    }


# ---------------------------------------------------------------- the numbers
def stats(ctx: Context) -> dict:
    """What the run did: payments by origin and status, lateness, the API traffic."""
    payments, ops, schedule_ops = ctx.payments, ctx.ops, ctx.schedule_ops
    lateness = [
        (row[3] - row[2]).total_seconds() for row in payments.values() if row[0] == "COMPLETED"
    ]
    origin = Counter(
        "recurring" if row[6] else "api" if row[5] else "direct" for row in payments.values()
    )
    return {
        "payments": len(payments),
        "by_origin": dict(origin),
        "by_status": dict(Counter(row[0] for row in payments.values())),
        "lateness_seconds": summarize(lateness, digits=3),
        "api": {
            "requests": dict(Counter(op["op"] for op in ops)),
            "schedule_by_kind": dict(Counter(op["kind"] for op in schedule_ops)),
            "outcomes": dict(Counter(f"{op['op']}:{op['outcome']}" for op in ops)),
            "retried_requests": sum(1 for op in ops if op["retries"]),
            "replayed_answers": sum(1 for op in ops if op["replayed"]),
            "retried_on": dict(Counter(r for op in ops for r in op["retried_on"])),
            "seconds_per_request": {
                name: summarize([op["seconds"] for op in ops if op["op"] == name], digits=3)
                for name in ("schedule", "cancel", "change")
            },
            "stream_errors": [s.error for s in ctx.run.streams if s.error],
        },
    }
