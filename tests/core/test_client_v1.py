"""The v1 client: HTTP Basic, snake_case bodies wrapped in ``data``, items keyed "1", "2", refunds."""

from __future__ import annotations

import base64
import re
from datetime import UTC, datetime
from typing import Any

import pytest
import responses
from responses import matchers

from flask_gateway.core.client import V1Client
from flask_gateway.core.errors import InvalidResponseError, V1RefundFailedError
from flask_gateway.core.wire import (
    V1Address,
    V1CheckoutRequest,
    V1Customer,
    V1Item,
    V1Order,
    V1RefundRequest,
    V1RefundType,
)

V1 = "https://v1.gateway.test"
ACCOUNT = "merchant-1"
API_KEY = "api-key-1"
BASIC = "Basic " + base64.b64encode(b"merchant-1:api-key-1").decode("ascii")
HEADERS: dict[str, str | re.Pattern[str]] = {
    "Authorization": BASIC,
    "Content-Type": "application/json",
    "User-Agent": re.compile(r"^flask-gateway/"),
}


@pytest.fixture
def rsps():
    with responses.RequestsMock(assert_all_requests_are_fired=True) as mock:
        yield mock


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def client(sleeps: list[float]) -> V1Client:
    return V1Client(v1_base_url=V1 + "/", merchant_account_id=ACCOUNT, api_key=API_KEY, sleep=sleeps.append)


def expect(
    rsps: responses.RequestsMock, operation: str, body: bytes, answer: dict[str, Any], status: int = 200
) -> None:
    rsps.add(
        "POST",
        f"{V1}/api/v1/merchant/{operation}",
        json=answer,
        status=status,
        match=[matchers.body_matcher(body.decode("ascii")), matchers.header_matcher(HEADERS)],
    )


def test_basic_auth_header_is_base64_of_account_and_key(rsps, client):
    expect(rsps, "configuration", b"{}", {"data": {"minimum_amount": 1000, "maximum_amount": 200000}})
    client.configuration()
    assert rsps.calls[0].request.headers["Authorization"] == "Basic bWVyY2hhbnQtMTphcGkta2V5LTE="
    assert "X-Signature" not in rsps.calls[0].request.headers


def test_repr_hides_api_key(client):
    assert API_KEY not in repr(client)


def test_configuration_empty_body_parses_numeric_strings(rsps, client):
    expect(rsps, "configuration", b"{}", {"data": {"minimum_amount": "1000", "maximum_amount": "2500000.00"}})

    answer = client.configuration()

    assert rsps.calls[0].request.body == b"{}"
    assert answer.data.minimum_amount == 1000
    assert answer.data.maximum_amount == 2500000
    assert isinstance(answer.data.minimum_amount, int)
    assert answer.data.payment_plan is None
    assert answer.status_code == 200


def test_configuration_with_amount_returns_payment_plan(rsps, client):
    expect(
        rsps,
        "configuration",
        b'{"amount":10000}',
        {
            "data": {
                "minimum_amount": 1000,
                "maximum_amount": 200000,
                "payment_plan": {"due_at": "2024-05-01 10:00:00", "amount": "3333", "excess": "1"},
            }
        },
    )

    plan = client.configuration(amount=10000).data.payment_plan

    assert plan is not None
    assert plan.amount == 3333
    assert plan.excess == 1
    assert plan.due_at == datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)


def test_configuration_with_customer_email(rsps, client):
    expect(
        rsps,
        "configuration",
        b'{"amount":500,"customer":{"email":"zoe@example.com"}}',
        {"data": {"minimum_amount": 100, "maximum_amount": 900}},
    )
    answer = client.configuration(amount=500, customer_email="zoe@example.com")
    assert answer.data.maximum_amount == 900


