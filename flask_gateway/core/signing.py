"""Request and callback signatures.

The gateway's published reference code signs ``body.replace(/\\s/g, '')`` with HMAC-SHA256 and base64.
"Whitespace" is therefore exactly JavaScript's ``\\s`` class (ECMAScript WhiteSpace + LineTerminator),
which differs from Python's ``str.isspace``: U+0085 and U+001C..U+001F are *not* removed, U+FEFF is.
Whitespace inside JSON string values is removed too; the signature covers the stripped text only.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
from typing import Final

__all__ = ["JS_WHITESPACE", "canonicalize", "sign", "verify"]

#: Every code point matched by JavaScript's ``\s``.
JS_WHITESPACE: Final[frozenset[str]] = frozenset(
    "\t\n\v\f\r \u00a0\u1680\u2028\u2029\u202f\u205f\u3000\ufeff"
    + "".join(chr(cp) for cp in range(0x2000, 0x200B))
)

_ASCII_WHITESPACE: Final = b"\t\n\v\f\r "
# str.translate with a dict deleting each character is a single C-level pass over the text.
_DELETE_JS_WHITESPACE: Final = dict.fromkeys(map(ord, JS_WHITESPACE))


def canonicalize(body: bytes | str) -> bytes:
    """Return the UTF-8 bytes the signature is computed over: ``body`` without JavaScript whitespace.

    ``bytes`` must be UTF-8 (``UnicodeDecodeError`` otherwise). One linear pass: pure ASCII bodies,
    which is what our compact ASCII-only JSON always is, are stripped with ``bytes.translate``.
    """
    if isinstance(body, bytes | bytearray | memoryview):
        raw = bytes(body)
        if raw.isascii():
            return raw.translate(None, _ASCII_WHITESPACE)
        text = raw.decode("utf-8")
    else:
        if body.isascii():
            return body.encode("ascii").translate(None, _ASCII_WHITESPACE)
        text = body
    return text.translate(_DELETE_JS_WHITESPACE).encode("utf-8")


def sign(body: bytes | str, key: str) -> str:
    """Base64 of HMAC-SHA256 over the canonical body, keyed with the secret signing key."""
    if not isinstance(key, str):
        raise TypeError("the signing key must be a str")
    digest = hmac.new(key.encode("utf-8"), canonicalize(body), hashlib.sha256).digest()
    return base64.b64encode(digest).decode("ascii")


def verify(body: object, key: object, signature: object) -> bool:
    """True when ``signature`` is the signature of ``body`` under ``key``.

    Compares in constant time and fails closed: it never raises, and returns False for a missing or
    empty key or signature, a signature that is not ASCII or not canonical base64 of a SHA-256 digest,
    and a body that is neither text nor UTF-8 bytes.
    """
    if not isinstance(key, str) or not key:
        return False
    if isinstance(signature, bytes):
        if not signature.isascii():
            return False
        signature = signature.decode("ascii")
    if not isinstance(signature, str) or not signature or not signature.isascii():
        return False
    if isinstance(body, bytearray | memoryview):
        body = bytes(body)
    if not isinstance(body, bytes | str):
        return False
    try:
        # Reject junk early (without leaking anything about the expected value): only a canonical
        # base64 encoding of 32 bytes can ever match.
        if len(base64.b64decode(signature, validate=True)) != hashlib.sha256().digest_size:
            return False
        expected = sign(body, key)
    except (binascii.Error, ValueError, UnicodeError):
        return False
    return hmac.compare_digest(expected.encode("ascii"), signature.encode("ascii"))
