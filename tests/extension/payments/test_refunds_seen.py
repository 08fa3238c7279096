"""Refund statuses the gateway reports are recorded by every path, and never confirm a payment (issue 12).

A refund made at the gateway (its dashboard, or anyone holding the signing key) is learnt by the next poll
(return page, reconciliation, admin refresh) or a confirmed callback: recorded as a ``RefundRecord``
(amount, time), ``refund_succeeded`` sent. A payment the shop first hears of as ``FULLY_REFUNDED`` is
never confirmed for fulfilment: the checkout is flagged for a person.
"""

from __future__ import annotations

import pytest

from flask_gateway import refund, signals
from flask_gateway.core.wire import RefundRequest
from flask_gateway.models import RefundState
from flask_gateway.operations.reconciliation import reconcile
from flask_gateway.payments.polling import refresh
from flask_gateway.state import get_state
from tests.extension.conftest import Harness
from tests.extension.inbound.inbound_support import return_path
from tests.extension.operations.operations_support import emulator_checkout, load, new_checkout, recording

TOTAL = 79800  # sample_order(): 2 x 39900


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


def refund_at_the_gateway(h: Harness, token: str, amount: int) -> None:
    """A refund made behind the shop's back (the gateway's dashboard, or a leaked signing key)."""
    with h.shop.app_context():
        answer = (
            get_state()
            .client()
            .refund(
                RefundRequest(
                    checkoutToken=token,
                    merchantRefundReference="made-at-the-gateway",
                    refundAmountCents=amount,
                    refundDescription="refunded on the gateway's dashboard",
                )
            )
        )
    assert answer.data.refundStatus == "SUCCESS"


@pytest.mark.parametrize("path", ["reconcile", "return page", "admin refresh"])
def test_a_full_refund_before_the_shop_knew_of_the_payment_is_recorded_flagged_never_confirmed(
    installed: Harness, path: str
) -> None:
    checkout_id, token = new_checkout(installed)
    assert installed.emulator.pay(token).status_code == 200  # the callback never arrives
    refund_at_the_gateway(installed, token, TOTAL)
    assert emulator_checkout(installed, token)["checkoutPaymentStatus"] == "FULLY_REFUNDED"

    with (
        recording(signals.payment_confirmed) as confirmed,
        recording(signals.refund_succeeded) as refunded,
        recording(signals.checkout_flagged) as flagged,
    ):
        if path == "reconcile":
            with installed.shop.app_context():
                report = reconcile(older_than_seconds=0)
            assert report.confirmed == 0 and report.polled == 1
        elif path == "return page":
            assert installed.client.get(return_path(installed, checkout_id, "confirm")).status_code == 303
        else:
            with installed.shop.app_context():
                refresh(load(installed, checkout_id), source="admin")

    assert len(confirmed) == 0
    assert [call["amount_cents"] for call in refunded.calls] == [TOTAL]
    assert len(flagged) == 1 and "before the shop knew of the payment" in flagged.calls[0]["reason"]
    with installed.shop.app_context():
        checkout = load(installed, checkout_id)
        assert checkout.status == "FULLY_REFUNDED"
        assert checkout.payment_confirmed_at is None
        assert checkout.flagged and "never confirmed for fulfilment" in (checkout.flag_reason or "")
        assert (checkout.paid_cents, checkout.refunded_cents) == (TOTAL, TOTAL)
        [record] = checkout.refunds
        assert (record.amount_cents, record.state) == (TOTAL, RefundState.SUCCEEDED)
        assert "refunded at the gateway" in record.reason and record.completed_at is not None


