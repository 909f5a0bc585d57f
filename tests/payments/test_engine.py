"""The durable timer in-process: sweep, lease, fence, executor, reaper (DESIGN §4.1)."""

import time
import uuid
from datetime import timedelta

import pytest
from django.db import transaction
from django.test import override_settings
from django.utils import timezone

from ledger import services as ledger
from ledger.models import Account, JournalEntry
from ledger.reconciliation import reconcile
from payments import transitions
from payments.clock import db_now
from payments.engine import executor, reaper, sweeper
from payments.models import Payment, PaymentAttempt, PaymentStatus
from tests.payments.helpers import capture_publish, claim_batch, make_due, sweep

pytestmark = pytest.mark.django_db


def schedule(client, n=1, **overrides):
    return [client.schedule(**overrides).json()["payment_id"] for _ in range(n)]


def balances(client):
    return [Account.objects.get(pk=a.pk).balance for a in (client.account, client.other_account)]


def test_sweep_claims_only_due_payments_and_publishes_to_partition_queue(alice, monkeypatch):
    due = schedule(alice, 3)
    future = schedule(alice, 1, delay_seconds=3600)
    make_due(*due)
    result, published = sweep(monkeypatch)
    assert result.claimed == 3
    partition = Payment.objects.get(pk=due[0]).partition
    assert {queue for queue, _, _ in published} == {f"payments.p{partition:02d}"}
    assert sorted(pid for pid, _ in published.items()) == sorted(due)
    for pid, fence in published.items():
        payment = Payment.objects.get(pk=pid)
        assert payment.status == "QUEUED" and payment.fence == fence == 1
        assert payment.attempts == 1 and payment.lease_expires_at > timezone.now()
        assert payment.events.filter(type="queued", actor="system").count() == 1
    assert Payment.objects.get(pk=future[0]).status == "PENDING"
    assert sweep(monkeypatch)[0].claimed == 0  # nothing twice


def test_lookahead_publishes_with_eta_not_early(alice, monkeypatch):
    (pid,) = schedule(alice)
    soon = timezone.now() + timedelta(milliseconds=600)
    Payment.objects.filter(pk=pid).update(due_at=soon, run_at=soon)
    result, published = sweep(monkeypatch)
    assert result.claimed == 1
    (_, _, countdown) = published[0]
    assert 0.3 < countdown <= 0.6
    # delivered now anyway (early): not executed, handed back
    outcome = executor.execute_chunk(published.items())
    assert outcome.completed == [] and [i[0] for i in outcome.not_due] == [pid]
    assert Payment.objects.get(pk=pid).status == "QUEUED"
    assert JournalEntry.objects.filter(reference=f"payment:{pid}").count() == 0


def test_executor_moves_money_once_and_records_history(alice, monkeypatch):
    ids = schedule(alice, 3, amount=100)
    make_due(*ids)
    _, published = sweep(monkeypatch)
    outcome = executor.execute_chunk(published.items())
    assert sorted(outcome.completed) == sorted(ids)
    assert balances(alice) == [9_700, 300]
    assert Account.objects.get(pk=alice.account.pk).held == 0
    for pid in ids:
        payment = Payment.objects.get(pk=pid)
        assert payment.status == "COMPLETED" and payment.executed_at >= payment.due_at
        assert payment.journal_entry.reference == f"payment:{pid}"
        assert payment.hold.status == "captured"
        attempt = PaymentAttempt.objects.get(payment=payment)
        assert (attempt.number, attempt.fence, attempt.outcome) == (1, 1, "succeeded")
        types = list(payment.events.order_by("pk").values_list("type", flat=True))
        assert types == ["scheduled", "queued", "executed"]
    # the same chunk delivered again: stale, nothing moves
    again = executor.execute_chunk(published.items())
    assert again.completed == [] and sorted(again.stale) == sorted(ids)
    assert balances(alice) == [9_700, 300]
    assert reconcile().ok


