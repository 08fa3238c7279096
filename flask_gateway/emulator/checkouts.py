"""The gateway's checkouts: one forward-only state machine, every change under a row lock.

Callers run inside a request (or app) context and commit. Every function that changes a checkout first
takes its row lock (``SELECT ... FOR UPDATE``; on SQLite the transaction holds the write lock from
``BEGIN IMMEDIATE``), then applies expiry, then checks the transition.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final, cast

from flask import g
from sqlalchemy import ColumnElement, Connection, Select, Table, bindparam, insert, or_, select

from flask_gateway.core.hosts import is_local_host
from flask_gateway.core.sql import begin_writing
from flask_gateway.core.wire import (
    CHANGEABLE_STATUSES,
    OPEN_STATUSES,
    PAID_STATUSES,
    REFUNDABLE_STATUSES,
    CheckoutResponse,
    CheckoutStatus,
    CheckoutStatusPayload,
    CreateCheckoutRequest,
    CreateOrderDetails,
    OrderDetailsEcho,
    RefundRequest,
    RefundResponse,
    UpdateCheckoutRequest,
    V1CheckoutRequest,
    V1RefundRequest,
    V1RefundType,
)
from flask_gateway.emulator import clock
from flask_gateway.emulator.api import settings
from flask_gateway.emulator.idempotency import defer_to_answer
from flask_gateway.emulator.models import (
    Account,
    ApiVersion,
    Checkout,
    CheckoutEvent,
    Delivery,
    DeliveryKind,
    IdempotencyKey,
    Refund,
    db,
)
from flask_gateway.emulator.problems import ApiProblem

__all__ = [
    "DEFAULT_EXPIRY",
    "TOKEN_MAX_LENGTH",
    "UPDATE_WINDOW",
    "begin_payment",
    "cancel",
    "check_firewall",
    "checkout_response",
    "consumer_cancel",
    "create",
    "create_v1",
    "expire_due",
    "expiry_due",
    "find",
    "lock",
    "mark_callback_delivered",
    "needs_expiry",
    "pay",
    "payment_url",
    "record_event",
    "refund",
    "refund_by_operator",
    "refund_v1",
    "reopen_v1",
    "snapshot",
    "status_payload",
    "update",
]

#: The message of the gateway's documented v1 refusal of a refund above what remains refundable.
V1_AMOUNT_EXCEEDED: Final = "Amount is greater than available amount refundable."
#: The longest checkout token (``Checkout.token``; the wire's ``checkoutToken`` allows no more either).
TOKEN_MAX_LENGTH: Final = 255
#: Expiry when a create gives no ``orderExpiryMinutes``, and the v1 default.
DEFAULT_EXPIRY: Final = timedelta(minutes=60)
#: The consumer's payment window after an update (when the order details give no ``expiresAt``).
UPDATE_WINDOW: Final = timedelta(minutes=60)

S = CheckoutStatus
#: Statuses that expire when ``expiresAt`` passes: the consumer could still pay.
OPEN: Final = tuple(sorted(OPEN_STATUSES))
#: Where the consumer can pay or cancel on the payment page.
_PAYABLE: Final = (S.PENDING_ORDER.value, S.PENDING_PAYMENT.value)


# --- firewall and limits -------------------------------------------------------------------------


def check_firewall(urls: Iterable[object], *, strict: bool) -> None:
    """403 ``{"message": "Forbidden"}`` when a redirect URL is local and the firewall is strict."""
    if strict and any(isinstance(url, str) and is_local_host(url) for url in urls):
        raise ApiProblem(403, "Forbidden")


def _check_limits(account: Account, total_cents: int, field: str) -> None:
    if not account.minimum_cents <= total_cents <= account.maximum_cents:
        raise ApiProblem(
            400,
            "The checkout total is outside the merchant's limits.",
            errors=[
                {
                    "field": field,
                    "message": f"must be between {account.minimum_cents} and {account.maximum_cents} cents",
                }
            ],
        )


# --- loading ---------------------------------------------------------------------------------------


def find(account_id: str | None, token: str, *, for_update: bool = False) -> Checkout:
    """The checkout with ``token`` of ``account_id`` (None: any account); 404 otherwise."""
    if "\x00" in token:  # no token has one, and PostgreSQL refuses it in a query (a 500)
        raise ApiProblem(404, "No checkout with this checkoutToken for this merchant account.")
    query = select(Checkout).where(Checkout.token == token)
    if account_id is not None:
        query = query.where(Checkout.account_id == account_id)
    if for_update:
        begin_writing(db.session())  # a read-only request (getstatus) that must write after all
        # Re-read under the lock: a row loaded earlier in this transaction would otherwise keep its old
        # values (PostgreSQL's READ COMMITTED lets another transaction change it in between).
        query = query.with_for_update().execution_options(populate_existing=True)
    checkout = db.session.scalars(query).one_or_none()
    if checkout is None:
        raise ApiProblem(404, "No checkout with this checkoutToken for this merchant account.")
    return checkout


def snapshot(account_id: str, token: str) -> Checkout:
    """The checkout with ``token`` of ``account_id`` as it is now (404 otherwise), for an answer only: read
    with one SQLAlchemy Core SELECT into an object outside the session (loading an ORM entity cost more
    than the query). Never change it: :func:`lock` gives the row to change."""
    if "\x00" in token:  # no token has one, and PostgreSQL refuses it in a query (a 500)
        raise ApiProblem(404, "No checkout with this checkoutToken for this merchant account.")
    row = db.session.connection().execute(_BY_TOKEN, {"token": token, "account_id": account_id}).first()
    if row is None:
        raise ApiProblem(404, "No checkout with this checkoutToken for this merchant account.")
    return Checkout(**row._mapping)


def lock(account_id: str | None, token: str) -> Checkout:
    """Row-lock the checkout and bring its expiry up to date."""
    checkout = find(account_id, token, for_update=True)
    if _apply_expiry(checkout, clock.now()):
        # Keep the expiry (and a v1 ABANDONED notice) even if the caller's action is refused and rolled back.
        db.session.commit()
        checkout = find(account_id, token, for_update=True)
    return checkout


def _expires(checkout: Checkout) -> bool:
    # A v1 order the merchant let be cancelled is final; only a v1 order still awaiting payment expires.
    if checkout.api_version == ApiVersion.V1:
        return checkout.status == S.PENDING_ORDER
    return checkout.status in OPEN


def needs_expiry(checkout: Checkout) -> bool:
    """True when the checkout is open but its ``expiresAt`` has passed (it must be locked and expired)."""
    return _expires(checkout) and clock.now() >= checkout.expires_at


def _apply_expiry(checkout: Checkout, now: datetime) -> bool:
    if _expires(checkout) and now >= checkout.expires_at:
        _transition(
            checkout, S.EXPIRED, now, "expired", f"expiresAt {checkout.expires_at.isoformat()} passed"
        )
        if checkout.api_version == ApiVersion.V1:
            _enqueue(checkout, DeliveryKind.V1_ABANDONED, checkout.details["order"]["fail_callback_url"], now)
        return True
    return False


def expiry_due(now: datetime) -> tuple[ColumnElement[bool], ...]:
    """The conditions of a checkout whose expiry is due at ``now`` (what :func:`expire_due` expires)."""
    return (
        Checkout.status.in_(OPEN),
        Checkout.expires_at <= now,
        or_(Checkout.api_version == ApiVersion.V2, Checkout.status == S.PENDING_ORDER.value),
    )


def expire_due(now: datetime | None = None, *, limit: int = 500) -> int:
    """Expire every open checkout whose ``expiresAt`` has passed; returns how many."""
    now = now or clock.now()
    due = db.session.scalars(
        select(Checkout)
        .where(*expiry_due(now))
        .order_by(Checkout.id)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .execution_options(populate_existing=True)
    ).all()
    return sum(_apply_expiry(checkout, now) for checkout in due)


# --- transitions -----------------------------------------------------------------------------------


def _event(checkout: Checkout, now: datetime, kind: str, detail: str = "") -> None:
    # From the event's side: ``checkout.events.append`` would first read every earlier event of the row.
    db.session.add(CheckoutEvent(checkout=checkout, at=now, kind=kind, detail=detail))


def record_event(checkout: Checkout, kind: str, detail: str = "") -> None:
    """Add a line to the checkout's timeline (shown on the dashboard)."""
    _event(checkout, clock.now(), kind, detail)


