"""Test data, fast: funded accounts and PENDING payments with their holds."""

from __future__ import annotations


def fund_accounts(count: int, balance: int, *, owner=None, name: str = "bench") -> list[int]:
    """Create ``count`` active accounts, each funded with ``balance`` (0 → unfunded)."""
    from bench.harness.app import account_create, deposit

    ids = []
    for _ in range(count):
        account = account_create(owner=owner, name=name)
        if balance:
            deposit(account_id=account.pk, amount=balance)
        ids.append(account.pk)
    return ids


def bulk_schedule(*, sources, targets, count, amount, due_at, batch=5_000) -> list[str]:
    """Insert ``count`` PENDING payments with their holds, ``batch`` per transaction."""
    ids: list[str] = []
    for start in range(0, count, batch):
        ids += _bulk_schedule_batch(
            sources=sources,
            targets=targets,
            count=min(batch, count - start),
            amount=amount,
            due_at=due_at,
        )
    return ids


def _bulk_schedule_batch(*, sources, targets, count, amount, due_at):
    """Create ``count`` funded PENDING payments fast (one transaction, bulk inserts).

    Same rows the API would write (hold placed through the ledger), minus
    the per-request overhead; round-robin over sources and targets.

    A copy of ``tests/payments/engine.py``'s ``bulk_schedule`` (bench does not
    import ``tests``); to be replaced by the app's own bulk-scheduling function.
    """
    import uuid

    from django.db import transaction

    from bench.harness.app import LedgerBatch, Payment, partition_for

    payments = []
    with transaction.atomic():
        batch = LedgerBatch(account_ids=sources)
        for i in range(count):
            source = sources[i % len(sources)]
            target = targets[i % len(targets)]
            pid = uuid.uuid4()
            hold = batch.place_hold(account_id=source, amount=amount, reference=f"payment:{pid}")
            payments.append(
                Payment(
                    id=pid,
                    from_account_id=source,
                    to_account_id=target,
                    owner_id=batch.accounts[source].owner_id,
                    amount=amount,
                    due_at=due_at,
                    run_at=due_at,
                    partition=partition_for(source),
                    hold=hold,
                )
            )
        batch.flush()
        Payment.objects.bulk_create(payments)
    return [str(p.pk) for p in payments]
