"""The owner's pages: login, the orders with their payment status, and one order with refund and cancel.

The gateway's own screens (install, settings, every checkout with its callbacks) are the extension's, at
``/gateway/admin/``, behind the same login (``auth.owner_only`` is the extension's admin guard).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from flask import Blueprint, abort, current_app, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from sqlalchemy import func, select
from werkzeug.wrappers import Response

from example_shop import auth, login_guard
from example_shop.extensions import db, limiter
from example_shop.forms import ActionForm, LoginForm, RefundForm
from example_shop.links import order_url
from example_shop.models import Order, OrderStatus, is_reference, latest_checkout, sync_with_gateway
from flask_gateway import (
    CHANGEABLE_STATUSES,
    CheckoutStateError,
    GatewayCheckout,
    GatewayError,
    NotInstalledError,
    RefundNotAllowedError,
    cancel_checkout,
    describe_detail,
    format_money,
    format_plain,
    refund,
    refund_state_label,
    setup_warnings,
)

__all__ = ["bp"]

bp = Blueprint("admin", __name__, url_prefix="/admin")
log = logging.getLogger("example_shop.admin")

PER_PAGE: Final = 25
#: Page numbers past this are this (an offset the database cannot take would be a 500).
MAX_PAGE: Final = 100_000


@bp.after_request
def _private(response: Response) -> Response:
    response.headers["Cache-Control"] = "no-store"
    return response


# --- login -------------------------------------------------------------------------------------------------


def _login_rate_limit() -> str:
    return str(current_app.config["SHOP_LOGIN_RATE_LIMIT"])


@bp.route("/login", methods=["GET", "POST"])
@limiter.limit(_login_rate_limit, methods=["POST"])
def login() -> ResponseReturnValue:
    form = LoginForm()
    configured = bool(current_app.config.get("SHOP_ADMIN_PASSWORD_HASH"))
    if request.method == "GET":
        if auth.is_owner():
            return redirect(auth.safe_next(request.args.get("next")))
        form.next.data = auth.safe_next(request.args.get("next"))
        return render_template("shop/admin/login.html", form=form, configured=configured)
    if form.validate_on_submit():
        address = auth.client_address()
        # Counted before the password is checked, so concurrent guesses cannot all be checked.
        verdict = login_guard.begin_attempt(address)
        if not verdict.allowed:
            minutes = max(round(verdict.wait / 60), 1)
            form.password.errors = [
                f"Too many wrong passwords: wait about {minutes} minute(s), then try again."
            ]
            page = render_template("shop/admin/login.html", form=form, configured=configured)
            return page, 429, {"Retry-After": str(int(verdict.wait) + 1)}
        if auth.check_password(form.password.data or ""):
            login_guard.record_success(address)
            auth.log_in()
            log.info("owner logged in from %s", address)
            return redirect(auth.safe_next(form.next.data), 303)
        log.warning("wrong owner password from %s", address)
        form.password.errors = [
            "That password is not right."
            if configured
            else "No owner password is set up: set SHOP_ADMIN_PASSWORD_HASH (or, in development, "
            "SHOP_ADMIN_PASSWORD) and restart the shop."
        ]
    return render_template("shop/admin/login.html", form=form, configured=configured), 400


@bp.post("/logout")
def logout() -> ResponseReturnValue:
    auth.log_out()
    flash("You are logged out.", "success")
    return redirect(url_for(".login"), 303)


# --- orders ------------------------------------------------------------------------------------------------


@bp.get("/")
@auth.owner_required
def orders() -> ResponseReturnValue:
    wanted = request.args.get("status") or None
    statuses = [s.value for s in OrderStatus]
    if wanted not in statuses:
        wanted = None
    page = min(max(request.args.get("page", 1, type=int) or 1, 1), MAX_PAGE)
    query = select(Order)
    count = select(func.count(Order.id))
    if wanted:
        query = query.where(Order.status == wanted)
        count = count.where(Order.status == wanted)
    total = db.session.scalar(count) or 0
    rows = db.session.scalars(
        query.order_by(Order.id.desc()).offset((page - 1) * PER_PAGE).limit(PER_PAGE)
    ).all()
    references = [order.reference for order in rows]
    checkouts: dict[str, GatewayCheckout] = {}
    if references:
        for checkout in db.session.scalars(
            select(GatewayCheckout)
            .where(GatewayCheckout.order_reference.in_(references))
            .order_by(GatewayCheckout.id)
        ):
            checkouts[checkout.order_reference] = checkout  # the newest wins
    counted = db.session.execute(select(Order.status, func.count(Order.id)).group_by(Order.status))
    per_status: dict[str, int] = {row[0]: row[1] for row in counted}
    return render_template(
        "shop/admin/orders.html",
        orders=rows,
        checkouts=checkouts,
        statuses=list(OrderStatus),
        wanted=wanted,
        per_status=per_status,
        page=page,
        pages=max((total + PER_PAGE - 1) // PER_PAGE, 1),
        total=total,
        setup_warnings=setup_warnings(),
    )


def _order_or_404(reference: str) -> Order:
    order = (
        db.session.scalar(select(Order).where(Order.reference == reference))
        if is_reference(reference)
        else None
    )
    if order is None:
        abort(404, description=f"There is no order {reference}.")
    return sync_with_gateway(order)


@dataclass(frozen=True)
class RefundToConfirm:
    """A refund the owner asked for, shown for confirmation before anything is sent."""

    amount_cents: int
    reason: str
    refunded_before: int
    #: Why it is shown again (the order was refunded meanwhile), else "".
    problem: str = ""


def _render_order(
    order: Order,
    refund_form: RefundForm | None = None,
    status: int = 200,
    confirm: RefundToConfirm | None = None,
) -> ResponseReturnValue:
    checkout = latest_checkout(order.reference)
    remaining = order.refundable_cents
    return (
        render_template(
            "shop/admin/order.html",
            order=order,
            checkout=checkout,
            refund_form=refund_form or RefundForm(formdata=None),
            confirm=confirm,
            action_form=ActionForm(),
            remaining=remaining,
            can_refund=checkout is not None and remaining > 0,
            can_cancel=checkout is not None
            and checkout.api_version == "v2"
            and checkout.status in CHANGEABLE_STATUSES,
            private_link=order_url(order.reference, external=True),
            plain_amount=format_plain,
        ),
        status,
    )


@bp.get("/orders/<reference>")
@auth.owner_required
def order(reference: str) -> ResponseReturnValue:
    return _render_order(_order_or_404(reference))


@bp.post("/orders/<reference>/refund")
@auth.owner_required
def refund_order(reference: str) -> ResponseReturnValue:
    """Two steps: the amount is shown for confirmation; only the confirmed submit refunds."""
    found = _order_or_404(reference)
    form = RefundForm()
    remaining = found.refundable_cents
    valid = form.validate_on_submit()
    amount = remaining if valid and form.everything.data and not form.confirmed.data else form.cents
    if valid and not form.confirmed.data and amount > remaining:
        form.amount.errors = [f"You can refund at most {format_money(remaining)} of this order."]
        valid = False
    if not valid:
        return _render_order(found, form, 400)
    reason = form.reason.data or ""
    if not form.confirmed.data:
        return _render_order(found, confirm=RefundToConfirm(amount, reason, found.refunded_cents))
    if form.refunded_before.data != found.refunded_cents:
        problem = (
            f"This order was refunded meanwhile (now {format_money(found.refunded_cents)} in all): check the "
            "amount again before confirming."
        )
        confirm = RefundToConfirm(amount, reason, found.refunded_cents, problem)
        return _render_order(found, status=409, confirm=confirm)
    checkout = latest_checkout(found.reference)
    if checkout is None:
        flash("This order has no payment to refund.", "error")
        return redirect(url_for(".order", reference=reference), 303)
    shown = format_money(amount)
    try:
        result = refund(checkout, amount, reason=reason)
    except (RefundNotAllowedError, CheckoutStateError, GatewayError, NotInstalledError) as error:
        db.session.rollback()
        log.warning("refund of %s on order %s not made: %s", shown, reference, error)
        flash(f"The refund of {shown} was not made: {error}", "error")
    else:
        if result.state == "SUCCEEDED":
            flash(f"Refunded {shown}.", "success")
        else:
            detail = describe_detail(result.error) or "see the gateway record"
            flash(
                f"The refund of {shown} is {refund_state_label(result.state).text.lower()}: {detail}.",
                "error",
            )
    return redirect(url_for(".order", reference=reference), 303)


@bp.post("/orders/<reference>/cancel")
@auth.owner_required
def cancel_order(reference: str) -> ResponseReturnValue:
    found = _order_or_404(reference)
    ActionForm().validate_on_submit()  # CSRFProtect has checked the token already
    checkout = latest_checkout(found.reference)
    if checkout is None:
        flash("This order has no checkout on the gateway to cancel.", "error")
        return redirect(url_for(".order", reference=reference), 303)
    try:
        cancel_checkout(checkout, source="admin")
    except (CheckoutStateError, GatewayError, NotInstalledError) as error:
        db.session.rollback()
        flash(f"The checkout was not cancelled: {error}", "error")
    else:
        flash("The checkout is cancelled on the gateway; the shopper can no longer pay it.", "success")
    return redirect(url_for(".order", reference=reference), 303)
