"""Support staff's bulk actions, one item at a time and bounded (DESIGN §8).

Both apps' admin actions (cancel, retry dead letters, freeze, unfreeze) go
through ``one_by_one``: a selection larger than ``ADMIN_ACTION_MAX_ITEMS`` is
refused before anything is done (a "select all" over a million payments would
hold a web thread and a pooled connection for hours); each item runs in its
own transaction, a business refusal of one is reported and the rest go on; a
database error stops the action and says how far it got (the rest would
likely fail the same way, and what is done stays done).
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.db import DatabaseError
from django.http import HttpResponseRedirect

from .errors import DomainError

SHOWN_REFUSALS = 5  # the first refusals named in the message; the rest counted


def one_by_one(
    modeladmin, request, queryset, call: Callable[[object], object], *, done: Callable[[int], str]
) -> int:
    """Run ``call(pk)`` for each selected object, report in messages; how many went through."""
    limit = settings.ADMIN_ACTION_MAX_ITEMS
    ids = list(queryset.order_by("pk").values_list("pk", flat=True)[: limit + 1])
    if len(ids) > limit:
        modeladmin.message_user(
            request,
            f"More than {limit} selected: an action handles at most {limit} at once. "
            "Narrow the selection (a filter) and run it again; nothing was done.",
            messages.ERROR,
        )
        return 0
    count, refused = 0, []
    for pk in ids:
        try:
            call(pk)
        except DomainError as exc:
            refused.append(f"{pk}: {exc.message}")
            continue
        except DatabaseError as exc:
            modeladmin.message_user(
                request,
                f"Stopped at {pk}: the database refused ({type(exc).__name__}). "
                f"{count} done before it; run the action again for the rest.",
                messages.ERROR,
            )
            break
        count += 1
    if refused:
        more = len(refused) - SHOWN_REFUSALS
        shown = "; ".join(refused[:SHOWN_REFUSALS]) + (f"; and {more} more" if more > 0 else "")
        modeladmin.message_user(request, f"{len(refused)} refused — {shown}", messages.WARNING)
    if count:
        modeladmin.message_user(request, done(count), messages.SUCCESS)
    return count


class _ChangeList(ChangeList):
    def get_filters(self, request):
        try:
            return super().get_filters(request)
        except OverflowError as exc:
            # ?due_at__year=999…9: Django's date drill-down turns a ValueError
            # into ?e=1, but the year overflows datetime() first — a 500
            raise IncorrectLookupParameters(exc) from exc


class ValidSelection:
    """A ModelAdmin mixin for what a hand-made or stale request can carry: an
    action posted with a selected id that is not one of the model's
    (``not-a-uuid`` for a payment) is refused with a message, where Django's
    ``filter(pk__in=…)`` raised a ValidationError, a 500; a date drill-down
    year past datetime's range answers ``?e=1`` like any bad filter value."""

    def get_changelist(self, request, **kwargs):
        return _ChangeList

    def response_action(self, request, queryset):
        pk = self.model._meta.pk
        try:
            for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
                pk.to_python(value)
        except ValidationError:
            self.message_user(
                request,
                "The selection holds an id that is not one of these rows; nothing was done.",
                messages.ERROR,
            )
            return HttpResponseRedirect(request.get_full_path())
        return super().response_action(request, queryset)


def choices_filter(field: str, title: str, choices: Callable[[], list]) -> type:
    """A list filter over ``field`` with fixed ``choices()`` (value, label): Django's
    default filter of a plain field lists its values with a ``SELECT DISTINCT``
    over the whole table on every page view, whatever else is filtered."""

    class ChoicesFilter(admin.SimpleListFilter):
        parameter_name = field

        def lookups(self, request, model_admin):
            return choices()

        def queryset(self, request, queryset):
            if self.value() is None:
                return queryset
            try:
                return queryset.filter(**{field: self.value()})
            except (ValueError, ValidationError) as exc:  # ?partition=abc: the admin's ?e=1
                raise IncorrectLookupParameters(exc) from exc

    ChoicesFilter.title = title
    return ChoicesFilter
