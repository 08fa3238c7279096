"""What a shop does with the gateway from its own code: checkouts, the payment option, refunds, cancel.

Every function works in the current app context, on the app's Flask-SQLAlchemy session, and commits it
(your own pending changes in that session are committed with ours). Statuses change only through
:func:`flask_gateway.transitions.apply`.

Money that moves is never left to chance:

- A checkout is saved (``CREATING``, with its ``requestId``) and committed before the first request. If
  the answer is lost (timeout, 5xx after the retries), the row stays ``CREATING`` and calling
  :func:`create_checkout` again for the same order sends the same ``requestId``: the gateway answers the
  checkout it created the first time (``idempotent-replay``), never a second one.
- A refund is saved (``PENDING``, with its ``requestId``) and committed before the first request; a retry
  (:func:`retry_refund`, or :func:`refund` again with the same amount) sends the same ``requestId``.

Errors: local checks raise ``ValueError`` subclasses (:class:`CheckoutUnavailableError`,
:class:`CheckoutStateError`, :class:`RefundNotAllowedError`); everything the gateway answers (or fails to
answer) is a :class:`flask_gateway.core.errors.GatewayError`, whose ``str()`` can be shown to the shop
owner as it is.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal

from flask import Flask, current_app, has_request_context, redirect, request
from pydantic import ValidationError
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from werkzeug.wrappers import Response

from flask_gateway import signals
from flask_gateway.config import ConfigurationError
from flask_gateway.core.client import GatewayClient, V1Client, new_request_id
from flask_gateway.core.errors import (
    ConflictError,
    FirewallRejectedError,
    GatewayError,
    IdempotencyError,
    InvalidResponseError,
    RateLimitError,
)
from flask_gateway.core.http import describe_validation_error
from flask_gateway.core.money import format_money
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import (
    CHANGEABLE_STATUSES,
    PAID_STATUSES,
    CheckoutStatus,
    CreateCheckoutRequest,
    RefundRequest,
    UpdateCheckoutRequest,
    V1CheckoutRequest,
    V1RefundRequest,
    V1RefundType,
)
from flask_gateway.extension import get_state
from flask_gateway.models import REFERENCE_LENGTH, GatewayCheckout, LocalStatus, RefundRecord, RefundState
from flask_gateway.orders import Address, OrderDraft
from flask_gateway.transitions import Observation, apply, lock, send_pending
from flask_gateway.urls import return_url, v1_outcome_url

__all__ = [
    "PLAN_CACHE_SECONDS",
    "REUSE_WINDOW",
    "CheckoutStateError",
    "CheckoutUnavailableError",
    "PaymentPlan",
    "RefundDeclinedError",
    "RefundNotAllowedError",
    "cancel_checkout",
    "clear_payment_plan_cache",
    "create_checkout",
    "format_instalment_hint",
    "is_available",
    "order_snapshot",
    "payment_plan",
    "refund",
    "retry_refund",
    "start_checkout",
    "update_checkout",
]

log = logging.getLogger("flask_gateway.operations")

S = CheckoutStatus

#: A ``CREATING`` checkout is retried with its ``requestId`` only within this window: the gateway keeps
#: idempotency keys 24 hours, so after that a resend could create a second checkout.
REUSE_WINDOW: Final = timedelta(hours=23)
#: Pauses (seconds, about 8 in all) of a create that meets its own requestId in flight (409): a concurrent
#: call for the same order sent it; once that request is done the gateway replays its answer.
_IN_FLIGHT_WAITS: Final = (0.25, 0.5, 1.0, 2.0, 4.0)
#: An open checkout is handed out again (double click on "Pay") only if it stays open this much longer.
_REUSE_OPEN_MARGIN: Final = timedelta(minutes=5)
#: How long a payment plan answer is kept per process, and how long a failure is (so a gateway outage
#: does not cost every product page a timeout).
PLAN_CACHE_SECONDS: Final = 300.0
_PLAN_ERROR_CACHE_SECONDS: Final = 30.0
_PLAN_CACHE_MAX: Final = 1024
_INSTALMENTS: Final = 3
#: ``refundDescription`` (v2) and the v1 refund ``reason``.
_REFUND_REASON_MAX: Final = 1000
_REFUNDABLE: Final = frozenset({S.PAID.value, S.PAID_PENDING_CALLBACK.value, S.PARTIALLY_REFUNDED.value})


class CheckoutUnavailableError(ValueError):
    """The gateway cannot be offered for this order (not installed, or the total is outside the limits)."""


class CheckoutStateError(ValueError):
    """The checkout's status (or API version) does not allow the operation; the message says what to do."""


