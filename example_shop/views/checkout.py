"""The checkout: the shopper's details, then a full-page redirect (303) to the gateway's payment page.

Submitting the form places an order (``processing``) and calls ``operations.start_checkout``. The cart
stays in the session until the order is paid (see example_shop/cart.py). A second submit of the same cart
and details (a double click, or "Back" from the payment page) reuses the order, and the extension hands
out the same open checkout.

The second submit is recognised twice over: by the session (it remembers the order it placed), and by the
form itself, for submits sent before the first one's answer (and its session cookie) came back. The page
carries the reference its order will get (``attempt``, signed, new for each page); the first submit inserts
the order under that reference, a concurrent one meets the unique reference, waits for the first to commit
and takes that order. A changed cart or changed details never reuse an order.
"""

from __future__ import annotations

import logging

from flask import Blueprint, current_app, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from itsdangerous import BadSignature, URLSafeSerializer
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from example_shop import cart as session_cart
from example_shop.brands import BrandError, account_for_cart, cart_problem
from example_shop.cart import Cart
from example_shop.extensions import db
from example_shop.forms import CheckoutForm
from example_shop.models import (
    Order,
    OrderStatus,
    is_reference,
    latest_checkout,
    mark_closed,
    new_reference,
    record,
)
from example_shop.payments import instalment_hint, order_draft, payment_available
from example_shop.views.cart import unavailable
from flask_gateway import (
    CheckoutUnavailableError,
    GatewayError,
    NotInstalledError,
    UnknownAccountError,
    start_checkout,
    utcnow,
)

__all__ = ["bp"]

bp = Blueprint("checkout", __name__)
log = logging.getLogger("example_shop.checkout")


def _lines(cart: Cart) -> list[dict[str, object]]:
    return [
        {
            "slug": line.product.slug,
            "sku": line.product.sku,
            "name": line.product.name,
            "quantity": line.quantity,
            "unit_price_cents": line.product.price_cents,
            "image": line.product.image_path,
            "category": line.product.category,
            "tags": list(line.product.tags),
        }
        for line in cart
    ]


def _details(form: CheckoutForm) -> dict[str, object]:
    billing = form.address("billing")
    return {
        "first_name": form.first_name.data,
        "last_name": form.last_name.data,
        "email": form.email.data,
        "phone": form.phone.data,
        "billing_address": billing,
        "shipping_address": billing if form.shipping_same.data else form.address("shipping"),
    }


_ATTEMPT_SALT = "example-shop.checkout-attempt"


def _attempts() -> URLSafeSerializer:
    return URLSafeSerializer(current_app.config["SECRET_KEY"], salt=_ATTEMPT_SALT)


def _attempt_reference(value: str | None) -> str | None:
    """The order reference a checkout page was given, or None (missing, forged or edited)."""
    if not value:
        return None
    try:
        reference = _attempts().loads(value)
    except BadSignature:
        return None
    return reference if isinstance(reference, str) and is_reference(reference) else None


def _reusable(
    order: Order | None, cart: Cart, lines: list[dict[str, object]], details: dict[str, object]
) -> bool:
    """The order is still waiting for its payment, for exactly this cart and these details."""
    return (
        order is not None
        and order.status == OrderStatus.PROCESSING
        and order.paid_at is None
        and order.lines == lines
        and order.total_cents == cart.total_cents
        and all(getattr(order, key) == value for key, value in details.items())
    )


def _by_reference(reference: str) -> Order | None:
    found: Order | None = db.session.scalar(select(Order).where(Order.reference == reference))
    return found


def _place_order(cart: Cart, form: CheckoutForm) -> Order:
    """The session's waiting order or the page's order when nothing changed, else a new one."""
    lines, details = _lines(cart), _details(form)
    pending = session_cart.pending_checkout()
    if pending is not None:
        order = _by_reference(pending["reference"])
        if order is not None and _reusable(order, cart, lines, details):
            return order
    reference = _attempt_reference(form.attempt.data)
    if reference is not None:
        existing = _by_reference(reference)
        if existing is not None:
            if _reusable(existing, cart, lines, details):
                return existing
            reference = None  # that order is another cart's, or settled: a new one
    now = utcnow()
    order = Order(
        reference=reference or new_reference(),
        status=OrderStatus.PROCESSING.value,
        api_version=current_app.config.get("GATEWAY_API_VERSION", "v2"),
        lines=lines,
        subtotal_cents=cart.subtotal_cents,
        shipping_cents=cart.shipping_cents,
        total_cents=cart.total_cents,
        refunded_cents=0,
        created_at=now,
        updated_at=now,
        **details,
    )
    db.session.add(order)
    try:
        db.session.flush()
    except IntegrityError:
        # A concurrent submit of the same page placed this order first (the unique reference made this
        # insert wait for its commit): take it, when it is the same cart.
        db.session.rollback()
        if reference is None:
            raise
        existing = _by_reference(reference)
        if existing is not None and _reusable(existing, cart, lines, details):
            return existing
        form.attempt.data = ""
        return _place_order(cart, form)
    record(order.id, "placed", f"{cart.count} item(s), {order.api_version} checkout")
    db.session.commit()
    return order


