"""The naive peers' task: one Celery task per payment (``bench/scenarios/peers.py``).

What a team writes without a durable timer: the payment is the message. The
task posts the transfer with no idempotency reference (nothing deduplicates a
second delivery) and logs the execution in ``bench_peer_execution``, a plain
table ``bench/scenarios/peers.py`` creates, in the same transaction — so a log row
exists exactly when money moved, and duplicate rows are duplicate payments.

Load it into a worker with ``celery -A scheduler_project worker -I
bench.scenarios.peer_tasks -Q peers``; it runs under the project's Celery settings
(acks_late, reject_on_worker_lost, prefetch 1, the broker's visibility
timeout), the same ones the service's own tasks get.
"""

from __future__ import annotations

from celery import shared_task
from django.db import connection, transaction

MODULE = "bench.scenarios.peer_tasks"  # what the peers' workers load (-I)
QUEUE = "peers"
TASK_NAME = "bench.peer_tasks.peer_transfer"  # its name from before bench/ was a suite


@shared_task(name=TASK_NAME, queue=QUEUE)
def peer_transfer(
    peer: str, payment_no: int, source: int, target: int, amount: int, due_at_iso: str
) -> None:
    """Move ``amount`` from ``source`` to ``target`` and log it, in one transaction."""
    from ledger.services import transfer_post  # the ledger's models need Django set up

    with transaction.atomic():
        transfer_post(
            from_account_id=source,
            to_account_id=target,
            amount=amount,
            description=f"{peer} payment {payment_no}",
        )
        with connection.cursor() as cursor:
            cursor.execute(
                "INSERT INTO bench_peer_execution (peer, payment_no, due_at) VALUES (%s, %s, %s)",
                [peer, payment_no, due_at_iso],
            )