class RefundNotAllowedError(ValueError):
    """A refund refused before anything was sent: wrong amount, not paid, or nothing left to refund."""


class RefundDeclinedError(GatewayError):
    """The gateway refused the refund. ``refund`` (a ``RefundRecord``) is marked ``FAILED`` with its reason.

    ``str()`` names the amount and the gateway's own message; show it to the shop owner.
    """

    def __init__(self, message: str, *, refund: RefundRecord, cause: GatewayError) -> None:
        super().__init__(
            message,
            http_status=cause.http_status,
            body=cause.body,
            headers=cause.headers,
            operation=cause.operation,
        )
        self.refund = refund
        self.cause = cause


def _app() -> Flask:
    """The real app object: the sender of every signal."""
    app: Flask = current_app._get_current_object()  # type: ignore[attr-defined]
    return app


# --- the order ------------------------------------------------------------------------------------------


def order_snapshot(order: OrderDraft) -> dict[str, Any]:
    """The order as stored on the checkout (JSON-ready; tuples become lists)."""
    data: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(order)))
    return data


def _public_base() -> str:
    """The shop's external base URL, for item URLs the shop left empty."""
    public = get_state().config.public_url
    if public:
        return public + "/"
    if has_request_context():
        return request.url_root
    raise ConfigurationError(
        "An order line has no image_url or page_url and GATEWAY_PUBLIC_URL is not set: set "
        "GATEWAY_PUBLIC_URL to the shop's external address (e.g. https://shop.example) or give every "
        "line absolute URLs."
    )


def _address(address: Address | None) -> dict[str, Any] | None:
    if address is None:
        return None
    return {
        "addressLine1": address.line1,
        "addressLine2": address.line2 or None,
        "city": address.city,
        "province": address.province,
        "postalCode": address.postal_code,
    }


def _v2_order_details(order: OrderDraft, checkout_id: int) -> dict[str, Any]:
    """The order details create and update share, as plain data: the request model validates them (so an
    error names the full path as the wire spells it, e.g. ``payjustnow.customer.email``)."""
    fallback = ""
    if any(not line.image_url or not line.page_url for line in order.lines):
        fallback = _public_base()
    customer = order.customer
    details: dict[str, Any] = {
        "merchantOrderReference": order.reference,
        "orderAmountCents": order.lines_total_cents,
        "orderItems": [
            {
                "name": line.name,
                "sku": line.sku,
                "quantity": line.quantity,
                "priceCents": line.unit_price_cents,
                "imageUrl": line.image_url or fallback,
                "pageUrl": line.page_url or fallback,
                "searchTerms": list(line.search_terms),
                "category": line.category,
            }
            for line in order.lines
        ],
        "confirmRedirectUrl": return_url(checkout_id, "confirm"),
        "cancelRedirectUrl": return_url(checkout_id, "cancel"),
        "billingAddress": _address(order.billing_address),
        "shippingAddress": _address(order.shipping_address),
    }
    if customer is not None:
        details["customer"] = {
            "firstName": customer.first_name,
            "lastName": customer.last_name,
            "email": customer.email,
            "phoneNumber": customer.phone or None,
        }
    return details


def _v2_create_request(order: OrderDraft, checkout_id: int, request_id: str) -> CreateCheckoutRequest:
    config = get_state().config
    details = _v2_order_details(order, checkout_id)
    details["orderExpiryMinutes"] = config.order_expiry_minutes
    return CreateCheckoutRequest.from_wire(
        {
            "requestId": request_id,
            config.wire_names.order_details: details,
            "checkoutTotalCents": order.amount_cents,
            "clickTraceId": order.click_trace_id,
        }
    )


