"""The app's older secret keys: Flask 3.1's ``SECRET_KEY_FALLBACKS``, read the way Flask reads it.

Flask signs its sessions with ``SECRET_KEY`` and accepts a session signed with any key of
``SECRET_KEY_FALLBACKS`` (a list), so ``SECRET_KEY`` can be changed without logging everyone out. The
extension and the embedded emulator honour the same list for what they sign and encrypt with the key.

Flask takes the value as a list of keys and nothing else: ``app.config.from_prefixed_env()`` gives a list
only for a JSON list (``FLASK_SECRET_KEY_FALLBACKS='["old key"]'``), and a plain string (``FLASK_...=old``,
JSON or not) stays a string, which Flask's sessions would read one character at a time, each character a
key. So a string is refused here, with how to give a list; it is never split on commas (Flask does not).

No Flask here: the extension (``flask_gateway.config``) and the emulator both read it through this module.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["SecretKeyFallbacksError", "fallback_keys"]


class SecretKeyFallbacksError(ValueError):
    """``SECRET_KEY_FALLBACKS`` is not a list of keys; the message says what it is and how to fix it."""


def fallback_keys(value: object) -> tuple[str | bytes, ...]:
    """``SECRET_KEY_FALLBACKS`` as a tuple of keys (``None`` or an empty list: none).

    A list or a tuple of non-empty strings or bytes; anything else raises :class:`SecretKeyFallbacksError`
    (its message never holds a key, nor a part of one)."""
    if value is None:
        return ()
    if isinstance(value, str | bytes):
        raise SecretKeyFallbacksError(
            "SECRET_KEY_FALLBACKS is a string, not a list of keys: Flask's sessions would take each of its "
            'characters for a key. Give a list: app.config["SECRET_KEY_FALLBACKS"] = [old_key], or, with '
            "app.config.from_prefixed_env(), FLASK_SECRET_KEY_FALLBACKS='[\"<old key>\"]' (a JSON list)."
        )
    if not isinstance(value, Sequence):
        raise SecretKeyFallbacksError(
            f"SECRET_KEY_FALLBACKS is a {type(value).__name__}, not a list of keys: give a list (or a tuple) "
            "of the older SECRET_KEY values."
        )
    keys: list[str | bytes] = []
    for position, key in enumerate(value, start=1):
        if not isinstance(key, str | bytes):
            raise SecretKeyFallbacksError(
                f"SECRET_KEY_FALLBACKS' key number {position} is a {type(key).__name__}: each key is a "
                "string (or bytes), as SECRET_KEY is."
            )
        if not key:
            raise SecretKeyFallbacksError(
                f"SECRET_KEY_FALLBACKS' key number {position} is empty: Flask's sessions would accept what "
                "an empty key signs, so anyone could forge them. Remove it."
            )
        keys.append(key)
    return tuple(keys)
