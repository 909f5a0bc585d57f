"""The executor's records: what one chunk writes and reports (DESIGN §4, §4.1).

``test_executor`` follows payments through the timer; these tests pin what the
executor leaves behind for each kind of chunk item — payment row, attempt,
event, journal, hold, webhook outbox row, the ``ChunkResult`` the task turns
into metrics and logs — and the operator's execute-now trigger.
"""

import logging
import os
import re
import socket
import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client import REGISTRY

from ledger import services as ledger
from ledger.models import Account, Hold, JournalEntry
from payments import services, tasks, webhooks
from payments.clock import iso_timestamp
from payments.engine import executor, reaper
from payments.exceptions import NotFound, PaymentNotDue
from payments.models import Payment, PaymentAttempt, PaymentEvent, WebhookEvent
from tests.payments.helpers import capture_publish, make_due, sweep

pytestmark = pytest.mark.django_db

WORKER = "node-7:4242"


def schedule(client, n=1, **overrides):
    return [client.schedule(**overrides).json()["payment_id"] for _ in range(n)]


def claimed(monkeypatch, *pids):
    """Make the payments due and sweep them: their (payment id, fence) chunk items."""
    make_due(*pids, seconds_ago=5)
    _, published = sweep(monkeypatch)
    items = dict(published.items())
    return [(pid, items[pid]) for pid in pids]


def held(account):
    return Account.objects.get(pk=account.pk).held


def balance(account):
    return Account.objects.get(pk=account.pk).balance


def events(pid):
    return list(
        PaymentEvent.objects.filter(payment_id=pid)
        .order_by("pk")
        .values_list("type", "from_status", "to_status", "actor", "fence", "data")
    )


@pytest.fixture
def chunk(alice, bob, monkeypatch):
    """One chunk of every kind of item: two due (one with a description), one whose
    destination is frozen, one no longer due, one with an old fence, one unknown."""
    (described,) = schedule(alice, amount=100, description="rent")
    (plain,) = schedule(alice, amount=200)
    (bad,) = schedule(alice, amount=30, to_account_id=bob.account.pk)
    (early,) = schedule(alice, amount=40)
    (old,) = schedule(alice, amount=50)
    items = claimed(monkeypatch, described, plain, bad, early, old)
    ledger.account_set_status(account_id=bob.account.pk, status="frozen")
    later = timezone.now() + timedelta(hours=1)
    Payment.objects.filter(pk=early).update(due_at=later)
    unknown = str(uuid.uuid4())
    items = [(pid, fence - 1 if pid == old else fence) for pid, fence in items]
    items.append((unknown, 1))
    return {
        "described": described,
        "plain": plain,
        "bad": bad,
        "early": early,
        "old": old,
        "unknown": unknown,
        "items": items,
    }


def test_chunk_result_reports_each_item_once(chunk):
    # Due 11 µs apart, so their lateness differs in the fifth decimal: a log
    # line rounded to five decimals instead of four shows in at least two.
    for step, key in enumerate(("described", "plain", "bad")):
        Payment.objects.filter(pk=chunk[key]).update(
            due_at=F("due_at") - timedelta(microseconds=11 * step)
        )
    result = executor.execute_chunk(chunk["items"], worker=WORKER)
    assert sorted(result.completed) == sorted([chunk["described"], chunk["plain"]])
    assert result.failed == [chunk["bad"]]
    assert result.failure_codes == ["account_not_active"]
    assert sorted(result.stale) == sorted([chunk["old"], chunk["unknown"]])
    early = Payment.objects.get(pk=chunk["early"])
    assert result.not_due == [(chunk["early"], early.fence, early.due_at)]
    done = {pid: Payment.objects.get(pk=pid) for pid in result.completed}
    assert result.lateness_seconds == [
        (done[pid].executed_at - done[pid].due_at).total_seconds() for pid in result.completed
    ]
    assert all(5 <= seconds < 120 for seconds in result.lateness_seconds)
    ran = {pid: Payment.objects.get(pk=pid) for pid in (*result.completed, chunk["bad"])}
    now = done[result.completed[0]].executed_at
    assert sorted(result.transitions, key=lambda t: t["payment_id"]) == sorted(
        (
            {
                "payment_id": pid,
                "status": p.status,
                "fence": p.fence,
                "attempt": 1,
                "lateness_seconds": round((now - p.due_at).total_seconds(), 4),
                "error_code": p.error_code or None,
            }
            for pid, p in ran.items()
        ),
        key=lambda t: t["payment_id"],
    )
    assert {t["payment_id"]: t["status"] for t in result.transitions} == {
        chunk["described"]: "COMPLETED",
        chunk["plain"]: "COMPLETED",
        chunk["bad"]: "FAILED",
    }
    assert {t["error_code"] for t in result.transitions} == {None, "account_not_active"}


