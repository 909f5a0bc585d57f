"""Admin for the ledger: money is visible, never editable.

Balances, holds, entries and postings change only through ``ledger.services``
(balanced entries under row locks); the admin shows them read-only. Freezing
and unfreezing go through ``account_set_status``, which refuses system
accounts (the action reports each one it skipped).
"""

import logging

from django import forms
from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import DataError
from django.db.models import F
from django.shortcuts import get_object_or_404, redirect
from django.template.loader import render_to_string
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.html import format_html

from scheduler_project.admin_actions import LargeTables, ValidSelection, one_by_one

from . import selectors, services
from .exceptions import LedgerError
from .models import Account, Hold, JournalEntry, Posting, ReconciliationRun

STATEMENT_ROWS = 50

logger = logging.getLogger(__name__)


class ReadOnlyAdmin(ValidSelection, LargeTables, admin.ModelAdmin):
    """View-only: rows are created by services, never by hand."""

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


def money(value: int) -> str:
    """Amounts and balances as the statement shows them: integers with thousands separators."""
    return f"{value:,d}"


@admin.register(Account)
class AccountAdmin(ValidSelection, LargeTables, admin.ModelAdmin):
    list_display = (
        "id",
        "name",
        "owner",
        "system_code",
        "balance_",
        "held_",
        "available_",
        "status",
        "updated_at",
    )
    list_filter = ("status", "allow_negative")
    search_fields = ("=id", "name", "owner__username", "owner__email", "system_code")
    list_select_related = ("owner",)
    readonly_fields = (
        "balance_",
        "held_",
        "available_",
        "version",
        "status",
        "allow_negative",
        "system_code",
        "created_at",
        "updated_at",
        "adjust_link",
        "statement",
    )
    fieldsets = (
        (None, {"fields": ("owner", "name", "max_payment_amount", *readonly_fields[:-1])}),
        ("Statement", {"fields": ("statement",)}),
    )
    raw_id_fields = ("owner",)
    actions = ("freeze", "unfreeze")

    class Media:
        css = {"all": ("ledger/admin.css",)}

    EDITABLE = ("name", "max_payment_amount")

    def save_model(self, request, obj, form, change):
        """A change writes only the fields the form edits: a plain save would write
        back the balance, holds and version read when the page was loaded, undoing
        every posting committed since (money created or destroyed)."""
        if not change:
            return super().save_model(request, obj, form, change)
        changed = [name for name in self.EDITABLE if name in form.changed_data]
        if changed:
            obj.save(update_fields=changed)

    def get_form(self, request, obj=None, change=False, **kwargs):
        """An account is added for a client: without an owner it was neither a
        client's nor a system account — any client could pay into it and
        nobody could ever spend from it (system accounts come from migrations)."""
        form = super().get_form(request, obj, change=change, **kwargs)
        if obj is None:
            form.base_fields["owner"].required = True
        return form

    def get_readonly_fields(self, request, obj=None):
        """The owner is chosen when an account is added and never changes after."""
        if obj is None:
            return self.readonly_fields
        return ("owner", *self.readonly_fields)

    def has_delete_permission(self, request, obj=None):
        return False

    @admin.display(description="balance", ordering="balance")
    def balance_(self, obj):
        return money(obj.balance)

    @admin.display(description="held", ordering="held")
    def held_(self, obj):
        return money(obj.held)

    @admin.display(description="available", ordering=F("balance") - F("held"))
    def available_(self, obj):
        return money(obj.available)

    @admin.display(description=f"Latest {STATEMENT_ROWS} postings")
    def statement(self, obj):
        """Newest first: time, amount, balance after, description, and what posted it."""
        if obj.pk is None:
            return "-"
        postings = selectors.account_statement(account_id=obj.pk, limit=STATEMENT_ROWS)
        if not postings:
            return "No postings."
        links = self.statement_links([p.entry for p in postings])
        rows = [
            {
                "time": p.entry.created_at,
                "amount": f"{p.amount:+,d}",
                "balance_after": f"{p.balance_after:,d}",
                "description": p.entry.description or p.entry.get_kind_display(),
                "kind": p.entry.get_kind_display(),
                "link": links.get(p.entry_id, ""),
                "credit": p.amount > 0,
            }
            for p in postings
        ]
        return render_to_string("admin/ledger/account/statement.html", {"rows": rows})

    def statement_links(self, entries: list[JournalEntry]) -> dict[int, str]:
        """HTML link per entry id for the statement's last column: the journal entry.
        The payments app's admin links the payment that posted it instead."""
        return {
            entry.pk: format_html(
                '<a href="{}">entry #{}</a>',
                reverse("admin:ledger_journalentry_change", args=[entry.pk]),
                entry.pk,
            )
            for entry in entries
        }

    def _set_status(self, request, queryset, status):
        """Each account changed is recorded in the admin's history (Django's
        LogEntry: who, when, what), with a log line: support can tell who froze
        an account whose payments fail ``account_not_active``."""

        def set_status(account_id):
            account = services.account_set_status(account_id=account_id, status=status)
            self.log_change(request, account, f"Status set to {status}.")
            logger.info(
                "account %s set to %s by %s",
                account_id,
                status,
                request.user.get_username(),
                extra={"account_id": account_id, "status": status, "staff_user": request.user.pk},
            )

        one_by_one(
            self, request, queryset, set_status, done=lambda n: f"{n} account(s) set to {status}."
        )

    def has_freeze_permission(self, request):
        return request.user.has_perm("ledger.freeze_account")

    @admin.action(description="Freeze selected accounts", permissions=["freeze"])
    def freeze(self, request, queryset):
        self._set_status(request, queryset, "frozen")

    @admin.action(description="Unfreeze selected accounts", permissions=["freeze"])
    def unfreeze(self, request, queryset):
        self._set_status(request, queryset, "active")

    # --- balance adjustments: balanced entries, privileged staff only ----------
    def get_urls(self):
        return [
            path(
                "<int:account_id>/adjust/",
                self.admin_site.admin_view(self.adjust_view),
                name="ledger_account_adjust",
            ),
            *super().get_urls(),
        ]

    @admin.display(description="Adjust balance")
    def adjust_link(self, obj):
        if obj.pk is None:
            return "-"
        url = reverse("admin:ledger_account_adjust", args=[obj.pk])
        return format_html('<a href="{}">Post an adjustment…</a> (needs "post adjustment")', url)

    def adjust_view(self, request, account_id):
        if not request.user.has_perm("ledger.post_adjustment"):
            raise PermissionDenied
        account = get_object_or_404(Account, pk=account_id)
        form = AdjustmentForm(request.POST or None)
        if request.method == "POST" and form.is_valid():
            try:
                entry = services.adjustment_post(
                    account_id=account.pk,
                    amount=form.cleaned_data["amount"],
                    description=form.cleaned_data["reason"],
                    staff_user=request.user,
                )
            except LedgerError as exc:
                form.add_error(None, exc.message)
            except (DataError, OverflowError):  # a balance past 64 bits (OverflowError:
                # SQLite's driver, before the statement): nothing was written
                form.add_error("amount", "This amount would take a balance out of range.")
            else:
                self.message_user(
                    request, f"Adjustment posted as entry #{entry.pk}.", messages.SUCCESS
                )
                return redirect("admin:ledger_account_change", account.pk)
        context = {
            **self.admin_site.each_context(request),
            "title": f"Adjust balance of {account}",
            "account": account,
            "form": form,
            "opts": self.model._meta,
        }
        return TemplateResponse(request, "admin/ledger/account/adjust.html", context)


