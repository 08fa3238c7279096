"""GET /gateway/v1/success and /gateway/v1/fail: only the gateway, holding the signed URL, completes them."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlencode

import pytest

from flask_gateway.urls import return_url, v1_outcome_url
from tests.conftest import Databases
from tests.extension.conftest import SHOP_URL, Harness, build_harness
from tests.extension.inbound.inbound_support import (
    create_v1_checkout,
    create_v2_checkout,
    emulator_checkout,
    path_of,
    record_signals,
    snapshot,
)

received = pytest.fixture(record_signals)


def _installed(databases: Databases, monkeypatch: pytest.MonkeyPatch, **config: Any) -> Harness:
    h = build_harness(databases, monkeypatch, GATEWAY_API_VERSION="v1", **config)
    h.install()
    return h


@pytest.fixture
def v1(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> Harness:
    """A v1 shop (GATEWAY_V1_CANCEL_ON_FAIL left at its default, True)."""
    return _installed(databases, monkeypatch)


def outcome_url(h: Harness, checkout_id: int, kind: str, **params: str) -> str:
    """The shop's signed v1 URL of ``kind`` as the gateway calls it (its own parameters appended)."""
    with h.shop.test_request_context():
        url = path_of(v1_outcome_url(checkout_id, kind))  # type: ignore[arg-type]
    return f"{url}&{urlencode(params)}" if params else url


# --- the gateway's calls, through the emulator -------------------------------------------------------


@pytest.mark.backends
def test_success_pays_once_and_answers_the_order_page(v1: Harness, received) -> None:
    checkout_id, token = create_v1_checkout(v1)

    outcome = v1.emulator.pay(token).json

    # The emulator checked our JSON answer (token echoed, absolute return_url) and sends the consumer on.
    assert outcome["merchantMessage"] == "OK"
    assert outcome["redirectUrl"] == f"{SHOP_URL}/orders/ORD-V1"
    state = snapshot(v1, checkout_id)
    assert state["status"] == "PAID"
    assert state["paid_cents"] == 79800
    assert [kw["source"] for kw in received["payment_confirmed"]] == ["v1"]

    # The gateway calling again (a retry) gets the same answer and changes nothing.
    replay = v1.client.get(outcome_url(v1, checkout_id, "v1-success", token=token, status="SUCCESS"))
    assert replay.status_code == 200
    assert replay.json == {"token": token, "return_url": f"{SHOP_URL}/orders/ORD-V1"}
    assert len(received["payment_confirmed"]) == 1


@pytest.mark.backends
def test_cancelled_is_recorded_and_cancels_on_the_gateway(v1: Harness, received) -> None:
    checkout_id, token = create_v1_checkout(v1)

    outcome = v1.emulator.consumer_cancel(token).json

    assert outcome["merchantMessage"] == "OK"
    state = snapshot(v1, checkout_id)
    assert (state["status"], state["fail_reason"]) == ("CANCELLED_BY_CONSUMER", "CANCELLED")
    assert [kw["source"] for kw in received["checkout_cancelled"]] == ["v1"]
    assert emulator_checkout(v1, token)["checkoutPaymentStatus"] == "CANCELLED_BY_CONSUMER"
    answer = v1.client.get(
        outcome_url(v1, checkout_id, "v1-fail", token=token, status="FAIL", reason="CANCELLED")
    )
    assert answer.json == {
        "token": token,
        "return_url": f"{SHOP_URL}/orders/ORD-V1",
        "cancel_on_payjustnow": True,
    }
    assert len(received["checkout_cancelled"]) == 1


@pytest.mark.backends
def test_cancel_on_gateway_false_keeps_the_order_open_for_a_retry(
    databases: Databases, monkeypatch: pytest.MonkeyPatch, received
) -> None:
    h = _installed(databases, monkeypatch, GATEWAY_V1_CANCEL_ON_FAIL=False)
    checkout_id, token = create_v1_checkout(h)

    outcome = h.emulator.consumer_cancel(token).json

    assert outcome["merchantMessage"] == "OK"
    state = snapshot(h, checkout_id)
    assert (state["status"], state["fail_reason"]) == ("PENDING_ORDER", None)
    source, before, after, applied, detail = state["events"][-1]
    assert (source, before, after, applied) == ("v1", "PENDING_ORDER", "PENDING_ORDER", False)
    assert "CANCELLED" in detail
    assert received["checkout_cancelled"] == []
    # The gateway reopened the order: the consumer tries again and pays.
    assert emulator_checkout(h, token)["checkoutPaymentStatus"] == "PENDING_ORDER"
    assert h.emulator.pay(token).json["merchantMessage"] == "OK"
    assert snapshot(h, checkout_id)["status"] == "PAID"
    assert len(received["payment_confirmed"]) == 1


@pytest.mark.backends
def test_abandoned_and_cancelled_are_recorded_distinctly(v1: Harness, received) -> None:
    cancelled_id, cancelled_token = create_v1_checkout(v1, "ORD-C")
    abandoned_id, _ = create_v1_checkout(v1, "ORD-A")
    v1.emulator.consumer_cancel(cancelled_token)

    # The other order is left alone until it expires (60 minutes): the gateway sends ABANDONED.
    v1.emulator.advance(61 * 60)

    cancelled, abandoned = snapshot(v1, cancelled_id), snapshot(v1, abandoned_id)
    assert (cancelled["status"], cancelled["fail_reason"]) == ("CANCELLED_BY_CONSUMER", "CANCELLED")
    assert (abandoned["status"], abandoned["fail_reason"]) == ("EXPIRED", "ABANDONED")
    assert [kw["checkout_id"] for kw in received["checkout_expired"]] == [abandoned_id]
    assert [kw["checkout_id"] for kw in received["checkout_cancelled"]] == [cancelled_id]


