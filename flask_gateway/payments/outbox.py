"""The outbox: the events the shop's code must hear of, delivered at least once.

A status change that the shop must act on (a payment confirmed, a cancellation, an expiry, a refund, a flag,
a payment after the order was closed) writes an ``OutboxEvent`` row **in the same transaction** as the
change (``transitions.apply``, ``refunds``): the change and the duty to tell the shop commit together or
not at all. Delivering an event sends its signal (``flask_gateway.signals``) to the shop's receivers with
``checkout``, ``account`` (the checkout's merchant account), the event's own keyword arguments and
``event_id``. The row's ``payload`` keeps those arguments and the checkout's ``merchant_account_id`` (so
a consumer of the table, or a person on the outbox screen, sees the account without a join).

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
  PostgreSQL, the write lock on SQLite) and leased, so several workers never deliver one event at once.
- **A short lease, renewed while the receivers run** (:data:`CLAIM_LEASE`, 10 s): a delivery still running
  after a third of it extends the lease of the rows it holds, every third of it, from a daemon thread of the
  process (``_Heartbeat``), each time in a short transaction of its own. A receiver slower than the lease
  keeps its event; a process that dies stops renewing, and its rows are free within the lease: the next
  ``deliver_due`` after that delivers them, so within lease + tick of the death (15 s with the task
  queue's 5 s tick, ``flask_gateway.tasks``). A receiver that returns within a third of the lease (nearly
  all) costs no renewal: no extra round trip. Events a caller delivers long after it wrote them (the last
  changes of a reconciliation batch) are taken again first, or left to the delivery that took them.
- **At least once**: an event may be delivered again (a receiver that raised after doing half its work, a
  worker killed after the receivers ran and before the row was marked). Each delivery of one event carries
  the same ``event_id``: a receiver that does its work once per ``event_id`` (or per order, as fulfilment
  usually is) is exactly once.

No transaction of the extension's is open while the receivers run (on SQLite one would hold the write
lock the shop's own commit needs); a renewal holds the write lock for one ``UPDATE``, as a claim does.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from time import monotonic
from typing import Any, Final, cast

from blinker import Signal
from flask import current_app
from sqlalchemy import ColumnElement, Table, bindparam, or_, select, update
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session
from sqlalchemy.orm.attributes import set_committed_value

from flask_gateway import signals
from flask_gateway.core.outages import describe_database_error, is_database_outage
from flask_gateway.core.spells import Spells
from flask_gateway.core.sql import commit_keeping_loaded, sqlite_in_memory, statement_by_statement
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import GatewayCheckout, OutboxEvent, OutboxState, RefundRecord
from flask_gateway.payments.heartbeats import record_run
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
    "of_accounts",
    "redeliver",
]

_log = logging.getLogger("flask_gateway.outbox")  # not __name__: the name is an interface (docs/logging.md)

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

#: How long a claim holds an event (real time) unless the delivery renews it: every third of it while the
#: receivers run, so only a delivery that died (its process killed) lets it run out, and its event is free
#: at most this long after the death. Read at each claim and renewal, so a test may shorten it
#: (tests/tasks: a few seconds); a shop has no reason to. The module reads the time through its names
#: ``utcnow`` (the leases and due times written in the rows) and ``monotonic`` (when the heartbeat renews),
#: so a test may put a clock of its own in their place.
CLAIM_LEASE: timedelta = timedelta(seconds=10)
#: The longest wait between two attempts.
MAX_RETRY_DELAY: Final = timedelta(hours=6)
#: The payload's key of the checkout's merchant account (not a keyword argument of the signal: the signal
#: gets ``account``).
_ACCOUNT_KEY: Final = "merchant_account_id"


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
    # The account is the checkout's and never changes: recorded for the table's readers, sent as
    # ``account`` from the checkout itself (events written before the account was recorded have none).
    payload[_ACCOUNT_KEY] = checkout.merchant_account_id
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
    """What a delivery round did: events delivered, attempts that failed, events that became dead (a person
    decides: ``GATEWAY_OUTBOX_MAX_ATTEMPTS`` reached)."""

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
    items = _still_ours(items)
    with _renewed([item.event.id for item in items]):
        outcomes = [
            (item.event.id, item.checkout, _send(item.event, item.checkout, item.kwargs)) for item in items
        ]
    _settle(outcomes, report)
    return report


def _still_ours(items: list[Queued]) -> list[Queued]:
    """The events whose claim (taken when they were written) still holds, renewed when it is old.

    Nearly always every one, at the cost of a clock read: the request delivers right after its commit. A
    caller that commits many changes and then delivers their events one change after another
    (reconciliation's batches) may come to the last ones after a third of the lease: each is taken
    again, if its claim is still the one written with it (no other delivery took it meanwhile), and
    skipped otherwise (that delivery has it).
    """
    now = utcnow()
    fresh = now + CLAIM_LEASE * 2 / 3
    if all(item.event.claimed_until is not None and item.event.claimed_until > fresh for item in items):
        return items
    session = get_state().session
    kept: list[Queued] = []
    try:
        for item in items:
            written = item.event.claimed_until
            if written is not None and written > fresh:
                kept.append(item)
                continue
            taken = session.execute(
                update(OutboxEvent)
                .where(
                    OutboxEvent.id == item.event.id,
                    OutboxEvent.state == OutboxState.PENDING.value,
                    OutboxEvent.claimed_until == written,
                )
                .values(claimed_until=now + CLAIM_LEASE)
                .execution_options(synchronize_session=False)
            )
            if taken.rowcount == 1:  # type: ignore[attr-defined]  # a CursorResult
                kept.append(item)
            else:
                _log.info(
                    "outbox event %s was taken by another delivery before this one came to it", item.event.id
                )
        commit_keeping_loaded(session)
    except BaseException:
        session.rollback()
        raise
    return kept


@leaves_no_transaction
def deliver_due(limit: int = 100, *, accounts: Collection[str] | None = None) -> DeliveryReport:
    """Deliver up to ``limit`` events that are due (pending, their time come, not taken by another); with
    ``accounts``, only the events of those accounts' checkouts (a person limited to them: not a run of the
    ``deliver`` job, whose heartbeat speaks for every account).

    One claim per event, right before its delivery: a lease taken for a whole batch could run out while
    earlier receivers of the batch run, and another worker then deliver the same event at the same time.
    """
    report = DeliveryReport()
    if accounts is not None:
        _deliver_claimed(limit, accounts, report)
        return report
    with record_run("deliver") as run:  # the heartbeat (flask_gateway.payments.heartbeats)
        _deliver_claimed(limit, None, report)
        run.done(str(report), failed=bool(report.errors))
    return report


def _deliver_claimed(limit: int, accounts: Collection[str] | None, report: DeliveryReport) -> None:
    for _ in range(limit):
        claimed = _claim(1, accounts)
        if not claimed:
            break
        _deliver_one(claimed[0], report)


def of_accounts(accounts: Collection[str] | None) -> tuple[ColumnElement[bool], ...]:
    """The conditions that keep to the events of ``accounts``' checkouts (None: every event)."""
    if accounts is None:
        return ()
    return (
        OutboxEvent.checkout_id.in_(
            select(GatewayCheckout.id).where(GatewayCheckout.merchant_account_id.in_(sorted(accounts)))
        ),
    )


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
        raise LookupError(f"outbox event {event_id} is being delivered right now: try again in a few seconds")
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


