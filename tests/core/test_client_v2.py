"""The v2 client against a mocked gateway: exact requests out, parsed models back."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
import responses
from pydantic import SecretStr
from responses import matchers

from flask_gateway.core.client import GatewayClient
from flask_gateway.core.signing import sign
from flask_gateway.core.wire import (
    SPEC,
    CheckoutStatus,
    CreateCheckoutRequest,
    CreateOrderDetails,
    Customer,
    InstallRequest,
    OrderItem,
    RefundRequest,
    SettingsUpdateRequest,
    UpdateCheckoutRequest,
    UpdateOrderDetails,
)

BASE = "https://gateway.test"
INSTALL = "https://install.gateway.test"
ACCOUNT = "merchant-1"
KEY = "signing-key-0123"
TOKEN = "v2.merchant-1.6f1c5a0e-2d59-4a51-9a41-0f4b7e9d3c11"

ITEM_JSON = (
    '{"name":"Mug","sku":"MUG-1","quantity":2,"priceCents":1500,'
    '"imageUrl":"https://shop.example/mug.png","pageUrl":"https://shop.example/mug","searchTerms":["mug"]}'
)
SERVICE_JSON = (
    '{"merchantOrderReference":"order-7","orderAmountCents":3000,"orderItems":[' + ITEM_JSON + "],"
    '"confirmRedirectUrl":"https://shop.example/ok","cancelRedirectUrl":"https://shop.example/cancel"'
)


def service_fields() -> dict[str, Any]:
    return {
        "merchantOrderReference": "order-7",
        "orderAmountCents": 3000,
        "orderItems": [
            OrderItem(
                name="Mug",
                sku="MUG-1",
                quantity=2,
                priceCents=1500,
                imageUrl="https://shop.example/mug.png",
                pageUrl="https://shop.example/mug",
                searchTerms=["mug"],
            )
        ],
        "confirmRedirectUrl": "https://shop.example/ok",
        "cancelRedirectUrl": "https://shop.example/cancel",
    }


def create_request(request_id: str | None = None, **service_extra: Any) -> CreateCheckoutRequest:
    return CreateCheckoutRequest(
        requestId=request_id,
        order_details=CreateOrderDetails(**service_fields(), **service_extra),
        checkoutTotalCents=3000,
    )


def refund_request(request_id: str | None = None) -> RefundRequest:
    return RefundRequest(
        requestId=request_id,
        checkoutToken=TOKEN,
        merchantRefundReference="refund-1",
        refundAmountCents=500,
        refundDescription="broken",
    )


def checkout_answer(request_id: str | None = "req-1", **extra: Any) -> dict[str, Any]:
    answer = {
        "requestId": request_id,
        "checkoutToken": TOKEN,
        "checkoutTotalCents": 3000,
        "paymentUrl": f"{BASE}/api/v2/app/checkout/{TOKEN}",
        "checkoutPaymentStatus": "PENDING_ORDER",
        "merchantOrderReference": "order-7",
        "createdAt": "2024-05-01T10:00:00.123Z",
        "updatedAt": "2024-05-01T10:00:00.123456Z",
        "expiresAt": "2024-05-01T11:00:00Z",
    }
    answer.update(extra)
    return answer


def signed_headers(body: bytes) -> dict[str, str | re.Pattern[str]]:
    return {
        "Content-Type": "application/json",
        "User-Agent": re.compile(r"^flask-gateway/"),
        "X-Merchant-Account-ID": ACCOUNT,
        "X-Signature": sign(body, KEY),
    }


def expect(
    rsps: responses.RequestsMock,
    method: str,
    url: str,
    body: bytes,
    answer: dict[str, Any],
    *,
    signed: bool = True,
    headers: dict[str, str] | None = None,
) -> None:
    """Register one answer that only matches the exact body and the expected headers."""
    match = [matchers.body_matcher(body.decode("ascii"))]
    if signed:
        match.append(matchers.header_matcher(signed_headers(body)))
    rsps.add(method, url, json=answer, match=match, headers=headers)


@pytest.fixture
def rsps():
    with responses.RequestsMock(assert_all_requests_are_fired=True) as mock:
        yield mock


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def client(sleeps: list[float]) -> GatewayClient:
    return GatewayClient(
        base_url=BASE + "/",
        install_url=INSTALL,
        merchant_account_id=ACCOUNT,
        signing_key=KEY,
        sleep=sleeps.append,
    )


def sent_body(rsps: responses.RequestsMock, index: int = -1) -> bytes:
    body = rsps.calls[index].request.body
    assert isinstance(body, bytes)
    return body


# --- installation and settings -------------------------------------------------------------------


def test_install_posts_unsigned_settings_and_parses_secret_key(rsps, client):
    body = (
        b'{"merchantAccountId":"merchant-1","merchantAccountApiKey":"api-key-1",'
        b'"checkoutStatusCallbackUrl":"https://shop.example/gateway/callback",'
        b'"callbackFailuresEmail":"owner@shop.example",'
        b'"minimumCheckoutAmountCents":1000,"maximumCheckoutAmountCents":500000}'
    )
    expect(rsps, "POST", f"{INSTALL}/v2", body, {"secretSigningKey": "fresh-key"}, signed=False)
    request = InstallRequest(
        merchantAccountId=ACCOUNT,
        merchantAccountApiKey=SecretStr("api-key-1"),
        checkoutStatusCallbackUrl="https://shop.example/gateway/callback",
        callbackFailuresEmail="owner@shop.example",
        minimumCheckoutAmountCents=1000,
        maximumCheckoutAmountCents=500000,
    )

    answer = client.install(request)

    sent = rsps.calls[0].request
    assert sent.method == "POST"
    assert sent.body == body
    assert sent.headers["Content-Type"] == "application/json"
    assert sent.headers["User-Agent"].startswith("flask-gateway/")
    assert "X-Signature" not in sent.headers
    assert "X-Merchant-Account-ID" not in sent.headers
    assert answer.data.secretSigningKey.get_secret_value() == "fresh-key"
    assert answer.status_code == 200
    assert answer.request_id is None


def test_install_works_without_a_signing_key_and_defaults_install_url(rsps):
    client = GatewayClient(base_url=BASE, merchant_account_id=ACCOUNT)
    rsps.add("POST", f"{BASE}/install/v2", json={"secretSigningKey": "k"})
    request = InstallRequest(
        merchantAccountId=ACCOUNT,
        merchantAccountApiKey=SecretStr("api-key-1"),
        checkoutStatusCallbackUrl="https://shop.example/cb",
        minimumCheckoutAmountCents=0,
        maximumCheckoutAmountCents=10,
    )
    assert client.install(request).data.secretSigningKey.get_secret_value() == "k"


def test_update_settings_patches_signed_body(rsps, client):
    body = (
        b'{"checkoutStatusCallbackUrl":"https://shop.example/new-callback","minimumCheckoutAmountCents":2000}'
    )
    answer = {
        "checkoutStatusCallbackUrl": "https://shop.example/new-callback",
        "callbackFailuresEmail": None,
        "minimumCheckoutAmountCents": 2000,
        "maximumCheckoutAmountCents": 500000,
        "signingKey": KEY,
    }
    expect(rsps, "PATCH", f"{INSTALL}/v2", body, answer)
    request = SettingsUpdateRequest(
        checkoutStatusCallbackUrl="https://shop.example/new-callback", minimumCheckoutAmountCents=2000
    )

    result = client.update_settings(request)

    assert rsps.calls[0].request.method == "PATCH"
    assert sent_body(rsps) == body
    assert result.data.minimumCheckoutAmountCents == 2000
    assert result.data.maximumCheckoutAmountCents == 500000
    assert result.data.signingKey.get_secret_value() == KEY


def test_signed_operations_need_a_signing_key(rsps):
    client = GatewayClient(base_url=BASE, merchant_account_id=ACCOUNT)
    with pytest.raises(RuntimeError, match="signing key"):
        client.create_checkout(create_request("r"))
    with pytest.raises(RuntimeError, match="signing key"):
        client.update_settings(SettingsUpdateRequest(minimumCheckoutAmountCents=1))
    assert len(rsps.calls) == 0


def test_repr_hides_signing_key(client):
    assert KEY not in repr(client)


# --- checkout operations -------------------------------------------------------------------------


def test_create_checkout_sends_exact_compact_ascii_body(rsps, client):
    body = (
        '{"requestId":"req-1","payjustnow":' + SERVICE_JSON + ","
        '"customer":{"firstName":"Zo\\u00eb","lastName":"\\u00c5ngstr\\u00f6m \\u6771\\u4eac"},'
        '"orderExpiryMinutes":30},"checkoutTotalCents":3000,"clickTraceId":"click-9"}'
    ).encode("ascii")
    expect(rsps, "POST", f"{BASE}/v2/create", body, checkout_answer())
    request = CreateCheckoutRequest(
        requestId="req-1",
        order_details=CreateOrderDetails(
            **service_fields(),
            customer=Customer(firstName="Zoë", lastName="Ångström 東京"),
            orderExpiryMinutes=30,
        ),
        checkoutTotalCents=3000,
        clickTraceId="click-9",
    )

    answer = client.create_checkout(request)

    sent = rsps.calls[0].request
    assert sent.url == f"{BASE}/v2/create"
    assert sent.body == body
    assert sent.headers["X-Signature"] == sign(body, KEY)
    assert answer.request_id == "req-1"
    assert answer.attempts == 1
    assert answer.data.checkoutToken == TOKEN
    assert answer.data.checkoutPaymentStatus is CheckoutStatus.PENDING_ORDER
    assert answer.data.paymentUrl == f"{BASE}/api/v2/app/checkout/{TOKEN}"


def test_create_checkout_parses_timestamps_with_ms_and_us(rsps, client):
    rsps.add("POST", f"{BASE}/v2/create", json=checkout_answer())
    data = client.create_checkout(create_request("req-1")).data
    assert data.createdAt == datetime(2024, 5, 1, 10, 0, 0, 123000, tzinfo=UTC)
    assert data.updatedAt == datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)
    assert data.expiresAt == datetime(2024, 5, 1, 11, 0, 0, tzinfo=UTC)


def test_create_checkout_keeps_unknown_status_and_extra_fields(rsps, client):
    rsps.add(
        "POST",
        f"{BASE}/v2/create",
        json=checkout_answer(checkoutPaymentStatus="ON_HOLD_FOR_REVIEW", riskScore=17, newThing={"a": 1}),
    )
    data = client.create_checkout(create_request("req-1")).data
    assert data.checkoutPaymentStatus == "ON_HOLD_FOR_REVIEW"
    assert not isinstance(data.checkoutPaymentStatus, CheckoutStatus)
    assert data.model_extra == {"riskScore": 17, "newThing": {"a": 1}}


def test_create_generates_a_uuid_request_id_when_none_given(rsps, client):
    rsps.add("POST", f"{BASE}/v2/create", json=checkout_answer(None))
    rsps.add("POST", f"{BASE}/v2/create", json=checkout_answer(None))

    first = client.create_checkout(create_request())
    second = client.create_checkout(create_request())

    sent_ids = [json.loads(sent_body(rsps, i))["requestId"] for i in range(2)]
    assert sent_ids == [first.request_id, second.request_id]
    assert uuid.UUID(sent_ids[0]).version == 4
    assert sent_ids[0] != sent_ids[1]
    # The signature covers the body that carries the generated id.
    assert rsps.calls[0].request.headers["X-Signature"] == sign(sent_body(rsps, 0), KEY)


def test_create_keeps_caller_request_id(rsps, client):
    rsps.add("POST", f"{BASE}/v2/create", json=checkout_answer("my-key-42"))
    answer = client.create_checkout(create_request("my-key-42"))
    assert json.loads(sent_body(rsps))["requestId"] == "my-key-42"
    assert answer.request_id == "my-key-42"


def test_idempotent_replay_header(rsps, client):
    rsps.add("POST", f"{BASE}/v2/create", json=checkout_answer(), headers={"idempotent-replay": "true"})
    rsps.add("POST", f"{BASE}/v2/create", json=checkout_answer())
    rsps.add("POST", f"{BASE}/v2/create", json=checkout_answer(), headers={"idempotent-replay": "false"})

    assert client.create_checkout(create_request("req-1")).idempotent_replay is True
    assert client.create_checkout(create_request("req-1")).idempotent_replay is False
    assert client.create_checkout(create_request("req-1")).idempotent_replay is False


def test_a_client_on_the_specs_wire_names_sends_them_and_reads_either(rsps):
    spec_client = GatewayClient(
        base_url=BASE, merchant_account_id=ACCOUNT, signing_key=KEY, sleep=lambda _: None, wire_names=SPEC
    )
    body = (
        '{"requestId":"req-1","service":'
        + SERVICE_JSON
        + ',"orderExpiryMinutes":30},"checkoutTotalCents":3000}'
    ).encode()
    echo = {"merchantOrderReference": "order-7", "orderAmountCents": 3000}
    expect(rsps, "POST", f"{BASE}/v2/create", body, checkout_answer(payjustnow=echo))
    expect(rsps, "POST", f"{BASE}/v2/create", body, checkout_answer(service=echo))
    request = CreateCheckoutRequest(
        requestId="req-1",
        order_details=CreateOrderDetails(**service_fields(), orderExpiryMinutes=30),
        checkoutTotalCents=3000,
    )
    for _ in range(2):
        answer = spec_client.create_checkout(request).data
        assert answer.order_details is not None and answer.order_details.orderAmountCents == 3000


def test_update_checkout_sends_signed_body(rsps, client):
    body = (
        '{"checkoutToken":"' + TOKEN + '","payjustnow":' + SERVICE_JSON + ","
        '"expiresAt":"2024-05-01T12:30:00.000Z"},"checkoutTotalCents":3000}'
    ).encode("ascii")
    answer_body = checkout_answer(
        payjustnow={"checkoutPaymentStatus": "PENDING_ORDER", "orderAmountCents": 3000}
    )
    expect(rsps, "POST", f"{BASE}/v2/update", body, answer_body)
    request = UpdateCheckoutRequest(
        checkoutToken=TOKEN,
        order_details=UpdateOrderDetails(
            **service_fields(), expiresAt=datetime(2024, 5, 1, 12, 30, tzinfo=UTC)
        ),
        checkoutTotalCents=3000,
    )

    answer = client.update_checkout(request)

    assert sent_body(rsps) == body
    assert answer.request_id is None
    assert answer.data.order_details is not None
    assert answer.data.order_details.checkoutPaymentStatus is CheckoutStatus.PENDING_ORDER


def test_cancel_checkout_sends_token(rsps, client):
    body = ('{"checkoutToken":"' + TOKEN + '"}').encode("ascii")
    answer = checkout_answer(
        checkoutPaymentStatus="CANCELLED_BY_MERCHANT",
        cancelledAt="2024-05-01T10:05:00.5Z",
        merchantAccountId=ACCOUNT,
        payjustnow={"merchantOrderReference": "order-7", "orderAmountCents": 3000},
    )
    expect(rsps, "POST", f"{BASE}/v2/cancel", body, answer)

    result = client.cancel_checkout(TOKEN)

    assert sent_body(rsps) == body
    assert result.data.checkoutPaymentStatus is CheckoutStatus.CANCELLED_BY_MERCHANT
    assert result.data.cancelledAt == datetime(2024, 5, 1, 10, 5, 0, 500000, tzinfo=UTC)
    assert result.data.merchantAccountId == ACCOUNT


def test_get_status_parses_the_16_key_payload(rsps, client):
    body = ('{"checkoutToken":"' + TOKEN + '"}').encode("ascii")
    payload = {
        "requestId": "req-1",
        "checkoutToken": TOKEN,
        "checkoutTotalCents": 3000,
        "paymentUrl": f"{BASE}/api/v2/app/checkout/{TOKEN}",
        "checkoutPaymentStatus": "PAID",
        "paidAt": "2024-05-01T10:10:00.654321Z",
        "paymentReference": 123456,
        "merchantOrderReference": "order-7",
        "payjustnowOrderReference": 987,
        "clickTraceId": None,
        "createdAt": "2024-05-01T10:00:00.123Z",
        "updatedAt": "2024-05-01T10:10:00.654Z",
        "expiresAt": "2024-05-01T11:00:00.000000Z",
        "cancelledAt": None,
        "lastCallbackAttemptedAt": "2024-05-01T10:10:01.001Z",
        "lastCallbackAttemptStatusMessage": "OK",
    }
    expect(rsps, "POST", f"{BASE}/v2/getstatus", body, payload)

    data = client.get_status(TOKEN).data

    assert sent_body(rsps) == body
    assert data.checkoutPaymentStatus is CheckoutStatus.PAID
    assert data.paidAt == datetime(2024, 5, 1, 10, 10, 0, 654321, tzinfo=UTC)
    assert data.createdAt == datetime(2024, 5, 1, 10, 0, 0, 123000, tzinfo=UTC)
    assert data.paymentReference == 123456
    assert data.gatewayOrderReference == 987
    assert data.lastCallbackAttemptStatusMessage == "OK"
    assert data.cancelledAt is None


def test_refund_sends_signed_body(rsps, client):
    body = (
        b'{"requestId":"refund-key-1","checkoutToken":"' + TOKEN.encode() + b'",'
        b'"merchantRefundReference":"refund-1","refundAmountCents":500,"refundDescription":"broken"}'
    )
    answer = {
        "requestId": "refund-key-1",
        "refundedAmountCents": 500,
        "refundStatus": "SUCCESS",
        "refundStatusAt": "2024-05-02T09:00:00.25Z",
        "refundStatusDescription": "done",
    }
    expect(rsps, "POST", f"{BASE}/v2/refund", body, answer, headers={"idempotent-replay": "true"})

    result = client.refund(refund_request("refund-key-1"))

    assert sent_body(rsps) == body
    assert result.request_id == "refund-key-1"
    assert result.idempotent_replay is True
    assert result.data.refundedAmountCents == 500
    assert result.data.refundStatus == "SUCCESS"
    assert result.data.refundStatusAt == datetime(2024, 5, 2, 9, 0, 0, 250000, tzinfo=UTC)


@pytest.mark.parametrize("echoed", [True, False], ids=["with-requestId", "without-requestId"])
def test_refund_answer_is_read_with_or_without_its_request_id(rsps, client, echoed):
    """The spec says the answer echoes ``requestId`` (the emulator does); the documented examples print
    none: both are read, the echo kept when present (docs/decisions.md, issue 29)."""
    answer: dict[str, Any] = {"refundedAmountCents": 500, "refundStatus": "SUCCESS"}
    if echoed:
        answer = {"requestId": "refund-key-2", **answer}
    rsps.add("POST", f"{BASE}/v2/refund", json=answer)

    result = client.refund(refund_request("refund-key-2"))

    assert result.request_id == "refund-key-2"
    assert result.data.requestId == ("refund-key-2" if echoed else None)
    assert result.data.refundedAmountCents == 500
    assert result.data.to_wire() == answer  # written back as read: no requestId invented, none dropped


def test_refund_generates_request_id_when_none_given(rsps, client):
    rsps.add("POST", f"{BASE}/v2/refund", json={"refundedAmountCents": 500, "refundStatus": "SUCCESS"})

    result = client.refund(refund_request())

    sent_id = json.loads(sent_body(rsps))["requestId"]
    assert uuid.UUID(sent_id).version == 4
    assert result.request_id == sent_id
    assert result.idempotent_replay is False
