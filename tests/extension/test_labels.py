"""The words owners read for the gateway's codes (flask_gateway.labels), one place for every screen."""

from __future__ import annotations

import pytest

from flask_gateway.core.wire import CheckoutStatus
from flask_gateway.labels import (
    CALLBACK_OUTCOME_LABELS,
    STATUS_LABELS,
    callback_outcome_label,
    refund_state_label,
    source_label,
    status_label,
)
from flask_gateway.models import CallbackOutcome, LocalStatus, RefundState


@pytest.mark.parametrize("status", [*CheckoutStatus, *LocalStatus, "PENDING_PAYMENT"])
def test_every_status_has_words_and_keeps_its_code(status):
    label = status_label(status)
    assert label.code == str(status)
    assert label.text != label.code and "_" not in label.text
    assert label.description.endswith(".")
    assert label.tone in ("ok", "open", "closed", "refund", "problem")
    assert str(label) == label.text


def test_the_labels_people_read():
    assert [status_label(s).text for s in STATUS_LABELS] == [
        "Being created",
        "Not created",
        "Awaiting payment",
        "Payment in progress",
        "Cancelled by the shopper",
        "Cancelled by the shop",
        "Paid",
        "Paid - confirming",
        "Partly refunded",
        "Refunded",
        "Expired",
    ]
    # PENDING_PAYMENT (the real gateway's "paying now") is open, not paid.
    assert status_label("PENDING_PAYMENT").tone == "open"
    assert status_label(CheckoutStatus.PAID_PENDING_CALLBACK).tone == "ok"


@pytest.mark.parametrize("status", ["SOMETHING_NEW", "", None, "x" * 300])
def test_an_unknown_status_is_shown_as_its_code(status):
    label = status_label(status)
    assert label.text == (status or "(none)")
    assert label.tone == "unknown"
    assert "does not know" in label.description


def test_every_callback_outcome_is_worded_for_people():
    assert set(CALLBACK_OUTCOME_LABELS) == {o.value for o in CallbackOutcome}
    assert callback_outcome_label("duplicate").text == "Already recorded"
    assert callback_outcome_label("accepted").text == "Recorded"
    assert callback_outcome_label("rejected-signature").text == "Refused: not signed by the gateway"
    for outcome in CallbackOutcome:
        label = callback_outcome_label(outcome)
        assert label.text != outcome.value and "-" not in label.text
    assert callback_outcome_label("new-outcome").text == "new-outcome"


def test_refund_states_and_event_sources():
    assert [refund_state_label(s).text for s in RefundState] == ["Pending", "Refunded", "Refused"]
    assert source_label("callback") == "Gateway callback"
    assert source_label("reconcile") == "Reconciliation"
    assert source_label("elsewhere") == "elsewhere"
