"""One error shape everywhere: ``{"error": {"code", "message", "details"}}``.

Domain exceptions carry a stable ``code``; this module maps each code to an
HTTP status once. A database that is unavailable or saturated is a 503
``service_unavailable`` with ``Retry-After`` (the client retries and
succeeds), on every path. Anything else unexpected is logged and answered with
a JSON 500 that leaks nothing.
"""

from __future__ import annotations

import logging
import sys

from django.conf import settings
from django.core.exceptions import PermissionDenied, RequestDataTooBig, SuspiciousOperation
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpResponse, JsonResponse
from django.views.defaults import bad_request, page_not_found, permission_denied, server_error
from rest_framework import exceptions, status
from rest_framework.response import Response

from scheduler_project.errors import DomainError

logger = logging.getLogger(__name__)

# Every code the API can answer with, and its HTTP status: the single source
# for the exception handler, the OpenAPI schema's ``ErrorCode`` enum
# (payments.api.schema) and the errors table in the README (a test compares
# them). A domain error whose code is not here is a bug, answered as a 500.
ERROR_CODES: dict[str, int] = {
    "validation_error": 400,
    "parse_error": 400,
    "not_authenticated": 401,
    "authentication_failed": 401,
    "permission_denied": 403,
    "not_found": 404,
    "method_not_allowed": 405,
    "not_acceptable": 406,
    "payment_not_cancellable": 409,
    "payment_not_modifiable": 409,
    "payment_not_due": 409,
    "recurring_not_modifiable": 409,
    "idempotency_key_in_use": 409,
    "length_required": 411,
    "payload_too_large": 413,
    "unsupported_media_type": 415,
    "account_not_found": 422,
    "account_not_active": 422,
    "insufficient_funds": 422,
    "limit_exceeded": 422,
    "idempotency_key_reused": 422,
    "throttled": 429,
    "internal_error": 500,
    "service_unavailable": 503,
}

DRF_CODES = {
    exceptions.ParseError: "parse_error",
    exceptions.AuthenticationFailed: "authentication_failed",
    exceptions.NotAuthenticated: "not_authenticated",
    exceptions.PermissionDenied: "permission_denied",
    exceptions.NotFound: "not_found",
    exceptions.MethodNotAllowed: "method_not_allowed",
    exceptions.NotAcceptable: "not_acceptable",
    exceptions.UnsupportedMediaType: "unsupported_media_type",
    exceptions.Throttled: "throttled",
}

JSON_MEDIA_TYPE = "application/json"
NOT_AUTHENTICATED_MESSAGE = (
    "Authentication credentials were not provided: send Authorization: Bearer <token>."
)
UNSUPPORTED_MEDIA_TYPE_MESSAGE = (
    'Unsupported media type "{given}": send the body as JSON with '
    f"Content-Type: {JSON_MEDIA_TYPE}."
)
INTERNAL_ERROR_MESSAGE = "Internal error; it has been logged."


# What Django raises (wrapping psycopg) when it cannot get or keep a
# connection: server down or restarting, "too many clients", a pool with every
# connection busy past DB_POOL_TIMEOUT (psycopg_pool.PoolTimeout), a dropped
# connection, and transient refusals such as a deadlock or serialization
# failure. Each is worth retrying; none is the client's fault or a bug.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)

UNAVAILABLE_MESSAGE = "The service is temporarily unavailable; retry after the given delay."
TOO_LARGE_MESSAGE = "The request body is larger than {limit} bytes."
LENGTH_REQUIRED_MESSAGE = (
    "Send the request body with a Content-Length header: a chunked body is not read."
)


def is_api_path(path: str) -> bool:
    """``/api`` and everything under it: answered in the JSON error shape."""
    return path == "/api" or path.startswith("/api/")


def error_body(code: str, message: str, details: dict | None = None) -> dict:
    return {"error": {"code": code, "message": message, "details": details or {}}}


def unavailable_body() -> tuple[dict, dict]:
    """The 503 ``service_unavailable`` body and its ``Retry-After`` header."""
    retry_after = settings.SERVICE_UNAVAILABLE_RETRY_AFTER
    body = error_body(
        "service_unavailable", UNAVAILABLE_MESSAGE, {"retry_after_seconds": retry_after}
    )
    return body, {"Retry-After": str(retry_after)}


def too_large_body(limit: int) -> dict:
    return error_body(
        "payload_too_large", TOO_LARGE_MESSAGE.format(limit=limit), {"max_bytes": limit}
    )


def service_unavailable(request, exc: BaseException) -> HttpResponse:
    """503 + Retry-After outside DRF: the error shape under /api/, plain text elsewhere."""
    logger.warning("database unavailable: %s %s: %r", request.method, request.path, exc)
    body, headers = unavailable_body()
    if is_api_path(request.path):
        return JsonResponse(body, status=503, headers=headers)
    return HttpResponse(
        "503 Service Unavailable: the database is unavailable; retry later.\n",
        status=503,
        content_type="text/plain; charset=utf-8",
        headers=headers,
    )


def payload_too_large() -> JsonResponse:
    """413 for an API body over ``API_MAX_BODY_BYTES`` (payments.middleware)."""
    return JsonResponse(too_large_body(settings.API_MAX_BODY_BYTES), status=413)


def length_required() -> JsonResponse:
    """411 for an API body sent without a Content-Length (payments.middleware)."""
    # No ``Connection: close`` (a hop-by-hop header: wsgiref, under runserver,
    # refuses it from an application). gunicorn discards the unread body itself;
    # runserver reads it as the next request on the connection, which fails 400.
    return JsonResponse(error_body("length_required", LENGTH_REQUIRED_MESSAGE), status=411)


