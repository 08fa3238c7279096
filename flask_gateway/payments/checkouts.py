"""Checkouts from the shop's own code: create one (and send the shopper to it), update it, cancel it.

Every function works in the current app context, in the extension's own database session
(``flask_gateway.state``): it commits what it writes and nothing of the shop's. Statuses change only through
:func:`flask_gateway.payments.transitions.apply`. A checkout is created by
:func:`flask_gateway.payments.creation.create`, for the merchant account chosen here.

Money that moves is never left to chance: a checkout is saved (``CREATING``, with its ``requestId``) and
committed before the first request. If the answer is lost (timeout, 5xx after the retries), the row stays
``CREATING`` and calling :func:`create_checkout` again for the same order sends the same ``requestId``:
the gateway answers the checkout it created the first time (``idempotent-replay``), never a second one.

Errors: the extension's own refusals are :class:`~flask_gateway.errors.GatewayExtensionError` subclasses
(:class:`~flask_gateway.errors.InvalidOrderError`, :class:`~flask_gateway.errors.CheckoutUnavailableError`,
:class:`~flask_gateway.errors.CheckoutStateError`); everything the gateway answers (or fails to answer) is
a :class:`~flask_gateway.core.errors.GatewayError`, whose ``str()`` can be shown to the shop owner as it is.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Literal

from flask import redirect
from pydantic import ValidationError
from werkzeug.wrappers import Response

from flask_gateway.core.errors import CheckoutExpiredError, ConflictError, GatewayError
from flask_gateway.core.http import describe_validation_error
from flask_gateway.core.money import format_money
from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import (
    CHANGEABLE_STATUSES,
    PAID_STATUSES,
    CheckoutStatus,
    UpdateCheckoutRequest,
)
from flask_gateway.errors import (
    CheckoutStateError,
    CheckoutUnavailableError,
    NotInstalledError,
)
from flask_gateway.models import GatewayCheckout, Installation
from flask_gateway.payments.accounts import choose_account
from flask_gateway.payments.availability import offers
from flask_gateway.payments.creation import create
from flask_gateway.payments.mapping import order_snapshot, v2_order_details
from flask_gateway.payments.orders import OrderDraft
from flask_gateway.payments.polling import refresh
from flask_gateway.payments.transitions import Observation, apply, send_pending
from flask_gateway.state import get_state, leaves_no_transaction

__all__ = ["cancel_checkout", "create_checkout", "start_checkout", "update_checkout"]

log = logging.getLogger("flask_gateway.checkouts")

S = CheckoutStatus


@leaves_no_transaction
def create_checkout(order: OrderDraft, *, account: str | None = None) -> GatewayCheckout:
    """Create the checkout for ``order`` on the gateway (v2, or v1 with ``GATEWAY_API_VERSION="v1"``).

    The local record (``CREATING``, a fresh ``requestId``, the order, the total, the merchant account) is
    committed before the request. Then:

    - success: the answer is applied (``PENDING_ORDER``, token, ``paymentUrl``, ``expiresAt``) and
      ``checkout_created`` is sent once;
    - a definite refusal (a 4xx answer): the record becomes ``FAILED`` and the ``GatewayError`` is raised;
    - no usable answer (connection error, timeout, 5xx after the retries): the record stays ``CREATING``
      and the error is raised. Calling again with the same order sends the same ``requestId`` (v2).
    - 409, the same ``requestId`` in flight (a concurrent call for this order sent it): asked again for
      about 8 seconds, until the gateway replays that request's answer; then as "no usable answer".

    Reuse: a call for an order (same reference, total, items, customer, addresses, API version and
    account) that already has a v2 ``CREATING`` record from the last 23 hours retries that record; one
    that has an open checkout which stays open five more minutes gets it back, without a request (a
    double click on "Pay" leads to one checkout). A changed order gets a new checkout.

    The merchant account: ``account``, else the shop's resolver's answer for ``order``, else the default
    account (``payments.accounts.choose_account``); it is recorded on the checkout and never changes.

    Raises ``ValueError`` for an order the API cannot take (the message names the field),
    ``NotInstalledError`` before installation, ``UnknownAccountError`` for an account that is not
    installed, ``CheckoutUnavailableError`` for a retired one.
    """
    return create(order, choose_account(order, account))


@leaves_no_transaction
def start_checkout(order: OrderDraft, *, account: str | None = None) -> Response:
    """Create the checkout and answer the full-page redirect to the payment page (303 See Other).

    Return it from your checkout view. The account is chosen as :func:`create_checkout` chooses it. Raises
    :class:`CheckoutUnavailableError` when the gateway is not installed, the account is retired or the
    total is outside its minimum and maximum (hide the option with :func:`is_available`), and
    ``UnknownAccountError`` for an account that is not installed.
    """
    try:
        installation: Installation | None = choose_account(order, account)
    except NotInstalledError:
        installation = None
    if installation is None or not offers(installation, order.amount_cents):
        symbol = get_state().config.currency_symbol
        total = format_money(order.amount_cents, symbol)
        why = (
            "the gateway is not installed"
            if installation is None
            else f"it is offered from {format_money(installation.minimum_cents, symbol)} to "
            f"{format_money(installation.maximum_cents, symbol)}"
        )
        raise CheckoutUnavailableError(
            f"The payment option is not available for order {order.reference!r} ({total}): {why}. "
            "Check is_available(total) (and payment_limits() for the range) before offering it."
        )
    checkout = create(order, installation)
    return redirect(checkout.payment_url or "", code=303)  # create guarantees the URL


# --- update and cancel -------------------------------------------------------------------------------


def _require_v2_token(checkout: GatewayCheckout, operation: str) -> str:
    if checkout.api_version != "v2":
        raise CheckoutStateError(
            f"checkout #{checkout.id} is a v1 order: the v1 API has no {operation} operation. "
            + (
                "Create a new checkout for the changed order instead."
                if operation == "update"
                else "The shopper can still cancel on the payment page; it expires unpaid otherwise."
            )
        )
    if not checkout.token:
        raise CheckoutStateError(
            f"checkout #{checkout.id} is {checkout.status}: the gateway never confirmed creating it, so "
            f"there is nothing to {operation}."
        )
    return checkout.token


@leaves_no_transaction
def update_checkout(
    checkout: GatewayCheckout, order: OrderDraft, *, expires_at: datetime | None = None
) -> GatewayCheckout:
    """Replace the order of an open v2 checkout (the cart changed before payment).

    The same checkout (token, payment URL) carries the new items and total; a consumer-cancelled checkout
    opens again. ``expires_at`` (aware, in the future) sets the new payment window; the gateway's default
    is one hour from now. The order's reference must stay the same.

    Raises :class:`CheckoutStateError` when the checkout is not open (create a new one then); on the
    gateway's ``CheckoutExpiredError`` (403) the checkout is marked ``EXPIRED``, on a ``ConflictError``
    (409) its status is refreshed with getstatus; both are raised again.
    """
    token = _require_v2_token(checkout, "update")
    if order.reference != checkout.order_reference:
        raise ValueError(
            f"checkout #{checkout.id} is for order {checkout.order_reference!r}, not {order.reference!r}: "
            "create a new checkout for another order."
        )
    if checkout.status not in CHANGEABLE_STATUSES:
        raise CheckoutStateError(
            f"checkout #{checkout.id} is {checkout.status}: only an open checkout (PENDING_ORDER or "
            "CANCELLED_BY_CONSUMER) can be updated. Create a new checkout instead."
        )
    state = get_state()
    session = state.session
    checkout_id = checkout.id
    try:
        details = v2_order_details(order, checkout_id)
        details["expiresAt"] = expires_at
        body = UpdateCheckoutRequest.from_wire(
            {
                "checkoutToken": token,
                state.config.wire_names.order_details: details,
                "checkoutTotalCents": order.amount_cents,
                "clickTraceId": order.click_trace_id,
            }
        )
    except ValidationError as exc:
        raise ValueError(
            f"order {order.reference!r} cannot be sent to the gateway: {describe_validation_error(exc)}"
        ) from None
    client = state.client(account=checkout.merchant_account_id)
    session.commit()  # no transaction (and no SQLite write lock) held while the gateway answers
    try:
        answer = client.update_checkout(body)
    except GatewayError as error:
        _learn_after_refusal(checkout_id, error, "update")
        raise
    data = answer.data
    transition = apply(
        session,
        checkout_id,
        Observation(
            status=str(data.checkoutPaymentStatus),
            source="update",
            expires_at=data.expiresAt,
            payment_url=data.paymentUrl,
            detail=f"updated: total {order.amount_cents} cents",
        ),
        commit=False,
    )
    updated = transition.checkout
    updated.order = order_snapshot(order)
    updated.total_cents = order.amount_cents
    updated.updated_at = utcnow()
    commit_keeping_loaded(session)
    send_pending(transition)
    return updated


def _learn_after_refusal(checkout_id: int, error: GatewayError, operation: str) -> None:
    """After a 403 (expired) or 409 (wrong state) from update or cancel, bring the local status up to date."""
    state = get_state()
    if isinstance(error, CheckoutExpiredError):
        state.session.rollback()
        apply(
            state.session,
            checkout_id,
            Observation(status=S.EXPIRED.value, source=operation, detail=f"{operation} refused: {error}"),
        )
    elif isinstance(error, ConflictError):
        try:
            refresh(state.session.get_one(GatewayCheckout, checkout_id), source=operation)
        except GatewayError as second:
            log.warning("checkout #%s: status unknown after a 409 on %s: %s", checkout_id, operation, second)
            error.add_note(f"The checkout's status could not be refreshed: {second}")


@leaves_no_transaction
def cancel_checkout(checkout: GatewayCheckout, source: Literal["admin", "code"] = "code") -> GatewayCheckout:
    """Cancel an open v2 checkout on the gateway (``CANCELLED_BY_MERCHANT``); ``source`` goes on the event.

    A checkout already ``CANCELLED_BY_MERCHANT`` is returned unchanged. A paid checkout cannot be
    cancelled (refund it). When the gateway answers 409 (a lost answer to an earlier cancel, or a payment
    the shop has not heard of yet), the status is refreshed with getstatus: if the checkout turns out
    cancelled it is returned, otherwise the ``ConflictError`` is raised and the checkout shows the truth.
    """
    token = _require_v2_token(checkout, "cancel")
    if checkout.status == S.CANCELLED_BY_MERCHANT:
        return checkout
    if checkout.status not in CHANGEABLE_STATUSES:
        if checkout.status in PAID_STATUSES:
            advice = "refund it instead"
        elif checkout.status == S.PENDING_PAYMENT:
            advice = "the shopper is paying on the gateway; wait for the outcome (refund it if it is paid)"
        else:
            advice = "nothing to cancel"
        raise CheckoutStateError(f"checkout #{checkout.id} is {checkout.status}: {advice}.")
    state = get_state()
    session = state.session
    checkout_id = checkout.id
    client = state.client(account=checkout.merchant_account_id)
    session.commit()  # no transaction held while the gateway answers
    try:
        answer = client.cancel_checkout(token)
    except GatewayError as error:
        _learn_after_refusal(checkout_id, error, source)
        if isinstance(error, ConflictError):
            current = session.get_one(GatewayCheckout, checkout_id)
            if current.status == S.CANCELLED_BY_MERCHANT:
                return current
        raise
    data = answer.data
    transition = apply(
        session,
        checkout_id,
        Observation(
            status=str(data.checkoutPaymentStatus),
            source=source,
            merchant_account_id=data.merchantAccountId,
            detail="cancelled by the merchant",
        ),
    )
    return transition.checkout
