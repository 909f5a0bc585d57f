"""Real threads on PostgreSQL: no deadlock surfaces, money is conserved."""

import random

import pytest
from django.core.management import call_command

from ledger import services as ledger
from ledger.exceptions import InsufficientFunds
from ledger.models import Account, JournalEntry
from tests.concurrency import run_in_threads
from tests.factories import AccountFactory

THREADS = 8
TRANSFERS_PER_THREAD = 500


@pytest.mark.django_db(transaction=True)
@pytest.mark.slow
def test_random_transfers_from_8_threads_conserve_money():
    accounts = [AccountFactory(funded=5_000).pk for _ in range(5)]
    total_before = sum(Account.objects.filter(pk__in=accounts).values_list("balance", flat=True))
    entries_before = JournalEntry.objects.count()
    outcomes = {"ok": 0, "insufficient": 0}

    def worker(index: int) -> None:
        rng = random.Random(index)
        for _ in range(TRANSFERS_PER_THREAD):
            source, target = rng.sample(accounts, 2)
            try:
                ledger.transfer_post(
                    from_account_id=source, to_account_id=target, amount=rng.randint(1, 400)
                )
                outcomes["ok"] += 1
            except InsufficientFunds:
                outcomes["insufficient"] += 1

    errors = run_in_threads(worker, THREADS)

    assert errors == []
    assert outcomes["ok"] + outcomes["insufficient"] == THREADS * TRANSFERS_PER_THREAD
    assert outcomes["ok"] > THREADS * TRANSFERS_PER_THREAD // 2
    assert JournalEntry.objects.count() - entries_before == outcomes["ok"]
    balances = list(Account.objects.filter(pk__in=accounts).values_list("balance", flat=True))
    assert sum(balances) == total_before
    assert min(balances) >= 0
    call_command("reconcile_ledger", "--no-progress")  # raises CommandError on any mismatch
