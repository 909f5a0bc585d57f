"""Bearer-token authentication and per-client throttling for the public API."""

from __future__ import annotations

import hmac
import logging
import os

from django.conf import settings
from django.contrib.auth.models import AnonymousUser
from django.core.cache import DEFAULT_CACHE_ALIAS, caches
from django.core.cache.backends.redis import RedisCache
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from redis.exceptions import RedisError
from rest_framework import authentication, exceptions
from rest_framework.permissions import BasePermission, IsAuthenticated
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
            unsupported = f"Unsupported authorization scheme: {USAGE}"
            raise refused(request, exceptions.AuthenticationFailed(unsupported))
        if len(header) != 2:
            raise refused(
                request, exceptions.AuthenticationFailed(f"Malformed Authorization header: {USAGE}")
            )
        try:
            token = header[1].decode()
        except UnicodeDecodeError:
            raise refused(request, exceptions.AuthenticationFailed("Malformed token.")) from None
        record = api_token_active(token)
        if record is None or not record.user.is_active:
            raise refused(request, exceptions.AuthenticationFailed("Invalid or revoked token."))
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


# KEYS[1]: the client's sorted set (member per counted request, score its time
# in µs). ARGV: the limit, the window in µs, a random suffix that keeps two
# requests of the same microsecond apart. Returns 0 when the request is
# counted, else the µs until enough counted requests leave the window for one
# more (> 0: anything older than the window was just removed).
_SLIDING_WINDOW = """
local limit = tonumber(ARGV[1])
local window = tonumber(ARGV[2])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000000 + tonumber(time[2])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local count = redis.call('ZCARD', KEYS[1])
if count < limit then
    redis.call('ZADD', KEYS[1], now, time[1] .. '.' .. time[2] .. '-' .. ARGV[3])
    redis.call('PEXPIRE', KEYS[1], math.ceil(window / 1000))
    return 0
end
local frees = redis.call('ZRANGE', KEYS[1], count - limit, count - limit, 'WITHSCORES')[2]
if not frees then
    return window
end
return tonumber(frees) + window - now
"""
_sliding_window = None  # redis-py's Script (EVALSHA, reloaded on NOSCRIPT), built on first use


class SharedCacheThrottle(SimpleRateThrottle):
    """A rate throttle over the shared cache that lets requests through if the cache is down.

    DRF's semantics: at most N requests per key in any window of ``duration``
    seconds, a rejected request not counted, ``wait()`` the seconds until the
    next one would be allowed (the 429's ``Retry-After``). With a Redis cache
    (settings.CACHES: every web process spends one budget) one Lua script
    checks and counts a request atomically, in one round trip, on Redis's
    clock: a sorted set per key under the cache's prefix, a member per counted
    request. DRF's own path (a GET of the pickled timestamp list, then a SET)
    races between processes, lets more than N through at once, and costs two
    round trips and a pickle. Any other cache (laptop: one process's memory)
    takes DRF's path. Redis being unreachable must not turn the API into 500s:
    the request is allowed and the failure logged.
    """

    _redis_wait: float | None = None  # seconds, set by a rejection on the Redis path

    def allow_request(self, request, view):
        try:
            backend = caches[DEFAULT_CACHE_ALIAS]
            if not isinstance(backend, RedisCache):
                return super().allow_request(request, view)
            return self._allow_in_redis(backend, request, view)
        except RedisError:
            logger.warning("throttle cache unavailable; request allowed", exc_info=True)
            return True

    def _allow_in_redis(self, backend: RedisCache, request, view) -> bool:
        """One EVALSHA on the cache's own Redis client (its pool). The set's key is
        DRF's cache key plus ``:window``: never the key of a pickled list that a
        process still running DRF's path (a rolling deploy) reads and writes."""
        global _sliding_window
        if self.rate is None:
            return True
        key = self.get_cache_key(request, view)
        if key is None:
            return True
        client = backend._cache.get_client(None, write=True)
        if _sliding_window is None:
            _sliding_window = client.register_script(_SLIDING_WINDOW)
        wait_us = _sliding_window(
            keys=[backend.make_key(f"{key}:window")],
            args=[self.num_requests, self.duration * 1_000_000, os.urandom(6).hex()],
            client=client,
        )
        if wait_us == 0:
            return True
        self._redis_wait = wait_us / 1_000_000
        return self.throttle_failure()

    def wait(self):
        return self._redis_wait if self._redis_wait is not None else super().wait()


