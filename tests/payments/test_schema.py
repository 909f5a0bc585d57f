"""The OpenAPI schema as a client generator reads it (issue 16, item 9).

`openapi-python-client` builds one typed function per operation from
``/api/schema/``: its name is the operation id, each declared status gets a
typed result, enums become Python enums, and anything undeclared is an
untyped object or an ``UnexpectedStatus``. These tests check the properties
that make such a client usable, so the schema cannot drift from the code:
valid OpenAPI, explicit operation ids, one error component (``code`` an enum
of every code the code base answers with) on every error response, 401 / 429
/ 503 wherever they apply, the headers, exact bounds and enums, and the
internal endpoint's own security scheme.
"""

import json
import re
from pathlib import Path

import pytest
from django.conf import settings
from drf_spectacular.generators import SchemaGenerator
from openapi_spec_validator import validate

import payments
from ledger.models import AccountStatus, EntryKind
from payments.api.errors import ERROR_CODES
from payments.calendar import AMBIGUOUS_POLICIES, NONEXISTENT_POLICIES
from payments.models import (
    OCCURRENCE_OUTCOMES,
    PAYMENT_EVENT_TYPES,
    Actor,
    AttemptOutcome,
    DeliveryStatus,
    PaymentStatus,
    RecurringStatus,
)
from payments.services.recurring import MISSED_RUN_POLICIES
from payments.webhooks import EVENT_TYPES

ERROR_REF = "#/components/schemas/ErrorResponse"

OPERATION_IDS = {
    "accounts_list",
    "accounts_retrieve",
    "accounts_transactions",
    "internal_payment_execute",
    "payments_attempts",
    "payments_cancel",
    "payments_cancel_delete",
    "payments_create",
    "payments_events",
    "payments_list",
    "payments_retrieve",
    "payments_schedule",
    "payments_update",
    "recurring_cancel",
    "recurring_create",
    "recurring_list",
    "recurring_occurrences",
    "recurring_pause",
    "recurring_resume",
    "recurring_retrieve",
    "recurring_update",
    "webhook_endpoints_create",
    "webhook_endpoints_delete",
    "webhook_endpoints_deliveries",
    "webhook_endpoints_list",
    "webhook_endpoints_retrieve",
    "webhook_endpoints_update",
}
# Operations wrapped in views.idempotent (Idempotency-Key honoured).
IDEMPOTENT = {
    "payments_schedule",
    "payments_create",
    "payments_update",
    "payments_cancel",
    "payments_cancel_delete",
    "recurring_create",
    "recurring_update",
    "recurring_pause",
    "recurring_resume",
    "recurring_cancel",
    "webhook_endpoints_create",
}


@pytest.fixture(scope="module")
def spec():
    schema = SchemaGenerator().get_schema(request=None, public=True)
    return json.loads(json.dumps(schema))  # plain JSON types, as served


@pytest.fixture(scope="module")
def operations(spec):
    return {
        op["operationId"]: {**op, "method": method, "path": path}
        for path, item in spec["paths"].items()
        for method, op in item.items()
        if method in {"get", "post", "put", "patch", "delete"}
    }


def component(spec, name):
    return spec["components"]["schemas"][name]


def deref(spec, schema):
    while "$ref" in schema:
        schema = component(spec, schema["$ref"].rsplit("/", 1)[1])
    return schema


def enum_of(spec, schema) -> list:
    """The values an enum property allows (through $ref and a blank/null oneOf)."""
    for combinator in ("oneOf", "allOf"):
        if combinator in schema:
            return [v for option in schema[combinator] for v in enum_of(spec, option)]
    return deref(spec, schema)["enum"]


@pytest.mark.django_db
def test_the_served_schema_is_the_generated_one_and_validates(client, spec):
    served = client.get("/api/schema/", {"format": "json"})
    assert served.status_code == 200
    assert served.json() == spec
    validate(spec)  # openapi-spec-validator: OpenAPI 3.0 rules, $refs resolve


def response_components(spec, schema, seen=None) -> set[str]:
    """The components a response schema reaches, through $ref, items and properties."""
    seen = set() if seen is None else seen
    if not isinstance(schema, dict):
        return seen
    if "$ref" in schema:
        name = schema["$ref"].rsplit("/", 1)[1]
        if name not in seen:
            seen.add(name)
            response_components(spec, component(spec, name), seen)
        return seen
    for key in ("items", "additionalProperties"):
        response_components(spec, schema.get(key), seen)
    for combinator in ("oneOf", "anyOf", "allOf"):
        for option in schema.get(combinator, []):
            response_components(spec, option, seen)
    for prop in schema.get("properties", {}).values():
        response_components(spec, prop, seen)
    return seen