def test_old_fence_after_reap_is_fenced_out(alice, monkeypatch):
    (pid,) = schedule(alice)
    make_due(pid)
    _, first = sweep(monkeypatch)
    Payment.objects.filter(pk=pid).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert reaper.reap_leases().requeued == 1
    payment = Payment.objects.get(pk=pid)
    assert (payment.status, payment.fence) == ("PENDING", 2)
    make_due(pid)
    _, second = sweep(monkeypatch)
    assert second.items() == [(pid, 3)]
    assert executor.execute_chunk(first.items()).stale == [pid]  # old message
    assert executor.execute_chunk(second.items()).completed == [pid]
    assert executor.execute_chunk(second.items()).stale == [pid]  # duplicate
    assert JournalEntry.objects.filter(reference=f"payment:{pid}").count() == 1


def test_business_failure_fails_one_payment_and_releases_its_hold(alice, bob, monkeypatch):
    good = schedule(alice, 2, amount=10)
    (bad,) = schedule(alice, 1, amount=20, to_account_id=bob.account.pk)
    ledger.account_set_status(account_id=bob.account.pk, status="frozen")
    make_due(*good, bad)
    _, published = sweep(monkeypatch)
    outcome = executor.execute_chunk(published.items())
    assert sorted(outcome.completed) == sorted(good) and outcome.failed == [bad]
    payment = Payment.objects.get(pk=bad)
    assert (payment.status, payment.error_code) == ("FAILED", "account_not_active")
    assert payment.hold.status == "released" and payment.journal_entry is None
    assert Account.objects.get(pk=alice.account.pk).held == 0
    assert balances(alice) == [9_980, 20]
    assert reconcile().ok


def test_cancelled_while_queued_is_skipped(alice, monkeypatch):
    (pid,) = schedule(alice)
    make_due(pid)
    _, published = sweep(monkeypatch)
    assert alice.api.delete(f"/api/v1/payments/{pid}/cancel").status_code == 200
    assert executor.execute_chunk(published.items()).stale == [pid]
    assert balances(alice) == [10_000, 0]
    assert Payment.objects.get(pk=pid).status == "CANCELLED"


@override_settings(PAYMENT_MAX_ATTEMPTS=2)
def test_dead_letter_after_max_attempts(alice, monkeypatch):
    (pid,) = schedule(alice, amount=500)
    for _ in range(2):
        make_due(pid)
        sweep(monkeypatch)
        Payment.objects.filter(pk=pid).update(
            lease_expires_at=timezone.now() - timedelta(seconds=1)
        )
        reaper.reap_leases()
    payment = Payment.objects.get(pk=pid)
    assert (payment.status, payment.error_code, payment.attempts) == (
        "FAILED",
        "max_attempts_exceeded",
        2,
    )
    assert payment.hold.status == "released"
    assert Account.objects.get(pk=alice.account.pk).held == 0
    types = list(payment.events.order_by("pk").values_list("type", flat=True))
    assert types == ["scheduled", "queued", "lease_expired", "queued", "dead_lettered"]


def test_reaper_backs_off_repeated_failures(alice, monkeypatch):
    (pid,) = schedule(alice)
    make_due(pid, seconds_ago=100)
    sweep(monkeypatch)
    Payment.objects.filter(pk=pid).update(
        attempts=3, lease_expires_at=timezone.now() - timedelta(seconds=1)
    )
    reaper.reap_leases()
    payment = Payment.objects.get(pk=pid)
    assert payment.run_at > timezone.now() + timedelta(seconds=3)  # 2^(3-1) s
    assert payment.due_at < timezone.now()


