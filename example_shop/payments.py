"""What the shop hands the gateway, through the extension's public operations only.

- :func:`instalment_hint`: the gateway's own plan for an amount (``operations.payment_plan``), in words
  (``"or 3 x R 133.00"``, ``"or R 325.68 now, then 2 x R 325.66"``: the first instalment carries the cents
  that do not divide evenly, as the gateway charges it) and in cents; None when the option is not offered
  for the amount or the gateway cannot say.
- :func:`payment_available`: the payment option is shown only when this is True (``operations.is_available``:
  installed, and the total within the merchant's minimum and maximum). Both take the merchant account of
  the products' brand when the shop has two (example_shop/brands.py).
- :func:`order_draft`: the ``flask_gateway.payments.orders.OrderDraft`` of a placed order, built only from
  what the order stored, so a second "Pay" for the same order sends the very same draft (the extension then
  hands out the same open checkout instead of creating another).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from flask import current_app, has_request_context, request, url_for

from example_shop.models import Order
from flask_gateway import Address, Customer, GatewayError, OrderDraft, OrderLine, is_available, payment_plan

__all__ = ["InstalmentHint", "absolute_url", "instalment_hint", "order_draft", "payment_available"]

log = logging.getLogger("example_shop.payments")


def payment_available(total_cents: int, account: str | None = None) -> bool:
    """``account``: the merchant account of the products' brand (example_shop/brands.py); None for the
    shop's one account."""
    return is_available(total_cents, account=account)


@dataclass(frozen=True)
class InstalmentHint:
    """The gateway's plan for one amount, as the pages show it (``data-instalments`` holds the cents)."""

    text: str
    #: Every instalment in cents, first to last: what the gateway will charge.
    amounts: tuple[int, ...]


def instalment_hint(total_cents: int, account: str | None = None) -> InstalmentHint | None:
    try:
        plan = payment_plan(total_cents, account=account)
    except (GatewayError, RuntimeError) as error:  # RuntimeError: e.g. stored secrets unreadable
        log.warning("no instalment hint for %s cents: %s", total_cents, error)
        return None
    if plan is None:
        return None
    symbol = str(current_app.config.get("GATEWAY_CURRENCY_SYMBOL", "R"))
    return InstalmentHint(text=plan.describe(symbol), amounts=plan.amounts)


def absolute_url(endpoint: str, **values: Any) -> str:
    """An absolute URL on ``GATEWAY_PUBLIC_URL`` (the address the gateway and shoppers use), else on the
    address of the current request."""
    public = (current_app.config.get("GATEWAY_PUBLIC_URL") or "").rstrip("/")
    path = url_for(endpoint, **values)
    if public:
        root = request.script_root if has_request_context() else ""
        return public + path[len(root) :]
    return url_for(endpoint, _external=True, **values)


def _address(stored: dict[str, str]) -> Address:
    return Address(
        line1=stored["line1"],
        line2=stored.get("line2", ""),
        city=stored["city"],
        province=stored["province"],
        postal_code=stored["postal_code"],
    )


def order_draft(order: Order) -> OrderDraft:
    lines = tuple(
        OrderLine(
            name=line["name"],
            sku=line["sku"],
            quantity=int(line["quantity"]),
            unit_price_cents=int(line["unit_price_cents"]),
            image_url=absolute_url("static", filename=line["image"]),
            page_url=absolute_url("shop.product", slug=line["slug"]),
            search_terms=tuple(line.get("tags", ())),
            category=line.get("category"),
        )
        for line in order.lines
    )
    return OrderDraft(
        reference=order.reference,
        lines=lines,
        customer=Customer(
            first_name=order.first_name,
            last_name=order.last_name,
            email=order.email,
            phone=order.phone,
        ),
        billing_address=_address(order.billing_address),
        shipping_address=_address(order.shipping_address),
        total_cents=order.total_cents,
    )
