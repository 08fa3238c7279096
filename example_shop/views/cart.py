"""The cart page and its three actions: add (from a product page), change a quantity, remove a line."""

from __future__ import annotations

from dataclasses import dataclass

from flask import Blueprint, abort, current_app, flash, redirect, render_template, url_for
from flask.typing import ResponseReturnValue
from markupsafe import Markup

from example_shop import cart as session_cart
from example_shop.brands import account_for_cart, cart_problem
from example_shop.catalog import find
from example_shop.forms import ActionForm, AddToCartForm, QuantityForm
from example_shop.payments import instalment_hint, payment_available
from flask_gateway import PaymentLimits, format_money, payment_limits

__all__ = ["Unavailable", "bp", "unavailable"]

bp = Blueprint("cart", __name__, url_prefix="/cart")


@dataclass(frozen=True)
class Unavailable:
    """Why Pay in 3 is not offered for a total, in words (the cart's and the checkout's notice)."""

    #: Markup: each amount in ``<span class="money">`` (it never breaks between the symbol and the number).
    title: Markup
    detail: Markup
    #: The merchant's minimum and maximum, or None when the shop does not know them (not installed: the
    #: gateway did not answer the installation, or the account is not open): then no number is shown.
    limits: PaymentLimits | None


def unavailable(total_cents: int, account: str | None = None) -> Unavailable:
    """The notice for a total the payment option is not offered for: the range it is offered for
    ("Pay in 3 is available from R 50.00 to R 50 000.00") and how far the total is from it; that the
    limits are unknown when the shop has none (``flask_gateway.payment_limits`` of the cart's account)."""
    limits = payment_limits(account=account)
    if limits is None:
        return Unavailable(
            title=Markup("Pay in 3 isn't available right now."),
            detail=Markup(
                "We couldn't get our payment provider's minimum and maximum order totals yet, so we can't "
                "offer instalments at the moment. Please try again later."
            ),
            limits=None,
        )
    symbol = str(current_app.config.get("GATEWAY_CURRENCY_SYMBOL", "R"))

    def money(cents: int) -> Markup:
        return Markup('<span class="money">{}</span>').format(format_money(cents, symbol))

    title = Markup("Pay in 3 is available from {} to {}.").format(
        money(limits.minimum_cents), money(limits.maximum_cents)
    )
    if total_cents < limits.minimum_cents:
        detail = Markup("Your total is {}: add {} or more to pay in 3 interest-free instalments.").format(
            money(total_cents), money(limits.minimum_cents - total_cents)
        )
    elif total_cents > limits.maximum_cents:
        detail = Markup("Your total is {}: remove {} or more to pay in 3 interest-free instalments.").format(
            money(total_cents), money(total_cents - limits.maximum_cents)
        )
    else:
        detail = Markup("It isn't available for this order right now. Please try again later.")
    return Unavailable(title=title, detail=detail, limits=limits)


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
            unavailable=unavailable(total, account) if cart and problem is None and not available else None,
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