class AdjustmentForm(forms.Form):
    amount = forms.IntegerField(
        min_value=-(2**63 - 1),
        max_value=2**63 - 1,
        help_text="Positive credits the account, negative debits it; balanced against issuance.",
    )
    reason = forms.CharField(max_length=255, help_text="Recorded on the journal entry.")

    def clean_amount(self):
        amount = self.cleaned_data["amount"]
        if amount == 0:
            raise forms.ValidationError("Amount must not be zero.")
        return amount


@admin.register(Hold)
class HoldAdmin(ReadOnlyAdmin):
    list_display = ("id", "account", "amount", "status", "reference", "created_at", "resolved_at")
    list_filter = ("status",)
    search_fields = ("=id", "=account__id", "reference")
    list_select_related = ("account",)


class PostingInline(admin.TabularInline):
    model = Posting
    fields = ("account", "amount", "balance_after")
    readonly_fields = fields
    extra = 0
    can_delete = False

    def has_add_permission(self, request, obj=None):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(JournalEntry)
class JournalEntryAdmin(ReadOnlyAdmin):
    list_display = ("id", "kind", "reference", "description", "created_by", "created_at")
    # The date as a filter, not a date_hierarchy: the drill-down bar read the
    # DISTINCT years of every entry (one per payment) on each view of the list.
    list_filter = ("kind", ("created_at", admin.DateFieldListFilter))
    search_fields = ("=id", "reference", "description")
    inlines = (PostingInline,)


@admin.register(ReconciliationRun)
class ReconciliationRunAdmin(ReadOnlyAdmin):
    list_display = ("started_at", "ok", "mismatch_count", "duration_seconds", "trigger")
    list_filter = ("ok", "trigger")
    date_hierarchy = "started_at"
