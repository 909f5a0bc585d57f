import json
import threading

import pytest
from django.core.management import CommandError, call_command
from django.db import IntegrityError, connection, transaction

from ledger import services as ledger
from ledger.models import Account, Hold, JournalEntry, ReconciliationRun
from ledger.reconciliation import (
    CHECKS,
    Check,
    CheckResult,
    Mismatch,
    Progress,
    id_ranges,
    reconcile,
    reconcile_and_record,
    register_check,
)
from tests.factories import AccountFactory

pytestmark = pytest.mark.django_db


@pytest.fixture
def books():
    a, b = AccountFactory(funded=1_000), AccountFactory(funded=50)
    ledger.transfer_post(from_account_id=a.pk, to_account_id=b.pk, amount=300)
    ledger.hold_place(account_id=a.pk, amount=100)
    return a, b


def run(*args):
    from io import StringIO

    out = StringIO()
    try:
        call_command("reconcile_ledger", "--no-progress", *args, stdout=out)
    except CommandError as exc:
        return exc.returncode, out.getvalue()
    return 0, out.getvalue()


def raw(statement, params):
    with connection.cursor() as cursor:
        cursor.execute(statement, params)


def test_healthy_ledger_exits_zero(books):
    code, out = run()
    assert code == 0
    assert "Ledger reconciled" in out
    code, out = run("--json")
    report = json.loads(out)
    assert code == 0 and report["ok"] is True and report["mismatch_count"] == 0
    assert {c["name"] for c in report["checks"]} >= {
        "entries_balanced",
        "books_balanced",
        "accounts_consistent",
    }
    accounts = next(c for c in report["checks"] if c["name"] == "accounts_consistent")
    assert accounts["rows_checked"] >= 3


def test_corrupted_balance_exits_nonzero_naming_the_account(books):
    a, _ = books
    raw("UPDATE ledger_account SET balance = balance + 5 WHERE id = %s", [a.pk])
    code, out = run()
    assert code == 1
    assert f"account {a.pk}: balance 705 != sum of postings 700" in out
    assert "sum of all account balances is 5" in out
    code, out = run("--json")
    report = json.loads(out)
    assert code == 1 and report["ok"] is False
    named = [
        m["account_id"] for c in report["checks"] for m in c["mismatches"] if "account_id" in m
    ]
    assert a.pk in named


def test_corrupted_held_amount_is_found(books):
    a, _ = books
    raw("UPDATE ledger_account SET held = 0 WHERE id = %s", [a.pk])
    code, out = run()
    assert code == 1
    assert f"account {a.pk}: held 0 != sum of active holds 100" in out


@pytest.mark.postgres
def test_unbalanced_entry_is_found(books):
    """Never committed (the trigger would refuse at COMMIT), but visible to the audit."""
    a, _ = books
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(
            "INSERT INTO ledger_journalentry (kind, description, created_at)"
            " VALUES ('transfer', '', now()) RETURNING id"
        )
        entry_id = cursor.fetchone()[0]
        cursor.execute(
            "INSERT INTO ledger_posting (entry_id, account_id, amount, balance_after)"
            " VALUES (%s, %s, 7, 0)",
            [entry_id, a.pk],
        )
        code, out = run()
        transaction.set_rollback(True)  # drop the queued trigger check with the rows
    assert code == 1
    assert f"entry {entry_id}: 1 postings summing to 7" in out


@pytest.fixture
def completed_payments():
    """Two payments executed by the real executor: COMPLETED, each with its entry."""
    from datetime import timedelta

    from django.utils import timezone

    from payments.engine import executor
    from payments.models import Payment
    from tests.payments.helpers import bulk_schedule, claim_batch

    source, target = AccountFactory(funded=1_000), AccountFactory()
    ids = bulk_schedule(
        sources=[source.pk],
        targets=[target.pk],
        count=2,
        amount=10,
        due_at=timezone.now() - timedelta(seconds=1),
    )
    with transaction.atomic():
        claims = claim_batch(10)
    executor.execute_chunk([(c.payment_id, c.fence) for c in claims])
    payments = list(Payment.objects.filter(pk__in=ids).order_by("pk"))
    assert [p.status for p in payments] == ["COMPLETED", "COMPLETED"]
    return payments


def payment_mismatches(report):
    (check,) = [c for c in report["checks"] if c["name"] == "payments_exactly_once"]
    return check["mismatches"]