def test_chunking_by_partition_size_and_spread(settings):
    settings.PAYMENT_CHUNK_SIZE = 2
    settings.PAYMENT_CHUNK_SPREAD_MS = 50
    t0 = timezone.now()
    claims = [
        transitions.Claimed("a", 1, 0, t0),
        transitions.Claimed("b", 1, 0, t0 + timedelta(milliseconds=10)),
        transitions.Claimed("c", 1, 0, t0 + timedelta(milliseconds=20)),
        transitions.Claimed("d", 1, 0, t0 + timedelta(milliseconds=500)),
        transitions.Claimed("e", 1, 3, t0),
    ]
    chunks = [
        (p, eta, [c.payment_id for c in chunk]) for p, eta, chunk in sweeper.chunk_claims(claims)
    ]
    assert chunks == [
        (0, t0 + timedelta(milliseconds=10), ["a", "b"]),
        (0, t0 + timedelta(milliseconds=20), ["c"]),
        (0, t0 + timedelta(milliseconds=500), ["d"]),
        (3, t0, ["e"]),
    ]


def test_overdue_claims_are_not_split_by_the_spread(settings):
    """A backlog (all already due) goes out in full-size chunks; payments not yet
    due still respect the spread, so none waits for a later one."""
    settings.PAYMENT_CHUNK_SIZE = 3
    settings.PAYMENT_CHUNK_SPREAD_MS = 50
    now = timezone.now()
    due = [now - timedelta(seconds=s) for s in (9, 6, 3, 1, 0)]
    claims = [transitions.Claimed(f"o{i}", 1, 0, d) for i, d in enumerate(due)]
    claims += [
        transitions.Claimed("f1", 1, 0, now + timedelta(milliseconds=100)),
        transitions.Claimed("f2", 1, 0, now + timedelta(milliseconds=400)),
    ]
    chunks = [[c.payment_id for c in chunk] for _, _, chunk in sweeper.chunk_claims(claims, now)]
    assert chunks == [["o0", "o1", "o2"], ["o3", "o4"], ["f1"], ["f2"]]
    # without "now" every gap counts, as before
    assert len(sweeper.chunk_claims(claims)) == 7


def _claim_and_age(n, claimed_seconds_ago, settings):
    with transaction.atomic():
        claims = claim_batch(n)
    ids = [c.payment_id for c in claims]
    Payment.objects.filter(pk__in=ids).update(
        lease_expires_at=db_now()
        + timedelta(seconds=settings.PAYMENT_LEASE_SECONDS - claimed_seconds_ago),
        run_at=db_now() - timedelta(seconds=claimed_seconds_ago),
    )
    return ids


def test_sweep_holds_back_while_live_claims_are_past_half_their_lease(alice, monkeypatch, settings):
    """Overload: claims that would wait longer than their lease in the queue are
    not made; the backlog stays PENDING (no expiries, no attempts spent). The
    oldest PAYMENT_LOST_CLAIMS_TOLERATED claims may be lost messages waiting
    for the reaper: on their own they neither stall the sweep nor count as lag."""
    settings.PAYMENT_LEASE_SECONDS = 60
    settings.PAYMENT_LOST_CLAIMS_TOLERATED = 1
    ids = schedule(alice, 4)
    make_due(*ids)
    _claim_and_age(1, 40, settings)  # one lost message, claimed 40 s ago
    assert sweeper.executor_state() == sweeper.ExecutorState(behind=False, lag=0.0)
    (waiting,) = _claim_and_age(1, 40, settings)  # a second one: the executors are behind
    state = sweeper.executor_state()
    assert state.behind and 39 < state.lag < 45
    result, _ = sweep(monkeypatch)
    assert result.backpressure and result.claimed == 0
    assert Payment.objects.filter(status="PENDING").count() == 2
    Payment.objects.filter(pk=waiting).update(
        lease_expires_at=db_now() + timedelta(seconds=50),  # claimed 10 s ago
        run_at=db_now() - timedelta(seconds=10),
    )
    result, _ = sweep(monkeypatch)
    assert not result.backpressure and result.claimed == 2 and 9 < result.lag < 15
    settings.PAYMENT_LOST_CLAIMS_TOLERATED = 0  # now the lost one counts
    assert sweeper.executor_state().behind


