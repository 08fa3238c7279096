"""The owner's login: one password (its werkzeug hash in the config), a server-checked mark in the session.

The extension's admin screens (``/gateway/admin/``) use the same login through ``@gateway.admin_guard``.
Attempts are counted, backed off and shared by every worker process, and a logout ends every copy of the
session (:mod:`example_shop.login_guard`).
"""

from __future__ import annotations

import time
import unicodedata
from collections.abc import Callable
from functools import wraps
from typing import Final, ParamSpec, TypeVar
from urllib.parse import urlsplit

from flask import current_app, g, redirect, request, session, url_for
from werkzeug.security import check_password_hash
from werkzeug.wrappers import Response

from example_shop import login_guard
from example_shop.extensions import gateway

__all__ = [
    "SESSION_HOURS",
    "check_password",
    "client_address",
    "is_owner",
    "log_in",
    "log_out",
    "owner_required",
    "safe_next",
]

SESSION_HOURS: Final = 8
_KEY: Final = "owner"

P = ParamSpec("P")
R = TypeVar("R")


def _stored_hash() -> str:
    stored = current_app.config.get("SHOP_ADMIN_PASSWORD_HASH")
    return stored if isinstance(stored, str) else ""


def _credential_key() -> str:
    """Stands for the owner's password in the session (``SHOP_OWNER_CREDENTIAL_KEY``): a new one ends the
    sessions made with the old."""
    return str(current_app.config.get("SHOP_OWNER_CREDENTIAL_KEY", ""))


def is_owner() -> bool:
    """The session was made by a login that is still current: within its hours, with the password hash in
    force, and not ended by a logout since (the version is the server's)."""
    cached = g.get("shop_is_owner")
    if cached is not None:
        return bool(cached)
    mark = session.get(_KEY)
    valid = (
        isinstance(mark, dict)
        and isinstance(mark.get("since"), int | float)
        and 0 <= time.time() - mark["since"] < SESSION_HOURS * 3600
        and mark.get("key") == _credential_key()
        and mark.get("version") == login_guard.session_version()
    )
    g.shop_is_owner = valid
    return valid


def log_in() -> None:
    session[_KEY] = {
        "since": time.time(),
        "version": login_guard.session_version(),
        "key": _credential_key(),
    }
    g.pop("shop_is_owner", None)


def log_out() -> None:
    """End this session and every copy of it (another device, a copied cookie)."""
    if is_owner():
        login_guard.end_sessions()
    session.pop(_KEY, None)
    g.pop("shop_is_owner", None)


def check_password(password: str) -> bool:
    stored = _stored_hash()
    return bool(stored) and check_password_hash(stored, password)


def client_address() -> str:
    return request.remote_addr or "unknown"


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