@pytest.mark.postgres  # raw SQL against the PostgreSQL CHECK constraints
def test_payment_entry_relation_corrupted_is_found(completed_payments):
    """DESIGN §3 invariant 3 — every COMPLETED payment has exactly one journal entry,
    its own ``payment:<id>``, and no other payment has one — audited on rows the
    database constraints still allow."""
    first, second = completed_payments
    assert run()[0] == 0
    # Nulling a COMPLETED payment's entry is refused by the database itself.
    with pytest.raises(IntegrityError), transaction.atomic():
        raw("UPDATE payments_payment SET journal_entry_id = NULL WHERE id = %s", [first.pk])

    # 1. a COMPLETED payment pointing at another entry (a deposit without a
    #    reference, a transfer with one): it is named, and its own entry is an orphan
    deposit = JournalEntry.objects.filter(kind="deposit").order_by("pk").first()
    source = first.from_account_id
    transfer = ledger.transfer_post(
        from_account_id=source, to_account_id=second.to_account_id, amount=1, reference="manual:42"
    )
    for wrong in (deposit, transfer):
        raw(
            "UPDATE payments_payment SET journal_entry_id = %s WHERE id = %s",
            [wrong.pk, first.pk],
        )
        code, out = run("--json")
        report = json.loads(out)
        assert code == 1 and report["ok"] is False
        assert [c["name"] for c in report["checks"] if not c["ok"]] == ["payments_exactly_once"]
        assert payment_mismatches(report) == [
            {
                "message": f"payment {first.pk}: COMPLETED but its entry is {wrong.reference!r}",
                "payment_id": str(first.pk),
                "reference": wrong.reference,
            },
            {
                "message": f"entry {first.journal_entry_id} (payment:{first.pk}) "
                "belongs to no COMPLETED payment",
                "entry_id": first.journal_entry_id,
                "reference": f"payment:{first.pk}",
            },
        ]
    raw(
        "UPDATE payments_payment SET journal_entry_id = %s WHERE id = %s",
        [first.journal_entry_id, first.pk],
    )
    assert run()[0] == 0

    # 2. money moved, but the payment says FAILED (its entry unlinked)
    raw(
        "UPDATE payments_payment SET status = 'FAILED', journal_entry_id = NULL WHERE id = %s",
        [second.pk],
    )
    code, out = run()
    assert code == 1
    assert (
        f"entry {second.journal_entry_id} (payment:{second.pk}) belongs to no COMPLETED payment"
        in out
    )


LEDGER_CHECKS = ("entries_balanced", "books_balanced", "accounts_consistent")


class Recorder(Progress):
    """What a progress bar is told: each check's total, then every chunk done."""

    def __init__(self):
        self.calls = []

    def start(self, name, total):
        self.calls.append(("start", name, total))

    def advance(self, n):
        self.calls.append(("advance", n))

    def finish(self):
        self.calls.append(("finish",))

    def per_check(self) -> dict[str, tuple[int, int]]:
        """Check name → (total announced, sum of the chunks advanced)."""
        out, name = {}, None
        for call in self.calls:
            if call[0] == "start":
                name = call[1]
                out[name] = (call[2], 0)
            elif call[0] == "advance":
                out[name] = (out[name][0], out[name][1] + call[1])
            else:
                name = None
        return out


def checks(report) -> dict:
    return {c["name"]: c for c in report.as_dict()["checks"]}


def assert_progress_matches(recorder, report):
    """Every check announced what it then visited, and advanced by exactly that."""
    assert [c[1] for c in recorder.calls if c[0] == "start"] == [c.name for c in report.checks]
    assert recorder.calls.count(("finish",)) == len(report.checks)
    for check in report.checks:
        assert recorder.per_check()[check.name] == (check.rows_checked, check.rows_checked)


