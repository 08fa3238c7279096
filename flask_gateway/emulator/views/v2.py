"""The v2 API: installation, settings, and the checkout operations."""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Callable
from contextlib import nullcontext
from functools import wraps
from typing import Any, TypeVar

from flask import Blueprint, Response

from flask_gateway.core.sql import sqlite_read_transactions
from flask_gateway.core.wire import (
    CancelCheckoutRequest,
    CreateCheckoutRequest,
    GetStatusRequest,
    InstallRequest,
    InstallResponse,
    RefundRequest,
    SettingsResponse,
    SettingsUpdateRequest,
    UpdateCheckoutRequest,
)
from flask_gateway.core.wire.names import spellings
from flask_gateway.emulator import checkouts, clock, faults
from flask_gateway.emulator.api import (
    authenticate_v2,
    base_url,
    json_response,
    parse,
    raw_body,
    read_json,
    settings,
)
from flask_gateway.emulator.idempotency import run_idempotent
from flask_gateway.emulator.models import Account, db
from flask_gateway.emulator.problems import ApiProblem

__all__ = ["bp", "new_signing_key", "operation"]

bp = Blueprint("emulator_v2", __name__)

F = TypeVar("F", bound=Callable[..., Response])


def operation(name: str, *, reads: bool = False) -> Callable[[F], F]:
    """Mark a route as API operation ``name``: injected ``status``/``delay`` faults apply before it runs.

    ``reads``: the operation only reads, as a rule (getstatus): on SQLite its transactions begin DEFERRED
    and take no write lock; whatever writes in it after all (a fault's use, an expiry) calls
    ``begin_writing`` first (``faults.take`` and ``checkouts.find(for_update=True)`` do).
    """

    def decorate(view: F) -> F:
        @wraps(view)
        def wrapper(*args: Any, **kwargs: Any) -> Response:
            with sqlite_read_transactions() if reads else nullcontext():
                faults.before_operation(name)
                return view(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def new_signing_key() -> str:
    """A fresh signing key: a random UUID, as the gateway issues them (its installation example)."""
    return str(uuid.uuid4())


def _redirect_urls(data: dict[str, Any]) -> list[object]:
    """The redirect URLs of a create or update body, before it is validated (the firewall runs first)."""
    details = next((data[name] for name in spellings("order_details") if name in data), None)
    if not isinstance(details, dict):
        return []
    return [details.get("confirmRedirectUrl"), details.get("cancelRedirectUrl")]


def _after_commit(name: str, response: Response) -> Response:
    if faults.take_drop(name):
        faults.drop_connection()
    return response


@bp.post("/install/v2")
@operation("install")
def install() -> Response:
    """Register the settings once per account; answers the generated ``secretSigningKey``."""
    request = parse(InstallRequest, read_json())
    account = db.session.get(Account, request.merchantAccountId, with_for_update=True, populate_existing=True)
    if account is None or not secrets.compare_digest(
        account.api_key.encode(), request.merchantAccountApiKey.get_secret_value().encode()
    ):
        raise ApiProblem(401, "Unknown merchantAccountId or wrong merchantAccountApiKey.")
    if account.installed:
        raise ApiProblem(
            403,
            "This merchant account is already installed. Use the signing key you received then, "
            "or rotate settings with PATCH /install/v2.",
        )
    account.installed_at = clock.now()
    account.signing_key = new_signing_key()
    account.callback_url = request.checkoutStatusCallbackUrl
    account.callback_failures_email = request.callbackFailuresEmail
    account.minimum_cents = request.minimumCheckoutAmountCents
    account.maximum_cents = request.maximumCheckoutAmountCents
    answer = InstallResponse.model_validate({"secretSigningKey": account.signing_key})
    db.session.commit()
    return json_response(answer)


@bp.patch("/install/v2")
@operation("settings")
def update_settings() -> Response:
    """Change any of the four settings (signed); answers them with the ``signingKey``."""
    data = read_json()
    account = authenticate_v2()
    request = parse(SettingsUpdateRequest, data)
    # Taken before the row lock (taking a rule commits); verified with the key the account had.
    new_key = faults.take_new_signing_key()
    # Re-read under the lock (authenticate_v2 read the row before it was locked).
    account = (
        db.session.get(Account, account.merchant_account_id, with_for_update=True, populate_existing=True)
        or account
    )
    changed = request.model_fields_set
    minimum = request.minimumCheckoutAmountCents if "minimumCheckoutAmountCents" in changed else None
    maximum = request.maximumCheckoutAmountCents if "maximumCheckoutAmountCents" in changed else None
    new_min = minimum if minimum is not None else account.minimum_cents
    new_max = maximum if maximum is not None else account.maximum_cents
    if new_min > new_max:
        raise ApiProblem(
            400,
            "The minimum would be above the maximum.",
            errors=[{"field": "minimumCheckoutAmountCents", "message": f"must not exceed {new_max}"}],
        )
    if "checkoutStatusCallbackUrl" in changed and request.checkoutStatusCallbackUrl:
        account.callback_url = request.checkoutStatusCallbackUrl
    if "callbackFailuresEmail" in changed:
        account.callback_failures_email = request.callbackFailuresEmail
    account.minimum_cents, account.maximum_cents = new_min, new_max
    if new_key:
        account.signing_key = new_signing_key()
    answer = SettingsResponse.model_validate(
        {
            "checkoutStatusCallbackUrl": account.callback_url,
            "callbackFailuresEmail": account.callback_failures_email,
            "minimumCheckoutAmountCents": account.minimum_cents,
            "maximumCheckoutAmountCents": account.maximum_cents,
            "signingKey": account.signing_key,
        }
    )
    db.session.commit()
    return json_response(answer)


@bp.post("/v2/create")
@operation("create")
def create() -> Response:
    data = read_json()
    checkouts.check_firewall(_redirect_urls(data), strict=settings().waf_strict)
    account = authenticate_v2()
    request = parse(CreateCheckoutRequest, data)

    def work() -> Response:
        checkout = checkouts.create(account, request)
        return json_response(checkouts.checkout_response(checkout, base_url()))

    response = run_idempotent(account.merchant_account_id, "create", request.requestId, raw_body(), work)
    return _after_commit("create", response)


@bp.post("/v2/update")
@operation("update")
def update() -> Response:
    data = read_json()
    checkouts.check_firewall(_redirect_urls(data), strict=settings().waf_strict)
    account = authenticate_v2()
    request = parse(UpdateCheckoutRequest, data)
    checkout = checkouts.update(account, request)
    answer = checkouts.checkout_response(checkout, base_url())
    db.session.commit()
    return json_response(answer)


@bp.post("/v2/cancel")
@operation("cancel")
def cancel() -> Response:
    data = read_json()
    account = authenticate_v2()
    request = parse(CancelCheckoutRequest, data)
    checkout = checkouts.cancel(account, request.checkoutToken)
    answer = checkouts.checkout_response(checkout, base_url(), reduced=True)
    db.session.commit()
    return json_response(answer)


@bp.post("/v2/getstatus")
@operation("getstatus", reads=True)
def getstatus() -> Response:
    data = read_json()
    account = authenticate_v2()
    request = parse(GetStatusRequest, data)
    checkout = checkouts.snapshot(account.merchant_account_id, request.checkoutToken)
    if checkouts.needs_expiry(checkout):
        checkout = checkouts.lock(account.merchant_account_id, request.checkoutToken)
        db.session.commit()
    return json_response(checkouts.status_payload(checkout, base_url()))


@bp.post("/v2/refund")
@operation("refund")
def refund() -> Response:
    data = read_json()
    account = authenticate_v2()
    request = parse(RefundRequest, data)

    def work() -> Response:
        return json_response(checkouts.refund(account, request))

    response = run_idempotent(account.merchant_account_id, "refund", request.requestId, raw_body(), work)
    return _after_commit("refund", response)
