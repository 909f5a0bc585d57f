"""Errors on every API path (issue 16, item 3): JSON in the one shape, never a 500
for bad input, messages that agree with each other, one timestamp format.

Everything goes through the Django test client and the real URL conf.
"""

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from ledger.models import Account
from payments.api.errors import ERROR_CODES
from payments.api.serializers import A_BOOLEAN, A_STRING
from payments.clock import ISO_TIMESTAMP_FORMAT
from payments.engine import materializer
from payments.models import IdempotencyKey, Payment, RecurringPayment
from tests.payments.conftest import dispatched
from tests.payments.test_api import error, held, schedule_body
from tests.payments.test_recurring import create as create_recurring
from tests.payments.test_recurring import make_schedule

pytestmark = pytest.mark.django_db

README = Path(__file__).resolve().parents[2] / "README.md"


# --- unknown paths, methods, media types, sizes ----------------------------------------


@pytest.mark.parametrize(
    "path",
    [
        "/api",
        "/api/",
        "/api/nothing",
        "/api/v1/nothing-here",
        "/api/v2/payments",
        "/api/v1/payments/",  # no trailing slashes in this API
        "/api/v1/payments/x/y/z",
        "/api/v1/accounts/not-a-number",
        "/api/schemax",
    ],
)
@pytest.mark.parametrize("method", ["get", "post", "delete"])
def test_unknown_api_paths_are_json_404(alice, path, method):
    for api in (alice.api, APIClient()):  # authenticated or not: no route is no route
        response = getattr(api, method)(path)
        error(response, 404, "not_found")
        assert response["Content-Type"] == "application/json"


@pytest.mark.parametrize("path", ["/api/v2/payments", "/api/v1/payments/x/y/z", "/api"])
def test_errors_are_json_with_debug_on_too(alice, settings, path):
    """scripts/dev runs with DEBUG=true, where Django answers a path no route matches
    (and a refused Host) with its technical HTML page unless the middleware steps in."""
    settings.DEBUG = True
    error(alice.api.get(path), 404, "not_found")
    settings.ALLOWED_HOSTS = ["api.example"]
    response = alice.api.get("/api/v1/payments", HTTP_HOST="evil.example")
    error(response, 400, "validation_error")
    assert response["Content-Type"] == "application/json"


def test_a_host_not_allowed_is_json_400_under_the_api(alice, settings, client):
    """Refused before any view (DisallowedHost), by Django's handler400: JSON under
    /api/, Django's page elsewhere. Found by bench/api_cost.py's test client."""
    settings.ALLOWED_HOSTS = ["api.example"]
    response = alice.api.get("/api/v1/payments", HTTP_HOST="evil.example")
    error(response, 400, "validation_error")
    assert response["Content-Type"] == "application/json"
    page = client.get("/admin/login/", HTTP_HOST="evil.example")
    assert page.status_code == 400 and page["Content-Type"].startswith("text/html")


def test_unknown_paths_outside_the_api_keep_the_html_page(client):
    response = client.get("/apix/v1/payments")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def one_of_each(client, fake_dns) -> dict:
    """Ids of one of ``client``'s account, payment, schedule and webhook endpoint."""
    fake_dns["example.test"] = ["93.184.215.14"]
    return {
        "account": client.account.pk,
        "payment": client.schedule().json()["payment_id"],
        "recurring": create_recurring(client).json()["recurring_payment_id"],
        "endpoint": client.api.post(
            "/api/v1/webhook-endpoints",
            {"url": "https://example.test/h", "event_types": ["payment.completed"]},
            format="json",
        ).json()["webhook_endpoint_id"],
    }


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("put", "/api/v1/payments"),
        ("get", "/api/v1/payments/schedule"),
        ("delete", "/api/v1/accounts"),
        ("post", "/api/v1/accounts/{account}"),
        ("get", "/api/v1/payments/{payment}/cancel"),
        ("put", "/api/v1/recurring-payments"),
        ("get", "/api/v1/recurring-payments/{recurring}/pause"),
        ("post", "/api/v1/webhook-endpoints/{endpoint}/deliveries"),
    ],
)
def test_method_not_allowed_is_json_405_with_allow(alice, fake_dns, method, path):
    ids = one_of_each(alice, fake_dns)
    response = getattr(alice.api, method)(path.format(**ids))
    err = error(response, 405, "method_not_allowed")
    assert method.upper() in err["message"]
    assert method.upper() not in response["Allow"]