def test_report_lists_each_mismatch_with_its_numbers(books):
    damaged = AccountFactory(funded=10)
    raw("UPDATE ledger_account SET balance = balance + 5 WHERE id = %s", [damaged.pk])
    holder = AccountFactory(funded=20)
    ledger.hold_place(account_id=holder.pk, amount=5)
    raw("UPDATE ledger_account SET held = 0 WHERE id = %s", [holder.pk])
    recorder = Recorder()
    report = reconcile(progress=recorder)

    found = checks(report)
    assert found["accounts_consistent"] == {
        "name": "accounts_consistent",
        "description": "balance = sum of postings = latest balance_after; held = sum of "
        "active holds; available >= 0 unless allow_negative",
        "ok": False,
        "rows_checked": Account.objects.count(),
        "mismatch_count": 3,
        "mismatches": [
            {
                "message": f"account {damaged.pk}: balance 15 != sum of postings 10",
                "account_id": damaged.pk,
                "balance": 15,
                "sum_postings": 10,
            },
            {
                "message": f"account {damaged.pk}: balance 15 != balance_after 10 "
                "of its latest posting",
                "account_id": damaged.pk,
                "balance": 15,
                "last_balance_after": 10,
            },
            {
                "message": f"account {holder.pk}: held 0 != sum of active holds 5",
                "account_id": holder.pk,
                "held": 0,
                "sum_active_holds": 5,
            },
        ],
    }
    assert found["books_balanced"] == {
        "name": "books_balanced",
        "description": "all account balances (issuance included) and all postings sum to zero",
        "ok": False,
        "rows_checked": 1,
        "mismatch_count": 1,
        "mismatches": [{"message": "sum of all account balances is 5, not 0", "sum_balances": 5}],
    }
    assert found["entries_balanced"] == {
        "name": "entries_balanced",
        "description": "every journal entry has two or more postings summing to zero",
        "ok": True,
        "rows_checked": JournalEntry.objects.count(),
        "mismatch_count": 0,
        "mismatches": [],
    }
    whole = report.as_dict()
    assert (whole["ok"], whole["mismatch_count"]) == (False, 4)
    assert whole["started_at"] == report.started_at.isoformat()
    assert 0 <= whole["duration_seconds"] < 60
    assert whole["duration_seconds"] == round(report.duration_seconds, 3)
    assert_progress_matches(recorder, report)


def test_an_empty_ledger_is_reconciled():
    """No accounts, entries or postings at all: every sum is zero, not NULL."""
    Hold.objects.all().delete()
    Account.objects.all().delete()
    report = reconcile()
    assert report.ok, report.as_dict()
    assert {n: c["rows_checked"] for n, c in checks(report).items() if n in LEDGER_CHECKS} == {
        "entries_balanced": 0,
        "books_balanced": 1,
        "accounts_consistent": 0,
    }


def test_checks_walk_every_row_across_id_chunks(books):
    """Rows are read in primary-key ranges of 5,000: each row exactly once, also
    one at the very end of a range or alone in the last."""
    base = Account.objects.order_by("-pk").first().pk + 10_000
    spread = [AccountFactory(id=base + offset) for offset in (0, 4_999, 5_000, 10_000)]
    for account in (spread[0], spread[2], spread[3]):
        raw("UPDATE ledger_account SET balance = 1 WHERE id = %s", [account.pk])
    recorder = Recorder()
    with transaction.atomic():  # entries without postings: rolled back before any COMMIT
        entries = [
            JournalEntry.objects.create(id=base + offset, kind="transfer") for offset in (0, 5_000)
        ]
        report = reconcile(progress=recorder)
        found = checks(report)
        entry_count = JournalEntry.objects.count()
        transaction.set_rollback(True)
    accounts = found["accounts_consistent"]
    assert accounts["rows_checked"] == Account.objects.count()
    assert [m["account_id"] for m in accounts["mismatches"]] == [
        spread[0].pk,
        spread[2].pk,
        spread[3].pk,
    ]
    assert found["entries_balanced"]["rows_checked"] == entry_count
    assert found["entries_balanced"]["mismatches"] == [
        {
            "message": f"entry {entry.pk}: 0 postings summing to 0",
            "entry_id": entry.pk,
            "postings": 0,
            "sum": 0,
        }
        for entry in entries
    ]
    assert_progress_matches(recorder, report)


def test_id_ranges_cover_each_key_once():
    accounts = [AccountFactory() for _ in range(4)]
    first = accounts[0].pk
    qs = Account.objects.filter(pk__in=[a.pk for a in accounts])
    assert list(id_ranges(qs, chunk_size=2)) == [(first, first + 2), (first + 2, first + 4)]
    assert list(id_ranges(qs, chunk_size=3)) == [(first, first + 3), (first + 3, first + 6)]
    assert list(id_ranges(qs.filter(pk=first), chunk_size=5)) == [(first, first + 5)]
    assert list(id_ranges(qs.none())) == []


