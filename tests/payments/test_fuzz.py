"""Schema-driven fuzzing of the public API with Schemathesis: no input gives a 5xx.

Every operation in the OpenAPI document (``/api/schema/``, loaded from the WSGI
app in-process) gets Schemathesis' coverage cases (boundaries, missing and
mistyped fields, wrong content types) and ``FUZZ_EXAMPLES`` Hypothesis
examples, sent as an authenticated client. Each case is sent as generated
(its ids are almost always unknown: the 404/422 paths) and, where that changes
anything, again aimed at the client's real resources (its accounts, a payment,
a recurring schedule, a webhook endpoint, the internal token), so the fuzzed
bodies and queries also reach the business rules and the ledger. Checks:
``not_a_server_error`` and ``response_schema_conformance``; each operation must
also answer 2xx at least once, so a run that never got past authentication,
lookup or validation fails instead of passing.

Requests commit (``transaction=True``) as in production: deferred ledger
constraints are checked at COMMIT, which a rolled-back test transaction
would skip.

    scripts/test tests/payments/test_fuzz.py                      # CI size
    FUZZ_EXAMPLES=500 scripts/test tests/payments/test_fuzz.py    # longer run
    scripts/test -m fuzz                                          # just the fuzzers
"""

from __future__ import annotations

import itertools
import json
import os
from collections import Counter
from datetime import timedelta
from zoneinfo import available_timezones

import pytest
import schemathesis
from django.conf import settings as django_settings
from django.utils import timezone
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from payments import services, tasks, webhooks
from payments.api.auth import ClientRateThrottle, InternalRateThrottle
from payments.models import IdempotencyKey, Payment
from payments.services import payment_execute_now
from scheduler_project.wsgi import application
from tests.payments.conftest import Client

FUZZ_EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "20"))
INTERNAL_TOKEN = "fuzz-internal-token"
WEBHOOK_URL = "https://hooks.example.test/fuzz"
TIMEZONES = available_timezones()
CHECKS = [not_a_server_error, response_schema_conformance]

schema = schemathesis.openapi.from_wsgi("/api/schema/", application)

pytestmark = pytest.mark.fuzz


