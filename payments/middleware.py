"""Web-tier guards that answer before, or instead of, a view (errors: payments.api.errors)."""

from __future__ import annotations

from django.conf import settings
from django.http import JsonResponse

from .api.errors import (
    DATABASE_UNAVAILABLE,
    error_body,
    is_api_path,
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
    the corrected request. (Under WSGI a body is read only up to its
    Content-Length, so a request without one carries no body to a view.)
    """

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        if is_api_path(request.path):
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
