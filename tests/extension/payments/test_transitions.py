"""The one transition function: forward-only, checked, recorded, each signal once."""

from __future__ import annotations

import uuid
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flask_gateway import signals
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import GatewayCheckout, LocalStatus
from flask_gateway.payments.transitions import RANK, Observation, Transition, apply
from flask_gateway.state import get_state
from tests.extension.conftest import make_shop

ALL_STATUSES = [*RANK, "SOMETHING_NEW"]


@contextmanager
def captured(signal):
    seen: list[dict[str, object]] = []

    def receiver(sender, **kwargs):
        seen.append(kwargs)

    signal.connect(receiver)
    try:
        yield seen
    finally:
        signal.disconnect(receiver)


@pytest.fixture
def shop(database_url):
    app, db, _ = make_shop(database_url)
    with app.app_context():
        yield app
        db.engine.dispose()


def new_checkout(status: str = LocalStatus.CREATING, total: int = 1000) -> int:
    session = get_state().session
    now = utcnow()
    checkout = GatewayCheckout(
        order_reference="ORD-1",
        request_id=f"req-{uuid.uuid4().hex}",
        merchant_account_id="demo-merchant",
        status=status,
        total_cents=total,
        order={},
        created_at=now,
        updated_at=now,
    )
    session.add(checkout)
    session.commit()
    return checkout.id


def observe(checkout_id: int, status: str, **kwargs) -> Transition:
    kwargs.setdefault("source", "poll")
    return apply(get_state().session, checkout_id, Observation(status=status, **kwargs))


def test_forward_path_and_its_events(shop):
    checkout_id = new_checkout()
    observe(
        checkout_id, "PENDING_ORDER", source="create", token="v2.demo-merchant.x", payment_url="https://gw/p"
    )
    observe(checkout_id, "PAID_PENDING_CALLBACK", total_cents=1000, source="callback")
    observe(checkout_id, "PAID", source="callback")
    checkout = get_state().session.get(GatewayCheckout, checkout_id)
    assert checkout.status == "PAID"
    assert checkout.token == "v2.demo-merchant.x"
    assert checkout.paid_cents == 1000
    assert [(e.from_status, e.to_status, e.applied) for e in checkout.events] == [
        ("CREATING", "PENDING_ORDER", True),
        ("PENDING_ORDER", "PAID_PENDING_CALLBACK", True),
        ("PAID_PENDING_CALLBACK", "PAID", True),
    ]


def test_backward_moves_are_recorded_not_applied(shop):
    checkout_id = new_checkout("PAID")
    result = observe(checkout_id, "PAID_PENDING_CALLBACK")
    assert not result.applied
    result = observe(checkout_id, "PENDING_ORDER")
    assert not result.applied
    checkout = get_state().session.get(GatewayCheckout, checkout_id)
    assert checkout.status == "PAID"
    assert [e.applied for e in checkout.events] == [False, False]


def test_update_may_reopen_a_consumer_cancellation(shop):
    checkout_id = new_checkout("CANCELLED_BY_CONSUMER")
    assert observe(checkout_id, "PENDING_ORDER", source="update").applied


def test_payment_confirmed_fires_once_across_paths(shop):
    checkout_id = new_checkout("PENDING_ORDER")
    with captured(signals.payment_confirmed) as seen:
        observe(checkout_id, "PAID_PENDING_CALLBACK", total_cents=1000, source="return")
        observe(checkout_id, "PAID_PENDING_CALLBACK", total_cents=1000, source="callback")
        observe(checkout_id, "PAID", total_cents=1000, source="callback")
        observe(checkout_id, "PARTIALLY_REFUNDED", source="poll")
    assert [s["source"] for s in seen] == ["return"]


def test_amount_mismatch_is_flagged_and_never_paid(shop):
    checkout_id = new_checkout("PENDING_ORDER", total=1000)
    with captured(signals.payment_confirmed) as seen:
        result = observe(checkout_id, "PAID", total_cents=1, source="callback")
    checkout = get_state().session.get(GatewayCheckout, checkout_id)
    assert result.flagged
    assert not result.applied
    assert checkout.status == "PENDING_ORDER"
    assert checkout.flagged
    assert "does not match" in checkout.flag_reason
    assert seen == []


