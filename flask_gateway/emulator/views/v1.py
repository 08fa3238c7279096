"""The v1 API: configuration, checkout and refund; HTTP Basic authentication; answers wrapped in ``data``."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, Response

from flask_gateway.core.timestamps import format_v1_timestamp
from flask_gateway.core.wire import V1CheckoutRequest, V1ConfigurationRequest, V1RefundRequest
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
from flask_gateway.emulator.models import Account, db
from flask_gateway.emulator.problems import ApiProblem
from flask_gateway.emulator.views.v2 import operation

__all__ = ["bp", "payment_plan"]

bp = Blueprint("emulator_v1", __name__, url_prefix="/api/v1/merchant")

INSTALMENTS = 3


def payment_plan(amount_cents: int) -> dict[str, Any]:
    """Three instalments: ``amount`` each, the remainder (``excess``) paid with the first, due now."""
    return {
        "due_at": format_v1_timestamp(clock.now()),
        "amount": amount_cents // INSTALMENTS,
        "excess": amount_cents % INSTALMENTS,
    }


def _limits(account: Account) -> dict[str, Any]:
    return {"minimum_amount": account.minimum_cents, "maximum_amount": account.maximum_cents}


@bp.post("/configuration")
@operation("v1_configuration")
def configuration() -> Response:
    """Empty body or ``customer``: the limits; ``amount``: the payment plan; both: all three."""
    account = authenticate_v1()
    request = parse(V1ConfigurationRequest, read_json() if raw_body().strip() else {})
    data: dict[str, Any] = {}
    if request.amount is None or request.customer is not None:
        data.update(_limits(account))
    if request.amount is not None:
        data["payment_plan"] = payment_plan(request.amount)
    return json_response({"data": data})


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
    answer = {
        "data": {
            "token": created.token,
            "expires_at": format_v1_timestamp(created.expires_at),
            "redirect_to": checkouts.payment_url(created, base_url()),
        }
    }
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
        return json_response(
            {"data": {"status": "FAILED", "reason": {"errors": {"code": 400, "message": problem.message}}}},
            400,
        )
    answer = {
        "data": {
            "status": "REFUNDED",
            "reason": request.reason,
            "refunded_at": format_v1_timestamp(refunded.updated_at),
            "amount_refunded": request.amount,
        }
    }
    db.session.commit()
    return json_response(answer)
