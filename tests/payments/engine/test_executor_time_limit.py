"""The executor's own time limit (``PAYMENT_BATCH_TIMEOUT_SECONDS``).

Payment workers run Celery's solo pool (Procfile), where Celery's soft and hard
time limits do not apply: a batch that waits forever would hold its worker
forever. The batch's transaction carries the limit in PostgreSQL instead
(``ledger.db.transaction_time_bound``): a statement past it is cancelled, the
batch rolls back with a transient error (the task retries, then splits), and
nothing of it is written.
"""

import threading
import time

import pytest
from django.db import OperationalError, connection, transaction

from ledger.db import set_local, transaction_time_bound
from ledger.models import Account
from payments.clock import db_now
from payments.engine import executor
from payments.models import Payment
from payments.tasks import TRANSIENT
from tests.concurrency import run_in_threads
from tests.factories import AccountFactory, UserFactory
from tests.payments.helpers import bulk_schedule, claim_batch, make_due

pytestmark = [pytest.mark.postgres]

HELD_SECONDS = 6.0


@pytest.mark.django_db(transaction=True)
def test_a_batch_that_waits_past_its_limit_is_cancelled_and_writes_nothing(settings):
    settings.PAYMENT_BATCH_TIMEOUT_SECONDS = 0.3
    owner = UserFactory()
    source, target = AccountFactory(owner=owner, funded=1_000).pk, AccountFactory().pk
    (pid,) = bulk_schedule(sources=[source], targets=[target], count=1, amount=7, due_at=db_now())
    make_due(pid, seconds_ago=5)
    with transaction.atomic():
        (claim,) = claim_batch(10, 0.0)
    locked, release = threading.Event(), threading.Event()

    def hold(_):
        # another session holds the payment row, as a stuck transaction would
        with transaction.atomic():
            Payment.objects.select_for_update().get(pk=pid)
            locked.set()
            release.wait(HELD_SECONDS)

    holder = threading.Thread(target=run_in_threads, args=(hold, 1))
    holder.start()
    try:
        assert locked.wait(10)
        started = time.monotonic()
        with pytest.raises(OperationalError) as caught:
            executor.execute_chunk([(claim.payment_id, claim.fence)])
        waited = time.monotonic() - started
    finally:
        release.set()
        holder.join(30)
    # cancelled at its limit, not when the lock was let go
    assert waited < HELD_SECONDS - 1, waited
    assert "statement timeout" in str(caught.value)
    assert isinstance(caught.value, TRANSIENT)  # the task retries it, then splits
    payment = Payment.objects.get(pk=pid)
    assert (payment.status, payment.fence) == ("QUEUED", claim.fence)
    assert Account.objects.get(pk=target).balance == 0
    # the lock gone, the same message runs
    result = executor.execute_chunk([(claim.payment_id, claim.fence)])
    assert result.completed == [pid]
    assert Account.objects.get(pk=target).balance == 7


def _setting(name: str) -> str:
    with connection.cursor() as cursor:
        cursor.execute(f"SHOW {name}")
        return cursor.fetchone()[0]


def test_a_limit_under_a_millisecond_is_one_never_0_which_would_be_none():
    """Whole milliseconds; under one is one (PostgreSQL reads 0 as no limit).
    Checked without the server: at 1 ms of idle time allowed, any pause of the
    client between two statements (a loaded CI host) ends the session — the
    limit working, not the test (seen once, beside a mutation run)."""
    assert transaction_time_bound(0.0004) == {
        "statement_timeout": "1",
        "idle_in_transaction_session_timeout": "1",
    }


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(("seconds", "shown"), [(0.25, "250ms"), (2.0, "2s")])
def test_the_limit_covers_statements_and_idle_time_and_ends_with_the_transaction(seconds, shown):
    before = (_setting("statement_timeout"), _setting("idle_in_transaction_session_timeout"))
    with transaction.atomic():
        set_local(transaction_time_bound(seconds))
        assert _setting("statement_timeout") == shown
        assert _setting("idle_in_transaction_session_timeout") == shown
    assert (_setting("statement_timeout"), _setting("idle_in_transaction_session_timeout")) == (
        before
    )
