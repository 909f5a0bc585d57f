"""Payments: what clients schedule, its audit trail, and idempotency records.

A ``Payment`` moves ``amount`` from ``from_account`` to ``to_account`` at
``due_at``. Its funds are reserved by ``hold`` from scheduling until the
transfer captures it (COMPLETED) or it is released (CANCELLED / FAILED).
Every transition is a conditional update under a row lock and appends a
``PaymentEvent``; every execution try writes a ``PaymentAttempt``.

Durable-timer fields (DESIGN §4.1): ``run_at`` is when the sweeper may next
claim the row (``due_at``, or later after a retryable failure); ``fence`` is
bumped on every claim, cancel and reschedule, so a message carrying an old
fence is recognised as stale; ``lease_expires_at`` bounds how long a QUEUED
row may wait for a worker before the reaper takes it back.
"""

import uuid

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now


class PaymentStatus(models.TextChoices):
    PENDING = "PENDING", "Pending"
    QUEUED = "QUEUED", "Queued"
    EXECUTING = "EXECUTING", "Executing"
    COMPLETED = "COMPLETED", "Completed"
    FAILED = "FAILED", "Failed"
    CANCELLED = "CANCELLED", "Cancelled"


OPEN_STATUSES = (PaymentStatus.PENDING, PaymentStatus.QUEUED)
TERMINAL_STATUSES = (PaymentStatus.COMPLETED, PaymentStatus.FAILED, PaymentStatus.CANCELLED)


class Payment(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    from_account = models.ForeignKey(
        "ledger.Account", on_delete=models.PROTECT, related_name="outgoing_payments"
    )
    to_account = models.ForeignKey(
        "ledger.Account", on_delete=models.PROTECT, related_name="incoming_payments"
    )
    amount = models.BigIntegerField()
    description = models.CharField(max_length=255, blank=True)
    metadata = models.JSONField(default=dict, blank=True)
    status = models.CharField(
        max_length=16, choices=PaymentStatus.choices, default=PaymentStatus.PENDING
    )
    due_at = models.DateTimeField(help_text="The scheduled time; never executed before it.")
    run_at = models.DateTimeField(help_text="When the sweeper may next claim this payment.")
    partition = models.PositiveSmallIntegerField()
    fence = models.BigIntegerField(default=0)
    lease_expires_at = models.DateTimeField(null=True, blank=True)
    attempts = models.PositiveIntegerField(default=0)
    hold = models.ForeignKey(
        "ledger.Hold", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    journal_entry = models.OneToOneField(
        "ledger.JournalEntry",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="payment",
    )
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now())
    executed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="payments_amount_positive"),
            models.CheckConstraint(
                condition=~Q(from_account=F("to_account")), name="payments_distinct_accounts"
            ),
            models.CheckConstraint(
                condition=Q(status__in=PaymentStatus.values), name="payments_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status=PaymentStatus.COMPLETED)
                | Q(journal_entry__isnull=False, executed_at__isnull=False),
                name="payments_completed_has_entry",
            ),
            models.CheckConstraint(
                condition=Q(status=PaymentStatus.COMPLETED) | Q(journal_entry__isnull=True),
                name="payments_entry_only_when_completed",
            ),
        ]
        indexes = [
            # The sweeper's index: only PENDING rows, so its cost does not grow
            # with the number of completed or far-future-but-claimed payments.
            models.Index(
                fields=["run_at"], condition=Q(status="PENDING"), name="payments_pending_run_at"
            ),
            # The reaper's index: only QUEUED rows.
            models.Index(
                fields=["lease_expires_at"],
                condition=Q(status="QUEUED"),
                name="payments_queued_lease",
            ),
            # Client listing, newest first, optionally by account.
            models.Index(fields=["from_account", "-created_at", "-id"], name="payments_by_account"),
            models.Index(fields=["status", "due_at"], name="payments_status_due"),
        ]

    def __str__(self) -> str:
        return f"payment {self.pk} {self.amount} {self.status}"

    @property
    def reference(self) -> str:
        """The journal-entry reference: UNIQUE, so the money moves at most once."""
        return f"payment:{self.pk}"


class Actor(models.TextChoices):
    CLIENT = "client", "Client"
    SYSTEM = "system", "System"
    STAFF = "staff", "Staff"


class PaymentEvent(models.Model):
    """Append-only audit trail: one row per transition or change."""

    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="events")
    type = models.CharField(max_length=32)
    from_status = models.CharField(max_length=16, blank=True)
    to_status = models.CharField(max_length=16, blank=True)
    actor = models.CharField(max_length=8, choices=Actor.choices)
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    fence = models.BigIntegerField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        indexes = [models.Index(fields=["payment", "id"], name="payments_event_by_payment")]

    def __str__(self) -> str:
        return f"{self.type} {self.from_status}→{self.to_status} by {self.actor}"


class AttemptOutcome(models.TextChoices):
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed (business rule)"
    RETRY = "retry", "Retry (transient error)"
    STALE = "stale", "Stale delivery"


class PaymentAttempt(models.Model):
    """One execution try: who ran it, with which fence, how long, and how it ended."""

    payment = models.ForeignKey(Payment, on_delete=models.PROTECT, related_name="attempt_log")
    number = models.PositiveIntegerField()
    fence = models.BigIntegerField()
    worker = models.CharField(max_length=128, blank=True)
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    outcome = models.CharField(max_length=16, choices=AttemptOutcome.choices)
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.CharField(max_length=255, blank=True)

    class Meta:
        indexes = [models.Index(fields=["payment", "id"], name="payments_attempt_by_payment")]

    def __str__(self) -> str:
        return f"attempt {self.number} of {self.payment_id}: {self.outcome}"


class ApiToken(models.Model):
    """A client's bearer token. Only its SHA-256 is stored; the token is shown once."""

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class IdempotencyStatus(models.TextChoices):
    IN_FLIGHT = "in_flight", "In flight"
    COMPLETED = "completed", "Completed"


class IdempotencyKey(models.Model):
    """Stripe-style idempotency: one row per (client, key), kept 24 h.

    The UNIQUE (client, key) constraint is what makes two concurrent requests
    with one key resolve to a single execution.
    """

    client = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    key = models.CharField(max_length=255)
    fingerprint = models.CharField(max_length=64, help_text="SHA-256 of method, path and body.")
    status = models.CharField(max_length=16, choices=IdempotencyStatus.choices)
    response_status = models.PositiveSmallIntegerField(null=True, blank=True)
    response_body = models.JSONField(null=True, blank=True)
    locked_at = models.DateTimeField()
    created_at = models.DateTimeField()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["client", "key"], name="payments_idempotency_unique")
        ]
        indexes = [models.Index(fields=["created_at"], name="payments_idempotency_created")]

    def __str__(self) -> str:
        return f"{self.key} ({self.status})"
