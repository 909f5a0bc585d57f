"""What the payment row locks take, and what they leave to other transactions
(``payments.locks``; PostgreSQL — SQLite ignores lock clauses).

``FOR NO KEY UPDATE`` of the payment row only: another transaction may still
write rows that refer to the payment (its history: events, attempts — their
foreign-key checks take ``FOR KEY SHARE``) and lock the payment's accounts,
without waiting for the lock holder to commit.
"""

from datetime import timedelta

import pytest
from django.db import OperationalError, connection, transaction
from django.test.utils import CaptureQueriesContext

from ledger.models import Account
from payments import locks, transitions
from payments.clock import db_now
from payments.exceptions import NotFound
from payments.models import Payment, PaymentEvent, RecurringPayment, RecurringStatus
from tests.concurrency import commit_elsewhere, key_share
from tests.factories import AccountFactory, UserFactory
from tests.payments.helpers import bulk_schedule, claim_batch, make_due, make_schedule

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]


@pytest.fixture
def payment():
    owner = UserFactory()
    source = AccountFactory(owner=owner, funded=100).pk
    (pid,) = bulk_schedule(
        sources=[source], targets=[AccountFactory().pk], count=1, amount=10, due_at=db_now()
    )
    return Payment.objects.get(pk=pid)


def others_go_on(payment):
    """In another transaction: record an event for the payment and lock its source
    account — neither may wait for the caller's lock (1 s at most)."""

    def work():
        PaymentEvent.objects.create(
            payment_id=payment.pk, type="note", to_status=payment.status, actor="system"
        )
        Account.objects.select_for_update(nowait=True).get(pk=payment.from_account_id)

    commit_elsewhere(work, lock_timeout="1s")


@pytest.mark.parametrize("as_client", [False, True], ids=["staff", "client"])
def test_lock_payment_takes_the_payment_row_only(payment, as_client):
    client = payment.owner if as_client else None
    with transaction.atomic():
        locked = locks.lock_payment(payment.pk, client)
        with CaptureQueriesContext(connection) as queries:
            assert locked.from_account.owner_id == payment.owner_id  # read with it
        assert len(queries) == 0
        others_go_on(payment)
    assert PaymentEvent.objects.filter(payment=payment, type="note").count() == 1


def test_lock_chunk_takes_the_payment_rows_only_and_reads_the_clock(payment):
    with transaction.atomic():
        before = db_now()
        now, locked = locks.lock_chunk([str(payment.pk)])
        assert before <= now <= db_now()
        assert [p.pk for p in locked] == [payment.pk]
        others_go_on(payment)
    assert PaymentEvent.objects.filter(payment=payment, type="note").count() == 1


def test_lock_due_queued_takes_the_payment_rows_only(payment):
    with transaction.atomic():
        claim_batch(1, 0.0)
    later = db_now() + timedelta(seconds=1)
    with transaction.atomic():
        (locked,) = locks.lock_due_queued([payment.partition], now=later, limit=5)
        assert locked.pk == payment.pk
        others_go_on(payment)
    assert PaymentEvent.objects.filter(payment=payment, type="note").count() == 1


# --- the other rows: schedules, the client, the reaper's claim ----------------------


@pytest.fixture
def schedule():
    owner = UserFactory()
    source = AccountFactory(owner=owner, funded=100).pk
    return make_schedule(source, AccountFactory().pk, start=db_now() + timedelta(hours=1))


def schedule_others_go_on(schedule):
    """Another transaction references the schedule (an occurrence's insert) and
    locks its source account: neither waits for the schedule's lock."""

    assert key_share("payments_recurringpayment", schedule.pk) is None
    commit_elsewhere(
        lambda: Account.objects.select_for_update(nowait=True).get(pk=schedule.from_account_id),
        lock_timeout="1s",
    )


@pytest.mark.parametrize("as_client", [False, True], ids=["staff", "client"])
def test_lock_schedule_takes_the_schedule_row_only(schedule, as_client):
    client = schedule.from_account.owner if as_client else None
    with transaction.atomic():
        assert locks.lock_schedule(schedule.pk, client).pk == schedule.pk
        schedule_others_go_on(schedule)


