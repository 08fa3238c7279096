"""The storefront: the catalog and the product pages, with the gateway's instalment hint."""

from __future__ import annotations

from flask import Blueprint, abort, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue

from example_shop import cart as session_cart
from example_shop.brands import account_for_product
from example_shop.catalog import CATEGORIES, Product, by_category, find
from example_shop.forms import AddToCartForm
from example_shop.payments import InstalmentHint, instalment_hint

__all__ = ["bp"]

bp = Blueprint("shop", __name__)


def _hint(product: Product) -> InstalmentHint | None:
    """The product's plan on its brand's merchant account."""
    return instalment_hint(product.price_cents, account_for_product(product))


@bp.get("/")
def index() -> ResponseReturnValue:
    category = request.args.get("category") or None
    if category is not None and category not in CATEGORIES:
        category = None
    products = by_category(category)
    return render_template(
        "shop/catalog.html",
        products=products,
        categories=CATEGORIES,
        category=category,
        hints={product.slug: _hint(product) for product in products},
    )


@bp.get("/favicon.ico")
def favicon() -> ResponseReturnValue:
    # Browsers ask for it whatever the page's <link rel="icon"> says.
    return redirect(url_for("static", filename="shop/favicon.svg"), 301)


@bp.get("/products/<slug>")
def product(slug: str) -> ResponseReturnValue:
    found = find(slug)
    if found is None:
        abort(404, description="We couldn't find that product. It may have sold out for good.")
    related = [p for p in by_category(found.category) if p.slug != found.slug][:3]
    return render_template(
        "shop/product.html",
        product=found,
        form=AddToCartForm(),
        hint=_hint(found),
        in_cart=session_cart.load().quantity_of(found.slug),
        related=related,
        related_hints={p.slug: _hint(p) for p in related},
    )
