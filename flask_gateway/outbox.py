"""The outbox: the events the shop's code must hear of, delivered at least once.

A status change that the shop must act on (a payment confirmed, a cancellation, an expiry, a refund, a flag,
a payment after the order was closed) writes an ``OutboxEvent`` row **in the same transaction** as the
change (``transitions.apply``, ``refunds``): the change and the duty to tell the shop commit together or
not at all. Delivering an event sends its signal (``flask_gateway.signals``) to the shop's receivers with
``checkout``, the event's own keyword arguments and ``event_id``.

- **At once, by default** (``GATEWAY_OUTBOX_DELIVER_AT_ONCE``): right after the commit, in the same request,
  as the signals always were. The row is claimed for :data:`CLAIM_LEASE` when it is written, so no other
  process delivers it meanwhile.
- **A receiver that raises** does not undo the change, nor fail the request that made it (a callback is
  still answered 200, the gateway does not retry a callback the shop did process): the attempt is counted,
  the error kept, and the event is due again after ``GATEWAY_OUTBOX_RETRY_SECONDS``, twice as long after
  each failure (at most 6 hours). After ``GATEWAY_OUTBOX_MAX_ATTEMPTS`` it is **dead**: a person decides
  (``/gateway/admin/outbox``, ``flask gateway outbox``), and a dead ``payment_confirmed`` sends
  ``fulfilment_failed`` (the hook for the shop's policy).
- **Retries** are made by :func:`deliver_due`: ``flask gateway deliver`` from cron, or the task queue
  (``flask_gateway.tasks``). Due rows are claimed in a short transaction (``FOR UPDATE SKIP LOCKED`` on
  PostgreSQL, the write lock on SQLite) and leased, so several workers never deliver one event at once; a
  worker that dies leaves its rows to the next run after the lease.
- **At least once**: an event may be delivered again (a receiver that raised after doing half its work, a
  worker killed after the receivers ran and before the row was marked). Each delivery of one event carries
  the same ``event_id``: a receiver that does its work once per ``event_id`` (or per order, as fulfilment
  usually is) is exactly once.

No transaction of the extension's is open while the receivers run (on SQLite one would hold the write
lock the shop's own commit needs).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final

from blinker import Signal
from flask import current_app
from sqlalchemy import or_, select, update
from sqlalchemy.orm import Session

from flask_gateway import signals
from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import GatewayCheckout, OutboxEvent, OutboxState, RefundRecord
from flask_gateway.state import get_state, leaves_no_transaction

__all__ = [
    "CLAIM_LEASE",
    "KINDS",
    "DeliveryReport",
    "Queued",
    "add",
    "backlog",
    "deliver_due",
    "deliver_now",
    "redeliver",
]

_log = logging.getLogger(__name__)

#: The signals delivered through the outbox, by the ``kind`` their rows carry.
KINDS: Final[Mapping[str, Signal]] = {
    "payment_confirmed": signals.payment_confirmed,
    "checkout_cancelled": signals.checkout_cancelled,
    "checkout_expired": signals.checkout_expired,
    "refund_succeeded": signals.refund_succeeded,
    "checkout_flagged": signals.checkout_flagged,
    "payment_after_close": signals.payment_after_close,
}
_KIND_OF: Final = {id(signal): kind for kind, signal in KINDS.items()}

#: How long a delivery holds the rows it took (real time). Read at each claim, so a test may shorten it
#: (tests/tasks sets a few seconds to see a killed worker's event delivered by another in seconds, not a
#: minute); a shop has no reason to: a receiver is expected to return well within it.
CLAIM_LEASE: timedelta = timedelta(seconds=60)
#: The longest wait between two attempts.
MAX_RETRY_DELAY: Final = timedelta(hours=6)


@dataclass
class Queued:
    """An event written in the current transaction, with the live objects its receivers get at once."""

    event: OutboxEvent
    checkout: GatewayCheckout
    kwargs: dict[str, Any]


def add(session: Session, checkout: GatewayCheckout, signal: Signal, kwargs: dict[str, Any]) -> Queued:
    """Write the event of ``signal`` for ``checkout`` into ``session``'s transaction (committed with it)."""
    kind = _KIND_OF.get(id(signal))
    if kind is None:
        raise ValueError(f"{signal!r} is not delivered through the outbox")
    now = utcnow()
    at_once = get_state().config.outbox_deliver_at_once
    payload = {
        ("refund_id" if name == "refund" else name): (value.id if isinstance(value, RefundRecord) else value)
        for name, value in kwargs.items()
    }
    event = OutboxEvent(
        checkout_id=checkout.id,
        kind=kind,
        payload=payload,
        state=OutboxState.PENDING.value,
        attempts=0,
        created_at=now,
        next_attempt_at=now,
        # Taken by the request that writes it, which delivers it right after the commit.
        claimed_until=now + CLAIM_LEASE if at_once else None,
    )
    session.add(event)
    return Queued(event, checkout, dict(kwargs))


