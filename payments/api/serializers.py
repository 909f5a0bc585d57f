"""Input serializers parse and type-check; output serializers render. No business rules here."""

from __future__ import annotations

import json
from datetime import UTC

from django.conf import settings
from django.utils.dateparse import parse_datetime
from rest_framework import serializers

from ledger.models import AccountStatus, EntryKind

from ..calendar import AMBIGUOUS_POLICIES, NONEXISTENT_POLICIES, planned
from ..exceptions import InvalidSchedule
from ..models import (
    OCCURRENCE_OUTCOMES,
    PAYMENT_EVENT_TYPES,
    Actor,
    AttemptOutcome,
    DeliveryStatus,
    PaymentStatus,
    RecurringStatus,
)
from ..services.recurring import MISSED_RUN_POLICIES, ONE_OF_CRON_OR_INTERVAL
from ..services.rules import ONE_OF_DELAY_OR_TIME, delay_seconds_rule
from ..webhooks import EVENT_TYPES

METADATA_MAX_BYTES = 4096


class StrictIntegerField(serializers.IntegerField):
    """A JSON integer: no strings, floats or booleans (money is never a float)."""

    default_error_messages = {"invalid": "A JSON integer is required."}

    def to_internal_value(self, data):
        if isinstance(data, bool) or not isinstance(data, int):
            self.fail("invalid")
        return super().to_internal_value(data)


class AwareDateTimeField(serializers.DateTimeField):
    """ISO-8601 with a UTC offset; a naive time would be ambiguous.

    The instant is returned in UTC: Python accepts offsets up to ±23:59:59.999999,
    PostgreSQL's text input only up to ±15:59:59 with no fractions, and a time
    kept with the client's ``+23:59`` failed at its save (a 500 on PATCH and the
    recurring writes, while a schedule's binary insert took it).
    """

    default_error_messages = {
        "naive": "Include a UTC offset, e.g. 2030-01-01T09:00:00Z.",
        "invalid": "An ISO-8601 date-time with a UTC offset is required.",
        "range": "The date-time is outside the supported range (years 1 to 9999 in UTC).",
    }

    def to_internal_value(self, value):
        if not isinstance(value, str):
            self.fail("invalid")
        try:
            parsed = parse_datetime(value)
        except ValueError:
            parsed = None
        if parsed is None:
            self.fail("invalid")
        if parsed.tzinfo is None:
            self.fail("naive")
        try:
            return parsed.astimezone(UTC)
        except OverflowError:  # year 1 at +14:00, year 9999 at -05:00
            self.fail("range")


class DelaySecondsField(StrictIntegerField):
    """Seconds from now, within ``PAYMENT_MIN_DELAY_SECONDS`` … ``PAYMENT_MAX_DELAY_SECONDS``.

    The bounds are read when the field is built (DRF rebuilds declared fields
    for every serializer instance), so the check, its message and the OpenAPI
    schema follow the settings, and agree with ``services.rules.resolve_due_at``.
    """

    def __init__(self, **kwargs):
        rule = delay_seconds_rule()
        kwargs["min_value"] = settings.PAYMENT_MIN_DELAY_SECONDS
        kwargs["max_value"] = settings.PAYMENT_MAX_DELAY_SECONDS
        kwargs["error_messages"] = {"min_value": rule, "max_value": rule}
        super().__init__(**kwargs)


A_STRING = "A JSON string is required."
A_BOOLEAN = "A JSON boolean (true or false) is required."


def _wrong_json_type(field, value) -> str | None:
    """Why ``value`` is not of the JSON type ``field`` declares, or None. As integers
    are (``StrictIntegerField``): DRF turned ``"description": 123`` into ``"123"``
    and ``"is_active": "no"`` (or ``0``, ``"on"``) into a boolean."""
    if value is None:
        return None  # allow_null decides
    if isinstance(field, serializers.BooleanField) and not isinstance(value, bool):
        return A_BOOLEAN
    if isinstance(field, serializers.CharField | serializers.ChoiceField) and not isinstance(
        value, str
    ):
        return A_STRING
    return None


