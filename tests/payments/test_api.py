"""Contract tests for the public API (DESIGN §5): paths, fields, error shape and codes."""

import json
from datetime import UTC, datetime, timedelta
from uuid import uuid4
from zoneinfo import ZoneInfo

import pytest
from django.db import transaction
from django.utils import timezone
from rest_framework.renderers import JSONRenderer

from ledger import services as ledger
from ledger.models import Account, Hold, JournalEntry
from payments.api import serializers as s
from payments.models import Payment, PaymentEvent, PaymentStatus
from tests.payments.helpers import make_due, sweep

pytestmark = pytest.mark.django_db


def error(response, http_status, code):
    assert response.status_code == http_status, response.content
    body = response.json()
    assert set(body) == {"error"}
    assert set(body["error"]) == {"code", "message", "details"}
    assert body["error"]["code"] == code
    assert body["error"]["message"]
    return body["error"]


def held(account):
    return Account.objects.get(pk=account.pk).held


# --- schedule ----------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/v1/payments/schedule", "/api/v1/payments"])
def test_schedule_creates_payment_and_places_hold(alice, path):
    before = timezone.now()
    response = alice.api.post(
        path,
        {
            "from_account_id": alice.account.pk,
            "to_account_id": alice.other_account.pk,
            "amount": 250,
            "delay_seconds": 60,
            "description": "rent",
            "metadata": {"invoice": "A-1"},
        },
        format="json",
    )
    assert response.status_code == 201, response.content
    body = response.json()
    assert body["status"] == "PENDING"
    assert body["amount"] == 250 and isinstance(body["amount"], int)
    assert body["from_account_id"] == alice.account.pk
    assert body["to_account_id"] == alice.other_account.pk
    assert body["description"] == "rent" and body["metadata"] == {"invoice": "A-1"}
    assert body["executed_at"] is None and body["cancelled_at"] is None
    assert body["error_code"] is None and body["attempts"] == 0
    payment = Payment.objects.get(pk=body["payment_id"])
    due = payment.due_at
    assert before + timedelta(seconds=59) < due < timezone.now() + timedelta(seconds=61)
    assert body["scheduled_time"].replace("Z", "+00:00") == due.isoformat()
    assert held(alice.account) == 250
    assert payment.hold.amount == 250 and payment.hold.status == "active"
    assert list(payment.events.values_list("type", "to_status", "actor")) == [
        ("scheduled", "PENDING", "client")
    ]


def test_schedule_at_a_scheduled_time(alice):
    when = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    response = alice.schedule(delay_seconds=None, scheduled_time=when.isoformat())
    # delay_seconds=None is an explicit null: rejected as a type error
    error(response, 400, "validation_error")
    body = {
        "from_account_id": alice.account.pk,
        "to_account_id": alice.other_account.pk,
        "amount": 5,
        "scheduled_time": when.strftime("%Y-%m-%dT%H:%M:%SZ"),
    }
    response = alice.api.post("/api/v1/payments/schedule", body, format="json")
    assert response.status_code == 201
    assert Payment.objects.get(pk=response.json()["payment_id"]).due_at == when


INVALID = [
    ({"amount": 0}, "amount"),
    ({"amount": -3}, "amount"),
    ({"amount": 1.5}, "amount"),
    ({"amount": "10"}, "amount"),
    ({"amount": True}, "amount"),
    ({"delay_seconds": 0}, "delay_seconds"),
    ({"delay_seconds": 366 * 24 * 3600}, "delay_seconds"),
    ({"delay_seconds": "5"}, "delay_seconds"),
    ({"scheduled_time": "2020-01-01T00:00:00Z"}, "delay_seconds"),  # both given
    ({"from_account_id": "x"}, "from_account_id"),
    ({"description": "x" * 256}, "description"),
    ({"metadata": {"k": "v" * 5000}}, "metadata"),
    ({"metadata": [1]}, "metadata"),
    ({"delay_second": 5}, "delay_second"),  # unknown field
]


@pytest.mark.parametrize(("overrides", "field"), INVALID)
def test_schedule_validation_errors_write_nothing(alice, overrides, field):
    error_ = error(alice.schedule(**overrides), 400, "validation_error")
    assert field in error_["details"]["fields"]
    assert Payment.objects.count() == 0
    assert held(alice.account) == 0


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"amount": 5, "to_account_id": 1, "delay_seconds": 5}, "from_account_id"),
        ({"from_account_id": 1, "to_account_id": 2, "delay_seconds": 5}, "amount"),
    ],
)
def test_schedule_missing_fields(alice, body, field):
    response = alice.api.post("/api/v1/payments/schedule", body, format="json")
    assert field in error(response, 400, "validation_error")["details"]["fields"]