def _transition(checkout: Checkout, to: CheckoutStatus, now: datetime, kind: str, detail: str = "") -> None:
    before = checkout.status
    checkout.status = to.value
    checkout.updated_at = now
    _event(checkout, now, kind, f"{before} -> {to.value}" + (f": {detail}" if detail else ""))


def _refuse(checkout: Checkout, operation: str) -> ApiProblem:
    return ApiProblem(409, f"Cannot {operation} a checkout in status {checkout.status}.")


def _enqueue(checkout: Checkout, kind: DeliveryKind, url: str | None, now: datetime) -> None:
    if url:
        db.session.add(
            Delivery(checkout=checkout, kind=kind.value, url=url, next_attempt_at=now, created_at=now)
        )


def _v2_token(account: Account) -> str:
    """``v2.<account>.<uuid>``; a long account id is shortened so the token fits its 255 characters (the
    ``checkoutToken`` of the wire, and ``Checkout.token``: PostgreSQL refuses a longer value, a 500)."""
    suffix = f".{uuid.uuid4()}"
    return f"v2.{account.merchant_account_id}"[: TOKEN_MAX_LENGTH - len(suffix)] + suffix


def create(account: Account, request: CreateCheckoutRequest) -> Checkout:
    """PENDING_ORDER with a new token; expiry from ``orderExpiryMinutes`` (default 60)."""
    _check_limits(account, request.checkoutTotalCents, "checkoutTotalCents")
    now = clock.now()
    minutes = request.order_details.orderExpiryMinutes
    expiry = timedelta(minutes=minutes) if minutes is not None else DEFAULT_EXPIRY
    values: dict[str, Any] = {
        "token": _v2_token(account),
        "account_id": account.merchant_account_id,
        "api_version": ApiVersion.V2.value,
        "status": S.PENDING_ORDER.value,
        "request_id": request.requestId,
        "total_cents": request.checkoutTotalCents,
        "merchant_order_reference": request.order_details.merchantOrderReference,
        "click_trace_id": request.clickTraceId,
        "details": request.order_details.to_wire(),
        "created_at": now,
        "updated_at": now,
        "expires_at": now + expiry,
        "refunded_cents": 0,
    }
    event = {"at": now, "kind": "created", "detail": f"total {request.checkoutTotalCents} cents"}
    checkout_id: int | None = None
    # With a claimed requestId the two rows are written with the stored answer, at the end of the claim's
    # transaction (idempotency.defer_to_answer); else now. The caller commits.
    if not defer_to_answer(lambda connection, key: _insert_created(connection, values, event, key)):
        checkout_id = _insert_created(db.session.connection(), values, event, None)
    # The answer is built from the values written: a checkout object outside the session (nothing of it
    # is loaded or flushed again). Its ``id`` is None when the rows are written with the answer (the
    # create's answer does not show it).
    checkout = Checkout(id=checkout_id, cancelled_at=None, **values)
    g._emulator_created = (checkout, request.order_details)  # for checkout_response, this request only
    return checkout