def test_completed_payment_records(chunk, alice):
    result = executor.execute_chunk(chunk["items"], worker=WORKER)
    assert len(result.completed) == 2
    descriptions = {chunk["described"]: "rent", chunk["plain"]: f"Payment {chunk['plain']}"}
    for pid, description in descriptions.items():
        payment = Payment.objects.get(pk=pid)
        assert payment.status == "COMPLETED"
        assert payment.lease_expires_at is None
        assert payment.executed_at == payment.updated_at
        assert payment.executed_at >= payment.due_at + timedelta(seconds=5)
        assert (payment.error_code, payment.error_message) == ("", "")
        entry = payment.journal_entry
        assert entry.reference == f"payment:{pid}"
        assert entry.description == description
        assert Hold.objects.get(pk=payment.hold_id).status == "captured"
        attempt = PaymentAttempt.objects.get(payment_id=pid)
        assert (attempt.number, attempt.fence, attempt.worker, attempt.outcome) == (
            1,
            payment.fence,
            WORKER,
            "succeeded",
        )
        assert attempt.started_at == attempt.finished_at == payment.executed_at
        assert (attempt.error_code, attempt.error_message) == ("", "")
        assert events(pid)[-1] == (
            "executed",
            "QUEUED",
            "COMPLETED",
            "system",
            payment.fence,
            {"worker": WORKER},
        )
    # the failed payment's hold is released, the not-due one's still held
    assert held(alice.account) == 40 + 50
    assert balance(alice.account) == 10_000 - 300
    assert balance(alice.other_account) == 300


def test_failed_payment_records(chunk, alice, bob):
    executor.execute_chunk(chunk["items"], worker=WORKER)
    payment = Payment.objects.get(pk=chunk["bad"])
    message = f"Account {bob.account.pk} is not active."  # bob's: its status is not told
    assert (payment.status, payment.error_code, payment.error_message) == (
        "FAILED",
        "account_not_active",
        message,
    )
    assert payment.journal_entry is None and payment.executed_at is None
    assert payment.lease_expires_at is None
    assert payment.updated_at > payment.due_at
    assert Hold.objects.get(pk=payment.hold_id).status == "released"
    assert JournalEntry.objects.filter(reference=f"payment:{payment.pk}").count() == 0
    attempt = PaymentAttempt.objects.get(payment=payment)
    assert (attempt.number, attempt.fence, attempt.worker, attempt.outcome) == (
        1,
        payment.fence,
        WORKER,
        "failed",
    )
    assert (attempt.error_code, attempt.error_message) == ("account_not_active", message)
    assert attempt.started_at == attempt.finished_at == payment.updated_at
    assert events(payment.pk)[-1] == (
        "failed",
        "QUEUED",
        "FAILED",
        "system",
        payment.fence,
        {"worker": WORKER, "error_code": "account_not_active"},
    )
    assert balance(bob.account) == 10_000


def test_skipped_items_are_left_as_they_were(chunk):
    before = {pid: Payment.objects.get(pk=pid) for pid in (chunk["early"], chunk["old"])}
    executor.execute_chunk(chunk["items"], worker=WORKER)
    for pid, was in before.items():
        now = Payment.objects.get(pk=pid)
        assert (now.status, now.fence, now.lease_expires_at, now.updated_at) == (
            "QUEUED",
            was.fence,
            was.lease_expires_at,
            was.updated_at,
        )
        assert Hold.objects.get(pk=now.hold_id).status == "active"
        assert not PaymentAttempt.objects.filter(payment_id=pid).exists()
        assert [e[0] for e in events(pid)] == ["scheduled", "queued"]


