"""The instalment hint costs no gateway call per visitor (issue 29, point 2).

The payment plan for any total is computed from the account's plan rule, learned from one v1 configuration
answer and re-checked once per ``PLAN_CACHE_SECONDS``; the hint must still be the plan the gateway charges,
and a gateway whose rule changes is followed within a period.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Iterator

import pytest

import flask_gateway.emulator.views.v1 as emulator_v1
from flask_gateway import clear_payment_plan_cache, format_instalment_hint, payment_plan
from flask_gateway.core.wire import V1PaymentPlan
from flask_gateway.emulator import clock as emulator_clock
from flask_gateway.payments import plans
from tests.extension.conftest import SHOP_URL, Harness
from tests.extension.operations.operations_support import spy

CONFIGURATION = "/api/v1/merchant/configuration"


@pytest.fixture(autouse=True)
def _fresh_plan_cache() -> Iterator[None]:
    clear_payment_plan_cache()
    yield
    clear_payment_plan_cache()


class Clock:
    """``plans._clock``, moved by hand (the period of a learned rule)."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(plans, "_clock", clock, raising=False)
    return clock


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()  # limits R 1.00 .. R 100 000.00
    return harness


def gateway_amounts(harness: Harness, total: int) -> tuple[int, ...]:
    """The instalments the emulator's plan for ``total`` charges, first to last (its own rule, now)."""
    with harness.emulator.client.application.app_context():
        plan = emulator_v1.payment_plan(total)
    amount, excess = plan.amount or 0, plan.excess or 0
    return (amount + excess, *(amount,) * (emulator_v1.INSTALMENTS - 1))


def anonymous_hint(harness: Harness, total: int, address: str) -> str:
    with harness.shop.test_request_context(base_url=SHOP_URL, environ_base={"REMOTE_ADDR": address}):
        return format_instalment_hint(total)


@pytest.mark.backends
def test_a_thousand_anonymous_totals_cost_at_most_one_gateway_call(installed: Harness, clock: Clock) -> None:
    sent = spy(installed)
    rng = random.Random(29)
    totals = rng.sample(range(100, 10_000_001), 1_000)
    hints = [
        anonymous_hint(installed, total, f"198.51.{n // 250}.{n % 250}") for n, total in enumerate(totals)
    ]
    assert all(hint.startswith("or ") for hint in hints)  # every visitor sees the hint (no limit reached)
    assert sent.paths().count(CONFIGURATION) == 1
    # Within the period, still none; after it, one re-check for the whole next period.
    clock.now += plans.PLAN_CACHE_SECONDS - 1
    assert anonymous_hint(installed, 4_321, "192.0.2.1")
    assert sent.paths().count(CONFIGURATION) == 1
    clock.now += 2
    for n, total in enumerate(totals[:200]):
        assert anonymous_hint(installed, total + 1, f"192.0.2.{n}")
    assert sent.paths().count(CONFIGURATION) == 2


def test_the_hint_is_the_gateway_plan_for_ten_thousand_amounts(installed: Harness, clock: Clock) -> None:
    """Computed locally, amount by amount equal to the plan the emulator answers and charges (its
    ``payment_plan``: the hosted page's instalments come from it too), every remainder, small and large."""
    sent = spy(installed)
    rng = random.Random(17)
    amounts = [
        *range(100, 3_100),
        97_700,
        10_000_000,
        *(rng.randrange(100, 10_000_000) for _ in range(6_998)),
    ]
    assert len(set(amounts)) > 9_900
    with installed.shop.app_context():
        for total in amounts:
            plan = payment_plan(total)
            assert plan is not None
            expected = gateway_amounts(installed, total)
            assert plan.amounts == expected, total
            assert sum(plan.amounts) == total
    assert sent.paths().count(CONFIGURATION) == 1