def _insert_created(
    connection: Connection, values: dict[str, Any], event: dict[str, Any], key: Mapping[str, Any] | None
) -> int:
    """Insert a new checkout, its first timeline event and (``key``) its idempotency key; the checkout's id.

    SQLAlchemy Core on the session's connection (a flush's unit of work, and ``Session.execute``'s own
    work per statement, cost more than the INSERTs). PostgreSQL: one statement, the rows chained in a
    ``WITH`` (``INSERT ... RETURNING id`` feeding the event's ``INSERT ... SELECT``): one round trip.
    SQLite (in the process: no round trip to save, and no ``INSERT`` in a ``WITH``): one each.
    """
    if connection.dialect.name == "postgresql":
        params = {f"c_{name}": value for name, value in values.items()}
        params.update({f"e_{name}": value for name, value in event.items()})
        if key is not None:
            params.update({f"k_{name}": value for name, value in key.items()})
        checkout_id: int = connection.execute(
            _CREATE_WITH_KEY if key is not None else _CREATE, params
        ).scalar_one()
        return checkout_id
    checkout_id = connection.execute(_INSERT_CHECKOUT, values).scalar_one()
    connection.execute(_INSERT_EVENT, {"checkout_id": checkout_id, **event})
    if key is not None:
        connection.execute(_INSERT_KEY, key)
    return checkout_id


