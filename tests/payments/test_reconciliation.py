"""reconcile_ledger's payment check (payments.reconciliation)."""

import uuid
from datetime import timedelta

import pytest
from django.db import IntegrityError, transaction
from django.utils import timezone

from ledger import services as ledger
from ledger.models import JournalEntry
from ledger.reconciliation import reconcile
from payments.engine import executor
from payments.models import Payment
from tests.payments.helpers import claim_batch, make_due, sweep
from tests.plans import index_scan

pytestmark = pytest.mark.django_db


def schedule(client, n=1, **overrides):
    return [client.schedule(**overrides).json()["payment_id"] for _ in range(n)]


def _payment_check(progress=None) -> dict:
    report = reconcile(progress=progress) if progress else reconcile()
    return next(c for c in report.as_dict()["checks"] if c["name"] == "payments_exactly_once")


@pytest.mark.postgres
def test_reconcile_orphan_check_uses_the_entry_index_with_stale_statistics(alice):
    """Right after a drain, before autovacuum re-analyzes, PostgreSQL believes no
    payment is COMPLETED and no ``payment:`` entry exists. The orphan check must
    still look each entry's payment up by the unique journal_entry_id index, not
    rescan COMPLETED payments per entry (hours at 100,000 payments)."""
    from django.db import connection, transaction

    from payments.reconciliation import orphan_entries
    from tests.payments.helpers import bulk_schedule

    ids = bulk_schedule(
        sources=[alice.account.pk],
        targets=[alice.other_account.pk],
        count=300,
        amount=1,
        due_at=timezone.now() - timedelta(seconds=1),
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE payments_payment")
        cursor.execute("ANALYZE ledger_journalentry")
    with transaction.atomic():
        claims = claim_batch(1_000)
    executor.execute_chunk([(c.payment_id, c.fence) for c in claims])
    assert Payment.objects.filter(pk__in=ids, status="COMPLETED").count() == 300

    sql, params = orphan_entries().query.sql_with_params()
    with connection.cursor() as cursor:
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        plan = cursor.fetchone()[0][0]["Plan"]
    assert index_scan(plan, "payments_one_per_entry") is not None, plan
    assert index_scan(plan, "payments_unfinished_status_due") is None, plan
    assert list(orphan_entries()) == []
    assert reconcile().ok


def test_one_payment_per_entry_however_many_have_none(alice, monkeypatch):
    """``payments_one_per_entry`` is a partial unique index (the rows with an
    entry): the payments without one — every PENDING and QUEUED payment — are
    not in it, so any number of them coexist, and a second payment pointing at
    an entry that is already a payment's is refused as before."""
    ids = schedule(alice, 4)
    make_due(*ids[:2])
    _, published = sweep(monkeypatch)
    assert sorted(executor.execute_chunk(published.items()).completed) == sorted(ids[:2])
    first, second, *waiting = ids
    assert Payment.objects.filter(pk__in=waiting, journal_entry__isnull=True).count() == 2
    entry = Payment.objects.get(pk=first).journal_entry_id
    with pytest.raises(IntegrityError), transaction.atomic():
        Payment.objects.filter(pk=second).update(journal_entry_id=entry)
    assert Payment.objects.get(pk=second).journal_entry_id != entry


def test_reconcile_names_a_completed_payment_whose_entry_is_not_its_own(alice, monkeypatch):
    """The corruption the check exists for: a COMPLETED payment pointing at
    another entry (a bad manual fix), which leaves its own ``payment:`` entry
    belonging to no payment."""
    ids = schedule(alice, 2)
    make_due(*ids)
    _, published = sweep(monkeypatch)
    assert sorted(executor.execute_chunk(published.items()).completed) == sorted(ids)
    clean = _payment_check()
    assert (clean["ok"], clean["rows_checked"], clean["mismatches"]) == (True, 2, [])

    broken, _ = ids
    own = JournalEntry.objects.get(reference=f"payment:{broken}")
    other = ledger.transfer_post(
        from_account_id=alice.account.pk,
        to_account_id=alice.other_account.pk,
        amount=1,
        reference="manual fix",
    )
    Payment.objects.filter(pk=broken).update(journal_entry=other)
    found = _payment_check()
    assert found == {
        "name": "payments_exactly_once",
        "description": "every COMPLETED payment has exactly one journal entry "
        "(payment:<id>); no other has one",
        "ok": False,
        "rows_checked": 2,
        "mismatch_count": 2,
        "mismatches": [
            {
                "message": f"payment {broken}: COMPLETED but its entry is 'manual fix'",
                "payment_id": broken,
                "reference": "manual fix",
            },
            {
                "message": f"entry {own.pk} (payment:{broken}) belongs to no COMPLETED payment",
                "entry_id": own.pk,
                "reference": f"payment:{broken}",
            },
        ],
    }


@pytest.mark.parametrize(("count", "advances"), [(5_001, [5_000, 1]), (5_000, [5_000, 0])])
def test_reconcile_payment_check_reports_progress_in_chunks_of_5000(alice, count, advances):
    """5,001 COMPLETED payments: one chunk of 5,000 advanced inside the loop, once
    5,000 rows are checked (not before), and the one left over after it; 5,000:
    the chunk inside the loop at the 5,000th row (a chunk at row 5,001 gave the
    same calls for 5,001 rows)."""
    from tests.ledger.test_reconcile import Recorder

    now = timezone.now()
    with transaction.atomic():  # entries without postings: rolled back before any COMMIT
        pids = [uuid.uuid4() for _ in range(count)]
        entries = JournalEntry.objects.bulk_create(
            JournalEntry(kind="transfer", reference=f"payment:{pid}") for pid in pids
        )
        Payment.objects.bulk_create(
            Payment(
                id=pid,
                from_account=alice.account,
                to_account=alice.other_account,
                owner=alice.user,
                amount=1,
                due_at=now,
                run_at=now,
                partition=0,
                status="COMPLETED",
                executed_at=now,
                journal_entry=entry,
            )
            for pid, entry in zip(pids, entries, strict=True)
        )
        recorder = Recorder()
        found = _payment_check(recorder)
        transaction.set_rollback(True)
    assert (found["ok"], found["rows_checked"]) == (True, count)
    start = recorder.calls.index(("start", "payments_exactly_once", count))
    end = recorder.calls.index(("finish",), start)
    assert recorder.calls[start + 1 : end] == [("advance", n) for n in advances]


def by_payment(mismatch: dict) -> str:
    return mismatch["payment_id"]


def _holds_check() -> dict:
    return next(c for c in reconcile().as_dict()["checks"] if c["name"] == "payments_holds")


def test_reconcile_reports_a_hold_left_active_on_a_finished_payment(alice, monkeypatch):
    """The executor once completed a payment whose entry was already posted and left
    its hold active: the amount held for ever, and every ledger check passed (held
    still equalled the sum of active holds)."""
    from ledger.models import Hold

    done, cancelled, _pending = schedule(alice, 3)
    alice.api.post(f"/api/v1/payments/{cancelled}/cancel")
    make_due(done)
    _, published = sweep(monkeypatch)
    executor.execute_chunk(published.items())
    check = _holds_check()
    assert check["ok"] and check["rows_checked"] == 1  # the pending one
    expected = []
    for pid, status in ((done, "COMPLETED"), (cancelled, "CANCELLED")):
        hold_id = Payment.objects.get(pk=pid).hold_id
        Hold.objects.filter(pk=hold_id).update(status="active")
        expected.append(
            {
                "message": f"payment {pid}: {status} but its hold {hold_id} is still active",
                "payment_id": pid,
                "status": status,
                "hold_id": hold_id,
            }
        )
    check = _holds_check()
    assert not check["ok"]
    assert sorted(check["mismatches"], key=by_payment) == sorted(expected, key=by_payment)


def test_reconcile_reports_an_open_payment_without_an_active_hold(alice):
    pending, other = schedule(alice, 2)
    from ledger.models import Hold

    Hold.objects.filter(pk=Payment.objects.get(pk=pending).hold_id).update(status="released")
    released = Payment.objects.get(pk=pending).hold_id
    Payment.objects.filter(pk=other).update(hold=None)
    check = _holds_check()
    assert not check["ok"] and check["rows_checked"] == 2
    expected = [
        {
            "message": f"payment {pending}: PENDING but its hold is released",
            "payment_id": pending,
            "status": "PENDING",
            "hold_id": released,
        },
        {
            "message": f"payment {other}: PENDING but its hold is missing",
            "payment_id": other,
            "status": "PENDING",
            "hold_id": None,
        },
    ]
    assert sorted(check["mismatches"], key=by_payment) == sorted(expected, key=by_payment)