def _last_order() -> Order | None:
    """The newest order this browser placed (the session remembers its references, not the details)."""
    references = session_cart.owned_references()
    if not references:
        return None
    found = db.session.scalars(select(Order).where(Order.reference.in_(references))).all()
    by_reference = {order.reference: order for order in found}
    return next((by_reference[ref] for ref in reversed(references) if ref in by_reference), None)


def _fill_from_last_order(form: CheckoutForm) -> None:
    """A second order: the details of this browser's last order, so the shopper need not type them again.

    Read from the shop's database by the references the session keeps: no personal details are stored
    in the session cookie.
    """
    last = _last_order()
    if last is None:
        return
    for name in ("first_name", "last_name", "email", "phone"):
        form[name].data = getattr(last, name)
    billing, shipping = last.billing_address, last.shipping_address
    for prefix, address in (("billing", billing), ("shipping", shipping)):
        for key in ("line1", "line2", "city", "province", "postal_code"):
            form[f"{prefix}_{key}"].data = address.get(key, "")
    form.shipping_same.data = shipping == billing
    if form.shipping_same.data:
        for key in ("line1", "line2", "city", "province", "postal_code"):
            form[f"shipping_{key}"].data = ""


def _render(
    form: CheckoutForm, cart: Cart, available: bool, status: int = 200, brand_problem: str | None = None
) -> ResponseReturnValue:
    if _attempt_reference(form.attempt.data) is None:
        form.attempt.data = _attempts().dumps(new_reference())
    return (
        render_template(
            "shop/checkout.html",
            form=form,
            cart=cart,
            available=available,
            brand_problem=brand_problem,
            hint=instalment_hint(cart.total_cents, account_for_cart(cart)) if available else None,
            unavailable=None
            if available or brand_problem
            else unavailable(cart.total_cents, account_for_cart(cart)),
            errors=form.errors_in_order(),
        ),
        status,
    )


@bp.route("/checkout", methods=["GET", "POST"])
def checkout() -> ResponseReturnValue:
    cart = session_cart.load()
    if not cart:
        flash("Your cart is empty: add something you like first.", "info")
        return redirect(url_for("cart.view"))
    # Two brands are two merchants' money: such a cart is not paid in one checkout (brands.py).
    problem = cart_problem(cart)
    available = problem is None and payment_available(cart.total_cents, account_for_cart(cart))
    form = CheckoutForm()
    if request.method == "GET":
        _fill_from_last_order(form)
        return _render(form, cart, available, brand_problem=problem)
    if not form.validate_on_submit():
        return _render(form, cart, available, 400, brand_problem=problem)
    if problem is not None:
        flash(problem, "error")
        return _render(form, cart, False, 409, brand_problem=problem)
    if not available:
        flash(
            "Paying in instalments isn't available for this order total. Change your cart and try again.",
            "error",
        )
        return _render(form, cart, available, 409)

    order = _place_order(cart, form)
    session_cart.remember_checkout(order.reference)
    try:
        response = start_checkout(order_draft(order))
    except (CheckoutUnavailableError, NotInstalledError):
        db.session.rollback()
        flash("Paying in instalments isn't available for this order right now. Nothing was charged.", "error")
        return _render(form, cart, False, 409)
    except BrandError as error:
        # The account resolver could not place the order's products (brands.py): nothing was sent.
        db.session.rollback()
        log.warning("order %s: no merchant account for its products: %s", order.reference, error)
        flash(str(error), "error")
        return _render(form, cart, False, 409, brand_problem=str(error))
    except UnknownAccountError as error:
        # The brand's merchant account is configured but not installed in this shop (yet).
        db.session.rollback()
        log.error(
            "order %s: the merchant account %r is not installed: run 'flask --app example_shop shop "
            "install' (or install it from /gateway/admin/install)",
            order.reference,
            error.account,
        )
        flash(
            "Paying in instalments isn't available for these products right now. Nothing was charged: "
            "please try again later.",
            "error",
        )
        return _render(form, cart, False, 409)
    except (GatewayError, ValueError) as error:
        db.session.rollback()
        log.warning("order %s: the checkout could not be started: %s", order.reference, error)
        checkout = latest_checkout(order.reference)
        if checkout is None or checkout.failed:
            # Refused for good: this order will never be paid; the next attempt places a new one.
            mark_closed(order.reference, OrderStatus.CANCELLED, f"the payment could not be started: {error}")
            flash(
                "The payment provider could not take this order, so nothing was charged. Please try again; "
                "if it happens again, contact us and quote the time.",
                "error",
            )
        else:
            # No answer: the order and its checkout request are kept, and a retry sends the same request.
            flash(
                "We couldn't reach the payment provider, so nothing was charged. "
                "Please try again in a moment.",
                "error",
            )
        return _render(form, cart, available, 502)
    record(order.id, "checkout", f"sent to the payment page ({order.api_version})")
    db.session.commit()
    return response