def test_worker_defaults_to_this_process(alice, monkeypatch):
    (pid,) = schedule(alice)
    executor.execute_chunk(claimed(monkeypatch, pid))
    name = f"{socket.gethostname()}:{os.getpid()}"
    assert PaymentAttempt.objects.get(payment_id=pid).worker == name
    assert events(pid)[-1][-1] == {"worker": name}


@pytest.mark.parametrize("frozen", [False, True])
def test_long_worker_name_is_cut_to_the_column(alice, bob, monkeypatch, frozen):
    (pid,) = schedule(alice, to_account_id=bob.account.pk)
    items = claimed(monkeypatch, pid)
    if frozen:
        ledger.account_set_status(account_id=bob.account.pk, status="frozen")
    name = "w" * 100 + "x" * 100
    executor.execute_chunk(items, worker=name)
    assert PaymentAttempt.objects.get(payment_id=pid).worker == name[:128]
    assert events(pid)[-1][-1]["worker"] == name[:128]


def test_payment_without_hold_fails(alice, monkeypatch):
    (pid,) = schedule(alice, amount=70)
    items = claimed(monkeypatch, pid)
    Payment.objects.filter(pk=pid).update(hold=None)
    result = executor.execute_chunk(items, worker=WORKER)
    assert (result.completed, result.failed, result.failure_codes) == ([], [pid], ["ledger_error"])
    payment = Payment.objects.get(pk=pid)
    assert (payment.status, payment.error_code, payment.error_message) == (
        "FAILED",
        "ledger_error",
        "Payment has no hold.",
    )
    attempt = PaymentAttempt.objects.get(payment_id=pid)
    assert (attempt.outcome, attempt.error_code, attempt.error_message) == (
        "failed",
        "ledger_error",
        "Payment has no hold.",
    )
    assert balance(alice.account) == 10_000 and balance(alice.other_account) == 0


def test_hold_released_elsewhere_fails_without_a_second_release(alice, monkeypatch):
    (pid, other) = schedule(alice, 2, amount=60)
    items = claimed(monkeypatch, pid, other)
    hold_id = Payment.objects.get(pk=pid).hold_id
    ledger.hold_release(hold_id=hold_id)
    assert held(alice.account) == 60
    result = executor.execute_chunk(items, worker=WORKER)
    assert (result.completed, result.failed, result.failure_codes) == (
        [other],
        [pid],
        ["hold_not_active"],
    )
    payment = Payment.objects.get(pk=pid)
    assert (payment.status, payment.error_code) == ("FAILED", "hold_not_active")
    assert Hold.objects.get(pk=hold_id).status == "released"
    assert held(alice.account) == 0
    assert balance(alice.account) == 10_000 - 60 and balance(alice.other_account) == 60


def test_entry_posted_before_is_recorded_not_posted_again(alice, monkeypatch):
    """The journal's UNIQUE reference is the last guard: a payment whose entry is
    already posted is COMPLETED with that entry (it was left QUEUED with no lease,
    out of the reaper's reach, and an attempt without an outcome)."""
    (pid,) = schedule(alice, amount=80)
    items = claimed(monkeypatch, pid)
    entry = ledger.transfer_post(
        from_account_id=alice.account.pk,
        to_account_id=alice.other_account.pk,
        amount=80,
        reference=f"payment:{pid}",
    )
    result = executor.execute_chunk(items, worker=WORKER)
    assert (result.completed, result.failed) == ([pid], [])
    payment = Payment.objects.get(pk=pid)
    assert payment.status == "COMPLETED" and payment.journal_entry_id == entry.pk
    assert payment.executed_at is not None and payment.lease_expires_at is None
    assert JournalEntry.objects.filter(reference=f"payment:{pid}").count() == 1
    assert balance(alice.other_account) == 80
    assert PaymentAttempt.objects.get(payment_id=pid).outcome == "succeeded"
    assert events(pid)[-1][:3] == ("executed", "QUEUED", "COMPLETED")
    # the payment's hold is not left active: it held 80 of alice's for ever (a
    # reviewer's finding; no cancel, reaper or executor reaches a COMPLETED payment)
    assert Hold.objects.get(pk=payment.hold_id).status == "released"
    source = Account.objects.get(pk=alice.account.pk)
    assert (source.balance, source.held) == (10_000 - 80, 0)