def test_a_changed_rule_is_followed_within_a_period(
    installed: Harness, clock: Clock, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sent = spy(installed)
    with installed.shop.app_context():
        assert format_instalment_hint(40_000) == "or R 133.34 now, then 2 x R 133.33"
        monkeypatch.setattr(emulator_v1, "INSTALMENTS", 4)  # the gateway now charges four instalments
        # Until the period ends the learned rule is shown (at most PLAN_CACHE_SECONDS old, as a cached
        # answer was before)...
        assert format_instalment_hint(40_001) == "or R 133.35 now, then 2 x R 133.33"
        assert sent.paths().count(CONFIGURATION) == 1
        clock.now += plans.PLAN_CACHE_SECONDS
        # ... then the re-check finds the difference: the gateway's answer is shown, with a warning.
        with caplog.at_level(logging.WARNING, logger="flask_gateway.plans"):
            assert format_instalment_hint(40_002) == "or R 100.02 now, then 3 x R 100.00"
        assert sent.paths().count(CONFIGURATION) == 2
        (warning,) = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert "is not the rule learned" in warning.getMessage()
        # Each total is asked until an answer gives one rule again: the next one does.
        plan = payment_plan(99_999)
        assert plan is not None and plan.amounts == gateway_amounts(installed, 99_999) == (
            25_002,
            24_999,
            24_999,
            24_999,
        )
        assert sent.paths().count(CONFIGURATION) == 3
        rng = random.Random(4)
        for total in [40_000, 40_001, 40_002, *(rng.randrange(100, 10_000_000) for _ in range(500))]:
            plan = payment_plan(total)
            assert plan is not None and plan.amounts == gateway_amounts(installed, total), total
        assert sent.paths().count(CONFIGURATION) == 3  # the new rule holds: no call per total again


def test_a_rounding_the_rule_cannot_give_is_asked_per_total(
    installed: Harness, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A gateway whose answers fit no count (here: whole rands, the rest with the first) is trusted answer by
    answer; each total costs its call (cached for the period), never a plan of ours."""

    def whole_rands(amount_cents: int) -> V1PaymentPlan:
        each = amount_cents // 300 * 100
        return V1PaymentPlan(due_at=emulator_clock.now(), amount=each, excess=amount_cents - 3 * each)

    monkeypatch.setattr(emulator_v1, "payment_plan", whole_rands)
    sent = spy(installed)
    with installed.shop.app_context():
        assert format_instalment_hint(100_050) == "or R 334.50 now, then 2 x R 333.00"
        assert format_instalment_hint(40_000) == "or R 134.00 now, then 2 x R 133.00"
        assert format_instalment_hint(100_050) == "or R 334.50 now, then 2 x R 333.00"  # cached
    assert sent.paths().count(CONFIGURATION) == 2


def test_while_one_request_re_checks_the_rule_the_others_compute_it(
    installed: Harness, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Visitors arriving while the period's re-check is on its way cost no call of their own."""
    sent = spy(installed)
    meanwhile: list[str] = []
    ask = plans._ask

    def slow_ask(client: object, total_cents: int) -> plans.PaymentPlan | None:
        meanwhile.extend(format_instalment_hint(total) for total in (10_000, 10_001, 10_002))
        return ask(client, total_cents)

    with installed.shop.app_context():
        assert format_instalment_hint(40_000)
        clock.now += plans.PLAN_CACHE_SECONDS
        monkeypatch.setattr(plans, "_ask", slow_ask)
        assert format_instalment_hint(40_003) == "or R 133.35 now, then 2 x R 133.34"
    assert meanwhile == [
        "or R 33.34 now, then 2 x R 33.33",
        "or R 33.35 now, then 2 x R 33.33",
        "or 3 x R 33.34",
    ]
    assert sent.paths().count(CONFIGURATION) == 2


def test_a_failed_call_is_not_repeated_for_30_seconds(installed: Harness, clock: Clock) -> None:
    """Before a rule is learned, a failure leaves every hint out for 30 s without a call; a failed re-check
    keeps the learned rule shown and is retried after 30 s."""
    sent = spy(installed)
    fault = {"operation": "v1_configuration", "kind": "status", "status": 500, "count": 1}
    assert installed.emulator.control("faults", fault).status_code == 201
    with installed.shop.app_context():
        assert payment_plan(40_000) is None
        assert payment_plan(50_000) is None  # the account's failure, not the total's
        asked = sent.paths().count(CONFIGURATION)
        clock.now += 31
        assert format_instalment_hint(40_000) == "or R 133.34 now, then 2 x R 133.33"
        assert sent.paths().count(CONFIGURATION) == asked + 1
        clock.now += plans.PLAN_CACHE_SECONDS
        assert installed.emulator.control("faults", fault).status_code == 201
        assert (
            format_instalment_hint(40_001) == "or R 133.35 now, then 2 x R 133.33"
        )  # the rule, re-check failed
        assert format_instalment_hint(40_002) == "or 3 x R 133.34"
        assert sent.paths().count(CONFIGURATION) == asked + 2
        clock.now += 31
        assert format_instalment_hint(40_002)
        assert sent.paths().count(CONFIGURATION) == asked + 3  # retried