def test_checkout_sends_items_keyed_by_index_and_unwraps_data(rsps, client):
    body = (
        b'{"customer":{"first_name":"Zo\\u00eb","last_name":"Smith","email":"zoe@example.com",'
        b'"mobile_number":"+27821234567","address":{"address_line_1":"1 Main Rd","city":"Cape Town",'
        b'"province":"Western Cape","postal_code":8001}},'
        b'"order":{"amount":4500,"merchant_reference":"order-9",'
        b'"success_callback_url":"https://shop.example/gateway/v1/success",'
        b'"fail_callback_url":"https://shop.example/gateway/v1/fail","expires_at":"2024-05-01 11:00:00",'
        b'"items":{"1":{"merchant_reference":"MUG-1","quantity":2,"description":"Mug","unit_price":1500},'
        b'"2":{"merchant_reference":"CAP-1","quantity":1,"description":"Cap","unit_price":1500}}}}'
    )
    token = "0123456789abcdef0123456789abcdef"
    expect(
        rsps,
        "checkout",
        body,
        {
            "data": {
                "token": token,
                "expires_at": "2024-05-01 11:00:00",
                "redirect_to": f"{V1}/api/v1/app/checkout/{token}",
            }
        },
    )
    request = V1CheckoutRequest(
        customer=V1Customer(
            first_name="Zoë",
            last_name="Smith",
            email="zoe@example.com",
            mobile_number="+27821234567",
            address=V1Address(
                address_line_1="1 Main Rd", city="Cape Town", province="Western Cape", postal_code=8001
            ),
        ),
        order=V1Order(
            amount=4500,
            merchant_reference="order-9",
            success_callback_url="https://shop.example/gateway/v1/success",
            fail_callback_url="https://shop.example/gateway/v1/fail",
            expires_at=datetime(2024, 5, 1, 11, 0, tzinfo=UTC),
            items=V1Order.number_items(
                [
                    V1Item(merchant_reference="MUG-1", quantity=2, description="Mug", unit_price=1500),
                    V1Item(merchant_reference="CAP-1", quantity=1, description="Cap", unit_price=1500),
                ]
            ),
        ),
    )

    answer = client.checkout(request)

    assert rsps.calls[0].request.body == body
    assert answer.data.token == token
    assert answer.data.redirect_to == f"{V1}/api/v1/app/checkout/{token}"
    assert answer.data.expires_at == datetime(2024, 5, 1, 11, 0, tzinfo=UTC)


def refund_request() -> V1RefundRequest:
    return V1RefundRequest(
        merchant_reference="order-9", token="0123456789abcdef", type=V1RefundType.PARTIAL, amount=700
    )


REFUND_BODY = (
    b'{"merchant_reference":"order-9","token":"0123456789abcdef","type":"partial","amount":700,"reason":""}'
)


def test_refund_success(rsps, client):
    expect(
        rsps,
        "refund",
        REFUND_BODY,
        {
            "data": {
                "status": "REFUNDED",
                "reason": "",
                "refunded_at": "2024-05-02 09:00:00",
                "amount_refunded": "700",
            }
        },
    )

    answer = client.refund(refund_request())

    assert rsps.calls[0].request.body == REFUND_BODY
    assert answer.data.status == "REFUNDED"
    assert answer.data.amount_refunded == 700
    assert answer.data.refunded_at == datetime(2024, 5, 2, 9, 0, tzinfo=UTC)


REFUSAL = {
    "data": {"status": "FAILED", "reason": {"errors": {"code": 400, "message": "Amount exceeds order"}}}
}


@pytest.mark.parametrize("status", [400, 200])
def test_refund_refusal_raises_with_gateway_message(rsps, client, sleeps, status):
    expect(rsps, "refund", REFUND_BODY, REFUSAL, status=status)

    with pytest.raises(V1RefundFailedError) as caught:
        client.refund(refund_request())

    assert caught.value.message == "Amount exceeds order"
    assert "Amount exceeds order" in str(caught.value)
    assert caught.value.http_status == status
    assert caught.value.operation == "v1_refund"
    assert len(rsps.calls) == 1
    assert sleeps == []


def test_configuration_with_non_numeric_amount_is_invalid_response(rsps, client):
    expect(rsps, "configuration", b"{}", {"data": {"minimum_amount": "one-thousand", "maximum_amount": 5}})

    with pytest.raises(InvalidResponseError) as caught:
        client.configuration()

    assert "data.minimum_amount" in caught.value.message
    assert "one-thousand" not in str(caught.value)
