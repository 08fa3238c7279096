"""The outbox and the signals with two merchant accounts (issue 27): each event's payload records its
checkout's account, and every signal about a checkout carries ``account=``, at once and when delivered
again from the table."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import select

from flask_gateway import payment_confirmed, refund, refund_succeeded
from flask_gateway.models import GatewayCheckout, OutboxEvent
from flask_gateway.payments.outbox import redeliver
from flask_gateway.state import get_state
from tests.extension.conftest import SHOP_URL, Harness
from tests.extension.operations.operations_support import recording
from tests.extension.operations.support_accounts import ACCOUNT, OTHER, install_both, paid_by
from tests.extension.operations.test_health import deliver

pytestmark = pytest.mark.backends  # the payload is JSON in a column of each backend


@pytest.fixture
def both(harness: Harness) -> Harness:
    return install_both(harness)


def payloads(harness: Harness) -> list[tuple[str, int, dict[str, Any]]]:
    with harness.shop.app_context():
        session = get_state().session
        rows = [
            (row.kind, row.checkout_id, dict(row.payload))
            for row in session.scalars(select(OutboxEvent).order_by(OutboxEvent.id))
        ]
        session.rollback()
        return rows


def test_each_event_and_signal_carries_its_checkouts_account(both: Harness) -> None:
    with recording(payment_confirmed) as confirmed, recording(refund_succeeded) as refunded:
        first, _ = paid_by(both, ACCOUNT, "A-1")
        second, _ = paid_by(both, OTHER, "B-1")
        deliver(both)  # both callbacks, each on its account's path
        with both.shop.test_request_context(base_url=SHOP_URL):
            checkout = get_state().session.get_one(GatewayCheckout, second)
            refund(checkout, 1000, reason="one cracked mug")

    by_checkout = {call["checkout"].id: call for call in confirmed.calls}
    assert by_checkout[first]["account"] == ACCOUNT
    assert by_checkout[second]["account"] == OTHER
    assert all(
        "merchant_account_id" not in call for call in confirmed.calls
    )  # the payload's key, not a kwarg
    [refund_call] = refunded.calls
    assert (refund_call["account"], refund_call["amount_cents"]) == (OTHER, 1000)

    events = payloads(both)
    assert sorted((kind, checkout_id, p["merchant_account_id"]) for kind, checkout_id, p in events) == sorted(
        [
            ("payment_confirmed", first, ACCOUNT),
            ("payment_confirmed", second, OTHER),
            ("refund_succeeded", second, OTHER),
        ]
    )
    [confirmed_other] = [
        p for kind, checkout_id, p in events if (kind, checkout_id) == ("payment_confirmed", second)
    ]
    assert confirmed_other == {"source": "callback", "merchant_account_id": OTHER}


def test_an_event_delivered_again_from_the_table_carries_the_account(both: Harness) -> None:
    second, _ = paid_by(both, OTHER, "B-1")
    deliver(both)
    with both.shop.app_context():
        event_id = (
            get_state().session.scalars(select(OutboxEvent.id).where(OutboxEvent.checkout_id == second)).one()
        )
    with recording(payment_confirmed) as again, both.shop.app_context():
        assert redeliver(event_id).delivered == 1
    [call] = again.calls
    assert (call["account"], call["event_id"], call["source"]) == (OTHER, event_id, "callback")
    assert "merchant_account_id" not in call