def _v1_checkout_request(order: OrderDraft, checkout_id: int) -> V1CheckoutRequest:
    customer = order.customer
    if customer is None or not customer.phone:
        raise ValueError(
            f"order {order.reference!r}: the v1 API needs the customer with a mobile number (E.164, e.g. "
            "+27821234567, as the gateway's documentation shows it); set OrderDraft.customer.phone."
        )
    address = order.billing_address or order.shipping_address
    if address is None:
        raise ValueError(f"order {order.reference!r}: the v1 API needs the customer's address.")
    minutes = get_state().config.order_expiry_minutes
    items = [
        {
            "merchant_reference": line.sku,
            "quantity": line.quantity,
            "description": line.name,
            "unit_price": line.unit_price_cents,
        }
        for line in order.lines
    ]
    return V1CheckoutRequest.from_wire(
        {
            "customer": {
                "first_name": customer.first_name,
                "last_name": customer.last_name,
                "email": customer.email,
                "mobile_number": customer.phone,
                "address": {
                    "address_line_1": address.line1,
                    "address_line_2": address.line2 or None,
                    "city": address.city,
                    "province": address.province,
                    # As text: "0181" keeps its leading zero (the gateway reads text or a number).
                    "postal_code": address.postal_code.strip(),
                },
            },
            "order": {
                "amount": order.amount_cents,
                "merchant_reference": order.reference,
                "success_callback_url": v1_outcome_url(checkout_id, "v1-success"),
                "fail_callback_url": v1_outcome_url(checkout_id, "v1-fail"),
                "expires_at": utcnow().replace(microsecond=0) + timedelta(minutes=minutes),
                "items": {str(number): item for number, item in enumerate(items, start=1)},
            },
        }
    )


# --- checkout creation -------------------------------------------------------------------------------


def _definite_refusal(error: GatewayError, *, conflict_refuses: bool = False) -> bool:
    """The gateway surely did not act: a 4xx answer other than 422 and 429, and 409 only when
    ``conflict_refuses``.

    A 409 on create can only mean "the same requestId is still in flight" (the first attempt may yet
    succeed); on a refund it is mostly the refusal itself (wrong status, more than what is left).
    """
    status = error.http_status
    if status is None or not 400 <= status < 500:
        return False
    if isinstance(error, ConflictError):
        return conflict_refuses
    return not isinstance(error, IdempotencyError | RateLimitError)


def _check_reference(order: OrderDraft, version: str) -> None:
    """Refuse a reference the gateway would refuse, before the row is written: PostgreSQL refuses one over
    the column's length, or with U+0000, outright (SQLite would store it and the request fail later)."""
    names = get_state().config.wire_names
    field = f"{names.order_details}.merchantOrderReference" if version == "v2" else "order.merchant_reference"
    problem = None
    if len(order.reference) > REFERENCE_LENGTH:
        problem = f"String should have at most {REFERENCE_LENGTH} characters"
    elif "\x00" in order.reference:
        problem = "must not contain U+0000"
    if problem is not None:
        raise ValueError(f"order {order.reference!r} cannot be sent to the gateway: {field}: {problem}")


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


