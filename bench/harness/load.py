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
    """Create ``count`` funded PENDING payments in one transaction: the rows the
    API would write (``transitions.schedule_many``: hold placed through the
    ledger, a ``scheduled`` event each), minus the per-request overhead;
    round-robin over sources and targets."""
    from django.db import transaction

    from bench.harness.app import db_now, schedule_many

    now = db_now()
    items = [
        {
            "from_account_id": sources[i % len(sources)],
            "to_account_id": targets[i % len(targets)],
            "amount": amount,
            "due_at": due_at,
            "now": now,
        }
        for i in range(count)
    ]
    with transaction.atomic():
        payments = schedule_many(sources=sources, items=items)
    return [str(p.pk) for p in payments]
