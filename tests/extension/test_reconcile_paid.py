"""A paid checkout the gateway later calls unpaid is flagged, never moved back (issue 15).

The shop asks about paid checkouts (reconciliation's paid pass, the admin's refresh); an answer to a
question sent after the shop recorded the payment cannot be stale about it, so an open, cancelled or
expired status there contradicts the payment: flagged for a person. An answer overtaken by the payment
(the question went out first) is not.
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta
from typing import Any

import pytest
import requests
import responses
from sqlalchemy import select

from flask_gateway import signals
from flask_gateway.core.timestamps import format_timestamp, utcnow
from flask_gateway.models import OutboxEvent
from flask_gateway.polling import refresh
from flask_gateway.state import get_state
from flask_gateway.transitions import Observation, apply
from tests.extension.conftest import EMULATOR_URL, Harness, sample_order
from tests.extension.operations_support import load, new_checkout, recording

TOTAL = 79800  # sample_order(): 2 x 39900


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


def paid_checkout(h: Harness, reference: str = "ORD-1") -> tuple[int, str]:
    """A checkout paid on the gateway and confirmed in the shop by its callback (``PAID``)."""
    checkout_id, token = new_checkout(h, sample_order(reference))
    assert h.emulator.pay(token).status_code == 200
    assert h.emulator.control("deliver").status_code == 200
    with h.shop.app_context():
        checkout = load(h, checkout_id)
        assert (checkout.status, checkout.payment_confirmed_at is not None) == ("PAID", True)
    return checkout_id, token


def _status_payload(token: str, status: str, paid_at: datetime) -> dict[str, object]:
    now = format_timestamp(utcnow())
    return {
        "requestId": "r",
        "checkoutToken": token,
        "checkoutTotalCents": TOTAL,
        "paymentUrl": f"{EMULATOR_URL}/api/v2/app/checkout/{token}",
        "checkoutPaymentStatus": status,
        "paidAt": format_timestamp(paid_at),
        "paymentReference": None,
        "merchantOrderReference": "ORD-1",
        "serviceOrderReference": None,
        "clickTraceId": None,
        "createdAt": now,
        "updatedAt": now,
        "expiresAt": format_timestamp(utcnow() + timedelta(hours=1)),
        "cancelledAt": now,
        "lastCallbackAttemptedAt": None,
        "lastCallbackAttemptStatusMessage": None,
    }


def test_any_status_check_asked_after_the_payment_flags_a_checkout_the_gateway_calls_unpaid(
    installed: Harness,
) -> None:
    checkout_id, token = paid_checkout(installed)
    get_state(installed.shop).client_options["session"] = requests.Session()  # through `responses`
    with (
        responses.RequestsMock() as mocked,
        recording(signals.checkout_flagged) as flagged,
        recording(signals.checkout_cancelled) as cancelled,
        installed.shop.app_context(),
    ):
        mocked.post(
            f"{EMULATOR_URL}/v2/getstatus",
            json=_status_payload(token, "CANCELLED_BY_MERCHANT", utcnow() - timedelta(minutes=5)),
        )
        transition = refresh(load(installed, checkout_id), source="admin")
        assert (transition.before, transition.after, transition.applied) == ("PAID", "PAID", False)
        assert transition.flagged and "does not go back" in transition.reason
        assert [call["source"] for call in flagged.calls] == ["admin"] and len(cancelled) == 0
        assert load(installed, checkout_id).flagged
        # Written to the outbox with the flag, in the same transaction (delivered at least once).
        kinds = get_state().session.scalars(
            select(OutboxEvent.kind).where(OutboxEvent.checkout_id == checkout_id)
        )
        assert list(kinds).count("checkout_flagged") == 1


def test_an_answer_overtaken_by_the_payment_is_not_flagged(installed: Harness) -> None:
    """Asked before the payment was recorded: the answer may be stale, never a contradiction."""
    checkout_id, token = new_checkout(installed)
    get_state(installed.shop).client_options["session"] = requests.Session()

    def answer(request: Any) -> tuple[int, dict[str, str], str]:
        # While the shop waits for this answer, the payment's callback is recorded by another worker.
        with installed.shop.app_context():
            apply(
                get_state().session,
                checkout_id,
                Observation(status="PAID_PENDING_CALLBACK", source="callback", total_cents=TOTAL),
            )
        return 200, {}, json.dumps(_status_payload(token, "PENDING_ORDER", utcnow()))

    with (
        responses.RequestsMock() as mocked,
        recording(signals.checkout_flagged) as flagged,
        installed.shop.app_context(),
    ):
        mocked.add_callback(responses.POST, f"{EMULATOR_URL}/v2/getstatus", callback=answer)
        transition = refresh(load(installed, checkout_id), source="admin")
        assert (transition.after, transition.applied, transition.flagged) == (
            "PAID_PENDING_CALLBACK",
            False,
            False,
        )
        assert len(flagged) == 0
        assert not load(installed, checkout_id).flagged
