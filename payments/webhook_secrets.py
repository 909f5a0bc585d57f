"""Webhook signing secrets at rest: Fernet (AES-128-CBC + HMAC-SHA256) ciphertext.

The plaintext exists in memory twice only: when ``endpoint_create`` returns it
to the client (once) and when a delivery is signed. Keys come from
``WEBHOOK_SECRET_KEYS`` (``MultiFernet``: the first encrypts, every one
decrypts, so keys can be rotated); without it one key is derived from
``SECRET_KEY`` with HKDF-SHA256, which ties the secrets to that key.
"""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from django.conf import settings

__all__ = ["InvalidToken", "decrypt", "encrypt", "reencrypt"]

_HKDF_INFO = b"delayed-payment-scheduler webhook-secret-encryption v1"


def _derived_key(secret_key: str) -> bytes:
    raw = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO).derive(
        secret_key.encode()
    )
    return base64.urlsafe_b64encode(raw)


def _fernet() -> MultiFernet:
    keys = [k.strip() for k in settings.WEBHOOK_SECRET_KEYS if k.strip()]
    if not keys:
        keys = [_derived_key(settings.SECRET_KEY)]
    return MultiFernet([Fernet(k) for k in keys])


def encrypt(plaintext: str) -> str:
    return _fernet().encrypt(plaintext.encode()).decode("ascii")


def decrypt(ciphertext: str) -> str:
    """Raises ``InvalidToken`` if no configured key can decrypt it."""
    return _fernet().decrypt(ciphertext.encode("ascii")).decode()


def reencrypt(ciphertext: str) -> str:
    """The same secret encrypted with the first (current) key, for key rotation."""
    return _fernet().rotate(ciphertext.encode("ascii")).decode("ascii")