@pytest.mark.parametrize(
    ("content_type", "data"),
    [
        ("text/plain", "amount=5"),
        ("application/x-www-form-urlencoded", "amount=5"),
        ("multipart/form-data; boundary=x", "--x--"),
        ("application/xml", "<a/>"),
    ],
)
@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/api/v1/payments/schedule"),
        ("post", "/api/v1/payments"),
        ("patch", "/api/v1/payments/{payment}"),
        ("post", "/api/v1/payments/{payment}/cancel"),
        ("post", "/api/v1/recurring-payments"),
        ("post", "/api/v1/webhook-endpoints"),
    ],
)
def test_a_body_that_is_not_json_is_415_with_a_hint(alice, content_type, data, method, path):
    payment_id = alice.schedule().json()["payment_id"]
    response = getattr(alice.api, method)(
        path.format(payment=payment_id), data, content_type=content_type
    )
    err = error(response, 415, "unsupported_media_type")
    assert "Content-Type: application/json" in err["message"]
    assert content_type.split(";")[0] in err["message"]
    assert err["details"] == {"supported_media_types": ["application/json"]}
    assert Payment.objects.count() == 1 and held(alice.account) == 100
    assert RecurringPayment.objects.count() == 0


def test_a_415_does_not_take_the_idempotency_key(alice):
    key = {"Idempotency-Key": "form-then-json"}
    response = alice.api.post(
        "/api/v1/payments/schedule", "amount=5", content_type="text/plain", headers=key
    )
    error(response, 415, "unsupported_media_type")
    assert IdempotencyKey.objects.count() == 0
    fixed = alice.schedule(headers=key)
    assert fixed.status_code == 201, fixed.content
    assert "Idempotent-Replayed" not in fixed


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("post", "/api/v1/payments"),
        ("patch", "/api/v1/payments/{payment}"),
        ("post", "/api/v1/recurring-payments"),
        ("post", "/api/v1/webhook-endpoints"),
        ("post", "/api/v1/nothing-here"),
    ],
)
def test_an_oversize_body_is_413_on_every_api_path(alice, settings, method, path):
    payment_id = alice.schedule().json()["payment_id"]
    body = schedule_body(alice, metadata={"blob": "x" * settings.API_MAX_BODY_BYTES})
    for api in (alice.api, APIClient()):  # refused before authentication, too
        response = getattr(api, method)(path.format(payment=payment_id), body, format="json")
        err = error(response, 413, "payload_too_large")
        assert err["details"] == {"max_bytes": settings.API_MAX_BODY_BYTES}
    assert Payment.objects.count() == 1 and RecurringPayment.objects.count() == 0


@pytest.mark.parametrize(
    "method, path",
    [
        ("POST", "/api/v1/payments/schedule"),
        ("PATCH", "/api/v1/payments/{payment}"),
        ("GET", "/api/v1/payments/{payment}"),
        ("POST", "/api/v1/nothing-here"),
    ],
)
def test_a_chunked_body_is_411_on_every_api_path_and_writes_nothing(alice, method, path):
    """Django reads a body only up to its Content-Length: a body sent chunked
    reached the view empty and was answered "field required" for fields the
    client had sent (an outside tester). Refused first, like an oversize body."""
    payment_id = alice.schedule().json()["payment_id"]
    for api in (alice.api, APIClient()):
        response = api.generic(
            method,
            path.format(payment=payment_id),
            HTTP_TRANSFER_ENCODING="chunked",
            HTTP_IDEMPOTENCY_KEY="chunked-1",
        )
        err = error(response, 411, "length_required")
        assert "Content-Length" in err["message"]
    assert Payment.objects.count() == 1
    # the key stayed free, and a body with its length goes through
    assert alice.schedule(headers={"Idempotency-Key": "chunked-1"}).status_code == 201