@pytest.mark.parametrize("accounts_locked", ["last", "first"])
def test_an_entry_posted_before_releases_its_hold_in_the_chunks_own_batch(
    alice, monkeypatch, accounts_locked
):
    """The release joins the chunk's batch: a release of its own wrote ``held`` at
    once, and a batch that locks accounts first (the re-run after StaleAccounts)
    then wrote back the value it read, the release undone — with another payment
    of the same source in the chunk, 80 stayed held for ever."""
    from ledger.reconciliation import reconcile

    posted, other = schedule(alice, 2, amount=80)
    items = claimed(monkeypatch, posted, other)
    ledger.transfer_post(
        from_account_id=alice.account.pk,
        to_account_id=alice.other_account.pk,
        amount=80,
        reference=f"payment:{posted}",
    )
    if accounts_locked == "first":
        monkeypatch.setattr(executor, "locking_accounts_last", lambda work, **kw: work(False))
    result = executor.execute_chunk(items, worker=WORKER)
    assert sorted(result.completed) == sorted([posted, other])
    source = Account.objects.get(pk=alice.account.pk)
    assert (source.balance, source.held) == (10_000 - 160, 0)
    assert reconcile().ok


CHUNK_STATEMENTS = [
    # one statement (ledger.db.set_local): batch UPDATEs by key, not a hash
    # of the table (random_page_cost), and the batch's time limit (the solo
    # pool has none of Celery's)
    (
        "SET",
        "random_page_cost",
        "statement_timeout",
        "idle_in_transaction_session_timeout",
        "lock_timeout",
    ),
    ("LOCK", "payments_payment"),  # lock the chunk's payments, reading the one clock
    ("SELECT", "ledger_account"),  # read the accounts, no lock yet
    ("LOCK", "ledger_hold"),  # lock the holds
    ("SELECT", "ledger_journalentry"),  # references already taken, one lookup
    # the new entries, their ids given back by RETURNING with their
    # references (postings refer to them; ledger.db._returning_key)
    ("INSERT", "ledger_journalentry"),
    ("UPDATE", "ledger_hold"),
    ("SELECT", "payments_webhookendpoint"),  # who is subscribed
    # the payments' outcomes, their attempts and events in one statement
    # (ledger.db.write_rows); no id round trip: nothing refers to the rows
    ("WRITE", "payments_payment", "payments_paymentattempt", "payments_paymentevent"),
    # The account locks come last, held for these two statements and COMMIT
    # only: a schedule request placing a hold does not wait for the batch.
    # Locked by one statement, then checked and written by the next, in one
    # round trip (ledger.services: why two).
    ("LOCK", "ledger_account"),
    ("CHECK+UPDATE", "ledger_account"),
    ("INSERT", "ledger_posting"),  # balance_after: from the locked balances
]
WEBHOOK_STATEMENT = ("INSERT", "payments_webhookevent")  # when a client subscribed


def statement(sql):
    """(verb, table or function) of one SQL statement; a row-locking SELECT is LOCK,
    flush_balances' check and update of the accounts it locked CHECK+UPDATE (the
    CTE, or for one account its UPDATE by key)."""
    if sql.lstrip().startswith(("WITH", "UPDATE ledger_account a")) and (
        "UPDATE ledger_account" in sql
    ):
        return ("CHECK+UPDATE", "ledger_account")
    if sql.startswith("SELECT set_config("):  # ledger.db.set_local: the settings, in order
        return ("SET", *re.findall(r"set_config\('(\w+)'", sql))
    if sql.startswith("WITH w0 AS ("):  # ledger.db.write_rows: the tables, in order
        return ("WRITE", *re.findall(r'(?:UPDATE|INSERT INTO) "(\w+)"', sql))
    function = re.match(r"SELECT (\w+)\(", sql)
    verb = "LOCK" if re.search(r"FOR (NO KEY )?UPDATE", sql) else sql.split()[0]
    if function:
        return (verb, function.group(1))
    return (verb, sql.split('"')[1] if '"' in sql else re.search(r"FROM (\w+)", sql).group(1))


