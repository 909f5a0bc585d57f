"""Bearer-token authentication and per-client throttling for the public API."""

from __future__ import annotations

from rest_framework import authentication, exceptions
from rest_framework.throttling import UserRateThrottle

from ..models import ApiToken
from ..tokens import hash_token


class BearerTokenAuthentication(authentication.BaseAuthentication):
    """``Authorization: Bearer <token>``; only the token's SHA-256 is looked up."""

    keyword = "Bearer"

    def authenticate(self, request):
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header.")
        try:
            token = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Malformed token.") from None
        record = (
            ApiToken.objects.select_related("user")
            .filter(key_hash=hash_token(token), revoked_at__isnull=True)
            .first()
        )
        if record is None or not record.user.is_active:
            raise exceptions.AuthenticationFailed("Invalid or revoked token.")
        return record.user, record

    def authenticate_header(self, request):
        return self.keyword


class ClientRateThrottle(UserRateThrottle):
    """One budget per client (per IP for unauthenticated calls)."""

    scope = "client"