def test_schedule_needs_a_time(alice):
    body = {"from_account_id": alice.account.pk, "to_account_id": alice.other_account.pk}
    response = alice.api.post("/api/v1/payments/schedule", body | {"amount": 1}, format="json")
    assert "delay_seconds" in error(response, 400, "validation_error")["details"]["fields"]


@pytest.mark.parametrize(
    ("when", "message"),
    [
        ("2020-01-01T00:00:00Z", "past"),
        ("2999-01-01T00:00:00Z", "ahead"),
        ("2030-01-01T00:00:00", "offset"),
        ("tomorrow", "ISO-8601"),
    ],
)
def test_schedule_time_rules(alice, when, message):
    body = {
        "from_account_id": alice.account.pk,
        "to_account_id": alice.other_account.pk,
        "amount": 1,
        "scheduled_time": when,
    }
    err = error(alice.api.post("/api/v1/payments", body, format="json"), 400, "validation_error")
    assert message in str(err)


def test_schedule_same_account(alice):
    err = error(alice.schedule(to_account_id=alice.account.pk), 400, "validation_error")
    assert "to_account_id" in err["details"]["fields"]


def test_schedule_above_account_limit(alice):
    Account.objects.filter(pk=alice.account.pk).update(max_payment_amount=50)
    err = error(alice.schedule(amount=51), 400, "validation_error")
    assert err["details"]["fields"] == {
        "amount": ["Must be at most 50, this account's max_payment_amount."]
    }
    assert alice.schedule(amount=50).status_code == 201


def test_schedule_insufficient_funds_writes_nothing(alice):
    err = error(alice.schedule(amount=10_001), 422, "insufficient_funds")
    assert err["details"] == {
        "account_id": alice.account.pk,
        "available": 10_000,
        "required": 10_001,
    }
    assert Payment.objects.count() == 0 and Hold.objects.count() == 0
    assert alice.schedule(amount=6_000).status_code == 201
    error(alice.schedule(amount=4_001), 422, "insufficient_funds")  # 6,000 is held


def test_schedule_from_someone_elses_account_is_not_found(alice, bob):
    error(alice.schedule(from_account_id=bob.account.pk), 404, "not_found")
    error(alice.schedule(from_account_id=999_999), 404, "not_found")
    # neither account exists: no row to read the database clock with, so it is
    # read by itself (payments.services.payments._read_with_clock) — a 404, not a 500
    error(alice.schedule(from_account_id=999_998, to_account_id=999_999), 404, "not_found")
    assert held(bob.account) == 0


def test_schedule_to_missing_or_inactive_account(alice, bob):
    error(alice.schedule(to_account_id=999_999), 422, "account_not_found")
    ledger.account_set_status(account_id=bob.account.pk, status="frozen")
    # Another client's frozen account is not named as frozen (test_isolation).
    error(alice.schedule(to_account_id=bob.account.pk), 422, "account_not_found")
    ledger.account_set_status(account_id=alice.other_account.pk, status="frozen")
    err = error(alice.schedule(), 422, "account_not_active")  # her own: she may know
    assert err["details"] == {"account_id": alice.other_account.pk, "status": "frozen"}
    ledger.account_set_status(account_id=alice.account.pk, status="frozen")
    error(alice.schedule(), 422, "account_not_active")
    assert Payment.objects.count() == 0


def test_to_another_clients_account_is_allowed(alice, bob):
    assert alice.schedule(to_account_id=bob.account.pk).status_code == 201


def test_malformed_json(alice):
    response = alice.api.post(
        "/api/v1/payments/schedule", "{not json", content_type="application/json"
    )
    error(response, 400, "parse_error")
    response = alice.api.post(
        "/api/v1/payments/schedule", "[1, 2]", content_type="application/json"
    )
    error(response, 400, "validation_error")


def test_authentication(alice):
    anonymous = alice.api.__class__()
    err = error(anonymous.get("/api/v1/payments"), 401, "not_authenticated")
    assert err
    anonymous.credentials(HTTP_AUTHORIZATION="Bearer dps_wrong")
    response = anonymous.get("/api/v1/payments")
    error(response, 401, "authentication_failed")
    assert response["WWW-Authenticate"] == "Bearer"


# --- read ----------------------------------------------------------------------


def test_get_payment(alice):
    payment_id = alice.schedule().json()["payment_id"]
    body = alice.api.get(f"/api/v1/payments/{payment_id}").json()
    assert body["payment_id"] == payment_id
    for field in (
        "from_account_id",
        "to_account_id",
        "amount",
        "scheduled_time",
        "status",
        "created_at",
        "executed_at",
        "cancelled_at",
        "error_code",
        "error_message",
        "attempts",
    ):
        assert field in body


def test_status_read_is_two_statements(alice, django_assert_num_queries):
    """The token and the payment, each one SELECT; the throttle counts in Redis."""
    payment_id = alice.schedule().json()["payment_id"]
    with django_assert_num_queries(2):
        response = alice.api.get(f"/api/v1/payments/{payment_id}")
    assert response.status_code == 200 and response.json()["payment_id"] == payment_id


