"""The ONE place a checkout's status changes on the merchant side.

Every path that learns a status (callback, return page, v1 URL, getstatus poll, reconciliation, admin
action) builds an ``Observation`` and calls ``apply``. It locks the row, refuses backward moves, checks
amount and account, records an event, commits, and only then sends each signal, once: the row's
``payment_confirmed_at`` (set under the lock) decides which transaction confirmed the payment.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from blinker import Signal
from flask import current_app
from sqlalchemy import select
from sqlalchemy.orm import Session, object_session

from flask_gateway import signals
from flask_gateway.core.sql import storable_text
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import OPEN_STATUSES, PAID_STATUSES, CheckoutStatus
from flask_gateway.models import STATUS_LENGTH, CheckoutEvent, GatewayCheckout, LocalStatus

__all__ = ["RANK", "Observation", "Transition", "apply", "lock", "lock_by_token", "rank"]

S = CheckoutStatus

#: Progress order. A move to a higher rank is forward; within a rank only the listed moves are allowed.
RANK: Final[dict[str, int]] = {
    LocalStatus.CREATING: 0,
    S.PENDING_ORDER: 1,
    S.PENDING_PAYMENT: 1,
    S.CANCELLED_BY_CONSUMER: 1,
    S.CANCELLED_BY_MERCHANT: 2,
    S.EXPIRED: 2,
    LocalStatus.FAILED: 2,
    S.PAID_PENDING_CALLBACK: 3,
    S.PAID: 3,
    S.PARTIALLY_REFUNDED: 4,
    S.FULLY_REFUNDED: 5,
}
_SAME_RANK_MOVES: Final = {
    # Among the open statuses every move is allowed: the consumer starts paying (PENDING_PAYMENT),
    # cancels, and an update reopens a consumer-cancelled checkout; polls may see any of them in any order.
    *((before.value, after.value) for before in OPEN_STATUSES for after in OPEN_STATUSES if before != after),
    (S.PAID_PENDING_CALLBACK.value, S.PAID.value),
}


def rank(status: str) -> int | None:
    return RANK.get(status)


@dataclass(frozen=True)
class Observation:
    """What one source says about a checkout."""

    status: str
    #: callback, return, v1, poll, reconcile, admin, create, update, cancel, refund
    source: str
    #: The checkout total the source reports (checked against ours before a payment is accepted).
    total_cents: int | None = None
    merchant_account_id: str | None = None
    paid_at: datetime | None = None
    #: The token the source reports; set on the record when it has none yet (create).
    token: str | None = None
    expires_at: datetime | None = None
    payment_url: str | None = None
    refunded_cents: int | None = None
    detail: str = ""


@dataclass
class Transition:
    """What ``apply`` did."""

    checkout: GatewayCheckout
    before: str
    after: str
    applied: bool
    flagged: bool = False
    reason: str = ""
    _pending: list[tuple[Signal, dict[str, Any]]] = field(default_factory=list, repr=False)


_LOCKED: Final = "flask_gateway_locked_checkouts"


def _locked_in_this_transaction(session: Session) -> set[int]:
    """Ids of the checkouts this session's current transaction has row-locked (and so read fresh)."""
    transaction = session.get_transaction()
    held = session.info.get(_LOCKED)
    if held is None or held[0] is not transaction:
        held = session.info[_LOCKED] = (transaction, set())
    locked: set[int] = held[1]
    return locked


def lock(session: Session, checkout_id: int) -> GatewayCheckout:
    """The checkout, row-locked (``FOR UPDATE``; SQLite: the transaction already holds the write lock).

    Locked once per transaction: a second call in the same transaction answers the row it already holds
    (read under that lock, and changed only by this transaction since) without asking the database again.
    """
    if session.in_transaction() and checkout_id in _locked_in_this_transaction(session):
        held = session.get(GatewayCheckout, checkout_id)
        if held is not None:
            return held
    checkout = session.scalars(
        select(GatewayCheckout)
        .where(GatewayCheckout.id == checkout_id)
        .with_for_update()
        .execution_options(populate_existing=True)
    ).one()
    _locked_in_this_transaction(session).add(checkout.id)
    return checkout


def lock_by_token(session: Session, token: str) -> GatewayCheckout | None:
    """The v2 checkout with ``token``, row-locked as ``lock`` does (one statement: find and lock)."""
    checkout = session.scalars(
        select(GatewayCheckout)
        .where(GatewayCheckout.token == token, GatewayCheckout.api_version == "v2")
        .with_for_update()
        .execution_options(populate_existing=True)
    ).first()
    if checkout is not None:
        _locked_in_this_transaction(session).add(checkout.id)
    return checkout


