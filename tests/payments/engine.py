"""Helpers for engine tests: make payments due, capture published messages."""

from datetime import timedelta

from django.utils import timezone

from payments import scheduling
from payments.models import Payment


def make_due(*payment_ids, seconds_ago=1):
    when = timezone.now() - timedelta(seconds=seconds_ago)
    Payment.objects.filter(pk__in=payment_ids).update(due_at=when, run_at=when)


class Published(list):
    """Messages the sweeper would have sent: (queue, items, countdown)."""

    def items(self):
        return [tuple(item) for _, items, _ in self for item in items]


def capture_publish(monkeypatch) -> Published:
    from payments import tasks

    published = Published()

    def fake_apply_async(args, queue, countdown=None, **kwargs):
        published.append((queue, args[0], countdown))

    monkeypatch.setattr(tasks.execute_chunk, "apply_async", fake_apply_async)
    return published


def sweep(monkeypatch):
    published = capture_publish(monkeypatch)
    result = scheduling.sweep_due()
    return result, published


def bulk_schedule(*, sources, targets, count, amount, due_at):
    """Create ``count`` funded PENDING payments fast (one transaction, bulk inserts).

    Same rows the API would write (hold placed through the ledger), minus
    the per-request overhead; round-robin over sources and targets.
    """
    import uuid

    from django.db import transaction

    from ledger.services import LedgerBatch
    from payments.services import partition_for

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
