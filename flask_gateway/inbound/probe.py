"""``flask gateway doctor``'s probe of the callback URL: the mark (:data:`PROBE_HEADER`, an HMAC with a key
derived from ``SECRET_KEY``) that tells the probe from a refused callback. The mark is made with
``SECRET_KEY`` and checked with it and each older key of ``SECRET_KEY_FALLBACKS`` (a doctor run by a
process that has not been given the new key yet, during a rotation).

Imports nothing from the rest of ``flask_gateway.inbound``.
"""

from __future__ import annotations

import hashlib
import hmac
import re
import time
from typing import Final

from flask import current_app
from werkzeug.datastructures import Headers

from flask_gateway.secrets import signing_keys

__all__ = ["PROBE_HEADER", "PROBE_WINDOW_SECONDS", "doctor_probe_mark"]


#: Marks ``flask gateway doctor``'s own unsigned probe of the callback: ``t=<unix time>,v1=<hex HMAC>``.
PROBE_HEADER: Final = "X-Gateway-Doctor-Probe"
#: How far from the receiving process's clock a probe's time may be (seconds, either way).
PROBE_WINDOW_SECONDS: Final = 300
_PROBE_KEY_LABEL: Final = b"flask-gateway/doctor-probe/v1"
_PROBE_MARK: Final = re.compile(r"t=(\d{1,12}),v1=([0-9a-f]{64})")


def _derived_key(secret: object) -> bytes:
    raw = secret if isinstance(secret, bytes) else str(secret).encode("utf-8")
    return hmac.new(raw, _PROBE_KEY_LABEL, hashlib.sha256).digest()


def _probe_key() -> bytes | None:
    """A key of its own for the probe's mark, derived from the app's ``SECRET_KEY`` (None without one)."""
    secret = current_app.config.get("SECRET_KEY")
    return _derived_key(secret) if secret else None


def _probe_keys() -> list[bytes]:
    """The keys a mark is checked with: ``SECRET_KEY``'s, then each of ``SECRET_KEY_FALLBACKS``'."""
    return [_derived_key(secret) for secret in reversed(signing_keys(current_app.config))]


def _probe_signature(key: bytes, stamp: int, body: bytes) -> str:
    return hmac.new(key, b"%d." % stamp + body, hashlib.sha256).hexdigest()


def doctor_probe_mark(body: bytes, *, now: float | None = None) -> str | None:
    """The :data:`PROBE_HEADER` value for ``flask gateway doctor``'s probe carrying ``body`` (None when the
    app has no ``SECRET_KEY``): the time, and an HMAC of it and the body made with a key derived from
    ``SECRET_KEY``. The shop answers the probe as any unsigned callback (401) and records it as
    ``doctor-probe``: no refused callback, no ``callback_rejected``, not counted against the rate limit.
    Only a holder of ``SECRET_KEY`` can make one, so copying the doctor's User-Agent hides nothing."""
    key = _probe_key()
    if key is None:
        return None
    stamp = int(time.time() if now is None else now)
    return f"t={stamp},v1={_probe_signature(key, stamp, body)}"


def _is_doctor_probe(headers: Headers, body: bytes | None) -> bool:
    mark = headers.get(PROBE_HEADER)
    if not mark or body is None:
        return False
    found = _PROBE_MARK.fullmatch(mark.strip())
    if found is None:
        return False
    stamp = int(found.group(1))
    if abs(time.time() - stamp) > PROBE_WINDOW_SECONDS:
        return False
    given = found.group(2)
    return any(hmac.compare_digest(given, _probe_signature(key, stamp, body)) for key in _probe_keys())
