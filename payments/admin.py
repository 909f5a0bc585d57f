"""Admin for support staff: find, inspect, cancel and retry payments.

Nothing here edits a payment directly. Cancel and retry go through the same
services as the API (row lock, hold release, fence, audit event) and record
the staff user as the actor. They need the ``payments.cancel_payment`` /
``payments.retry_payment`` permissions, which the ``Support`` group has.

API tokens are revoked and issued here through ``payments.tokens`` (audited)
by staff with ``payments.manage_api_tokens``, which Support does not have:
whoever can issue a client's token can move that client's money.
"""

import uuid
from datetime import timedelta

from django import forms
from django.conf import settings
from django.contrib import admin
from django.contrib.auth import get_user_model
from django.core.exceptions import PermissionDenied
from django.db import models
from django.db.models import F, Q
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join

from ledger.admin import AccountAdmin as LedgerAccountAdmin
from ledger.admin import ReadOnlyAdmin
from ledger.exceptions import LedgerError
from ledger.models import Account
from scheduler_project.admin_actions import choices_filter, one_by_one
from scheduler_project.errors import DomainError

from . import services, tokens, webhooks
from .formatting import duration_ms
from .models import (
    DEAD_LETTER_CODE,
    Actor,
    ApiToken,
    ApiTokenEvent,
    ApiTokenVia,
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


def _codes(error: type) -> set[str]:
    return {error.code}.union(*(_codes(sub) for sub in error.__subclasses__()))


def error_codes() -> list[tuple[str, str]]:
    """What a payment's ``error_code`` can be: a ledger refusal at execution or a dead letter."""
    return [(code, code) for code in sorted(_codes(LedgerError) | {DEAD_LETTER_CODE})]


PartitionFilter = choices_filter(
    "partition",
    "partition",
    lambda: [(str(n), f"{n:02d}") for n in range(settings.PAYMENT_PARTITIONS)],
)
ErrorCodeFilter = choices_filter("error_code", "error code", error_codes)


def account_link(account) -> str:
    url = reverse("admin:ledger_account_change", args=[account.pk])
    return format_html('<a href="{}" title="{}">#{}</a>', url, str(account), account.pk)


class PaymentAdmin(ReadOnlyAdmin):
    """Newest due first; one line per payment: what support looks for fits in 1,400 px
    beside the filters (payments/static/payments/admin.css)."""

    list_display = (
        "short_id",
        "status",
        "amount_display",
        "from_link",
        "to_link",
        "due_at",
        "executed_at",
        "late_by",
        "error_code",
        "attempts",
    )
    list_display_links = ("short_id",)
    ordering = ("-due_at",)
    list_filter = (
        "status",
        DueFilter,
        PartitionFilter,
        ErrorCodeFilter,
        ("due_at", admin.DateFieldListFilter),
    )
    search_fields = (
        "=from_account__id",
        "=to_account__id",
        "owner__username",
        "owner__email",
    )
    search_help_text = (
        "Payment id (whole, or its first 8 characters as listed), account id, "
        "or owner username / email."
    )
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
        "late_by",
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
    # No date_hierarchy: its drill-down bar read MIN/MAX(due_at) and the
    # DISTINCT years of every payment on each view of the list (236 ms of a
    # 664 ms view with 1,000,000 payments, bench/results/2026-11-30-s43-admin-list);
    # the due-time filters above cover it.

    class Media:
        css = {"all": ("payments/admin.css",)}

    def get_search_results(self, request, queryset, search_term):
        """A payment id (UUID) is matched exactly; the short id the list shows (a prefix
        of 8 or more hex digits) as a primary-key range, beside the usual fields (an
        all-digit term may also be an account id); anything else as usual."""
        term = search_term.strip()
        try:
            return queryset.filter(pk=uuid.UUID(term)), False
        except ValueError:
            pass
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        digits = term.replace("-", "").lower()
        if 8 <= len(digits) < 32 and all(c in "0123456789abcdef" for c in digits):
            low, high = uuid.UUID(digits.ljust(32, "0")), uuid.UUID(digits.ljust(32, "f"))
            results = results | queryset.filter(pk__gte=low, pk__lte=high)
        return results, may_have_duplicates

    @admin.display(description="payment", ordering="pk")
    def short_id(self, obj):
        """The first 8 hex digits (unique in practice; searchable); the whole id on hover."""
        return format_html('<span title="{}">{}</span>', obj.pk, str(obj.pk)[:8])

    @admin.display(description="amount", ordering="amount")
    def amount_display(self, obj):
        return f"{obj.amount:,d}"

    @admin.display(description="from", ordering="from_account_id")
    def from_link(self, obj):
        return account_link(obj.from_account)

    @admin.display(description="to", ordering="to_account_id")
    def to_link(self, obj):
        return account_link(obj.to_account)

    @admin.display(description="late by", ordering=F("executed_at") - F("due_at"))
    def late_by(self, obj):
        """executed_at - due_at (both the database's clock) of an executed payment."""
        if obj.executed_at is None:
            return "-"
        return duration_ms(obj.executed_at - obj.due_at)

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
        one_by_one(self, request, queryset, service, done=lambda n: f"{n} payment(s) {verb}.")

    @admin.action(description="Cancel selected payments", permissions=["cancel"])
    def cancel_payments(self, request, queryset):
        self._apply(
            request,
            queryset,
            lambda pid: services.payment_cancel(
                payment_id=pid,
                actor=Actor.STAFF,
                actor_user=request.user,
                # the client reads the reason (its events); actor_user names the
                # staff user for staff only — a login is half of a credential
                reason="cancelled by support",
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


class AccountAdmin(LedgerAccountAdmin):
    """The ledger's account admin, its statement rows linked to the payments that posted them
    (the ledger knows nothing of payments)."""

    def statement_links(self, entries):
        links = super().statement_links(entries)
        for payment_id, entry_id in Payment.objects.filter(
            journal_entry__in=[entry.pk for entry in entries]
        ).values_list("pk", "journal_entry_id"):
            url = reverse("admin:payments_payment_change", args=[payment_id])
            links[entry_id] = format_html(
                '<a href="{}" title="{}" class="payment-link">payment {}</a>',
                url,
                payment_id,
                str(payment_id)[:8],
            )
        return links


admin.site.unregister(Account)
admin.site.register(Account, AccountAdmin)


@admin.register(DeadLetter)
class DeadLetterAdmin(PaymentAdmin):
    """Payments the reaper gave up on; retry them once the cause is fixed."""

    actions = ("retry_dead_letters", "cancel_payments")
    list_filter = (PartitionFilter, ("updated_at", admin.DateFieldListFilter))

    def get_queryset(self, request):
        return (
            super()
            .get_queryset(request)
            .filter(status=PaymentStatus.FAILED, error_code=DEAD_LETTER_CODE)
        )


OCCURRENCE_ROWS = 50


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
    list_select_related = ("from_account", "to_account")
    readonly_fields = ("latest_occurrences",)

    @admin.display(description=f"Latest {OCCURRENCE_ROWS} occurrences")
    def latest_occurrences(self, obj):
        """Newest first, bounded: an every-minute schedule has 525,600 a year, and an
        inline listed them all, one query each for its payment link."""
        rows = (
            RecurringOccurrence.objects.filter(recurring=obj)
            .select_related("payment")
            .order_by("-scheduled_for")[:OCCURRENCE_ROWS]
        )
        lines = format_html_join(
            "",
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            (
                (
                    occurrence.scheduled_for.isoformat(),
                    occurrence.outcome,
                    occurrence.reason,
                    format_html(
                        '<a href="{}">{}</a>',
                        reverse("admin:payments_payment_change", args=[occurrence.payment_id]),
                        str(occurrence.payment_id)[:8],
                    )
                    if occurrence.payment_id
                    else "-",
                )
                for occurrence in rows
            ),
        )
        if not lines:
            return "None yet."
        return format_html(
            '<table class="occurrences"><tr><th>scheduled for</th><th>outcome</th>'
            "<th>reason</th><th>payment</th></tr>{}</table>",
            lines,
        )


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
    list_filter = (
        "status",
        choices_filter("event_type", "event type", lambda: [(t, t) for t in webhooks.EVENT_TYPES]),
    )
    search_fields = ("=id", "endpoint__url", "endpoint__client__username")
    list_select_related = ("endpoint",)
    inlines = (WebhookAttemptInline,)


@admin.register(WebhookEndpoint)
class WebhookEndpointAdmin(ReadOnlyAdmin):
    list_display = (
        "id",
        "client",
        "url",
        "is_active",
        "consecutive_failures",
        "circuit_open_until",
        "created_at",
    )
    list_filter = ("is_active",)
    search_fields = ("url", "client__username")
    list_select_related = ("client",)
    # The signing secret is never shown, not even encrypted.
    exclude = ("secret_ciphertext",)
    # endpoint URLs are https (Django 6's default; says so explicitly on 5.2)
    formfield_overrides = {models.URLField: {"assume_scheme": "https"}}


class ApiTokenEventInline(ReadOnlyInline):
    model = ApiTokenEvent
    fields = ("created_at", "action", "actor", "via")
    readonly_fields = fields
    ordering = ("pk",)


class TokenStateFilter(admin.SimpleListFilter):
    title = "state"
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return (("active", "Active"), ("revoked", "Revoked"))

    def queryset(self, request, queryset):
        if self.value() == "active":
            return queryset.filter(revoked_at__isnull=True)
        if self.value() == "revoked":
            return queryset.filter(revoked_at__isnull=False)
        return queryset


class IssueTokenForm(forms.Form):
    username = forms.CharField(max_length=150, help_text="The client the token is for.")
    name = forms.CharField(max_length=100, required=False, help_text="To recognise it later.")
    revoke_others = forms.BooleanField(
        required=False,
        label="Revoke the client's other active tokens (rotate)",
    )

    def clean_username(self):
        username = self.cleaned_data["username"].strip()
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise forms.ValidationError(f"No user {username!r}.")
        return user


@admin.register(ApiToken)
class ApiTokenAdmin(ReadOnlyAdmin):
    """Tokens by prefix: the hash is never shown, the plain token only once, at issue."""

    list_display = ("prefix", "user", "name", "created_at", "revoked_at")
    list_filter = (TokenStateFilter,)
    search_fields = ("prefix", "user__username", "user__email", "name")
    list_select_related = ("user",)
    fields = ("prefix", "user", "name", "created_at", "revoked_at")
    readonly_fields = fields
    inlines = (ApiTokenEventInline,)
    actions = ("revoke_tokens",)
    change_list_template = "admin/payments/apitoken/change_list.html"

    def has_manage_permission(self, request):
        return request.user.has_perm("payments.manage_api_tokens")

    def has_view_permission(self, request, obj=None):
        return super().has_view_permission(request, obj) or self.has_manage_permission(request)

    def has_module_permission(self, request):
        return super().has_module_permission(request) or self.has_manage_permission(request)

    @admin.action(description="Revoke selected tokens", permissions=["manage"])
    def revoke_tokens(self, request, queryset):
        """Bounded and one at a time like every bulk action (``one_by_one``); a
        token already revoked is reported, not counted."""
        revoked = []

        def revoke(pk):
            token = ApiToken.objects.get(pk=pk)
            if not tokens.api_token_revoke(token=token, actor=request.user, via=ApiTokenVia.ADMIN):
                raise DomainError(f"token {token.prefix} was already revoked")
            revoked.append(token.prefix)

        one_by_one(
            self,
            request,
            queryset,
            revoke,
            done=lambda n: f"Revoked {n} token(s): {', '.join(revoked)}.",
        )

    def get_urls(self):
        return [
            path(
                "issue/",
                self.admin_site.admin_view(self.issue_view),
                name="payments_apitoken_issue",
            ),
            *super().get_urls(),
        ]

    def changelist_view(self, request, extra_context=None):
        extra_context = {**(extra_context or {}), "can_issue": self.has_manage_permission(request)}
        return super().changelist_view(request, extra_context)

    def issue_view(self, request):
        """Issue a token and show it on this response only (never in a message:
        messages travel in a cookie or the session), marked no-store."""
        if not self.has_manage_permission(request):
            raise PermissionDenied
        form = IssueTokenForm(request.POST or None)
        context = {
            **self.admin_site.each_context(request),
            "title": "Issue a new API token",
            "opts": self.model._meta,
            "form": form,
        }
        if request.method == "POST" and form.is_valid():
            user, name = form.cleaned_data["username"], form.cleaned_data["name"]
            if form.cleaned_data["revoke_others"]:
                record, token, revoked = tokens.api_token_rotate(
                    user=user, name=name, actor=request.user, via=ApiTokenVia.ADMIN
                )
            else:
                record, token = tokens.api_token_issue(
                    user=user, name=name, actor=request.user, via=ApiTokenVia.ADMIN
                )
                revoked = []
            context |= {"record": record, "token": token, "revoked": revoked}
            response = TemplateResponse(request, "admin/payments/apitoken/issued.html", context)
            response["Cache-Control"] = "no-store"
            return response
        return TemplateResponse(request, "admin/payments/apitoken/issue.html", context)
