"""Every name bench takes from the service's apps, in one place.

When the apps move a name, re-point it here and nowhere else (the peers'
Celery task, ``bench/scenarios/peer_tasks.py``, imports ``transfer_post`` on
its own: it runs inside a worker, not in a bench process). Import this module
only after Django is set up (``bench.harness.db.prepare``), i.e. inside
functions.
"""

from ledger.models import Account, Hold, JournalEntry
from ledger.reconciliation import reconcile
from ledger.services import LedgerBatch, account_create, account_set_status, deposit
from payments import tasks, transitions
from payments.clock import db_now
from payments.engine import sweeper
from payments.engine.executor import execute_chunk
from payments.models import (
    DEAD_LETTER_CODE,
    OPEN_STATUSES,
    TERMINAL_STATUSES,
    Actor,
    OccurrenceStatus,
    Payment,
    PaymentAttempt,
    PaymentEvent,
    PaymentStatus,
    RecurringOccurrence,
    RecurringPayment,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
)
from payments.routing import partition_for
from payments.services import recurring_create
from payments.webhook_secrets import encrypt as encrypt_webhook_secret
from payments.webhooks import endpoint_create, new_secret


def claim_batch(limit: int, lookahead: float):
    """The sweeper's claim (PENDING → QUEUED) without publishing; caller's transaction."""
    return transitions.claim_due(limit=limit, lookahead=lookahead)


def sweep_due(max_batches: int = 50):
    """One sweep as the timer worker runs it: claim, commit, publish."""
    return sweeper.sweep_due(publish=tasks.publish_chunks, max_batches=max_batches)


def schedule_many(*, sources, items):
    """Funded PENDING payments with their holds and events (``transitions.schedule_many``)."""
    return transitions.schedule_many(LedgerBatch(account_ids=sources), items, actor=Actor.CLIENT)


__all__ = [
    "DEAD_LETTER_CODE",
    "OPEN_STATUSES",
    "TERMINAL_STATUSES",
    "Account",
    "Hold",
    "JournalEntry",
    "LedgerBatch",
    "OccurrenceStatus",
    "Payment",
    "PaymentAttempt",
    "PaymentEvent",
    "PaymentStatus",
    "RecurringOccurrence",
    "RecurringPayment",
    "WebhookAttempt",
    "WebhookDelivery",
    "WebhookEndpoint",
    "account_create",
    "account_set_status",
    "claim_batch",
    "db_now",
    "deposit",
    "encrypt_webhook_secret",
    "endpoint_create",
    "execute_chunk",
    "new_secret",
    "partition_for",
    "reconcile",
    "recurring_create",
    "schedule_many",
    "sweep_due",
]