_CHECKOUTS: Final = cast(Table, Checkout.__table__)
_EVENTS: Final = cast(Table, CheckoutEvent.__table__)
_INSERT_CHECKOUT: Final = insert(_CHECKOUTS).returning(_CHECKOUTS.c.id)
_INSERT_EVENT: Final = insert(_EVENTS)
_KEYS: Final = cast(Table, IdempotencyKey.__table__)
_INSERT_KEY: Final = insert(_KEYS)


def _create_statement(*, with_key: bool) -> Select[Any]:
    """``WITH c AS (INSERT checkout RETURNING id), e AS (INSERT event SELECT c.id ...)[, k AS (INSERT key)]
    SELECT c.id``, its parameters named ``c_<column>``, ``e_<column>``, ``k_<column>``."""

    def bound(table: Table, prefix: str, names: Iterable[str]) -> dict[str, Any]:
        return {name: bindparam(f"{prefix}_{name}", type_=table.c[name].type) for name in names}

    checkout_columns = (
        "token",
        "account_id",
        "api_version",
        "status",
        "request_id",
        "total_cents",
        "merchant_order_reference",
        "click_trace_id",
        "details",
        "created_at",
        "updated_at",
        "expires_at",
        "refunded_cents",
    )
    new = insert(_CHECKOUTS).values(bound(_CHECKOUTS, "c", checkout_columns)).returning(_CHECKOUTS.c.id)
    new_checkout = new.cte("new_checkout")
    event = bound(_EVENTS, "e", ("at", "kind", "detail"))
    new_event = insert(_EVENTS).from_select(
        ["checkout_id", *event],
        select(new_checkout.c.id, *(value.label(name) for name, value in event.items())),
    )
    statement = select(new_checkout.c.id).add_cte(new_event.cte("new_event"))
    if with_key:
        key_columns = [column.key for column in _KEYS.columns if column.key != "id"]
        statement = statement.add_cte(insert(_KEYS).values(bound(_KEYS, "k", key_columns)).cte("new_key"))
    return statement


#: Built once (PostgreSQL only): create's rows in one statement, with and without the idempotency key.
_CREATE: Final = _create_statement(with_key=False)
_CREATE_WITH_KEY: Final = _create_statement(with_key=True)
_BY_TOKEN: Final = select(_CHECKOUTS).where(
    _CHECKOUTS.c.token == bindparam("token"), _CHECKOUTS.c.account_id == bindparam("account_id")
)


def update(account: Account, request: UpdateCheckoutRequest) -> Checkout:
    """Replace the order of an open checkout; a new payment window; CANCELLED_BY_CONSUMER reopens."""
    checkout = lock(account.merchant_account_id, request.checkoutToken)
    if checkout.status == S.EXPIRED:
        raise ApiProblem(403, "The checkout has expired and can no longer be updated: create a new checkout.")
    if checkout.status not in CHANGEABLE_STATUSES:
        raise _refuse(checkout, "update")
    _check_limits(account, request.checkoutTotalCents, "checkoutTotalCents")
    now = clock.now()
    order = request.order_details
    if order.expiresAt is not None and order.expiresAt <= now:
        field = f"{settings().wire_names.order_details}.expiresAt"
        raise ApiProblem(
            400,
            "The new expiry time is in the past.",
            errors=[{"field": field, "message": "must be in the future"}],
        )
    details = order.to_wire()
    details.pop("expiresAt", None)
    checkout.details = details
    checkout.total_cents = request.checkoutTotalCents
    checkout.merchant_order_reference = order.merchantOrderReference
    if request.clickTraceId is not None:
        checkout.click_trace_id = request.clickTraceId
    checkout.expires_at = order.expiresAt or now + UPDATE_WINDOW
    if checkout.status == S.CANCELLED_BY_CONSUMER:
        _transition(checkout, S.PENDING_ORDER, now, "updated", "reopened by an update")
    else:
        checkout.updated_at = now
        _event(checkout, now, "updated", f"total {request.checkoutTotalCents} cents")
    return checkout


