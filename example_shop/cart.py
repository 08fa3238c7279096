"""The cart, kept in the session as ``{slug: quantity}``.

It stays in the session until the order it was checked out into is paid: a cancelled or expired payment
leaves it as it was ("Your cart is still here"). The shopper's session cannot be changed by the gateway's
callback, so the cart is emptied on the shopper's next request after the payment is confirmed, and only if
it is still exactly what was checked out (items added afterwards are kept, all of them).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

from flask import session
from sqlalchemy import select

from example_shop.catalog import Product, find
from example_shop.extensions import db
from example_shop.models import Order

__all__ = [
    "MAX_QUANTITY",
    "Cart",
    "CartLine",
    "clear_when_paid",
    "load",
    "owned_references",
    "remember_checkout",
    "set_quantity",
]

MAX_QUANTITY: Final = 10
_CART: Final = "cart"
_CHECKOUT: Final = "checkout"
_ORDERS: Final = "orders"
_ORDERS_KEPT: Final = 20


@dataclass(frozen=True)
class CartLine:
    product: Product
    quantity: int

    @property
    def total_cents(self) -> int:
        return self.product.price_cents * self.quantity


@dataclass(frozen=True)
class Cart:
    lines: tuple[CartLine, ...]

    def __iter__(self) -> Iterator[CartLine]:
        return iter(self.lines)

    def __bool__(self) -> bool:
        return bool(self.lines)

    @property
    def count(self) -> int:
        return sum(line.quantity for line in self.lines)

    @property
    def subtotal_cents(self) -> int:
        return sum(line.total_cents for line in self.lines)

    @property
    def shipping_cents(self) -> int:
        return 0  # free delivery, so the total is what the gateway's limits are checked against

    @property
    def total_cents(self) -> int:
        return self.subtotal_cents + self.shipping_cents

    def quantity_of(self, slug: str) -> int:
        return next((line.quantity for line in self.lines if line.product.slug == slug), 0)


def _raw() -> dict[str, int]:
    stored = session.get(_CART)
    if not isinstance(stored, dict):
        return {}
    return {
        slug: quantity
        for slug, quantity in stored.items()
        if isinstance(slug, str) and isinstance(quantity, int) and not isinstance(quantity, bool)
    }


def load() -> Cart:
    """The session's cart; products no longer in the catalog are left out."""
    lines = []
    for slug, quantity in _raw().items():
        product = find(slug)
        if product is not None and quantity > 0:
            lines.append(CartLine(product, min(quantity, MAX_QUANTITY)))
    return Cart(tuple(lines))


def set_quantity(slug: str, quantity: int) -> None:
    """Set a line's quantity (0 removes it); at most :data:`MAX_QUANTITY`."""
    cart = _raw()
    if quantity <= 0:
        cart.pop(slug, None)
    else:
        cart[slug] = min(quantity, MAX_QUANTITY)
    session[_CART] = cart


def _fingerprint(cart: dict[str, int]) -> str:
    return hashlib.sha256(json.dumps(cart, sort_keys=True).encode()).hexdigest()[:16]


def remember_checkout(reference: str) -> None:
    """The session placed this order with its current cart: it may open the order, and the cart is
    emptied once this order is paid (unless it changed meanwhile)."""
    session[_CHECKOUT] = {"reference": reference, "cart": _fingerprint(_raw())}
    owned = [ref for ref in owned_references() if ref != reference]
    session[_ORDERS] = [*owned, reference][-_ORDERS_KEPT:]


def owned_references() -> list[str]:
    stored = session.get(_ORDERS)
    return [ref for ref in stored if isinstance(ref, str)] if isinstance(stored, list) else []


def pending_checkout() -> dict[str, Any] | None:
    stored = session.get(_CHECKOUT)
    return stored if isinstance(stored, dict) and isinstance(stored.get("reference"), str) else None


def clear_when_paid() -> None:
    """Run before the shopper's requests: empty the cart once the order it became is paid.

    One indexed query, and only while the session has an order waiting for its payment.
    """
    pending = pending_checkout()
    if pending is None:
        return
    paid_at = db.session.scalar(select(Order.paid_at).where(Order.reference == pending["reference"]))
    db.session.commit()  # end the read at once (SQLite: every transaction holds the write lock)
    if paid_at is None:
        return
    if pending.get("cart") == _fingerprint(_raw()):
        session.pop(_CART, None)
    session.pop(_CHECKOUT, None)
