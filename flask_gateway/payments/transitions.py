"""The ONE place a checkout's status changes on the merchant side: the rules' decision, written under the
row lock.

Every path that learns a status (callback, return page, v1 URL, getstatus poll, reconciliation, admin
action) builds an ``Observation`` and calls :func:`apply`: it locks the row, asks
:func:`flask_gateway.payments.decision.decide` (every rule of the state machine), writes the decision (the
columns, the event, the outbox rows, the refunds), commits, and only then delivers the events. The row's
``payment_confirmed_at`` (set under the lock) decides which transaction confirmed the payment.
:func:`apply_unchanged` records many observations the rules say change nothing in a few statements.
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

from flask_gateway.core.sql import commit_keeping_loaded, storable_text
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import (
    STATUS_LENGTH,
    CheckoutEvent,
    GatewayCheckout,
    RefundRecord,
    RefundState,
)
from flask_gateway.payments import outbox
from flask_gateway.payments.decision import (
    NO_CHANGE,
    RANK,
    Current,
    Decision,
    Observation,
    Refund,
    decide,
    moves,
    rank,
)
from flask_gateway.payments.outbox import Queued

__all__ = [
    "NO_CHANGE",
    "RANK",
    "Observation",
    "Transition",
    "Unchanged",
    "apply",
    "apply_unchanged",
    "lock",
    "lock_by_token",
    "rank",
    "send_pending",
    "would_apply",
]

#: Whether a checkout in ``before`` would move to ``after`` (the rules' forward-only move).
would_apply: Final = moves


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


def _current(checkout: GatewayCheckout, *, refunds: bool = False) -> Current:
    """The checkout as the rules read it; its pending refunds read (a statement) only with ``refunds``."""
    pending = (
        tuple(Refund(r.amount_cents, r.id) for r in checkout.refunds if r.state == RefundState.PENDING)
        if refunds
        else None
    )
    return Current(
        status=checkout.status,
        merchant_account_id=checkout.merchant_account_id,
        total_cents=checkout.total_cents,
        token=checkout.token,
        payment_url=checkout.payment_url,
        expires_at=checkout.expires_at,
        refunded_cents=checkout.refunded_cents,
        paid_at=checkout.paid_at,
        payment_confirmed=checkout.payment_confirmed_at is not None,
        flagged=checkout.flagged,
        pending_refunds=pending,
    )


def apply(session: Session, checkout_id: int, observation: Observation, *, commit: bool = True) -> Transition:
    """Apply what ``observation`` says to checkout ``checkout_id`` under its row lock.

    ``commit``: commit and deliver the events; without it the caller commits and then calls
    :func:`send_pending`.
    """
    checkout = lock(session, checkout_id)
    now = utcnow()
    decision = decide(_current(checkout), observation, now)
    if decision.needs_refunds:
        decision = decide(_current(checkout, refunds=True), observation, now)
    transition = _write(session, checkout, observation, decision, now)
    if commit:
        # Kept loaded: the signals' receivers (the shop's code) read the checkout without reloading it,
        # so they open no transaction of the extension's (on SQLite one would hold the write lock).
        commit_keeping_loaded(session)
        send_pending(transition)
    return transition


def _write(
    session: Session, checkout: GatewayCheckout, observation: Observation, decision: Decision, now: datetime
) -> Transition:
    """Write ``decision`` on the locked ``checkout``: its columns, refunds, outbox rows and event."""
    transition = Transition(
        checkout=checkout,
        before=decision.before,
        after=decision.after,
        applied=decision.applied,
        flagged=decision.refused,
        reason=decision.reason,
    )
    for name, value in decision.changes.items():
        setattr(checkout, name, value)
    records = _settle(session, checkout, decision)
    for notice in decision.notices:
        kwargs = dict(notice.arguments)
        if notice.refund is not None:
            kwargs = {"refund": records[decision.refunds.index(notice.refund)], **kwargs}
        transition.queue(outbox.KINDS[notice.kind], **kwargs)
    detail = decision.detail
    if records:
        amounts = ", ".join(f"{r.amount_cents} cents (refund #{r.id})" for r in records)
        detail = transition.reason = f"refund seen at the gateway recorded: {amounts}"
    # Through the event's side of the relationship: the checkout's event list is not loaded to add one
    # (appending to ``checkout.events`` would read every earlier event of the checkout first).
    session.add(
        CheckoutEvent(
            checkout=checkout, **_event(now, observation, decision.before, decision.applied, detail)
        )
    )
    return transition


def _settle(session: Session, checkout: GatewayCheckout, decision: Decision) -> list[RefundRecord]:
    """The refund records ``decision`` settles (a refund made at the gateway written first), succeeded."""
    if not decision.refunds:
        return []
    by_id = {record.id: record for record in checkout.refunds}
    records = []
    for refund in decision.refunds:
        if refund.id is None:
            record = RefundRecord(
                request_id=f"gateway-{uuid.uuid4()}",
                amount_cents=refund.amount_cents,
                reason=refund.reason,
                state=RefundState.PENDING.value,
                created_at=decision.refunds_at,
            )
            checkout.refunds.append(record)
            session.flush()
        else:
            record = by_id[refund.id]
        record.state = RefundState.SUCCEEDED.value
        record.completed_at = decision.refunds_at
        record.error = None
        records.append(record)
    return records


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
    """``apply`` (``commit=False``) of the observations (checkout id -> observation) the rules say change
    nothing (:attr:`Decision.unchanged`), in a few statements for all of them; the others are left to
    ``apply``.

    Written: one ``SELECT ... FOR UPDATE`` of the rows (in id order), one ``UPDATE`` of the ``stamp``
    columns, one of the ``expires_at`` that moved (when any did), one ``INSERT`` of the events; no entity
    loaded, no outbox row. ``unless(row)``: a row the caller wants through ``apply`` after all, asked
    before anything is written. Returns the rows recorded here; their entities in the session's identity
    map are kept in step.
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
            c.paid_at,
            c.payment_confirmed_at,
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
        current = Current(
            status=row.status,
            merchant_account_id=row.merchant_account_id,
            total_cents=row.total_cents,
            token=row.token,
            payment_url=row.payment_url,
            expires_at=row.expires_at,
            refunded_cents=row.refunded_cents,
            paid_at=row.paid_at,
            payment_confirmed=row.payment_confirmed_at is not None,
            flagged=row.flagged,
        )
        decision = decide(current, observed, now)
        if not decision.unchanged:
            continue
        expires_at = decision.changes.get("expires_at", row.expires_at)
        unchanged = Unchanged(row.id, row.status, expires_at, row.refunded_cents, row.flagged)
        if unless is not None and unless(unchanged):
            continue
        found[row.id] = unchanged
        if "expires_at" in decision.changes:
            moved.append({"b_id": row.id, "b_expires_at": expires_at})
        events.append({"checkout_id": row.id, **_event(now, observed, row.status, False, decision.detail)})
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


def _event(
    now: datetime, observation: Observation, before: str, applied: bool, detail: str
) -> dict[str, Any]:
    """The columns of the event recording ``observation`` (but its checkout), for ``apply`` and
    ``apply_unchanged`` alike."""
    # The gateway may report a status this version does not know: the column (``StoredText``) keeps what
    # fits of it, and the detail says it as it came when that is not all of it.
    to_status = storable_text(observation.status, STATUS_LENGTH)
    reported = f"status as reported: {observation.status!r}" if to_status != observation.status else ""
    text = "; ".join(part for part in (observation.detail, detail, reported) if part)
    return {
        "at": now,
        "source": observation.source,
        "from_status": before,
        "to_status": to_status,
        "applied": applied,
        "detail": text,
    }