class StrictSerializer(serializers.Serializer):
    """Rejects unknown fields, so a typo ('delay_second') is not silently ignored,
    and a value of another JSON type than its field's (a number for a string, a
    string for a boolean). A query string's values are all strings: its
    serializers declare none but strings, integers (read from their text) and
    choices."""

    def to_internal_value(self, data):
        if not isinstance(data, dict):
            raise serializers.ValidationError(
                {"non_field_errors": ["Expected a JSON object."]}, code="invalid"
            )
        unknown = sorted(set(data) - set(self.fields))
        if unknown:
            raise serializers.ValidationError({name: ["Unknown field."] for name in unknown})
        wrong = {
            name: [reason]
            for name, value in data.items()
            if (reason := _wrong_json_type(self.fields[name], value))
        }
        if wrong:
            raise serializers.ValidationError(wrong)
        return super().to_internal_value(data)


def _validate_metadata(value):
    if len(json.dumps(value)) > METADATA_MAX_BYTES:
        raise serializers.ValidationError(f"At most {METADATA_MAX_BYTES} bytes of JSON.")
    return value


class ScheduleInput(StrictSerializer):
    from_account_id = StrictIntegerField(min_value=1, max_value=2**63 - 1)
    to_account_id = StrictIntegerField(min_value=1, max_value=2**63 - 1)
    amount = StrictIntegerField(min_value=1, max_value=2**63 - 1)
    delay_seconds = DelaySecondsField(required=False)
    scheduled_time = AwareDateTimeField(required=False)
    description = serializers.CharField(
        required=False, allow_blank=True, max_length=255, default=""
    )
    metadata = serializers.DictField(required=False, default=dict, validators=[_validate_metadata])

    def validate(self, attrs):
        if ("delay_seconds" in attrs) == ("scheduled_time" in attrs):
            raise serializers.ValidationError({"delay_seconds": [ONE_OF_DELAY_OR_TIME]})
        return attrs


class UpdateInput(StrictSerializer):
    delay_seconds = DelaySecondsField(required=False)
    scheduled_time = AwareDateTimeField(required=False)
    amount = StrictIntegerField(required=False, min_value=1, max_value=2**63 - 1)
    description = serializers.CharField(required=False, allow_blank=True, max_length=255)

    def validate(self, attrs):
        if "delay_seconds" in attrs and "scheduled_time" in attrs:
            raise serializers.ValidationError(
                {"delay_seconds": ["Give at most one of delay_seconds or scheduled_time."]}
            )
        if not attrs:
            raise serializers.ValidationError(
                {"non_field_errors": ["Give delay_seconds, scheduled_time, amount or description."]}
            )
        return attrs


class CancelInput(StrictSerializer):
    reason = serializers.CharField(required=False, allow_blank=True, max_length=255, default="")


class ListQuery(StrictSerializer):
    account_id = serializers.IntegerField(required=False, min_value=1, max_value=2**63 - 1)
    status = serializers.ChoiceField(required=False, choices=PaymentStatus.values)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=20)
    cursor = serializers.CharField(required=False, max_length=200)


class StatementQuery(StrictSerializer):
    limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=20)
    cursor = serializers.CharField(required=False, max_length=200)


class LogQuery(StrictSerializer):
    """A page of a log (a payment's events, an endpoint's deliveries): 100 by default."""

    limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=100)
    cursor = serializers.CharField(required=False, max_length=200)


class PaymentOutput(serializers.Serializer):
    payment_id = serializers.UUIDField(source="id")
    from_account_id = serializers.IntegerField()
    to_account_id = serializers.IntegerField()
    amount = serializers.IntegerField()
    description = serializers.CharField()
    metadata = serializers.DictField()
    scheduled_time = serializers.DateTimeField(source="due_at")
    status = serializers.ChoiceField(choices=PaymentStatus.values)
    created_at = serializers.DateTimeField()
    updated_at = serializers.DateTimeField()
    executed_at = serializers.DateTimeField(allow_null=True)
    cancelled_at = serializers.DateTimeField(allow_null=True)
    error_code = serializers.CharField(allow_null=True)
    error_message = serializers.CharField(allow_null=True)
    attempts = serializers.IntegerField()

    def to_representation(self, instance):
        data = super().to_representation(instance)
        data["error_code"] = data["error_code"] or None
        data["error_message"] = data["error_message"] or None
        return data


_TIMESTAMP = serializers.DateTimeField()  # how PaymentOutput's date-times render


def _timestamp(value):
    return None if value is None else _TIMESTAMP.to_representation(value)


