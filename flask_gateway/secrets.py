"""Secrets at rest: the merchant API key and the signing key are stored encrypted (Fernet).

The key comes from ``GATEWAY_ENCRYPTION_KEY`` (one Fernet key, or several separated by commas: the first
encrypts, all decrypt, so keys can be rotated), else it is derived from the app's ``SECRET_KEY`` with HKDF,
and from each older key of ``SECRET_KEY_FALLBACKS`` likewise (they decrypt, the current key encrypts).
``GATEWAY_ENCRYPTION_KEY``, when set, is the whole story: ``SECRET_KEY`` and its fallbacks then protect no
stored secret. A secret read only with an older key is re-encrypted under the current one by ``flask
gateway rotate-secrets`` (:mod:`flask_gateway.operations.rotation`). Secrets are shown afterwards only
masked (last 4 characters).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from cryptography.fernet import Fernet, InvalidToken, MultiFernet
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from flask_gateway.core.secret_keys import SecretKeyFallbacksError, fallback_keys
from flask_gateway.errors import ConfigurationError, SecretUnreadable

__all__ = ["SecretBox", "SecretUnreadable", "mask", "secret_key_fallbacks", "signing_keys"]

#: Where a box's older keys come from (what an owner drops once nothing needs them).
KeySource = Literal["GATEWAY_ENCRYPTION_KEY", "SECRET_KEY_FALLBACKS"]


def mask(secret: str | None) -> str:
    """``****abcd``: enough to recognise a secret, never enough to use it."""
    if not secret:
        return "(not set)"
    return "****" + secret[-4:] if len(secret) >= 12 else "****"


def secret_key_fallbacks(app_config: Mapping[str, Any]) -> tuple[str | bytes, ...]:
    """The app's ``SECRET_KEY_FALLBACKS`` (Flask 3.1: its older keys, a list), checked: a string, an empty
    key or anything but a list of keys is a :class:`ConfigurationError` saying how to give the list."""
    try:
        return fallback_keys(app_config.get("SECRET_KEY_FALLBACKS"))
    except SecretKeyFallbacksError as error:
        raise ConfigurationError(str(error)) from None


def signing_keys(app_config: Mapping[str, Any]) -> list[str | bytes]:
    """``SECRET_KEY`` and its fallbacks in itsdangerous' order, as Flask's sessions use them: the older keys
    first, the current one last (it signs; every one verifies). Empty without ``SECRET_KEY``."""
    current = app_config.get("SECRET_KEY")
    if not current:
        return []
    return [*secret_key_fallbacks(app_config), current]


def _raw(key: str | bytes) -> bytes:
    return key.encode() if isinstance(key, str) else key


def _derived(secret_key: str | bytes) -> Fernet:
    derived = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"flask-gateway secrets v1").derive(
        _raw(secret_key)
    )
    return Fernet(base64.urlsafe_b64encode(derived))


class SecretBox:
    """Encrypts and decrypts the extension's secrets: encrypts with the current key, decrypts with it and
    every older one (``GATEWAY_ENCRYPTION_KEY``'s later keys, or ``SECRET_KEY_FALLBACKS``)."""

    def __init__(
        self,
        encryption_key: str | None,
        secret_key: str | bytes | None,
        fallbacks: Sequence[str | bytes] = (),
    ) -> None:
        fernets: list[Fernet]
        if encryption_key:
            try:
                keys = list(dict.fromkeys(k.strip() for k in encryption_key.split(",") if k.strip()))
                fernets = [Fernet(k.encode()) for k in keys]
            except (ValueError, TypeError):
                raise ConfigurationError(
                    "GATEWAY_ENCRYPTION_KEY is not a Fernet key (or a comma-separated list of them). "
                    'Generate one with: python -c "from cryptography.fernet import Fernet; '
                    'print(Fernet.generate_key().decode())"'
                ) from None
            self.older_keys_in: KeySource = "GATEWAY_ENCRYPTION_KEY"
        elif secret_key:
            # The current key first (it encrypts), then each fallback once (they decrypt).
            distinct = dict.fromkeys(_raw(k) for k in (secret_key, *fallbacks))
            fernets = [_derived(k) for k in distinct]
            self.older_keys_in = "SECRET_KEY_FALLBACKS"
        else:
            raise ConfigurationError(
                "Flask-Gateway encrypts the API key and signing key at rest and needs a key: set the app's "
                "SECRET_KEY, or GATEWAY_ENCRYPTION_KEY (a Fernet key)."
            )
        self._current = fernets[0]
        self._fernet = MultiFernet(fernets)
        #: How many older keys still decrypt (0: only the current key).
        self.older_keys = len(fernets) - 1
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
                "Put the old key back (SECRET_KEY's in SECRET_KEY_FALLBACKS, or list it after the new one "
                "in GATEWAY_ENCRYPTION_KEY), or enter the signing key again on the gateway's install screen."
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

    def needs_older_key(self, token: str) -> bool:
        """Whether ``token`` decrypts only with an older key (not with the current one). Raises
        :class:`SecretUnreadable` when no key decrypts it."""
        try:
            self._current.decrypt(token.encode("ascii"))
        except (InvalidToken, ValueError):
            self.decrypt(token)  # readable with an older key, or SecretUnreadable
            return True
        return False

    def rotate(self, token: str) -> str:
        """Re-encrypt with the first (current) key. Raises :class:`SecretUnreadable` when no key
        decrypts ``token``."""
        try:
            return self._fernet.rotate(token.encode("ascii")).decode("ascii")
        except (InvalidToken, ValueError):
            self.decrypt(token)  # raises the explained SecretUnreadable
            raise