def test_every_field_of_a_success_response_is_required(spec, operations):
    """Every field our responses carry is always there (null when it has no
    value): the schema must say so, or a generated client types it optional.
    ``payment_status`` of an occurrence and ``secret_shown_once`` of a created
    webhook endpoint were listed as optional (a DRF ``default``)."""
    names = set()
    for operation in operations.values():
        for status, response in operation["responses"].items():
            if status.startswith("2"):
                for media in response.get("content", {}).values():
                    response_components(spec, media["schema"], names)
    assert "OccurrenceOutput" in names and "WebhookEndpointCreatedOutput" in names
    optional = {
        name: sorted(set(props) - set(component(spec, name).get("required", [])))
        for name in names
        if (props := component(spec, name).get("properties"))
    }
    assert {name: fields for name, fields in optional.items() if fields} == {}


def test_every_operation_has_an_explicit_stable_id(operations):
    assert set(operations) == OPERATION_IDS
    for operation_id in operations:
        assert not re.search(r"_\d+$", operation_id) and not operation_id.startswith("v1_")


def test_one_error_component_with_every_code(spec):
    body = component(spec, "ErrorResponse")
    assert body["required"] == ["error"]
    error = deref(spec, body["properties"]["error"])
    assert sorted(error["required"]) == ["code", "details", "message"]
    assert enum_of(spec, error["properties"]["code"]) == list(ERROR_CODES)
    assert error["properties"]["details"]["type"] == "object"


def test_every_error_response_is_the_error_component(operations):
    for operation_id, op in operations.items():
        errors = {s: r for s, r in op["responses"].items() if int(s) >= 400}
        assert errors, operation_id
        for status, response in errors.items():
            schema = response["content"]["application/json"]["schema"]
            assert schema == {"$ref": ERROR_REF}, (operation_id, status)
            codes = re.findall(r"`([a-z_]+)`", response["description"])
            assert codes and {ERROR_CODES[c] for c in codes} == {int(status)}, (
                operation_id,
                status,
            )


def test_401_411_413_429_503_wherever_they_apply(operations):
    for operation_id, op in operations.items():
        statuses = set(op["responses"])
        assert {"411", "413", "429", "503"} <= statuses, operation_id
        if operation_id == "internal_payment_execute":
            assert "401" not in statuses  # a wrong X-Internal-Auth is a 404
        else:
            assert op["security"] == [{"bearerAuth": []}], operation_id
            assert "401" in statuses, operation_id
        for status in ("429", "503"):
            header = op["responses"][status]["headers"]["Retry-After"]
            assert header["required"] and header["schema"]["type"] == "integer"


def test_request_bodies_declare_400_413_415(operations):
    for operation_id, op in operations.items():
        if "requestBody" in op:
            assert {"400", "413", "415"} <= set(op["responses"]), operation_id


def test_refusals_of_actions_are_declared(operations):
    """What the issue found missing: cancel, pause, resume, webhook-create."""
    expected = {
        "payments_cancel": {"400", "404", "409", "422"},
        "payments_cancel_delete": {"400", "404", "409", "422"},
        "recurring_pause": {"400", "404", "409", "422"},
        "recurring_resume": {"400", "404", "409", "422"},
        "recurring_cancel": {"400", "404", "409", "422"},
        "webhook_endpoints_create": {"400", "409", "422"},
    }
    for operation_id, statuses in expected.items():
        assert statuses <= set(operations[operation_id]["responses"]), operation_id
    assert (
        "`payment_not_cancellable`"
        in operations["payments_cancel"]["responses"]["409"]["description"]
    )
    assert (
        "`recurring_not_modifiable`"
        in operations["recurring_pause"]["responses"]["409"]["description"]
    )


