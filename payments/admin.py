"""Admin for support staff: find, inspect, cancel and retry payments.

Nothing here edits a payment directly. Cancel and retry go through the same
services as the API (row lock, hold release, fence, audit event) and record
the staff user as the actor. They need the ``payments.cancel_payment`` /
``payments.retry_payment`` permissions, which the ``Support`` group has.
"""

import uuid

from django.contrib import admin, messages
from django.db.models import Q
from django.urls import reverse
from django.utils.html import format_html

from ledger.admin import ReadOnlyAdmin
from ledger.exceptions import LedgerError

from . import services
from .models import (
    DEAD_LETTER_CODE,
    Actor,
    DeadLetter,
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


class ReadOnlyInline(admin.TabularInline):
    extra = 0
    can_delete = False
    show_change_link = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


class PaymentEventInline(ReadOnlyInline):
    model = PaymentEvent
    fields = (
        "created_at",
        "type",
        "from_status",
        "to_status",
        "actor",
        "actor_user",
        "fence",
        "data",
    )
    readonly_fields = fields
    ordering = ("pk",)


class PaymentAttemptInline(ReadOnlyInline):
    model = PaymentAttempt
    fk_name = "payment"
    fields = (
        "number",
        "fence",
        "worker",
        "started_at",
        "finished_at",
        "outcome",
        "error_code",
        "error_message",
    )
    readonly_fields = fields
    ordering = ("pk",)


class DueFilter(admin.SimpleListFilter):
    title = "due"
    parameter_name = "due"

    def lookups(self, request, model_admin):
        return (
            ("overdue", "Overdue (open)"),
            ("hour", "Within the next hour"),
            ("day", "Within the next day"),
            ("later", "Later"),
        )

    def queryset(self, request, queryset):
        from datetime import timedelta

        from django.utils import timezone

        now = timezone.now()
        value = self.value()
        open_ = Q(status__in=[PaymentStatus.PENDING, PaymentStatus.QUEUED])
        if value == "overdue":
            return queryset.filter(open_, due_at__lt=now)
        if value == "hour":
            return queryset.filter(open_, due_at__gte=now, due_at__lt=now + timedelta(hours=1))
        if value == "day":
            return queryset.filter(open_, due_at__gte=now, due_at__lt=now + timedelta(days=1))
        if value == "later":
            return queryset.filter(open_, due_at__gte=now + timedelta(days=1))
        return queryset


class PaymentAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "status",
        "amount",
        "from_account",
        "to_account",
        "due_at",
        "executed_at",
        "attempts",
        "partition",
        "error_code",
    )
    list_filter = (
        "status",
        DueFilter,
        "partition",
        "error_code",
        ("due_at", admin.DateFieldListFilter),
    )
    search_fields = (
        "=from_account__id",
        "=to_account__id",
        "owner__username",
        "owner__email",
    )
    search_help_text = "Payment id, account id, or owner username / email."
    list_select_related = ("from_account", "to_account")
    readonly_fields = (
        "id",
        "status",
        "amount",
        "description",
        "metadata",
        "from_account",
        "to_account",
        "owner",
        "due_at",
        "run_at",
        "executed_at",
        "cancelled_at",
        "error_code",
        "error_message",
        "attempts",
        "fence",
        "partition",
        "lease_expires_at",
        "hold",
        "journal_entry_link",
        "recurring",
        "created_at",
        "updated_at",
    )
    fields = readonly_fields
    inlines = (PaymentEventInline, PaymentAttemptInline)
    actions = ("cancel_payments", "retry_dead_letters")
    date_hierarchy = "due_at"
    show_full_result_count = False  # no COUNT(*) over millions of rows per page view

    def get_search_results(self, request, queryset, search_term):
        """A payment id (UUID) is matched exactly, anything else as usual."""
        term = search_term.strip()
        try:
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            return super().get_search_results(request, queryset, search_term)

    @admin.display(description="journal entry")
    def journal_entry_link(self, obj):
        if obj.journal_entry_id is None:
            return "-"
        url = reverse("admin:ledger_journalentry_change", args=[obj.journal_entry_id])
        return format_html('<a href="{}">entry #{}</a>', url, obj.journal_entry_id)

    def has_cancel_permission(self, request):
        return request.user.has_perm("payments.cancel_payment")

    def has_retry_permission(self, request):
        return request.user.has_perm("payments.retry_payment")

    def _apply(self, request, queryset, service, verb):
        done = 0
        for payment_id in queryset.values_list("pk", flat=True):
            try:
                service(payment_id)
                done += 1
            except LedgerError as exc:
                self.message_user(request, f"{payment_id}: {exc.message}", messages.WARNING)
        if done:
            self.message_user(request, f"{done} payment(s) {verb}.", messages.SUCCESS)

    @admin.action(description="Cancel selected payments", permissions=["cancel"])
    def cancel_payments(self, request, queryset):
        self._apply(
            request,
            queryset,
            lambda pid: services.payment_cancel(
                payment_id=pid,
                actor=Actor.STAFF,
                actor_user=request.user,
                reason=f"cancelled by support ({request.user.get_username()})",
            ),
            "cancelled",
        )

    @admin.action(description="Retry selected dead letters", permissions=["retry"])
    def retry_dead_letters(self, request, queryset):
        self._apply(
            request,
            queryset,
            lambda pid: services.payment_retry_dead_letter(payment_id=pid, staff_user=request.user),
            "sent back for execution",
        )


admin.site.register(Payment, PaymentAdmin)


@admin.register(DeadLetter)
class DeadLetterAdmin(PaymentAdmin):
    """Payments the reaper gave up on; retry them once the cause is fixed."""

    actions = ("retry_dead_letters", "cancel_payments")
    list_filter = ("partition", ("updated_at", admin.DateFieldListFilter))

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .filter(status=PaymentStatus.FAILED, error_code=DEAD_LETTER_CODE)
        )


class OccurrenceInline(ReadOnlyInline):
    model = RecurringOccurrence
    fields = ("scheduled_for", "status", "reason", "payment")
    readonly_fields = fields
    ordering = ("-scheduled_for",)


@admin.register(RecurringPayment)
class RecurringPaymentAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "status",
        "amount",
        "from_account",
        "to_account",
        "cron",
        "interval_seconds",
        "timezone",
        "next_run_at",
        "consecutive_failures",
    )
    list_filter = ("status", "missed_run_policy")
    search_fields = ("=from_account__id", "from_account__owner__username")
    inlines = (OccurrenceInline,)


class WebhookAttemptInline(ReadOnlyInline):
    model = WebhookAttempt
    fields = ("number", "created_at", "status_code", "error", "duration_ms")
    readonly_fields = fields


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "event_type",
        "endpoint",
        "status",
        "attempts",
        "last_status_code",
        "next_attempt_at",
        "created_at",
    )
    list_filter = ("status", "event_type")
    search_fields = ("=id", "endpoint__url", "endpoint__client__username")
    inlines = (WebhookAttemptInline,)
    show_full_result_count = False


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ReadOnlyAdmin):
    list_display = ("id", "client", "url", "is_active", "created_at")
    list_filter = ("is_active",)
    search_fields = ("url", "client__username")
    exclude = ("secret",)
