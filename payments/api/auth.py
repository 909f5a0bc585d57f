"""Bearer-token authentication and per-client throttling for the public API."""

from __future__ import annotations

import hmac
import logging

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from redis.exceptions import RedisError
from rest_framework import authentication, exceptions
from rest_framework.permissions import BasePermission
from rest_framework.throttling import BaseThrottle, SimpleRateThrottle, UserRateThrottle

from ..tokens import api_token_active

logger = logging.getLogger(__name__)


USAGE = "send Authorization: Bearer <token>."


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <token>``; only the token's SHA-256 is looked up."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header:
            return None
        if header[0].lower() != self.keyword.lower().encode():
            # "Token …", "Basic …": a credential was sent, in the wrong scheme.
            # Saying which scheme works beats "credentials were not provided".
            raise exceptions.AuthenticationFailed(f"Unsupported authorization scheme: {USAGE}")
        if len(header) != 2:
            raise exceptions.AuthenticationFailed(f"Malformed Authorization header: {USAGE}")
        try:
            token = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Malformed token.") from None
        record = api_token_active(token)
        if record is None or not record.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        return record.user, record

    def authenticate_header(self, request):
        return self.keyword


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of ``BearerTokenAuthentication`` (registered on import)."""

    target_class = BearerTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer"}


class InternalTokenAuthentication(authentication.BaseAuthentication):
    """``X-Internal-Auth: <INTERNAL_API_TOKEN>``, for the operator endpoint only.

    Unset ``INTERNAL_API_TOKEN`` disables the endpoint. A missing or wrong
    header is a 404, never a 401: the endpoint does not reveal that it exists.
    """

    header = "X-Internal-Auth"

    def authenticate(self, request):
        expected = settings.INTERNAL_API_TOKEN
        given = request.headers.get(self.header, "")
        if not expected or not hmac.compare_digest(given.encode(), expected.encode()):
            raise exceptions.NotFound("Not found.")
        return AnonymousUser(), self.header


class IsInternalCaller(BasePermission):
    """The request authenticated with ``InternalTokenAuthentication`` (which runs now)."""

    def has_permission(self, request, view):
        return isinstance(request.successful_authenticator, InternalTokenAuthentication)


class InternalTokenScheme(OpenApiAuthenticationExtension):
    """The OpenAPI security scheme of ``InternalTokenAuthentication``."""

    target_class = InternalTokenAuthentication
    name = "internalAuth"

    def get_security_definition(self, auto_schema):
        return {"type": "apiKey", "in": "header", "name": InternalTokenAuthentication.header}


def client_ip(request) -> str | None:
    """The client's address as the throttles and the admin login lockout see it.

    ``REMOTE_ADDR`` unless ``NUM_PROXIES`` (settings) says how many proxies
    in front append to ``X-Forwarded-For``; then the address the outermost of
    them saw. A client-written ``X-Forwarded-For`` never decides it.
    """
    return BaseThrottle().get_ident(request)


class SharedCacheThrottle(SimpleRateThrottle):
    """A rate throttle over the shared cache that lets requests through if the cache is down.

    The counters live in Redis (settings.CACHES), so every web process spends
    one budget. Redis being unreachable must not turn the API into 500s: the
    request is allowed and the failure logged.
    """

    def allow_request(self, request, view):
        try:
            return super().allow_request(request, view)
        except RedisError:
            logger.warning("throttle cache unavailable; request allowed", exc_info=True)
            return True


class ClientRateThrottle(SharedCacheThrottle, UserRateThrottle):
    """One budget per client (per IP for unauthenticated calls)."""

    scope = "client"


class InternalRateThrottle(SharedCacheThrottle):
    """One budget per client address for the operator endpoint, whatever it sends."""

    scope = "internal"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