def _field_errors(detail) -> dict:
    if isinstance(detail, dict):
        return {
            k: _field_errors(v) if isinstance(v, dict) else _messages(v) for k, v in detail.items()
        }
    return {"non_field_errors": _messages(detail)}


def _messages(value) -> list[str]:
    if isinstance(value, list | tuple):
        return [str(v) for v in value]
    return [str(value)]


def _first_message(fields: dict, prefix: str = "") -> str:
    for name, value in fields.items():
        if isinstance(value, dict):
            return _first_message(value, f"{prefix}{name}.")
        if value:
            label = "" if name == "non_field_errors" else f"{prefix}{name}: "
            return f"{label}{value[0]}"
    return "Invalid request."


def _internal_error(context) -> Response:
    logger.exception("Unhandled API error", extra={"view": type(context.get("view")).__name__})
    return Response(
        error_body("internal_error", INTERNAL_ERROR_MESSAGE),
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )


def _throttle_wait(exc: exceptions.Throttled) -> float:
    """Seconds until the next request is allowed. DRF has no estimate when more
    requests than the rate slipped in together (processes racing on the shared
    cache); a 429 still says when to retry (the schema declares Retry-After)."""
    return exc.wait if exc.wait is not None else 1.0


def _api_exception_message(exc: exceptions.APIException, context) -> tuple[str, dict]:
    """The message and details of a DRF exception: DRF's own text, with a hint where
    DRF's does not say what to send instead."""
    if isinstance(exc, exceptions.NotAuthenticated):
        return NOT_AUTHENTICATED_MESSAGE, {}
    if isinstance(exc, exceptions.UnsupportedMediaType):
        request = context.get("request")
        given = getattr(request, "content_type", "") or ""
        return UNSUPPORTED_MEDIA_TYPE_MESSAGE.format(given=given), {
            "supported_media_types": [JSON_MEDIA_TYPE]
        }
    if isinstance(exc, exceptions.Throttled):
        return str(exc.detail), {"retry_after_seconds": _throttle_wait(exc)}
    return str(exc.detail), {}


def exception_handler(exc, context):
    if isinstance(exc, DomainError):
        if exc.code not in ERROR_CODES:
            # A rule the API should have checked before reaching the service.
            return _internal_error(context)
        details = dict(exc.details)
        if "fields" in details:
            details["fields"] = {k: _messages(v) for k, v in details["fields"].items()}
        return Response(error_body(exc.code, exc.message, details), status=ERROR_CODES[exc.code])
    if isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, PermissionDenied):
        exc = exceptions.PermissionDenied()
    if isinstance(exc, exceptions.ValidationError):
        fields = _field_errors(exc.detail)
        return Response(
            error_body("validation_error", _first_message(fields), {"fields": fields}),
            status=status.HTTP_400_BAD_REQUEST,
        )
    if isinstance(exc, exceptions.APIException):
        code = next((c for cls, c in DRF_CODES.items() if isinstance(exc, cls)), None)
        if code is None:
            return _internal_error(context)
        message, details = _api_exception_message(exc, context)
        headers = {}
        if isinstance(exc, exceptions.Throttled):
            headers["Retry-After"] = str(int(_throttle_wait(exc)) + 1)
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        return Response(error_body(code, message, details), status=exc.status_code, headers=headers)
    if isinstance(exc, DATABASE_UNAVAILABLE):
        logger.warning("database unavailable: %r", exc)
        body, headers = unavailable_body()
        return Response(body, status=status.HTTP_503_SERVICE_UNAVAILABLE, headers=headers)
    if isinstance(exc, RequestDataTooBig):  # Django's own limit, reached reading the body
        return Response(
            too_large_body(settings.DATA_UPLOAD_MAX_MEMORY_SIZE),
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    if isinstance(exc, SuspiciousOperation):
        # Django refusing the request itself, read inside the view: more than
        # DATA_UPLOAD_MAX_NUMBER_FIELDS fields in the query string (DRF reads it
        # for ``?format=`` before authentication) — a 400, as Django gives outside DRF.
        return Response(
            error_body("validation_error", "Bad request."), status=status.HTTP_400_BAD_REQUEST
        )
    return _internal_error(context)


def json_400(request, exception=None):
    """Django-level 400 (a request refused before any view: a Host not in
    ALLOWED_HOSTS, another SuspiciousOperation): JSON under /api/."""
    if is_api_path(request.path):
        return JsonResponse(error_body("validation_error", "Bad request."), status=400)
    return bad_request(request, exception)


def json_403(request, exception=None):
    """Django-level 403 (raised outside DRF, e.g. by a middleware): JSON under /api/."""
    if is_api_path(request.path):
        return JsonResponse(error_body("permission_denied", "Permission denied."), status=403)
    return permission_denied(request, exception)


def json_404(request, exception=None):
    """Django-level 404 (no route matched): JSON under /api/, the usual page elsewhere."""
    if is_api_path(request.path):
        return JsonResponse(error_body("not_found", "Not found."), status=404)
    return page_not_found(request, exception)


def json_500(request):
    """Django-level 500. Called while the exception is being handled, so a database
    outage raised outside any view (a middleware saving the session, …) is still a 503."""
    exc = sys.exc_info()[1]
    if isinstance(exc, DATABASE_UNAVAILABLE):
        return service_unavailable(request, exc)
    if is_api_path(request.path):
        return JsonResponse(error_body("internal_error", INTERNAL_ERROR_MESSAGE), status=500)
    return server_error(request)
