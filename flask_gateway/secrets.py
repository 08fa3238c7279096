"""Secrets at rest: the merchant API key and the signing key are stored encrypted (Fernet).

The key comes from ``GATEWAY_ENCRYPTION_KEY`` (one Fernet key, or several separated by commas: the first
encrypts, all decrypt, so keys can be rotated), else it is derived from the app's ``SECRET_KEY`` with HKDF.
Secrets are shown afterwards only masked (last 4 characters).
"""

from __future__ import annotations

import base64

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from flask_gateway.errors import ConfigurationError, SecretUnreadable

__all__ = ["SecretBox", "SecretUnreadable", "mask"]


def mask(secret: str | None) -> str:
    """``****abcd``: enough to recognise a secret, never enough to use it."""
    if not secret:
        return "(not set)"
    return "****" + secret[-4:] if len(secret) >= 12 else "****"


class SecretBox:
    """Encrypts and decrypts the extension's secrets."""

    def __init__(self, encryption_key: str | None, secret_key: str | bytes | None) -> None:
        if encryption_key:
            try:
                fernets = [Fernet(k.strip().encode()) for k in encryption_key.split(",") if k.strip()]
            except (ValueError, TypeError):
                raise ConfigurationError(
                    "GATEWAY_ENCRYPTION_KEY is not a Fernet key (or a comma-separated list of them). "
                    'Generate one with: python -c "from cryptography.fernet import Fernet; '
                    'print(Fernet.generate_key().decode())"'
                ) from None
        elif secret_key:
            raw = secret_key.encode() if isinstance(secret_key, str) else secret_key
            derived = HKDF(
                algorithm=hashes.SHA256(), length=32, salt=None, info=b"flask-gateway secrets v1"
            ).derive(raw)
            fernets = [Fernet(base64.urlsafe_b64encode(derived))]
        else:
            raise ConfigurationError(
                "Flask-Gateway encrypts the API key and signing key at rest and needs a key: set the app's "
                "SECRET_KEY, or GATEWAY_ENCRYPTION_KEY (a Fernet key)."
            )
        self._fernet = MultiFernet(fernets)
        #: Plaintexts by ciphertext for ``decrypt_cached``: a new ciphertext (new key, re-encryption) is a
        #: new entry, so nothing is ever stale. Never logged, never shown (``__repr__`` stays masked).
        self._plaintexts: dict[str, str] = {}

    def __repr__(self) -> str:
        return "SecretBox(****)"

    def encrypt(self, secret: str) -> str:
        return self._fernet.encrypt(secret.encode("utf-8")).decode("ascii")

    def decrypt(self, token: str) -> str:
        try:
            return self._fernet.decrypt(token.encode("ascii")).decode("utf-8")
        except (InvalidToken, ValueError):
            raise SecretUnreadable(
                "A stored gateway secret cannot be decrypted: SECRET_KEY or GATEWAY_ENCRYPTION_KEY changed. "
                "Restore the old key (list it after the new one in GATEWAY_ENCRYPTION_KEY), or enter the "
                "signing key again on the gateway's install screen."
            ) from None

    def decrypt_cached(self, token: str) -> str:
        """``decrypt``, remembered for this box (so per process) keyed by the ciphertext itself.

        For the secret read on a hot path (the signing key on every callback and client): the HMAC check
        and AES decryption of a Fernet token are done once per key instead of per request. Keyed by the
        exact ciphertext, so a changed row (a new signing key, a rotation) is decrypted afresh; a
        ciphertext that cannot be decrypted is never remembered.
        """
        try:
            return self._plaintexts[token]
        except KeyError:
            pass
        plaintext = self.decrypt(token)
        if len(self._plaintexts) >= 8:  # installations are few: bounded, dropped wholesale when full
            self._plaintexts.clear()
        self._plaintexts[token] = plaintext
        return plaintext

    def rotate(self, token: str) -> str:
        """Re-encrypt with the first (current) key."""
        return self._fernet.rotate(token.encode("ascii")).decode("ascii")