@dataclass
class DeliveryReport:
    delivered: int = 0
    failed: int = 0
    dead: int = 0
    #: ``(event id, error)`` of each failed attempt.
    errors: list[tuple[int, str]] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{self.delivered} delivered, {self.failed} failed, {self.dead} dead"


def deliver_now(queued: Iterable[Queued]) -> DeliveryReport:
    """Deliver events just committed (the request that wrote them), unless ``GATEWAY_OUTBOX_DELIVER_AT_ONCE``
    is off (then ``deliver_due`` does)."""
    report = DeliveryReport()
    items = list(queued)
    if not items or not get_state().config.outbox_deliver_at_once:
        return report
    outcomes = [
        (item.event.id, item.checkout, _send(item.event, item.checkout, item.kwargs)) for item in items
    ]
    _settle(outcomes, report)
    return report


@leaves_no_transaction
def deliver_due(limit: int = 100) -> DeliveryReport:
    """Deliver up to ``limit`` events that are due (pending, their time come, not taken by another).

    One claim per event, right before its delivery: a lease taken for a whole batch could run out while
    earlier receivers of the batch run, and another worker then deliver the same event at the same time.
    """
    report = DeliveryReport()
    for _ in range(limit):
        claimed = _claim(1)
        if not claimed:
            break
        _deliver_one(claimed[0], report)
    return report


@leaves_no_transaction
def redeliver(event_id: int) -> DeliveryReport:
    """Deliver one event now, whatever its state or time (a person's "deliver again"); a delivered event is
    delivered again (its receivers see the same ``event_id``). Raises ``LookupError`` for an unknown id."""
    session = get_state().session
    event = session.get(OutboxEvent, event_id, with_for_update=True)
    if event is None:
        session.rollback()
        raise LookupError(f"no outbox event {event_id}")
    now = utcnow()
    if event.claimed_until is not None and event.claimed_until > now and event.state == OutboxState.PENDING:
        session.rollback()
        raise LookupError(f"outbox event {event_id} is being delivered right now: try again in a minute")
    event.claimed_until = now + CLAIM_LEASE
    commit_keeping_loaded(session)
    report = DeliveryReport()
    _deliver_one(event_id, report, again=True)
    return report


@leaves_no_transaction
def backlog() -> tuple[int, datetime | None]:
    """How many events wait for delivery (pending), and when the oldest was written."""
    session = get_state().session
    rows = session.execute(
        select(OutboxEvent.id, OutboxEvent.created_at).where(OutboxEvent.state == OutboxState.PENDING)
    ).all()
    return len(rows), min((row.created_at for row in rows), default=None)


# --- delivering ------------------------------------------------------------------------------------------