@pytest.mark.postgres  # the statements of the PostgreSQL bulk path
@pytest.mark.parametrize("subscribed", [False, True], ids=["no-endpoint", "endpoint"])
def test_statements_do_not_grow_with_the_chunk(alice, monkeypatch, receiver, subscribed):
    """A chunk costs the same statements whatever its size: one per kind of row
    (bulk writes, one lookup of taken references), not one per payment — and
    no column the executor leaves unread (``locks.EXECUTOR_UNREAD``) is fetched
    one payment at a time, webhook payloads included."""
    expected = list(CHUNK_STATEMENTS)
    if subscribed:
        webhooks.endpoint_create(
            client=alice.user, url=receiver.url, event_types=["payment.completed"]
        )
        expected.insert(
            expected.index(("SELECT", "payments_webhookendpoint")) + 1, WEBHOOK_STATEMENT
        )
    for n in (1, 4, 9):
        ids = schedule(alice, n, amount=10)
        items = claimed(monkeypatch, *ids)
        with CaptureQueriesContext(connection) as queries:
            result = executor.execute_chunk(items, worker=WORKER)
        assert sorted(result.completed) == sorted(ids)
        sent = [q["sql"] for q in queries.captured_queries if "SAVEPOINT" not in q["sql"]]
        assert [statement(sql) for sql in sent] == expected
    if subscribed:
        assert WebhookEvent.objects.filter(event_type="payment.completed").count() == 14


@pytest.mark.postgres  # PostgreSQL's pipeline mode
def test_the_chunks_pipeline_holds_no_write_that_reads_a_row_count(
    chunk, alice, bob, monkeypatch, receiver
):
    """The executor sends its statements in one pipeline (``ledger.db.pipelined``),
    where psycopg reports a row count of -1 until it syncs. So every write in it
    goes through ``ledger.db``'s server-binding cursor, whose bulk statements
    never read one — no ORM ``save()``/``update()``/``delete()``, which would
    mistake -1 for a row. Every kind of item (completed, failed with its hold
    released, stale, not due, unknown), a collapsed payment, a posted reference
    and a subscribed endpoint, so each write path of a chunk is sent."""
    webhooks.endpoint_create(
        client=alice.user, url=receiver.url, event_types=["payment.completed", "payment.failed"]
    )
    (extra,) = schedule(alice, amount=5)
    ((_, extra_fence),) = claimed(monkeypatch, extra)
    (posted,) = schedule(alice, amount=7)
    items = [*chunk["items"], *claimed(monkeypatch, posted)]
    ledger.transfer_post(  # posted before: the executor finds its entry (DuplicateReference)
        from_account_id=alice.account.pk,
        to_account_id=alice.other_account.pk,
        amount=7,
        reference=f"payment:{posted}",
    )
    sent = []

    def record(execute, sql, params, many, context):
        in_pipeline = bool(connection.connection.pgconn.pipeline_status)
        sent.append((sql.split()[0].upper(), type(context["cursor"].cursor).__name__, in_pipeline))
        return execute(sql, params, many, context)

    partitions = list(Payment.objects.filter(pk=extra).values_list("partition", flat=True))
    with connection.execute_wrapper(record):
        result = executor.execute_chunk(items, partitions=partitions, worker=WORKER)
    assert result.collapsed == [extra] and extra_fence == 1
    assert sorted(result.completed) == sorted([chunk["described"], chunk["plain"], posted, extra])
    assert result.failed == [chunk["bad"]]
    piped = [(verb, kind) for verb, kind, in_pipeline in sent if in_pipeline]
    writes = {(verb, kind) for verb, kind in piped if verb in ("INSERT", "UPDATE", "DELETE")}
    assert {verb for verb, _ in writes} == {"INSERT", "UPDATE"}
    assert {kind for _, kind in writes} == {"ServerBindingCursor"}, writes
    # every statement of the chunk went through the pipeline (outside it: only the
    # savepoint the test's own transaction turns the executor's atomic() into)
    assert {verb for verb, _, in_pipeline in sent if not in_pipeline} <= {"SAVEPOINT", "RELEASE"}
    assert WebhookEvent.objects.count() == 5  # four completed, one failed: the outbox too


