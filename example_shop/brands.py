"""Two brands, two merchant accounts (docs/example-shop.md, "Two brands, two merchant accounts").

Most of the catalog is Stoep's (``catalog.MAIN_BRAND``), sold on ``SHOP_GATEWAY_ACCOUNT``; a few products
are Vuurhout's (``catalog.SECOND_BRAND``), sold on its own merchant account when ``SHOP_SECOND_ACCOUNT`` is
set. Without it the shop has one account, and nothing here changes anything: every answer is None, the
extension's default account.

The shop registers :func:`account_for_draft` as the extension's ``@gateway.account_resolver``: a checkout
is made on the account of its products' brand. A cart that mixes the two brands is not paid in one
checkout (its money belongs to two merchants): the cart and the checkout say so and offer no payment until
the shopper checks out one brand at a time. A product whose brand has no account here (a catalog mistake)
is refused with a clear message, never a 500.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from flask import current_app

from example_shop.cart import Cart
from example_shop.catalog import MAIN_BRAND, SECOND_BRAND, Product, by_sku
from example_shop.extensions import gateway

__all__ = [
    "BrandError",
    "account_for_brand",
    "account_for_cart",
    "account_for_draft",
    "account_for_product",
    "cart_problem",
    "two_accounts",
]


class BrandError(ValueError):
    """The products cannot be paid on one merchant account of this shop; the message says why, in words
    a shopper reads."""


def two_accounts() -> bool:
    """The shop sells its second brand on a merchant account of its own (``SHOP_SECOND_ACCOUNT``)."""
    return bool(current_app.config.get("SHOP_SECOND_ACCOUNT_ID"))


def account_for_brand(brand: str) -> str | None:
    """The merchant account that sells ``brand``: None (the default account) when the shop has one."""
    config = current_app.config
    if not two_accounts():
        return None
    if brand == SECOND_BRAND:
        return str(config["SHOP_SECOND_ACCOUNT_ID"])
    if brand == MAIN_BRAND:
        return str(config["SHOP_GATEWAY_ACCOUNT"])
    raise BrandError(
        f"Products of {brand or 'an unknown brand'} can't be paid in instalments here yet. Nothing was "
        "charged: remove them from your cart to check out the rest."
    )


def account_for_product(product: Product) -> str | None:
    """The account of one product's brand (for its instalment hint); None when it has none here."""
    try:
        return account_for_brand(product.brand)
    except BrandError:
        return None


def _account_for_brands(brands: Iterable[str | None]) -> str | None:
    found = set(brands)
    if not two_accounts():
        return None
    if None in found:
        raise BrandError(
            "Your order holds a product that is no longer in our catalog, so it can't be paid here. Nothing "
            "was charged: remove it from your cart to check out the rest."
        )
    if len(found) > 1:
        raise BrandError(
            f"Your cart holds products of {' and '.join(sorted(str(b) for b in found))}, which are paid "
            "separately. Check out one brand at a time: remove the products of one of them (and add them "
            "again after this order)."
        )
    return account_for_brand(next((brand for brand in found if brand is not None), MAIN_BRAND))


def account_for_cart(cart: Cart) -> str | None:
    """The account the cart's checkout uses; :class:`BrandError` for a cart that mixes brands."""
    return _account_for_brands(line.product.brand for line in cart)


def cart_problem(cart: Cart) -> str | None:
    """Why this cart cannot be paid in one checkout (mixed brands, a brand without an account), or None."""
    try:
        account_for_cart(cart)
    except BrandError as error:
        return str(error)
    return None


@gateway.account_resolver
def account_for_draft(draft: Any) -> str | None:
    """The extension's account resolver: the account of the draft's products' brand (by their SKUs); the
    shop's own brand when there is no draft yet (a total's availability and plan). None with one account."""
    if draft is None:
        return account_for_brand(MAIN_BRAND)
    brands = []
    for line in draft.lines:
        product = by_sku(line.sku)
        brands.append(product.brand if product is not None else None)
    return _account_for_brands(brands)