def cancel(account: Account, token: str) -> Checkout:
    """The merchant cancels: PENDING_ORDER or CANCELLED_BY_CONSUMER -> CANCELLED_BY_MERCHANT."""
    checkout = lock(account.merchant_account_id, token)
    if checkout.status not in CHANGEABLE_STATUSES:
        raise _refuse(checkout, "cancel")
    now = clock.now()
    checkout.cancelled_at = now
    _transition(checkout, S.CANCELLED_BY_MERCHANT, now, "cancelled", "by the merchant")
    return checkout


def pay(checkout: Checkout, account: Account) -> None:
    """The consumer pays (row already locked). v2: PAID_PENDING_CALLBACK and a callback; v1: PAID."""
    if checkout.status not in _PAYABLE:
        raise _refuse(checkout, "pay")
    now = clock.now()
    checkout.paid_at = now
    checkout.payment_reference = 700_000_000 + checkout.id
    if checkout.api_version == ApiVersion.V1:
        _transition(checkout, S.PAID, now, "paid", "by the consumer")
        return
    _transition(checkout, S.PAID_PENDING_CALLBACK, now, "paid", "by the consumer")
    _enqueue(checkout, DeliveryKind.CALLBACK, account.callback_url, now)


def begin_payment(checkout: Checkout) -> None:
    """The consumer starts paying on the gateway (row already locked): v2 PENDING_ORDER -> PENDING_PAYMENT.

    The real gateway reports ``PENDING_PAYMENT`` while a consumer's application is under way; the merchant
    may then neither update nor cancel, and the consumer may still pay or cancel.
    """
    if checkout.api_version != ApiVersion.V2 or checkout.status != S.PENDING_ORDER:
        raise _refuse(checkout, "begin paying")
    _transition(checkout, S.PENDING_PAYMENT, clock.now(), "payment-started", "by the consumer")


def consumer_cancel(checkout: Checkout, account: Account) -> None:
    """The consumer cancels on the payment page (row already locked)."""
    if checkout.status not in _PAYABLE:
        raise _refuse(checkout, "cancel")
    now = clock.now()
    _transition(checkout, S.CANCELLED_BY_CONSUMER, now, "consumer-cancelled", "on the payment page")
    if checkout.api_version == ApiVersion.V2 and account.cancel_callbacks:
        _enqueue(checkout, DeliveryKind.CALLBACK, account.callback_url, now)


def mark_callback_delivered(checkout: Checkout) -> bool:
    """The merchant answered HTTP 200 to a callback (row already locked): PAID_PENDING_CALLBACK -> PAID.

    Any other status is left alone (a cancel callback, or a checkout refunded meanwhile); returns whether
    the checkout moved.
    """
    if checkout.status != S.PAID_PENDING_CALLBACK:
        return False
    _transition(checkout, S.PAID, clock.now(), "callback-acknowledged", "the merchant answered HTTP 200")
    return True


def reopen_v1(checkout: Checkout) -> None:
    """The merchant's fail URL answered that the gateway must not cancel: the consumer may try again."""
    if checkout.status == S.CANCELLED_BY_CONSUMER:
        _transition(checkout, S.PENDING_ORDER, clock.now(), "reopened", "the merchant keeps the order open")


