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
    """Shown as-is everywhere (API, admin, logs), so support and clients read the same word."""

    PENDING = "PENDING", "PENDING"
    QUEUED = "QUEUED", "QUEUED"
    EXECUTING = "EXECUTING", "EXECUTING"
    COMPLETED = "COMPLETED", "COMPLETED"
    FAILED = "FAILED", "FAILED"
    CANCELLED = "CANCELLED", "CANCELLED"


# error_code of a payment the reaper gave up on: a dead letter staff can retry.
DEAD_LETTER_CODE = "max_attempts_exceeded"
OPEN_STATUSES = (PaymentStatus.PENDING, PaymentStatus.QUEUED)
TERMINAL_STATUSES = (PaymentStatus.COMPLETED, PaymentStatus.FAILED, PaymentStatus.CANCELLED)


class Payment(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    # Indexes cost every write: status changes are never HOT updates, so each
    # claim and each completion writes one entry into every index of the table.
    # A foreign key that another index already leads with has no index of its
    # own, one that is NULL on most rows has a partial index (see Meta), and one
    # that nothing looks payments up by (the target account, the hold: neither
    # is ever deleted, and no query filters on them) has none.
    from_account = models.ForeignKey(
        "ledger.Account",
        on_delete=models.PROTECT,
        related_name="outgoing_payments",
        db_index=False,  # payments_by_account leads with it
    )
    to_account = models.ForeignKey(
        "ledger.Account",
        on_delete=models.PROTECT,
        related_name="incoming_payments",
        db_index=False,  # no query filters on it (above)
    )
    # Denormalised so a client's listing is one index range (payments_by_owner)
    # instead of a join over every payment of every account it owns. Accounts
    # never change owner, so it is fixed at creation; the trigger
    # payments_payment_owner (migration 0010) refuses a row whose owner is not
    # its source account's. NULL only when the source account has no owner
    # (no client can see such a payment).
    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        editable=False,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,  # payments_by_owner leads with owner
        help_text="The source account's owner (the client who sees this payment).",
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
        "ledger.Hold",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,  # no query filters on it (above)
    )
    # One payment per entry (payments_one_per_entry, Meta): a partial unique
    # index, so the rows without an entry yet — every PENDING and QUEUED one —
    # write no entry into it when inserted or claimed.
    journal_entry = models.ForeignKey(
        "ledger.JournalEntry",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="payments",  # a manager: at most one, by the constraint
        db_index=False,
    )
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.CharField(max_length=255, blank=True)
    recurring = models.ForeignKey(
        "RecurringPayment",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="payments",
        db_index=False,  # payments_by_recurring, partial: most payments are one-off
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now())
    executed_at = models.DateTimeField(null=True, blank=True)
    cancelled_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["journal_entry"],
                condition=Q(journal_entry__isnull=False),
                name="payments_one_per_entry",
            ),
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
            # The executor's collapse (``locks.lock_due_queued``): the due QUEUED
            # payments of one partition, oldest first.
            models.Index(
                fields=["partition", "due_at"],
                condition=Q(status="QUEUED"),
                name="payments_queued_partition_due",
            ),
            # Client listing, newest first (GET /payments): one index range per
            # client, keyset-paged, so page 1,000 costs what page 1 does.
            models.Index(fields=["owner", "-created_at", "-id"], name="payments_by_owner"),
            # ... filtered by status. Without it a rare status (FAILED among a
            # million COMPLETED) scans the client's whole history. The price: status
            # changes are never HOT updates (other indexes already name status),
            # so every transition writes one more index entry.
            models.Index(
                fields=["owner", "status", "-created_at", "-id"], name="payments_by_owner_status"
            ),
            # ... filtered by account.
            models.Index(fields=["from_account", "-created_at", "-id"], name="payments_by_account"),
            # By status (the dead letters, the open backlog by due time): every
            # status but COMPLETED, which most rows are, so a completion writes
            # no entry into it. The admin's list filtered to COMPLETED reads the
            # table as its unfiltered list does (a sort of the rows it keeps).
            models.Index(
                fields=["status", "due_at"],
                condition=~Q(status="COMPLETED"),
                name="payments_unfinished_status_due",
            ),
            models.Index(
                fields=["recurring"],
                condition=Q(recurring__isnull=False),
                name="payments_by_recurring",
            ),
        ]
        permissions = [
            ("cancel_payment", "Can cancel payments (audited)"),
            ("retry_payment", "Can retry dead-lettered payments (audited)"),
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


# Every PaymentEvent.type the code writes: the API's PaymentEventTypeEnum
# (tests/payments/test_schema.py checks that no other literal is written).
PAYMENT_EVENT_TYPES = (
    "scheduled",
    "queued",
    "executed",
    "failed",
    "cancelled",
    "rescheduled",
    "amount_changed",
    "description_changed",
    "lease_expired",
    "unqueued",
    "dead_lettered",
    "dead_letter_failed",
    "retried",
)


class PaymentEvent(models.Model):
    """Append-only audit trail: one row per transition or change."""

    payment = models.ForeignKey(
        Payment,
        on_delete=models.PROTECT,
        related_name="events",
        db_index=False,  # payments_event_by_payment leads with it
    )
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
        db_index=False,  # payments_event_by_user, partial: the engine's events have none
    )
    fence = models.BigIntegerField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        indexes = [
            models.Index(fields=["payment", "id"], name="payments_event_by_payment"),
            models.Index(
                fields=["actor_user"],
                condition=Q(actor_user__isnull=False),
                name="payments_event_by_user",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.type} {self.from_status}→{self.to_status} by {self.actor}"


class AttemptOutcome(models.TextChoices):
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed (business rule)"
    RETRY = "retry", "Retry (transient error)"
    STALE = "stale", "Stale delivery"


class PaymentAttempt(models.Model):
    """One execution try: who ran it, with which fence, how long, and how it ended."""

    payment = models.ForeignKey(
        Payment,
        on_delete=models.PROTECT,
        related_name="attempt_log",
        db_index=False,  # payments_attempt_by_payment leads with it
    )
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
    """A client's bearer token. Only its SHA-256 is stored; the token is shown once.

    Issued and revoked only through ``payments.tokens`` (admin, commands),
    which writes an ``ApiTokenEvent`` for each. A revoked token is refused
    from the next request on.
    """

    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens"
    )
    name = models.CharField(max_length=100, blank=True)
    prefix = models.CharField(max_length=12, help_text="First characters, to recognise it.")
    key_hash = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name = "API token"
        permissions = [("manage_api_tokens", "Can issue and revoke API tokens (audited)")]

    def __str__(self) -> str:
        return f"{self.prefix}… ({self.user})"


