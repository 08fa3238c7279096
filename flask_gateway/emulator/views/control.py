"""Control API for tests and demos (JSON): reset, accounts, clock, consumer actions, faults.

Open unless ``EMULATOR_CONTROL_TOKEN`` is set; POSTs need a JSON content type (``emulator/access.py``).
Deliveries, dead letters and e-mails have their own routes in ``views/deliveries.py``.
"""

from __future__ import annotations

from typing import Annotated, Any

from flask import Blueprint, Response
from pydantic import Field, Strict
from sqlalchemy import delete, select
from sqlalchemy.exc import IntegrityError
from werkzeug.wrappers import Response as WerkzeugResponse

from flask_gateway.core.timestamps import format_timestamp
from flask_gateway.core.wire import WireModel
from flask_gateway.emulator import checkouts, clock, consumer, delivery, faults
from flask_gateway.emulator.access import check_access
from flask_gateway.emulator.accounts import seed_accounts
from flask_gateway.emulator.api import base_url, json_response, parse, read_json, settings
from flask_gateway.emulator.models import (
    Account,
    Checkout,
    CheckoutEvent,
    ClockState,
    Delivery,
    DeliveryAttempt,
    Email,
    FaultRule,
    IdempotencyKey,
    Refund,
    db,
)

__all__ = ["bp", "describe_account"]

bp = Blueprint("emulator_control", __name__, url_prefix="/_emulator")


@bp.before_request
def _operator_only() -> WerkzeugResponse | None:
    return check_access(dashboard=False)


class AccountSpec(WireModel):
    merchantAccountId: Annotated[
        str, Strict(), Field(min_length=1, max_length=255, pattern=r"^[A-Za-z0-9_.-]+$")
    ]
    merchantAccountApiKey: Annotated[str, Strict(), Field(min_length=1, max_length=255)]
    cancelCallbacks: Annotated[bool, Strict()] = False


class ClockAdvance(WireModel):
    seconds: Annotated[float, Field(ge=0, le=10 * 365 * 24 * 3600)]


class OperatorRefund(WireModel):
    #: Omitted: everything that remains refundable.
    amountCents: Annotated[int, Strict(), Field(gt=0, le=10**12)] | None = None
    reason: Annotated[str, Strict(), Field(max_length=1000)] = ""


def describe_account(account: Account) -> dict[str, Any]:
    """An account as the control API and dashboard show it (the API key and signing key masked)."""
    return {
        "merchantAccountId": account.merchant_account_id,
        "merchantAccountApiKey": "****" + account.api_key[-4:] if len(account.api_key) > 8 else "****",
        "installed": account.installed,
        "cancelCallbacks": account.cancel_callbacks,
        "checkoutStatusCallbackUrl": account.callback_url,
        "callbackFailuresEmail": account.callback_failures_email,
        "minimumCheckoutAmountCents": account.minimum_cents,
        "maximumCheckoutAmountCents": account.maximum_cents,
    }


@bp.post("/reset")
def reset() -> Response:
    """Forget everything: checkouts, keys, deliveries, e-mails, faults, accounts (re-seeded), the clock."""
    for model in (
        DeliveryAttempt,
        Delivery,
        Refund,
        CheckoutEvent,
        Checkout,
        IdempotencyKey,
        Email,
        FaultRule,
    ):
        db.session.execute(delete(model))
    db.session.execute(delete(Account))
    db.session.execute(delete(ClockState))
    db.session.commit()
    seed_accounts(settings())
    return json_response({"reset": True})


@bp.post("/accounts")
def create_account() -> Response:
    """Issue an account (as the account manager would), or change an uninstalled one's key and flags."""
    spec = parse(AccountSpec, read_json())
    account = db.session.get(Account, spec.merchantAccountId, with_for_update=True, populate_existing=True)
    status = 200
    if account is None:
        account = Account(merchant_account_id=spec.merchantAccountId, api_key=spec.merchantAccountApiKey)
        db.session.add(account)
        status = 201
        try:
            db.session.flush()
        except IntegrityError:
            # PostgreSQL: a concurrent request created it first (a row that does not exist yet cannot be
            # locked; SQLite's BEGIN IMMEDIATE serialises the two). Change that one instead.
            db.session.rollback()
            account = db.session.get_one(
                Account, spec.merchantAccountId, with_for_update=True, populate_existing=True
            )
            status = 200
    account.api_key = spec.merchantAccountApiKey
    account.cancel_callbacks = spec.cancelCallbacks
    db.session.flush()
    body = describe_account(account)
    db.session.commit()
    return json_response(body, status)


