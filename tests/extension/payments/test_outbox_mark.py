"""Marking an outbox event delivered (flask_gateway/payments/outbox.py, issue 30): one ``UPDATE`` with no
row read first (on PostgreSQL in autocommit: one round trip), only on a row still claimed by a delivery,
and the event the request holds shows the values written without a query."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import event, select, update

from flask_gateway import create_checkout, payment_confirmed
from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.models import OutboxEvent, OutboxState
from flask_gateway.payments.transitions import Observation, apply, send_pending
from flask_gateway.state import get_state
from flask_gateway.testing import SHOP_URL, GatewayEmulator
from tests.extension.conftest import sample_order

pytestmark = pytest.mark.backends


@contextmanager
def recorded(app: Flask) -> Iterator[list[tuple[str, bool]]]:
    """(statement, in autocommit) of each statement the extension's engine sends inside the block."""
    with app.app_context():
        engine = get_state().engine
    seen: list[tuple[str, bool]] = []

    def record(conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        dbapi = conn.connection.dbapi_connection
        seen.append((" ".join(statement.split()), bool(getattr(dbapi, "autocommit", False))))

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def paid_but_not_delivered(app: Flask, reference: str) -> Any:
    """A checkout paid (learnt by a poll) and committed: its ``payment_confirmed`` event written and
    claimed for this request's own delivery, not delivered yet (``send_pending`` delivers it)."""
    with app.test_request_context(base_url=SHOP_URL):
        checkout = create_checkout(sample_order(reference))
        checkout_id, total = checkout.id, checkout.total_cents
        session = get_state().session
        session.commit()
    context = app.app_context()
    context.push()
    session = get_state().session
    transition = apply(
        session, checkout_id, Observation(status="PAID", source="poll", total_cents=total), commit=False
    )
    commit_keeping_loaded(session)  # as apply() commits before it delivers
    return context, transition


def outbox_rows(app: Flask) -> list[tuple[str, int]]:
    with app.app_context():
        session = get_state().session
        rows = [(row.state, row.attempts) for row in session.execute(select(OutboxEvent)).scalars()]
        session.rollback()
        return rows


def test_a_delivery_is_marked_in_one_statement(gateway_emulator: GatewayEmulator, gateway_app: Flask) -> None:
    received: list[int] = []

    def receiver(sender: Any, event_id: int, **extra: Any) -> None:
        received.append(event_id)

    payment_confirmed.connect(receiver, sender=gateway_app, weak=False)
    context, transition = paid_but_not_delivered(gateway_app, "ORD-MARK")
    try:
        [queued] = transition._pending
        with recorded(gateway_app) as statements:
            send_pending(transition)
        with recorded(gateway_app) as afterwards:
            held = (queued.event.state, queued.event.attempts, queued.event.claimed_until)
        dialect = get_state().engine.dialect.name
    finally:
        context.pop()
        payment_confirmed.disconnect(receiver, sender=gateway_app)

    assert received == [queued.event.id]
    on_outbox = [(sql, autocommit) for sql, autocommit in statements if "gateway_outbox" in sql]
    assert len(on_outbox) == 1, statements  # before: SELECT ... FOR UPDATE, then the UPDATE
    sql, autocommit = on_outbox[0]
    assert sql.startswith("UPDATE gateway_outbox") and "claimed_until IS NOT NULL" in sql, sql
    if dialect == "postgresql":
        assert autocommit, "the mark is one round trip: no BEGIN, no COMMIT"
        assert statements == on_outbox, statements
    # The event the request holds shows what was written, without reading it again.
    assert held == (OutboxState.DELIVERED, 1, None)
    assert afterwards == []
    assert outbox_rows(gateway_app) == [(OutboxState.DELIVERED, 1)]


def test_an_event_another_delivery_settled_meanwhile_is_left_as_it_settled_it(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    """While the receivers ran, the claim ran out and another delivery took the event, delivered it and
    settled it (its claim released): this delivery's mark leaves the row alone (one attempt, not two)."""

    def receiver(sender: Any, event_id: int, **extra: Any) -> None:
        with get_state().engine.begin() as connection:  # the other delivery's settling
            connection.execute(
                update(OutboxEvent)
                .where(OutboxEvent.id == event_id)
                .values(
                    state=OutboxState.DELIVERED.value, attempts=OutboxEvent.attempts + 1, claimed_until=None
                )
            )

    payment_confirmed.connect(receiver, sender=gateway_app, weak=False)
    context, transition = paid_but_not_delivered(gateway_app, "ORD-TAKEN")
    try:
        with caplog.at_level(logging.INFO, logger="flask_gateway.outbox"):
            send_pending(transition)
    finally:
        context.pop()
        payment_confirmed.disconnect(receiver, sender=gateway_app)

    assert outbox_rows(gateway_app) == [(OutboxState.DELIVERED, 1)]  # before: attempts 2
    assert any("settled by another delivery" in record.getMessage() for record in caplog.records)


def test_a_failed_and_a_delivered_event_settled_together(
    gateway_emulator: GatewayEmulator, gateway_app: Flask
) -> None:
    """A transition with two events, one receiver raising: the delivered one is marked, the other counts an
    attempt and is due again (the transaction of the failure holds both)."""
    from flask_gateway import checkout_cancelled
    from flask_gateway.payments import outbox

    def failing(sender: Any, **extra: Any) -> None:
        raise ConnectionError("the stock service is down")

    checkout_cancelled.connect(failing, sender=gateway_app, weak=False)
    context, transition = paid_but_not_delivered(gateway_app, "ORD-BOTH")
    try:
        session = get_state().session
        checkout = transition.checkout
        transition._pending.append(outbox.add(session, checkout, checkout_cancelled, {"source": "test"}))
        commit_keeping_loaded(session)
        [first, second] = transition._pending
        report = outbox.deliver_now(transition._pending)
        transition._pending = []
        states = (first.event.state, second.event.state, second.event.attempts)
    finally:
        context.pop()
        checkout_cancelled.disconnect(failing, sender=gateway_app)

    assert (report.delivered, report.failed) == (1, 1)
    assert states == (OutboxState.DELIVERED, OutboxState.PENDING, 1)
    assert sorted(outbox_rows(gateway_app)) == [(OutboxState.DELIVERED, 1), (OutboxState.PENDING, 1)]