def test_mismatches_are_all_counted_but_100_listed():
    result = CheckResult("c", "d")
    for i in range(101):
        result.add(Mismatch(f"m{i}"))
    assert (result.mismatch_count, len(result.mismatches), result.ok) == (101, 100, False)
    assert result.mismatches[-1].message == "m99"


def test_a_check_is_registered_once_by_name():
    count, existing = len(CHECKS), CHECKS[0]
    register_check(Check(existing.name, "again", lambda: 0, lambda result, progress: None))
    assert len(CHECKS) == count and CHECKS[0] is existing
    extra = Check("extra", "added by a test", lambda: 0, lambda result, progress: None)
    try:
        assert register_check(extra) is extra
        assert len(CHECKS) == count + 1 and CHECKS[-1] is extra
    finally:
        CHECKS.remove(extra)


def test_a_recorded_run_keeps_its_trigger_and_report(books):
    recorder = Recorder()
    report = reconcile_and_record(trigger="beat", progress=recorder)
    run_row = ReconciliationRun.objects.get()
    assert (run_row.trigger, run_row.ok, run_row.mismatch_count) == ("beat", True, 0)
    assert run_row.started_at == report.started_at
    assert run_row.duration_seconds == report.duration_seconds
    assert run_row.report == json.loads(json.dumps(report.as_dict()))
    assert_progress_matches(recorder, report)


@pytest.mark.postgres
def test_available_below_zero_is_found_even_past_the_constraint(books):
    """The audit does not rely on the CHECK constraint it re-derives."""
    account = AccountFactory(funded=10)
    ledger.hold_place(account_id=account.pk, amount=8)
    raw("SET CONSTRAINTS ALL IMMEDIATE", [])  # no pending trigger events: ALTER may run
    raw("ALTER TABLE ledger_account DROP CONSTRAINT ledger_account_available_nonnegative", [])
    raw("UPDATE ledger_account SET balance = 5 WHERE id = %s", [account.pk])
    accounts = checks(reconcile())["accounts_consistent"]
    assert accounts["mismatches"][-1] == {
        "message": f"account {account.pk}: available -3 is negative",
        "account_id": account.pk,
        "balance": 5,
        "held": 8,
    }
    assert accounts["mismatch_count"] == 3  # and the sum of postings, the last balance_after


@pytest.mark.postgres
def test_entries_that_do_not_balance_are_each_named(books):
    """Never committed (the trigger would refuse at COMMIT), but visible to the audit."""
    a, b = books
    with transaction.atomic(), connection.cursor() as cursor:
        ids = []
        for postings in ([], [(a.pk, 5), (b.pk, -2)]):
            cursor.execute(
                "INSERT INTO ledger_journalentry (kind, description, created_at)"
                " VALUES ('transfer', '', now()) RETURNING id"
            )
            ids.append(cursor.fetchone()[0])
            for account_id, amount in postings:
                cursor.execute(
                    "INSERT INTO ledger_posting (entry_id, account_id, amount, balance_after)"
                    " VALUES (%s, %s, %s, 0)",
                    [ids[-1], account_id, amount],
                )
        found = checks(reconcile())
        transaction.set_rollback(True)
    assert found["entries_balanced"]["mismatches"] == [
        {
            "message": f"entry {ids[0]}: 0 postings summing to 0",
            "entry_id": ids[0],
            "postings": 0,
            "sum": 0,
        },
        {
            "message": f"entry {ids[1]}: 2 postings summing to 3",
            "entry_id": ids[1],
            "postings": 2,
            "sum": 3,
        },
    ]
    assert found["books_balanced"]["mismatches"] == [
        {"message": "sum of all postings is 3, not 0", "sum_postings": 3}
    ]


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_run_reads_one_snapshot_beside_live_writes():
    """A change committed while the run is under way is not half-seen: the
    accounts check still sees the books as they were when the run began."""
    account = AccountFactory(funded=100)

    class WriteDuringTheRun(Recorder):
        def start(self, name, total):
            super().start(name, total)
            if len(self.calls) == 1:
                thread = threading.Thread(target=corrupt)
                thread.start()
                thread.join(30)

    def corrupt():
        try:
            raw("UPDATE ledger_account SET balance = balance + 5 WHERE id = %s", [account.pk])
        finally:
            connection.close()

    assert reconcile(progress=WriteDuringTheRun()).ok
    after = checks(reconcile())["accounts_consistent"]["mismatches"]
    assert after[0]["message"] == f"account {account.pk}: balance 105 != sum of postings 100"