class Resources:
    """A funded client and real ids to put into fuzzed requests.

    Reads get long-lived objects with history (an executed payment with
    attempts and events, an account with postings, a webhook endpoint with a
    delivery); writes get a fresh object per case, so one fuzzed cancel does
    not turn every later case into a 409.
    """

    def __init__(self, client: Client):
        self.client = client
        self.user = client.user
        self.account_id = client.account.pk
        self.other_account_id = client.other_account.pk
        self.endpoint_id = self.new_endpoint()
        self.payment_id = self.new_payment(due=True)
        payment_execute_now(payment_id=self.payment_id, execution_id="fuzz-setup")
        self.recurring_id = self.new_recurring()
        self.keys = itertools.count()

    def new_payment(self, *, due: bool = False) -> str:
        payment = services.payment_schedule(
            client=self.user,
            from_account_id=self.account_id,
            to_account_id=self.other_account_id,
            amount=100,
            delay_seconds=3600,
        )
        if due:
            when = timezone.now() - timedelta(seconds=1)
            Payment.objects.filter(pk=payment.pk).update(due_at=when, run_at=when)
        return str(payment.pk)

    def new_recurring(self) -> str:
        schedule = services.recurring_create(
            client=self.user,
            from_account_id=self.account_id,
            to_account_id=self.other_account_id,
            amount=100,
            interval_seconds=3600,
        )
        return str(schedule.pk)

    def new_endpoint(self) -> str:
        endpoint = webhooks.endpoint_create(
            client=self.user,
            url=WEBHOOK_URL,
            event_types=["payment.completed", "payment.cancelled"],
        )
        return str(endpoint.pk)

    def path_parameters(self, method: str, path: str) -> dict[str, str | int]:
        read = method == "GET"
        if path.startswith("/api/v1/internal/payments/"):
            return {"payment_id": self.new_payment(due=True)}
        if path.startswith("/api/v1/payments/{payment_id}"):
            return {"payment_id": self.payment_id if read else self.new_payment()}
        if path.startswith("/api/v1/recurring-payments/{recurring_id}"):
            return {"recurring_id": self.recurring_id if read else self.new_recurring()}
        if path.startswith("/api/v1/webhook-endpoints/{endpoint_id}"):
            return {"endpoint_id": self.endpoint_id if read else self.new_endpoint()}
        if path.startswith("/api/v1/accounts/{account_id}"):
            return {"account_id": self.account_id}
        return {}

    def aim(self, case):
        """``case`` aimed at this client's real resources; None if that changes nothing."""
        if case.method.upper() != case.operation.method.upper():
            return None  # a probe for 405: which ids it names does not matter
        if "{" not in case.operation.path and case.meta and case.meta.generation.mode.is_negative:
            return None  # refused by validation whichever accounts it names
        real = case.derive(keep_auth=True)
        real.path_parameters.update(self.path_parameters(case.method.upper(), case.path))
        if "account_id" in real.query:
            real.query["account_id"] = self.account_id
        if case.operation.path.startswith("/api/v1/internal/"):
            # its security scheme (apiKey X-Internal-Auth): not generated
            real.headers["X-Internal-Auth"] = INTERNAL_TOKEN
        if "Idempotency-Key" in real.headers:
            # The fuzzer draws few distinct keys: reused with another body they
            # are a 422 before any work. The case as generated covers reuse.
            real.headers["Idempotency-Key"] = f"aimed-{next(self.keys)}"
        if isinstance(real.body, dict):
            real.body = self.repair(real.body, declared_fields(case.operation))
        unchanged = (real.path_parameters, real.query, real.headers, real.body) == (
            case.path_parameters,
            case.query,
            case.headers,
            case.body,
        )
        return None if unchanged else real

    def repair(self, body: dict, declared: set[str]) -> dict:
        """Undo what the schema allows but the API refuses before any real work.

        The fuzzer then reaches the services and the ledger with its amounts,
        times, descriptions and metadata instead of stopping at a 400. What
        the schema cannot say: request objects reject unknown fields;
        ``delay_seconds`` and ``scheduled_time`` (``cron`` and
        ``interval_seconds``) exclude each other; delays are bounded by
        settings; ``timezone`` is an IANA name; ``end_time`` follows the start;
        a webhook ``url`` must resolve to a public address.
        """
        body = {name: value for name, value in body.items() if name in declared}
        for name, value in (
            ("from_account_id", self.account_id),
            ("to_account_id", self.other_account_id),
        ):
            if name in body:
                body[name] = value
        if "delay_seconds" in body:
            body.pop("scheduled_time", None)
            if isinstance(body["delay_seconds"], int):
                max_delay = django_settings.PAYMENT_MAX_DELAY_SECONDS
                body["delay_seconds"] = 1 + body["delay_seconds"] % max_delay
        elif {"delay_seconds", "from_account_id"} <= declared and "scheduled_time" not in body:
            body["delay_seconds"] = 60  # a new payment needs one of the two
        if "url" in body:
            body["url"] = WEBHOOK_URL  # a public https URL (fake_dns), not the fuzzer's host
        if "cron" in declared:
            body.pop("cron", None)
            if not (isinstance(body.get("timezone"), str) and body["timezone"] in TIMEZONES):
                body.pop("timezone", None)
            body.pop("end_time", None)
            if not isinstance(body.get("interval_seconds"), int):
                body["interval_seconds"] = 3600
        return body


def declared_fields(operation) -> set[str]:
    """Property names of the operation's JSON request body in the OpenAPI document."""
    definition = schema.raw_schema["paths"][operation.path][operation.method.lower()]
    content = definition.get("requestBody", {}).get("content", {})
    ref = content.get("application/json", {}).get("schema", {}).get("$ref", "")
    component = schema.raw_schema["components"]["schemas"].get(ref.rsplit("/", 1)[-1], {})
    return set(component.get("properties", {}))


@pytest.fixture
def resources(db, settings, monkeypatch, fake_dns):
    settings.INTERNAL_API_TOKEN = INTERNAL_TOKEN
    # Webhook URLs must resolve to a public address: the aimed cases' host does
    # (and is never called: see dispatch_webhooks below). Every write case on an endpoint
    # gets a fresh one, so the per-client quota is lifted.
    fake_dns["hooks.example.test"] = ["93.184.215.14"]
    settings.WEBHOOK_MAX_ENDPOINTS_PER_CLIENT = 10**6
    # Likewise every case aimed at a schedule gets a fresh one (the quota has its
    # own tests in test_recurring_isolation.py).
    settings.RECURRING_MAX_ACTIVE_PER_CLIENT = 10**6
    # DRF reads throttle rates once, at import: lift the budget on the class so
    # hundreds of in-process requests a second are fuzzed, not throttled.
    monkeypatch.setattr(ClientRateThrottle, "rate", "1000000/s", raising=False)
    monkeypatch.setattr(InternalRateThrottle, "rate", "1000000/s", raising=False)
    # Webhook deliveries are written as usual but not published to the broker:
    # a worker elsewhere must not POST to URLs the fuzzer made up.
    monkeypatch.setattr(tasks.dispatch_webhooks, "apply_async", lambda *a, **kw: None)
    return Resources(Client("fuzz", balance=10**9))