def test_idempotency_headers(operations):
    for operation_id, op in operations.items():
        headers = {p["name"]: p for p in op.get("parameters", []) if p["in"] == "header"}
        success = next(s for s in op["responses"] if s.startswith("2"))
        replayed = op["responses"][success].get("headers", {}).get("Idempotent-Replayed")
        if operation_id in IDEMPOTENT:
            key = headers["Idempotency-Key"]["schema"]
            assert (key["minLength"], key["maxLength"]) == (1, 255)
            # the server refuses anything but printable ASCII: a key the schema
            # allowed (a DEL, a letter with an accent) was a surprise 400
            pattern = re.compile(key["pattern"])
            for allowed in ("a", " ", "~", "k" * 255, "order-42/retry_1"):
                assert pattern.fullmatch(allowed), allowed
            for refused in ("", "abc\x7f", "café", "tab\there", "k" * 256):
                assert not pattern.fullmatch(refused), refused
            assert replayed["schema"]["enum"] == ["true"], operation_id
            assert "Idempotent-Replayed" in op["responses"]["422"]["headers"]
            assert "Idempotent-Replayed" not in op["responses"]["401"].get("headers", {})
        else:
            assert "Idempotency-Key" not in headers and replayed is None, operation_id


def test_delay_seconds_bounds_are_what_the_server_accepts(spec):
    for name in ("ScheduleInputRequest", "PatchedUpdateInputRequest"):
        delay = component(spec, name)["properties"]["delay_seconds"]
        assert (delay["minimum"], delay["maximum"]) == (
            settings.PAYMENT_MIN_DELAY_SECONDS,
            settings.PAYMENT_MAX_DELAY_SECONDS,
        )
        assert (delay["minimum"], delay["maximum"]) == (1, 31_536_000)


def test_statuses_policies_and_event_types_are_exact_enums(spec):
    def prop(name, field):
        return component(spec, name)["properties"][field]

    payment_statuses = list(PaymentStatus.values)
    expected = {
        ("PaymentOutput", "status"): payment_statuses,
        ("CancelOutput", "status"): payment_statuses,
        ("EventOutput", "to_status"): payment_statuses,
        ("EventOutput", "from_status"): [*payment_statuses, ""],
        ("EventOutput", "actor"): list(Actor.values),
        ("EventOutput", "type"): list(PAYMENT_EVENT_TYPES),
        ("AttemptOutput", "outcome"): list(AttemptOutcome.values),
        ("AccountOutput", "status"): list(AccountStatus.values),
        ("StatementLineOutput", "kind"): list(EntryKind.values),
        ("RecurringOutput", "status"): list(RecurringStatus.values),
        ("RecurringOutput", "missed_run_policy"): list(MISSED_RUN_POLICIES),
        ("RecurringInputRequest", "missed_run_policy"): list(MISSED_RUN_POLICIES),
        ("OccurrenceOutput", "status"): list(OCCURRENCE_OUTCOMES),
        ("OccurrenceOutput", "payment_status"): [*payment_statuses, None],
        ("WebhookDeliveryOutput", "status"): list(DeliveryStatus.values),
        ("WebhookDeliveryOutput", "event_type"): list(EVENT_TYPES),
        ("DstPolicyOutput", "nonexistent"): list(NONEXISTENT_POLICIES),
        ("DstPolicyOutput", "ambiguous"): list(AMBIGUOUS_POLICIES),
        ("DstPolicyRequest", "nonexistent"): list(NONEXISTENT_POLICIES),
        ("DstPolicyRequest", "ambiguous"): list(AMBIGUOUS_POLICIES),
    }
    for (name, field), values in expected.items():
        assert enum_of(spec, prop(name, field)) == values, (name, field)
    for name in ("WebhookEndpointOutput", "WebhookEndpointInputRequest"):
        assert enum_of(spec, prop(name, "event_types")["items"]) == list(EVENT_TYPES)
    dst_policy = deref(spec, prop("RecurringOutput", "dst_policy"))
    assert "additionalProperties" not in dst_policy
    assert sorted(dst_policy["required"]) == ["ambiguous", "nonexistent"]


def test_the_internal_endpoint_uses_x_internal_auth(spec, operations):
    schemes = spec["components"]["securitySchemes"]
    assert schemes["internalAuth"] == {"type": "apiKey", "in": "header", "name": "X-Internal-Auth"}
    assert schemes["bearerAuth"] == {"type": "http", "scheme": "bearer"}
    op = operations["internal_payment_execute"]
    assert op["security"] == [{"internalAuth": []}]
    assert not [p for p in op.get("parameters", []) if p["name"] == "X-Internal-Auth"]
    body = deref(spec, op["requestBody"]["content"]["application/json"]["schema"])
    assert body["required"] == ["execution_id"]
    result = deref(spec, op["responses"]["200"]["content"]["application/json"]["schema"])
    assert "execution_id" in result["required"] and "payment_id" in result["required"]
    assert "`payment_not_due`" in op["responses"]["409"]["description"]