class ApiTokenAction(models.TextChoices):
    ISSUED = "issued", "Issued"
    REVOKED = "revoked", "Revoked"


class ApiTokenVia(models.TextChoices):
    ADMIN = "admin", "Admin"
    CLI = "cli", "Command line"


class ApiTokenEvent(models.Model):
    """Append-only audit of API tokens: each issue and revocation, by whom and through what.

    ``actor`` is the staff user in the admin; empty from the command line,
    where the operator's shell is the record.
    """

    token = models.ForeignKey(
        ApiToken,
        on_delete=models.PROTECT,
        related_name="events",
        db_index=False,  # payments_tokenevent_by_token leads with it
    )
    action = models.CharField(max_length=8, choices=ApiTokenAction.choices)
    actor = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
    )
    via = models.CharField(max_length=8, choices=ApiTokenVia.choices)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        verbose_name = "API token event"
        indexes = [models.Index(fields=["token", "id"], name="payments_tokenevent_by_token")]
        constraints = [
            models.CheckConstraint(
                condition=Q(action__in=ApiTokenAction.values), name="payments_tokenevent_action"
            ),
            models.CheckConstraint(
                condition=Q(via__in=ApiTokenVia.values), name="payments_tokenevent_via"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.token} {self.action} via {self.via}"


class IdempotencyStatus(models.TextChoices):
    IN_FLIGHT = "in_flight", "In flight"
    COMPLETED = "completed", "Completed"


class IdempotencyKey(models.Model):
    """Stripe-style idempotency: one row per (client, key), kept 24 h.

    The UNIQUE (client, key) constraint is what makes two concurrent requests
    with one key resolve to a single execution.
    """

    client = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        on_delete=models.CASCADE,
        related_name="+",
        db_index=False,  # payments_idempotency_unique leads with it
    )
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


class RecurringStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    PAUSED = "paused", "Paused"
    ENDED = "ended", "Ended"
    CANCELLED = "cancelled", "Cancelled"


