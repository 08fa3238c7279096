"""The stored order of a checkout (``operations.order_snapshot``) as the checkout page shows it.

Plain data, no Flask; imports nothing of the package.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["OrderLineView", "OrderView"]


@dataclass(frozen=True)
class OrderLineView:
    name: str
    sku: str
    quantity: int
    unit_price_cents: int

    @property
    def total_cents(self) -> int:
        return self.quantity * self.unit_price_cents


@dataclass(frozen=True)
class OrderView:
    """The stored order (``operations.order_snapshot``) as the owner reads it; parts it cannot read are
    left out (the JSON below it on the page shows everything)."""

    lines: list[OrderLineView]
    customer: str
    contact: str
    billing: str
    shipping: str


def _order_view(order: Mapping[str, Any] | None) -> OrderView | None:
    if not isinstance(order, Mapping):
        return None
    lines = []
    for line in order.get("lines") or ():
        try:
            lines.append(
                OrderLineView(
                    name=str(line["name"]),
                    sku=str(line.get("sku") or ""),
                    quantity=int(line["quantity"]),
                    unit_price_cents=int(line["unit_price_cents"]),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    found = order.get("customer")
    customer: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    name = " ".join(str(customer.get(k) or "") for k in ("first_name", "last_name")).strip()
    contact = " · ".join(str(customer[k]) for k in ("email", "phone") if customer.get(k))
    billing = _address_text(order.get("billing_address"))
    shipping = _address_text(order.get("shipping_address"))
    if shipping and shipping == billing:
        shipping = "The billing address"
    return OrderView(lines=lines, customer=name, contact=contact, billing=billing, shipping=shipping)


def _address_text(address: Any) -> str:
    if not isinstance(address, Mapping):
        return ""
    parts = (address.get(k) for k in ("line1", "line2", "city", "province", "postal_code"))
    return ", ".join(str(part) for part in parts if part)


def _order_summary(order: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The stored order as label/value pairs, one level deep (whatever shape operations saved)."""
    if not isinstance(order, Mapping):
        return []
    return [(str(key), _text(value)) for key, value in order.items()]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, indent=1, ensure_ascii=False, default=str)