def create_checkout(order: OrderDraft) -> GatewayCheckout:
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

    Raises ``ValueError`` for an order the API cannot take (the message names the field),
    ``NotInstalledError`` before installation.
    """
    state = get_state()
    session = state.session
    installation = state.require_installation()
    account = installation.merchant_account_id
    version = state.config.api_version
    _check_reference(order, version)
    _one_create_per_order(session, account, order.reference)
    checkout = _reusable(session, order, version, account)
    if checkout is not None and checkout.status != LocalStatus.CREATING:
        session.commit()
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
            _v2_create_request(order, checkout_id, request_id)
            if version == "v2"
            else _v1_checkout_request(order, checkout_id)
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
        session.commit()  # the requestId is safe before anything leaves
        observation = _send_v2_create(client, checkout_id, body)
    else:
        v1_client = state.v1_client(installation)
        session.commit()
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
        signals.checkout_created.send(_app(), checkout=created)
    return created


def _refused(checkout_id: int, error: GatewayError, operation: str) -> None:
    """Mark a checkout ``FAILED`` after a definite refusal of its creation."""
    if isinstance(error, FirewallRejectedError):
        error.add_note(
            "The gateway's firewall refuses redirect URLs on localhost or an IP address: set "
            "GATEWAY_PUBLIC_URL to the shop's public address."
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
            if _definite_refusal(error):
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
        if _definite_refusal(error):
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


def start_checkout(order: OrderDraft) -> Response:
    """Create the checkout and answer the full-page redirect to the payment page (303 See Other).

    Return it from your checkout view. Raises :class:`CheckoutUnavailableError` when the gateway is not
    installed or the total is outside the merchant's limits (hide the option with :func:`is_available`).
    """
    if not is_available(order.amount_cents):
        raise CheckoutUnavailableError(
            f"The payment option is not available for order {order.reference!r} "
            f"({order.amount_cents} cents): the gateway is not installed or the total is outside the "
            "merchant's minimum and maximum. Check is_available(total) before offering it."
        )
    checkout = create_checkout(order)
    return redirect(checkout.payment_url or "", code=303)  # create_checkout guarantees the URL


# --- availability and the payment plan ----------------------------------------------------------------


def is_available(total_cents: int) -> bool:
    """True when the gateway is installed and ``total_cents`` is within the stored minimum and maximum."""
    if isinstance(total_cents, bool) or not isinstance(total_cents, int):
        return False
    installation = get_state().installation()
    if installation is None:
        return False
    return installation.minimum_cents <= total_cents <= installation.maximum_cents


@dataclass(frozen=True)
class PaymentLimits:
    """The merchant's installed limits: the payment option is offered for totals within them."""

    minimum_cents: int
    maximum_cents: int


def payment_limits() -> PaymentLimits | None:
    """The installed minimum and maximum, or None when the gateway is not installed yet."""
    installation = get_state().installation()
    if installation is None:
        return None
    return PaymentLimits(minimum_cents=installation.minimum_cents, maximum_cents=installation.maximum_cents)


@dataclass(frozen=True)
class PaymentPlan:
    """The gateway's plan for an amount: ``instalments`` payments of ``instalment_cents``.

    The remainder (``excess_cents``) is paid with the first instalment, due at ``first_due_at``.
    """

    total_cents: int
    instalments: int
    instalment_cents: int
    excess_cents: int
    first_due_at: datetime

    @property
    def first_instalment_cents(self) -> int:
        return self.instalment_cents + self.excess_cents

    @property
    def amounts(self) -> tuple[int, ...]:
        """Every instalment in cents, first to last, as the gateway charges them: they add up to the total."""
        return (self.first_instalment_cents, *(self.instalment_cents,) * (self.instalments - 1))

    def describe(self, symbol: str = "R") -> str:
        """The hint for product and cart pages, the amounts exactly as the gateway charges them:
        ``"or 3 x R 133.00"``, or ``"or R 325.68 now, then 2 x R 325.66"`` when the first instalment carries
        the cents that do not divide evenly."""
        each = format_money(self.instalment_cents, symbol)
        if self.excess_cents == 0:
            return f"or {self.instalments} x {each}"
        first = format_money(self.first_instalment_cents, symbol)
        return f"or {first} now, then {self.instalments - 1} x {each}"


_plan_cache: dict[tuple[str, str, int], tuple[float, PaymentPlan | None]] = {}
_plan_lock = threading.Lock()


def clear_payment_plan_cache() -> None:
    """Forget every cached payment plan (tests; after changing the merchant account)."""
    with _plan_lock:
        _plan_cache.clear()


