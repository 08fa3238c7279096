"""The cart page and its three actions: add (from a product page), change a quantity, remove a line."""

from __future__ import annotations

from flask import Blueprint, abort, flash, redirect, render_template, url_for
from flask.typing import ResponseReturnValue

from example_shop import cart as session_cart
from example_shop.brands import account_for_cart, cart_problem
from example_shop.catalog import find
from example_shop.forms import ActionForm, AddToCartForm, QuantityForm
from example_shop.payments import instalment_hint, payment_available

__all__ = ["bp"]

bp = Blueprint("cart", __name__, url_prefix="/cart")


def render_cart(status: int = 200, errors: dict[str, list[str]] | None = None) -> ResponseReturnValue:
    cart = session_cart.load()
    total = cart.total_cents
    # A cart of two brands is two merchants' money: it is not paid in one checkout (brands.py).
    problem = cart_problem(cart) if cart else None
    account = account_for_cart(cart) if cart and problem is None else None
    available = bool(cart) and problem is None and payment_available(total, account)
    return (
        render_template(
            "shop/cart.html",
            cart=cart,
            available=available,
            brand_problem=problem,
            hint=instalment_hint(total, account) if available else None,
            quantity_form=QuantityForm,
            remove_form=ActionForm(),
            line_errors=errors or {},
        ),
        status,
    )


@bp.get("")
def view() -> ResponseReturnValue:
    return render_cart()


@bp.post("/add/<slug>")
def add(slug: str) -> ResponseReturnValue:
    product = find(slug)
    if product is None:
        abort(404, description="That product is not in our catalog.")
    form = AddToCartForm()
    if not form.validate_on_submit():
        for message in form.quantity.errors or ["Please try again: the form had expired."]:
            flash(message, "error")
        return redirect(url_for("shop.product", slug=slug))
    current = session_cart.load().quantity_of(slug)
    wanted = current + form.quantity.data
    session_cart.set_quantity(slug, wanted)
    if wanted > session_cart.MAX_QUANTITY:
        flash(
            f"You can order up to {session_cart.MAX_QUANTITY} of each item: your cart now has "
            f"{session_cart.MAX_QUANTITY} x {product.name}.",
            "info",
        )
    else:
        flash(f"Added {form.quantity.data} x {product.name} to your cart.", "added")
    return redirect(url_for("shop.product", slug=slug))


@bp.post("/update")
def update() -> ResponseReturnValue:
    form = QuantityForm()
    slug = form.slug.data or ""
    product = find(slug)
    if product is None:
        abort(404, description="That product is not in our catalog.")
    if not form.validate_on_submit():
        return render_cart(400, {slug: form.quantity.errors or ["Please try again."]})
    session_cart.set_quantity(slug, form.quantity.data)
    if form.quantity.data == 0:
        flash(f"Removed {product.name} from your cart.", "success")
    else:
        flash(f"{product.name}: quantity updated to {form.quantity.data}.", "success")
    return redirect(url_for(".view"))


@bp.post("/remove/<slug>")
def remove(slug: str) -> ResponseReturnValue:
    product = find(slug)
    form = ActionForm()
    if not form.validate_on_submit():
        flash("Please try again: the form had expired.", "error")
    elif product is not None:
        session_cart.set_quantity(slug, 0)
        flash(f"Removed {product.name} from your cart.", "success")
    return redirect(url_for(".view"))
