"""The shop's blueprints, and what every shop page shares: template helpers, headers, error pages."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Final

from flask import Flask, render_template, request
from flask.typing import ResponseReturnValue
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException
from werkzeug.wrappers import Response

from example_shop import auth, outages
from example_shop import cart as session_cart
from example_shop.models import OrderStatus
from flask_gateway import DATABASE_ERRORS, format_money, format_time, get_state, is_database_outage

__all__ = ["register"]

#: The extension's blueprints answer with their own headers and pages.
_GATEWAY_BLUEPRINTS: Final = frozenset({"gateway", "gateway_admin"})
#: Everything from this shop's own origin; no inline script or style, no framing.
CONTENT_SECURITY_POLICY: Final = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "object-src 'none'; base-uri 'self'; frame-ancestors 'none'"
)

#: The CSRF failure's page when the session cookie is Secure (``SHOP_ENV=production``) and the request came
#: over plain http: the browser never sends that cookie back, so the form cannot be checked.
SECURE_COOKIE_OVER_HTTP: Final = (
    "Nothing was changed: this page came over plain http, but the shop's session cookie is sent over https "
    "only (it is Secure, as SHOP_ENV=production sets it), so your browser did not send it back with the "
    "form. Open the shop at its https:// address. Behind a proxy that ends TLS, set SHOP_TRUSTED_PROXIES "
    "to the number of proxies in front of the shop, so it believes their X-Forwarded-Proto: https."
)


def when(moment: datetime | None, seconds: bool = True) -> str:
    """``2026-11-27 13:51:09 SAST``: the gateway's one clock (``GATEWAY_TIMEZONE``, which the shop sets to
    ``Africa/Johannesburg``), so the shop's pages and the gateway's screens show an event at the same time
    in the same zone; ``-`` for None."""
    return format_time(moment, get_state().config.zone, seconds=seconds)


#: ``OrderEvent.kind`` as the owner reads it in the order's history.
EVENT_KINDS: Final = {
    "placed": "Placed",
    "checkout": "Sent to pay",
    "paid": "Paid",
    "cancelled": "Cancelled",
    "expired": "Expired",
    "refund": "Refund",
    "refunded": "Refunded",
    "note": "Note",
}


def event_kind(kind: str) -> str:
    """An order event's kind in words (an unknown kind as it is)."""
    return EVENT_KINDS.get(kind, kind)


def _ours() -> bool:
    return request.blueprint not in _GATEWAY_BLUEPRINTS


def _owner_unless_away() -> bool:
    """``auth.is_owner()`` for the page's owner navigation; False while the database is away, so the
    outage pages (the shop's, and the extension's ``gateway/unavailable.html`` in the shop's look) draw
    without it: the owner's login is checked in the database."""
    if outages.database_away():
        return False
    try:
        return auth.is_owner()
    except DATABASE_ERRORS as error:
        if not is_database_outage(error):
            raise
        return False


def register(app: Flask) -> None:
    from example_shop.views import admin, cart, checkout, orders, shop

    for blueprint in (shop.bp, cart.bp, checkout.bp, orders.bp, admin.bp):
        app.register_blueprint(blueprint)

    @app.before_request
    def _cart_follows_payment() -> None:
        if request.endpoint != "static" and _ours():
            session_cart.clear_when_paid()

    @app.after_request
    def _headers(response: Response) -> Response:
        if _ours():
            response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
            response.headers.setdefault("X-Frame-Options", "DENY")
            response.headers.setdefault("X-Content-Type-Options", "nosniff")
            response.headers.setdefault("Referrer-Policy", "same-origin")
        if app.config["SHOP_ENV"] == "production":
            response.headers.setdefault("Strict-Transport-Security", "max-age=31536000")
        return response

    @app.context_processor
    def _helpers() -> dict[str, Any]:
        symbol = str(app.config.get("GATEWAY_CURRENCY_SYMBOL", "R"))

        def money(cents: int | None) -> str:
            return format_money(cents, symbol)

        return {
            "money": money,
            "when": when,
            "event_kind": event_kind,
            "shop_name": app.config["SHOP_NAME"],
            "cart_count": session_cart.load().count,
            "is_owner": _owner_unless_away(),
            "demo_gateway": app.config.get("GATEWAY_ENVIRONMENT", "emulator") == "emulator",
            "OrderStatus": OrderStatus,
            # The second brand sells on its own merchant account (brands.py): pages name brands and accounts.
            "two_brands": bool(app.config.get("SHOP_SECOND_ACCOUNT_ID")),
        }

    @app.errorhandler(CSRFError)
    def _csrf_error(error: CSRFError) -> ResponseReturnValue:
        if app.config.get("SESSION_COOKIE_SECURE") and not request.is_secure:
            # The browser keeps a Secure cookie for https only: over plain http the form's session never
            # comes back, and no reload helps. Say so (the owner's login is where it shows first).
            return (
                render_template(
                    "shop/error.html",
                    code=400,
                    title="This shop needs https",
                    message=SECURE_COOKIE_OVER_HTTP,
                ),
                400,
            )
        return (
            render_template(
                "shop/error.html",
                code=400,
                title="Please try that again",
                message="The form had expired (or cookies are switched off), so nothing was changed. "
                "Go back, reload the page and submit it once more.",
            ),
            400,
        )

    @app.errorhandler(HTTPException)
    def _http_error(error: HTTPException) -> ResponseReturnValue:
        if not _ours() or error.code is None or error.code < 400:
            return error
        titles = {
            403: "You can't open this page",
            404: "Page not found",
            405: "That didn't work",
            429: "Too many attempts",
        }
        return (
            render_template(
                "shop/error.html",
                code=error.code,
                title=titles.get(error.code, error.name),
                message=error.description if error.code in (403, 404) else None,
            ),
            error.code,
        )