def _apply_refund(
    checkout: Checkout, amount: int, reference: str, description: str, request_id: str | None
) -> None:
    if checkout.status not in REFUNDABLE_STATUSES:
        raise _refuse(checkout, "refund")
    remaining = checkout.total_cents - checkout.refunded_cents
    if amount > remaining:
        raise ApiProblem(
            409,
            f"The refund of {amount} cents exceeds the {remaining} cents that remain refundable.",
        )
    now = clock.now()
    checkout.refunded_cents += amount
    checkout.refunds.append(
        Refund(
            request_id=request_id, amount_cents=amount, reference=reference, description=description, at=now
        )
    )
    to = S.FULLY_REFUNDED if checkout.refunded_cents >= checkout.total_cents else S.PARTIALLY_REFUNDED
    _transition(checkout, to, now, "refunded", f"{amount} cents ({reference})")


def refund(account: Account, request: RefundRequest) -> RefundResponse:
    checkout = lock(account.merchant_account_id, request.checkoutToken)
    _apply_refund(
        checkout,
        request.refundAmountCents,
        request.merchantRefundReference,
        request.refundDescription,
        request.requestId,
    )
    # The description "OK" as the gateway's latest example answers; the request's requestId echoed as the
    # spec's common fields say (docs/decisions.md: the documented examples print none; a request without one
    # gets an answer without one).
    return RefundResponse(
        requestId=request.requestId,
        refundedAmountCents=request.refundAmountCents,
        refundStatus="SUCCESS",
        refundStatusAt=checkout.updated_at,
        refundStatusDescription="OK",
    )


def refund_by_operator(token: str, amount: int | None, reason: str) -> Checkout:
    """A refund made in the gateway's own portal (the control API and the dashboard): no merchant request,
    so no requestId and no callback; the merchant learns of it by asking (getstatus). ``amount`` None:
    everything that remains."""
    checkout = lock(None, token)
    remaining = checkout.total_cents - checkout.refunded_cents
    _apply_refund(
        checkout, remaining if amount is None else amount, "portal", reason or "refunded in the portal", None
    )
    return checkout


# --- v1 ---------------------------------------------------------------------------------------------


def create_v1(account: Account, request: V1CheckoutRequest) -> Checkout:
    order = request.order
    _check_limits(account, order.amount, "order.amount")
    now = clock.now()
    if order.expires_at is not None and order.expires_at <= now:
        raise ApiProblem(
            400,
            "The order expiry is in the past.",
            errors=[{"field": "order.expires_at", "message": "must be in the future"}],
        )
    checkout = Checkout(
        token=secrets.token_hex(16),
        account_id=account.merchant_account_id,
        api_version=ApiVersion.V1,
        status=S.PENDING_ORDER.value,
        total_cents=order.amount,
        merchant_order_reference=str(order.merchant_reference),
        details=request.to_wire(),
        created_at=now,
        updated_at=now,
        expires_at=order.expires_at or now + DEFAULT_EXPIRY,
    )
    db.session.add(checkout)
    _event(checkout, now, "created", f"v1 order of {order.amount} cents")
    db.session.flush()
    return checkout


def refund_v1(account: Account, request: V1RefundRequest) -> Checkout:
    """A v1 refund; raises ApiProblem(400) with the reason when refused (the v1 route shapes the body)."""
    try:
        checkout = lock(account.merchant_account_id, request.token)
    except ApiProblem:
        raise ApiProblem(400, "No order with this token for this merchant account.") from None
    if checkout.api_version != ApiVersion.V1 or checkout.merchant_order_reference != str(
        request.merchant_reference
    ):
        raise ApiProblem(400, "The token and merchant_reference do not name the same order.")
    remaining = checkout.total_cents - checkout.refunded_cents
    if checkout.status in PAID_STATUSES and request.amount > remaining:
        # The gateway's documented refusal (also for a second refund of a refunded order).
        raise ApiProblem(400, f"{V1_AMOUNT_EXCEEDED} ({remaining} cents remain.)")
    if request.type == V1RefundType.FULL and request.amount != remaining:
        raise ApiProblem(400, f"A full refund must be for the remaining {remaining} cents.")
    try:
        _apply_refund(checkout, request.amount, str(request.merchant_reference), request.reason, None)
    except ApiProblem as problem:
        raise ApiProblem(400, problem.message) from None
    return checkout


# --- answers ----------------------------------------------------------------------------------------


