"""Private order links: ``/orders/view/<token>``, where the token is the order reference signed with
itsdangerous (``SECRET_KEY``). Whoever has the link sees the order; an edited or forged token is a 404."""

from __future__ import annotations

from typing import Final

from flask import current_app, url_for
from itsdangerous import BadSignature, URLSafeSerializer

__all__ = ["order_token", "order_url", "reference_from"]

_SALT: Final = "example-shop.order-link"


def _serializer() -> URLSafeSerializer:
    return URLSafeSerializer(current_app.config["SECRET_KEY"], salt=_SALT)


def order_token(reference: str) -> str:
    return str(_serializer().dumps(reference))


def order_url(reference: str, *, external: bool = False) -> str:
    return url_for("orders.show", token=order_token(reference), _external=external)


def reference_from(token: str) -> str | None:
    """The order reference in a token, or None when the token was not made by this shop."""
    try:
        value = _serializer().loads(token)
    except BadSignature:
        return None
    return value if isinstance(value, str) else None