def test_lock_schedule_of_another_client_is_not_found(schedule):
    with transaction.atomic(), pytest.raises(NotFound) as caught:
        locks.lock_schedule(schedule.pk, UserFactory())
    assert caught.value.message == f"Recurring payment {schedule.pk} not found."
    assert caught.value.details == {"recurring_payment_id": str(schedule.pk)}


def test_lock_active_schedule_takes_the_schedule_row_only_with_its_account_read(schedule):
    with transaction.atomic():
        locked = locks.lock_active_schedule(schedule.pk)
        with CaptureQueriesContext(connection) as queries:
            assert locked.from_account.pk == schedule.from_account_id  # read with it
        assert len(queries) == 0
        schedule_others_go_on(schedule)


def test_lock_active_schedule_waits_for_a_held_schedule_unless_told_to_skip(schedule):
    def try_elsewhere(**options):
        """The materialiser's lock in another transaction, while this test's one
        holds the schedule; it may wait 300 ms at most."""
        outcome = []

        def work():
            try:
                with transaction.atomic():
                    outcome.append(locks.lock_active_schedule(schedule.pk, **options))
            except OperationalError as exc:  # waited, then timed out
                outcome.append(exc)

        commit_elsewhere(work, lock_timeout="300ms")
        return outcome[0]

    with transaction.atomic():
        locks.lock_schedule(schedule.pk, None)
        assert try_elsewhere(skip_locked=True) is None  # left to the holder at once
        assert isinstance(try_elsewhere(skip_locked=False), OperationalError)
        assert isinstance(try_elsewhere(), OperationalError)  # the default waits


def test_lock_active_schedule_passes_over_a_schedule_that_is_not_active(schedule):
    RecurringPayment.objects.filter(pk=schedule.pk).update(status=RecurringStatus.PAUSED)
    with transaction.atomic():
        assert locks.lock_active_schedule(schedule.pk) is None


def test_lock_client_leaves_rows_that_reference_the_client_free():
    client = UserFactory()
    with transaction.atomic():
        locks.lock_client(client)
        assert key_share(client._meta.db_table, client.pk) is None


def test_lock_expired_claim_takes_only_a_queued_payment(payment):
    with transaction.atomic():
        assert locks.lock_expired_claim(payment.pk) is None  # PENDING: not a claim
    with transaction.atomic():
        claim_batch(1, 0.0)
    with transaction.atomic():
        assert locks.lock_expired_claim(payment.pk).pk == payment.pk


# --- the sweeper's hand-back (transitions.unclaim) -------------------------------------


def test_a_hand_back_skips_a_claim_an_executor_holds_and_blocks_no_reference(alice):
    """``SKIP LOCKED``: a claim an executor's batch holds is being run, and the
    hand-back must not wait for it (the sweep would stall behind a batch); and
    ``FOR NO KEY UPDATE``: an insert referencing a handed-back payment (an
    event, an attempt) is not kept waiting."""
    held, free = [alice.schedule().json()["payment_id"] for _ in range(2)]
    make_due(held, free)
    with transaction.atomic():
        claims = claim_batch(10)
    with transaction.atomic():
        Payment.objects.select_for_update().get(pk=held)  # the executor's batch
        commit_elsewhere(lambda: transitions.unclaim(claims))
    statuses = dict(Payment.objects.filter(pk__in=[held, free]).values_list("pk", "status"))
    assert {str(k): v for k, v in statuses.items()} == {held: "QUEUED", free: "PENDING"}
    bystander = alice.schedule().json()["payment_id"]  # QUEUED, not this sweep's claim
    make_due(bystander)
    with transaction.atomic():
        claims = claim_batch(10)
    (claim,) = [c for c in claims if c.payment_id == free]
    with transaction.atomic():
        assert transitions.unclaim([claim]) == 1
        assert key_share("payments_payment", claim.payment_id) is None
        # only its own claims are locked: an executor's batch taking another goes on
        commit_elsewhere(lambda: Payment.objects.select_for_update(nowait=True).get(pk=bystander))
