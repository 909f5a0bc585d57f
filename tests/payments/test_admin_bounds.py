"""Admin pages and actions: bounded work per page view and per action, an audit
of who did what, nothing of a staff user's shown to clients, no 500 from an odd
selection (DESIGN §6, §8). Each test here failed before its fix (a reviewer's
findings, session 41)."""

import re
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.admin.options import IncorrectLookupParameters
from django.db import connection
from django.test import RequestFactory
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from ledger.models import Account
from payments.models import (
    ApiToken,
    ApiTokenVia,
    OccurrenceStatus,
    Payment,
    RecurringOccurrence,
)
from payments.tokens import api_token_issue
from tests.factories import UserFactory
from tests.payments.helpers import bulk_schedule, make_schedule

pytestmark = pytest.mark.django_db


@pytest.fixture
def superadmin(client):
    user = UserFactory(username="root", is_staff=True, is_superuser=True)
    client.force_login(user)
    client.user = user
    return client


def test_an_account_added_in_the_admin_needs_an_owner(superadmin, alice):
    """Without one it was neither a client's nor a system account (those come from
    migrations): any client could pay into it, nobody could spend from it."""
    url = reverse("admin:ledger_account_add")
    response = superadmin.post(url, {"name": "typo", "max_payment_amount": 1000})
    assert response.status_code == 200  # the form again, with its error
    assert "This field is required" in response.content.decode()
    assert not Account.objects.filter(name="typo").exists()
    owner = UserFactory(username="carol")
    response = superadmin.post(
        url, {"owner": owner.pk, "name": "carol's", "max_payment_amount": 1000}
    )
    assert response.status_code == 302
    assert Account.objects.get(name="carol's").owner == owner


def test_freezing_and_unfreezing_record_which_staff_user_did_it(support, alice):
    for action in ("freeze", "unfreeze"):
        support.post(
            reverse("admin:ledger_account_changelist"),
            {"action": action, "_selected_action": [alice.account.pk]},
        )
    assert Account.objects.get(pk=alice.account.pk).status == "active"
    entries = LogEntry.objects.filter(object_id=str(alice.account.pk), user=support.user)
    assert sorted(e.get_change_message() for e in entries) == [
        "Status set to active.",
        "Status set to frozen.",
    ]


def test_a_staff_cancel_does_not_show_the_staff_login_to_the_client(support, alice):
    """actor_user names the staff user, for staff; the reason, which the client's
    events return, named the login too (half of a credential)."""
    pid = alice.schedule().json()["payment_id"]
    support.post(
        reverse("admin:payments_payment_changelist"),
        {"action": "cancel_payments", "_selected_action": [pid]},
    )
    events = alice.api.get(f"/api/v1/payments/{pid}/events").json()["events"]
    (cancelled,) = [e for e in events if e["type"] == "cancelled"]
    assert cancelled["data"]["reason"] == "cancelled by support"
    assert "sam" not in str(events)


def test_revoking_tokens_is_bounded_and_reports_the_already_revoked(superadmin, alice, settings):
    """Like every bulk action (one_by_one): a selection over ADMIN_ACTION_MAX_ITEMS is
    refused with nothing done — a "select all" revoked every client's token at once."""
    settings.ADMIN_ACTION_MAX_ITEMS = 3
    for _ in range(4):
        api_token_issue(user=alice.user, actor=None, via=ApiTokenVia.CLI)
    ids = list(ApiToken.objects.order_by("pk").values_list("pk", flat=True))
    url = reverse("admin:payments_apitoken_changelist")
    page = superadmin.post(url, {"action": "revoke_tokens", "_selected_action": ids}, follow=True)
    assert "handles at most 3 at once" in page.content.decode()
    assert not ApiToken.objects.filter(revoked_at__isnull=False).exists()
    page = superadmin.post(
        url, {"action": "revoke_tokens", "_selected_action": ids[:2]}, follow=True
    )
    assert "Revoked 2 token(s)" in page.content.decode()
    page = superadmin.post(
        url, {"action": "revoke_tokens", "_selected_action": ids[1:3]}, follow=True
    )
    text = page.content.decode()
    assert "Revoked 1 token(s)" in text and "1 refused" in text and "already revoked" in text
    assert ApiToken.objects.filter(revoked_at__isnull=False).count() == 3