def test_lagging_executors_get_only_due_payments_in_full_chunks(alice, monkeypatch, settings):
    """While the executors' queue delay exceeds PAYMENT_CATCH_UP_LAG_MS the
    sweeper does not claim ahead (that would cut the next second into small
    messages queued behind the backlog); the lookahead resumes after."""
    settings.PAYMENT_LOST_CLAIMS_TOLERATED = 0
    settings.PAYMENT_CATCH_UP_LAG_MS = 250
    settings.PAYMENT_CHUNK_SPREAD_MS = 50
    waiting, *overdue = schedule(alice, 4)
    make_due(waiting, *overdue)
    ahead = schedule(alice, 2)
    soon = db_now() + timedelta(milliseconds=600)
    Payment.objects.filter(pk__in=ahead).update(due_at=soon, run_at=soon)
    Payment.objects.filter(pk=ahead[1]).update(
        due_at=soon + timedelta(milliseconds=200), run_at=soon + timedelta(milliseconds=200)
    )
    Payment.objects.filter(pk__in=overdue).update(run_at=db_now() + timedelta(hours=1))
    _claim_and_age(1, 2, settings)  # claimed 2 s ago, still waiting for a worker
    Payment.objects.filter(pk__in=overdue).update(run_at=db_now() - timedelta(seconds=1))
    state = sweeper.executor_state()
    assert not state.behind and 1.9 < state.lag < 3
    result, published = sweep(monkeypatch)
    assert result.catching_up and not result.backpressure
    assert (
        sorted(p for p, _ in published.items()) == sorted(overdue) and result.messages == 1
    )  # one full chunk
    assert set(Payment.objects.filter(pk__in=ahead).values_list("status", flat=True)) == {"PENDING"}
    executor.execute_chunk(published.items())  # the executors catch up
    executor.execute_chunk([(waiting, Payment.objects.get(pk=waiting).fence)])
    result, published = sweep(monkeypatch)
    assert not result.catching_up and sorted(p for p, _ in published.items()) == sorted(ahead)
    assert result.messages == 2  # not yet due: the spread applies again


def test_backpressure_stops_claiming(alice, monkeypatch, settings):
    settings.PAYMENT_MAX_QUEUED = 2
    ids = schedule(alice, 3)
    make_due(*ids)
    result, _ = sweep(monkeypatch)
    assert result.claimed == 2
    assert sweep(monkeypatch)[0].backpressure


def test_backlog_is_topped_up_in_whole_batches(alice, monkeypatch, settings):
    """With a backlog QUEUED the sweeper waits until a whole batch fits: topping up
    the few claims that just freed up would cut the backlog into tiny chunks."""
    settings.PAYMENT_MAX_QUEUED = 5
    settings.PAYMENT_SWEEP_BATCH = 3
    ids = schedule(alice, 7)
    make_due(*ids)
    result, published = sweep(monkeypatch)
    assert result.claimed == 3 and result.backpressure  # 2 would fit, not a batch
    first = next(iter(published.items()))
    executor.execute_chunk([first])  # one done: 2 QUEUED, room 3
    result, _ = sweep(monkeypatch)
    assert result.claimed == 3 and result.backpressure


def test_internal_execute_endpoint(alice, settings, monkeypatch):
    settings.INTERNAL_API_TOKEN = "s3cret"
    (pid,) = schedule(alice, amount=40)
    url = f"/api/v1/internal/payments/{pid}/execute"
    api = alice.api.__class__()
    body = {"execution_id": "op-1"}
    assert api.post(url, body, format="json").status_code == 404
    assert (
        api.post(url, body, format="json", headers={"X-Internal-Auth": "nope"}).status_code == 404
    )
    auth = {"X-Internal-Auth": "s3cret"}
    response = api.post(url, body, format="json", headers=auth)
    assert response.status_code == 409 and response.json()["error"]["code"] == "payment_not_due"
    make_due(pid)
    response = api.post(url, body, format="json", headers=auth)
    assert response.status_code == 200
    assert response.json()["status"] == "COMPLETED" and response.json()["execution_id"] == "op-1"
    again = api.post(url, body, format="json", headers=auth)
    assert again.status_code == 200 and again.json()["status"] == "COMPLETED"
    assert JournalEntry.objects.filter(reference=f"payment:{pid}").count() == 1
    assert balances(alice) == [9_960, 40]