def payment_plan(total_cents: int) -> PaymentPlan | None:
    """The v1 configuration's payment plan for ``total_cents``, or None.

    None when the option is not available for the amount (:func:`is_available`) or the gateway could not
    be asked: the hint is then left out rather than guessed. Answers are cached per process for
    :data:`PLAN_CACHE_SECONDS` per amount, failures for 30 seconds.
    """
    if not is_available(total_cents):
        return None
    state = get_state()
    installation = state.require_installation()
    key = (state.config.v1_base_url, installation.merchant_account_id, total_cents)
    now = time.monotonic()
    with _plan_lock:
        cached = _plan_cache.get(key)
    if cached is not None and cached[0] > now:
        return cached[1]
    plan: PaymentPlan | None = None
    lifetime = _PLAN_ERROR_CACHE_SECONDS
    client = state.v1_client(installation)
    # Never wait on the network inside a transaction (on SQLite it holds the write lock).
    state.session.commit()
    if not _plan_lookup_allowed():
        return None  # not cached: the hint comes back once the visitor's window ends
    try:
        answer = client.configuration(amount=total_cents).data.payment_plan
    except GatewayError as error:
        log.warning("payment plan for %s cents unavailable: %s", total_cents, error)
    else:
        if answer is None or answer.amount is None or answer.due_at is None:
            log.warning("the v1 configuration answered no usable payment_plan for %s cents", total_cents)
        else:
            plan = PaymentPlan(
                total_cents=total_cents,
                instalments=_INSTALMENTS,
                instalment_cents=answer.amount,
                excess_cents=answer.excess or 0,
                first_due_at=answer.due_at,
            )
            lifetime = PLAN_CACHE_SECONDS
    with _plan_lock:
        if len(_plan_cache) >= _PLAN_CACHE_MAX:
            for stale in [k for k, (until, _) in _plan_cache.items() if until <= now]:
                del _plan_cache[stale]
            if len(_plan_cache) >= _PLAN_CACHE_MAX:
                _plan_cache.clear()
        _plan_cache[key] = (now + lifetime, plan)
    return plan


def _plan_lookup_allowed() -> bool:
    """One more authenticated gateway call for this visitor (``GATEWAY_PLAN_RATE_LIMIT`` per address)?

    Every new cart total costs a v1 configuration call: an anonymous visitor varying quantities must not
    turn the shop into a client of the gateway on his behalf."""
    limit = get_state().plan_limit
    if limit is None or not has_request_context():
        return True
    client = request.remote_addr or "unknown"
    if limit.retry_after(client) is not None:
        log.info("payment plan lookups of %s over GATEWAY_PLAN_RATE_LIMIT: hint left out", client)
        return False
    limit.hit(client)
    return True


def _money(cents: int) -> str:
    """``R 1 234.00``, with ``GATEWAY_CURRENCY_SYMBOL``."""
    return format_money(cents, get_state().config.currency_symbol)


def format_instalment_hint(total_cents: int) -> str:
    """The gateway's plan for the cart or product page (:meth:`PaymentPlan.describe`, with
    ``GATEWAY_CURRENCY_SYMBOL``): ``"or 3 x R 133.00"``, ``"or R 325.68 now, then 2 x R 325.66"``; ``""``
    when there is no plan to show."""
    plan = payment_plan(total_cents)
    if plan is None:
        return ""
    return plan.describe(get_state().config.currency_symbol)


# --- update and cancel --------------------------------------------------------------------------------


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
        details = _v2_order_details(order, checkout_id)
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
    client = state.client()
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
    session.commit()
    send_pending(transition)
    return updated


def _learn_after_refusal(checkout_id: int, error: GatewayError, operation: str) -> None:
    """After a 403 (expired) or 409 (wrong state) from update or cancel, bring the local status up to date."""
    from flask_gateway.core.errors import CheckoutExpiredError
    from flask_gateway.polling import refresh

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
    client = state.client()
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


# --- refunds -----------------------------------------------------------------------------------------------


def _check_refund_amount(amount_cents: object) -> int:
    if isinstance(amount_cents, bool) or not isinstance(amount_cents, int):
        raise RefundNotAllowedError(f"a refund amount is whole cents (an int), not {amount_cents!r}")
    if amount_cents <= 0:
        raise RefundNotAllowedError(f"a refund amount must be above 0 cents, not {amount_cents}")
    return amount_cents


