"""Web-tier guards that answer before, or instead of, a view (errors: payments.api.errors)."""

from __future__ import annotations

import logging
import time

from django.conf import settings
from django.http import JsonResponse

from . import metrics
from .api.errors import (
    DATABASE_UNAVAILABLE,
    error_body,
    is_api_path,
    length_required,
    payload_too_large,
    service_unavailable,
)

# Django-level refusals that reach an API client as an HTML page: a path no route
# matches (404) or a request refused before any view (400: a Host outside
# ALLOWED_HOSTS; 403). With DEBUG off the handlers in payments.api.errors answer
# JSON; with DEBUG on (scripts/dev) Django renders its technical pages instead.
_HTML_REFUSALS = {
    400: ("validation_error", "Bad request."),
    403: ("permission_denied", "Permission denied."),
    404: ("not_found", "Not found."),
}


logger = logging.getLogger(__name__)

_METHODS = frozenset(
    ("GET", "HEAD", "POST", "PUT", "DELETE", "TRACE", "OPTIONS", "CONNECT", "PATCH")
)
_UNNAMED_VIEW = "<unnamed view>"


class HttpMetricsMiddleware:
    """Counts requests and responses and times them, by view and method (outermost).

    Exports the three request series of django-prometheus that answer "how
    many, how fast, which status, where" under their names and labels
    (``payments.metrics``: ``django_http_requests_total_by_view_transport_method``,
    ``django_http_responses_total_by_status_view_method``,
    ``django_http_requests_latency_seconds_by_view_method``) plus
    ``django_http_exceptions_total_by_type``, in place of its two middlewares'
    thirteen series. Those cost 3 to 4 % of a request's CPU
    (``bench/results/2026-11-27-s21-metrics-ab/``): ten labelled writes per
    request, each a lock and an mmap write in multiprocess mode. Here a
    request makes four writes (a histogram observation is two) to label
    children looked up once per process.

    Unlike django-prometheus's, every request is counted when its response is
    (a 404 without a route, a 413 or a 403 refused before any view too: the
    requests and responses series then add up), the latency includes every
    other middleware, and ``django_http_exceptions_total_by_view`` is gone.
    """

    def __init__(self, get_response):
        self.get_response = get_response
        self._children: dict[tuple, tuple] = {}

    def __call__(self, request):
        started = time.perf_counter()
        response = self.get_response(request)
        try:
            self._record(request, response, time.perf_counter() - started)
        except Exception:
            # The response stands: a committed schedule must not become a 500
            # (and a retry without Idempotency-Key a second payment) because a
            # metric could not be written.
            logger.exception("HTTP metrics not recorded")
        return response

    def _record(self, request, response, seconds: float) -> None:
        method = request.method if request.method in _METHODS else "<invalid method>"
        match = getattr(request, "resolver_match", None)
        view = (match.view_name if match is not None else None) or _UNNAMED_VIEW
        key = (view, method, response.status_code, request.is_secure())
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (
                metrics.http_requests.labels(
                    view=view, transport="https" if key[3] else "http", method=method
                ),
                metrics.http_responses.labels(
                    status=str(response.status_code), view=view, method=method
                ),
                metrics.http_latency.labels(view=view, method=method),
            )
        requests, responses, latency = children
        requests.inc()
        responses.inc()
        latency.observe(seconds)

    def process_exception(self, request, exception):
        metrics.http_exceptions.labels(type=type(exception).__name__).inc()


class ApiJsonErrorsMiddleware:
    """Every error under ``/api/`` is in the API's JSON shape, whatever ``DEBUG`` says.

    DRF views already answer JSON; this catches what Django answers itself
    (outermost, so it sees those responses last). 5xx pages are left alone: in a
    DEBUG run the traceback page is what a developer needs, and with DEBUG off
    ``json_500`` answers JSON.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (
            response.status_code in _HTML_REFUSALS
            and is_api_path(request.path)
            and not response.get("Content-Type", "").startswith("application/json")
        ):
            code, message = _HTML_REFUSALS[response.status_code]
            return JsonResponse(error_body(code, message), status=response.status_code)
        return response


class ApiBodyLimitMiddleware:
    """An API request whose body exceeds ``API_MAX_BODY_BYTES`` is a 413 ``payload_too_large``.

    Judged by ``Content-Length`` before anything reads the body, authenticates
    or claims an Idempotency-Key: nothing is written, and the key stays free for
    the corrected request.

    A body sent chunked (``Transfer-Encoding``, no ``Content-Length``) is a 411
    ``length_required``: under WSGI Django reads a body only up to its
    Content-Length, so the view saw an empty body and answered "field
    required" for a request that had sent every field (an outside tester).
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if is_api_path(request.path):
            if "HTTP_TRANSFER_ENCODING" in request.META and not request.META.get("CONTENT_LENGTH"):
                return length_required()
            try:
                length = int(request.META.get("CONTENT_LENGTH") or 0)
            except ValueError:
                length = 0
            if length > settings.API_MAX_BODY_BYTES:
                return payload_too_large()
        return self.get_response(request)


class DatabaseUnavailableMiddleware:
    """A view outside DRF (admin, operations page) that hits a database outage answers 503.

    DRF views get the same answer from ``payments.api.errors.exception_handler``;
    errors raised in other middleware reach ``json_500``, which does the same.
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        return self.get_response(request)

    def process_exception(self, request, exception):
        if isinstance(exception, DATABASE_UNAVAILABLE):
            return service_unavailable(request, exception)
        return None