def test_management_commands(alice, monkeypatch):
    from io import StringIO

    from django.core.management import call_command

    capture_publish(monkeypatch)
    ids = schedule(alice, 2)
    make_due(*ids)
    out = StringIO()
    call_command("sweep_due", "--json", stdout=out)
    assert '"claimed": 2' in out.getvalue()
    Payment.objects.update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    out = StringIO()
    call_command("reap_leases", "--json", stdout=out)
    assert '"requeued": 2' in out.getvalue()
    assert set(Payment.objects.values_list("status", flat=True)) == {PaymentStatus.PENDING}


def test_periodic_tasks_installed_by_migration():
    from django_celery_beat.models import PeriodicTask

    tasks = dict(PeriodicTask.objects.values_list("task", "interval__every"))
    assert tasks["payments.sweep"] == 1 and tasks["payments.reap_leases"] == 5
    queues = dict(PeriodicTask.objects.values_list("task", "queue"))
    assert {task for task, queue in queues.items() if queue == "timers"} == {
        "payments.sweep",
        "payments.reap_leases",
    }
    assert queues["payments.materialize_recurring"] == "recurring"
    assert queues["payments.retry_webhooks"] == "webhooks"


def test_timer_tasks_are_routed_to_their_own_queue():
    """The sweeper must not wait behind payment chunks, a materialiser run or a webhook:
    it and the reaper go to "timers", which the Procfile gives a worker of its own."""
    from scheduler_project.celery import app

    def queue(name):
        return app.amqp.router.route({}, name)["queue"].name

    assert queue("payments.sweep") == queue("payments.reap_leases") == "timers"
    assert queue("payments.materialize_recurring") == "recurring"
    assert queue("payments.retry_webhooks") == queue("payments.deliver_webhook") == "webhooks"
    assert queue("ledger.reconcile") == "default"


def _index_scan(plan: dict, index: str) -> dict | None:
    if plan.get("Index Name") == index:
        return plan
    for child in plan.get("Plans", []):
        if (found := _index_scan(child, index)) is not None:
            return found
    return None


def _explain(sql: str, params: dict) -> dict:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("ANALYZE payments_payment")
        cursor.execute("EXPLAIN (ANALYZE, FORMAT JSON) " + sql, params)
        return cursor.fetchone()[0][0]["Plan"]


@pytest.mark.postgres
def test_idle_sweep_and_reaper_do_not_scan_far_future_rows(alice):
    """The cutoff must be an index condition, not a filter over every pending row.

    ``clock_timestamp()`` is volatile, so PostgreSQL cannot use it to bound an
    index scan: an idle sweep read all pending rows (28 ms at 50,000, growing
    with the backlog). ``statement_timestamp()`` is stable and can.
    """
    from tests.payments.helpers import bulk_schedule

    far = timezone.now() + timedelta(days=30)
    bulk_schedule(
        sources=[alice.account.pk],
        targets=[alice.other_account.pk],
        count=500,
        amount=1,
        due_at=far,
    )
    plan = _explain(transitions._CLAIM_SQL, {"lookahead": 1, "limit": 2000, "lease": 60})
    scan = _index_scan(plan, "payments_pending_run_at")
    assert scan is not None and "run_at" in scan.get("Index Cond", ""), scan
    assert scan.get("Rows Removed by Filter", 0) == 0 and scan["Actual Rows"] == 0

    Payment.objects.update(status="QUEUED", lease_expires_at=far)
    plan = _explain(transitions._REQUEUE_SQL, {"max_attempts": 5, "limit": 10_000})
    scan = _index_scan(plan, "payments_queued_lease")
    assert scan is not None and "lease_expires_at" in scan.get("Index Cond", ""), scan
    assert scan.get("Rows Removed by Filter", 0) == 0 and scan["Actual Rows"] == 0
    assert Payment.objects.filter(status="QUEUED").count() == 500  # nothing claimed


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
    assert _index_scan(plan, "payments_payment_journal_entry_id_key") is not None, plan
    assert _index_scan(plan, "payments_status_due") is None, plan
    assert list(orphan_entries()) == []
    assert reconcile().ok


