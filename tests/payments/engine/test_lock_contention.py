"""Schedule requests and executor batches on a few shared accounts, at once,
for a while: the kind of load a capacity run puts on one account row, here
concentrated on three rows so that what happens once in ~400,000 payments
there happens within seconds.

Every request and every batch must succeed: no database error of any kind
(``deadlock detected``, a lock timeout…) reaches the caller, and afterwards
the ledger reconciles and every executed payment moved its money once.

What it found: ``flush_balances`` took the account locks and updated the
rows in one statement; under this load that deadlocked inside PostgreSQL's
row locking (0 to 5 times per 40 s of a load like this one; never since the
lock is a statement of its own; ``ledger.services._LOCK_ACCOUNTS_SQL`` says why). The
interleaving needs a key-share lock taken by another transaction's
foreign-key check at the right moment, so this test finds it by load, not by
steps: at its default 12 s it failed 3 runs in 4 on the old statement.
``LOCK_CONTENTION_SECONDS=90`` runs it longer.
"""

import os
import random
import threading
import time
from collections import Counter

import pytest
from django.db import transaction

from ledger.models import Account, JournalEntry
from ledger.reconciliation import reconcile
from payments.engine import executor
from payments.models import Payment
from payments.services.payments import payment_schedule
from tests.concurrency import run_in_threads
from tests.factories import AccountFactory, UserFactory
from tests.payments.helpers import claim_batch

pytestmark = [pytest.mark.postgres, pytest.mark.django_db(transaction=True)]

SECONDS = float(os.environ.get("LOCK_CONTENTION_SECONDS", "12"))
SCHEDULERS, EXECUTORS = 3, 2
FUNDS = 10**9


def test_schedules_and_batches_on_shared_accounts_never_fail():
    owner = UserFactory()
    accounts = [AccountFactory(owner=owner, funded=FUNDS).pk for _ in range(3)]
    stop = time.monotonic() + SECONDS
    done: Counter = Counter()
    lock = threading.Lock()

    def schedule(rnd: random.Random) -> None:
        source, target = rnd.sample(accounts, 2)
        payment_schedule(
            client=owner, from_account_id=source, to_account_id=target, amount=1, delay_seconds=1
        )
        with lock:
            done["scheduled"] += 1

    def execute() -> None:
        with transaction.atomic():
            claims = claim_batch(50, 0.0)
        if not claims:
            time.sleep(0.01)
            return
        result = executor.execute_chunk([(c.payment_id, c.fence) for c in claims])
        with lock:
            done["completed"] += len(result.completed)

    def work(index: int) -> None:
        rnd = random.Random(index)
        while time.monotonic() < stop:
            schedule(rnd) if index < SCHEDULERS else execute()

    errors = run_in_threads(work, SCHEDULERS + EXECUTORS, timeout=SECONDS + 120)
    assert errors == [], [repr(e)[:500] for e in errors[:3]]
    assert done["scheduled"] > 100 and done["completed"] > 100, done
    assert Payment.objects.count() == done["scheduled"]
    completed = Payment.objects.filter(status="COMPLETED")
    assert completed.count() == done["completed"]
    assert (
        JournalEntry.objects.filter(reference__startswith="payment:").count() == done["completed"]
    )
    assert sum(Account.objects.filter(pk__in=accounts).values_list("balance", flat=True)) == (
        3 * FUNDS
    )
    assert reconcile().ok