# --- authentication ------------------------------------------------------------------


@pytest.mark.parametrize("header", ["Token abc123", "token abc123", "Basic dXNlcjpwYXNz", "abc"])
def test_another_authorization_scheme_is_told_to_use_bearer(alice, header):
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=header)
    response = api.get("/api/v1/payments")
    err = error(response, 401, "authentication_failed")
    assert "Authorization: Bearer <token>" in err["message"]
    assert response["WWW-Authenticate"] == "Bearer"
    # the same with the right token in the wrong scheme: a Token-style client
    api.credentials(HTTP_AUTHORIZATION=f"Token {alice.token}")
    assert "Bearer" in error(api.get("/api/v1/accounts"), 401, "authentication_failed")["message"]


def test_missing_or_malformed_credentials_name_the_bearer_scheme():
    api = APIClient()
    err = error(api.get("/api/v1/payments"), 401, "not_authenticated")
    assert "Authorization: Bearer <token>" in err["message"]
    api.credentials(HTTP_AUTHORIZATION="Bearer a b")
    err = error(api.get("/api/v1/payments"), 401, "authentication_failed")
    assert "Authorization: Bearer <token>" in err["message"]


# --- validation messages ---------------------------------------------------------------

DELAY_RULE = "Must be between 1 and 31536000 seconds."


@pytest.mark.parametrize("delay", [0, -1, 31_536_001, 2**31 + 1, 10**20])
def test_both_delay_bounds_in_one_message_whichever_is_broken(alice, delay):
    """The input check and the service word the rule the same way (it used to be
    "greater than or equal to 0" or "less than or equal to 2147483648" by turns)."""
    payment_id = alice.schedule().json()["payment_id"]
    for response in (
        alice.schedule(delay_seconds=delay),
        alice.api.patch(f"/api/v1/payments/{payment_id}", {"delay_seconds": delay}, format="json"),
    ):
        err = error(response, 400, "validation_error")
        assert err["message"] == f"delay_seconds: {DELAY_RULE}"
        assert err["details"]["fields"] == {"delay_seconds": [DELAY_RULE]}
    assert Payment.objects.count() == 1


def test_delay_bounds_follow_the_settings(alice, settings):
    settings.PAYMENT_MAX_DELAY_SECONDS = 100
    err = error(alice.schedule(delay_seconds=101), 400, "validation_error")
    assert err["details"]["fields"] == {"delay_seconds": ["Must be between 1 and 100 seconds."]}
    assert alice.schedule(delay_seconds=100).status_code == 201


def test_one_of_delay_or_time_is_worded_once(alice):
    both = alice.schedule(scheduled_time=(timezone.now() + timedelta(hours=1)).isoformat())
    neither = alice.api.post(
        "/api/v1/payments",
        {"from_account_id": alice.account.pk, "to_account_id": alice.other_account.pk, "amount": 1},
        format="json",
    )
    messages = {error(r, 400, "validation_error")["message"] for r in (both, neither)}
    assert messages == {"delay_seconds: Give exactly one of delay_seconds or scheduled_time."}


def test_amount_above_the_accounts_limit_names_max_payment_amount(alice):
    Account.objects.filter(pk=alice.account.pk).update(max_payment_amount=50)
    payment_id = alice.schedule(amount=50).json()["payment_id"]
    rule = "Must be at most 50, this account's max_payment_amount."
    schedule_id = create_recurring(alice, amount=50).json()["recurring_payment_id"]
    for response in (
        alice.schedule(amount=51),
        alice.api.patch(f"/api/v1/payments/{payment_id}", {"amount": 51}, format="json"),
        create_recurring(alice, amount=51),
        alice.api.patch(f"/api/v1/recurring-payments/{schedule_id}", {"amount": 51}, format="json"),
    ):
        err = error(response, 400, "validation_error")
        assert err["message"] == f"amount: {rule}"
        assert err["details"] == {
            "fields": {"amount": [rule]},
            "account_id": alice.account.pk,
            "max_payment_amount": 50,
        }
    assert Payment.objects.get(pk=payment_id).amount == 50 and held(alice.account) == 50


