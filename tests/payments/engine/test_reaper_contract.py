"""The lease reaper (DESIGN §4.1): an expired lease returns the payment to PENDING
under a new fence with a back-off; after ``PAYMENT_MAX_ATTEMPTS`` claims it is a
dead letter (FAILED ``max_attempts_exceeded``, hold released, client told).

Most tests run on both code paths of the timer (see
tests/payments/engine/timer.py); on the ORM path the database clock is frozen.
"""

import logging
import uuid
from datetime import timedelta
from types import SimpleNamespace

import pytest
from django.db import connection

from ledger import services as ledger
from ledger.models import Account, Hold
from payments import tasks, transitions
from payments.clock import db_now
from payments.engine import reaper
from payments.models import Payment, PaymentEvent, WebhookEvent
from tests.concurrency import in_other_connection
from tests.factories import AccountFactory
from tests.payments.engine.timer import in_another_transaction, queued_payment

pytestmark = pytest.mark.django_db

SECOND = timedelta(seconds=1)


@pytest.mark.parametrize(
    ("attempts", "delay"), [(0, 1), (1, 1), (2, 2), (3, 4), (6, 32), (7, 60), (40, 60)]
)
def test_retry_delay_doubles_per_attempt_up_to_a_minute(attempts, delay):
    assert transitions.retry_delay_seconds(attempts) == delay


@pytest.mark.parametrize(
    ("attempts", "due_in", "backoff"),
    [
        (3, -100, 4),  # long overdue: back off 2^(3-1) s from now
        (7, -100, 60),  # capped at a minute
        (1, 30, 1),  # claimed ahead and lost: not before its due time
    ],
)
def test_an_expired_lease_returns_the_payment_to_pending_under_a_new_fence(
    alice, settings, frozen_clock, attempts, due_in, backoff
):
    settings.PAYMENT_MAX_ATTEMPTS = 8
    now = frozen_clock or db_now()
    payment = queued_payment(
        alice.account,
        alice.other_account,
        lease_expires_at=now - SECOND,
        due_at=now + timedelta(seconds=due_in),
        attempts=attempts,
        fence=7,
    )
    before = frozen_clock or db_now()
    result = reaper.reap_leases()
    after = frozen_clock or db_now()
    assert result == reaper.ReapResult(requeued=1, dead_lettered=0)
    payment.refresh_from_db()
    assert (payment.status, payment.fence, payment.lease_expires_at, payment.attempts) == (
        "PENDING",
        8,
        None,
        attempts,
    )
    due_at, wait = payment.due_at, timedelta(seconds=backoff)
    assert max(due_at, before + wait) <= payment.run_at <= max(due_at, after + wait)
    assert before <= payment.updated_at <= after
    event = payment.events.get()
    assert (event.type, event.from_status, event.to_status, event.actor) == (
        "lease_expired",
        "QUEUED",
        "PENDING",
        "system",
    )
    assert (event.fence, event.data) == (8, {"attempts": attempts})
    assert payment.hold.status == "active"


@pytest.mark.parametrize(
    ("expired_by", "attempts", "status"),
    [
        (timedelta(0), 1, "QUEUED"),  # the lease ends now: not yet expired
        (timedelta(microseconds=1), 1, "PENDING"),
        (timedelta(microseconds=1), 4, "PENDING"),  # one attempt left
        (timedelta(microseconds=1), 5, "FAILED"),  # the last attempt's lease ran out
        (timedelta(0), 5, "QUEUED"),
    ],
)
def test_reaper_boundaries_lease_end_and_max_attempts(
    alice, settings, portable_clock, expired_by, attempts, status
):
    settings.PAYMENT_MAX_ATTEMPTS = 5
    payment = queued_payment(
        alice.account,
        alice.other_account,
        lease_expires_at=portable_clock - expired_by,
        attempts=attempts,
    )
    result = reaper.reap_leases()
    assert (result.requeued, result.dead_lettered) == (status == "PENDING", status == "FAILED")
    assert Payment.objects.get(pk=payment.pk).status == status