def test_catching_up_the_sweep_ticks_within_its_beat_interval(alice, monkeypatch, settings):
    """While catching up only due payments are claimed; the sweep task sweeps again
    every tick, so a payment falling due 300 ms into the tick is claimed in the same
    run, not at beat's next tick a second later. Once caught up it returns at once."""
    from payments import tasks

    settings.PAYMENT_LOST_CLAIMS_TOLERATED = 0
    settings.PAYMENT_CATCH_UP_LAG_MS = 250
    settings.PAYMENT_SWEEP_TICK_MS = 50
    settings.PAYMENT_SWEEP_WINDOW_SECONDS = 0.8
    waiting, soon = schedule(alice, 2)
    make_due(waiting)
    _claim_and_age(1, 2, settings)  # an executor backlog: claimed 2 s ago, still waiting
    due = db_now() + timedelta(milliseconds=300)
    Payment.objects.filter(pk=soon).update(due_at=due, run_at=due)
    published = capture_publish(monkeypatch)
    started = time.monotonic()
    result = tasks.sweep()
    assert result["claimed"] == 1 and published.items()[0][0] == soon
    assert Payment.objects.get(pk=soon).status == "QUEUED"
    assert time.monotonic() - started < 1.0  # within the beat interval
    # caught up: one sweep and back
    for pid in (waiting, soon):
        executor.execute_chunk([(pid, Payment.objects.get(pk=pid).fence)])
    runs = []
    real = tasks.sweep_once
    monkeypatch.setattr(tasks, "sweep_once", lambda: runs.append(1) or real())
    tasks.sweep()
    assert runs == [1]


def test_without_lookahead_the_sweep_ticks_within_its_beat_interval(alice, monkeypatch, settings):
    """With no lookahead nothing is ever claimed ahead of its time, so the sweep task
    keeps ticking through its window: a payment falling due 300 ms in is claimed in
    the same run."""
    from payments import tasks

    settings.PAYMENT_LOOKAHEAD_SECONDS = 0
    settings.PAYMENT_SWEEP_TICK_MS = 50
    settings.PAYMENT_SWEEP_WINDOW_SECONDS = 0.8
    (soon,) = schedule(alice, 1)
    due = db_now() + timedelta(milliseconds=300)
    Payment.objects.filter(pk=soon).update(due_at=due, run_at=due)
    published = capture_publish(monkeypatch)
    runs = []
    real = tasks.sweep_once
    monkeypatch.setattr(tasks, "sweep_once", lambda: runs.append(1) or real())
    result = tasks.sweep()
    assert result["claimed"] == 1 and published.items()[0][0] == soon
    assert len(runs) > 1
    assert Payment.objects.get(pk=soon).executed_at is None  # claimed, not executed early


# --- reconcile_ledger's payment check ------------------------------------------


def _payment_check(progress=None) -> dict:
    report = reconcile(progress=progress) if progress else reconcile()
    return next(c for c in report.as_dict()["checks"] if c["name"] == "payments_exactly_once")


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


def test_reconcile_payment_check_reports_progress_in_chunks_of_5000(alice):
    """Exactly 5,000 COMPLETED payments: one chunk advanced inside the loop, none after."""
    from tests.ledger.test_reconcile import Recorder

    now = timezone.now()
    with transaction.atomic():  # entries without postings: rolled back before any COMMIT
        pids = [uuid.uuid4() for _ in range(5_000)]
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
    assert (found["ok"], found["rows_checked"]) == (True, 5_000)
    start = recorder.calls.index(("start", "payments_exactly_once", 5_000))
    end = recorder.calls.index(("finish",), start)
    assert recorder.calls[start + 1 : end] == [("advance", 5_000), ("advance", 0)]