def _claim(limit: int) -> list[int]:
    """Take up to ``limit`` due events in one short transaction (leased; skipped when another holds them)."""
    session = get_state().session
    now = utcnow()
    try:
        ids = list(
            session.scalars(
                select(OutboxEvent.id)
                .where(
                    OutboxEvent.state == OutboxState.PENDING,
                    OutboxEvent.next_attempt_at <= now,
                    or_(OutboxEvent.claimed_until.is_(None), OutboxEvent.claimed_until < now),
                )
                .order_by(OutboxEvent.next_attempt_at, OutboxEvent.id)
                .limit(limit)
                .with_for_update(skip_locked=True)
            )
        )
        if ids:
            session.execute(
                update(OutboxEvent)
                .where(OutboxEvent.id.in_(ids))
                .values(claimed_until=now + CLAIM_LEASE)
                .execution_options(synchronize_session=False)
            )
        commit_keeping_loaded(session)  # what earlier receivers were given stays readable
    except BaseException:
        session.rollback()
        raise
    return ids


def _deliver_one(event_id: int, report: DeliveryReport, *, again: bool = False) -> None:
    session = get_state().session
    event = session.get_one(OutboxEvent, event_id, populate_existing=True)
    checkout = session.get_one(GatewayCheckout, event.checkout_id)
    kwargs = dict(event.payload)
    refund_id = kwargs.pop("refund_id", None)
    if refund_id is not None:
        kwargs["refund"] = session.get(RefundRecord, refund_id)
    commit_keeping_loaded(session)  # the receivers run with no transaction of ours open, objects loaded
    _settle([(event_id, checkout, _send(event, checkout, kwargs))], report, again=again)


def _send(event: OutboxEvent, checkout: GatewayCheckout, kwargs: dict[str, Any]) -> str | None:
    """Send the event's signal; ``None`` when every receiver returned, else what one raised."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    try:
        KINDS[event.kind].send(app, checkout=checkout, event_id=event.id, **kwargs)
    except Exception as exc:
        _log.exception(
            "a receiver of %s failed for checkout %s (outbox event %s); it is delivered again later",
            event.kind,
            checkout.token or checkout.id,
            event.id,
        )
        return f"{type(exc).__name__}: {exc}"[:2000]
    return None


def _settle(
    outcomes: list[tuple[int, GatewayCheckout, str | None]], report: DeliveryReport, *, again: bool = False
) -> None:
    """Record the attempts in one short transaction; then tell the shop of a fulfilment that died."""
    state = get_state()
    session = state.session
    now = utcnow()
    died: list[tuple[GatewayCheckout, int, str]] = []
    try:
        for event_id, checkout, error in outcomes:
            event = session.get_one(OutboxEvent, event_id, with_for_update=True, populate_existing=True)
            event.attempts += 1
            event.claimed_until = None
            if error is None:
                event.state = OutboxState.DELIVERED.value
                event.delivered_at = now
                event.last_error = None
                report.delivered += 1
                continue
            event.last_error = error
            report.failed += 1
            report.errors.append((event_id, error))
            if event.attempts >= state.config.outbox_max_attempts and (
                not again or event.state != OutboxState.DEAD
            ):
                if event.state != OutboxState.DEAD and event.kind == "payment_confirmed":
                    died.append((checkout, event_id, error))
                event.state = OutboxState.DEAD.value
                report.dead += 1
            elif event.state != OutboxState.DEAD:
                delay = timedelta(seconds=state.config.outbox_retry_seconds) * 2 ** (event.attempts - 1)
                event.next_attempt_at = now + min(delay, MAX_RETRY_DELAY)
        commit_keeping_loaded(session)
    except BaseException:
        session.rollback()
        raise
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    for checkout, event_id, error in died:
        _log.error(
            "checkout %s: the payment could not be fulfilled, every delivery of outbox event %s failed (%s)",
            checkout.token or checkout.id,
            event_id,
            error,
        )
        try:
            signals.fulfilment_failed.send(app, checkout=checkout, event_id=event_id, error=error)
        except Exception:
            _log.exception("a receiver of fulfilment_failed failed for outbox event %s", event_id)
