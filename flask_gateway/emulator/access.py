"""Who may use the dashboard and the control API (``/_emulator/...``), and what anonymous eyes see.

- **JSON only.** Every POST to the control API needs a JSON body type (``application/json``): a cross-site
  page can send a ``text/plain`` or form POST without a CORS preflight, never a JSON one. Others get 415.
- **``EMULATOR_CONTROL_TOKEN``** (optional). When set, the control API needs ``Authorization: Bearer
  <token>`` (401 otherwise) and the dashboard a sign-in with the token (``/_emulator/login``; the session
  then remembers it); the hosted payment pages and the gateway's APIs stay as they are, and so does
  ``GET /_emulator/clock`` (a health check that shows nothing). Unset (tests, ``make demo``), both are open.
- **v1 outcome URLs** (``success_callback_url``, ``fail_callback_url``): with the order's token they are
  what the gateway uses to tell the shop an order was paid, so their query values are shown only to a
  caller proven by the token (``****`` otherwise, also when no token is set).
"""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Final
from urllib.parse import parse_qsl, quote, urlsplit, urlunsplit

from flask import Response, redirect, request, session, url_for
from werkzeug.exceptions import UnsupportedMediaType

from flask_gateway.emulator.api import settings
from flask_gateway.emulator.problems import ApiProblem

__all__ = [
    "OPEN_PATHS",
    "check_access",
    "is_operator",
    "mask_v1_urls",
    "remember_operator",
    "token_matches",
    "visible_url",
]

_SESSION_KEY: Final = "emulator_operator"
#: Paths under ``/_emulator/`` that stay open with a token: the health check, the sign-in, the API document.
OPEN_PATHS: Final = frozenset({"/_emulator/clock", "/_emulator/login", "/_emulator/openapi.json"})
_MASK: Final = "****"


def _fingerprint(token: str) -> str:
    return hashlib.sha256(b"emulator-operator:" + token.encode()).hexdigest()


def token_matches(candidate: str) -> bool:
    token = settings().control_token
    return token is not None and hmac.compare_digest(candidate.encode(), token.encode())


def is_operator() -> bool:
    """The caller proved it holds ``EMULATOR_CONTROL_TOKEN`` (bearer header or a dashboard sign-in)."""
    token = settings().control_token
    if token is None:
        return False
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    if scheme.lower() == "bearer" and token_matches(given.strip()):
        return True
    remembered = session.get(_SESSION_KEY)
    return isinstance(remembered, str) and hmac.compare_digest(remembered, _fingerprint(token))


def remember_operator() -> None:
    token = settings().control_token
    if token is not None:
        session[_SESSION_KEY] = _fingerprint(token)


def check_access(*, dashboard: bool) -> Response | None:
    """``before_request`` of the control API (``dashboard=False``) and the dashboard."""
    if not dashboard and request.method == "POST" and request.mimetype != "application/json":
        raise UnsupportedMediaType(
            "Control API requests are JSON: send Content-Type: application/json (an empty body is {})."
        )
    if settings().control_token is None or request.path in OPEN_PATHS or is_operator():
        return None
    if dashboard:
        return redirect(url_for("emulator_dashboard.login", next=request.path), 303)  # type: ignore[return-value]
    raise ApiProblem(
        401,
        "The control API needs the emulator's control token: send Authorization: Bearer <token>.",
        headers={"WWW-Authenticate": 'Bearer realm="gateway emulator"'},
    )


def visible_url(url: str | None) -> str | None:
    """``url`` with its query values masked, unless the caller is the operator."""
    if not url or is_operator():
        return url
    parts = urlsplit(url)
    if not parts.query:
        return url
    names = [name for name, _ in parse_qsl(parts.query, keep_blank_values=True)]
    return urlunsplit(parts._replace(query="&".join(f"{quote(name)}={_MASK}" for name in names)))


def mask_v1_urls(details: Any) -> Any:
    """A v1 order's stored request with its outcome URLs passed through :func:`visible_url`."""
    if not isinstance(details, dict) or not isinstance(details.get("order"), dict):
        return details
    order = dict(details["order"])
    for key in ("success_callback_url", "fail_callback_url"):
        if isinstance(order.get(key), str):
            order[key] = visible_url(order[key])
    return {**details, "order": order}