def _payments_of_every_shape():
    """Unsaved payments with the values a response can carry: the renderers read attributes."""
    paris = ZoneInfo("Europe/Paris")
    base = {
        "from_account_id": 2,
        "to_account_id": 3,
        "amount": 2**63 - 1,
        "due_at": datetime(2030, 1, 1, 9, 0, tzinfo=paris),  # no microseconds, not UTC
        "created_at": datetime(2026, 11, 24, 5, 6, 7, 891011, tzinfo=UTC),
        "updated_at": datetime(2026, 11, 24, 5, 6, 7, 1, tzinfo=UTC),
        "attempts": 0,
    }
    yield Payment(id=uuid4(), status=PaymentStatus.PENDING, **base)  # enum member, defaults
    yield Payment(
        id=uuid4(),
        status="FAILED",
        description='Miete \u00e9 \u2713 "quoted" </script>',
        metadata={"nested": {"list": [1, 2.5, None, True]}, "none": None, "": "empty key"},
        executed_at=datetime(2030, 1, 1, 8, 0, 0, 500, tzinfo=UTC),
        error_code="insufficient_funds",
        error_message="Available 5, needed 7.",
        **base | {"attempts": 3},
    )
    yield Payment(
        id=uuid4(),
        status=PaymentStatus.CANCELLED,
        cancelled_at=datetime(2029, 12, 31, 23, 59, 59, 999999, tzinfo=paris),
        metadata={},
        **base,
    )


def test_payment_data_is_the_payment_output_serializer_byte_for_byte(alice):
    """``payment_data`` (every payment the API returns) renders what ``PaymentOutput``
    declares: the same keys, in the same order, the same JSON."""
    scheduled = alice.schedule(metadata={"k": [1, {"x": None}]}, description="d").json()
    stored = Payment.objects.get(pk=scheduled["payment_id"])
    for payment in [*_payments_of_every_shape(), stored]:
        fast, reference = s.payment_data(payment), s.PaymentOutput(payment).data
        assert list(fast) == list(reference)
        assert JSONRenderer().render(fast) == JSONRenderer().render(reference)
        assert json.loads(JSONRenderer().render(fast)) == reference
    # What the API sends is that rendering of the stored row.
    assert scheduled == alice.api.get(f"/api/v1/payments/{stored.pk}").json()
    assert scheduled == json.loads(JSONRenderer().render(s.PaymentOutput(stored).data))


@pytest.mark.parametrize("payment_id", [str(uuid4()), "not-a-uuid", "1"])
def test_unknown_payment_is_not_found(alice, payment_id):
    error(alice.api.get(f"/api/v1/payments/{payment_id}"), 404, "not_found")


def test_unknown_api_route_is_json_404(alice):
    error(alice.api.get("/api/v1/nothing-here"), 404, "not_found")


def test_method_not_allowed(alice):
    error(alice.api.put("/api/v1/payments", {}, format="json"), 405, "method_not_allowed")


