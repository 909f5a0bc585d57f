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

import functools
from collections.abc import Callable

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ValidationError
from django.core.paginator import Paginator
from django.db import DatabaseError, connections
from django.http import HttpResponseRedirect
from django.utils import timezone
from django.utils.functional import cached_property

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


class _UnreadableIsABadLookup:
    def get_filters(self, request):
        if any(  # every value of a repeated parameter: the filters OR them all
            "\x00" in key or any("\x00" in value for value in values)
            for key, values in request.GET.lists()
        ):
            # PostgreSQL's text cannot hold NUL: the filter was built, and the
            # list's query failed when it ran (DataError, a 500 on every list)
            raise IncorrectLookupParameters("a query parameter holds a NUL character")
        try:
            return super().get_filters(request)
        except (OverflowError, ValueError) as exc:
            # ?due_at__year=999…9 overflows datetime(), and ?…__year=9999 its
            # year + 1 (the drill-down's upper bound): both were 500s
            raise IncorrectLookupParameters(exc) from exc


@functools.cache
def _guarded_changelist(base: type[ChangeList]) -> type[ChangeList]:
    """``base`` (Django's ChangeList, or a third party's own) with the guard."""
    return type(base.__name__, (_UnreadableIsABadLookup, base), {})


class ValidSelection:
    """A ModelAdmin mixin for what a hand-made or stale request can carry: an
    action posted with a selected id that is not one of the model's
    (``not-a-uuid`` for a payment) is refused with a message, where Django's
    ``filter(pk__in=…)`` raised a ValidationError, a 500; a date drill-down
    year past datetime's range (9999 included: its year + 1 is not) and a
    query parameter holding a NUL character answer ``?e=1`` like any bad
    filter value."""

    def get_changelist(self, request, **kwargs):
        return _guarded_changelist(super().get_changelist(request, **kwargs))

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


def table_estimate(queryset) -> int | None:
    """PostgreSQL's estimate of the rows ``queryset`` selects when it selects a
    whole table (no filter, search, distinct, slice or union), else None: the
    planner's ``pg_class.reltuples``, which VACUUM and ANALYZE (autovacuum's
    too) keep near the truth; None too before the table was ever analysed."""
    query = getattr(queryset, "query", None)
    if query is None or query.where or query.distinct or query.combinator or query.is_sliced:
        return None
    connection = connections[queryset.db]
    if connection.vendor != "postgresql":
        return None
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
            [connection.ops.quote_name(queryset.model._meta.db_table)],
        )
        row = cursor.fetchone()
    return row[0] if row and row[0] >= 0 else None


class EstimatedCountPaginator(Paginator):
    """An unfiltered changelist of a big table paged by PostgreSQL's estimate of
    its rows (from ``ADMIN_ESTIMATED_COUNT_FROM`` rows on): Django's paginator
    ran ``SELECT COUNT(*)`` of the whole table on every view of the list's first
    page — seconds a view, and a pooled connection held, with millions of
    payments. A filtered or searched list is counted exactly (what it selects)."""

    @cached_property
    def count(self) -> int:
        estimate = table_estimate(self.object_list)
        if estimate is not None and estimate >= settings.ADMIN_ESTIMATED_COUNT_FROM:
            return estimate
        return super().count


class LargeTables:
    """A ModelAdmin mixin for tables that grow: the estimated count of
    ``EstimatedCountPaginator``, and no second ``COUNT(*)`` of the whole table
    beside a filtered list's own count (Django's "N total")."""

    paginator = EstimatedCountPaginator
    show_full_result_count = False


class AxesAttemptTime:
    """django-axes 8's *Clean up expired attempts* action reads
    ``request.axes_attempt_time``, which only axes' own login handling sets
    (``AxesProxyHandler.update_request``): the action answered a 500 on every
    use. The attribute is set first, as axes sets it (now)."""

    @admin.action(description="Clean up expired attempts")
    def cleanup_expired_attempts(self, request, queryset):
        if not hasattr(request, "axes_attempt_time"):
            request.axes_attempt_time = timezone.now()
        return super().cleanup_expired_attempts(request, queryset)


def guard_every_admin(site: admin.AdminSite) -> None:
    """Give every ModelAdmin on ``site`` — django-axes', django-celery-beat's
    and Django auth's too, which have not ours — the request guards of
    ``ValidSelection`` and the count of ``LargeTables`` (and axes' attempts
    ``AxesAttemptTime``): registered again as a subclass with the missing
    mixins first. A third party's own ChangeList is kept (the guard is mixed
    into it) and so is its own paginator (no ``LargeTables`` then). Run once
    the admin modules are loaded (``PaymentsConfig.ready``: the admin's
    autodiscovery runs first)."""
    for model, model_admin in list(site._registry.items()):
        mixins = [ValidSelection]
        if model_admin.paginator is Paginator:  # a third party's own paginator is kept
            mixins.append(LargeTables)
        if hasattr(model_admin, "cleanup_expired_attempts"):  # django-axes' attempts
            mixins.insert(0, AxesAttemptTime)
        missing = tuple(m for m in mixins if not isinstance(model_admin, m))
        if missing:
            cls = type(model_admin)
            guarded = type(cls.__name__, (*missing, cls), {"__module__": cls.__module__})
            site.unregister(model)
            site.register(model, guarded)


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