WHOLE_TABLE_AGGREGATE = re.compile(
    r'^SELECT (COUNT\(\*\)|DISTINCT|MIN\().*FROM "(\w+)"(?!.*\bWHERE\b)', re.S
)


@pytest.mark.parametrize(
    ("changelist", "narrowed_by"),
    [
        ("payments_payment", {"status__exact": "PENDING", "due": "hour"}),
        ("payments_payment", {"partition": "3", "error_code": "insufficient_funds"}),
        ("payments_deadletter", {"partition": "3"}),
        ("ledger_hold", {"status__exact": "active"}),
        ("ledger_journalentry", {"kind__exact": "adjustment"}),
        ("payments_webhookdelivery", {"status__exact": "pending", "event_type": "payment.failed"}),
    ],
)
def test_a_narrowed_changelist_runs_no_aggregate_over_the_whole_table(
    support, alice, changelist, narrowed_by
):
    """Tables that grow by a row per payment: a filtered page still counted the whole
    table ("N total") or listed a plain field's values with a SELECT DISTINCT over all
    of it (partition, error_code, event_type filters), on every page view — ~100 ms
    each at 200,000 payments. The filters' choices are fixed now."""
    alice.schedule()
    with CaptureQueriesContext(connection) as ctx:
        page = support.get(reverse(f"admin:{changelist}_changelist"), narrowed_by)
    assert page.status_code == 200
    whole = [q["sql"][:120] for q in ctx.captured_queries if WHOLE_TABLE_AGGREGATE.search(q["sql"])]
    assert whole == []


def test_the_fixed_filters_filter(support, alice, bob):
    mine = alice.schedule().json()["payment_id"]
    other = bob.schedule().json()["payment_id"]
    Payment.objects.filter(pk=mine).update(partition=3)
    Payment.objects.filter(pk=other).update(partition=4)
    page = support.get(reverse("admin:payments_payment_changelist"), {"partition": "3"})
    text = page.content.decode()
    assert mine[:8] in text and other[:8] not in text
    assert "insufficient_funds" in text and "max_attempts_exceeded" in text  # error code choices


def test_a_schedule_page_shows_its_latest_occurrences_at_a_fixed_cost(support, alice):
    """An inline listed every occurrence a schedule ever had (525,600 a year for an
    every-minute one), with a query each for its payment link."""
    schedule = make_schedule(
        alice.account.pk, alice.other_account.pk, start=timezone.now(), every=60
    )
    ids = bulk_schedule(
        sources=[alice.account.pk],
        targets=[alice.other_account.pk],
        count=60,
        amount=1,
        due_at=timezone.now() + timedelta(hours=1),
    )
    base = timezone.now()
    url = reverse("admin:payments_recurringpayment_change", args=[schedule.pk])

    def add(payment_ids, offset):
        RecurringOccurrence.objects.bulk_create(
            RecurringOccurrence(
                recurring=schedule,
                scheduled_for=base + timedelta(minutes=offset + i),
                status=OccurrenceStatus.SCHEDULED,
                payment_id=pid,
            )
            for i, pid in enumerate(payment_ids)
        )

    def view():
        with CaptureQueriesContext(connection) as ctx:
            page = support.get(url)
        assert page.status_code == 200
        return len(ctx.captured_queries), page.content.decode()

    add(ids[:10], 0)
    view()  # (a first view loads what is cached after)
    queries_10, page_10 = view()
    add(ids[10:], 100)
    queries_60, page_60 = view()
    assert queries_60 == queries_10
    assert page_10.count('href="/admin/payments/payment/') >= 10
    rows = re.findall(r"<tr><td>[^<]*</td><td>scheduled</td>", page_60)
    assert len(rows) == 50
    assert ids[-1][:8] in page_60 and ids[0][:8] not in page_60  # newest first