class ClientRateThrottle(SharedCacheThrottle, UserRateThrottle):
    """One budget per client (``API_THROTTLE_RATE``); per address on what needs no
    credentials (the schema and its docs). A request refused for its
    credentials never gets here: ``AnonymousRateThrottle``."""

    scope = "client"


class AnonymousRateThrottle(SharedCacheThrottle):
    """One budget per client address for requests without valid credentials
    (``API_ANON_THROTTLE_RATE``): no ``Authorization``, another scheme, a wrong
    or revoked token. DRF checks throttles after authentication and
    permissions, so such a request never reached ``ClientRateThrottle`` — a
    401 cost nothing however many were asked for, guessing tokens included (a
    review, session 42). Only refused requests count against it."""

    scope = "anonymous"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}


def refused(request, exc: exceptions.APIException) -> exceptions.APIException:
    """``exc`` for a request without valid credentials, or ``Throttled`` once its
    address is past ``AnonymousRateThrottle``'s budget."""
    throttle = AnonymousRateThrottle()
    if throttle.allow_request(request, None):
        return exc
    return exceptions.Throttled(wait=throttle.wait())


class IsClient(IsAuthenticated):
    """``IsAuthenticated``; a request without credentials counts against its
    address's ``AnonymousRateThrottle`` (one with bad ones was counted when
    ``BearerTokenAuthentication`` refused them)."""

    def has_permission(self, request, view):
        if super().has_permission(request, view):
            return True
        exc = refused(request, exceptions.NotAuthenticated())
        if isinstance(exc, exceptions.Throttled):
            raise exc
        return False


class WebhookEndpointWriteThrottle(SharedCacheThrottle, UserRateThrottle):
    """A client's webhook endpoint creations and changes (``WEBHOOK_ENDPOINT_WRITE_RATE``):
    each looks its host up inside the request, holding a web thread meanwhile."""

    scope = "webhook_endpoint_writes"


class OneAtATime:
    """At most one request of a kind in flight per client, across the web
    processes (the shared cache; one process's memory on a laptop).

    A rate alone lets a client's budget arrive at once: ten endpoint
    registrations in parallel each hold a web thread for their DNS look-up,
    and every other client's request waits for a thread meanwhile. The slot
    is a cache key added only if absent (Redis ``SET NX``) and deleted when the
    request ends; it expires after ``seconds`` if the process dies holding
    it. The cache being down lets the request through (like the throttles).
    """

    def __init__(self, kind: str, seconds: float):
        self.kind = kind
        self.seconds = seconds

    def _key(self, client_id) -> str:
        return f"one-at-a-time:{self.kind}:{client_id}"

    def acquire(self, client_id) -> str | None:
        """A token to ``release`` with ("" when the cache is down), or None: busy."""
        token = os.urandom(8).hex()
        try:
            added = caches[DEFAULT_CACHE_ALIAS].add(self._key(client_id), token, self.seconds)
        except RedisError:
            logger.warning("slot cache unavailable; request allowed", exc_info=True)
            return ""
        return token if added else None

    def release(self, client_id, token: str) -> None:
        if not token:
            return
        backend = caches[DEFAULT_CACHE_ALIAS]
        try:
            if backend.get(self._key(client_id)) == token:  # not another request's, after expiry
                backend.delete(self._key(client_id))
        except RedisError:
            logger.warning("slot cache unavailable; slot left to expire", exc_info=True)


class InternalRateThrottle(SharedCacheThrottle):
    """One budget per client address for the operator endpoint, whatever it sends."""

    scope = "internal"

    def get_cache_key(self, request, view):
        return self.cache_format % {"scope": self.scope, "ident": self.get_ident(request)}