def test_readme_documents_the_per_account_limit_and_how_staff_change_it():
    text = README.read_text()
    section = text[text.index("**Per-account limit.**") :][:1500]
    for words in ("max_payment_amount", "1,000,000", "Max payment amount", "change_account"):
        assert words in section, words


@pytest.mark.parametrize("zone", ["Mars/Olympus", "../etc/passwd", "", "x" * 65, "UTC+1"])
def test_an_unknown_time_zone_is_reported_under_timezone(alice, zone):
    err = error(create_recurring(alice, timezone=zone), 400, "validation_error")
    assert list(err["details"]["fields"]) == ["timezone"]
    assert err["message"].startswith("timezone: ")
    assert RecurringPayment.objects.count() == 0


def test_same_account_is_worded_once(alice):
    for response in (
        alice.schedule(to_account_id=alice.account.pk),
        create_recurring(alice, to_account_id=alice.account.pk),
    ):
        err = error(response, 400, "validation_error")
        assert err["details"]["fields"] == {"to_account_id": ["Must differ from from_account_id."]}


# --- timestamps ------------------------------------------------------------------------

TIMESTAMP = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z$")
LOOKS_LIKE_A_TIME = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d")


def timestamps(value):
    """Every string in a JSON document that looks like a date-time."""
    if isinstance(value, dict):
        for item in value.values():
            yield from timestamps(item)
    elif isinstance(value, list):
        for item in value:
            yield from timestamps(item)
    elif isinstance(value, str) and LOOKS_LIKE_A_TIME.match(value):
        yield value


def test_created_at_is_not_after_updated_at_on_creation(alice, accounts_for_materialiser):
    body = alice.schedule().json()
    assert body["created_at"] == body["updated_at"]
    payment = Payment.objects.get(pk=body["payment_id"])
    assert payment.created_at == payment.updated_at
    schedule = RecurringPayment.objects.get(
        pk=create_recurring(alice).json()["recurring_payment_id"]
    )
    assert schedule.created_at == schedule.updated_at
    source, target = accounts_for_materialiser
    make_schedule(source, target, start=timezone.now() + timedelta(seconds=5))
    assert materializer.materialize_due().scheduled == 1
    occurrence = Payment.objects.get(from_account_id=source)
    assert occurrence.created_at == occurrence.updated_at


@pytest.fixture
def accounts_for_materialiser(alice):
    from tests.factories import AccountFactory

    return AccountFactory(owner=alice.user, funded=1_000).pk, alice.other_account.pk


def test_one_timestamp_format_everywhere(alice, receiver):
    """UTC, six fractional digits, "Z" — even for an instant on a whole second, in
    responses, error details, event data and webhook bodies."""
    alice.api.post(
        "/api/v1/webhook-endpoints",
        {"url": receiver.url, "event_types": ["payment.cancelled"]},
        format="json",
    )
    whole_second = (timezone.now() + timedelta(hours=2)).replace(microsecond=0)
    body = schedule_body(alice, scheduled_time=whole_second.isoformat())
    del body["delay_seconds"]
    created = alice.api.post("/api/v1/payments", body, format="json")
    payment = created.json()
    assert payment["scheduled_time"] == whole_second.strftime(ISO_TIMESTAMP_FORMAT)
    pid = payment["payment_id"]
    later = (whole_second + timedelta(hours=1)).isoformat()
    alice.api.patch(f"/api/v1/payments/{pid}", {"scheduled_time": later}, format="json")
    alice.api.delete(f"/api/v1/payments/{pid}/cancel")
    documents = [
        payment,
        alice.api.get(f"/api/v1/payments/{pid}").json(),
        alice.api.get(f"/api/v1/payments/{pid}/events").json(),
        alice.api.get("/api/v1/payments").json(),
        alice.api.get(f"/api/v1/accounts/{alice.account.pk}").json(),
        alice.api.get(f"/api/v1/accounts/{alice.account.pk}/transactions").json(),
        create_recurring(alice, start_time=whole_second.isoformat()).json(),
        error(
            alice.api.post(
                "/api/v1/payments", body | {"scheduled_time": "2020-01-01T00:00:00Z"}, format="json"
            ),
            400,
            "validation_error",
        ),
    ]
    dispatched()
    from payments.models import WebhookDelivery

    documents += [d.payload for d in WebhookDelivery.objects.all()]
    found = [t for document in documents for t in timestamps(document)]
    assert len(found) > 20
    assert [t for t in found if not TIMESTAMP.match(t)] == []


