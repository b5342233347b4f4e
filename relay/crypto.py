"""Encryption at rest for webhook secrets, keyed from ``RELAY_SECRET_KEY`` (docs/operations.md)."""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from flask import current_app


def _fernet(secret_key: str | None = None) -> Fernet:
    secret = secret_key if secret_key is not None else current_app.config["RELAY"].secret_key
    key = HKDF(algorithm=hashes.SHA256(), length=32, salt=b"relay-webhook-secrets", info=b"fernet-v1").derive(
        secret.encode("utf-8")
    )
    return Fernet(base64.urlsafe_b64encode(key))


def encrypt(plaintext: str) -> str:
    """Encrypt a secret for storage."""
    return _fernet().encrypt(plaintext.encode("utf-8")).decode("ascii")


def decrypt(token: str) -> str:
    """Decrypt a stored secret; raise ValueError if RELAY_SECRET_KEY changed since it was stored."""
    try:
        return _fernet().decrypt(token.encode("ascii")).decode("utf-8")
    except InvalidToken:
        raise ValueError("cannot decrypt a webhook secret: was RELAY_SECRET_KEY changed?") from None
