"""Webhook signing secrets at rest: Fernet (AES-128-CBC + HMAC-SHA256) ciphertext.

The plaintext exists in memory twice only: when ``endpoint_create`` returns it
to the client (once) and when a delivery is signed. Keys come from
``WEBHOOK_SECRET_KEYS`` (``MultiFernet``: the first encrypts, every one
decrypts, so keys can be rotated); without it one key is derived from
``SECRET_KEY`` with HKDF-SHA256. The derived keys (of ``SECRET_KEY`` and of
``SECRET_KEY_FALLBACKS``) always decrypt, after the configured ones, so
either move can be completed with ``rotate_webhook_secrets``.
"""

from __future__ import annotations

import base64
import functools

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

__all__ = ["InvalidToken", "decrypt", "encrypt", "reencrypt"]

_HKDF_INFO = b"delayed-payment-scheduler webhook-secret-encryption v1"


@functools.lru_cache(maxsize=8)  # every delivery decrypts: derive each key once
def _derived_key(secret_key: str) -> bytes:
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO).derive(
        secret_key.encode()
    )
    return base64.urlsafe_b64encode(raw)


def _fernet() -> MultiFernet:
    """The configured keys, then the keys derived from ``SECRET_KEY`` and each of
    ``SECRET_KEY_FALLBACKS``. ``MultiFernet`` encrypts with the first only: the
    derived keys after configured ones only decrypt, so moving from the
    derived key to a dedicated one (or rotating ``SECRET_KEY`` with the old one
    in ``SECRET_KEY_FALLBACKS``) keeps every stored secret readable until
    ``rotate_webhook_secrets`` has re-encrypted it — without them, setting the
    first dedicated key made every secret unreadable and the rotation could
    re-encrypt none."""
    configured = [k.strip() for k in settings.WEBHOOK_SECRET_KEYS if k.strip()]
    derived = [
        _derived_key(secret)
        for secret in [settings.SECRET_KEY, *getattr(settings, "SECRET_KEY_FALLBACKS", [])]
    ]
    keys = list(dict.fromkeys([*(k.encode() for k in configured), *derived]))
    return MultiFernet([Fernet(k) for k in keys])


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode("ascii")


def decrypt(ciphertext: str) -> str:
    """Raises ``InvalidToken`` if no configured key can decrypt it."""
    return _fernet().decrypt(ciphertext.encode("ascii")).decode()


def reencrypt(ciphertext: str) -> str:
    """The same secret encrypted with the first (current) key, for key rotation."""
    return _fernet().rotate(ciphertext.encode("ascii")).decode("ascii")