def test_an_action_on_a_malformed_selection_is_refused_not_a_500(support, alice):
    """Only a hand-made or stale POST gets here; it was a ValidationError, a 500."""
    pid = alice.schedule().json()["payment_id"]
    url = reverse("admin:payments_payment_changelist")
    response = support.post(
        url, {"action": "cancel_payments", "_selected_action": ["not-a-uuid", pid]}, follow=True
    )
    assert response.status_code == 200
    assert "not one of these rows; nothing was done" in response.content.decode()
    assert alice.api.get(f"/api/v1/payments/{pid}").json()["status"] == "PENDING"
    response = support.post(
        reverse("admin:ledger_account_changelist"),
        {"action": "freeze", "_selected_action": ["x1"]},
        follow=True,
    )
    assert response.status_code == 200
    assert "nothing was done" in response.content.decode()


@pytest.mark.parametrize("changelist", ["payments_payment", "payments_deadletter"])
def test_a_filter_value_that_is_not_a_choice_is_not_a_500(superadmin, changelist):
    """The fixed-choice filters pass the value to the query: ``?partition=abc``
    raised a ValueError, a 500 (Django's own field filters answer ``?e=1``)."""
    response = superadmin.get(reverse(f"admin:{changelist}_changelist"), {"partition": "abc"})
    assert response.status_code == 302 and "e=1" in response["Location"]


# "\x00": PostgreSQL's text cannot hold it (a DataError when the list's query
# ran); "9999": a drill-down year whose year + 1 is past datetime's range —
# both 500s on every list until an outside tester sent them (session 44)
GARBAGE = [
    "abc",
    "-1",
    "9" * 30,
    "9999",
    "2026-13-45",
    "' OR 1=1 --",
    "%00",
    "\x00",
    "a\x00",
    "1.5",
]


def filter_parameters(model_admin) -> list[str]:
    """The query parameters a changelist's filters, search, ordering and paging read."""
    names = ["q", "o", "p", "e"]
    for spec in model_admin.list_filter:
        if isinstance(spec, str):
            names.append(f"{spec}__exact")
        elif isinstance(spec, tuple):
            names += [f"{spec[0]}__gte", f"{spec[0]}__lt"]
        else:
            names.append(spec.parameter_name)
    if model_admin.date_hierarchy:
        names += [f"{model_admin.date_hierarchy}__{part}" for part in ("year", "month", "day")]
    return names


def test_no_changelist_answers_500_to_any_odd_parameter(superadmin, alice):
    """The kind of test the ?partition=abc 500 was missing: every changelist on
    the site — ours, Django auth's, django-axes' and django-celery-beat's —,
    every parameter its filters, search, ordering, paging and date drill-down
    read, each with values a hand-edited URL can carry. (It found
    ?due_at__year=999…9 too: Django's drill-down lets datetime()'s OverflowError
    through, a 500 — on axes' and celery-beat's lists until session 43.)"""
    from django.contrib import admin

    alice.schedule()
    superadmin.raise_request_exception = False
    failures = []
    for model, model_admin in admin.site._registry.items():
        info = (model._meta.app_label, model._meta.model_name)
        url = reverse("admin:{}_{}_changelist".format(*info))
        for name in filter_parameters(model_admin):
            for value in GARBAGE:
                status = superadmin.get(url, {name: value}).status_code
                if status >= 500:
                    failures.append((url, name, value, status))
    assert failures == [], "\n".join(map(str, failures))


def test_no_changelist_answers_500_to_a_nul_in_any_field_lookup(superadmin, alice):
    """Django's admin takes a lookup on any of a model's own fields from the query
    string (``?description=…``), not only the filters' parameters: a NUL there
    reached PostgreSQL on every list (an outside tester's finding, session 44)."""
    from django.contrib import admin
    from django.db import models

    alice.schedule()
    superadmin.raise_request_exception = False
    failures = []
    for model in admin.site._registry:
        info = (model._meta.app_label, model._meta.model_name)
        url = reverse("admin:{}_{}_changelist".format(*info))
        for field in model._meta.concrete_fields:
            if isinstance(field, models.CharField | models.TextField):
                for name in (field.name, f"{field.name}__exact", f"{field.name}__in"):
                    # not the last value: the filters read every one
                    status = superadmin.get(url, {name: ["x\x00", "y"]}).status_code
                    if status >= 500:
                        failures.append((url, name, status))
    assert failures == [], "\n".join(map(str, failures))