def test_a_live_lease_is_left_alone(alice, settings, timer_path):
    settings.PAYMENT_MAX_ATTEMPTS = 1
    for _ in range(2):
        queued_payment(alice.account, alice.other_account, lease_expires_at=db_now() + 30 * SECOND)
    assert reaper.reap_leases() == reaper.ReapResult()
    assert set(Payment.objects.values_list("status", flat=True)) == {"QUEUED"}
    assert not PaymentEvent.objects.exists()


def test_one_reap_handles_at_most_limit_of_each(alice, settings, timer_path):
    settings.PAYMENT_MAX_ATTEMPTS = 3
    expired = db_now() - SECOND
    for attempts in (1, 2, 3, 3, 3, 3):
        queued_payment(
            alice.account, alice.other_account, lease_expires_at=expired, attempts=attempts
        )
    assert reaper.reap_leases(limit=1) == reaper.ReapResult(requeued=1, dead_lettered=1)
    assert reaper.reap_leases() == reaper.ReapResult(requeued=1, dead_lettered=3)
    assert reaper.reap_leases() == reaper.ReapResult()
    statuses = sorted(Payment.objects.values_list("status", flat=True))
    assert statuses == ["FAILED"] * 4 + ["PENDING"] * 2


def test_a_dead_letter_fails_the_payment_releases_its_hold_and_tells_the_client(
    alice, settings, frozen_clock, fake_dns
):
    settings.PAYMENT_MAX_ATTEMPTS = 3
    fake_dns["example.test"] = ["93.184.215.14"]
    response = alice.api.post(
        "/api/v1/webhook-endpoints",
        {"url": "https://example.test/hooks", "event_types": ["payment.failed"]},
        format="json",
    )
    assert response.status_code == 201
    now = frozen_clock or db_now()
    payment = queued_payment(
        alice.account,
        alice.other_account,
        lease_expires_at=now - SECOND,
        attempts=3,
        fence=5,
        amount=700,
    )
    assert Account.objects.get(pk=alice.account.pk).held == 700
    before = frozen_clock or db_now()
    result = reaper.reap_leases()
    after = frozen_clock or db_now()
    assert result == reaper.ReapResult(requeued=0, dead_lettered=1)
    payment.refresh_from_db()
    assert (payment.status, payment.error_code, payment.error_message) == (
        "FAILED",
        "max_attempts_exceeded",
        "Not executed after 3 attempts.",
    )
    assert (payment.fence, payment.lease_expires_at, payment.attempts) == (6, None, 3)
    assert before <= payment.updated_at <= after
    assert payment.hold.status == "released"
    source = Account.objects.get(pk=alice.account.pk)
    assert (source.balance, source.held) == (10_000, 0)
    event = payment.events.get()
    assert (event.type, event.from_status, event.to_status, event.actor) == (
        "dead_lettered",
        "QUEUED",
        "FAILED",
        "system",
    )
    assert (event.fence, event.data) == (6, {"attempts": 3})
    (told,) = WebhookEvent.objects.all()
    assert (told.client_id, told.event_type) == (alice.user.pk, "payment.failed")
    assert told.data["payment_id"] == str(payment.pk)
    assert (told.data["status"], told.data["error_code"]) == ("FAILED", "max_attempts_exceeded")
    assert reaper.reap_leases() == reaper.ReapResult()  # once


@pytest.mark.parametrize("hold", ["released", "none"])
def test_a_dead_letter_without_an_active_hold_releases_nothing(alice, settings, timer_path, hold):
    settings.PAYMENT_MAX_ATTEMPTS = 1
    payment = queued_payment(
        alice.account,
        alice.other_account,
        lease_expires_at=db_now() - SECOND,
        hold=hold != "none",
    )
    if hold == "released":  # by staff, say, while the payment was queued
        ledger.hold_release(hold_id=payment.hold_id)
    assert reaper.reap_leases().dead_lettered == 1
    payment.refresh_from_db()
    assert (payment.status, payment.error_code) == ("FAILED", "max_attempts_exceeded")
    source = Account.objects.get(pk=alice.account.pk)
    assert (source.balance, source.held) == (10_000, 0)
    if hold == "released":
        assert Hold.objects.get(pk=payment.hold_id).status == "released"