def payment_data(payment) -> dict:
    """``PaymentOutput(payment).data``, built directly: the same keys in the same order and
    the same values, so the same JSON.

    Every payment the API returns goes through here (schedule and the status read
    are the hot calls). ``PaymentOutput`` stays the declared shape (the OpenAPI
    schema); a serializer instance deep-copies its 15 fields before rendering
    one payment, about a tenth of a millisecond. A test renders payments of
    every shape both ways and compares the JSON.
    """
    metadata = payment.metadata
    return {
        "payment_id": str(payment.id),
        "from_account_id": payment.from_account_id,
        "to_account_id": payment.to_account_id,
        "amount": payment.amount,
        "description": str(payment.description),
        "metadata": None if metadata is None else {str(k): v for k, v in metadata.items()},
        "scheduled_time": _timestamp(payment.due_at),
        "status": str(payment.status),
        "created_at": _timestamp(payment.created_at),
        "updated_at": _timestamp(payment.updated_at),
        "executed_at": _timestamp(payment.executed_at),
        "cancelled_at": _timestamp(payment.cancelled_at),
        "error_code": payment.error_code or None,
        "error_message": payment.error_message or None,
        "attempts": payment.attempts,
    }


class PaymentListOutput(serializers.Serializer):
    payments = PaymentOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)


class CancelOutput(serializers.Serializer):
    success = serializers.BooleanField()
    status = serializers.ChoiceField(choices=PaymentStatus.values)
    payment = PaymentOutput()


# Kept in the database and shown to staff, never to clients: which host and
# process ran an attempt (``executor.worker_name``) and the operator's id of an
# execute-now trigger are the service's inside.
INTERNAL_EVENT_DATA = frozenset({"worker", "execution_id"})


class ClientEventData(serializers.DictField):
    def to_representation(self, value):
        shown = {k: v for k, v in value.items() if k not in INTERNAL_EVENT_DATA}
        return super().to_representation(shown)


class EventOutput(serializers.Serializer):
    event_id = serializers.IntegerField(source="id")
    type = serializers.ChoiceField(choices=PAYMENT_EVENT_TYPES)
    from_status = serializers.ChoiceField(
        choices=PaymentStatus.choices, allow_blank=True, help_text="Empty on the first event."
    )
    to_status = serializers.ChoiceField(choices=PaymentStatus.choices)
    actor = serializers.ChoiceField(choices=Actor.choices)
    fence = serializers.IntegerField(allow_null=True)
    data = ClientEventData()
    created_at = serializers.DateTimeField()


class AttemptOutput(serializers.Serializer):
    number = serializers.IntegerField()
    fence = serializers.IntegerField()
    started_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    outcome = serializers.ChoiceField(choices=AttemptOutcome.choices)
    error_code = serializers.CharField()
    error_message = serializers.CharField()


class EventListOutput(serializers.Serializer):
    events = EventOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)


class AttemptListOutput(serializers.Serializer):
    attempts = AttemptOutput(many=True)


class AccountOutput(serializers.Serializer):
    account_id = serializers.IntegerField(source="id")
    name = serializers.CharField()
    status = serializers.ChoiceField(choices=AccountStatus.choices)
    balance = serializers.IntegerField()
    held = serializers.IntegerField()
    available = serializers.IntegerField()
    max_payment_amount = serializers.IntegerField()
    created_at = serializers.DateTimeField()


class AccountListOutput(serializers.Serializer):
    accounts = AccountOutput(many=True)


class StatementLineOutput(serializers.Serializer):
    posting_id = serializers.IntegerField(source="id")
    entry_id = serializers.IntegerField()
    kind = serializers.ChoiceField(source="entry.kind", choices=EntryKind.choices)
    reference = serializers.CharField(source="entry.reference", allow_null=True)
    description = serializers.CharField(source="entry.description")
    amount = serializers.IntegerField()
    balance_after = serializers.IntegerField()
    created_at = serializers.DateTimeField(source="entry.created_at")


class StatementOutput(serializers.Serializer):
    account = AccountOutput()
    transactions = StatementLineOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)


# --- recurring payments -------------------------------------------------------


class DstPolicy(StrictSerializer):
    nonexistent = serializers.ChoiceField(choices=NONEXISTENT_POLICIES, default="shift")
    ambiguous = serializers.ChoiceField(choices=AMBIGUOUS_POLICIES, default="first")


