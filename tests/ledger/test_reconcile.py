import json

import pytest
from django.core.management import CommandError, call_command
from django.db import connection, transaction

from ledger import services as ledger
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