def test_a_dead_letter_from_an_ownerless_account_tells_no_client(settings, timer_path):
    settings.PAYMENT_MAX_ATTEMPTS = 1
    source = AccountFactory(owner=None, funded=1_000)
    payment = queued_payment(source, AccountFactory(), lease_expires_at=db_now() - SECOND)
    assert reaper.reap_leases().dead_lettered == 1
    assert Payment.objects.get(pk=payment.pk).status == "FAILED"
    assert not WebhookEvent.objects.exists()


def test_the_reaper_logs_what_it_did_and_nothing_when_idle(alice, settings, caplog, timer_path):
    settings.PAYMENT_MAX_ATTEMPTS = 2
    with caplog.at_level(logging.DEBUG, logger="payments.engine.reaper"):
        assert reaper.reap_leases() == reaper.ReapResult()
    assert [r for r in caplog.records if r.name == "payments.engine.reaper"] == []
    expired = db_now() - SECOND
    for attempts in (1, 1, 2):
        queued_payment(
            alice.account, alice.other_account, lease_expires_at=expired, attempts=attempts
        )
    with caplog.at_level(logging.DEBUG, logger="payments.engine.reaper"):
        assert tasks.reap_leases() == {
            "requeued": 2,
            "dead_lettered": 1,
            "errors": 0,
            "timed_out": 0,
            "budget_exhausted": False,
        }
    (record,) = [r for r in caplog.records if r.name == "payments.engine.reaper"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == "reaper requeued 2 and dead-lettered 1 payments"
    assert (record.requeued, record.dead_lettered) == (2, 1)
    caplog.clear()
    queued_payment(alice.account, alice.other_account, lease_expires_at=expired, attempts=1)
    with caplog.at_level(logging.DEBUG, logger="payments.engine.reaper"):
        assert reaper.reap_leases() == reaper.ReapResult(requeued=1)
    (record,) = [r for r in caplog.records if r.name == "payments.engine.reaper"]
    assert record.getMessage() == "reaper requeued 1 and dead-lettered 0 payments"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_dead_letter_locked_elsewhere_is_skipped_not_waited_for(settings):
    """The reaper never waits for a row another transaction holds (an executor,
    a cancel): it leaves it for the next run."""
    settings.PAYMENT_MAX_ATTEMPTS = 1
    source = AccountFactory(funded=1_000)
    payment = queued_payment(source, AccountFactory(), lease_expires_at=db_now() - SECOND)
    done = in_another_transaction(
        lambda: Payment.objects.select_for_update().filter(pk=payment.pk).first()
    )
    try:
        result = reaper.reap_leases()
    finally:
        done()
    assert result.dead_lettered == 0
    assert Payment.objects.get(pk=payment.pk).status == "QUEUED"
    assert reaper.reap_leases().dead_lettered == 1


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_an_account_locked_elsewhere_puts_its_dead_letter_off_and_the_run_goes_on(settings, caplog):
    """DESIGN §8: a dead letter releases its hold, which locks the payer's account;
    another session may keep that row locked as long as it likes (a staff action, an
    operator's open transaction). The reaper shares the timer worker with the sweeper:
    it waited for as long as the lock lasted, and every client's sweeps with it, and
    the dead letters behind that one were not reached. Now the statement gives up after
    PAYMENT_REAPER_STATEMENT_TIMEOUT_SECONDS, that payment is put off a minute (still
    QUEUED, hold kept) and the next one is dead-lettered in the same run."""
    settings.PAYMENT_MAX_ATTEMPTS = 1
    settings.PAYMENT_REAPER_STATEMENT_TIMEOUT_SECONDS = 0.2
    settings.PAYMENT_REAPER_BUDGET_SECONDS = 10  # room for both waits, on a slow host too
    locked_source, other_source = AccountFactory(funded=1_000), AccountFactory(funded=1_000)
    stuck = queued_payment(locked_source, AccountFactory(), lease_expires_at=db_now() - 3 * SECOND)
    also = queued_payment(locked_source, AccountFactory(), lease_expires_at=db_now() - 2 * SECOND)
    behind = queued_payment(other_source, AccountFactory(), lease_expires_at=db_now() - SECOND)
    from prometheus_client import REGISTRY

    def timed_out_total():
        labels = {"outcome": "timed_out"}
        return REGISTRY.get_sample_value("payments_reaped_leases_total", labels) or 0.0

    counted_before = timed_out_total()
    done = in_another_transaction(
        lambda: Account.objects.select_for_update().filter(pk=locked_source.pk).first(),
        release_after=20,
    )
    try:
        with caplog.at_level(logging.WARNING, logger="payments.engine.reaper"):
            result = tasks.reap_leases()
        # the lock is still held: the run did not wait it out
        lock = "SELECT 1 FROM ledger_account WHERE id = %s FOR UPDATE NOWAIT"
        assert in_other_connection(lock, [locked_source.pk]) == "LockNotAvailable"
    finally:
        done()
    assert result == {
        "requeued": 0,
        "dead_lettered": 1,
        "errors": 0,
        "timed_out": 2,
        "budget_exhausted": False,
    }
    assert timed_out_total() == counted_before + 2
    assert Payment.objects.get(pk=behind.pk).status == "FAILED"
    stuck = Payment.objects.get(pk=stuck.pk)
    assert stuck.status == "QUEUED" and stuck.hold.status == "active"
    assert stuck.lease_expires_at > db_now() + 50 * SECOND  # put off a minute
    assert stuck.events.filter(type="dead_letter_failed").count() == 1
    record, _ = [r for r in caplog.records if r.levelno == logging.WARNING and "past" in r.msg]
    assert record.getMessage() == (
        f"reaper: dead-lettering payment {stuck.pk} waited past 0.2 s (a row locked "
        "elsewhere?); put off 60 s"
    )
    assert record.payment_id == str(stuck.pk)
    # once their time comes again, they go through
    Payment.objects.filter(pk__in=[stuck.pk, also.pk]).update(lease_expires_at=db_now() - SECOND)
    assert reaper.reap_leases().dead_lettered == 2
    assert Payment.objects.get(pk=stuck.pk).status == "FAILED"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_a_dead_letter_does_not_wait_for_rows_that_only_reference_the_payment(settings):
    """Writing a row that references the payment (its history) takes a key share
    lock on it when the foreign key is checked; dead-lettering does not change
    the key, so it goes ahead."""
    settings.PAYMENT_MAX_ATTEMPTS = 1
    source = AccountFactory(funded=1_000)
    payment = queued_payment(source, AccountFactory(), lease_expires_at=db_now() - SECOND)

    def write_history():
        with connection.cursor() as cursor:  # check the foreign key now, as at commit
            cursor.execute("SET CONSTRAINTS ALL IMMEDIATE")
        PaymentEvent.objects.create(
            payment_id=payment.pk, type="description_changed", actor="system", data={}
        )

    done = in_another_transaction(write_history)
    try:
        result = reaper.reap_leases()
    finally:
        done()
    assert result.dead_lettered == 1
    assert Payment.objects.get(pk=payment.pk).status == "FAILED"


@pytest.mark.postgres
@pytest.mark.django_db(transaction=True)
def test_two_reapers_never_requeue_the_same_payment(settings):
    """Reapers on several nodes: the one that reaches an expired lease second
    skips it (it is being requeued) instead of requeueing it again."""
    source = AccountFactory(funded=1_000)
    payment = queued_payment(source, AccountFactory(), lease_expires_at=db_now() - SECOND)
    first = []
    done = in_another_transaction(lambda: first.append(reaper.reap_leases()))
    try:
        second = reaper.reap_leases()
    finally:
        done()
    assert (first, second) == ([reaper.ReapResult(requeued=1)], reaper.ReapResult())
    payment.refresh_from_db()
    assert (payment.status, payment.fence) == ("PENDING", 2)
    assert list(payment.events.values_list("type", "fence")) == [("lease_expired", 2)]


def _between_listing_and_dead_lettering(monkeypatch, change):
    """Run ``change(payment_id)`` after the reaper has listed a dead letter and
    before it locks it: what a concurrent transaction could do in between."""
    real = reaper._dead_letter

    def dead_letter(payment_id):
        change(payment_id)
        return real(payment_id)

    monkeypatch.setattr(reaper, "_dead_letter", dead_letter)


def test_a_payment_cancelled_before_it_is_dead_lettered_stays_cancelled(
    alice, settings, monkeypatch, timer_path
):
    from payments.services import payment_cancel

    settings.PAYMENT_MAX_ATTEMPTS = 1
    payment = queued_payment(alice.account, alice.other_account, lease_expires_at=db_now() - SECOND)
    _between_listing_and_dead_lettering(
        monkeypatch, lambda pid: payment_cancel(payment_id=pid, client=alice.user)
    )
    assert reaper.reap_leases() == reaper.ReapResult()
    payment.refresh_from_db()
    assert (payment.status, payment.error_code) == ("CANCELLED", "")
    assert not payment.events.filter(type="dead_lettered").exists()


def test_a_lease_renewed_before_it_is_dead_lettered_is_left_alone(
    alice, settings, monkeypatch, portable_clock
):
    """Re-checked under the lock: a lease that now ends at the current instant is
    not expired (the same boundary as the listing's)."""
    settings.PAYMENT_MAX_ATTEMPTS = 1
    payment = queued_payment(
        alice.account, alice.other_account, lease_expires_at=portable_clock - SECOND
    )
    _between_listing_and_dead_lettering(
        monkeypatch,
        lambda pid: Payment.objects.filter(pk=pid).update(lease_expires_at=portable_clock),
    )
    assert reaper.reap_leases() == reaper.ReapResult()
    payment.refresh_from_db()
    assert (payment.status, payment.lease_expires_at) == ("QUEUED", portable_clock)
    assert payment.hold.status == "active"


def test_a_last_attempt_still_running_does_not_hold_back_a_dead_letter(alice, settings, timer_path):
    """Only expired leases are listed: one reap of limit 1 dead-letters the
    expired payment even when a live one on its last attempt comes first (in
    primary-key order, and in table order: PostgreSQL is told to read the
    table, as it may with other statistics, rather than the lease index)."""
    settings.PAYMENT_MAX_ATTEMPTS = 2
    if connection.vendor == "postgresql":
        with connection.cursor() as cursor:  # until the test's transaction ends
            for scan in ("indexscan", "indexonlyscan", "bitmapscan"):
                cursor.execute(f"SET LOCAL enable_{scan} = off")
    now = db_now()
    running = queued_payment(
        alice.account,
        alice.other_account,
        lease_expires_at=now + 30 * SECOND,
        attempts=2,
        id=uuid.UUID(int=1),
    )
    expired = queued_payment(
        alice.account,
        alice.other_account,
        lease_expires_at=now - SECOND,
        attempts=2,
        id=uuid.UUID(int=2**128 - 1),
    )
    assert reaper.reap_leases(limit=1) == reaper.ReapResult(dead_lettered=1)
    assert Payment.objects.get(pk=expired.pk).status == "FAILED"
    assert Payment.objects.get(pk=running.pk).status == "QUEUED"


@pytest.mark.postgres
def test_one_reap_requeues_at_most_10_000_payments(alice):
    """A reap is one bounded transaction: a flood of expired leases (a Redis
    flush) is requeued 10,000 at a time."""
    expired = db_now() - SECOND
    Payment.objects.bulk_create(
        Payment(
            from_account=alice.account,
            to_account=alice.other_account,
            owner=alice.user,
            amount=1,
            due_at=expired,
            run_at=expired,
            partition=0,
            status="QUEUED",
            fence=1,
            attempts=1,
            lease_expires_at=expired,
        )
        for _ in range(10_001)
    )
    assert reaper.reap_leases() == reaper.ReapResult(requeued=10_000)
    assert Payment.objects.filter(status="QUEUED").count() == 1


def _dead_letters(alice, n):
    """``n`` payments out of attempts whose leases expired, oldest lease first."""
    now = db_now()
    return [
        queued_payment(
            alice.account,
            alice.other_account,
            lease_expires_at=now - (n + 1 - i) * SECOND,
            attempts=3,
        )
        for i in range(n)
    ]


def _raise_for(monkeypatch, payment_id, error):
    real = transitions.dead_letter

    def dead_letter(payment, *, now):
        if payment.pk == payment_id:
            raise error
        return real(payment, now=now)

    monkeypatch.setattr(transitions, "dead_letter", dead_letter)


def test_a_dead_letter_that_raises_is_logged_put_off_and_the_others_go_on(
    alice, settings, timer_path, frozen_clock, monkeypatch, caplog
):
    """DESIGN §8: one bad row never stops the rest. It stays QUEUED with its hold,
    its lease a minute on (an event says so) so later runs reach the rows behind it."""
    settings.PAYMENT_MAX_ATTEMPTS = 3
    *bad, good = _dead_letters(alice, 3)  # the bad ones have the oldest leases: first in line
    real = transitions.dead_letter

    def dead_letter(payment, *, now):
        if payment.pk in {b.pk for b in bad}:
            raise ValueError("a row the code cannot handle")
        return real(payment, now=now)

    monkeypatch.setattr(transitions, "dead_letter", dead_letter)
    before = tasks.metrics.reaped.labels(outcome="error")._value.get()
    now = frozen_clock or db_now()
    assert tasks.reap_leases()["errors"] == 2
    after = frozen_clock or db_now()
    assert tasks.metrics.reaped.labels(outcome="error")._value.get() == before + 2
    assert Payment.objects.get(pk=good.pk).status == "FAILED"
    for payment in bad:
        payment.refresh_from_db()
        assert (payment.status, payment.hold.status, payment.fence) == ("QUEUED", "active", 1)
        assert now + 60 * SECOND <= payment.lease_expires_at <= after + 60 * SECOND
        event = payment.events.get()
        assert (event.type, event.from_status, event.to_status, event.actor) == (
            "dead_letter_failed",
            "QUEUED",
            "QUEUED",
            "system",
        )
        assert event.data == {"retry_in_seconds": 60}
    records = [r for r in caplog.records if r.levelname == "ERROR"]
    assert [r.getMessage() for r in records] == [
        f"reaper could not dead-letter payment {b.pk}; put off 60 s" for b in bad
    ]
    assert [r.payment_id for r in records] == [str(b.pk) for b in bad]
    assert all(r.exc_info is not None for r in records)
    # put off: the next run has nothing to do until their new lease ends
    assert reaper.reap_leases() == reaper.ReapResult()


def test_rows_that_keep_raising_do_not_hold_back_the_ones_behind_them(
    alice, settings, timer_path, monkeypatch
):
    """More bad rows than a run's budget reaches: each run puts off those it
    tried, so a later run reaches the good row behind them."""
    settings.PAYMENT_MAX_ATTEMPTS = 3
    settings.PAYMENT_REAPER_BUDGET_SECONDS = 0.5
    *_, good = _dead_letters(alice, 4)
    real = transitions.dead_letter

    def dead_letter(payment, *, now):
        if payment.pk != good.pk:
            raise ValueError("poison")
        return real(payment, now=now)

    monkeypatch.setattr(transitions, "dead_letter", dead_letter)
    ticks = iter(0.25 * i for i in range(1000))  # a run has time for one row
    monkeypatch.setattr(reaper, "time", SimpleNamespace(monotonic=lambda: next(ticks)))
    runs = [reaper.reap_leases() for _ in range(4)]
    assert [r.errors for r in runs] == [1, 1, 1, 0]
    assert runs[3].dead_lettered == 1
    assert Payment.objects.get(pk=good.pk).status == "FAILED"


def test_equal_leases_are_taken_in_id_order(alice, settings, timer_path, monkeypatch):
    settings.PAYMENT_MAX_ATTEMPTS = 3
    expired = db_now() - SECOND
    payments = [
        queued_payment(alice.account, alice.other_account, lease_expires_at=expired, attempts=3)
        for _ in range(3)
    ]
    ticks = iter(0.25 * i for i in range(1000))
    monkeypatch.setattr(reaper, "time", SimpleNamespace(monotonic=lambda: next(ticks)))
    assert reaper.reap_leases(budget_seconds=0.5).dead_lettered == 1
    first = min(payments, key=lambda p: p.pk)
    assert set(Payment.objects.filter(status="FAILED").values_list("pk", flat=True)) == {first.pk}


def test_a_transient_database_error_ends_the_run(alice, settings, timer_path, monkeypatch):
    """A lost connection would fail every other row the same way: the run stops at once."""
    from django.db import OperationalError

    settings.PAYMENT_MAX_ATTEMPTS = 3
    first, *_ = _dead_letters(alice, 3)
    _raise_for(monkeypatch, first.pk, OperationalError("server closed the connection"))
    with pytest.raises(OperationalError):
        reaper.reap_leases()
    assert set(Payment.objects.values_list("status", flat=True)) == {"QUEUED"}


def test_the_dead_letters_stop_at_the_time_budget_oldest_lease_first(
    alice, settings, timer_path, monkeypatch
):
    """The reaper shares the timer worker with the sweeper: a run of dead letters
    (a transaction each) starts none once PAYMENT_REAPER_BUDGET_SECONDS have passed."""
    settings.PAYMENT_MAX_ATTEMPTS = 3
    settings.PAYMENT_REAPER_BUDGET_SECONDS = 0.5
    payments = _dead_letters(alice, 4)
    requeue = queued_payment(
        alice.account, alice.other_account, lease_expires_at=db_now() - SECOND, attempts=1
    )
    ticks = iter(0.25 * i for i in range(100))  # each look at the clock: 0.25 s later
    monkeypatch.setattr(reaper, "time", SimpleNamespace(monotonic=lambda: next(ticks)))
    result = reaper.reap_leases()
    assert result == reaper.ReapResult(requeued=1, dead_lettered=1, budget_exhausted=True)
    failed = set(Payment.objects.filter(status="FAILED").values_list("pk", flat=True))
    assert failed == {payments[0].pk}
    assert Payment.objects.get(pk=requeue.pk).status == "PENDING"
    # a budget of nothing dead-letters nothing, and says so
    assert reaper.reap_leases(budget_seconds=0) == reaper.ReapResult(budget_exhausted=True)
    assert tasks.reap_leases()["budget_exhausted"] is True


def test_the_command_exits_non_zero_when_a_dead_letter_raised(
    alice, settings, timer_path, monkeypatch
):
    import io
    import json

    from django.core.management import call_command
    from django.core.management.base import CommandError

    settings.PAYMENT_MAX_ATTEMPTS = 3
    bad, good = _dead_letters(alice, 2)
    _raise_for(monkeypatch, bad.pk, ValueError("poison"))
    out = io.StringIO()
    with pytest.raises(CommandError, match="1 payment"):
        call_command("reap_leases", "--json", stdout=out)
    assert json.loads(out.getvalue()) == {
        "requeued": 0,
        "dead_lettered": 1,
        "errors": 1,
        "timed_out": 0,
        "budget_exhausted": False,
    }
    assert Payment.objects.get(pk=good.pk).status == "FAILED"


def test_a_row_that_cannot_even_be_put_off_is_logged_and_the_run_goes_on(
    alice, settings, timer_path, monkeypatch, caplog
):
    settings.PAYMENT_MAX_ATTEMPTS = 3
    bad, good = _dead_letters(alice, 2)
    _raise_for(monkeypatch, bad.pk, ValueError("poison"))

    def put_off(payment, **kwargs):
        raise ValueError("cannot write it either")

    monkeypatch.setattr(transitions, "dead_letter_put_off", put_off)
    assert reaper.reap_leases() == reaper.ReapResult(dead_lettered=1, errors=1)
    messages = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert messages == [
        f"reaper could not dead-letter payment {bad.pk}; put off 60 s",
        f"reaper could not put off payment {bad.pk} either",
    ]
    assert Payment.objects.get(pk=good.pk).status == "FAILED"
