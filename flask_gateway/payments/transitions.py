"""The ONE place a checkout's status changes on the merchant side.

Every path that learns a status (callback, return page, v1 URL, getstatus poll, reconciliation, admin
action) builds an ``Observation`` and calls ``apply``. It locks the row, refuses backward moves, checks
amount and account, records an event, commits, and only then sends each signal, once: the row's
``payment_confirmed_at`` (set under the lock) decides which transaction confirmed the payment.

Refund statuses learnt from the gateway (a poll, a confirmed callback; not the shop's own ``refund``)
are recorded under the same lock: ``FULLY_REFUNDED`` records what was not refunded here yet (settling the
shop's own pending refunds when they account for it exactly, else as a ``RefundRecord`` of a refund made
at the gateway, timed by the answer's ``updatedAt``) and sends ``refund_succeeded``; ``PARTIALLY_REFUNDED``
with nothing refunded here settles the one pending refund, or flags the checkout (the status answer does
not carry the amount). Only ``PAID`` and ``PAID_PENDING_CALLBACK`` confirm a payment: a checkout whose
first news of a payment is a refund status was refunded before the shop knew of it, so it is never
confirmed for fulfilment; it is flagged for a person (``checkout_flagged``).

Many observations that change nothing (a reconciliation's answers while the shoppers have not paid yet):
``apply_unchanged`` records what ``apply`` would for each (the event, the answer's expiry, the poll's time)
with a few statements for all of them, and leaves every other observation to ``apply``.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final, cast

from blinker import Signal
from sqlalchemy import Table, bindparam, insert, select, update
from sqlalchemy.orm import Session, object_session
from sqlalchemy.orm.attributes import set_committed_value
from sqlalchemy.orm.util import identity_key

from flask_gateway import signals
from flask_gateway.core.sql import commit_keeping_loaded, storable_text
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import OPEN_STATUSES, PAID_STATUSES, PAYMENT_STATUSES, CheckoutStatus
from flask_gateway.models import (
    STATUS_LENGTH,
    CheckoutEvent,
    GatewayCheckout,
    LocalStatus,
    RefundRecord,
    RefundState,
)
from flask_gateway.payments import outbox
from flask_gateway.payments.outbox import Queued

__all__ = [
    "RANK",
    "Observation",
    "Transition",
    "Unchanged",
    "apply",
    "apply_unchanged",
    "lock",
    "lock_by_token",
    "rank",
    "would_apply",
]

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
_PAYMENT: Final = PAYMENT_STATUSES
_REFUNDED: Final = frozenset({S.PARTIALLY_REFUNDED.value, S.FULLY_REFUNDED.value})


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
    #: When the source says the status last changed (getstatus ``updatedAt``): the time of a refund seen.
    reported_at: datetime | None = None
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
    _pending: list[Queued] = field(default_factory=list, repr=False)

    def queue(self, signal: Signal, **kwargs: Any) -> None:
        """Write the event of ``signal`` to the outbox, in the transaction that makes this change; it is
        delivered by ``send_pending`` after the commit."""
        session = object_session(self.checkout)
        if session is None:  # pragma: no cover - apply() always works on a row it loaded
            raise RuntimeError("the checkout is not in a session")
        self._pending.append(outbox.add(session, self.checkout, signal, kwargs))


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
    return _mismatch_of(checkout.merchant_account_id, checkout.total_cents, observation)


def _mismatch_of(account: str, total_cents: int, observation: Observation) -> str | None:
    """Why ``observation`` does not belong to a checkout of ``account`` for ``total_cents``, or None."""
    if observation.merchant_account_id is not None and observation.merchant_account_id != account:
        return (
            f"merchant account {observation.merchant_account_id!r} does not match the checkout's {account!r}"
        )
    if (
        observation.status in PAID_STATUSES
        and observation.total_cents is not None
        and observation.total_cents != total_cents
    ):
        return f"total {observation.total_cents} cents does not match the checkout's {total_cents}"
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


def would_apply(before: str, after: str) -> bool:
    """Whether a checkout in ``before`` would move to ``after`` (the forward-only rule of ``apply``)."""
    return _allowed(before, after)


def apply(session: Session, checkout_id: int, observation: Observation, *, commit: bool = True) -> Transition:
    """Apply what ``observation`` says to checkout ``checkout_id``; see the module docstring."""
    checkout = lock(session, checkout_id)
    now = utcnow()
    before = checkout.status
    transition = Transition(checkout=checkout, before=before, after=before, applied=False)
    problem = _mismatch(checkout, observation)
    if problem is not None:
        _flag(checkout, transition, problem, observation.source)
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
            transition.reason = NO_CHANGE if before == observation.status else f"{before} does not move back"
        _record(checkout, now, observation, before, applied=transition.applied, detail=transition.reason)
    if commit:
        # Kept loaded: the signals' receivers (the shop's code) read the checkout without reloading it,
        # so they open no transaction of the extension's (on SQLite one would hold the write lock).
        commit_keeping_loaded(session)
        send_pending(transition)
    return transition


#: The detail ``apply`` records for an observation of the status the checkout already has.
NO_CHANGE: Final = "no change"
_CHECKOUTS: Final = cast(Table, GatewayCheckout.__table__)
_EVENTS: Final = cast(Table, CheckoutEvent.__table__)


@dataclass(frozen=True)
class Unchanged:
    """A checkout an observation found as the shop has it, recorded by :func:`apply_unchanged`: the row as
    it is after (what ``Transition.checkout`` shows after ``apply`` of the same observation)."""

    checkout_id: int
    status: str
    expires_at: datetime | None
    refunded_cents: int
    flagged: bool


def apply_unchanged(
    session: Session,
    observations: Mapping[int, Observation],
    *,
    stamp: Mapping[str, Any] | None = None,
    unless: Callable[[Unchanged], bool] | None = None,
) -> dict[int, Unchanged]:
    """``apply`` (``commit=False``) of the observations (by checkout id) that change nothing, in a few
    statements for all of them; the others are left to ``apply``.

    An observation changes nothing when it says the status the row has (within the statuses this version
    knows), belongs to the row (account, and total for a paid status: no mismatch to flag), and carries no
    token, payment URL or refunded amount the row does not have. For those, what ``apply`` records:
    the event (``applied`` false, detail "no change"), ``expires_at`` where the observation says another
    one, and the ``stamp`` columns (``last_polled_at`` for a poll), written with one ``SELECT ... FOR
    UPDATE`` of the rows (by id, in id order), one ``UPDATE`` of ``stamp`` (``WHERE id IN``), one for the
    ``expires_at`` that moved (when any did) and one ``INSERT`` of the events: no entity loaded, no signal,
    nothing in the outbox (``apply`` queues none for them either).

    ``unless(row)``: a row the caller wants through ``apply`` after all (e.g. a checkout that must now
    expire), asked before anything is written. Returns the rows recorded here; the caller applies the
    other observations with ``apply`` in the same transaction (their rows stay locked; ``apply`` locks and
    reads them again). Rows of the session's identity map are kept in step (the values written, as
    committed ones), so an entity read earlier does not show the old ``stamp``.
    """
    if not observations:
        return {}
    c = _CHECKOUTS.c
    rows = session.execute(
        select(
            c.id,
            c.status,
            c.merchant_account_id,
            c.total_cents,
            c.token,
            c.payment_url,
            c.expires_at,
            c.refunded_cents,
            c.flagged,
        )
        .where(c.id.in_(sorted(observations)))
        .order_by(c.id)
        .with_for_update()
    ).all()
    now = utcnow()
    found: dict[int, Unchanged] = {}
    moved: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for row in rows:
        observed = observations[row.id]
        if not (
            row.status == observed.status
            and observed.status in RANK
            and _mismatch_of(row.merchant_account_id, row.total_cents, observed) is None
            and not (observed.token and not row.token)
            and (not observed.payment_url or observed.payment_url == row.payment_url)
            and (observed.refunded_cents is None or observed.refunded_cents <= row.refunded_cents)
        ):
            continue
        expires_at = row.expires_at if observed.expires_at is None else observed.expires_at
        unchanged = Unchanged(row.id, row.status, expires_at, row.refunded_cents, row.flagged)
        if unless is not None and unless(unchanged):
            continue
        found[row.id] = unchanged
        if expires_at != row.expires_at:
            moved.append({"b_id": row.id, "b_expires_at": expires_at})
        events.append({"checkout_id": row.id, **_event(now, observed, row.status, False, NO_CHANGE)})
    if not found:
        return found
    if stamp:
        session.execute(update(_CHECKOUTS).where(c.id.in_(list(found))).values(dict(stamp)))
    if moved:
        session.execute(
            update(_CHECKOUTS).where(c.id == bindparam("b_id")).values(expires_at=bindparam("b_expires_at")),
            moved,
        )
    session.execute(insert(_EVENTS), events)
    for checkout_id, unchanged in found.items():
        held = session.identity_map.get(identity_key(GatewayCheckout, checkout_id))
        if held is not None:
            for name, value in (stamp or {}).items():
                set_committed_value(held, name, value)
            set_committed_value(held, "expires_at", unchanged.expires_at)
    return found


def send_pending(transition: Transition) -> None:
    """Deliver the events of a committed transition (``payments.outbox``: at once, at least once)."""
    pending, transition._pending = transition._pending, []
    outbox.deliver_now(pending)


def _flag(checkout: GatewayCheckout, transition: Transition, reason: str, source: str) -> None:
    """Flag the checkout for a person; ``checkout_flagged`` is sent (after the commit) when it was not yet."""
    if not checkout.flagged:
        transition.queue(signals.checkout_flagged, reason=reason, source=source)
    checkout.flagged = True
    checkout.flag_reason = reason


def _effects(
    checkout: GatewayCheckout, transition: Transition, observation: Observation, now: datetime
) -> None:
    after = observation.status

    if after in _PAYMENT and checkout.payment_confirmed_at is None:
        checkout.payment_confirmed_at = now
        checkout.paid_at = observation.paid_at or now
        checkout.paid_cents = checkout.total_cents
        transition.queue(signals.payment_confirmed, source=observation.source)
        if rank(transition.before) == RANK[S.CANCELLED_BY_MERCHANT]:
            transition.queue(signals.payment_after_close, before=transition.before, source=observation.source)
            _flag(
                checkout,
                transition,
                f"paid after the shop saw it {transition.before}: review the order",
                observation.source,
            )
    elif after in _REFUNDED and observation.source != "refund":
        if checkout.payment_confirmed_at is None:
            # Money was taken and (some or all of it) given back before the shop heard of the payment:
            # whoever refunded it, the order must not be fulfilled without a person looking at it.
            checkout.paid_at = observation.paid_at or checkout.paid_at
            checkout.paid_cents = checkout.total_cents
            _flag(
                checkout,
                transition,
                f"the gateway reports {after} before the shop knew of the payment: never confirmed for "
                "fulfilment; review the order and the gateway's records",
                observation.source,
            )
        _record_gateway_refund(checkout, transition, observation, now)
    elif after in (S.CANCELLED_BY_CONSUMER, S.CANCELLED_BY_MERCHANT):
        transition.queue(signals.checkout_cancelled, status=after, source=observation.source)
    elif after == S.EXPIRED:
        transition.queue(signals.checkout_expired, source=observation.source)


def _record_gateway_refund(
    checkout: GatewayCheckout, transition: Transition, observation: Observation, now: datetime
) -> None:
    """Record a refund status the gateway reports that the shop's own refunds do not account for."""
    session = object_session(checkout)
    if session is None:  # pragma: no cover - apply() always works on a row it loaded
        raise RuntimeError("the checkout is not in a session")
    pending = [r for r in checkout.refunds if r.state == RefundState.PENDING]
    at = observation.reported_at or now
    settled: list[RefundRecord] = []
    if observation.status == S.FULLY_REFUNDED:
        missing = checkout.total_cents - checkout.refunded_cents
        if missing <= 0:
            return
        if pending and sum(r.amount_cents for r in pending) == missing:
            settled = pending  # the answers to the shop's own refunds were lost; the gateway made them
        else:
            record = RefundRecord(
                request_id=f"gateway-{uuid.uuid4()}",
                amount_cents=missing,
                reason=f"refunded at the gateway, not through the shop (seen by {observation.source})",
                state=RefundState.PENDING.value,
                created_at=at,
            )
            checkout.refunds.append(record)
            session.flush()
            settled = [record]
    elif checkout.refunded_cents == 0:  # PARTIALLY_REFUNDED: the answer does not carry the amount
        if len(pending) == 1:
            settled = pending
        else:
            _flag(
                checkout,
                transition,
                "the gateway reports a partial refund the shop did not record (the status answer does not "
                "carry its amount): check the refund on the gateway",
                observation.source,
            )
            return
    for record in settled:
        record.state = RefundState.SUCCEEDED.value
        record.completed_at = at
        record.error = None
        checkout.refunded_cents += record.amount_cents
        transition.queue(signals.refund_succeeded, refund=record, amount_cents=record.amount_cents)
    if settled:
        amounts = ", ".join(f"{r.amount_cents} cents (refund #{r.id})" for r in settled)
        transition.reason = f"refund seen at the gateway recorded: {amounts}"