class RecurringPayment(models.Model):
    """A schedule producing one ordinary payment per occurrence (DESIGN §4.2).

    ``last_occurrence_at`` is the cursor: the latest occurrence instant already
    handled (materialised, failed or skipped); ``next_run_at`` the next planned
    one (None once the schedule has ended).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    from_account = models.ForeignKey(
        "ledger.Account",
        on_delete=models.PROTECT,
        related_name="+",
        db_index=False,  # recurring_by_account leads with it
    )
    to_account = models.ForeignKey("ledger.Account", on_delete=models.PROTECT, related_name="+")
    amount = models.BigIntegerField()
    description = models.CharField(max_length=255, blank=True)
    cron = models.CharField(max_length=100, blank=True)
    interval_seconds = models.PositiveIntegerField(null=True, blank=True)
    timezone = models.CharField(max_length=64, default="UTC")
    start_time = models.DateTimeField()
    end_time = models.DateTimeField(null=True, blank=True)
    max_occurrences = models.PositiveIntegerField(null=True, blank=True)
    jitter_seconds = models.PositiveIntegerField(default=0)
    dst_nonexistent = models.CharField(max_length=8, default="shift")
    dst_ambiguous = models.CharField(max_length=8, default="first")
    missed_run_policy = models.CharField(max_length=8, default="skip")
    max_catch_up = models.PositiveIntegerField(default=10)
    max_consecutive_failures = models.PositiveIntegerField(default=3)
    status = models.CharField(
        max_length=16, choices=RecurringStatus.choices, default=RecurringStatus.ACTIVE
    )
    status_reason = models.CharField(max_length=255, blank=True)
    last_occurrence_at = models.DateTimeField(null=True, blank=True)
    next_run_at = models.DateTimeField(null=True, blank=True)
    occurrences_run = models.PositiveIntegerField(default=0)
    consecutive_failures = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="recurring_amount_positive"),
            models.CheckConstraint(
                condition=(Q(cron="") & Q(interval_seconds__isnull=False))
                | (~Q(cron="") & Q(interval_seconds__isnull=True)),
                name="recurring_cron_xor_interval",
            ),
        ]
        indexes = [
            models.Index(
                fields=["next_run_at"],
                condition=Q(status="active"),
                name="recurring_active_next_run",
            ),
            models.Index(fields=["from_account", "-created_at"], name="recurring_by_account"),
        ]

    def __str__(self) -> str:
        return f"recurring {self.pk} {self.cron or f'every {self.interval_seconds}s'}"


class OccurrenceStatus(models.TextChoices):
    SCHEDULED = "scheduled", "Scheduled (payment created)"
    FAILED = "failed", "Failed (not funded)"
    SKIPPED = "skipped", "Skipped"


class RecurringOccurrence(models.Model):
    """One occurrence of a schedule and what became of it.

    UNIQUE (recurring, scheduled_for): two materialisers can never create the
    same occurrence twice, whatever their timing.
    """

    recurring = models.ForeignKey(
        RecurringPayment,
        on_delete=models.PROTECT,
        related_name="occurrences",
        db_index=False,  # recurring_occurrence_unique leads with it
    )
    scheduled_for = models.DateTimeField()
    status = models.CharField(max_length=16, choices=OccurrenceStatus.choices)
    reason = models.CharField(max_length=64, blank=True)
    payment = models.OneToOneField(
        Payment, null=True, blank=True, on_delete=models.PROTECT, related_name="occurrence"
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["recurring", "scheduled_for"], name="recurring_occurrence_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.recurring_id} @ {self.scheduled_for:%Y-%m-%d %H:%M}Z {self.outcome}"

    @property
    def outcome(self) -> str:
        """What became of the occurrence: once its payment has run or been cancelled,
        the payment's outcome (``completed``, ``failed``, ``cancelled``), else the
        stored status (``scheduled``, ``failed`` — not funded —, ``skipped``)."""
        if self.status == OccurrenceStatus.SCHEDULED and self.payment_id is not None:
            return OCCURRENCE_OUTCOME_OF_PAYMENT.get(self.payment.status, self.status)
        return self.status


class RecurringBacklog(models.Model):
    """Occurrences a schedule left behind when it stopped: the instants in
    (``after``, ``until``] that were due when it was paused or cancelled but
    not yet handled — a catch-up after downtime still going (the materialiser
    handles a bounded number of instants per run), or an occurrence still
    inside the missed-run grace. None of them runs; the materialiser records
    each ``skipped`` (reason ``paused`` or ``cancelled``), a bounded number per
    run, moving ``after`` on and deleting the row when it reaches ``until``
    (DESIGN §4.2: each missed occurrence is recorded, never dropped).

    ``after`` None: from the schedule's start_time (nothing was handled yet).
    """

    recurring = models.ForeignKey(
        RecurringPayment, on_delete=models.CASCADE, related_name="backlog"
    )
    after = models.DateTimeField(null=True, blank=True)
    until = models.DateTimeField()
    reason = models.CharField(max_length=64)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    def __str__(self) -> str:
        return f"{self.recurring_id} ({self.after}, {self.until}] {self.reason}"


OCCURRENCE_OUTCOME_OF_PAYMENT = {
    PaymentStatus.COMPLETED: "completed",
    PaymentStatus.FAILED: "failed",
    PaymentStatus.CANCELLED: "cancelled",
}
OCCURRENCE_OUTCOMES = ("scheduled", "completed", "failed", "cancelled", "skipped")


class WebhookEndpoint(models.Model):
    """A client's URL for event notifications, signed with a per-endpoint secret.

    The secret is stored only encrypted (``payments.webhook_secrets``). The
    circuit-breaker fields are changed only under this row's lock
    (``payments.webhooks``): ``consecutive_failures`` counts failed attempts
    since the last success; ``circuit_open_until`` set means no request before
    that time (while a probe is in flight it is the probe's lease);
    ``circuit_opens`` counts re-opens since the last success (the cool-down
    doubles with each).
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    client = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="webhook_endpoints"
    )
    url = models.URLField(max_length=500)
    secret_ciphertext = models.TextField(editable=False)
    event_types = models.JSONField(default=list)
    is_active = models.BooleanField(default=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    consecutive_failures = models.PositiveIntegerField(default=0)
    circuit_open_until = models.DateTimeField(null=True, blank=True)
    circuit_opens = models.PositiveIntegerField(default=0)

    def __str__(self) -> str:
        return self.url


class DeliveryStatus(models.TextChoices):
    PENDING = "pending", "Pending"
    SUCCEEDED = "succeeded", "Succeeded"
    FAILED = "failed", "Failed (gave up)"


class WebhookEvent(models.Model):
    """The outbox: one row per event for a client with a subscribed endpoint, written
    in the transaction that caused the event, so a rolled-back change sends nothing.

    One row per event, not per endpoint: the payment workers' cost of an event
    does not grow with how many endpoints its client registered. The webhook
    worker expands it into one ``WebhookDelivery`` per endpoint
    (``webhooks.dispatch``) and stamps ``dispatched_at``.
    """

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    client = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    event_type = models.CharField(max_length=64)
    data = models.JSONField()
    created_at = models.DateTimeField()
    dispatched_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        indexes = [
            models.Index(
                fields=["created_at"],
                condition=Q(dispatched_at__isnull=True),
                name="webhook_event_undispatched",
            ),
            # the retention purge's oldest dispatched events (set by the webhook
            # worker: an event's insert, in the payment's transaction, adds no entry)
            models.Index(
                fields=["dispatched_at"],
                condition=Q(dispatched_at__isnull=False),
                name="webhook_event_dispatched",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} for {self.client_id}"


class WebhookDelivery(models.Model):
    """One event for one endpoint, expanded from a ``WebhookEvent`` by the webhook
    worker (older rows have no event: they were written directly)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    endpoint = models.ForeignKey(
        WebhookEndpoint,
        on_delete=models.CASCADE,
        related_name="deliveries",
        db_index=False,  # webhook_delivery_log leads with it
    )
    event = models.ForeignKey(
        WebhookEvent,
        null=True,
        blank=True,
        on_delete=models.CASCADE,
        related_name="deliveries",
        db_index=False,  # webhook_delivery_once leads with it
    )
    event_type = models.CharField(max_length=64)
    payload = models.JSONField()
    status = models.CharField(
        max_length=16, choices=DeliveryStatus.choices, default=DeliveryStatus.PENDING
    )
    attempts = models.PositiveIntegerField(default=0)
    next_attempt_at = models.DateTimeField(db_default=Now())
    last_status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    last_error = models.CharField(max_length=255, blank=True)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        verbose_name_plural = "webhook deliveries"
        constraints = [
            # an event is expanded once per endpoint, however many dispatchers run
            models.UniqueConstraint(fields=["event", "endpoint"], name="webhook_delivery_once")
        ]
        indexes = [
            # the beat's scan of due deliveries, in turns across endpoints
            # (webhooks.due_delivery_ids), and an endpoint's put-off ones
            models.Index(
                fields=["endpoint", "next_attempt_at"],
                condition=Q(status="pending"),
                name="webhook_pending_by_endpoint",
            ),
            # the delivery log's keyset pages (and the endpoint's foreign key)
            models.Index(fields=["endpoint", "-created_at", "-id"], name="webhook_delivery_log"),
            # the retention purge's oldest finished deliveries (webhooks.purge_finished)
            models.Index(
                fields=["created_at"],
                condition=Q(status__in=["succeeded", "failed"]),
                name="webhook_delivery_finished",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.event_type} → {self.endpoint_id} ({self.status})"


class WebhookAttempt(models.Model):
    delivery = models.ForeignKey(
        WebhookDelivery, on_delete=models.CASCADE, related_name="attempt_log"
    )
    number = models.PositiveIntegerField()
    status_code = models.PositiveSmallIntegerField(null=True, blank=True)
    error = models.CharField(max_length=255, blank=True)
    duration_ms = models.PositiveIntegerField(default=0)
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    def __str__(self) -> str:
        return f"attempt {self.number}: {self.status_code or self.error}"


class DeadLetter(Payment):
    """Payments the reaper gave up on (FAILED ``max_attempts_exceeded``), for the admin."""

    class Meta:
        proxy = True
        verbose_name = "dead letter"
