"""The OpenAPI description of what an operation answers besides its success body.

Every view method is declared with ``api_operation``: an explicit operation
id, the success response, and the error statuses it can answer with. Each
error response is the one ``ErrorResponse`` component (``code`` an enum of
``errors.ERROR_CODES``) and says which codes that status carries. What all
operations of a kind share is added here, once, not at each view:

- bearer-authenticated: 401 ``not_authenticated`` / ``authentication_failed``;
- every operation: 411 ``length_required`` and 413 ``payload_too_large`` (the body
  limit), 429 ``throttled`` and 503 ``service_unavailable``, both with
  ``Retry-After``;
- a JSON request body: 400 ``validation_error`` / ``parse_error``, 413
  ``payload_too_large``, 415 ``unsupported_media_type``;
- ``Idempotency-Key`` honoured (``views.idempotent``): the header, 400 for a
  bad key, 409 ``idempotency_key_in_use``, 422 ``idempotency_key_reused``, and
  ``Idempotent-Replayed`` on the responses a replay can repeat.

``tests/payments/test_schema.py`` checks the generated schema against these
rules, so the description cannot drift from the code unnoticed.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from drf_spectacular.utils import (
    OpenApiParameter,
    OpenApiResponse,
    extend_schema,
    extend_schema_serializer,
)
from rest_framework import serializers

from .errors import ERROR_CODES


@extend_schema_serializer(component_name="Error")
class ErrorDetailOutput(serializers.Serializer):
    code = serializers.ChoiceField(
        choices=list(ERROR_CODES), help_text="Stable, machine-readable; see the README's table."
    )
    message = serializers.CharField(help_text="For people; may change between versions.")
    details = serializers.DictField(
        help_text="Depends on the code, e.g. fields (validation_error: field name to list of "
        "messages), status (409 conflicts), limit, max_bytes, retry_after_seconds."
    )


class ErrorResponse(serializers.Serializer):
    """``{"error": {"code", "message", "details"}}``: every error, on every path."""

    error = ErrorDetailOutput()


IDEMPOTENCY_KEY = OpenApiParameter(
    "Idempotency-Key",
    # the server's own rule (views.idempotent): printable ASCII, space to tilde
    {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[ -~]{1,255}$"},
    OpenApiParameter.HEADER,
    description="Retry-safe key (1 to 255 printable ASCII characters), kept 24 h, scoped to "
    "the client: the same key with the same request replays the first response.",
)


def _retry_after(statuses: Iterable[int]) -> OpenApiParameter:
    return OpenApiParameter(
        "Retry-After",
        {"type": "integer", "minimum": 0},
        OpenApiParameter.HEADER,
        response=sorted(statuses),
        required=True,
        description="Seconds to wait before retrying.",
    )


def _idempotent_replayed(statuses: Iterable[int]) -> OpenApiParameter:
    return OpenApiParameter(
        "Idempotent-Replayed",
        {"type": "string", "enum": ["true"]},
        OpenApiParameter.HEADER,
        response=sorted(statuses),
        description="Present (true) when this is the stored response to an earlier request "
        "with the same Idempotency-Key, replayed.",
    )


BEARER_ERRORS = {401: ("not_authenticated", "authentication_failed")}
# 411, 413: ApiBodyLimitMiddleware judges every API request by its Content-Length,
# a GET's too, before anything else (payments/middleware.py).
COMMON_ERRORS = {
    411: ("length_required",),
    413: ("payload_too_large",),
    429: ("throttled",),
    503: ("service_unavailable",),
}
BODY_ERRORS = {
    400: ("validation_error", "parse_error"),
    413: ("payload_too_large",),
    415: ("unsupported_media_type",),
}
# views.idempotent checks the key (400) and reads a JSON body to fingerprint it.
IDEMPOTENCY_ERRORS = {
    400: ("validation_error", "parse_error"),
    409: ("idempotency_key_in_use",),
    422: ("idempotency_key_reused",),
}
# A replay repeats a stored success or business refusal; never 401, 411, 413, 415, 429, 503.
NOT_REPLAYED = {401, 411, 413, 415, 429, 503}


def error_response(codes: Iterable[str]) -> OpenApiResponse:
    codes = list(dict.fromkeys(codes))
    return OpenApiResponse(
        response=ErrorResponse,
        description="Error codes: " + ", ".join(f"`{code}`" for code in codes) + ".",
    )


def _merge(*tables: Mapping[int, Iterable[str]]) -> dict[int, list[str]]:
    merged: dict[int, list[str]] = {}
    for table in tables:
        for http_status, codes in table.items():
            known = merged.setdefault(http_status, [])
            known += [code for code in codes if code not in known]
    return dict(sorted(merged.items()))


def api_operation(
    *,
    operation_id: str,
    summary: str,
    responses: Mapping[int, object],
    errors: Mapping[int, Iterable[str]] | None = None,
    request: object = None,
    idempotent: bool = False,
    bearer: bool = True,
    parameters: Iterable[object] = (),
    description: str | None = None,
    **kwargs,
):
    """``extend_schema`` for one view method; see the module docstring."""
    tables = [errors or {}, COMMON_ERRORS]
    if bearer:
        tables.append(BEARER_ERRORS)
    if request is not None:
        tables.append(BODY_ERRORS)
    if idempotent:
        tables.append(IDEMPOTENCY_ERRORS)
    error_codes = _merge(*tables)
    for http_status, codes in error_codes.items():
        for code in codes:
            if ERROR_CODES.get(code) != http_status:
                raise AssertionError(f"{operation_id}: {code} is not a {http_status}")
    all_responses = {**responses, **{s: error_response(c) for s, c in error_codes.items()}}
    headers = [_retry_after(s for s in error_codes if s in (429, 503))]
    if idempotent:
        headers += [
            IDEMPOTENCY_KEY,
            _idempotent_replayed(s for s in all_responses if s not in NOT_REPLAYED),
        ]
    return extend_schema(
        operation_id=operation_id,
        summary=summary,
        description=description,
        request=request,
        responses=all_responses,
        parameters=[*parameters, *headers],
        **kwargs,
    )


def query_may_be_empty(result, generator, request, public):
    """drf-spectacular postprocessing hook: every query parameter declares
    ``allowEmptyValue``, as the server treats one given empty (``?status=``, as
    an HTML form or a URL template sends it) like one left out
    (``views.parse_query``); the schema said ``minLength: 1`` alone, and a
    schema-checking client read the accepted empty value as a violation."""
    for path in result.get("paths", {}).values():
        for operation in path.values():
            for parameter in operation.get("parameters", []) if isinstance(operation, dict) else []:
                if parameter.get("in") == "query":
                    parameter["allowEmptyValue"] = True
    return result