def _mismatch(checkout: GatewayCheckout, observation: Observation) -> str | None:
    if (
        observation.merchant_account_id is not None
        and observation.merchant_account_id != checkout.merchant_account_id
    ):
        return (
            f"merchant account {observation.merchant_account_id!r} does not match the checkout's "
            f"{checkout.merchant_account_id!r}"
        )
    if (
        observation.status in PAID_STATUSES
        and observation.total_cents is not None
        and observation.total_cents != checkout.total_cents
    ):
        return f"total {observation.total_cents} cents does not match the checkout's {checkout.total_cents}"
    return None


def _allowed(before: str, after: str) -> bool:
    if before == after:
        return False
    old, new = rank(before), rank(after)
    if new is None:  # a status this version does not know: recorded, never applied
        return False
    if old is None:
        return True
    if new > old:
        return before != LocalStatus.FAILED
    return new == old and (before, after) in _SAME_RANK_MOVES


def apply(session: Session, checkout_id: int, observation: Observation, *, commit: bool = True) -> Transition:
    """Apply what ``observation`` says to checkout ``checkout_id``; see the module docstring."""
    checkout = lock(session, checkout_id)
    now = utcnow()
    before = checkout.status
    transition = Transition(checkout=checkout, before=before, after=before, applied=False)
    problem = _mismatch(checkout, observation)
    if problem is not None:
        checkout.flagged = True
        checkout.flag_reason = problem
        transition.flagged, transition.reason = True, problem
        _record(checkout, now, observation, before, applied=False, detail=f"REFUSED: {problem}")
    else:
        if observation.token and not checkout.token:
            checkout.token = observation.token
        if observation.payment_url:
            checkout.payment_url = observation.payment_url
        if observation.expires_at is not None:
            checkout.expires_at = observation.expires_at
        refunded_more = (
            observation.refunded_cents is not None and observation.refunded_cents > checkout.refunded_cents
        )
        if refunded_more:
            checkout.refunded_cents = observation.refunded_cents or 0
        if _allowed(before, observation.status):
            checkout.status = observation.status
            checkout.updated_at = now
            transition.after, transition.applied = observation.status, True
            _effects(checkout, transition, observation, now)
        elif refunded_more:
            # A second partial refund: the status stays, the refunded amount is the change.
            checkout.updated_at = now
            transition.applied = True
            transition.reason = f"refunded {checkout.refunded_cents} cents in all"
        else:
            transition.reason = (
                "no change" if before == observation.status else f"{before} does not move back"
            )
        _record(checkout, now, observation, before, applied=transition.applied, detail=transition.reason)
    if commit:
        session.commit()
        send_pending(transition)
    return transition


def send_pending(transition: Transition) -> None:
    """Send the signals of a committed transition (each once)."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    pending, transition._pending = transition._pending, []
    for signal, kwargs in pending:
        signal.send(app, checkout=transition.checkout, **kwargs)


def _effects(
    checkout: GatewayCheckout, transition: Transition, observation: Observation, now: datetime
) -> None:
    after = observation.status

    def queue(signal: Signal, kwargs: dict[str, Any]) -> None:
        transition._pending.append((signal, kwargs))

    if after in PAID_STATUSES and checkout.payment_confirmed_at is None:
        checkout.payment_confirmed_at = now
        checkout.paid_at = observation.paid_at or now
        checkout.paid_cents = checkout.total_cents
        queue(signals.payment_confirmed, {"source": observation.source})
        if rank(transition.before) == RANK[S.CANCELLED_BY_MERCHANT]:
            checkout.flagged = True
            checkout.flag_reason = f"paid after the shop saw it {transition.before}: review the order"
    elif after in (S.CANCELLED_BY_CONSUMER, S.CANCELLED_BY_MERCHANT):
        queue(signals.checkout_cancelled, {"status": after, "source": observation.source})
    elif after == S.EXPIRED:
        queue(signals.checkout_expired, {"source": observation.source})


def _record(
    checkout: GatewayCheckout,
    now: datetime,
    observation: Observation,
    before: str,
    *,
    applied: bool,
    detail: str,
) -> None:
    # The gateway may report a status this version does not know: it is recorded as it came, within the
    # column (PostgreSQL refuses a longer value, or U+0000, where SQLite would keep it).
    to_status = storable_text(observation.status, STATUS_LENGTH)
    reported = f"status as reported: {observation.status!r}" if to_status != observation.status else ""
    text = "; ".join(part for part in (observation.detail, detail, reported) if part)
    # Through the event's side of the relationship: the checkout's event list is not loaded to add one
    # (appending to ``checkout.events`` would read every earlier event of the checkout first).
    session = object_session(checkout)
    if session is None:  # pragma: no cover - apply() always works on a row it loaded
        raise RuntimeError("the checkout is not in a session")
    session.add(
        CheckoutEvent(
            checkout=checkout,
            at=now,
            source=observation.source,
            from_status=before,
            to_status=to_status,
            applied=applied,
            detail=storable_text(text),
        )
    )
