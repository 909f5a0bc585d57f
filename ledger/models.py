"""Double-entry ledger: accounts, holds, journal entries and postings.

Invariants (DESIGN §3), enforced by PostgreSQL and checked by
``manage.py reconcile_ledger``:

1. the postings of every entry sum to zero; all balances sum to zero
   (the issuance account included);
2. ``account.balance`` is the sum of its postings, ``account.held`` the sum of
   its active holds, and ``balance - held >= 0`` unless ``allow_negative``;
3. a journal entry's ``reference`` is unique: the same payment can never post
   twice, whatever the queue delivers.

The CHECK constraints below are created on every backend; the zero-sum
constraint trigger and the append-only triggers are PostgreSQL-only
(``0002_ledger_triggers``).

Money is integer units ("Robux") in ``BigIntegerField``; never floats.
"""

from django.conf import settings
from django.db import models
from django.db.models import F, Q
from django.db.models.functions import Now


class AccountStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    FROZEN = "frozen", "Frozen"
    CLOSED = "closed", "Closed"


class Account(models.Model):
    """A holder of funds.

    ``balance`` is posted money, ``held`` the part reserved by active holds;
    ``available = balance - held``. Both change only through
    ``ledger.services`` under a row lock, and ``version`` is bumped each time.

    An account never changes owner once created (the admin shows the owner
    read-only): payments copy their source account's owner to list a
    client's payments from one index (``payments.Payment.owner``).
    """

    ISSUANCE = "issuance"

    owner = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="accounts",
        help_text="Empty for system accounts.",
    )
    name = models.CharField(max_length=100, blank=True)
    system_code = models.CharField(
        max_length=32,
        unique=True,
        null=True,
        blank=True,
        help_text="Set only on system accounts, e.g. 'issuance'.",
    )
    balance = models.BigIntegerField(default=0)
    held = models.BigIntegerField(default=0)
    version = models.BigIntegerField(default=0)
    status = models.CharField(
        max_length=16, choices=AccountStatus.choices, default=AccountStatus.ACTIVE
    )
    max_payment_amount = models.BigIntegerField(default=1_000_000)
    allow_negative = models.BooleanField(default=False)
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    updated_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        constraints = [
            models.CheckConstraint(
                condition=Q(held__gte=0), name="ledger_account_held_nonnegative"
            ),
            models.CheckConstraint(
                condition=Q(allow_negative=True) | Q(balance__gte=F("held")),
                name="ledger_account_available_nonnegative",
            ),
            models.CheckConstraint(
                condition=Q(allow_negative=False) | Q(system_code__isnull=False),
                name="ledger_account_negative_only_system",
            ),
            models.CheckConstraint(
                condition=Q(max_payment_amount__gte=1),
                name="ledger_account_max_payment_positive",
            ),
            models.CheckConstraint(
                condition=Q(status__in=AccountStatus.values), name="ledger_account_status_valid"
            ),
            # System accounts are never frozen or closed (account_set_status).
            models.CheckConstraint(
                condition=Q(system_code__isnull=True) | Q(status=AccountStatus.ACTIVE),
                name="ledger_account_system_active",
            ),
        ]
        permissions = [
            ("freeze_account", "Can freeze and unfreeze accounts"),
            ("post_adjustment", "Can post balance adjustments (balanced entries)"),
        ]

    def __str__(self) -> str:
        label = self.name or self.system_code or "account"
        return f"#{self.pk} {label}"

    MONEY_FIELDS = frozenset({"balance", "held"})

    def save(self, *args, **kwargs):
        """An existing account is saved only field by field, never money: a full save
        writes back the balance this instance read, undoing every posting since (the
        admin's change form did). Money moves through ``ledger.services``' SQL."""
        if not self._state.adding:
            fields = kwargs.get("update_fields")
            if fields is None or self.MONEY_FIELDS & set(fields):
                raise ValueError(
                    "An existing Account is saved with update_fields, and never its "
                    "balance or held: those change only through ledger.services' SQL."
                )
        super().save(*args, **kwargs)

    @property
    def available(self) -> int:
        return self.balance - self.held


class HoldStatus(models.TextChoices):
    ACTIVE = "active", "Active"
    CAPTURED = "captured", "Captured"
    RELEASED = "released", "Released"