def _record(
    checkout: GatewayCheckout,
    now: datetime,
    observation: Observation,
    before: str,
    *,
    applied: bool,
    detail: str,
) -> None:
    # Through the event's side of the relationship: the checkout's event list is not loaded to add one
    # (appending to ``checkout.events`` would read every earlier event of the checkout first).
    session = object_session(checkout)
    if session is None:  # pragma: no cover - apply() always works on a row it loaded
        raise RuntimeError("the checkout is not in a session")
    session.add(CheckoutEvent(checkout=checkout, **_event(now, observation, before, applied, detail)))


def _event(
    now: datetime, observation: Observation, before: str, applied: bool, detail: str
) -> dict[str, Any]:
    """The columns of the event recording ``observation`` (but its checkout), for ``_record`` and
    ``apply_unchanged`` alike."""
    # The gateway may report a status this version does not know: it is recorded as it came, within the
    # column (PostgreSQL refuses a longer value, or U+0000, where SQLite would keep it).
    to_status = storable_text(observation.status, STATUS_LENGTH)
    reported = f"status as reported: {observation.status!r}" if to_status != observation.status else ""
    text = "; ".join(part for part in (observation.detail, detail, reported) if part)
    return {
        "at": now,
        "source": observation.source,
        "from_status": before,
        "to_status": to_status,
        "applied": applied,
        "detail": storable_text(text),
    }