def _check_refund_reason(reason: str) -> None:
    # Refused before the record is saved: the request could never be sent with it (the gateway takes 1000
    # characters without U+0000), and PostgreSQL would not even store U+0000.
    if len(reason) > _REFUND_REASON_MAX:
        raise RefundNotAllowedError(f"a refund reason is at most {_REFUND_REASON_MAX} characters")
    if "\x00" in reason:
        raise RefundNotAllowedError("a refund reason must not contain U+0000")


def refund(checkout: GatewayCheckout, amount_cents: int, reason: str = "") -> RefundRecord:
    """Refund ``amount_cents`` of a paid checkout (v2 refund, or the v1 refund: full or partial).

    Checked first: a reason the gateway takes (at most 1000 characters, no U+0000); then, under the
    checkout's row lock: a whole positive amount, a paid status (PAID, PAID_PENDING_CALLBACK,
    PARTIALLY_REFUNDED), and no more than the paid amount minus what was refunded and what is still
    pending. The ``RefundRecord`` (``PENDING``, with its ``requestId``) is committed
    before the request. If an earlier refund of the same amount and reason is still ``PENDING`` (its
    answer was lost), this call retries it (:func:`retry_refund`) instead of refunding twice.

    On success the record is ``SUCCEEDED``, the checkout's ``refunded_cents`` and status
    (``PARTIALLY_REFUNDED`` / ``FULLY_REFUNDED``) change, and ``refund_succeeded`` is sent once. On a
    refusal the record is ``FAILED`` with the gateway's message and :class:`RefundDeclinedError` is raised.
    Without an answer the record stays ``PENDING`` and the ``GatewayError`` is raised: retry later.
    """
    amount = _check_refund_amount(amount_cents)
    _check_refund_reason(reason)
    state = get_state()
    session = state.session
    locked = lock(session, checkout.id)
    for record in locked.refunds:
        if record.state == RefundState.PENDING and record.amount_cents == amount and record.reason == reason:
            session.commit()
            return retry_refund(record)
    try:
        if locked.status not in _REFUNDABLE:
            raise RefundNotAllowedError(
                f"checkout #{locked.id} is {locked.status}: only a paid checkout (PAID, "
                "PAID_PENDING_CALLBACK or PARTIALLY_REFUNDED) can be refunded."
            )
        if not locked.token:
            raise RefundNotAllowedError(f"checkout #{locked.id} has no gateway token")
        pending = sum(r.amount_cents for r in locked.refunds if r.state == RefundState.PENDING)
        available = locked.paid_cents - locked.refunded_cents - pending
        if amount > available:
            detail = f" ({pending} cents are in refunds still pending)" if pending else ""
            raise RefundNotAllowedError(
                f"a refund of {amount} cents is more than the {max(available, 0)} cents left to refund on "
                f"checkout #{locked.id}{detail}."
            )
    except RefundNotAllowedError:
        session.rollback()
        raise
    record = RefundRecord(
        request_id=new_request_id(),
        amount_cents=amount,
        reason=reason,
        state=RefundState.PENDING.value,
        created_at=utcnow(),
    )
    locked.refunds.append(record)
    session.commit()  # the requestId is safe before anything leaves
    return retry_refund(record)


