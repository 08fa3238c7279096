"""``flask gateway refund ORDER_OR_TOKEN [AMOUNT | --all] [--reason TEXT] [--yes] [--account ID]``: the
admin screen's refund rules from a terminal, its outcome in words and its exit status by outcome."""

from __future__ import annotations

from typing import Any

import click
import pytest
from sqlalchemy import func, select

from flask_gateway import refresh, refund
from flask_gateway.models import RefundRecord
from flask_gateway.state import get_state
from tests.extension.conftest import ACCOUNT, Harness, sample_order
from tests.extension.operations.cli_support import SECOND, checkout_of, install_account, run_gateway
from tests.extension.operations.operations_support import emulator_checkout, load, new_checkout


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


@pytest.fixture
def two(harness: Harness) -> Harness:
    harness.install()
    install_account(harness)
    return harness


def paid(harness: Harness, reference: str = "R-1042") -> tuple[int, str]:
    """A v2 checkout of R 798.00 the consumer paid, known to the shop (PAID_PENDING_CALLBACK): id, token."""
    checkout_id, token = new_checkout(harness, sample_order(reference))
    assert harness.emulator.pay(token).status_code == 200
    with harness.shop.app_context():
        assert refresh(load(harness, checkout_id)).after == "PAID_PENDING_CALLBACK"
    return checkout_id, token


def refunded(harness: Harness, checkout_id: int) -> tuple[int, str, int]:
    """The checkout's refunded cents and status, and how many refund records it has."""
    with harness.shop.app_context():
        checkout = load(harness, checkout_id)
        records = get_state().session.scalar(
            select(func.count()).select_from(RefundRecord).where(RefundRecord.checkout_id == checkout_id)
        )
        return checkout.refunded_cents, checkout.status, int(records or 0)


def fault(harness: Harness, **rule: object) -> None:
    assert harness.emulator.control("faults", rule).status_code == 201


@pytest.mark.backends
def test_a_partial_refund_then_the_rest_in_the_shops_money(installed: Harness) -> None:
    checkout_id, token = paid(installed)
    result = run_gateway(
        installed.shop, "refund", "r-1042", "R 100.00", "--reason", "one cup broken", "--yes"
    )
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (
        f"Refund R 100.00 of order R-1042 ({token}): paid R 798.00, refunded so far R 0.00, left R 798.00; "
        "reason: one cup broken."
    )
    assert result.stdout.splitlines()[-1] == (
        f"Refunded R 100.00 of order R-1042 ({token}): refunded R 100.00 of R 798.00 in all; status "
        "Partly refunded (PARTIALLY_REFUNDED)."
    )
    assert refunded(installed, checkout_id) == (10_000, "PARTIALLY_REFUNDED", 1)
    assert emulator_checkout(installed, token)["refundedCents"] == 10_000

    rest = run_gateway(installed.shop, "refund", token, "--all", "--yes")
    assert rest.exit_code == 0, rest.output
    assert "Refunded R 698.00 " in rest.stdout and "status Refunded (FULLY_REFUNDED)." in rest.stdout
    assert refunded(installed, checkout_id) == (79_800, "FULLY_REFUNDED", 2)
    assert emulator_checkout(installed, token)["refundedCents"] == 79_800


def test_the_amount_is_confirmed_first_and_nothing_happens_without_a_yes(installed: Harness) -> None:
    checkout_id, _ = paid(installed)
    declined = run_gateway(installed.shop, "refund", "R-1042", "50", input="n\n")
    assert declined.exit_code == 1
    assert "Refund R 50.00?" in declined.stderr
    assert "Error: nothing was refunded: the refund of R 50.00 was not confirmed" in declined.stderr
    no_answer = run_gateway(installed.shop, "refund", "R-1042", "50")  # no terminal, nothing typed
    assert no_answer.exit_code == 1
    assert "(answer y at the question, or pass --yes)" in no_answer.stderr
    assert refunded(installed, checkout_id) == (0, "PAID_PENDING_CALLBACK", 0)

    confirmed = run_gateway(installed.shop, "refund", "R-1042", "50", input="y\n")
    assert confirmed.exit_code == 0, confirmed.output
    assert refunded(installed, checkout_id) == (5_000, "PARTIALLY_REFUNDED", 1)