@pytest.mark.parametrize(
    "query",
    [
        "status__exact=%00&status__exact=QUEUED",
        "status__exact=QUEUED&status__exact=%00",
        "description=x%00&description=y",
    ],
)
def test_a_nul_in_any_value_of_a_repeated_parameter_is_not_a_500(superadmin, alice, query):
    """Django's filters take every value of a repeated parameter (OR-ed); the guard
    read only the last one, so a NUL in an earlier one still reached PostgreSQL (a
    reviewer's probe: a 500)."""
    alice.schedule()
    superadmin.raise_request_exception = False
    response = superadmin.get(reverse("admin:payments_payment_changelist") + "?" + query)
    assert response.status_code == 302 and "e=1" in response["Location"]


def test_an_action_on_a_malformed_selection_is_not_a_500_on_any_list(superadmin):
    """Every list with actions, third parties' too: a selected id that is not of
    the model's key type (``abc`` for an integer key) raised a ValueError or a
    ValidationError in ``filter(pk__in=…)``, a 500, on django-axes',
    django-celery-beat's and Django auth's lists."""
    from django.contrib import admin

    superadmin.raise_request_exception = False
    failures = []
    for model, model_admin in admin.site._registry.items():
        request = RequestFactory().get("/")
        request.user = superadmin.user
        actions = [name for name in model_admin.get_actions(request) if name != "delete_selected"]
        actions = actions or list(model_admin.get_actions(request))
        if not actions:
            continue
        url = reverse(f"admin:{model._meta.app_label}_{model._meta.model_name}_changelist")
        for value in ("abc", "9" * 30, "' OR 1=1 --"):
            response = superadmin.post(
                url, {"action": actions[0], "_selected_action": [value], "post": "yes"}
            )
            if response.status_code >= 500:
                failures.append((url, actions[0], value, response.status_code))
    assert failures == [], "\n".join(map(str, failures))


def count_statements(ctx, table: str) -> list[str]:
    return [
        q["sql"] for q in ctx.captured_queries if "COUNT(" in q["sql"].upper() and table in q["sql"]
    ]


@pytest.mark.postgres
def test_an_unfiltered_list_of_a_big_table_is_paged_by_the_estimate(superadmin, alice, settings):
    """The unfiltered payments list ran ``SELECT COUNT(*)`` over the whole table
    on every view, and its date drill-down two more statements over every row
    (together 282 ms of a 664 ms view with 1,000,000 payments); from
    ``ADMIN_ESTIMATED_COUNT_FROM`` rows on it shows PostgreSQL's estimate.
    A filtered list, and a small table, are still counted exactly."""
    for _ in range(3):
        alice.schedule()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE payments_payment")
        cursor.execute("UPDATE pg_class SET reltuples = 1234 WHERE relname = 'payments_payment'")
    url = reverse("admin:payments_payment_changelist")

    settings.ADMIN_ESTIMATED_COUNT_FROM = 1000
    with CaptureQueriesContext(connection) as ctx:
        response = superadmin.get(url)
    assert response.status_code == 200
    assert response.context["cl"].result_count == 1234
    assert count_statements(ctx, "payments_payment") == []
    # one statement reads the table: the page (the date drill-down bar's
    # MIN/MAX and DISTINCT years of every payment are gone with it)
    reads = [q["sql"] for q in ctx.captured_queries if 'FROM "payments_payment"' in q["sql"]]
    assert len(reads) == 1 and "LIMIT 100" in reads[0], reads

    with CaptureQueriesContext(connection) as ctx:
        response = superadmin.get(url, {"status__exact": "PENDING"})
    assert response.context["cl"].result_count == 3
    assert len(count_statements(ctx, "payments_payment")) == 1

    settings.ADMIN_ESTIMATED_COUNT_FROM = 1235
    with CaptureQueriesContext(connection) as ctx:
        response = superadmin.get(url)
    assert response.context["cl"].result_count == 3
    assert len(count_statements(ctx, "payments_payment")) == 1


