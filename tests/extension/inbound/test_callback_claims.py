"""A callback is a claim (issue 12): confirmed with getstatus before anything moves, refused cheaply.

- A body signed through the sandbox's own 401 answer (``expectedSignature``) pays nothing.
- Refused requests keep a bounded excerpt; a client that keeps being refused gets 429, nothing stored.
- An oversize *chunked* body is 413, not a cut body answered 401.
- ``X-Merchant-Account-ID`` (issue 11): absent, the signature alone decides; present, it must match.
"""

from __future__ import annotations

import io
import json
from typing import Any

import pytest

from flask_gateway.core.signing import sign
from flask_gateway.models import CallbackLog
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.extension.conftest import ACCOUNT, Harness, build_harness
from tests.extension.inbound.inbound_support import (
    callback_logs,
    create_v2_checkout,
    gateway_status,
    post_callback,
    record_signals,
    signing_key,
    snapshot,
)

received = pytest.fixture(record_signals)


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


def installed_with(databases: Databases, monkeypatch: pytest.MonkeyPatch, **config: Any) -> Harness:
    h = build_harness(databases, monkeypatch, **config)
    h.install()
    return h


def forged_paid_payload(h: Harness, token: str) -> dict[str, Any]:
    """What an attacker builds: the checkout's real status payload, edited to say it was paid."""
    payload = gateway_status(h, token)
    assert payload["checkoutPaymentStatus"] == "PENDING_ORDER"
    payload.update(
        checkoutPaymentStatus="PAID", paidAt="2025-01-01T10:00:00.000000Z", paymentReference=123456
    )
    return payload


def signed_by_the_sandbox(h: Harness, body: bytes) -> str:
    """The sandbox signs any body for anyone: its 401 answer to a junk signature carries the real one."""
    answer = h.emulator.client.post(
        "/v2/getstatus",
        data=body,
        headers={"Content-Type": "application/json", "X-Merchant-Account-ID": ACCOUNT, "X-Signature": "junk"},
    )
    assert answer.status_code == 401
    signature = answer.json["expectedSignature"]
    assert signature == sign(body, signing_key(h))  # the genuine signature, handed to anyone
    return str(signature)


# --- confirm before you fulfil ------------------------------------------------------------------------


