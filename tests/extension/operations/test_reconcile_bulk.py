"""Reconciliation's answers that change nothing, recorded a batch at a time (``transitions.apply_unchanged``):
what they write is what the state machine writes for each, in a few statements for the whole batch, and an
answer that changes something still goes through the state machine (its event, its signals)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

import pytest
from sqlalchemy import event, select, update

from flask_gateway import signals
from flask_gateway.core.timestamps import format_timestamp, utcnow
from flask_gateway.core.wire import CheckoutStatusPayload
from flask_gateway.models import CheckoutEvent, GatewayCheckout
from flask_gateway.operations.reconciliation import answers
from flask_gateway.operations.reconciliation.claiming import _Claimed
from flask_gateway.payments import polling, transitions
from flask_gateway.state import get_state
from tests.extension.conftest import Harness
from tests.extension.operations.operations_support import recording
from tests.extension.payments.test_statement_counts import seed

# Row locks of a whole batch, one UPDATE and one INSERT for many rows, statement counts.
pytestmark = pytest.mark.backends

TOTAL = 79800  # the seeded checkouts' total


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


def answer(
    token: str, status: str, *, expires: datetime | None, total: int = TOTAL, at: datetime | None = None
) -> CheckoutStatusPayload:
    """A getstatus answer about ``token`` (as the gateway writes it), ``at`` that time (default: now)."""
    now = at or utcnow()
    paid = status in ("PAID_PENDING_CALLBACK", "PAID")
    return CheckoutStatusPayload.model_validate(
        {
            "requestId": "r",
            "checkoutToken": token,
            "checkoutTotalCents": total,
            "paymentUrl": None,
            "checkoutPaymentStatus": status,
            "paidAt": format_timestamp(now, "us") if paid else None,
            "paymentReference": 12345 if paid else None,
            "merchantOrderReference": None,
            "clickTraceId": None,
            "createdAt": format_timestamp(now),
            "updatedAt": format_timestamp(now),
            "expiresAt": format_timestamp(expires, "us") if expires is not None else None,
            "cancelledAt": None,
            "lastCallbackAttemptedAt": None,
            "lastCallbackAttemptStatusMessage": None,
        }
    )


def checkouts(harness: Harness, count: int) -> list[GatewayCheckout]:
    """``count`` pending v2 checkouts (bulk-inserted), by id."""
    seed(harness, count)
    session = get_state(harness.shop).session
    rows = list(session.scalars(select(GatewayCheckout).order_by(GatewayCheckout.id)))
    session.commit()
    return rows


def claimed(checkout: GatewayCheckout, *, paid: bool = False) -> _Claimed:
    assert checkout.token is not None
    return _Claimed(checkout.id, checkout.token, checkout.merchant_account_id, checkout.status, paid)


@contextmanager
def statements(harness: Harness) -> Iterator[list[str]]:
    """The SQL statements the shop's engine sends meanwhile (an ``executemany`` counts once)."""
    seen: list[str] = []
    engine = get_state(harness.shop).engine

    def count(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", count)


def events_of(checkout_id: int) -> list[tuple[Any, ...]]:
    """The checkout's events, oldest first, without their ids."""
    session = get_state().session
    return [
        (e.at, e.source, e.from_status, e.to_status, e.applied, e.detail)
        for e in session.scalars(
            select(CheckoutEvent).where(CheckoutEvent.checkout_id == checkout_id).order_by(CheckoutEvent.id)
        )
    ]


def test_a_mixed_batch_records_the_unchanged_in_bulk_and_the_changed_through_the_state_machine(
    installed: Harness,
) -> None:
    with installed.shop.app_context():
        rows = checkouts(installed, 6)
        session = get_state().session
        expires = [row.expires_at for row in rows]
        moved = utcnow() + timedelta(hours=5)
        batch: list[answers._Answer] = [
            (claimed(rows[0]), answer(rows[0].token or "", "PENDING_ORDER", expires=expires[0])),
            (claimed(rows[1]), answer(rows[1].token or "", "PAID_PENDING_CALLBACK", expires=expires[1])),
            (claimed(rows[2]), answer(rows[2].token or "", "PENDING_ORDER", expires=moved)),
            (claimed(rows[3]), answer(rows[3].token or "", "CANCELLED_BY_CONSUMER", expires=expires[3])),
            (claimed(rows[4]), answer(rows[4].token or "", "PENDING_ORDER", expires=None)),
            (claimed(rows[5]), answer(rows[5].token or "", "PENDING_ORDER", expires=expires[5])),
        ]
        before = utcnow()
        with recording(signals.payment_confirmed) as confirmed, recording(signals.checkout_cancelled) as gone:
            outcomes, fresh = answers._write(batch, None)
        assert fresh == []
        assert [(o.status, o.changed, o.confirmed, o.error) for o in outcomes] == [
            ("PENDING_ORDER", False, False, None),
            ("PAID_PENDING_CALLBACK", True, True, None),
            ("PENDING_ORDER", False, False, None),
            ("CANCELLED_BY_CONSUMER", True, False, None),
            ("PENDING_ORDER", False, False, None),
            ("PENDING_ORDER", False, False, None),
        ]
        # The changed ones went through the state machine: their signals, once each, after the commit.
        assert [call["checkout"].id for call in confirmed.calls] == [rows[1].id]
        assert [(call["checkout"].id, call["status"]) for call in gone.calls] == [
            (rows[3].id, "CANCELLED_BY_CONSUMER")
        ]
        session.expire_all()
        stored = {row.id: row for row in session.scalars(select(GatewayCheckout))}
        for n in (0, 2, 4, 5):  # unchanged: polled now, the answer's expiry, one "no change" event
            row = stored[rows[n].id]
            assert row.status == "PENDING_ORDER" and row.updated_at == rows[n].updated_at
            assert row.last_polled_at is not None and row.last_polled_at >= before
            assert row.expires_at == (moved if n == 2 else expires[n])
            [_seeded, polled] = events_of(row.id)
            assert polled[1:] == (
                "reconcile",
                "PENDING_ORDER",
                "PENDING_ORDER",
                False,
                "getstatus: PENDING_ORDER; no change",
            )
            assert polled[0] >= before
        paid = stored[rows[1].id]
        assert paid.status == "PAID_PENDING_CALLBACK" and paid.payment_confirmed_at is not None
        assert paid.last_polled_at is not None and paid.last_polled_at >= before
        assert [e[2:5] for e in events_of(paid.id)][-1] == ("PENDING_ORDER", "PAID_PENDING_CALLBACK", True)
        cancelled = stored[rows[3].id]
        assert cancelled.status == "CANCELLED_BY_CONSUMER"
        assert [e[2:5] for e in events_of(cancelled.id)][-1] == (
            "PENDING_ORDER",
            "CANCELLED_BY_CONSUMER",
            True,
        )


def test_an_unchanged_batch_costs_the_same_few_statements_whatever_its_size(installed: Harness) -> None:
    with installed.shop.app_context():
        rows = checkouts(installed, 60)
        counts = []
        for part in (rows[:5], rows[5:60]):
            batch: list[answers._Answer] = [
                (claimed(row), answer(row.token or "", "PENDING_ORDER", expires=row.expires_at))
                for row in part
            ]
            with statements(installed) as seen:
                outcomes, _ = answers._write(batch, None)
            assert [o.status for o in outcomes] == ["PENDING_ORDER"] * len(part)
            counts.append(len(seen))
        # The rows locked in one SELECT, one UPDATE, one INSERT of the events (and SQLite's BEGIN).
        assert counts[0] == counts[1] <= 4, counts
        session = get_state().session
        session.expire_all()
        assert (
            session.scalar(
                select(GatewayCheckout.id).where(GatewayCheckout.last_polled_at.is_(None)).limit(1)
            )
            is None
        )
        polled = session.scalars(
            select(CheckoutEvent.checkout_id).where(CheckoutEvent.source == "reconcile")
        ).all()
        assert sorted(polled) == [row.id for row in rows]


def test_an_expiry_that_moved_is_written_too_in_one_more_statement(installed: Harness) -> None:
    with installed.shop.app_context():
        rows = checkouts(installed, 20)
        later = utcnow() + timedelta(hours=2)
        batch: list[answers._Answer] = [
            (claimed(row), answer(row.token or "", "PENDING_ORDER", expires=later)) for row in rows
        ]
        with statements(installed) as seen:
            answers._write(batch, None)
        assert len(seen) <= 5, seen
        session = get_state().session
        session.expire_all()
        assert set(session.scalars(select(GatewayCheckout.expires_at))) == {later}


def test_a_checkout_changed_since_its_claim_is_not_taken_for_unchanged(installed: Harness) -> None:
    """The claim saw PENDING_ORDER; a callback made it PAID before the answer (PENDING_ORDER, asked before
    the payment) is applied: the state machine decides (a paid checkout does not go back), not the bulk."""
    with installed.shop.app_context():
        [row] = checkouts(installed, 1)
        claim = claimed(row)  # PENDING_ORDER
        said = answer(row.token or "", "PENDING_ORDER", expires=row.expires_at)
        session = get_state().session
        session.execute(update(GatewayCheckout).values(status="PAID", payment_confirmed_at=utcnow()))
        session.commit()
        [outcome], _ = answers._write([(claim, said)], None)
        assert (outcome.status, outcome.changed) == ("PAID", False)
        assert events_of(row.id)[-1][2:] == (
            "PAID",
            "PENDING_ORDER",
            False,
            "getstatus: PENDING_ORDER; PAID does not move back",
        )


def test_a_pending_checkout_past_its_expiry_still_expires(installed: Harness) -> None:
    with installed.shop.app_context():
        [row] = checkouts(installed, 1)
        past = utcnow() - timedelta(hours=1)
        session = get_state().session
        session.execute(update(GatewayCheckout).values(expires_at=past))
        session.commit()
        with recording(signals.checkout_expired) as expired:
            [outcome], _ = answers._write(
                [(claimed(row), answer(row.token or "", "PENDING_ORDER", expires=past))], None
            )
        assert (outcome.status, outcome.expired) == ("EXPIRED", 1)
        assert len(expired) == 1


@dataclass(frozen=True)
class Case:
    """A checkout as the shop has it, and what the gateway answers about it."""

    status: str
    said: str
    #: The answer's expiresAt: the checkout's own (None here), another one, or none at all.
    expires: datetime | Literal["none"] | None = None
    total: int = TOTAL
    paid: bool = False
    values: dict[str, Any] = field(default_factory=dict)


def test_the_bulk_path_writes_what_the_state_machine_writes(
    installed: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same answers about twin checkouts at the same instant: the first half with the bulk path off
    (every answer through ``apply``, as before it existed), the second with it on: the same rows, the same
    events, the same outcomes."""
    instant = utcnow()
    for module in (transitions, polling, answers):
        monkeypatch.setattr(module, "utcnow", lambda: instant)
    confirmed = {"payment_confirmed_at": instant}
    cases = [
        Case("PENDING_ORDER", "PENDING_ORDER"),
        Case("PENDING_ORDER", "PENDING_ORDER", expires=instant + timedelta(hours=3)),
        Case("PENDING_ORDER", "PENDING_ORDER", expires="none"),
        Case("CANCELLED_BY_CONSUMER", "CANCELLED_BY_CONSUMER"),
        Case("PAID_PENDING_CALLBACK", "PAID_PENDING_CALLBACK", values=confirmed),
        Case("PAID", "PAID", paid=True, values=confirmed),
        Case("PAID", "PAID", total=TOTAL + 1, paid=True, values=confirmed),  # refused: flagged
        Case("PENDING_ORDER", "PAID_PENDING_CALLBACK"),  # a payment found
        Case(
            "PENDING_ORDER", "PENDING_ORDER", values={"expires_at": instant - timedelta(hours=1)}
        ),  # expired
        Case("PAID", "PENDING_ORDER", paid=True, values=confirmed),  # a contradiction: flagged
    ]
    with installed.shop.app_context():
        rows = checkouts(installed, 2 * len(cases))
        half = len(cases)
        session = get_state().session
        for n, case in enumerate(cases):
            twins = (rows[n].id, rows[n + half].id)
            session.execute(
                update(GatewayCheckout)
                .where(GatewayCheckout.id.in_(twins))
                .values(status=case.status, **case.values)
            )
        session.commit()
        session.expire_all()
        rows = list(session.scalars(select(GatewayCheckout).order_by(GatewayCheckout.id)))

        def batch(part: list[GatewayCheckout]) -> list[answers._Answer]:
            made: list[answers._Answer] = []
            for row, case in zip(part, cases, strict=True):
                expires = None if case.expires == "none" else case.expires or row.expires_at
                said = answer(row.token or "", case.said, expires=expires, total=case.total, at=instant)
                made.append((claimed(row, paid=case.paid), said))
            return made

        with monkeypatch.context() as off:
            off.setattr(answers, "record_unchanged_answers", lambda *_args, **_kwargs: {})
            slow, _ = answers._write(batch(rows[:half]), None)
        bulk = polling.record_unchanged_answers
        took: list[int] = []

        def spied(*args: Any, **kwargs: Any) -> dict[int, transitions.Unchanged]:
            found = bulk(*args, **kwargs)
            took.extend(found)
            return found

        monkeypatch.setattr(answers, "record_unchanged_answers", spied)
        quick, _ = answers._write(batch(rows[half:]), None)
        # The bulk path took the six that change nothing; the total that does not match (flagged) and the
        # checkout that must expire went through the state machine, with the changes.
        assert sorted(took) == [row.id for row in rows[half : half + 6]]
        assert quick == slow
        session.expire_all()
        skip = {"id", "token", "request_id", "order_reference", "order"}
        columns = [c.key for c in GatewayCheckout.__table__.columns if c.key not in skip]
        stored = list(session.scalars(select(GatewayCheckout).order_by(GatewayCheckout.id)))
        for case, one, twin in zip(cases, stored[:half], stored[half:], strict=True):
            assert {c: getattr(twin, c) for c in columns} == {c: getattr(one, c) for c in columns}, case
            assert events_of(twin.id) == events_of(one.id), case


def test_a_checkout_loaded_in_the_session_shows_what_the_bulk_path_wrote(installed: Harness) -> None:
    """The bulk path writes with SQL statements, not through the entity: one the session holds is kept in
    step (its poll time and expiry), without a read."""
    with installed.shop.app_context():
        [row] = checkouts(installed, 1)
        session = get_state().session
        held = session.get(GatewayCheckout, row.id)
        assert held is not None and held.last_polled_at is None
        later = utcnow() + timedelta(hours=4)
        said = answer(held.token or "", "PENDING_ORDER", expires=later)
        found = polling.record_unchanged_answers([(held.id, "PENDING_ORDER", said)], "reconcile")
        assert list(found) == [held.id]
        with statements(installed) as seen:
            assert held.last_polled_at is not None and held.expires_at == later
        assert seen == []
        session.commit()