class DstPolicyChange(StrictSerializer):
    """PATCH: only the keys sent change (no defaults: ``{"ambiguous": "last"}``
    must not reset ``nonexistent`` to ``shift``)."""

    nonexistent = serializers.ChoiceField(choices=NONEXISTENT_POLICIES, required=False)
    ambiguous = serializers.ChoiceField(choices=AMBIGUOUS_POLICIES, required=False)


class DstPolicyOutput(serializers.Serializer):
    nonexistent = serializers.ChoiceField(source="dst_nonexistent", choices=NONEXISTENT_POLICIES)
    ambiguous = serializers.ChoiceField(source="dst_ambiguous", choices=AMBIGUOUS_POLICIES)


class RecurringInput(StrictSerializer):
    from_account_id = StrictIntegerField(min_value=1, max_value=2**63 - 1)
    to_account_id = StrictIntegerField(min_value=1, max_value=2**63 - 1)
    amount = StrictIntegerField(min_value=1, max_value=2**63 - 1)
    description = serializers.CharField(
        required=False, allow_blank=True, max_length=255, default=""
    )
    cron = serializers.CharField(required=False, max_length=100)
    interval_seconds = StrictIntegerField(required=False, min_value=60, max_value=366 * 86400)
    timezone = serializers.CharField(required=False, max_length=64, default="UTC")
    start_time = AwareDateTimeField(required=False)
    end_time = AwareDateTimeField(required=False)
    max_occurrences = StrictIntegerField(required=False, min_value=1, max_value=1_000_000)
    jitter_seconds = StrictIntegerField(required=False, min_value=0, max_value=3600, default=0)
    dst_policy = DstPolicy(required=False)
    missed_run_policy = serializers.ChoiceField(
        choices=MISSED_RUN_POLICIES, required=False, default="skip"
    )
    max_catch_up = StrictIntegerField(required=False, min_value=1, max_value=1000, default=10)
    max_consecutive_failures = StrictIntegerField(
        required=False, min_value=1, max_value=100, default=3
    )

    def validate(self, attrs):
        if ("cron" in attrs) == ("interval_seconds" in attrs):
            raise serializers.ValidationError({"cron": [ONE_OF_CRON_OR_INTERVAL]})
        return attrs


class RecurringUpdateInput(StrictSerializer):
    amount = StrictIntegerField(required=False, min_value=1, max_value=2**63 - 1)
    description = serializers.CharField(required=False, allow_blank=True, max_length=255)
    end_time = AwareDateTimeField(required=False, allow_null=True)
    max_occurrences = StrictIntegerField(
        required=False, allow_null=True, min_value=1, max_value=1_000_000
    )
    jitter_seconds = StrictIntegerField(required=False, min_value=0, max_value=3600)
    dst_policy = DstPolicyChange(required=False)
    missed_run_policy = serializers.ChoiceField(choices=MISSED_RUN_POLICIES, required=False)
    max_catch_up = StrictIntegerField(required=False, min_value=1, max_value=1000)
    max_consecutive_failures = StrictIntegerField(required=False, min_value=1, max_value=100)

    def validate(self, attrs):
        if not attrs:
            raise serializers.ValidationError({"non_field_errors": ["Nothing to change."]})
        return attrs


class RecurringOutput(serializers.Serializer):
    recurring_payment_id = serializers.UUIDField(source="id")
    from_account_id = serializers.IntegerField()
    to_account_id = serializers.IntegerField()
    amount = serializers.IntegerField()
    description = serializers.CharField()
    cron = serializers.CharField(allow_null=True)
    interval_seconds = serializers.IntegerField(allow_null=True)
    timezone = serializers.CharField()
    start_time = serializers.DateTimeField()
    end_time = serializers.DateTimeField(allow_null=True)
    max_occurrences = serializers.IntegerField(allow_null=True)
    jitter_seconds = serializers.IntegerField()
    dst_policy = DstPolicyOutput(source="*")
    missed_run_policy = serializers.ChoiceField(choices=MISSED_RUN_POLICIES)
    max_catch_up = serializers.IntegerField()
    max_consecutive_failures = serializers.IntegerField()
    status = serializers.ChoiceField(choices=RecurringStatus.choices)
    status_reason = serializers.CharField()
    next_run_at = serializers.DateTimeField(allow_null=True)
    upcoming = serializers.SerializerMethodField()
    occurrences_run = serializers.IntegerField()
    consecutive_failures = serializers.IntegerField()
    created_at = serializers.DateTimeField()

    def get_upcoming(self, obj) -> list[str]:
        field = serializers.DateTimeField()
        try:
            return [field.to_representation(t) for t in planned(obj)]
        except InvalidSchedule:  # a schedule parked for bad data still reads
            return []

    def to_representation(self, instance):
        data = super().to_representation(instance)
        data["cron"] = data["cron"] or None
        return data