def test_a_callback_signed_through_the_sandbox_401_pays_nothing(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    body = json.dumps(forged_paid_payload(installed, token)).encode()
    signature = signed_by_the_sandbox(installed, body)

    answer = post_callback(installed, body, signature=signature)

    assert (answer.status_code, answer.json["outcome"]) == (200, "unconfirmed")
    state = snapshot(installed, checkout_id)
    assert state["status"] == "PENDING_ORDER"
    assert state["payment_confirmed_at"] is None and state["paid_cents"] == 0
    assert received["payment_confirmed"] == []
    [rejected] = received["callback_rejected"]
    assert rejected["checkout_id"] == checkout_id
    assert "getstatus says PENDING_ORDER" in rejected["reason"]
    [log] = callback_logs(installed)
    assert (log["outcome"], log["verified"], log["http_status"]) == ("unconfirmed", True, 200)
    assert "NOT CONFIRMED" in state["events"][-1][4]


def test_a_genuine_callback_is_confirmed_by_getstatus_and_applied(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    assert installed.emulator.pay(token).status_code == 200
    payload = gateway_status(installed, token)

    answer = post_callback(installed, payload)

    assert (answer.status_code, answer.json["outcome"]) == (200, "accepted")
    state = snapshot(installed, checkout_id)
    # Recorded as PAID: the gateway says PAID once this 200 reaches it (docs/decisions.md).
    assert state["status"] == "PAID" and state["payment_confirmed_at"] is not None
    assert "confirmed by getstatus" in state["events"][-1][4]
    assert [kw["source"] for kw in received["payment_confirmed"]] == ["callback"]


def test_a_claim_whose_amount_getstatus_contradicts_is_unconfirmed(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    assert installed.emulator.pay(token).status_code == 200
    payload = {**gateway_status(installed, token), "checkoutTotalCents": 1}

    answer = post_callback(installed, payload)

    assert (answer.status_code, answer.json["outcome"]) == (200, "unconfirmed")
    assert "total of 1 cents" in received["callback_rejected"][0]["reason"]
    # Nothing of the claim is applied; what getstatus says is (as a poll would): the real payment.
    state = snapshot(installed, checkout_id)
    assert (state["status"], state["paid_cents"]) == ("PAID_PENDING_CALLBACK", 79800)
    assert "applied what getstatus says" in state["events"][-1][4]


def test_a_claim_about_a_checkout_the_gateway_does_not_know_for_us_is_unconfirmed(
    installed: Harness, received
) -> None:
    checkout_id, token = create_v2_checkout(installed)
    with installed.shop.app_context():  # the shop's record says another token: the gateway answers 404
        from flask_gateway.models import GatewayCheckout

        session = get_state().session
        row = session.get_one(GatewayCheckout, checkout_id)
        row.token = token[:-4] + "0000"
        session.commit()
    payload = {**forged_paid_payload(installed, token), "checkoutToken": token[:-4] + "0000"}

    answer = post_callback(installed, payload)

    assert (answer.status_code, answer.json["outcome"]) == (200, "unconfirmed")
    assert snapshot(installed, checkout_id)["status"] == "PENDING_ORDER"
    assert received["payment_confirmed"] == []


@pytest.mark.backends
def test_a_callback_that_cannot_be_confirmed_is_503_and_changes_nothing(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    assert installed.emulator.pay(token).status_code == 200
    payload = gateway_status(installed, token)
    fault = {"operation": "getstatus", "kind": "status", "status": 500}
    assert installed.emulator.control("faults", fault).status_code == 201

    answer = post_callback(installed, payload)

    assert answer.status_code == 503
    assert snapshot(installed, checkout_id)["status"] == "PENDING_ORDER"
    assert received["payment_confirmed"] == []
    [log] = callback_logs(installed)
    assert (log["outcome"], log["http_status"], log["verified"]) == ("confirm-failed", 503, True)
    # The gateway retries once it answers again: then the payment is confirmed.
    assert installed.emulator.control("faults", method="DELETE").status_code == 200
    assert post_callback(installed, payload).json["outcome"] == "accepted"
    assert len(received["payment_confirmed"]) == 1


def test_a_duplicate_of_a_confirmed_payment_needs_no_second_getstatus(installed: Harness, received) -> None:
    _checkout_id, token = create_v2_checkout(installed)
    assert installed.emulator.pay(token).status_code == 200
    payload = gateway_status(installed, token)
    assert post_callback(installed, payload).json["outcome"] == "accepted"
    # Were it asked, the gateway would fail: a duplicate changes nothing, so it is not asked.
    fault = {"operation": "getstatus", "kind": "status", "status": 500}
    assert installed.emulator.control("faults", fault).status_code == 201

    again = post_callback(installed, payload)

    assert (again.status_code, again.json["outcome"]) == (200, "duplicate")
    assert len(received["payment_confirmed"]) == 1


def test_with_confirmation_off_a_signed_claim_is_applied_as_it_says(
    databases: Databases, monkeypatch: pytest.MonkeyPatch, received
) -> None:
    """``GATEWAY_CONFIRM_CALLBACKS=False`` trusts the signature alone: why it is on by default."""
    h = installed_with(databases, monkeypatch, GATEWAY_CONFIRM_CALLBACKS=False)
    checkout_id, token = create_v2_checkout(h)
    body = json.dumps(forged_paid_payload(h, token)).encode()

    answer = post_callback(h, body, signature=signed_by_the_sandbox(h, body))

    assert (answer.status_code, answer.json["outcome"]) == (200, "accepted")
    assert snapshot(h, checkout_id)["payment_confirmed_at"] is not None


# --- the account header (issue 11) --------------------------------------------------------------------


def test_a_callback_without_the_account_header_is_verified_by_its_signature_alone(
    installed: Harness, received
) -> None:
    checkout_id, token = create_v2_checkout(installed)
    assert installed.emulator.pay(token).status_code == 200

    answer = post_callback(installed, gateway_status(installed, token), account=None)

    assert (answer.status_code, answer.json["outcome"]) == (200, "accepted")
    assert snapshot(installed, checkout_id)["payment_confirmed_at"] is not None
    [log] = callback_logs(installed)
    assert log["verified"] is True and log["merchant_account_id"] is None


def test_a_callback_without_the_account_header_and_a_wrong_signature_is_401(
    installed: Harness, received
) -> None:
    checkout_id, token = create_v2_checkout(installed)
    assert installed.emulator.pay(token).status_code == 200

    answer = post_callback(installed, gateway_status(installed, token), account=None, key="another-key")

    assert answer.status_code == 401
    assert snapshot(installed, checkout_id)["payment_confirmed_at"] is None


def test_a_present_but_wrong_account_header_is_401_even_with_the_right_signature(
    installed: Harness, received
) -> None:
    checkout_id, token = create_v2_checkout(installed)
    assert installed.emulator.pay(token).status_code == 200

    answer = post_callback(installed, gateway_status(installed, token), account="other-merchant")

    assert answer.status_code == 401
    assert snapshot(installed, checkout_id)["payment_confirmed_at"] is None
    assert "X-Merchant-Account-ID" in callback_logs(installed)[0]["detail"]


# --- refused requests cost almost nothing -------------------------------------------------------------


@pytest.mark.backends
def test_a_refused_callback_keeps_a_bounded_excerpt_and_the_client_address(installed: Harness) -> None:
    body = b'{"checkoutToken": "' + b"x" * (60 * 1024) + b'"}'
    headers = {"Content-Type": "application/json", "X-Signature": "bm9wZQ==", "User-Agent": "u" * 900}
    headers.update({f"X-Junk-{i}": "j" * 1000 for i in range(40)})

    answer = installed.client.post(
        "/gateway/callback", data=body, headers=headers, environ_base={"REMOTE_ADDR": "203.0.113.9"}
    )

    assert answer.status_code == 401
    [log] = callback_logs(installed)
    assert log["verified"] is False and log["outcome"] == "rejected-signature"
    assert log["body"] == body[:256].decode()
    assert set(log["headers"]) <= {"Content-Type", "Content-Length", "User-Agent", "X-Merchant-Account-ID"}
    assert all(len(value) <= 100 for value in log["headers"].values())
    assert len(json.dumps(log)) < 1200  # a few hundred bytes, not the 64 KiB body and 40 KiB of headers
    with installed.shop.app_context():
        assert get_state().session.get_one(CallbackLog, log["id"]).client_address == "203.0.113.9"


@pytest.mark.backends
def test_a_client_that_keeps_being_refused_gets_429_and_nothing_is_stored(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    h = installed_with(databases, monkeypatch, GATEWAY_CALLBACK_RATE_LIMIT="3 per minute")
    forged = {"Content-Type": "application/json", "X-Signature": "bm9wZQ=="}
    attacker, other = {"REMOTE_ADDR": "203.0.113.9"}, {"REMOTE_ADDR": "198.51.100.7"}

    answers = [
        h.client.post("/gateway/callback", data=b"{}", headers=forged, environ_base=attacker).status_code
        for _ in range(6)
    ]

    assert answers == [401, 401, 401, 429, 429, 429]
    limited = h.client.post("/gateway/callback", data=b"{}", headers=forged, environ_base=attacker)
    assert int(limited.headers["Retry-After"]) >= 1
    assert limited.json == {"message": "Too many refused callbacks from this address; try again later."}
    assert len(callback_logs(h)) == 3  # the 429s stored nothing
    # Another address is not affected, nor are accepted callbacks counted against one.
    assert (
        h.client.post("/gateway/callback", data=b"{}", headers=forged, environ_base=other).status_code == 401
    )
    checkout_id, token = create_v2_checkout(h)
    assert h.emulator.pay(token).status_code == 200
    payload = gateway_status(h, token)
    for _ in range(5):
        raw = json.dumps(payload).encode()
        answer = h.client.post(
            "/gateway/callback",
            data=raw,
            headers={"Content-Type": "application/json", "X-Signature": sign(raw, signing_key(h))},
            environ_base=other,
        )
        assert answer.status_code == 200
    assert snapshot(h, checkout_id)["payment_confirmed_at"] is not None


def test_an_oversize_chunked_callback_is_413_not_a_cut_body(installed: Harness) -> None:
    body = b'{"checkoutToken": "' + b"x" * (70 * 1024) + b'"}'

    answer = installed.client.post(
        "/gateway/callback",
        input_stream=io.BytesIO(body),
        headers={"Content-Type": "application/json", "Transfer-Encoding": "chunked", "X-Signature": "x"},
        environ_overrides={"wsgi.input_terminated": True},
    )

    assert answer.status_code == 413
    [log] = callback_logs(installed)
    assert (log["outcome"], log["body"]) == ("too-large", "")


def test_a_chunked_callback_within_the_limit_is_read_whole(installed: Harness, received) -> None:
    _checkout_id, token = create_v2_checkout(installed)
    assert installed.emulator.pay(token).status_code == 200
    raw = json.dumps(gateway_status(installed, token)).encode()

    answer = installed.client.post(
        "/gateway/callback",
        input_stream=io.BytesIO(raw),
        headers={
            "Content-Type": "application/json",
            "Transfer-Encoding": "chunked",
            "X-Signature": sign(raw, signing_key(installed)),
        },
        environ_overrides={"wsgi.input_terminated": True},
    )

    assert (answer.status_code, answer.json["outcome"]) == (200, "accepted")
