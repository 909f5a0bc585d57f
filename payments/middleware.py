"""Web-tier guards that answer before, or instead of, a view (errors: payments.api.errors)."""

from __future__ import annotations

from django.conf import settings

from .api.errors import DATABASE_UNAVAILABLE, payload_too_large, service_unavailable


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
        if request.path.startswith("/api/"):
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