def test_a_full_refund_made_at_the_gateway_after_the_payment_is_recorded(installed: Harness) -> None:
    checkout_id, token = new_checkout(installed)
    assert installed.emulator.pay(token).status_code == 200
    assert installed.emulator.control("deliver").status_code == 200  # paid and confirmed
    with installed.shop.app_context():
        assert refund(load(installed, checkout_id), 10000).state == RefundState.SUCCEEDED
    refund_at_the_gateway(installed, token, TOTAL - 10000)

    with (
        recording(signals.refund_succeeded) as refunded,
        recording(signals.checkout_flagged) as flagged,
        installed.shop.app_context(),
    ):
        transition = refresh(load(installed, checkout_id), source="admin")

    assert (transition.before, transition.after) == ("PARTIALLY_REFUNDED", "FULLY_REFUNDED")
    assert [call["amount_cents"] for call in refunded.calls] == [TOTAL - 10000]
    assert len(flagged) == 0  # the payment was known: a refund, not a mystery
    with installed.shop.app_context():
        checkout = load(installed, checkout_id)
        assert checkout.refunded_cents == TOTAL and not checkout.flagged
        assert [(r.amount_cents, r.state) for r in checkout.refunds] == [
            (10000, "SUCCEEDED"),
            (TOTAL - 10000, "SUCCEEDED"),
        ]


def test_a_poll_settles_a_refund_whose_answer_was_lost(installed: Harness) -> None:
    checkout_id, token = new_checkout(installed)
    assert installed.emulator.pay(token).status_code == 200
    assert installed.emulator.control("deliver").status_code == 200
    rule = {"operation": "refund", "kind": "drop_response", "count": 1}
    assert installed.emulator.control("faults", rule).status_code == 201
    from tests.extension.operations.operations_support import spy

    spy(installed)  # turns the dropped answer into a connection reset
    with installed.shop.app_context(), pytest.raises(Exception, match="could not reach the gateway"):
        refund(load(installed, checkout_id), TOTAL)

    with recording(signals.refund_succeeded) as refunded, installed.shop.app_context():
        refresh(load(installed, checkout_id), source="admin")

    assert [call["amount_cents"] for call in refunded.calls] == [TOTAL]
    with installed.shop.app_context():
        checkout = load(installed, checkout_id)
        [record] = checkout.refunds
        assert (record.state, checkout.refunded_cents, checkout.status) == (
            "SUCCEEDED",
            TOTAL,
            "FULLY_REFUNDED",
        )


def test_a_partial_refund_the_shop_cannot_account_for_is_flagged(installed: Harness) -> None:
    checkout_id, token = new_checkout(installed)
    assert installed.emulator.pay(token).status_code == 200
    assert installed.emulator.control("deliver").status_code == 200
    refund_at_the_gateway(installed, token, 500)

    with (
        recording(signals.checkout_flagged) as flagged,
        recording(signals.refund_succeeded) as refunded,
        installed.shop.app_context(),
    ):
        refresh(load(installed, checkout_id), source="admin")

    assert len(refunded) == 0  # the amount is not in the status answer
    assert len(flagged) == 1 and "partial refund" in flagged.calls[0]["reason"]
    with installed.shop.app_context():
        checkout = load(installed, checkout_id)
        assert checkout.status == "PARTIALLY_REFUNDED" and checkout.flagged
        assert checkout.payment_confirmed_at is not None  # confirmed before, by the callback


def test_a_payment_callback_that_meets_a_full_refund_records_it_and_confirms_nothing(
    installed: Harness,
) -> None:
    from tests.extension.inbound.inbound_support import gateway_status, post_callback

    checkout_id, token = new_checkout(installed)
    assert installed.emulator.pay(token).status_code == 200
    late_callback = gateway_status(installed, token)  # PAID_PENDING_CALLBACK, delayed
    refund_at_the_gateway(installed, token, TOTAL)

    with recording(signals.payment_confirmed) as confirmed, recording(signals.refund_succeeded) as refunded:
        answer = post_callback(installed, late_callback)

    assert (answer.status_code, answer.json["outcome"]) == (200, "unconfirmed")
    assert len(confirmed) == 0 and len(refunded) == 1
    with installed.shop.app_context():
        checkout = load(installed, checkout_id)
        assert (checkout.status, checkout.flagged, checkout.payment_confirmed_at) == (
            "FULLY_REFUNDED",
            True,
            None,
        )