def payment_url(checkout: Checkout, base_url: str) -> str:
    version = "v1" if checkout.api_version == ApiVersion.V1 else "v2"
    return f"{base_url.rstrip('/')}/api/{version}/app/checkout/{checkout.token}"


_REDUCED_ECHO: Final = (
    "merchantOrderReference",
    "confirmRedirectUrl",
    "cancelRedirectUrl",
    "orderAmountCents",
    "orderItems",
)


def checkout_response(checkout: Checkout, base_url: str, *, reduced: bool = False) -> CheckoutResponse:
    """The create/update answer (full echo of the order details) or the cancel answer: a reduced echo and
    no ``expiresAt``, as the gateway's cancel example shows it."""
    created = None if reduced else g.get("_emulator_created")
    if created is not None and created[0] is checkout:
        return _created_response(checkout, created[1], base_url)
    details: dict[str, Any] = dict(checkout.details)
    if reduced:
        echo = OrderDetailsEcho.model_validate({k: details[k] for k in _REDUCED_ECHO if k in details})
    else:
        echo = OrderDetailsEcho.model_validate(
            {**details, "expiresAt": checkout.expires_at, "checkoutPaymentStatus": checkout.status}
        )
    return CheckoutResponse(
        **_answer_fields(checkout, base_url),
        expiresAt=None if reduced else checkout.expires_at,
        order_details=echo,
    )


def _created_response(checkout: Checkout, order: CreateOrderDetails, base_url: str) -> CheckoutResponse:
    """The answer to the create that made ``checkout`` from ``order`` moments ago: the same models with
    the same values as :func:`checkout_response` gives, built without validating again what the request's
    validation produced (``model_construct``: the order's lines, customer and addresses are the request's
    own validated objects), so the same JSON (``tests/emulator/test_create_cost.py`` compares the two)."""
    echo: dict[str, Any] = {name: value for name in _ECHOED if (value := getattr(order, name)) is not None}
    echo.update((name, value) for name, value in (order.model_extra or {}).items() if value is not None)
    echo["expiresAt"] = checkout.expires_at
    echo["checkoutPaymentStatus"] = checkout.status
    return CheckoutResponse.model_construct(
        **_answer_fields(checkout, base_url),
        expiresAt=checkout.expires_at,
        order_details=OrderDetailsEcho.model_construct(**echo),
    )


def _answer_fields(checkout: Checkout, base_url: str) -> dict[str, Any]:
    """The fields of a checkout's answer that come from its row as they are (both builders above)."""
    return {
        "requestId": checkout.request_id,
        "checkoutToken": checkout.token,
        "checkoutTotalCents": checkout.total_cents,
        "paymentUrl": payment_url(checkout, base_url),
        "checkoutPaymentStatus": checkout.status,
        "merchantOrderReference": checkout.merchant_order_reference,
        "clickTraceId": checkout.click_trace_id,
        "createdAt": checkout.created_at,
        "updatedAt": checkout.updated_at,
        "cancelledAt": checkout.cancelled_at,
        "merchantAccountId": checkout.account_id,
    }


#: The fields of a create's order details, in their declared order (what ``to_wire`` writes).
_ECHOED: Final = tuple(CreateOrderDetails.model_fields)


def status_payload(checkout: Checkout, base_url: str) -> CheckoutStatusPayload:
    """The getstatus answer and callback body: exactly the 16 keys."""
    return CheckoutStatusPayload(
        requestId=checkout.request_id,
        checkoutToken=checkout.token,
        checkoutTotalCents=checkout.total_cents,
        paymentUrl=payment_url(checkout, base_url),
        checkoutPaymentStatus=checkout.status,
        paidAt=checkout.paid_at,
        paymentReference=checkout.payment_reference,
        merchantOrderReference=checkout.merchant_order_reference,
        gatewayOrderReference=checkout.id,
        clickTraceId=checkout.click_trace_id,
        createdAt=checkout.created_at,
        updatedAt=checkout.updated_at,
        expiresAt=checkout.expires_at,
        cancelledAt=checkout.cancelled_at,
        lastCallbackAttemptedAt=checkout.last_callback_attempted_at,
        lastCallbackAttemptStatusMessage=checkout.last_callback_status_message,
    )