class RecurringListOutput(serializers.Serializer):
    recurring_payments = RecurringOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)


class OccurrenceOutput(serializers.Serializer):
    scheduled_for = serializers.DateTimeField()
    status = serializers.ChoiceField(
        source="outcome",
        choices=OCCURRENCE_OUTCOMES,
        help_text="scheduled until its payment runs, then completed / failed / cancelled; "
        "failed without a payment when it could not be funded; skipped when missed.",
    )
    reason = serializers.CharField()
    payment_id = serializers.UUIDField(allow_null=True)
    # read_only: every response carries it (null before a payment exists), so
    # the schema lists it as required, as it does the others
    payment_status = serializers.ChoiceField(
        source="payment.status",
        choices=PaymentStatus.choices,
        allow_null=True,
        default=None,
        read_only=True,
    )


class OccurrenceListOutput(serializers.Serializer):
    next_run_at = serializers.DateTimeField(allow_null=True)
    upcoming = serializers.ListField(child=serializers.DateTimeField())
    occurrences = OccurrenceOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)


class RecurringListQuery(StrictSerializer):
    status = serializers.ChoiceField(required=False, choices=RecurringStatus.choices)
    limit = serializers.IntegerField(required=False, min_value=1, max_value=100, default=20)
    cursor = serializers.CharField(required=False, max_length=200)


# --- webhooks -------------------------------------------------------------------


def event_types_field(**kwargs) -> serializers.ListField:
    return serializers.ListField(
        child=serializers.ChoiceField(choices=EVENT_TYPES), min_length=1, max_length=10, **kwargs
    )


class WebhookEndpointInput(StrictSerializer):
    url = serializers.URLField(max_length=500)
    event_types = event_types_field()


class WebhookEndpointUpdateInput(StrictSerializer):
    url = serializers.URLField(required=False, max_length=500)
    event_types = event_types_field(required=False)
    is_active = serializers.BooleanField(required=False)


class WebhookEndpointOutput(serializers.Serializer):
    webhook_endpoint_id = serializers.UUIDField(source="id")
    url = serializers.URLField()
    event_types = serializers.ListField(child=serializers.ChoiceField(choices=EVENT_TYPES))
    is_active = serializers.BooleanField()
    created_at = serializers.DateTimeField()


class WebhookEndpointCreatedOutput(WebhookEndpointOutput):
    secret = serializers.CharField(
        allow_null=True,
        help_text="The signing secret, in this response only: verify signatures with it. "
        "It is stored encrypted and never shown again: null when this response is "
        "replayed for the same Idempotency-Key.",
    )
    secret_shown_once = serializers.BooleanField(
        default=False,
        read_only=True,  # in every response: required in the schema
        help_text="true in a replayed response: the secret was shown in the original "
        "response only and is null here.",
    )


class WebhookEndpointListOutput(serializers.Serializer):
    webhook_endpoints = WebhookEndpointOutput(many=True)


class WebhookDeliveryOutput(serializers.Serializer):
    delivery_id = serializers.UUIDField(source="id")
    event_type = serializers.ChoiceField(choices=EVENT_TYPES)
    status = serializers.ChoiceField(choices=DeliveryStatus.choices)
    attempts = serializers.IntegerField()
    last_status_code = serializers.IntegerField(allow_null=True)
    last_error = serializers.CharField(
        help_text="Empty, or a generic class: timeout, connection_failed, tls_error, "
        "address_not_allowed (the host did not resolve to an allowed public address), "
        "redirect_not_followed, invalid_response, http_<status>, endpoint_disabled, "
        "circuit_open (waiting for the endpoint's circuit breaker), client_busy (waiting "
        "in line: your other deliveries' requests use your share), secret_unavailable."
    )
    created_at = serializers.DateTimeField()
    delivered_at = serializers.DateTimeField(allow_null=True)
    payload = serializers.DictField()


class WebhookDeliveryListOutput(serializers.Serializer):
    deliveries = WebhookDeliveryOutput(many=True)
    next_cursor = serializers.CharField(allow_null=True)
