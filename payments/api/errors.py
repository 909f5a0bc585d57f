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
from django.core.exceptions import PermissionDenied, RequestDataTooBig
from django.db import InterfaceError, OperationalError
from django.http import Http404, HttpResponse, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response

from ledger.exceptions import LedgerError

logger = logging.getLogger(__name__)

STATUS_BY_CODE = {
    "validation_error": 400,
    "invalid_amount": 400,
    "same_account": 400,
    "not_found": 404,
    "account_not_found": 422,
    "account_not_active": 422,
    "insufficient_funds": 422,
    "payment_not_cancellable": 409,
    "payment_not_modifiable": 409,
    "payment_not_due": 409,
    "recurring_not_modifiable": 409,
    "idempotency_key_in_use": 409,
    "idempotency_key_reused": 422,
    "limit_exceeded": 422,
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


# What Django raises (wrapping psycopg) when it cannot get or keep a
# connection: server down or restarting, "too many clients", a pool with every
# connection busy past DB_POOL_TIMEOUT (psycopg_pool.PoolTimeout), a dropped
# connection, and transient refusals such as a deadlock or serialization
# failure. Each is worth retrying; none is the client's fault or a bug.
DATABASE_UNAVAILABLE = (OperationalError, InterfaceError)

UNAVAILABLE_MESSAGE = "The service is temporarily unavailable; retry after the given delay."
TOO_LARGE_MESSAGE = "The request body is larger than {limit} bytes."


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
    if request.path.startswith("/api/"):
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


def exception_handler(exc, context):
    headers = {}
    if isinstance(exc, LedgerError):
        details = dict(exc.details)
        if "fields" in details:
            details["fields"] = {k: _messages(v) for k, v in details["fields"].items()}
        http_status = STATUS_BY_CODE.get(exc.code, 422)
        return Response(error_body(exc.code, exc.message, details), status=http_status)
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
        details = {}
        if isinstance(exc, exceptions.Throttled) and exc.wait is not None:
            details["retry_after_seconds"] = exc.wait
            headers["Retry-After"] = str(int(exc.wait) + 1)
        if getattr(exc, "auth_header", None):
            headers["WWW-Authenticate"] = exc.auth_header
        code = next((c for cls, c in DRF_CODES.items() if isinstance(exc, cls)), "error")
        return Response(
            error_body(code, str(exc.detail), details), status=exc.status_code, headers=headers
        )
    if isinstance(exc, DATABASE_UNAVAILABLE):
        logger.warning("database unavailable: %r", exc)
        body, headers = unavailable_body()
        return Response(body, status=status.HTTP_503_SERVICE_UNAVAILABLE, headers=headers)
    if isinstance(exc, RequestDataTooBig):  # Django's own limit, reached reading the body
        return Response(
            too_large_body(settings.DATA_UPLOAD_MAX_MEMORY_SIZE),
            status=status.HTTP_413_REQUEST_ENTITY_TOO_LARGE,
        )
    logger.exception("Unhandled API error", extra={"view": type(context.get("view")).__name__})
    return Response(
        error_body("internal_error", "Internal error; it has been logged."),
        status=status.HTTP_500_INTERNAL_SERVER_ERROR,
    )


def json_404(request, exception=None):
    """Django-level 404 (no route matched): JSON under /api/, the usual page elsewhere."""
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("not_found", "Not found."), status=404)
    from django.views.defaults import page_not_found

    return page_not_found(request, exception)


def json_500(request):
    """Django-level 500. Called while the exception is being handled, so a database
    outage raised outside any view (a middleware saving the session, …) is still a 503."""
    exc = sys.exc_info()[1]
    if isinstance(exc, DATABASE_UNAVAILABLE):
        return service_unavailable(request, exc)
    if request.path.startswith("/api/"):
        return JsonResponse(
            error_body("internal_error", "Internal error; it has been logged."), status=500
        )
    from django.views.defaults import server_error

    return server_error(request)