def test_a_refund_made_while_the_owner_reads_is_not_repeated_unseen(
    installed: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout_id, _ = paid(installed)

    def someone_else_refunds_first(*args: Any, **kwargs: Any) -> bool:
        with installed.shop.app_context():  # the admin screen, in another tab, meanwhile
            refund(load(installed, checkout_id), 10_000)
        return True

    monkeypatch.setattr(click, "confirm", someone_else_refunds_first)
    result = run_gateway(installed.shop, "refund", "R-1042", "100.00")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: the refunded total of order R-1042 ("
        + (result.stdout.split("(", 1)[1].split(")", 1)[0])
        + ") changed while you read this (now R 100.00): nothing was refunded; run the command again to "
        "review the amount."
    )
    assert refunded(installed, checkout_id) == (10_000, "PARTIALLY_REFUNDED", 1)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["R-1042"], "give the amount to refund (for example 100.00), or --all for everything that is left"),
        (["R-1042", "10", "--all"], "give the amount to refund (for example 100.00) or --all, not both"),
        (["R-1042", "12,50"], "Use '.' before the cents (1234.50)"),
        (["R-1042", "1.005"], "Use at most 2 decimals"),
        (["R-1042", "0"], "The refund must be more than zero."),
        (["R-1042", "--", "-5"], "The amount must not be negative."),
    ],
)
def test_what_is_no_amount_is_a_usage_error_and_nothing_is_sent(
    installed: Harness, arguments: list[str], message: str
) -> None:
    checkout_id, _ = paid(installed)
    result = run_gateway(installed.shop, "refund", "--yes", *arguments)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert refunded(installed, checkout_id) == (0, "PAID_PENDING_CALLBACK", 0)


def test_the_shops_rules_refuse_more_than_is_left_and_an_unpaid_checkout(installed: Harness) -> None:
    _, token = paid(installed)
    too_much = run_gateway(installed.shop, "refund", "R-1042", "798.01", "--yes")
    assert too_much.exit_code == 1
    assert too_much.stderr.strip().splitlines()[-1] == (
        f"Error: at most R 798.00 of order R-1042 ({token}) can be refunded."
    )
    assert run_gateway(installed.shop, "refund", "R-1042", "--all", "--yes").exit_code == 0
    nothing_left = run_gateway(installed.shop, "refund", "R-1042", "--all", "--yes")
    assert nothing_left.exit_code == 1
    assert "nothing is left to refund of order R-1042" in nothing_left.stderr

    _, open_token = new_checkout(installed, sample_order("R-1043"))
    unpaid = run_gateway(installed.shop, "refund", "R-1043", "--all", "--yes")
    assert unpaid.exit_code == 1
    assert unpaid.stderr.strip().splitlines()[-1] == (
        f"Error: order R-1043 ({open_token}) is awaiting payment (PENDING_ORDER): only a paid checkout can "
        "be refunded."
    )
    unknown = run_gateway(installed.shop, "refund", "R-9999", "--all", "--yes")
    assert unknown.exit_code == 1 and "the gateway was not asked" in unknown.stderr


@pytest.mark.backends
def test_no_answer_is_pending_exit_75_and_the_same_command_refunds_once(installed: Harness) -> None:
    checkout_id, token = paid(installed)
    fault(installed, operation="refund", kind="drop_response", count=1)
    lost = run_gateway(installed.shop, "refund", "R-1042", "100", "--yes")
    assert lost.exit_code == 75, lost.output
    assert "the refund of R 100.00 of order R-1042" in lost.stderr and "is pending" in lost.stderr
    assert "Run the same command again to retry it" in lost.stderr
    # The gateway did refund (only its answer was lost); the shop does not know yet.
    assert emulator_checkout(installed, token)["refundedCents"] == 10_000
    assert refunded(installed, checkout_id) == (0, "PAID_PENDING_CALLBACK", 1)

    again = run_gateway(installed.shop, "refund", "R-1042", "100", "--yes")
    assert again.exit_code == 0, again.output
    assert refunded(installed, checkout_id) == (10_000, "PARTIALLY_REFUNDED", 1)  # the same record
    assert emulator_checkout(installed, token)["refundedCents"] == 10_000  # refunded once


def test_a_refund_the_gateway_declines_is_exit_1_with_its_reason(installed: Harness) -> None:
    checkout_id, _ = paid(installed)
    fault(installed, operation="refund", kind="status", status=400, count=1)
    declined = run_gateway(installed.shop, "refund", "R-1042", "100", "--yes")
    assert declined.exit_code == 1, declined.output
    assert "the gateway declined the refund of R 100.00" in declined.stderr
    assert refunded(installed, checkout_id) == (0, "PAID_PENDING_CALLBACK", 1)  # recorded FAILED


def test_account_narrows_the_order_and_the_command_is_listed(two: Harness) -> None:
    checkout_of(two, ACCOUNT, "A-1")
    refused = run_gateway(two.shop, "refund", "A-1", "--all", "--yes", "--account", SECOND)
    assert refused.exit_code == 1 and f"no checkout of the merchant account {SECOND}" in refused.stderr
    listed = run_gateway(two.shop, "--help")
    assert "refund" in listed.stdout
