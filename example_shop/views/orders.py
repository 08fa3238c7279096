"""The shopper's order page, reachable only by its private (signed) link, and its JSON status.

============================================  ===========================================================
``GET /orders/<reference>``                   ``GATEWAY_ORDER_ENDPOINT``: where the gateway's return page
                                              sends the shopper. 303 to the signed link when this session
                                              placed the order; 403 "use your private link" otherwise (the
                                              same for an order that does not exist: nothing leaks)
``GET /orders/view/<token>``                  the order page (404 for a forged or edited token)
``GET /orders/view/<token>/status.json``      ``{reference, status, label, final, html, cart_count}``: polled
============================================  ===========================================================
"""

from __future__ import annotations

from flask import Blueprint, abort, jsonify, redirect, render_template
from flask.typing import ResponseReturnValue
from sqlalchemy import select
from werkzeug.wrappers import Response

from example_shop import cart as session_cart
from example_shop.extensions import db
from example_shop.links import order_url, reference_from
from example_shop.models import Order, OrderStatus, sync_with_gateway

__all__ = ["bp"]

bp = Blueprint("orders", __name__, url_prefix="/orders")


@bp.after_request
def _private(response: Response) -> Response:
    # Order pages carry a private link and personal details: never cached, never sent as a Referer.
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


@bp.get("/<reference>")
def by_reference(reference: str) -> ResponseReturnValue:
    if reference in session_cart.owned_references():
        return redirect(order_url(reference), 303)
    return render_template("shop/order_link_needed.html"), 403


def _order(token: str) -> Order:
    reference = reference_from(token)
    if reference is None:
        abort(404, description="This order link is not valid. Check that you copied all of it.")
    order = db.session.scalar(select(Order).where(Order.reference == reference))
    if order is None:
        abort(404, description="This order no longer exists.")
    order = sync_with_gateway(order)
    session_cart.clear_when_paid()  # at once, so the header's count is right on this very answer
    return order


def _status_panel(order: Order) -> str:
    """The status panel (the page includes the same template): sent as ``html`` in the JSON status."""
    return render_template("shop/_order_status.html", order=order, cart=session_cart.load())


@bp.get("/view/<token>")
def show(token: str) -> ResponseReturnValue:
    order = _order(token)
    return render_template(
        "shop/order.html",
        order=order,
        token=token,
        cart=session_cart.load(),
        private_link=order_url(order.reference, external=True),
        placed_here=order.reference in session_cart.owned_references(),
    )


@bp.get("/view/<token>/status.json")
def status(token: str) -> ResponseReturnValue:
    order = _order(token)
    state = order.state
    return jsonify(
        reference=order.reference,
        status=state.value,
        label=state.label,
        final=state is not OrderStatus.PROCESSING,
        html=_status_panel(order),
        cart_count=session_cart.load().count,
    )
