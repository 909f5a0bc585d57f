"""Property tests over kinds of input the schema fuzzer (``test_fuzz.py``) does
not generate, each of which a reviewer turned into a 500 from outside:

- a date-time with any UTC offset Python accepts (±23:59:59.999999): PostgreSQL
  takes ±15:59:59 with no fractions, and a time kept with the client's offset
  failed at its save on PATCH and on the recurring writes;
- any query string, on every path: Schemathesis sends the declared parameters
  only, never 1,001 empty fields (Django's ``TooManyFieldsSent``, raised while
  DRF read ``?format=`` before authentication), repeated or undeclared keys.
"""

from __future__ import annotations

from datetime import timedelta, timezone
from urllib.parse import quote

import pytest
from django.db import transaction
from django.utils import timezone as dj_timezone
from django.utils.dateparse import parse_datetime
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from rest_framework.test import APIClient

from payments.api.auth import ClientRateThrottle
from payments.clock import db_now
from payments.models import Payment, RecurringPayment

pytestmark = pytest.mark.django_db

LIMIT = timedelta(hours=24) - timedelta(microseconds=1)
OFFSETS = st.timedeltas(min_value=-LIMIT, max_value=LIMIT).map(timezone)
PROPERTY = hypothesis_settings(
    max_examples=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@pytest.fixture
def unthrottled(settings, monkeypatch):
    settings.RECURRING_MAX_ACTIVE_PER_CLIENT = 10**6
    monkeypatch.setattr(ClientRateThrottle, "rate", "1000000/s", raising=False)


def at(hours: float, zone) -> str:
    """An instant ``hours`` from now, written with ``zone``'s offset (Python's
    isoformat: seconds and microseconds in the offset when it has them)."""
    return (dj_timezone.now() + timedelta(hours=hours)).astimezone(zone).isoformat()


def same_instant(sent: str, stored) -> bool:
    return parse_datetime(sent) == stored


@PROPERTY
@given(zone=OFFSETS)
def test_any_offset_in_a_payment_time_is_taken_as_the_instant_it_names(alice, unthrottled, zone):
    when = at(30, zone)
    body = {"from_account_id": alice.account.pk, "to_account_id": alice.other_account.pk}
    created = alice.api.post(
        "/api/v1/payments/schedule", body | {"amount": 1, "scheduled_time": when}, format="json"
    )
    assert created.status_code == 201, created.content
    payment = Payment.objects.get(pk=created.json()["payment_id"])
    assert same_instant(when, payment.due_at)
    later = at(40, zone)
    patched = alice.api.patch(
        f"/api/v1/payments/{payment.pk}", {"scheduled_time": later}, format="json"
    )
    assert patched.status_code == 200, patched.content
    payment.refresh_from_db()
    assert same_instant(later, payment.due_at)


@PROPERTY
@given(zone=OFFSETS)
def test_any_offset_in_a_schedule_time_is_taken_as_the_instant_it_names(alice, unthrottled, zone):
    start, end = at(30, zone), at(24 * 30, zone)
    body = {
        "from_account_id": alice.account.pk,
        "to_account_id": alice.other_account.pk,
        "amount": 5,
        "interval_seconds": 3600,
        "start_time": start,
        "end_time": end,
    }
    created = alice.api.post("/api/v1/recurring-payments", body, format="json")
    assert created.status_code == 201, created.content
    rid = created.json()["recurring_payment_id"]
    schedule = RecurringPayment.objects.get(pk=rid)
    assert same_instant(start, schedule.start_time) and same_instant(end, schedule.end_time)
    new_end = at(24 * 60, zone)
    patched = alice.api.patch(
        f"/api/v1/recurring-payments/{rid}", {"end_time": new_end}, format="json"
    )
    assert patched.status_code == 200, patched.content
    schedule.refresh_from_db()
    assert same_instant(new_end, schedule.end_time)


@pytest.mark.parametrize("field", ["scheduled_time", "start_time"])
@pytest.mark.parametrize("value", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-05:00"])
def test_an_offset_that_leaves_the_years_is_a_400(alice, field, value):
    path, body = (
        ("/api/v1/payments/schedule", {"amount": 1})
        if field == "scheduled_time"
        else ("/api/v1/recurring-payments", {"amount": 1, "interval_seconds": 3600})
    )
    body |= {
        "from_account_id": alice.account.pk,
        "to_account_id": alice.other_account.pk,
        field: value,
    }
    response = alice.api.post(path, body, format="json")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "validation_error"


KEYS = st.one_of(
    st.sampled_from(["account_id", "status", "limit", "cursor", "format", "page", ""]),
    st.text(max_size=12),
)
PAIRS = st.lists(st.tuples(KEYS, st.text(max_size=30)), max_size=8)
RAW = st.sampled_from(["&" * 1001, "a=1&" * 1001, "=&=", "%", "%zz", "a[]=1", "format=api"])


def query(pairs) -> str:
    return "&".join(f"{quote(k, safe='')}={quote(v, safe='')}" for k, v in pairs)


def list_paths(client) -> list[str]:
    payment_id = client.schedule().json()["payment_id"]
    body = {
        "from_account_id": client.account.pk,
        "to_account_id": client.other_account.pk,
        "amount": 5,
        "interval_seconds": 3600,
    }
    rid = client.api.post("/api/v1/recurring-payments", body, format="json").json()[
        "recurring_payment_id"
    ]
    return [
        "/api/v1/payments",
        f"/api/v1/payments/{payment_id}",
        f"/api/v1/payments/{payment_id}/events",
        "/api/v1/accounts",
        f"/api/v1/accounts/{client.account.pk}/transactions",
        "/api/v1/recurring-payments",
        f"/api/v1/recurring-payments/{rid}/occurrences",
        "/api/v1/webhook-endpoints",
    ]


@PROPERTY
@given(pairs=PAIRS, raw=RAW, data=st.data())
def test_no_query_string_gives_a_server_error(alice, unthrottled, pairs, raw, data):
    paths = list_paths(alice)
    path = data.draw(st.sampled_from(paths))
    for qs in (query(pairs), raw, f"{query(pairs)}&{raw}"):
        for client in (alice.api, APIClient()):  # with a token and without
            response = client.get(f"{path}?{qs}")
            assert response.status_code < 500, (path, qs[:80], response.content[:300])
    written = alice.api.post(
        f"/api/v1/payments/schedule?{raw}",
        {
            "from_account_id": alice.account.pk,
            "to_account_id": alice.other_account.pk,
            "amount": 1,
            "delay_seconds": 60,
        },
        format="json",
    )
    assert written.status_code < 500, written.content[:300]


def test_too_many_query_fields_is_a_400_that_writes_nothing(alice):
    """Over DATA_UPLOAD_MAX_NUMBER_FIELDS: Django refuses the request; under the
    API that is a JSON 400, with or without a token, before any write."""
    from payments.models import IdempotencyKey

    before = Payment.objects.count()
    for client in (alice.api, APIClient()):
        response = client.post(
            "/api/v1/payments/schedule?" + "&" * 1000,
            {
                "from_account_id": alice.account.pk,
                "to_account_id": alice.other_account.pk,
                "amount": 1,
                "delay_seconds": 60,
            },
            format="json",
            headers={"Idempotency-Key": "k-many"},
        )
        assert response.status_code == 400, response.content
        assert response.json()["error"]["code"] == "validation_error"
    assert Payment.objects.count() == before and not IdempotencyKey.objects.exists()


# --- recurring: whatever the client does during a catch-up --------------------------

ACTIONS = st.lists(st.sampled_from(["run", "pause", "resume", "cancel"]), max_size=8)


@PROPERTY
@given(actions=ACTIONS)
def test_every_instant_due_before_a_schedule_first_stopped_is_recorded(
    alice, unthrottled, settings, actions
):
    """The kind of test the dropped catch-up was missing (DESIGN §4.2: each missed
    occurrence is recorded): any sequence of materialiser runs, pauses, resumes
    and cancels during a catch-up of 120 missed minutes (50 handled a run). Every
    instant due before the schedule first stopped ends recorded exactly once, and
    none recorded while it was paused runs."""
    from payments.engine import materializer
    from payments.models import RecurringOccurrence
    from tests.payments.helpers import make_schedule

    settings.RECURRING_MAX_OCCURRENCES_PER_RUN = 50
    settings.RECURRING_MATERIALIZE_AHEAD_SECONDS = 0
    with transaction.atomic():
        start = db_now() - timedelta(minutes=120, seconds=30)
        schedule = make_schedule(
            alice.account.pk, alice.other_account.pk, start=start, every=60, amount=1
        )
        base = f"/api/v1/recurring-payments/{schedule.pk}"
        first_stop = None
        for action in actions:
            if action == "run":
                materializer.materialize_due()
                continue
            response = alice.api.post(f"{base}/{action}")
            assert response.status_code in (200, 409), response.content
            if action in ("pause", "cancel") and response.status_code == 200:
                first_stop = first_stop or db_now()
        for _ in range(6):  # the materialiser carries on, whatever state it is in
            materializer.materialize_due()
        rows = list(
            RecurringOccurrence.objects.filter(recurring=schedule).values_list(
                "scheduled_for", "status", "reason"
            )
        )
        recorded = [instant for instant, _, _ in rows]
        assert len(recorded) == len(set(recorded))
        until = first_stop or db_now()
        due = {
            start + timedelta(minutes=k)
            for k in range(121)
            if start + timedelta(minutes=k) <= until
        }
        assert due <= set(recorded)
        for _, status, reason in rows:
            assert reason not in ("paused", "cancelled") or status == "skipped"
        transaction.set_rollback(True)


def test_no_input_field_takes_a_value_of_another_json_type():
    """The kind of test a number taken as a description's text and "no" taken as a
    boolean were missing (an outside tester's finding, session 44): every field
    of every input serializer, given each JSON type but its own, refuses it under
    its own name."""
    from rest_framework import serializers as drf

    from payments.api import serializers as api

    def own_type(field, value) -> bool:
        if isinstance(field, drf.BooleanField):
            return isinstance(value, bool)
        if isinstance(field, drf.IntegerField):
            return isinstance(value, int) and not isinstance(value, bool)
        if isinstance(field, drf.CharField | drf.ChoiceField):
            return isinstance(value, str)
        if isinstance(field, drf.ListField):
            return isinstance(value, list)
        if isinstance(field, drf.DictField | drf.Serializer):
            return isinstance(value, dict)
        return True  # a type this test does not know: not judged

    inputs = [
        cls
        for cls in vars(api).values()
        if isinstance(cls, type) and issubclass(cls, api.StrictSerializer)
    ]
    checked, taken = 0, []
    for cls in inputs:
        for name, field in cls().fields.items():
            for value in (7, 1.5, True, "x", ["x"], {"k": 1}):
                if own_type(field, value):
                    continue
                checked += 1
                serializer = cls(data={name: value})
                if serializer.is_valid() or name not in serializer.errors:
                    taken.append((cls.__name__, name, value))
    assert checked > 150 and taken == []