class Hold(models.Model):
    """Funds reserved on an account until captured by a transfer or released."""

    # Neither key has an index of its own (ledger 0006): a hold's row is
    # written twice a payment (placed, then captured or released, never a HOT
    # update: the status is in ``ledger_hold_active_by_account``'s predicate),
    # and each index on it is written each time. The active holds of an
    # account are found through that partial index; no query looks holds up by
    # their entry, and neither parent is ever deleted (the admin refuses both;
    # journal entries are append-only in the database), so no PROTECT or
    # foreign-key check looks for the holds either.
    account = models.ForeignKey(
        Account, on_delete=models.PROTECT, related_name="holds", db_index=False
    )
    amount = models.BigIntegerField()
    status = models.CharField(max_length=16, choices=HoldStatus.choices, default=HoldStatus.ACTIVE)
    reference = models.CharField(max_length=128, blank=True)
    entry = models.ForeignKey(
        "JournalEntry",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="captured_holds",
        help_text="The entry that captured this hold.",
        db_index=False,
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)
    resolved_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.CheckConstraint(condition=Q(amount__gt=0), name="ledger_hold_amount_positive"),
            models.CheckConstraint(
                condition=Q(status__in=HoldStatus.values), name="ledger_hold_status_valid"
            ),
            models.CheckConstraint(
                condition=~Q(status=HoldStatus.CAPTURED) | Q(entry__isnull=False),
                name="ledger_hold_captured_has_entry",
            ),
        ]
        indexes = [
            models.Index(
                fields=["account"],
                condition=Q(status="active"),
                name="ledger_hold_active_by_account",
            ),
        ]

    def __str__(self) -> str:
        return f"hold #{self.pk} {self.amount} on account {self.account_id} ({self.status})"


class EntryKind(models.TextChoices):
    DEPOSIT = "deposit", "Deposit (issuance)"
    TRANSFER = "transfer", "Transfer"
    ADJUSTMENT = "adjustment", "Staff adjustment"
    REVERSAL = "reversal", "Reversal"


class JournalEntry(models.Model):
    """One movement of money: two or more postings summing to zero.

    Entries are append-only; a mistake is corrected by a reversing entry.
    ``reference`` is the idempotency fence: a payment posts with
    ``payment:<id>`` and the UNIQUE constraint makes a second post impossible.
    """

    kind = models.CharField(max_length=16, choices=EntryKind.choices)
    reference = models.CharField(max_length=128, unique=True, null=True, blank=True)
    description = models.CharField(max_length=255, blank=True)
    reverses = models.OneToOneField(
        "self",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="reversed_by",
    )
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="+",
        help_text="Staff user for adjustments; empty for system entries.",
        db_index=False,  # ledger_entry_by_creator, partial: system entries have none
    )
    created_at = models.DateTimeField(db_default=Now(), editable=False)

    class Meta:
        verbose_name_plural = "journal entries"
        constraints = [
            models.CheckConstraint(
                condition=Q(kind__in=EntryKind.values), name="ledger_entry_kind_valid"
            ),
        ]
        indexes = [
            # Every executed payment writes an entry; an index over a column
            # that is NULL on nearly all of them would be written for nothing.
            models.Index(
                fields=["created_by"],
                condition=Q(created_by__isnull=False),
                name="ledger_entry_by_creator",
            ),
        ]

    def __str__(self) -> str:
        return f"entry #{self.pk} {self.kind} {self.reference or ''}".strip()


class Posting(models.Model):
    """One leg of an entry: a signed amount on one account and the balance after it."""

    entry = models.ForeignKey(JournalEntry, on_delete=models.PROTECT, related_name="postings")
    account = models.ForeignKey(
        Account,
        on_delete=models.PROTECT,
        related_name="postings",
        db_index=False,  # ledger_posting_statement leads with it
    )
    amount = models.BigIntegerField()
    balance_after = models.BigIntegerField()

    class Meta:
        constraints = [
            models.CheckConstraint(condition=~Q(amount=0), name="ledger_posting_amount_nonzero"),
        ]
        indexes = [
            models.Index(fields=["account", "id"], name="ledger_posting_statement"),
        ]

    def __str__(self) -> str:
        return f"posting #{self.pk} {self.amount:+d} on account {self.account_id}"


class ReconciliationRun(models.Model):
    """One run of ``reconcile_ledger`` (command or beat), kept for the operations page."""

    started_at = models.DateTimeField()
    duration_seconds = models.FloatField()
    ok = models.BooleanField()
    mismatch_count = models.PositiveIntegerField()
    trigger = models.CharField(max_length=16, default="command")
    report = models.JSONField()

    class Meta:
        get_latest_by = "started_at"
        indexes = [models.Index(fields=["-started_at"], name="ledger_recon_latest")]

    def __str__(self) -> str:
        return f"reconciliation {self.started_at:%Y-%m-%d %H:%M} {'ok' if self.ok else 'MISMATCH'}"
