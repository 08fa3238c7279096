"""The v1 API: configuration, checkout and refund; HTTP Basic authentication.

Configuration and checkout answers are wrapped in ``data``; the refund answer is a bare object, as the
gateway's documentation prints it.
"""

from __future__ import annotations

from flask import Blueprint, Response

from flask_gateway.core.wire import (
    V1CheckoutData,
    V1CheckoutRequest,
    V1CheckoutResponse,
    V1Configuration,
    V1ConfigurationRequest,
    V1ConfigurationResponse,
    V1PaymentPlan,
    V1RefundRefused,
    V1RefundRequest,
    V1RefundSucceeded,
)
from flask_gateway.emulator import checkouts, clock
from flask_gateway.emulator.api import (
    authenticate_v1,
    base_url,
    json_response,
    parse,
    raw_body,
    read_json,
    settings,
)
from flask_gateway.emulator.models import db
from flask_gateway.emulator.problems import ApiProblem
from flask_gateway.emulator.views.v2 import operation

__all__ = ["bp", "payment_plan"]

bp = Blueprint("emulator_v1", __name__, url_prefix="/api/v1/merchant")

INSTALMENTS = 3
#: The ``reason`` of a v1 refund that went through, as the gateway's documentation prints it.
REFUNDED_REASON = "Order successfully refunded"


def payment_plan(amount_cents: int) -> V1PaymentPlan:
    """Three instalments: ``amount`` each, the remainder (``excess``) paid with the first, due now."""
    return V1PaymentPlan(
        due_at=clock.now(), amount=amount_cents // INSTALMENTS, excess=amount_cents % INSTALMENTS
    )


@bp.post("/configuration")
@operation("v1_configuration")
def configuration() -> Response:
    """Empty body or ``customer``: the limits; ``amount``: the payment plan; both: all three."""
    account = authenticate_v1()
    request = parse(V1ConfigurationRequest, read_json() if raw_body().strip() else {})
    data = V1Configuration()
    if request.amount is None or request.customer is not None:
        data.minimum_amount, data.maximum_amount = account.minimum_cents, account.maximum_cents
    if request.amount is not None:
        data.payment_plan = payment_plan(request.amount)
    return json_response(V1ConfigurationResponse(data=data))


@bp.post("/checkout")
@operation("v1_checkout")
def checkout() -> Response:
    data = read_json()
    order = data.get("order")
    if isinstance(order, dict):
        urls = [order.get("success_callback_url"), order.get("fail_callback_url")]
        checkouts.check_firewall(urls, strict=settings().waf_strict)
    account = authenticate_v1()
    request = parse(V1CheckoutRequest, data)
    created = checkouts.create_v1(account, request)
    answer = V1CheckoutResponse(
        data=V1CheckoutData(
            token=created.token,
            expires_at=created.expires_at,
            redirect_to=checkouts.payment_url(created, base_url()),
        )
    )
    db.session.commit()
    return json_response(answer)


@bp.post("/refund")
@operation("v1_refund")
def refund() -> Response:
    account = authenticate_v1()
    request = parse(V1RefundRequest, read_json())
    try:
        refunded = checkouts.refund_v1(account, request)
    except ApiProblem as problem:
        db.session.rollback()
        return json_response(V1RefundRefused.because(problem.message), 400)
    answer = V1RefundSucceeded(
        reason=REFUNDED_REASON, refunded_at=refunded.updated_at, amount_refunded=request.amount
    )
    db.session.commit()
    return json_response(answer)
