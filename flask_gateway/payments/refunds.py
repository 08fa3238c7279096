"""Refunds from the shop's own code: all or part of a paid checkout, retried safely.

A refund is saved (``PENDING``, with its ``requestId``) and committed before the first request; a retry
(:func:`retry_refund`, or :func:`refund` again with the same amount) sends the same ``requestId``, so the
gateway refunds once. The shop's own checks raise :class:`~flask_gateway.errors.RefundNotAllowedError`;
a refund the gateway declines is recorded ``FAILED`` and raises
:class:`~flask_gateway.errors.RefundDeclinedError` (its ``cause`` is the gateway's error).
"""

from __future__ import annotations

import logging
from typing import Final

from flask_gateway import signals
from flask_gateway.core.client import new_request_id
from flask_gateway.core.errors import (
    GatewayError,
    InvalidResponseError,
    definite_refusal,
)
from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import (
    REFUNDABLE_STATUSES,
    CheckoutStatus,
    RefundRequest,
    V1RefundRequest,
    V1RefundType,
)
from flask_gateway.errors import (
    RefundDeclinedError,
    RefundNotAllowedError,
)
from flask_gateway.models import GatewayCheckout, RefundRecord, RefundState
from flask_gateway.payments.transitions import Observation, apply, lock, send_pending
from flask_gateway.state import get_state, leaves_no_transaction

__all__ = ["refund", "retry_refund"]

log = logging.getLogger("flask_gateway.refunds")

S = CheckoutStatus

#: ``refundDescription`` (v2) and the v1 refund ``reason``.
_REFUND_REASON_MAX: Final = 1000


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


@leaves_no_transaction
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
        if locked.status not in REFUNDABLE_STATUSES:
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


@leaves_no_transaction
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
    account = checkout.merchant_account_id
    v1_client = state.v1_client(account=account) if v1 else None
    client = None if v1 else state.client(account=account)
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
        if definite_refusal(error, conflict_refuses=True) and settled.state == RefundState.FAILED:
            raise RefundDeclinedError(
                f"The gateway refused the refund of {get_state().money(amount)}: {error.message}",
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
        if definite_refusal(error, conflict_refuses=True):
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
    transition.queue(signals.refund_succeeded, refund=record, amount_cents=record.amount_cents)
    commit_keeping_loaded(session)  # the refund, its status and the event for the shop, together
    send_pending(transition)
    return record
