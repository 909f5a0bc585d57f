"""Bearer-token authentication and per-client throttling for the public API."""

from __future__ import annotations

import hashlib
import secrets

from django.contrib.auth.models import AbstractBaseUser
from rest_framework import authentication, exceptions
from rest_framework.throttling import UserRateThrottle

from ..models import ApiToken

TOKEN_PREFIX = "dps_"  # noqa: S105 - a public prefix, not a secret


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def api_token_create(*, user: AbstractBaseUser, name: str = "") -> tuple[ApiToken, str]:
    """Create a token for ``user``; the plain token is returned once and never stored."""
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    record = ApiToken.objects.create(
        user=user, name=name, prefix=token[:12], key_hash=hash_token(token)
    )
    return record, token


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