# --- the error codes --------------------------------------------------------------------


def readme_error_table() -> dict[str, int]:
    """``code -> HTTP status`` from the README's errors table."""
    text = README.read_text()
    start = text.index("Errors always look like")
    table = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            if table:
                break
            continue
        cells = [c.strip() for c in line.strip("|").split("|")]
        if not cells[0].isdigit():
            continue
        for code in re.findall(r"`([a-z_]+)`", cells[1]):
            table[code] = int(cells[0])
    return table


def test_readme_error_table_matches_the_code():
    assert readme_error_table() == ERROR_CODES


def test_a_429_always_says_when_to_retry():
    """DRF has no estimate when more requests than the rate got in at once
    (processes racing on the shared cache): Retry-After is still sent."""
    from rest_framework.exceptions import Throttled

    from payments.api.errors import exception_handler

    response = exception_handler(Throttled(wait=None), {})
    assert response.status_code == 429 and response["Retry-After"] == "2"
    assert response.data["error"]["code"] == "throttled"
    assert response.data["error"]["details"] == {"retry_after_seconds": 1.0}


@pytest.mark.parametrize(
    ("method", "path", "body", "field", "reason"),
    [
        ("post", "/api/v1/payments", {"description": 123}, "description", "string"),
        ("patch", "/api/v1/payments/{payment}", {"description": 42}, "description", "string"),
        ("post", "/api/v1/payments/{payment}/cancel", {"reason": 7}, "reason", "string"),
        (
            "patch",
            "/api/v1/recurring-payments/{recurring}",
            {"description": 42},
            "description",
            "string",
        ),
        ("post", "/api/v1/recurring-payments", {"cron": 5}, "cron", "string"),
        ("post", "/api/v1/recurring-payments", {"timezone": ["UTC"]}, "timezone", "string"),
        (
            "patch",
            "/api/v1/webhook-endpoints/{endpoint}",
            {"is_active": "no"},
            "is_active",
            "boolean",
        ),
        ("patch", "/api/v1/webhook-endpoints/{endpoint}", {"is_active": 0}, "is_active", "boolean"),
        (
            "patch",
            "/api/v1/webhook-endpoints/{endpoint}",
            {"is_active": "on"},
            "is_active",
            "boolean",
        ),
        ("patch", "/api/v1/webhook-endpoints/{endpoint}", {"url": 1}, "url", "string"),
    ],
)
def test_a_value_of_another_json_type_is_refused_as_integers_are(
    alice, fake_dns, method, path, body, field, reason
):
    """Integers were strict (a string or float refused) while DRF turned a number
    into a string field's text and "no", 0 or "on" into a boolean (an outside
    tester's finding): every field takes its own JSON type only, and nothing is
    written."""
    ids = one_of_each(alice, fake_dns)
    if path == "/api/v1/payments":
        body = schedule_body(alice) | body
    elif path == "/api/v1/recurring-payments":
        body = {
            "from_account_id": alice.account.pk,
            "to_account_id": alice.other_account.pk,
            "amount": 10,
            "cron": "0 9 * * *",
            "timezone": "UTC",
        } | body
    before = (Payment.objects.count(), RecurringPayment.objects.count())
    response = getattr(alice.api, method)(path.format(**ids), body, format="json")
    err = error(response, 400, "validation_error")
    assert err["details"]["fields"][field] == [A_STRING if reason == "string" else A_BOOLEAN]
    assert (Payment.objects.count(), RecurringPayment.objects.count()) == before
