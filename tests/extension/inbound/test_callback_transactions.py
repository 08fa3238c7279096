"""A callback's first steps (the installation read, the checkout found, the log row stored) run statement by
statement on PostgreSQL, with no ``BEGIN``/``COMMIT`` round trips; the connection they used must go back to
the pool as it came, so that the next transaction on it, the callback's own or the shop's, is one."""

from __future__ import annotations

import pytest
from sqlalchemy import select, text

from flask_gateway import create_checkout
from flask_gateway.models import CallbackLog, GatewayCheckout
from flask_gateway.state import get_state
from flask_gateway.testing import SHOP_URL
from tests.conftest import Databases, fetch_all
from tests.extension.conftest import build_harness, sample_order
from tests.extension.payments.test_statement_counts import signed_callback

pytestmark = pytest.mark.backends


def test_after_a_callback_the_shops_rollback_still_undoes_its_changes(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    # One connection in the pool: the shop's next transaction gets the one the callback used.
    h = build_harness(databases, monkeypatch, SQLALCHEMY_ENGINE_OPTIONS={"pool_size": 1, "max_overflow": 0})
    h.install()
    with h.shop.test_request_context(base_url=SHOP_URL):
        checkout = create_checkout(sample_order("R-TX"))
        checkout_id, token = checkout.id, checkout.token
        get_state().session.commit()
    assert token is not None
    assert h.emulator.pay(token).status_code == 200
    body, headers = signed_callback(h, token, "PAID")

    answer = h.client.post("/gateway/callback", data=body, headers=headers)

    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.get_json()["outcome"] == "accepted"
    with h.shop.app_context():
        session = h.db.session
        session.execute(
            text("UPDATE gateway_checkouts SET order_reference = 'CHANGED' WHERE id = :id"),
            {"id": checkout_id},
        )
        session.rollback()
        reference = session.scalar(
            select(GatewayCheckout.order_reference).where(GatewayCheckout.id == checkout_id)
        )
        status = session.scalar(select(GatewayCheckout.status).where(GatewayCheckout.id == checkout_id))
        logged = session.scalars(select(CallbackLog.outcome)).all()
        session.commit()
        h.db.engine.dispose()
    assert reference == "R-TX"
    assert status == "PAID"
    assert logged == ["accepted"]


def test_a_callback_on_a_connection_the_database_dropped_is_answered_not_a_500(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fault run's 500 (PendingRollbackError): the callback's first read, the rate limit's, runs on the
    request's own connection; when the database has dropped that connection (a restart), the read fails and
    is let through, and the callback's own work must reconnect on a clean session, not meet the dead
    transaction. One connection in the pool: the one the database drops."""
    if databases.backend != "postgresql":
        pytest.skip("PostgreSQL: the callback's first steps share the request's connection (SQLite: its own)")
    h = build_harness(databases, monkeypatch, SQLALCHEMY_ENGINE_OPTIONS={"pool_size": 1, "max_overflow": 0})
    h.install()
    with h.shop.test_request_context(base_url=SHOP_URL):
        checkout = create_checkout(sample_order("R-DROPPED"))
        token = checkout.token
        session = get_state().session
        pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
        session.commit()
    assert token is not None
    assert h.emulator.pay(token).status_code == 200
    body, headers = signed_callback(h, token, "PAID")
    # The database drops the pooled connection, as a restart does.
    assert fetch_all(databases.url("main"), "SELECT pg_terminate_backend(:pid)", pid=pid) == [(True,)]

    answer = h.client.post("/gateway/callback", data=body, headers=headers)

    # The database is there: the callback's own work reconnects (the rate limit let it through).
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.get_json()["outcome"] == "accepted"
    with h.shop.app_context():
        h.db.engine.dispose()