def test_webhook_outbox_rows_for_the_source_accounts_owner(chunk, alice, bob, receiver):
    types = ["payment.completed", "payment.failed", "payment.cancelled"]
    webhooks.endpoint_create(client=alice.user, url=receiver.url, event_types=types)
    webhooks.endpoint_create(client=bob.user, url=receiver.url, event_types=types)
    executor.execute_chunk(chunk["items"], worker=WORKER)
    rows = {
        (e.data["payment_id"], e.event_type): (e.client_id, e.data)
        for e in WebhookEvent.objects.all()
    }
    expected = {
        (chunk["described"], "payment.completed"),
        (chunk["plain"], "payment.completed"),
        (chunk["bad"], "payment.failed"),
    }
    assert set(rows) == expected
    for (pid, _), (client_id, data) in rows.items():
        assert client_id == alice.user.pk
        assert data == webhooks.payment_data(Payment.objects.get(pk=pid))
    assert rows[(chunk["bad"], "payment.failed")][1]["error_code"] == "account_not_active"


def metric(name, **labels):
    return REGISTRY.get_sample_value(name, labels) or 0.0


def test_metrics_and_logs_after_commit(chunk, caplog, django_capture_on_commit_callbacks):
    before = {
        "executed": metric("payments_executed_total"),
        "failed": metric("payments_failed_total", error_code="account_not_active"),
        "stale": metric("payments_stale_deliveries_total"),
        "lateness": metric("payments_lateness_seconds_count"),
    }
    caplog.set_level(logging.INFO, logger="payments.engine.executor")
    with django_capture_on_commit_callbacks(execute=False) as callbacks:
        result = executor.execute_chunk(chunk["items"], worker=WORKER)
    # nothing recorded before the commit
    assert metric("payments_executed_total") == before["executed"]
    lines = [r for r in caplog.records if r.getMessage().startswith("payment ")]
    assert lines == []
    for callback in callbacks:
        callback()
    assert metric("payments_executed_total") == before["executed"] + 2
    assert metric("payments_failed_total", error_code="account_not_active") == before["failed"] + 1
    assert metric("payments_stale_deliveries_total") == before["stale"] + 2
    assert metric("payments_lateness_seconds_count") == before["lateness"] + 2
    lines = [r for r in caplog.records if r.getMessage().startswith("payment ")]
    assert sorted(r.getMessage() for r in lines) == sorted(
        f"payment {t['payment_id']} {t['status']}" for t in result.transitions
    )
    for record in lines:
        (transition,) = [t for t in result.transitions if t["payment_id"] == record.payment_id]
        for key, value in transition.items():
            assert getattr(record, key) == value
        assert record.levelno == logging.INFO
    (skipped,) = [r for r in caplog.records if "stale deliveries" in r.getMessage()]
    assert skipped.getMessage() == "skipped 2 stale deliveries"
    assert sorted(skipped.stale) == sorted([chunk["old"], chunk["unknown"]])


def test_no_stale_log_without_stale_items(alice, monkeypatch, caplog):
    (pid,) = schedule(alice)
    caplog.set_level(logging.INFO, logger="payments.engine.executor")
    executor.execute_chunk(claimed(monkeypatch, pid), worker=WORKER)
    assert not [r for r in caplog.records if "stale" in r.getMessage()]


def test_task_reports_counts_and_hands_back_early_items(chunk, monkeypatch):
    published = capture_publish(monkeypatch)
    report = tasks.execute_chunk([list(item) for item in chunk["items"]])
    assert report == {"completed": 2, "failed": 1, "stale": 2, "busy": 0}
    early = Payment.objects.get(pk=chunk["early"])
    assert published.items() == [(chunk["early"], early.fence)]


# --- payment_execute_now: the operator's trigger -------------------------------------


def test_execute_now_unknown_payment():
    missing = uuid.uuid4()
    with pytest.raises(NotFound) as raised:
        services.payment_execute_now(payment_id=missing, execution_id="op-1")
    assert raised.value.message == f"Payment {missing} not found."
    assert raised.value.details == {"payment_id": str(missing)}


def test_execute_now_refuses_a_payment_not_yet_due(alice):
    (pid,) = schedule(alice)
    payment = Payment.objects.get(pk=pid)
    with pytest.raises(PaymentNotDue) as raised:
        services.payment_execute_now(payment_id=pid, execution_id="op-1")
    due = iso_timestamp(payment.due_at)
    assert raised.value.message == f"Payment {pid} is not due until {due}."
    assert raised.value.details == {"due_at": due}
    after = Payment.objects.get(pk=pid)
    assert (after.status, after.fence, after.attempts) == ("PENDING", 0, 0)
    assert [e[0] for e in events(pid)] == ["scheduled"]


