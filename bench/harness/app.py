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
from payments.clock import db_now
from payments.execution import execute_chunk
from payments.models import (
    DEAD_LETTER_CODE,
    OPEN_STATUSES,
    TERMINAL_STATUSES,
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
from payments.recurring import recurring_create
from payments.scheduling import _claim_batch as claim_batch
from payments.scheduling import sweep_due
from payments.services import partition_for
from payments.webhook_secrets import encrypt as encrypt_webhook_secret
from payments.webhooks import endpoint_create, new_secret

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
    "sweep_due",
]