def _claim(limit: int, accounts: Collection[str] | None = None) -> list[int]:
    """Take up to ``limit`` due events (of ``accounts``' checkouts, None: any) in one short transaction
    (leased; skipped when another holds them)."""
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
                    *of_accounts(accounts),
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
    kwargs.pop(_ACCOUNT_KEY, None)
    refund_id = kwargs.pop("refund_id", None)
    if refund_id is not None:
        kwargs["refund"] = session.get(RefundRecord, refund_id)
    commit_keeping_loaded(session)  # the receivers run with no transaction of ours open, objects loaded
    with _renewed([event_id]):
        error = _send(event, checkout, kwargs)
    _settle([(event_id, checkout, error)], report, again=again)


def _send(event: OutboxEvent, checkout: GatewayCheckout, kwargs: dict[str, Any]) -> str | None:
    """Send the event's signal; ``None`` when every receiver returned, else what one raised."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    try:
        KINDS[event.kind].send(
            app, checkout=checkout, account=checkout.merchant_account_id, event_id=event.id, **kwargs
        )
    except Exception as exc:
        if is_database_outage(exc):
            # The database went away under the receiver (a restart, a failover): one line without a
            # traceback, as the requests log an outage; the event is delivered again once it answers.
            _log.warning(
                "a receiver of %s failed for checkout %s (outbox event %s): the database is unreachable "
                "(%s); it is delivered again later",
                event.kind,
                checkout.token or checkout.id,
                event.id,
                describe_database_error(exc),
            )
        else:
            _log.exception(
                "a receiver of %s failed for checkout %s (outbox event %s); it is delivered again later",
                event.kind,
                checkout.token or checkout.id,
                event.id,
            )
        return f"{type(exc).__name__}: {exc}"[:2000]
    return None


_TABLE: Final = cast(Table, OutboxEvent.__table__)

#: The events whose receivers all returned, marked delivered in one statement (no row read first): only
#: rows still claimed, i.e. held by a delivery (each delivery claims its events, and only a settling ends
#: a claim). An event another delivery settled meanwhile (its lease ran out while the receivers ran, and
#: that delivery took it) is left as that one settled it: not counted twice, and delivered again later if
#: that attempt failed (at least once). ``RETURNING`` says which rows were marked, with their attempts.
_MARK_DELIVERED: Final = (
    update(_TABLE)
    .where(_TABLE.c.id.in_(bindparam("ids", expanding=True)), _TABLE.c.claimed_until.is_not(None))
    .values(
        state=OutboxState.DELIVERED.value,
        attempts=_TABLE.c.attempts + 1,
        claimed_until=None,
        delivered_at=bindparam("now", type_=_TABLE.c.delivered_at.type),
        last_error=None,
    )
    .returning(_TABLE.c.id, _TABLE.c.attempts)
)


def _mark_delivered(session: Session, event_ids: list[int], now: datetime) -> None:
    """``_MARK_DELIVERED``; the events this session holds get the values written (kept loaded, not
    dirty: read afterwards without a query)."""
    marked = {row[0]: row[1] for row in session.execute(_MARK_DELIVERED, {"ids": event_ids, "now": now})}
    for event_id in event_ids:
        attempts = marked.get(event_id)
        if attempts is None:
            _log.info(
                "outbox event %s was settled by another delivery while this one ran: left as it is", event_id
            )
            continue
        event = session.identity_map.get(session.identity_key(OutboxEvent, event_id))
        if event is not None:
            for name, value in (
                ("state", OutboxState.DELIVERED.value),
                ("attempts", attempts),
                ("claimed_until", None),
                ("delivered_at", now),
                ("last_error", None),
            ):
                set_committed_value(event, name, value)


def _settle(
    outcomes: list[tuple[int, GatewayCheckout, str | None]], report: DeliveryReport, *, again: bool = False
) -> None:
    """Record the attempts in one short transaction (a delivery whose receivers all returned: one
    statement); then tell the shop of a fulfilment that died."""
    state = get_state()
    session = state.session
    now = utcnow()
    died: list[tuple[GatewayCheckout, int, str]] = []
    delivered = [event_id for event_id, _checkout, error in outcomes if error is None]
    try:
        if delivered and len(delivered) == len(outcomes):
            statement_by_statement(session)
        if delivered:
            _mark_delivered(session, delivered, now)
            report.delivered += len(delivered)
        for event_id, checkout, error in outcomes:
            if error is None:
                continue
            event = session.get_one(OutboxEvent, event_id, with_for_update=True, populate_existing=True)
            event.attempts += 1
            event.claimed_until = None
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
            signals.fulfilment_failed.send(
                app, checkout=checkout, account=checkout.merchant_account_id, event_id=event_id, error=error
            )
        except Exception:
            _log.exception("a receiver of fulfilment_failed failed for outbox event %s", event_id)


# --- renewing the lease while the receivers run ------------------------------------------------------------


@contextmanager
def _renewed(ids: Sequence[int]) -> Iterator[None]:
    """Keep the claim of the events ``ids`` (claimed by this delivery) while the block runs.

    The process's heartbeat renews their lease every third of it, the first time a third of the lease
    after the block began: a block that ends sooner costs a lock and a dict entry, no database round
    trip. Left before the attempt is settled, so no renewal follows the settling.
    """
    engine = get_state().engine
    # An in-memory SQLite database has one connection for the whole app, which another thread must not
    # use; it has one process too, so no dead process's events to free either.
    if not ids or sqlite_in_memory(engine):
        yield
        return
    hold = _HEARTBEAT.hold(engine, ids)
    try:
        yield
    finally:
        _HEARTBEAT.release(hold)


@dataclass(eq=False)
class _Hold:
    """Events one delivery holds: renewed on ``engine`` at ``due`` (monotonic), then every ``period``."""

    engine: Engine
    ids: tuple[int, ...]
    lease: timedelta
    period: float
    due: float


class _Heartbeat:
    """One daemon thread per process that renews the leases of the deliveries still running.

    It sleeps until the next renewal is due (or for good when nothing is held), renews each due hold in a
    short transaction of its own (one ``UPDATE`` per engine, never while holding the lock deliveries
    take), and never touches the request's session. A renewal that fails (the database away) is logged
    once and tried again at the next period; meanwhile the lease may run out and another process deliver
    the event again (with the same ``event_id``: at least once). The thread does not survive a fork (a
    prefork pool, ``gunicorn --preload``): the child starts its own on its first hold.
    """

    def __init__(self) -> None:
        self._reset()
        os.register_at_fork(after_in_child=self._reset)

    def _reset(self) -> None:
        self._wake = threading.Condition()
        self._holds: set[_Hold] = set()
        self._thread: threading.Thread | None = None
        self._failing: Spells[None] = Spells()

    def hold(self, engine: Engine, ids: Sequence[int]) -> _Hold:
        lease = CLAIM_LEASE
        period = lease.total_seconds() / 3
        hold = _Hold(engine, tuple(ids), lease, period, monotonic() + period)
        with self._wake:
            self._holds.add(hold)
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="flask-gateway-outbox-lease", daemon=True
                )
                self._thread.start()
            elif len(self._holds) == 1:
                self._wake.notify()  # it sleeps for good while nothing is held
        return hold

    def release(self, hold: _Hold) -> None:
        with self._wake:
            self._holds.discard(hold)

    def _run(self) -> None:
        while True:
            with self._wake:
                due = self._wait_for_due()
                for hold in due:
                    hold.due = monotonic() + hold.period
            self._renew(due)

    def _wait_for_due(self) -> list[_Hold]:
        while True:
            if not self._holds:
                self._wake.wait()
                continue
            now = monotonic()
            due = [hold for hold in self._holds if hold.due <= now]
            if due:
                return due
            self._wake.wait(min(hold.due for hold in self._holds) - now)

    def _renew(self, due: list[_Hold]) -> None:
        by_engine: dict[int, tuple[Engine, list[_Hold]]] = {}
        for hold in due:
            by_engine.setdefault(id(hold.engine), (hold.engine, []))[1].append(hold)
        for engine, holds in by_engine.values():
            ids = sorted({event_id for hold in holds for event_id in hold.ids})
            until = utcnow() + max(hold.lease for hold in holds)
            try:
                with engine.begin() as connection:
                    connection.execute(
                        update(OutboxEvent)
                        .where(
                            OutboxEvent.id.in_(ids),
                            OutboxEvent.state == OutboxState.PENDING.value,
                            # Settled meanwhile (the hold was released as this renewal began): left alone.
                            OutboxEvent.claimed_until.is_not(None),
                        )
                        .values(claimed_until=until)
                    )
            except Exception as error:  # the thread must live on: the next period tries again
                if self._failing.failed(None):
                    _log.warning(
                        "the lease of outbox event(s) %s could not be renewed (%s): if it runs out, another "
                        "delivery may deliver them again",
                        ", ".join(map(str, ids)),
                        describe_database_error(error),
                    )
                continue
            if self._failing.succeeded(None) is not None:
                _log.warning("the leases of the outbox's deliveries are renewed again")


_HEARTBEAT: Final = _Heartbeat()
