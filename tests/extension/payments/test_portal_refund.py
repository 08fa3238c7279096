"""A refund made in the gateway's own portal (the emulator's control API and dashboard) reaches the shop in
one reconcile run: the gateway sends no callback for it, so only asking finds it (issue 15)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import update

from flask_gateway import create_checkout, reconcile, refund_succeeded
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import GatewayCheckout, RefundState
from flask_gateway.state import get_state
from flask_gateway.testing import SHOP_URL, GatewayEmulator
from tests.extension.conftest import sample_order

TOTAL = 79800


@pytest.fixture
def refunds(gateway_app: Flask) -> Iterator[list[int]]:
    seen: list[int] = []

    def receiver(sender: Any, checkout: Any, refund: Any, amount_cents: int, **extra: Any) -> None:
        seen.append(amount_cents)

    refund_succeeded.connect(receiver, sender=gateway_app, weak=False)
    yield seen
    refund_succeeded.disconnect(receiver)


def paid(gateway_emulator: GatewayEmulator, app: Flask) -> GatewayCheckout:
    with app.test_request_context(base_url=SHOP_URL):
        checkout = create_checkout(sample_order())
    gateway_emulator.pay(checkout.token)
    assert gateway_emulator.deliver() == 1
    return checkout


def an_hour_later(app: Flask, checkout_id: int) -> None:
    """As if the payment had been recorded, and last asked about, an hour ago (the paid pass's recheck)."""
    at = utcnow() - timedelta(hours=1, minutes=1)
    with app.app_context():
        session = get_state().session
        session.execute(
            update(GatewayCheckout)
            .where(GatewayCheckout.id == checkout_id)
            .values(payment_confirmed_at=at, updated_at=at, last_polled_at=at)
        )
        session.commit()


def state_of(app: Flask, checkout_id: int) -> tuple[str, int, list[tuple[int, str]]]:
    with app.app_context():
        checkout = get_state().session.get_one(GatewayCheckout, checkout_id)
        return checkout.status, checkout.refunded_cents, [(r.amount_cents, r.state) for r in checkout.refunds]


def test_a_refund_in_the_portal_reaches_the_shop_in_one_reconcile_run(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, refunds: list[int]
) -> None:
    checkout = paid(gateway_emulator, gateway_app)
    answer = gateway_emulator.control(f"checkouts/{checkout.token}/refund", {"reason": "goodwill"})
    assert (answer["checkoutPaymentStatus"], answer["refundedCents"]) == ("FULLY_REFUNDED", TOTAL)
    assert (
        gateway_emulator.callbacks(checkout) and len(gateway_emulator.callbacks(checkout)) == 1
    )  # no new one
    assert state_of(gateway_app, checkout.id)[:2] == ("PAID", 0)  # the shop does not know yet

    an_hour_later(gateway_app, checkout.id)
    with gateway_app.app_context():
        report = reconcile()
    assert (report.paid_polled, report.paid_changed, report.refunded_cents) == (1, 1, TOTAL)
    assert state_of(gateway_app, checkout.id) == ("FULLY_REFUNDED", TOTAL, [(TOTAL, RefundState.SUCCEEDED)])
    assert refunds == [TOTAL]
    with gateway_app.app_context():
        again = reconcile(paid_recheck_seconds=0)
    assert again.refunded == 0 and refunds == [TOTAL]


def test_the_operator_refunds_from_the_dashboard(
    gateway_emulator: GatewayEmulator, gateway_app: Flask
) -> None:
    checkout = paid(gateway_emulator, gateway_app)
    client = gateway_emulator.app.test_client()
    page = client.get(f"/_emulator/dashboard/checkouts/{checkout.token}").get_data(as_text=True)
    token = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert token is not None and "Refund in the portal" in page
    url = f"/_emulator/dashboard/checkouts/{checkout.token}/refund"
    assert client.post(url, data={"amount_cents": "30000"}).status_code == 400  # CSRF
    wrong = client.post(url, data={"csrf_token": token.group(1), "amount_cents": "-5"}, follow_redirects=True)
    assert "is not an amount in cents" in wrong.get_data(as_text=True)
    done = client.post(
        url, data={"csrf_token": token.group(1), "amount_cents": "30000"}, follow_redirects=True
    )
    assert "R 300.00 refunded in all" in done.get_data(as_text=True)
    too_much = client.post(
        url, data={"csrf_token": token.group(1), "amount_cents": "60000"}, follow_redirects=True
    )
    assert "Not refunded: The refund of 60000 cents exceeds the 49800 cents" in too_much.get_data(
        as_text=True
    )
    status = gateway_emulator.checkout(checkout)
    assert (status["checkoutPaymentStatus"], status["refundedCents"]) == ("PARTIALLY_REFUNDED", 30000)

    # The shop sees a partial refund it did not make: the status carries no amount, so it is flagged.
    an_hour_later(gateway_app, checkout.id)
    with gateway_app.app_context():
        report = reconcile()
        flagged = get_state().session.get_one(GatewayCheckout, checkout.id).flagged
    assert report.paid_changed == 1 and flagged
