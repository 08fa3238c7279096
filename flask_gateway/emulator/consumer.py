"""What the consumer does on the hosted payment page: pay or cancel (also driven by the control API)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask_gateway.core.wire import V1FailReason, V1OutcomeStatus
from flask_gateway.emulator import checkouts, merchant
from flask_gateway.emulator.models import Account, ApiVersion, Checkout, db

__all__ = ["Outcome", "begin_payment", "cancel", "pay"]


@dataclass(frozen=True)
class Outcome:
    """Where the consumer goes next, and what happened."""

    status: str
    #: The merchant page to send the consumer to (None: the v1 merchant gave no usable answer).
    redirect_url: str | None
    #: For v1: what the merchant's success/fail URL answered (``OK`` or why it failed).
    merchant_message: str | None = None


def _locked(token: str) -> tuple[Checkout, Account]:
    checkout = checkouts.lock(None, token)
    account = db.session.get(Account, checkout.account_id)
    if account is None:  # pragma: no cover - the foreign key prevents it
        raise LookupError(f"checkout {token} has no account")
    return checkout, account


def _committed(checkout: Checkout) -> tuple[int, str, dict[str, Any]]:
    """Commit, keeping what the next steps read: the API version, the status and the details.

    Read after the commit, they would be loaded again in a new transaction, and on SQLite every transaction
    of the emulator takes the write lock (``BEGIN IMMEDIATE``): held while the merchant's v1 URL answers,
    it would block every other writer, and the merchant itself when it shares the database (the embedded
    emulator).
    """
    kept = (checkout.api_version, checkout.status, checkout.details)
    db.session.commit()
    return kept


def pay(token: str) -> Outcome:
    """Pay the checkout; v1 then asks the merchant's success URL where to send the consumer."""
    checkout, account = _locked(token)
    checkouts.pay(checkout, account)
    version, status, details = _committed(checkout)
    if version == ApiVersion.V2:
        return Outcome(status, details["confirmRedirectUrl"])
    order = details["order"]
    reply = merchant.call_v1_outcome(order["success_callback_url"], token, V1OutcomeStatus.SUCCESS)
    checkout, _ = _locked(token)
    checkouts.record_event(checkout, "merchant-notified", f"success URL: {reply.message}")
    db.session.commit()
    return Outcome(checkout.status, reply.answer.return_url if reply.answer else None, reply.message)


def begin_payment(token: str) -> Outcome:
    """The consumer starts paying (v2): the checkout is ``PENDING_PAYMENT`` until they pay or cancel."""
    checkout, _ = _locked(token)
    checkouts.begin_payment(checkout)
    _version, status, _details = _committed(checkout)
    return Outcome(status, None)


def cancel(token: str) -> Outcome:
    """Cancel on the payment page; v1 asks the fail URL, whose answer may keep the order open."""
    checkout, account = _locked(token)
    checkouts.consumer_cancel(checkout, account)
    version, status, details = _committed(checkout)
    if version == ApiVersion.V2:
        return Outcome(status, details["cancelRedirectUrl"])
    order = details["order"]
    reply = merchant.call_v1_outcome(
        order["fail_callback_url"], token, V1OutcomeStatus.FAIL, V1FailReason.CANCELLED
    )
    checkout, _ = _locked(token)
    checkouts.record_event(checkout, "merchant-notified", f"fail URL (CANCELLED): {reply.message}")
    if reply.answer is not None and reply.answer.cancel_on_gateway is False:
        checkouts.reopen_v1(checkout)
    db.session.commit()
    return Outcome(checkout.status, reply.answer.return_url if reply.answer else None, reply.message)