@pytest.mark.parametrize("queued", [False, True])
def test_execute_now_claims_and_runs_a_due_payment(alice, monkeypatch, queued):
    (pid,) = schedule(alice, amount=90)
    if queued:
        (old_item,) = claimed(monkeypatch, pid)
    else:
        make_due(pid)
    was = Payment.objects.get(pk=pid)
    payment = services.payment_execute_now(payment_id=pid, execution_id="op-7")
    assert isinstance(payment, Payment)
    assert (payment.status, payment.fence, payment.attempts) == (
        "COMPLETED",
        was.fence + 1,
        was.attempts + 1,
    )
    assert payment.lease_expires_at is None and payment.journal_entry_id is not None
    assert balance(alice.other_account) == 90
    assert events(pid)[-2:] == [
        (
            "queued",
            was.status,
            "QUEUED",
            "staff",
            payment.fence,
            {"execution_id": "op-7", "trigger": "internal_api"},
        ),
        ("executed", "QUEUED", "COMPLETED", "system", payment.fence, {"worker": "internal:op-7"}),
    ]
    attempt = PaymentAttempt.objects.get(payment_id=pid)
    assert (attempt.number, attempt.fence, attempt.worker) == (
        payment.attempts,
        payment.fence,
        "internal:op-7",
    )
    if queued:  # the sweeper's message arrives late: fenced out
        assert executor.execute_chunk([old_item]).stale == [pid]


def test_execute_now_cuts_a_long_execution_id_for_the_worker(alice):
    (pid,) = schedule(alice)
    make_due(pid)
    execution_id = "e" * 100 + "f" * 100
    services.payment_execute_now(payment_id=pid, execution_id=execution_id)
    assert PaymentAttempt.objects.get(payment_id=pid).worker == f"internal:{execution_id}"[:128]
    assert events(pid)[-2][-1]["execution_id"] == execution_id


def test_execute_now_returns_a_terminal_payment_as_it_is(alice):
    (done, cancelled) = schedule(alice, 2)
    make_due(done, cancelled)
    first = services.payment_execute_now(payment_id=done, execution_id="op-1")
    assert alice.api.delete(f"/api/v1/payments/{cancelled}/cancel").status_code == 200
    for pid, status in ((done, "COMPLETED"), (cancelled, "CANCELLED")):
        history = events(pid)
        payment = services.payment_execute_now(payment_id=pid, execution_id="op-2")
        assert (payment.pk, payment.status) == (uuid.UUID(pid), status)
        assert events(pid) == history
        stored = Payment.objects.get(pk=pid)
        assert (stored.status, stored.fence, stored.attempts) == (
            status,
            payment.fence,
            payment.attempts,
        )
    assert Payment.objects.get(pk=done).fence == first.fence
    assert PaymentAttempt.objects.filter(payment_id=done).count() == 1
    assert JournalEntry.objects.filter(reference=f"payment:{done}").count() == 1


def test_execute_now_claim_survives_a_crashed_executor(alice, monkeypatch, settings):
    """The claim commits before the chunk runs, leased like a sweeper's claim (an
    execute-now's lease already over let the reaper take the payment back while
    it ran): if the executor dies, the reaper gives it back when the lease ends."""
    (pid,) = schedule(alice)
    make_due(pid)

    def crash(items, **kwargs):
        raise SystemExit("worker died")

    monkeypatch.setattr(executor, "execute_chunk", crash)
    with pytest.raises(SystemExit):
        services.payment_execute_now(payment_id=pid, execution_id="op-9")
    payment = Payment.objects.get(pk=pid)
    assert (payment.status, payment.fence, payment.attempts) == ("QUEUED", 1, 1)
    lease = payment.lease_expires_at - timezone.now()
    assert timedelta(seconds=settings.PAYMENT_LEASE_SECONDS - 5) < lease
    assert lease <= timedelta(seconds=settings.PAYMENT_LEASE_SECONDS)
    assert reaper.reap_leases().requeued == 0  # still leased: it may be running
    Payment.objects.filter(pk=pid).update(lease_expires_at=timezone.now() - timedelta(seconds=1))
    assert reaper.reap_leases().requeued == 1
    assert Payment.objects.get(pk=pid).status == "PENDING"