def retry_refund(record: RefundRecord, *, force: bool = False) -> RefundRecord:
    """Send (again) a ``PENDING`` refund with its saved ``requestId``; a settled record is returned as is.

    v2 refunds are idempotent, so a retry never refunds twice. The v1 refund has no idempotency key: a v1
    record whose earlier attempt may have reached the gateway is resent only with ``force=True`` (check the
    order on the gateway first).
    """
    state = get_state()
    session = state.session
    record_id = record.id
    current = session.get_one(RefundRecord, record_id, populate_existing=True)
    if current.state != RefundState.PENDING:
        session.commit()
        return current
    checkout = current.checkout
    v1 = checkout.api_version == "v1"
    if v1 and current.error is not None and not force:
        session.rollback()
        raise RefundNotAllowedError(
            f"refund #{record_id} (v1) may have reached the gateway already ({current.error}); the v1 API "
            "cannot tell a retry from a second refund. Check the order on the gateway, then call "
            "retry_refund(record, force=True) if it was not refunded."
        )
    checkout_id, token, reference = checkout.id, checkout.token or "", checkout.order_reference
    amount, reason, request_id = current.amount_cents, current.reason, current.request_id
    remaining = checkout.total_cents - checkout.refunded_cents
    v1_client = state.v1_client() if v1 else None
    client = None if v1 else state.client()
    session.commit()  # no transaction held while the gateway answers
    try:
        if v1_client is not None:
            v1_client.refund(
                V1RefundRequest(
                    merchant_reference=reference,
                    token=token,
                    type=V1RefundType.FULL if amount == remaining else V1RefundType.PARTIAL,
                    amount=amount,
                    reason=reason,
                )
            )
        elif client is not None:
            answer = client.refund(
                RefundRequest(
                    requestId=request_id,
                    checkoutToken=token,
                    # Derived from the record, so every retry sends the very same body.
                    merchantRefundReference=f"{reference}/refund-{record_id}"[-255:],
                    refundAmountCents=amount,
                    refundDescription=reason,
                )
            )
            if answer.data.refundStatus != "SUCCESS":
                raise InvalidResponseError(
                    f"the gateway answered refundStatus {answer.data.refundStatus!r} "
                    f"({answer.data.refundStatusDescription or 'no description'}); the refund stays pending",
                    http_status=answer.status_code,
                    operation="refund",
                )
    except GatewayError as error:
        settled = _refund_failed(checkout_id, record_id, error)
        if _definite_refusal(error, conflict_refuses=True) and settled.state == RefundState.FAILED:
            raise RefundDeclinedError(
                f"The gateway refused the refund of {_money(amount)}: {error.message}",
                refund=settled,
                cause=error,
            ) from error
        if settled.state == RefundState.SUCCEEDED:  # a concurrent retry succeeded meanwhile
            return settled
        raise
    return _refund_succeeded(checkout_id, record_id)


def _refund_failed(checkout_id: int, record_id: int, error: GatewayError) -> RefundRecord:
    """Record the failure: ``FAILED`` after a refusal, else the record stays ``PENDING`` with a note."""
    session = get_state().session
    session.rollback()
    lock(session, checkout_id)  # the same lock as the success path: one of them decides
    record = session.get_one(RefundRecord, record_id, populate_existing=True)
    if record.state == RefundState.PENDING:
        if _definite_refusal(error, conflict_refuses=True):
            record.state = RefundState.FAILED.value
            record.completed_at = utcnow()
            record.error = error.message
        else:
            record.error = f"no answer: {error}"
    session.commit()
    return record


def _refund_succeeded(checkout_id: int, record_id: int) -> RefundRecord:
    state = get_state()
    session = state.session
    checkout = lock(session, checkout_id)
    record = session.get_one(RefundRecord, record_id, populate_existing=True)
    if record.state == RefundState.SUCCEEDED:  # a concurrent retry got there first
        session.commit()
        return record
    # A FAILED record can still succeed: a concurrent attempt's 409 ("in flight") marked it first.
    record.state = RefundState.SUCCEEDED.value
    record.completed_at = utcnow()
    record.error = None
    refunded = checkout.refunded_cents + record.amount_cents
    status = S.FULLY_REFUNDED if refunded >= checkout.total_cents else S.PARTIALLY_REFUNDED
    transition = apply(
        session,
        checkout_id,
        Observation(
            status=status.value,
            source="refund",
            refunded_cents=refunded,
            detail=f"refund #{record_id}: {record.amount_cents} cents",
        ),
        commit=False,
    )
    session.commit()
    send_pending(transition)
    signals.refund_succeeded.send(
        _app(),
        checkout=transition.checkout,
        refund=record,
        amount_cents=record.amount_cents,
    )
    return record