@pytest.fixture
def statuses(request):
    seen: Counter[int] = Counter()
    yield seen
    assert any(200 <= code < 300 for code in seen), (
        f"{request.node.name}: no 2xx answer among {sum(seen.values())} requests "
        f"({dict(seen)}): the fuzzer never got past authentication, lookup or validation"
    )


@pytest.mark.django_db(transaction=True)
@schema.parametrize()
@settings(
    max_examples=FUZZ_EXAMPLES,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
def test_api_has_no_server_errors(case, resources, statuses):
    case.headers["Authorization"] = f"Bearer {resources.client.token}"
    aimed = resources.aim(case)
    for sent in (case,) if aimed is None else (case, aimed):
        response = sent.call()
        statuses[response.status_code] += 1
        sent.validate_response(response, checks=CHECKS)


# What the fuzzer found (or led to), replayed as plain requests. Valid JSON that
# PostgreSQL or a UTF-8 response cannot carry was a 500, and so was nesting deep
# enough to exhaust the stack (parsing ~1000 levels; ~909 levels parsed but then
# failed json.dumps in the metadata size check): now a 400 before any work, with
# nesting capped at payments.api.parsers.MAX_DEPTH.
UNREPRESENTABLE = {
    "U+0000 in an unknown field, stored by Idempotency-Key": (
        "/api/v1/webhook-endpoints",
        '{"bad\\u0000": 1, "url": "https://a.example.test", "event_types": ["payment.failed"]}',
    ),
    "U+0000 in metadata": ("/api/v1/payments/schedule", '{"metadata": {"a": "\\u0000"}}'),
    "unpaired surrogate in an unknown field (echoed)": (
        "/api/v1/payments/schedule",
        '{"bad\\ud800": 1}',
    ),
    "invalid choice quoting U+0000, stored by Idempotency-Key": (
        "/api/v1/recurring-payments",
        '{"missed_run_policy": "\\u0000"}',
    ),
    "number beyond a double in metadata": (
        "/api/v1/payments/schedule",
        '{"metadata": {"a": 1e400}}',
    ),
    "metadata nested past the limit": (
        "/api/v1/payments/schedule",
        '{"metadata": ' + '{"a": ' * 100 + "1" + "}" * 101,
    ),
    "nesting past the recursion limit": (  # within API_MAX_BODY_BYTES (64 KiB)
        "/api/v1/payments/schedule",
        "[" * 32_000 + "]" * 32_000,
    ),
}


@pytest.mark.parametrize("path, body", UNREPRESENTABLE.values(), ids=UNREPRESENTABLE.keys())
def test_unrepresentable_json_is_a_400_and_writes_nothing(alice, path, body):
    valid = {
        "from_account_id": alice.account.pk,
        "to_account_id": alice.other_account.pk,
        "amount": 100,
        "delay_seconds": 60,
    }
    if body.startswith("{") and path == "/api/v1/payments/schedule":
        body = json.dumps(valid)[:-1] + ", " + body[1:]  # otherwise valid
    response = alice.api.post(
        path, data=body, content_type="application/json", headers={"Idempotency-Key": "k"}
    )

    assert response.status_code == 400, response.content
    assert response.json()["error"]["code"] == "parse_error"
    assert not Payment.objects.exists()
    assert not IdempotencyKey.objects.exists()


def test_ordinary_json_is_still_accepted(alice):
    """Only the characters themselves are refused, not their spelling as text."""
    nested: dict = {"leaf": True}
    for _ in range(97):
        nested = {"n": nested}  # body, metadata and these 98: 100 levels, the most allowed
    metadata = {"a": "\\u0000", "b": "\\ud800", "c": 1e300, "nested": nested}
    response = alice.schedule(metadata=metadata)

    assert response.status_code == 201, response.content
    assert response.json()["metadata"] == metadata


@pytest.mark.parametrize("method", ["post", "patch"])
def test_u0000_in_the_id_of_an_idempotent_write_is_a_404(alice, method):
    path = "/api/v1/payments/%00x/cancel" if method == "post" else "/api/v1/payments/%00x"
    response = getattr(alice.api, method)(path, {}, format="json", headers={"Idempotency-Key": "k"})

    assert response.status_code == 404, response.content
    assert response.json()["error"]["code"] == "not_found"
    assert not IdempotencyKey.objects.exists()
