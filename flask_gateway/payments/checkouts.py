"""Checkouts from the shop's own code: create one (and send the shopper to it), update it, cancel it.

Every function works in the current app context, in the extension's own database session
(``flask_gateway.state``): it commits what it writes and nothing of the shop's. Statuses change only through
:func:`flask_gateway.payments.transitions.apply`.

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
from datetime import datetime, timedelta
from typing import Final, Literal

from flask import redirect
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from werkzeug.wrappers import Response

from flask_gateway import signals
from flask_gateway.core.client import GatewayClient, V1Client, new_request_id
from flask_gateway.core.errors import (
    CheckoutExpiredError,
    ConflictError,
    FirewallRejectedError,
    GatewayError,
    InvalidResponseError,
    definite_refusal,
)
from flask_gateway.core.http import describe_validation_error
from flask_gateway.core.money import format_money
from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import (
    CHANGEABLE_STATUSES,
    PAID_STATUSES,
    CheckoutStatus,
    CreateCheckoutRequest,
    UpdateCheckoutRequest,
    V1CheckoutRequest,
)
from flask_gateway.errors import (
    CheckoutStateError,
    CheckoutUnavailableError,
    NotInstalledError,
)
from flask_gateway.models import GatewayCheckout, LocalStatus
from flask_gateway.payments.accounts import choose_account
from flask_gateway.payments.availability import is_available, payment_limits
from flask_gateway.payments.mapping import (
    check_reference,
    order_snapshot,
    v1_checkout_request,
    v2_create_request,
    v2_order_details,
)
from flask_gateway.payments.orders import OrderDraft
from flask_gateway.payments.polling import refresh
from flask_gateway.payments.transitions import Observation, apply, send_pending
from flask_gateway.signals import sender
from flask_gateway.state import get_state, leaves_no_transaction

__all__ = ["REUSE_WINDOW", "cancel_checkout", "create_checkout", "start_checkout", "update_checkout"]

log = logging.getLogger("flask_gateway.checkouts")

S = CheckoutStatus

#: A ``CREATING`` checkout is retried with its ``requestId`` only within this window: the gateway keeps
#: idempotency keys 24 hours, so after that a resend could create a second checkout.
REUSE_WINDOW: Final = timedelta(hours=23)
#: Pauses (seconds, about 8 in all) of a create that meets its own requestId in flight (409): a concurrent
#: call for the same order sent it; once that request is done the gateway replays its answer.
_IN_FLIGHT_WAITS: Final = (0.25, 0.5, 1.0, 2.0, 4.0)
#: An open checkout is handed out again (double click on "Pay") only if it stays open this much longer.
_REUSE_OPEN_MARGIN: Final = timedelta(minutes=5)


#: The first key of the advisory locks taken by :func:`_one_create_per_order` (the second: the order's hash).
_CREATE_LOCK_NAMESPACE: Final = 7_305_214


def _one_create_per_order(session: Session, account: str, reference: str) -> None:
    """Let one create for this order run at a time: until this transaction ends, a concurrent call (a double
    click on "Pay") waits, then finds this call's ``CREATING`` row and reuses it (no second checkout).

    PostgreSQL: a transaction-level advisory lock on (account, reference); rows that do not exist yet cannot
    be locked, and READ COMMITTED would let both calls see "no checkout yet". SQLite needs none: its
    ``BEGIN IMMEDIATE`` transactions already run one at a time.
    """
    connection = session.connection()
    if connection.dialect.name == "postgresql":
        key = func.hashtext(f"{account}\n{reference}")
        session.execute(select(func.pg_advisory_xact_lock(_CREATE_LOCK_NAMESPACE, key)))


def _reusable(session: Session, order: OrderDraft, version: str, account: str) -> GatewayCheckout | None:
    """A checkout this very order already has: ``CREATING`` (v2, within the window) or still open."""
    snapshot = order_snapshot(order)
    now = utcnow()
    candidates = session.scalars(
        select(GatewayCheckout)
        .where(
            GatewayCheckout.order_reference == order.reference,
            GatewayCheckout.api_version == version,
            GatewayCheckout.merchant_account_id == account,
            GatewayCheckout.total_cents == order.amount_cents,
            GatewayCheckout.status.in_([LocalStatus.CREATING.value, S.PENDING_ORDER.value]),
            GatewayCheckout.flagged.is_(False),
        )
        .order_by(GatewayCheckout.id.desc())
    ).all()
    for checkout in candidates:
        if checkout.order != snapshot:
            continue
        if checkout.status == LocalStatus.CREATING:
            # v1 has no idempotency key: resending could create a second order, so never reuse.
            if version == "v2" and checkout.created_at > now - REUSE_WINDOW:
                return checkout
        elif (
            checkout.payment_url
            and checkout.expires_at is not None
            and checkout.expires_at > now + _REUSE_OPEN_MARGIN
        ):
            return checkout
    return None


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
    state = get_state()
    session = state.session
    installation = choose_account(order, account)
    account = installation.merchant_account_id
    version = state.config.api_version
    check_reference(order, version)
    _one_create_per_order(session, account, order.reference)
    checkout = _reusable(session, order, version, account)
    if checkout is not None and checkout.status != LocalStatus.CREATING:
        commit_keeping_loaded(session)
        return checkout
    if checkout is None:
        now = utcnow()
        checkout = GatewayCheckout(
            api_version=version,
            order_reference=order.reference,
            request_id=new_request_id(),
            merchant_account_id=account,
            status=LocalStatus.CREATING.value,
            total_cents=order.amount_cents,
            paid_cents=0,
            refunded_cents=0,
            order=order_snapshot(order),
            created_at=now,
            updated_at=now,
            flagged=False,
        )
        session.add(checkout)
        session.flush()  # the id goes into the signed redirect URLs
    checkout_id, request_id = checkout.id, checkout.request_id
    try:
        body: CreateCheckoutRequest | V1CheckoutRequest = (
            v2_create_request(order, checkout_id, request_id)
            if version == "v2"
            else v1_checkout_request(order, checkout_id)
        )
    except ValidationError as exc:
        session.rollback()
        raise ValueError(
            f"order {order.reference!r} cannot be sent to the gateway: {describe_validation_error(exc)}"
        ) from None
    except BaseException:
        session.rollback()
        raise
    # The client is built first (it reads the installation): no transaction, and on SQLite no write lock,
    # stays open while the gateway answers.
    if isinstance(body, CreateCheckoutRequest):
        client = state.client(installation)
        # The requestId is safe before anything leaves. Keeping what the session holds loaded: a checkout
        # the shop was handed before (another order's, another account's) stays readable.
        commit_keeping_loaded(session)
        observation = _send_v2_create(client, checkout_id, body)
    else:
        v1_client = state.v1_client(installation)
        commit_keeping_loaded(session)
        observation = _send_v1_checkout(v1_client, checkout_id, body)
    transition = apply(session, checkout_id, observation)
    created = transition.checkout
    if transition.flagged or created.payment_url is None:
        raise InvalidResponseError(
            f"the gateway's answer to create does not fit checkout #{checkout_id}: "
            f"{transition.reason or 'no paymentUrl'}",
            operation="create",
        )
    if transition.applied and transition.before == LocalStatus.CREATING:
        signals.checkout_created.send(sender(), checkout=created, account=created.merchant_account_id)
    return created


def _refused(checkout_id: int, error: GatewayError, operation: str) -> None:
    """Mark a checkout ``FAILED`` after a definite refusal of its creation."""
    if isinstance(error, FirewallRejectedError):
        # The key first: a one-line summary (pytest's, a log line) shows the start of the message.
        error.message = (
            "GATEWAY_PUBLIC_URL: the gateway's firewall refuses redirect URLs on localhost or an IP "
            f"address; set it to the shop's public address ({error.message})"
        )
    state = get_state()
    state.session.rollback()
    apply(
        state.session,
        checkout_id,
        Observation(status=LocalStatus.FAILED.value, source="create", detail=f"{operation} refused: {error}"),
    )


def _send_v2_create(client: GatewayClient, checkout_id: int, body: CreateCheckoutRequest) -> Observation:
    waits = iter(_IN_FLIGHT_WAITS)
    while True:
        try:
            answer = client.create_checkout(body)
            break
        except ConflictError as error:
            # This requestId is still in flight: a concurrent call for the same order (a double click)
            # sent it a moment ago. Its answer is stored by the gateway and replayed to us once it is done.
            delay = next(waits, None)
            if delay is None:
                log.warning(
                    "checkout #%s: create still in flight elsewhere, kept CREATING: %s", checkout_id, error
                )
                raise
            log.info("checkout #%s: the same create is in flight; asking again in %s s", checkout_id, delay)
            client.transport.sleep(delay)
        except GatewayError as error:
            if definite_refusal(error):
                _refused(checkout_id, error, "create")
            else:
                log.warning("checkout #%s: create outcome unknown, kept CREATING: %s", checkout_id, error)
            raise
    data = answer.data
    replay = " (idempotent replay)" if answer.idempotent_replay else ""
    return Observation(
        status=str(data.checkoutPaymentStatus),
        source="create",
        token=data.checkoutToken,
        payment_url=data.paymentUrl,
        expires_at=data.expiresAt,
        total_cents=data.checkoutTotalCents,
        merchant_account_id=data.merchantAccountId,
        detail=f"created{replay}",
    )


def _send_v1_checkout(client: V1Client, checkout_id: int, body: V1CheckoutRequest) -> Observation:
    try:
        answer = client.checkout(body)
    except GatewayError as error:
        if definite_refusal(error):
            _refused(checkout_id, error, "v1 checkout")
        else:
            log.warning("checkout #%s: v1 checkout outcome unknown, kept CREATING: %s", checkout_id, error)
        raise
    return Observation(
        status=S.PENDING_ORDER.value,
        source="create",
        token=answer.data.token,
        payment_url=answer.data.redirect_to,
        expires_at=answer.data.expires_at,
        total_cents=body.order.amount,
        detail="created (v1)",
    )


@leaves_no_transaction
def start_checkout(order: OrderDraft, *, account: str | None = None) -> Response:
    """Create the checkout and answer the full-page redirect to the payment page (303 See Other).

    Return it from your checkout view. The account is chosen as :func:`create_checkout` chooses it. Raises
    :class:`CheckoutUnavailableError` when the gateway is not installed, the account is retired or the
    total is outside its minimum and maximum (hide the option with :func:`is_available`), and
    ``UnknownAccountError`` for an account that is not installed.
    """
    chosen = _chosen_account(order, account)
    if chosen is None or not is_available(order.amount_cents, account=chosen):
        symbol = get_state().config.currency_symbol
        total = format_money(order.amount_cents, symbol)
        limits = payment_limits(account=chosen) if chosen is not None else None
        why = (
            "the gateway is not installed"
            if limits is None
            else f"it is offered from {format_money(limits.minimum_cents, symbol)} to "
            f"{format_money(limits.maximum_cents, symbol)}"
        )
        raise CheckoutUnavailableError(
            f"The payment option is not available for order {order.reference!r} ({total}): {why}. "
            "Check is_available(total) (and payment_limits() for the range) before offering it."
        )
    checkout = create_checkout(order, account=chosen)
    return redirect(checkout.payment_url or "", code=303)  # create_checkout guarantees the URL


def _chosen_account(order: OrderDraft, account: str | None) -> str | None:
    """The account id :func:`choose_account` picks (the resolver asked once), None when nothing is
    installed; an unknown account (``UnknownAccountError``) or a retired one is raised as it is."""
    try:
        return choose_account(order, account).merchant_account_id
    except NotInstalledError:
        return None


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