@bp.get("/accounts")
def list_accounts() -> Response:
    accounts = db.session.scalars(select(Account).order_by(Account.merchant_account_id)).all()
    return json_response({"accounts": [describe_account(a) for a in accounts]})


def _clock_body() -> dict[str, Any]:
    return {"now": format_timestamp(clock.now()), "offsetSeconds": clock.offset()}


@bp.get("/clock")
def get_clock() -> Response:
    return json_response(_clock_body())


@bp.post("/clock/advance")
def advance_clock() -> Response:
    """Move the clock forward, then process what became due: expiries and callback attempts."""
    spec = parse(ClockAdvance, read_json())
    clock.advance(spec.seconds)
    db.session.commit()
    expired = checkouts.expire_due()
    db.session.commit()
    attempts = delivery.run_due()
    return json_response({**_clock_body(), "expired": expired, "deliveryAttempts": attempts})


def _outcome(outcome: consumer.Outcome) -> Response:
    return json_response(
        {
            "checkoutPaymentStatus": outcome.status,
            "redirectUrl": outcome.redirect_url,
            "merchantMessage": outcome.merchant_message,
        }
    )


@bp.post("/checkouts/<token>/pay")
def pay(token: str) -> Response:
    """The consumer pays (v2 and v1 tokens)."""
    return _outcome(consumer.pay(token))


@bp.post("/checkouts/<token>/refund")
def operator_refund(token: str) -> Response:
    """A refund made in the gateway's portal (v2 tokens): the merchant is not told (no callback), as the
    shop's reconciliation must find out by asking."""
    spec = parse(OperatorRefund, read_json())
    checkout = checkouts.refund_by_operator(token, spec.amountCents, spec.reason)
    body = _summary(checkout)
    db.session.commit()
    return json_response(body)


@bp.post("/checkouts/<token>/begin-payment")
def begin_payment(token: str) -> Response:
    """The consumer starts paying (v2 tokens): ``PENDING_PAYMENT``, as the real gateway reports it."""
    return _outcome(consumer.begin_payment(token))


@bp.post("/checkouts/<token>/cancel")
def consumer_cancel(token: str) -> Response:
    """The consumer cancels on the payment page (v2 and v1 tokens)."""
    return _outcome(consumer.cancel(token))


@bp.get("/checkouts")
def list_checkouts() -> Response:
    rows = db.session.scalars(select(Checkout).order_by(Checkout.id.desc()).limit(200)).all()
    return json_response({"checkouts": [_summary(c) for c in rows]})


@bp.get("/checkouts/<token>")
def checkout_detail(token: str) -> Response:
    checkout = checkouts.find(None, token)
    body = {
        **_summary(checkout),
        "status": checkouts.status_payload(checkout, base_url()).to_wire(settings().wire_names),
        "refunds": [
            {"amountCents": r.amount_cents, "reference": r.reference, "at": format_timestamp(r.at)}
            for r in checkout.refunds
        ],
        "events": [
            {"at": format_timestamp(e.at), "kind": e.kind, "detail": e.detail} for e in checkout.events
        ],
    }
    return json_response(body)


def _summary(checkout: Checkout) -> dict[str, Any]:
    return {
        "checkoutToken": checkout.token,
        "apiVersion": checkout.api_version,
        "merchantAccountId": checkout.account_id,
        "merchantOrderReference": checkout.merchant_order_reference,
        "checkoutTotalCents": checkout.total_cents,
        "refundedCents": checkout.refunded_cents,
        "checkoutPaymentStatus": checkout.status,
        "expiresAt": format_timestamp(checkout.expires_at),
    }


@bp.post("/faults")
def add_fault() -> Response:
    rule = faults.add(parse(faults.FaultSpec, read_json()))
    body = faults.describe(rule)
    db.session.commit()
    return json_response(body, 201)


@bp.get("/faults")
def list_faults() -> Response:
    rules = db.session.scalars(select(FaultRule).order_by(FaultRule.id)).all()
    return json_response({"faults": [faults.describe(r) for r in rules]})


@bp.delete("/faults")
def clear_faults() -> Response:
    removed = db.session.execute(delete(FaultRule)).rowcount  # type: ignore[attr-defined]
    db.session.commit()
    return json_response({"removed": removed})