def test_list_newest_first_with_stable_cursor(alice, bob):
    ids = [alice.schedule(amount=i + 1).json()["payment_id"] for i in range(5)]
    bob.schedule()
    seen, cursor = [], None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = alice.api.get("/api/v1/payments", params).json()
        assert len(page["payments"]) <= 2
        seen += [p["payment_id"] for p in page["payments"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        alice.schedule(amount=99)  # new payments do not shift later pages
    assert seen == ids[::-1]


def test_list_filters_and_limits(alice):
    first = alice.schedule().json()["payment_id"]
    alice.schedule()
    alice.api.delete(f"/api/v1/payments/{first}/cancel")
    cancelled = alice.api.get("/api/v1/payments", {"status": "CANCELLED"}).json()["payments"]
    assert [p["payment_id"] for p in cancelled] == [first]
    by_account = alice.api.get("/api/v1/payments", {"account_id": alice.other_account.pk}).json()
    assert by_account["payments"] == []
    assert len(alice.api.get("/api/v1/payments").json()["payments"]) == 2
    for params, field in (
        ({"limit": 101}, "limit"),
        ({"limit": 0}, "limit"),
        ({"status": "DONE"}, "status"),
        ({"cursor": "garbage"}, "cursor"),
        ({"account_id": "x"}, "account_id"),
    ):
        response = alice.api.get("/api/v1/payments", params)
        assert field in error(response, 400, "validation_error")["details"]["fields"]


def test_list_default_limit_is_20(alice):
    for _ in range(21):
        alice.schedule(amount=1)
    page = alice.api.get("/api/v1/payments").json()
    assert len(page["payments"]) == 20 and page["next_cursor"]


# --- cancel --------------------------------------------------------------------


@pytest.mark.parametrize("method", ["delete", "post"])
def test_cancel_releases_hold_and_is_definite(alice, method):
    payment_id = alice.schedule(amount=300).json()["payment_id"]
    response = getattr(alice.api, method)(f"/api/v1/payments/{payment_id}/cancel")
    assert response.status_code == 200
    body = response.json()
    assert body["success"] is True and body["status"] == "CANCELLED"
    assert body["payment"]["cancelled_at"]
    assert held(alice.account) == 0
    payment = Payment.objects.get(pk=payment_id)
    assert payment.hold.status == "released"
    event = payment.events.get(type="cancelled")
    assert (event.from_status, event.to_status, event.actor, event.actor_user) == (
        "PENDING",
        "CANCELLED",
        "client",
        alice.user,
    )
    err = error(
        getattr(alice.api, method)(f"/api/v1/payments/{payment_id}/cancel"),
        409,
        "payment_not_cancellable",
    )
    assert err["details"]["status"] == "CANCELLED"


def test_cancel_completed_payment_is_refused(alice):
    payment_id = alice.schedule().json()["payment_id"]
    payment = Payment.objects.get(pk=payment_id)
    entry = ledger.hold_capture(
        hold_id=payment.hold_id, to_account_id=payment.to_account_id, reference=payment.reference
    )
    Payment.objects.filter(pk=payment_id).update(
        status=PaymentStatus.COMPLETED, journal_entry=entry, executed_at=timezone.now()
    )
    err = error(
        alice.api.delete(f"/api/v1/payments/{payment_id}/cancel"), 409, "payment_not_cancellable"
    )
    assert err["details"]["status"] == "COMPLETED"
    err = error(
        alice.api.patch(f"/api/v1/payments/{payment_id}", {"amount": 5}, format="json"),
        409,
        "payment_not_modifiable",
    )
    assert err["details"]["status"] == "COMPLETED"


def test_cancel_queued_payment_bumps_fence(alice):
    payment_id = alice.schedule().json()["payment_id"]
    Payment.objects.filter(pk=payment_id).update(status=PaymentStatus.QUEUED, fence=3)
    assert alice.api.delete(f"/api/v1/payments/{payment_id}/cancel").status_code == 200
    payment = Payment.objects.get(pk=payment_id)
    assert payment.status == "CANCELLED" and payment.fence == 4


def test_cancel_queued_payment_releases_its_hold(alice):
    """A payment the sweeper has already claimed (QUEUED, leased, message on its
    way): cancelling it releases the hold, and the message that arrives later
    moves no money."""
    from payments.engine import executor
    from tests.payments.helpers import claim_batch, make_due

    payment_id = alice.schedule(amount=300).json()["payment_id"]
    make_due(payment_id)
    with transaction.atomic():
        (claim,) = claim_batch(10)
    assert Payment.objects.get(pk=payment_id).status == "QUEUED"
    assert held(alice.account) == 300
    response = alice.api.delete(f"/api/v1/payments/{payment_id}/cancel")
    assert response.status_code == 200 and response.json()["status"] == "CANCELLED"
    payment = Payment.objects.get(pk=payment_id)
    assert payment.hold.status == "released" and held(alice.account) == 0
    account = Account.objects.get(pk=alice.account.pk)
    assert (account.balance, account.held) == (10_000, 0)
    event = payment.events.get(type="cancelled")
    assert (event.from_status, event.to_status) == ("QUEUED", "CANCELLED")
    executor.execute_chunk([(claim.payment_id, claim.fence)])  # the late message
    payment.refresh_from_db()
    assert payment.status == "CANCELLED" and payment.journal_entry_id is None
    assert not JournalEntry.objects.filter(reference=f"payment:{payment_id}").exists()
    assert Account.objects.get(pk=alice.other_account.pk).balance == 0
    assert held(alice.account) == 0


# --- update --------------------------------------------------------------------


def test_patch_reschedule_amount_and_description(alice):
    payment_id = alice.schedule(amount=100).json()["payment_id"]
    url = f"/api/v1/payments/{payment_id}"
    body = alice.api.patch(url, {"delay_seconds": 7200}, format="json").json()
    due = Payment.objects.get(pk=payment_id).due_at
    assert timezone.now() + timedelta(seconds=7100) < due
    assert body["scheduled_time"].replace("Z", "+00:00") == due.isoformat()
    body = alice.api.patch(url, {"amount": 400, "description": "more"}, format="json").json()
    assert (body["amount"], body["description"]) == (400, "more")
    assert held(alice.account) == 400
    payment = Payment.objects.get(pk=payment_id)
    assert payment.hold.amount == 400 and payment.hold.status == "active"
    assert Hold.objects.filter(account=alice.account, status="released").count() == 1
    types = list(payment.events.order_by("pk").values_list("type", flat=True))
    assert types == ["scheduled", "rescheduled", "amount_changed", "description_changed"]


def test_patch_amount_beyond_funds_changes_nothing(alice):
    payment_id = alice.schedule(amount=100).json()["payment_id"]
    url = f"/api/v1/payments/{payment_id}"
    error(
        alice.api.patch(url, {"amount": 10_001, "description": "x"}, format="json"),
        422,
        "insufficient_funds",
    )
    payment = Payment.objects.get(pk=payment_id)
    assert (payment.amount, payment.description, payment.hold.status) == (100, "", "active")
    assert held(alice.account) == 100
    # up to everything available is fine: the old hold is released first
    assert alice.api.patch(url, {"amount": 10_000}, format="json").status_code == 200


def rows():
    """Everything a PATCH could write: payments, holds, accounts, events."""
    return (
        list(Payment.objects.order_by("pk").values()),
        list(Hold.objects.order_by("pk").values()),
        list(Account.objects.order_by("pk").values("pk", "balance", "held", "version")),
        list(PaymentEvent.objects.order_by("pk").values_list("pk", "type")),
    )


@pytest.mark.parametrize("key", [None, "patch-400"])
@pytest.mark.parametrize(
    "body",
    [
        {},
        {"amount": 0},
        {"delay_seconds": 0},
        {"status": "COMPLETED"},
        {"delay_seconds": 5, "scheduled_time": "2030-01-01T00:00:00Z"},
        # valid parts next to an invalid one: nothing of them is applied
        {"amount": 500, "description": "x" * 256},
        {"delay_seconds": 7200, "status": "COMPLETED"},
        {"amount": 1_000_001, "delay_seconds": 7200},  # over max_payment_amount
        # the amount passes and swaps the hold before the time is refused
        # (by the service, inside its transaction): the swap is rolled back
        {"amount": 500, "delay_seconds": 0},
        {"amount": 500, "delay_seconds": 366 * 24 * 3600},
        {"amount": 500, "description": "y", "scheduled_time": "2020-01-01T00:00:00Z"},
    ],
)
def test_patch_400_writes_nothing(alice, body, key):
    payment_id = alice.schedule(amount=100).json()["payment_id"]
    before = rows()
    headers = {"Idempotency-Key": key} if key else {}
    error(
        alice.api.patch(f"/api/v1/payments/{payment_id}", body, format="json", headers=headers),
        400,
        "validation_error",
    )
    assert rows() == before  # no event; due_at, amount, hold, updated_at unchanged
    assert held(alice.account) == 100


def test_reschedule_queued_payment_returns_it_to_pending_with_new_fence(alice):
    payment_id = alice.schedule().json()["payment_id"]
    Payment.objects.filter(pk=payment_id).update(
        status=PaymentStatus.QUEUED, fence=1, lease_expires_at=timezone.now()
    )
    body = alice.api.patch(
        f"/api/v1/payments/{payment_id}", {"delay_seconds": 30}, format="json"
    ).json()
    assert body["status"] == "PENDING"
    payment = Payment.objects.get(pk=payment_id)
    assert payment.fence == 2 and payment.lease_expires_at is None
    assert payment.run_at == payment.due_at


# --- history -------------------------------------------------------------------


def test_events_and_attempts(alice):
    payment_id = alice.schedule().json()["payment_id"]
    alice.api.post(
        f"/api/v1/payments/{payment_id}/cancel", {"reason": "changed my mind"}, format="json"
    )
    events = alice.api.get(f"/api/v1/payments/{payment_id}/events").json()["events"]
    assert [(e["type"], e["from_status"], e["to_status"], e["actor"]) for e in events] == [
        ("scheduled", "", "PENDING", "client"),
        ("cancelled", "PENDING", "CANCELLED", "client"),
    ]
    assert events[1]["data"] == {"reason": "changed my mind"}
    assert alice.api.get(f"/api/v1/payments/{payment_id}/attempts").json() == {"attempts": []}


def test_a_patch_that_changes_nothing_writes_nothing(alice):
    """README: ``updated_at`` equals ``created_at`` until the payment first
    changes. The same amount or description again answered 200 with no event
    but moved ``updated_at`` (a review, session 42)."""
    created = alice.schedule(description="rent").json()
    url = f"/api/v1/payments/{created['payment_id']}"
    for same in ({"amount": created["amount"]}, {"description": "rent"}, {"amount": 100}):
        response = alice.api.patch(url, same, format="json")
        assert response.status_code == 200, response.content
        assert response.json()["updated_at"] == created["created_at"]
    payment = Payment.objects.get(pk=created["payment_id"])
    assert payment.updated_at == payment.created_at
    assert list(payment.events.values_list("type", flat=True)) == ["scheduled"]
    changed = alice.api.patch(url, {"description": "rent, May"}, format="json").json()
    assert changed["updated_at"] > created["created_at"]


def test_a_long_audit_trail_is_read_a_page_at_a_time_oldest_first(alice):
    """Every PATCH adds an event, so a trail has no bound of its own: the events
    come 100 a page (``limit`` up to 100) with a ``next_cursor``, oldest first;
    walking the pages gives every event once, in order (a review, session 42:
    one response held all 5,004 of them)."""
    payment_id = alice.schedule().json()["payment_id"]
    payment = Payment.objects.get(pk=payment_id)
    PaymentEvent.objects.bulk_create(
        PaymentEvent(
            payment=payment,
            type="description_changed",
            from_status="PENDING",
            to_status="PENDING",
            actor="client",
            data={"n": n},
        )
        for n in range(230)
    )
    url = f"/api/v1/payments/{payment_id}/events"
    first = alice.api.get(url).json()
    assert len(first["events"]) == 100 and first["next_cursor"]
    assert first["events"][0]["type"] == "scheduled"
    seen, cursor = [], None
    while True:
        page = alice.api.get(url, {"limit": 40, **({"cursor": cursor} if cursor else {})}).json()
        assert len(page["events"]) <= 40
        seen += page["events"]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert [e["data"].get("n") for e in seen] == [None, *range(230)]
    ids = [e["event_id"] for e in seen]
    assert ids == sorted(ids)
    for bad in ({"cursor": "nope"}, {"limit": 0}, {"limit": 101}, {"after": 1}):
        error(alice.api.get(url, bad), 400, "validation_error")


def test_the_history_a_client_reads_names_no_host_or_process(alice, monkeypatch):
    """Which host and process ran an attempt is kept for staff (admin, database),
    not shown to clients: attempts had ``worker`` and executed events its
    ``data.worker`` ("host:pid")."""
    from payments.engine import executor
    from payments.models import PaymentAttempt

    monkeypatch.setattr(executor, "worker_name", lambda: "db-host-7:4242")
    payment_id = alice.schedule().json()["payment_id"]
    make_due(payment_id)
    _, published = sweep(monkeypatch)
    executor.execute_chunk(published.items())
    assert Payment.objects.get(pk=payment_id).status == "COMPLETED"
    assert PaymentAttempt.objects.get(payment_id=payment_id).worker == "db-host-7:4242"
    base = f"/api/v1/payments/{payment_id}"
    for path in (f"{base}/attempts", f"{base}/events"):
        body = alice.api.get(path).content.decode()
        assert "db-host-7" not in body and "4242" not in body and '"worker"' not in body
    (attempt,) = alice.api.get(f"{base}/attempts").json()["attempts"]
    assert (attempt["number"], attempt["outcome"]) == (1, "succeeded")
    assert PaymentEvent.objects.filter(payment_id=payment_id, data__worker="db-host-7:4242")


def test_an_execute_now_triggers_id_is_not_shown_to_the_client(alice):
    from payments.services import payment_execute_now

    payment_id = alice.schedule().json()["payment_id"]
    make_due(payment_id)
    payment_execute_now(payment_id=payment_id, execution_id="ops-run-8812")
    assert PaymentEvent.objects.filter(payment_id=payment_id, data__execution_id="ops-run-8812")
    for path in ("events", "attempts"):
        body = alice.api.get(f"/api/v1/payments/{payment_id}/{path}").content.decode()
        assert "ops-run-8812" not in body and "execution_id" not in body


def test_empty_query_parameters_are_the_same_as_none(alice):
    """``?account_id=&status=&limit=&cursor=`` (a form or a URL template) lists as if
    nothing were given, on every list path (it was a 400)."""
    alice.schedule()
    empty = "account_id=&status=&limit=&cursor="
    for path in ("/api/v1/payments", f"/api/v1/accounts/{alice.account.pk}/transactions"):
        plain = alice.api.get(path)
        given = alice.api.get(f"{path}?{empty}" if "payments" in path else f"{path}?limit=&cursor=")
        assert (plain.status_code, given.status_code) == (200, 200), given.content
        assert given.json() == plain.json()
    assert alice.api.get("/api/v1/recurring-payments?limit=&cursor=").status_code == 200
    error(alice.api.get("/api/v1/payments?limit=x"), 400, "validation_error")  # still checked


@pytest.mark.parametrize("body", ["[]", "0", "false", '""', '"x"', "[{}]"])
def test_a_cancel_body_that_is_not_an_object_is_refused(alice, body):
    """A cancel's body is an object or nothing: ``[]``, ``0`` or ``false`` were taken
    for no body and the payment was cancelled."""
    payment_id = alice.schedule().json()["payment_id"]
    response = alice.api.post(
        f"/api/v1/payments/{payment_id}/cancel", data=body, content_type="application/json"
    )
    error(response, 400, "validation_error")
    assert Payment.objects.get(pk=payment_id).status == "PENDING"


@pytest.mark.parametrize("body", [None, "", "{}", "null"])
def test_a_cancel_without_a_body_or_with_an_empty_object_cancels(alice, body):
    payment_id = alice.schedule().json()["payment_id"]
    kwargs = {} if body is None else {"data": body, "content_type": "application/json"}
    response = alice.api.post(f"/api/v1/payments/{payment_id}/cancel", **kwargs)
    assert response.status_code == 200, response.content
    assert Payment.objects.get(pk=payment_id).status == "CANCELLED"


# --- accounts ------------------------------------------------------------------


def test_accounts_list_and_detail(alice, bob):
    alice.schedule(amount=1_000)
    accounts = alice.api.get("/api/v1/accounts").json()["accounts"]
    assert [a["account_id"] for a in accounts] == [alice.account.pk, alice.other_account.pk]
    detail = alice.api.get(f"/api/v1/accounts/{alice.account.pk}").json()
    assert (detail["balance"], detail["held"], detail["available"]) == (10_000, 1_000, 9_000)
    error(alice.api.get(f"/api/v1/accounts/{bob.account.pk}"), 404, "not_found")
    error(alice.api.get(f"/api/v1/accounts/{bob.account.pk}/transactions"), 404, "not_found")


def test_statement_running_balance_and_cursor(alice):
    for amount in (10, 20, 30):
        ledger.transfer_post(
            from_account_id=alice.account.pk, to_account_id=alice.other_account.pk, amount=amount
        )
    url = f"/api/v1/accounts/{alice.account.pk}/transactions"
    page = alice.api.get(url, {"limit": 2}).json()
    assert [(t["amount"], t["balance_after"]) for t in page["transactions"]] == [
        (-30, 9_940),
        (-20, 9_970),
    ]
    page = alice.api.get(url, {"limit": 2, "cursor": page["next_cursor"]}).json()
    assert [(t["amount"], t["balance_after"], t["kind"]) for t in page["transactions"]] == [
        (-10, 9_990, "transfer"),
        (10_000, 10_000, "deposit"),
    ]
    assert page["next_cursor"] is None
    error(alice.api.get(url, {"cursor": "!!"}), 400, "validation_error")


# --- throttling and docs ---------------------------------------------------------


def test_throttling_per_client(alice, bob, monkeypatch):
    from payments.api.auth import ClientRateThrottle

    monkeypatch.setattr(ClientRateThrottle, "THROTTLE_RATES", {"client": "3/min"})
    for _ in range(3):
        assert alice.api.get("/api/v1/accounts").status_code == 200
    response = alice.api.get("/api/v1/accounts")
    err = error(response, 429, "throttled")
    assert err["details"]["retry_after_seconds"] > 0 and int(response["Retry-After"]) > 0
    assert bob.api.get("/api/v1/accounts").status_code == 200  # separate budget


def test_schema_and_offline_docs(client):
    schema = client.get("/api/schema/", {"format": "json"})
    assert schema.status_code == 200
    spec = schema.json()
    assert spec["openapi"].startswith("3.")
    for path in (
        "/api/v1/payments/schedule",
        "/api/v1/payments",
        "/api/v1/payments/{payment_id}",
        "/api/v1/payments/{payment_id}/cancel",
        "/api/v1/payments/{payment_id}/events",
        "/api/v1/payments/{payment_id}/attempts",
        "/api/v1/accounts",
        "/api/v1/accounts/{account_id}",
        "/api/v1/accounts/{account_id}/transactions",
    ):
        assert path in spec["paths"], path
    docs = client.get("/api/docs/")
    assert docs.status_code == 200
    html = docs.content.decode()
    assert "swagger-ui" in html and "http://" not in html.replace("http://testserver", "")
    assert "https://" not in html
    assert JournalEntry.objects.count() == 0 and PaymentEvent.objects.count() == 0


def test_anonymous_budget_is_per_connection_address_not_x_forwarded_for(client, monkeypatch):
    """With no proxy configured (NUM_PROXIES=0) a client-written X-Forwarded-For
    does not open a fresh budget."""
    from payments.api.auth import ClientRateThrottle

    monkeypatch.setattr(ClientRateThrottle, "THROTTLE_RATES", {"client": "2/min"})
    for n in range(2):
        response = client.get("/api/schema/", HTTP_X_FORWARDED_FOR=f"192.0.2.{n}")
        assert response.status_code == 200
    spoofed = client.get("/api/schema/", HTTP_X_FORWARDED_FOR="192.0.2.99")
    assert spoofed.status_code == 429 and int(spoofed["Retry-After"]) > 0
    assert client.get("/api/schema/", REMOTE_ADDR="198.51.100.1").status_code == 200


def test_requests_without_valid_credentials_have_a_budget_per_address(client, alice, monkeypatch):
    """DRF checks throttles after authentication and permissions: a 401 never
    reached the per-client throttle, so guessing tokens (or asking without one)
    cost nothing however often (a review, session 42). Refused requests count
    against their address's API_ANON_THROTTLE_RATE (here 3 a minute) — a wrong
    token, another scheme, none at all alike — and a client with a valid token
    from the same address never meets it."""
    from payments.api.auth import AnonymousRateThrottle

    monkeypatch.setattr(AnonymousRateThrottle, "THROTTLE_RATES", {"anonymous": "3/min"})
    url = "/api/v1/accounts"
    for header in ("Bearer wrong-token", "Basic dXNlcjpwYXNz"):
        error(client.get(url, HTTP_AUTHORIZATION=header), 401, "authentication_failed")
    error(client.get(url), 401, "not_authenticated")
    for kwargs in ({"HTTP_AUTHORIZATION": "Bearer guess"}, {}):
        response = client.get(url, HTTP_X_FORWARDED_FOR="192.0.2.9", **kwargs)
        assert int(response["Retry-After"]) > 0
        error(response, 429, "throttled")
    assert alice.api.get(url).status_code == 200  # same address, valid token
    assert client.get(url, REMOTE_ADDR="198.51.100.1").status_code == 401  # another address


def test_client_address_behind_configured_proxies(rf, settings):
    from payments.api.auth import client_ip

    request = rf.get("/", REMOTE_ADDR="10.0.0.5", HTTP_X_FORWARDED_FOR="6.6.6.6, 198.51.100.7")
    assert client_ip(request) == "10.0.0.5"
    settings.REST_FRAMEWORK = {**settings.REST_FRAMEWORK, "NUM_PROXIES": 1}
    # One proxy appends the address it saw; what the client wrote before it is ignored.
    assert client_ip(request) == "198.51.100.7"


def test_internal_endpoint_is_throttled_before_the_token_check(
    client, alice, settings, monkeypatch
):
    from payments.api.auth import InternalRateThrottle

    settings.INTERNAL_API_TOKEN = "operator-secret"
    monkeypatch.setattr(InternalRateThrottle, "THROTTLE_RATES", {"internal": "3/min"})
    pid = alice.schedule().json()["payment_id"]
    url = f"/api/v1/internal/payments/{pid}/execute"
    for n in range(3):
        guess = client.post(
            url,
            {"execution_id": "x"},
            content_type="application/json",
            HTTP_X_INTERNAL_AUTH=f"guess-{n}",
            HTTP_X_FORWARDED_FOR=f"192.0.2.{n}",
        )
        error(guess, 404, "not_found")
    # The budget is spent: even the right token waits, and a new X-Forwarded-For
    # does not help.
    right = client.post(
        url,
        {"execution_id": "x"},
        content_type="application/json",
        HTTP_X_INTERNAL_AUTH="operator-secret",
        HTTP_X_FORWARDED_FOR="192.0.2.200",
    )
    err = error(right, 429, "throttled")
    assert int(right["Retry-After"]) > 0 and err["details"]["retry_after_seconds"] > 0
    assert Payment.objects.get(pk=pid).status == PaymentStatus.PENDING


# --- request size ------------------------------------------------------------------


def schedule_body(alice, **overrides):
    return {
        "from_account_id": alice.account.pk,
        "to_account_id": alice.other_account.pk,
        "amount": 100,
        "delay_seconds": 60,
    } | overrides


def test_body_over_the_api_limit_is_413_and_writes_nothing(alice, settings):
    from payments.models import IdempotencyKey

    body = schedule_body(alice, metadata={"blob": "x" * settings.API_MAX_BODY_BYTES})
    for headers in ({}, {"Idempotency-Key": "big-1"}):
        response = alice.api.post("/api/v1/payments/schedule", body, format="json", headers=headers)
        err = error(response, 413, "payload_too_large")
        assert err["details"] == {"max_bytes": settings.API_MAX_BODY_BYTES}
    assert Payment.objects.count() == 0 and IdempotencyKey.objects.count() == 0
    assert held(alice.account) == 0
    # The key was not taken: the corrected request goes through with it.
    fixed = alice.schedule(headers={"Idempotency-Key": "big-1"})
    assert fixed.status_code == 201, fixed.content
    assert Payment.objects.count() == 1


def test_body_over_djangos_upload_limit_is_413_not_500(alice, settings):
    """Django's own limit (DATA_UPLOAD_MAX_MEMORY_SIZE) raised inside a view: 413 too."""
    settings.API_MAX_BODY_BYTES = 10 * 1024 * 1024
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1024
    body = schedule_body(alice, metadata={"blob": "x" * 2048})
    for headers in ({}, {"Idempotency-Key": "big-2"}):
        response = alice.api.post("/api/v1/payments/schedule", body, format="json", headers=headers)
        error(response, 413, "payload_too_large")
    assert Payment.objects.count() == 0
    assert alice.schedule(headers={"Idempotency-Key": "big-2"}).status_code == 201