def test_every_admin_on_the_site_has_the_guards():
    """Third parties' admins registered again with ours mixed in (PaymentsConfig.ready)."""
    from django.contrib import admin

    from scheduler_project.admin_actions import LargeTables, ValidSelection

    unguarded = [
        type(model_admin).__qualname__
        for model_admin in admin.site._registry.values()
        if not (isinstance(model_admin, ValidSelection) and isinstance(model_admin, LargeTables))
    ]
    assert unguarded == []
    names = {model._meta.label for model in admin.site._registry}
    assert {"axes.AccessAttempt", "django_celery_beat.PeriodicTask", "auth.User"} <= names


@pytest.mark.postgres
def test_an_unfiltered_journal_reads_only_its_page(superadmin, alice, settings):
    """The journal (an entry a payment) had the payments list's date drill-down:
    MIN/MAX and the DISTINCT years of every entry on each view."""
    alice.schedule()
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE ledger_journalentry")
        cursor.execute("UPDATE pg_class SET reltuples = 5000 WHERE relname = 'ledger_journalentry'")
    settings.ADMIN_ESTIMATED_COUNT_FROM = 1000
    with CaptureQueriesContext(connection) as ctx:
        response = superadmin.get(reverse("admin:ledger_journalentry_changelist"))
    assert response.status_code == 200 and response.context["cl"].result_count == 5000
    reads = [q["sql"] for q in ctx.captured_queries if 'FROM "ledger_journalentry"' in q["sql"]]
    assert len(reads) == 1 and "LIMIT 100" in reads[0], reads


def test_axes_clean_up_of_expired_attempts_works_from_the_admin(superadmin, settings):
    """django-axes' own action read an attribute only its login handling sets:
    every use was a 500. It deletes the attempts older than the cool-off."""
    from axes.models import AccessAttempt

    old = AccessAttempt.objects.create(
        username="x", ip_address="10.0.0.1", user_agent="", failures_since_start=5
    )
    AccessAttempt.objects.filter(pk=old.pk).update(
        attempt_time=timezone.now() - settings.AXES_COOLOFF_TIME - timedelta(minutes=1)
    )
    fresh = AccessAttempt.objects.create(
        username="y", ip_address="10.0.0.2", user_agent="", failures_since_start=1
    )
    response = superadmin.post(
        reverse("admin:axes_accessattempt_changelist"),
        {"action": "cleanup_expired_attempts", "_selected_action": [fresh.pk]},
        follow=True,
    )
    assert response.status_code == 200
    assert "Cleaned up 1 expired access attempts." in response.content.decode()
    assert list(AccessAttempt.objects.values_list("pk", flat=True)) == [fresh.pk]


def test_the_guards_keep_a_third_partys_own_changelist_and_paginator(rf, superadmin):
    """The mixins go in front of the third party's class: its own ChangeList
    (the guard is mixed into it) and its own paginator must survive."""
    from django.contrib import admin
    from django.contrib.admin.views.main import ChangeList
    from django.core.paginator import Paginator

    from ledger.models import ReconciliationRun
    from scheduler_project.admin_actions import LargeTables, ValidSelection, guard_every_admin

    class TheirChangeList(ChangeList):
        pass

    class TheirPaginator(Paginator):
        pass

    class TheirAdmin(admin.ModelAdmin):
        paginator = TheirPaginator
        date_hierarchy = "started_at"

        def get_changelist(self, request, **kwargs):
            return TheirChangeList

    site = admin.AdminSite(name="third_party")
    site.register(ReconciliationRun, TheirAdmin)
    guard_every_admin(site)
    model_admin = site.get_model_admin(ReconciliationRun)
    assert isinstance(model_admin, ValidSelection) and not isinstance(model_admin, LargeTables)
    assert model_admin.paginator is TheirPaginator
    request = rf.get("/", {"started_at__year": "9" * 30})
    request.user = superadmin.user
    changelist = model_admin.get_changelist(request)
    assert issubclass(changelist, TheirChangeList)
    with pytest.raises(IncorrectLookupParameters):
        model_admin.get_changelist_instance(request)