def test_account_mismatch_is_flagged(shop):
    checkout_id = new_checkout("PENDING_ORDER")
    result = observe(checkout_id, "PAID", total_cents=1000, merchant_account_id="someone-else")
    assert result.flagged
    assert get_state().session.get(GatewayCheckout, checkout_id).status == "PENDING_ORDER"


def test_unknown_status_is_recorded_without_change(shop):
    checkout_id = new_checkout("PENDING_ORDER")
    assert not observe(checkout_id, "ON_HOLD").applied
    checkout = get_state().session.get(GatewayCheckout, checkout_id)
    assert checkout.status == "PENDING_ORDER"
    assert checkout.events[-1].to_status == "ON_HOLD"


@pytest.mark.backends
@pytest.mark.parametrize("status", ["ON_HOLD_" + "X" * 100, "ON\x00HOLD"])
def test_an_unknown_status_that_does_not_fit_the_column_is_recorded_as_far_as_it_fits(shop, status):
    """PostgreSQL refuses a value over the column's length, or U+0000: the event is kept all the same."""
    checkout_id = new_checkout("PENDING_ORDER")
    assert not observe(checkout_id, status).applied
    checkout = get_state().session.get(GatewayCheckout, checkout_id)
    assert checkout.status == "PENDING_ORDER"
    event = checkout.events[-1]
    assert event.to_status == status.replace("\x00", "\ufffd")[:40]
    assert repr(status) in event.detail  # the status exactly as reported


def test_payment_after_a_merchant_cancel_is_kept_and_flagged(shop):
    checkout_id = new_checkout("CANCELLED_BY_MERCHANT")
    assert observe(checkout_id, "PAID", total_cents=1000).applied
    checkout = get_state().session.get(GatewayCheckout, checkout_id)
    assert checkout.status == "PAID"
    assert checkout.flagged


def test_cancel_and_expiry_signals(shop):
    first, second = new_checkout("PENDING_ORDER"), new_checkout("PENDING_ORDER")
    with captured(signals.checkout_cancelled) as cancelled, captured(signals.checkout_expired) as expired:
        observe(first, "CANCELLED_BY_CONSUMER", source="callback")
        observe(first, "CANCELLED_BY_CONSUMER", source="poll")
        observe(second, "EXPIRED", source="reconcile")
    assert [c["status"] for c in cancelled] == ["CANCELLED_BY_CONSUMER"]
    assert [e["source"] for e in expired] == ["reconcile"]


def test_any_sequence_never_moves_back_and_confirms_at_most_once(shop):
    # One database for the test, a checkout of its own for each example (a database per example would
    # cost more than the example on PostgreSQL).
    @settings(max_examples=60, deadline=None)
    @given(st.lists(st.sampled_from(ALL_STATUSES), max_size=12))
    def any_sequence(sequence: list[str]) -> None:
        with captured(signals.payment_confirmed) as confirmed:
            checkout_id = new_checkout("PENDING_ORDER")
            best = RANK["PENDING_ORDER"]
            passed_a_payment = False
            for status in sequence:
                observe(checkout_id, status, total_cents=1000)
                current = get_state().session.get(GatewayCheckout, checkout_id).status
                assert RANK[current] >= best
                best = RANK[current]
                passed_a_payment |= current in ("PAID", "PAID_PENDING_CALLBACK")
            checkout = get_state().session.get(GatewayCheckout, checkout_id)
            # Only a payment status confirms: a refund status first seen is flagged for a person instead.
            assert len(confirmed) == (1 if passed_a_payment else 0)
            if RANK[checkout.status] >= RANK["PAID"] and not passed_a_payment:
                assert checkout.flagged and checkout.payment_confirmed_at is None

    any_sequence()


def test_a_second_partial_refund_is_recorded_as_a_change(shop):
    checkout_id = new_checkout("PAID")
    assert observe(checkout_id, "PARTIALLY_REFUNDED", refunded_cents=100, source="refund").applied
    second = observe(checkout_id, "PARTIALLY_REFUNDED", refunded_cents=300, source="refund")
    assert second.applied
    checkout = get_state().session.get(GatewayCheckout, checkout_id)
    assert checkout.refunded_cents == 300
    assert "300 cents" in checkout.events[-1].detail