def test_abandoned_answer(v1: Harness, received) -> None:
    checkout_id, token = create_v1_checkout(v1)

    answer = v1.client.get(
        outcome_url(v1, checkout_id, "v1-fail", token=token, status="FAIL", reason="ABANDONED")
    )

    assert answer.status_code == 200
    assert answer.json == {
        "token": token,
        "return_url": f"{SHOP_URL}/orders/ORD-V1",
        "cancel_on_payjustnow": True,
    }
    assert snapshot(v1, checkout_id)["status"] == "EXPIRED"
    assert len(received["checkout_expired"]) == 1


def test_return_url_is_the_built_in_page_without_an_order_endpoint(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = _installed(databases, monkeypatch, GATEWAY_ORDER_ENDPOINT=None)
    checkout_id, token = create_v1_checkout(h)

    outcome = h.emulator.pay(token).json

    with h.shop.test_request_context():
        expected = return_url(checkout_id, "confirm")
    assert outcome["redirectUrl"] == expected
    page = h.client.get(path_of(expected))
    assert page.status_code == 200
    assert 'data-state="paid"' in page.get_data(as_text=True)


# --- forged and unknown calls ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("edited-ref", 403),
        ("missing-ref", 400),
        ("ref-of-another-order", 403),
        ("fail-ref-on-success-url", 403),
        ("return-page-ref", 403),
        ("token-mismatch", 403),
        ("missing-token", 400),
        ("wrong-status", 400),
        ("unknown-order", 404),
        ("v2-checkout", 404),
    ],
)
def test_forged_success_calls_are_refused_and_change_nothing(
    v1: Harness, received, case: str, expected: int
) -> None:
    checkout_id, token = create_v1_checkout(v1, "ORD-1")
    other_id, other_token = create_v1_checkout(v1, "ORD-2")
    v2_id, _ = create_v2_checkout(v1, "ORD-V2")
    good = outcome_url(v1, checkout_id, "v1-success")
    ref = good.partition("ref=")[2]
    with v1.shop.test_request_context():
        confirm_ref = path_of(return_url(checkout_id, "confirm")).partition("ref=")[2]
    params = {"token": token, "status": "SUCCESS"}
    path = "/gateway/v1/success"
    query: dict[str, str] = {"ref": ref, **params}
    if case == "edited-ref":
        middle = len(ref) - 10  # inside the signature (its last character has insignificant bits)
        query["ref"] = ref[:middle] + ("A" if ref[middle] != "A" else "B") + ref[middle + 1 :]
    elif case == "missing-ref":
        del query["ref"]
    elif case == "ref-of-another-order":
        query["ref"] = outcome_url(v1, other_id, "v1-success").partition("ref=")[2]
    elif case == "fail-ref-on-success-url":
        query["ref"] = outcome_url(v1, checkout_id, "v1-fail").partition("ref=")[2]
    elif case == "return-page-ref":
        query["ref"] = confirm_ref
    elif case == "token-mismatch":
        query["token"] = other_token
    elif case == "missing-token":
        del query["token"]
    elif case == "wrong-status":
        query["status"] = "FAIL"
    elif case == "unknown-order":
        query["ref"] = outcome_url(v1, 987654, "v1-success").partition("ref=")[2]
    elif case == "v2-checkout":
        query["ref"] = outcome_url(v1, v2_id, "v1-success").partition("ref=")[2]
    before = [snapshot(v1, i) for i in (checkout_id, other_id, v2_id)]

    answer = v1.client.get(f"{path}?{urlencode(query)}")

    assert answer.status_code == expected
    assert answer.mimetype == "application/json"
    assert set(answer.json) == {"message"}
    assert [snapshot(v1, i) for i in (checkout_id, other_id, v2_id)] == before
    assert all(kws == [] for kws in received.values())


@pytest.mark.parametrize(
    ("case", "expected"),
    [
        ("success-ref-on-fail-url", 403),
        ("edited-ref", 403),
        ("token-mismatch", 403),
        ("missing-reason", 400),
        ("unknown-reason", 400),
        ("success-status", 400),
    ],
)
def test_forged_fail_calls_are_refused_and_change_nothing(
    v1: Harness, received, case: str, expected: int
) -> None:
    checkout_id, token = create_v1_checkout(v1)
    query = {
        "ref": outcome_url(v1, checkout_id, "v1-fail").partition("ref=")[2],
        "token": token,
        "status": "FAIL",
        "reason": "CANCELLED",
    }
    if case == "success-ref-on-fail-url":
        query["ref"] = outcome_url(v1, checkout_id, "v1-success").partition("ref=")[2]
    elif case == "edited-ref":
        query["ref"] = "x" + query["ref"][1:]
    elif case == "token-mismatch":
        query["token"] = "0" * 32
    elif case == "missing-reason":
        del query["reason"]
    elif case == "unknown-reason":
        query["reason"] = "REFUNDED"
    elif case == "success-status":
        query["status"] = "SUCCESS"
    before = snapshot(v1, checkout_id)

    answer = v1.client.get(f"/gateway/v1/fail?{urlencode(query)}")

    assert answer.status_code == expected
    assert answer.mimetype == "application/json"
    assert set(answer.json) == {"message"}
    assert snapshot(v1, checkout_id) == before
    assert all(kws == [] for kws in received.values())
