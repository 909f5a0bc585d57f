"""What the payment row locks take, and what they leave to other transactions
(``payments.locks``; PostgreSQL — SQLite ignores lock clauses).

``FOR NO KEY UPDATE`` of the payment row only: another transaction may still
write rows that refer to the payment (its history: events, attempts — their
foreign-key checks take ``FOR KEY SHARE``) and lock the payment's accounts,
without waiting for the lock holder to commit.
"""

from datetime import timedelta

import pytest
from django.db import connection, transaction
from django.test.utils import CaptureQueriesContext

from ledger.models import Account
from payments import locks
from payments.clock import db_now
from payments.models import Payment, PaymentEvent
from tests.concurrency import commit_elsewhere
from tests.factories import AccountFactory, UserFactory
from tests.payments.helpers import bulk_schedule, claim_batch

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