def test_every_payment_event_type_written_is_in_the_enum():
    """Event types are literals where events are written (``PaymentEvent(type=…)``,
    ``transitions.event(payment, "…")``): a new one must be added to the enum."""
    written = set()
    for path in Path(payments.__file__).parent.rglob("*.py"):
        if "migrations" in path.parts:
            continue
        text = path.read_text()
        for line in re.findall(r"\btype=(.*)$", text, flags=re.M):
            written |= set(re.findall(r'"([a-z_]+)"', line))
        written |= set(re.findall(r'\bevent\(\s*\w+,\s*"([a-z_]+)"', text))
    assert {"scheduled", "executed", "failed", "retried", "amount_changed"} <= written
    assert written <= set(PAYMENT_EVENT_TYPES)


@pytest.mark.django_db
def test_a_delete_cancel_with_a_body_answers_only_what_it_declares(operations, alice):
    """DELETE …/cancel reads an optional body as POST does, so a malformed one is
    a 400 and a non-JSON one a 415 — statuses its operation did not declare."""
    declared = set(operations["payments_cancel_delete"]["responses"])
    assert {"400", "413", "415"} <= declared
    pid = alice.schedule().json()["payment_id"]
    url = f"/api/v1/payments/{pid}/cancel"
    bad_json = alice.api.generic("DELETE", url, "{", content_type="application/json")
    assert bad_json.status_code == 400 and str(bad_json.status_code) in declared
    text = alice.api.generic("DELETE", url, "stop", content_type="text/plain")
    assert text.status_code == 415 and str(text.status_code) in declared
    reason = alice.api.generic("DELETE", url, '{"reason": "changed my mind"}', "application/json")
    assert reason.status_code == 200 and reason.json()["status"] == "CANCELLED"


@pytest.mark.django_db
def test_a_request_of_any_method_over_the_body_limit_is_a_declared_413(operations, alice, settings):
    """The body limit judges every API request by its Content-Length, before
    authentication: a GET or a pause carrying one answered a 413 that only the
    operations with a request body declared."""
    pid = alice.schedule().json()["payment_id"]
    settings.API_MAX_BODY_BYTES = 10
    for operation_id, method, path in [
        ("payments_retrieve", "GET", f"/api/v1/payments/{pid}"),
        ("payments_list", "GET", "/api/v1/payments"),
        ("payments_cancel_delete", "DELETE", f"/api/v1/payments/{pid}/cancel"),
    ]:
        response = alice.api.generic(method, path, "x" * 11, content_type="application/json")
        assert response.status_code == 413, operation_id
        assert response.json()["error"]["code"] == "payload_too_large"
        assert "413" in operations[operation_id]["responses"], operation_id


@pytest.mark.django_db
def test_a_representation_the_api_does_not_have_is_answered_in_json(client, alice):
    """``?format=xml`` was DRF's 404 and ``Accept: application/xml`` its 406, on
    operations that declare neither; both now get the JSON the API has. The
    schema view still honours the formats it has."""
    pid = alice.schedule().json()["payment_id"]
    for response in (
        alice.api.get(f"/api/v1/payments/{pid}", {"format": "xml"}),
        alice.api.get(f"/api/v1/payments/{pid}", HTTP_ACCEPT="application/xml"),
        alice.api.get("/api/v1/payments", HTTP_ACCEPT="application/xml"),
    ):
        assert response.status_code == 200, response.status_code
        assert response["Content-Type"].startswith("application/json")
        assert response.json()
    # a list reads its query strictly: format is not one of its parameters (a declared 400)
    listed = alice.api.get("/api/v1/payments", {"format": "xml"})
    assert listed.status_code == 400 and listed.json()["error"]["code"] == "validation_error"
    assert client.get("/api/schema/", {"format": "json"})["Content-Type"].startswith(
        "application/vnd.oai.openapi+json"
    )
    assert client.get("/api/schema/", {"format": "xml"}).status_code == 200


def test_every_query_parameter_may_be_given_empty(operations):
    """The server reads ``?status=`` as no status (views.parse_query); the schema
    said ``minLength: 1`` only, so a schema-checking client (schemathesis) called
    the accepted empty value a violation (an outside tester's finding)."""
    query = [
        (operation_id, p)
        for operation_id, op in operations.items()
        for p in op.get("parameters", [])
        if p["in"] == "query"
    ]
    assert len(query) >= 10  # the lists' status, account_id, limit, cursor…
    assert [(o, p["name"]) for o, p in query if p.get("allowEmptyValue") is not True] == []
