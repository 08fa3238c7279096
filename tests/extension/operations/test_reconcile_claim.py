"""Reconciliation's claim: the oldest due checkouts first whatever their status, and on a large table an
ordered read of the ``(status, updated_at)`` index, never a scan and sort of every due checkout (issue 30:
a million checkouts)."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest
from sqlalchemy import insert, select, text

from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import GatewayCheckout
from flask_gateway.operations.reconciliation import BATCH_SIZE, POLLED_STATUSES, claiming, due
from flask_gateway.state import get_state
from tests.extension.conftest import ACCOUNT, Harness

# The claim's SQL differs by backend (LATERAL per status on PostgreSQL), and so does its plan.
pytestmark = pytest.mark.backends


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


def add_checkouts(harness: Harness, rows: list[tuple[str, int]]) -> None:
    """Pending v2 checkouts of (status, minutes ago last changed), inserted in the order given."""
    now = utcnow()
    with harness.shop.app_context():
        session = get_state().session
        session.execute(
            insert(GatewayCheckout),
            [
                {
                    "api_version": "v2",
                    "order_reference": f"CLAIM-{n}",
                    "request_id": f"claim-{n}",
                    "token": f"v2.{ACCOUNT}.claim-{n}",
                    "merchant_account_id": ACCOUNT,
                    "status": status,
                    "total_cents": 79800,
                    "paid_cents": 0,
                    "refunded_cents": 0,
                    "order": {"reference": f"CLAIM-{n}"},
                    "created_at": now - timedelta(minutes=minutes),
                    "updated_at": now - timedelta(minutes=minutes),
                    "expires_at": now + timedelta(hours=1),
                    "flagged": False,
                }
                for n, (status, minutes) in enumerate(rows)
            ],
        )
        session.commit()


def claim(harness: Harness, size: int, started: datetime) -> list[str]:
    """One claim of the open pass of a run that started at ``started``, committed: the references
    claimed, in the order handed out."""
    with harness.shop.app_context():
        session = get_state().session
        claimed = claiming._claim(due([ACCOUNT], started, started), size, paid=False)
        ids = [c.id for c in claimed]
        by_id = dict(
            session.execute(
                select(GatewayCheckout.id, GatewayCheckout.order_reference).where(GatewayCheckout.id.in_(ids))
            ).all()
        )
        session.commit()
        return [by_id[i] for i in ids]


def polled(harness: Harness) -> set[str]:
    with harness.shop.app_context():
        session = get_state().session
        references = set(
            session.scalars(
                select(GatewayCheckout.order_reference).where(GatewayCheckout.last_polled_at.is_not(None))
            )
        )
        session.commit()
        return references


def test_a_claim_takes_the_oldest_due_checkouts_whatever_their_status(installed):
    # Every polled status, their ages interleaved, inserted out of age order (ids do not follow the ages).
    ages = [70, 10, 90, 30, 50, 80, 20, 60, 40, 100]
    rows = [(POLLED_STATUSES[n % len(POLLED_STATUSES)], age) for n, age in enumerate(ages)]
    add_checkouts(installed, rows)
    oldest_first = [f"CLAIM-{n}" for n in sorted(range(len(ages)), key=lambda n: -ages[n])]
    started = utcnow()

    assert claim(installed, 3, started) == oldest_first[:3]
    # Only the checkouts handed out are marked polled: the others the claim looked at are still due.
    assert polled(installed) == set(oldest_first[:3])
    assert claim(installed, 4, started) == oldest_first[3:7]
    assert claim(installed, 10, started) == oldest_first[7:]
    assert claim(installed, 10, started) == []
    assert polled(installed) == set(oldest_first)


def test_on_a_large_table_the_claim_reads_the_status_index_in_order(installed, databases):
    # 20,000 due checkouts, last changed over a month: enough for PostgreSQL to scan and sort the whole
    # table for one claim of ``status IN (...) ORDER BY updated_at, id LIMIT 10`` (it did before issue 30).
    rows = 20_000
    minutes = 30 * 24 * 60
    add_checkouts(installed, [("PENDING_ORDER", minutes * (rows - n) // rows) for n in range(rows)])
    with installed.shop.app_context():
        state = get_state()
        session = state.session
        now = utcnow()
        query = claiming._oldest(due([ACCOUNT], now, now), BATCH_SIZE, paid=False, dialect=databases.backend)
        compiled = query.compile(dialect=state.engine.dialect, compile_kwargs={"literal_binds": True})  # type: ignore[attr-defined]
        if databases.backend == "postgresql":
            session.execute(text("ANALYZE gateway_checkouts"))
            plan = "\n".join(row[0] for row in session.execute(text(f"EXPLAIN {compiled}")))
            assert "Seq Scan" not in plan, plan
            assert "Index Scan using ix_gateway_checkouts_status_updated" in plan, plan
        else:
            session.execute(text("ANALYZE"))
            plan = "\n".join(row[-1] for row in session.execute(text(f"EXPLAIN QUERY PLAN {compiled}")))
            assert "ix_gateway_checkouts_status_updated" in plan, plan
        session.rollback()
    # And it still hands out the oldest.
    assert claim(installed, 3, utcnow()) == ["CLAIM-0", "CLAIM-1", "CLAIM-2"]
