"""Anonymous visitors cannot make the shop call the gateway at will (issue 12, point 6).

- The instalment hint: computed from the account's plan rule, so new totals cost no call (issue 29;
  tests/extension/payments/test_plans.py); the calls that remain (learning or re-checking the rule, or
  asking per total while no rule holds) at most ``GATEWAY_PLAN_RATE_LIMIT`` per visitor address (beyond it
  the hint is left out).
- The return page: getstatus only while the payment is unknown, at most once per ``RETURN_POLL_INTERVAL``
  per checkout, however often the link is opened.
"""

from __future__ import annotations

import pytest

import flask_gateway.emulator.views.v1 as emulator_v1
from flask_gateway import clear_payment_plan_cache, format_instalment_hint
from flask_gateway.core.wire import V1PaymentPlan
from flask_gateway.emulator import clock as emulator_clock
from tests.conftest import Databases
from tests.extension.conftest import SHOP_URL, Harness, build_harness
from tests.extension.inbound.inbound_support import return_path
from tests.extension.operations.operations_support import new_checkout, spy


@pytest.fixture(autouse=True)
def _fresh_plan_cache():
    clear_payment_plan_cache()
    yield
    clear_payment_plan_cache()


@pytest.mark.backends
def test_instalment_hints_for_new_totals_are_limited_per_visitor(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = build_harness(databases, monkeypatch, GATEWAY_PLAN_RATE_LIMIT="3 per minute")
    h.install()
    sent = spy(h)

    def hint(total: int, address: str) -> str:
        with h.shop.test_request_context(base_url=SHOP_URL, environ_base={"REMOTE_ADDR": address}):
            return format_instalment_hint(total)

    # The gateway's rule learned from one answer: new totals cost nothing, the limit is never reached.
    assert all(hint(10_000 + cents, "203.0.113.5") for cents in range(6))
    assert sent.paths().count("/api/v1/merchant/configuration") == 1

    # A gateway whose plans fit no rule (whole rands, the rest with the first) is asked per total: then
    # the limit bounds what one visitor can cause.
    def whole_rands(amount_cents: int) -> V1PaymentPlan:
        each = amount_cents // 300 * 100
        return V1PaymentPlan(due_at=emulator_clock.now(), amount=each, excess=amount_cents - 3 * each)

    monkeypatch.setattr(emulator_v1, "payment_plan", whole_rands)
    clear_payment_plan_cache()
    hints = [hint(20_000 + cents, "198.51.100.8") for cents in range(6)]

    assert [bool(h) for h in hints] == [True, True, True, False, False, False]
    assert sent.paths().count("/api/v1/merchant/configuration") == 4
    assert hint(20_000, "198.51.100.8")  # an answer cached costs nothing and is still shown
    assert hint(30_100, "192.0.2.7")  # another visitor has an allowance of his own
    assert sent.paths().count("/api/v1/merchant/configuration") == 5


def test_reopening_a_return_link_asks_the_gateway_at_most_once_per_interval(harness: Harness) -> None:
    harness.install()
    checkout_id, token = new_checkout(harness)
    sent = spy(harness)
    link = return_path(harness, checkout_id, "confirm")

    for _ in range(5):
        assert harness.client.get(link).status_code in (200, 303)
    assert sent.paths().count("/v2/getstatus") == 1

    assert harness.emulator.pay(token).status_code == 200
    assert harness.emulator.control("deliver").status_code == 200  # the callback confirms the payment
    with harness.shop.app_context():  # the interval since the last poll has passed
        from datetime import timedelta

        from flask_gateway.models import GatewayCheckout
        from flask_gateway.state import get_state

        session = get_state().session
        row = session.get_one(GatewayCheckout, checkout_id)
        assert row.last_polled_at is not None
        row.last_polled_at -= timedelta(seconds=10)
        session.commit()
    asked = sent.paths().count("/v2/getstatus")
    for _ in range(5):
        assert harness.client.get(link).status_code in (200, 303)
    # The callback recorded PAID (the gateway's own status once the shop answered 200): the checkout is
    # final, so reopening the link asks the gateway nothing more.
    assert sent.paths().count("/v2/getstatus") == asked
