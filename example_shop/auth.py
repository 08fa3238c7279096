"""The owner's login: one password (its werkzeug hash in the config), a flag in the session.

The extension's admin screens (``/gateway/admin/``) use the same login through ``@gateway.admin_guard``.
"""

from __future__ import annotations

import threading
import time
import unicodedata
from collections import deque
from collections.abc import Callable
from functools import wraps
from typing import Final, ParamSpec, TypeVar
from urllib.parse import urlsplit

from flask import current_app, redirect, request, session, url_for
from werkzeug.security import check_password_hash
from werkzeug.wrappers import Response

from example_shop.extensions import gateway

__all__ = [
    "FAILED_LOGINS_ALLOWED",
    "SESSION_HOURS",
    "check_password",
    "is_owner",
    "log_in",
    "log_out",
    "owner_required",
    "safe_next",
    "throttled",
]

SESSION_HOURS: Final = 8
_KEY: Final = "owner_since"
#: Failed logins allowed per client address in :data:`_WINDOW` seconds before the form refuses to check.
FAILED_LOGINS_ALLOWED: Final = 5
_WINDOW: Final = 300.0
_failures: dict[str, deque[float]] = {}
_failures_lock = threading.Lock()

P = ParamSpec("P")
R = TypeVar("R")


def is_owner() -> bool:
    since = session.get(_KEY)
    if not isinstance(since, int | float) or isinstance(since, bool):
        return False
    return 0 <= time.time() - since < SESSION_HOURS * 3600


def log_in() -> None:
    session[_KEY] = time.time()


def log_out() -> None:
    session.pop(_KEY, None)


def check_password(password: str) -> bool:
    stored = current_app.config.get("SHOP_ADMIN_PASSWORD_HASH")
    return isinstance(stored, str) and bool(stored) and check_password_hash(stored, password)


def _client() -> str:
    return request.remote_addr or "unknown"


def throttled() -> bool:
    """True while this client has used up its failed logins (in-process; a real shop uses its proxy)."""
    now = time.monotonic()
    with _failures_lock:
        attempts = _failures.get(_client())
        if not attempts:
            return False
        while attempts and attempts[0] < now - _WINDOW:
            attempts.popleft()
        return len(attempts) >= FAILED_LOGINS_ALLOWED


def record_failure() -> None:
    with _failures_lock:
        _failures.setdefault(_client(), deque(maxlen=FAILED_LOGINS_ALLOWED)).append(time.monotonic())


def forget_failures() -> None:
    with _failures_lock:
        _failures.pop(_client(), None)


def safe_next(target: str | None) -> str:
    """A local path to go to after logging in; anything else (another host, ``//host``) is ignored."""
    fallback = url_for("admin.orders")
    if not target:
        return fallback
    try:
        parts = urlsplit(target)
    except ValueError:  # e.g. a netloc that NFKC-normalises to a separator ("//\uff0f"): a 500 before
        return fallback
    if parts.scheme or parts.netloc or not target.startswith("/") or target.startswith("//"):
        return fallback
    if "\\" in target:
        return fallback
    # Whitespace and control characters: browsers drop tabs and newlines (so "/\t/evil.com" is
    # "//evil.com" to them), and a CR/LF in a Location header is a 500.
    if any(ch.isspace() or unicodedata.category(ch).startswith("C") for ch in target):
        return fallback
    return target


def _login_redirect() -> Response:
    return redirect(url_for("admin.login", next=request.full_path.rstrip("?")))


def owner_required(view: Callable[P, R]) -> Callable[P, R | Response]:
    @wraps(view)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | Response:
        if not is_owner():
            return _login_redirect()
        return view(*args, **kwargs)

    return wrapper


@gateway.admin_guard
def owner_only() -> bool | Response:
    """The extension's admin screens: True for the logged-in owner, else the login page."""
    return True if is_owner() else _login_redirect()
