"""The emulator's v1 API: Basic authentication, configuration, checkout, firewall and refund.

The last part drives ``flask_gateway.core.V1Client`` against the in-process emulator through a
``requests`` adapter, so the client and the emulator are checked against each other.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterator
from datetime import timedelta

import pytest
import requests
import responses

from flask_gateway.core import V1Client
from flask_gateway.core.errors import AuthenticationError, FirewallRejectedError, V1RefundFailedError
from flask_gateway.core.timestamps import format_v1_timestamp, parse_timestamp, parse_v1_timestamp
from flask_gateway.core.wire import V1CheckoutRequest, V1RefundRequest, V1RefundResult
from flask_gateway.testing import FlaskAdapter
from tests.emulator.conftest import make_emulator
from tests.emulator.support import ACCOUNT, API_KEY, Gateway, v1_checkout_body
from tests.emulator.test_hosted import path_of

V1_TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\Z")
SUCCESS_URL = "https://shop.example/gateway/v1/success"
FAIL_URL = "https://shop.example/gateway/v1/fail"
FORBIDDEN = {"message": "Forbidden"}


# --- helpers -----------------------------------------------------------------------------------------


def emulator_now(gateway):
    return parse_timestamp(gateway.control("clock", method="GET").json["now"])


def status_of(gateway, token: str) -> str:
    response = gateway.control(f"checkouts/{token}", method="GET")
    assert response.status_code == 200
    return str(response.json["checkoutPaymentStatus"])


def checkout_count(gateway) -> int:
    return len(gateway.control("checkouts", method="GET").json["checkouts"])


def create_order(gateway, **order) -> str:
    response = gateway.v1("checkout", v1_checkout_body(**order))
    assert response.status_code == 200, response.get_data(as_text=True)
    return str(response.json["data"]["token"])


def paid_order(gateway, **order) -> str:
    """A v1 order the consumer paid (the merchant's success URL answers as it should)."""
    token = create_order(gateway, **order)
    with responses.RequestsMock() as merchant:
        merchant.get(SUCCESS_URL, json={"token": token, "return_url": "https://shop.example/orders/1"})
        paid = gateway.pay(token)
    assert paid.status_code == 200, paid.get_data(as_text=True)
    assert status_of(gateway, token) == "PAID"
    return token


def refund_body(
    token: str, amount: int, *, type: str = "partial", reference: str = "order-1", reason: str = "returned"
):
    return {"merchant_reference": reference, "token": token, "type": type, "amount": amount, "reason": reason}


def failed_reason(response) -> str:
    """The message of a refused v1 refund, checking the whole FAILED shape on the way."""
    assert response.status_code == 400, response.get_data(as_text=True)
    data = response.json  # a bare object, like the documented success answer
    assert set(data) == {"status", "reason"}
    assert data["status"] == "FAILED"
    assert set(data["reason"]) == {"errors"}
    assert set(data["reason"]["errors"]) == {"code", "message"}
    assert data["reason"]["errors"]["code"] == 400
    message = data["reason"]["errors"]["message"]
    assert isinstance(message, str) and message
    return message


def error_fields(response) -> set[str]:
    assert response.status_code == 400, response.get_data(as_text=True)
    assert isinstance(response.json["message"], str)
    return {error["field"] for error in response.json["errors"]}


# --- authentication ----------------------------------------------------------------------------------


@pytest.mark.parametrize("operation", ["configuration", "checkout", "refund"])
def test_missing_basic_auth_is_401_with_challenge(installed, operation):
    body = {"configuration": {}, "checkout": v1_checkout_body(), "refund": refund_body("x" * 32, 100)}[
        operation
    ]
    response = installed.client.post(f"/api/v1/merchant/{operation}", json=body)
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"].startswith("Basic ")
    assert "Basic" in response.json["message"]


@pytest.mark.parametrize(
    "authorization",
    [
        "Basic " + base64.b64encode(f"{ACCOUNT}:wrong-key".encode()).decode(),
        "Basic " + base64.b64encode(f"ghost:{API_KEY}".encode()).decode(),
        "Basic " + base64.b64encode(ACCOUNT.encode()).decode(),  # no colon, no key
        "Basic !!not-base64!!",
        "Bearer " + API_KEY,
    ],
    ids=["wrong key", "unknown account", "no key", "malformed", "other scheme"],
)
def test_bad_credentials_are_401_with_challenge(installed, authorization):
    response = installed.client.post(
        "/api/v1/merchant/configuration", json={}, headers={"Authorization": authorization}
    )
    assert response.status_code == 401
    assert response.headers["WWW-Authenticate"] == 'Basic realm="gateway v1"'
    assert response.json["message"]
    assert API_KEY not in response.get_data(as_text=True)


def test_right_credentials_are_accepted(installed):
    assert installed.v1("configuration", {}).status_code == 200


# --- configuration -----------------------------------------------------------------------------------


def test_configuration_without_body_gives_only_the_limits(installed):
    for response in (
        installed.client.post("/api/v1/merchant/configuration", auth=(ACCOUNT, API_KEY)),  # no body at all
        installed.v1("configuration", {}),
    ):
        assert response.status_code == 200
        assert response.json == {"data": {"minimum_amount": 100, "maximum_amount": 10_000_000}}


def test_configuration_for_a_customer_gives_the_limits(installed):
    response = installed.v1("configuration", {"customer": {"email": "thandi@example.com"}})
    assert response.json == {"data": {"minimum_amount": 100, "maximum_amount": 10_000_000}}


def test_configuration_limits_follow_the_settings(installed):
    patched = installed.signed(
        "/install/v2",
        {"minimumCheckoutAmountCents": 5000, "maximumCheckoutAmountCents": 90000},
        method="PATCH",
    )
    assert patched.status_code == 200, patched.get_data(as_text=True)
    assert installed.v1("configuration", {}).json["data"] == {"minimum_amount": 5000, "maximum_amount": 90000}


@pytest.mark.parametrize(
    ("amount", "each", "excess"), [(1000, 333, 1), (900, 300, 0), (1001, 333, 2), (2, 0, 2)]
)
def test_configuration_with_amount_gives_only_the_plan(installed, stopped_clock, amount, each, excess):
    assert emulator_now(installed) == stopped_clock
    response = installed.v1("configuration", {"amount": amount})
    assert response.status_code == 200
    data = response.json["data"]
    assert set(data) == {"payment_plan"}
    plan = data["payment_plan"]
    assert set(plan) == {"due_at", "amount", "excess"}
    assert (plan["amount"], plan["excess"]) == (each, excess)
    assert 3 * plan["amount"] + plan["excess"] == amount
    assert V1_TIME.match(plan["due_at"])
    assert parse_v1_timestamp(plan["due_at"]) == stopped_clock  # due now, by the emulator's clock


def test_plan_due_date_follows_the_emulator_clock(installed, stopped_clock):
    installed.advance(3 * 86400)
    due = parse_v1_timestamp(
        installed.v1("configuration", {"amount": 1000}).json["data"]["payment_plan"]["due_at"]
    )
    assert due == emulator_now(installed) == stopped_clock + timedelta(days=3)


def test_configuration_with_customer_and_amount_gives_all_three(installed):
    response = installed.v1("configuration", {"amount": 1000, "customer": {"email": "thandi@example.com"}})
    data = response.json["data"]
    assert set(data) == {"minimum_amount", "maximum_amount", "payment_plan"}
    assert (data["minimum_amount"], data["maximum_amount"]) == (100, 10_000_000)
    assert (data["payment_plan"]["amount"], data["payment_plan"]["excess"]) == (333, 1)


@pytest.mark.parametrize("amount", ["1000", -1, 10.5, True])
def test_configuration_refuses_a_bad_amount(installed, amount):
    assert error_fields(installed.v1("configuration", {"amount": amount})) == {"amount"}


# --- checkout ----------------------------------------------------------------------------------------


def test_checkout_answers_token_expiry_and_redirect(installed, stopped_clock):
    installed.advance(86400)  # the default expiry counts from the emulator's clock, not the wall clock
    now = emulator_now(installed)
    assert now == stopped_clock + timedelta(days=1)
    response = installed.v1("checkout", v1_checkout_body())
    assert response.status_code == 200, response.get_data(as_text=True)
    data = response.json["data"]
    assert set(data) == {"token", "expires_at", "redirect_to"}
    assert re.fullmatch(r"[0-9a-f]{32}", data["token"])
    assert data["redirect_to"] == f"http://localhost/api/v1/app/checkout/{data['token']}"
    assert V1_TIME.match(data["expires_at"])
    assert parse_v1_timestamp(data["expires_at"]) == now + timedelta(minutes=60)
    assert status_of(installed, data["token"]) == "PENDING_ORDER"


def test_checkout_with_explicit_expiry(installed):
    expires = format_v1_timestamp(emulator_now(installed) + timedelta(hours=5))
    response = installed.v1("checkout", v1_checkout_body(expires_at=expires))
    assert response.status_code == 200
    assert response.json["data"]["expires_at"] == expires


@pytest.mark.parametrize("seconds_ago", [1, 3600])
def test_checkout_with_past_expiry_is_400(installed, seconds_ago):
    past = format_v1_timestamp(emulator_now(installed) - timedelta(seconds=seconds_ago))
    assert error_fields(installed.v1("checkout", v1_checkout_body(expires_at=past))) == {"order.expires_at"}
    assert checkout_count(installed) == 0


def test_checkout_with_malformed_expiry_is_400(installed):
    body = v1_checkout_body(expires_at="2030-01-01T10:00:00Z")
    assert error_fields(installed.v1("checkout", body)) == {"order.expires_at"}


def test_checkout_names_every_missing_field(installed):
    body = v1_checkout_body()
    del body["customer"]["first_name"]
    del body["customer"]["address"]["city"]
    del body["order"]["merchant_reference"]
    del body["order"]["success_callback_url"]
    del body["order"]["items"]["1"]["unit_price"]
    assert error_fields(installed.v1("checkout", body)) == {
        "customer.first_name",
        "customer.address.city",
        "order.merchant_reference",
        "order.success_callback_url",
        "order.items.1.unit_price",
    }
    assert checkout_count(installed) == 0


def test_checkout_without_customer_or_order(installed):
    assert error_fields(installed.v1("checkout", {"order": v1_checkout_body()["order"]})) == {"customer"}
    assert error_fields(installed.v1("checkout", {"customer": v1_checkout_body()["customer"]})) == {"order"}


def test_checkout_accepts_address_line_2(installed):
    body = v1_checkout_body()
    body["customer"]["address"]["address_line_2"] = "Unit 4"
    assert installed.v1("checkout", body).status_code == 200


@pytest.mark.parametrize("mobile", ["0821234567", "27821234567", "+27 82 123 4567", "+27821234567"])
def test_checkout_takes_the_mobile_number_as_the_shop_stored_it(installed, mobile):
    """The documentation shows E.164 but validates only "string required"; real clients send local numbers."""
    body = v1_checkout_body()
    body["customer"]["mobile_number"] = mobile
    assert installed.v1("checkout", body).status_code == 200
    assert checkout_count(installed) == 1


@pytest.mark.parametrize("mobile", ["", 27821234567, None])
def test_checkout_refuses_a_missing_or_non_text_mobile_number(installed, mobile):
    body = v1_checkout_body()
    body["customer"]["mobile_number"] = mobile
    assert error_fields(installed.v1("checkout", body)) == {"customer.mobile_number"}


def test_checkout_accepts_items_keyed_one_two(installed):
    item = v1_checkout_body()["order"]["items"]["1"]
    items = {"1": item, "2": {**item, "merchant_reference": "T-9", "description": "Toaster", "quantity": 1}}
    assert installed.v1("checkout", v1_checkout_body(items=items)).status_code == 200


@pytest.mark.backends
def test_checkout_accepts_items_as_an_array_and_shows_them_in_order(installed):
    item = v1_checkout_body()["order"]["items"]["1"]
    items = [item, {**item, "merchant_reference": 77, "description": "Toaster", "quantity": 1}]
    response = installed.v1("checkout", v1_checkout_body(items=items))
    assert response.status_code == 200, response.get_data(as_text=True)
    page = installed.client.get(path_of(response.json["data"]["redirect_to"])).get_data(as_text=True)
    assert page.index(item["description"]) < page.index("Toaster")


@pytest.mark.backends
def test_checkout_takes_what_real_clients_send(installed):
    """Text postal code, numeric merchant references (order and items), extra keys anywhere."""
    body = v1_checkout_body()
    body["customer"]["company"] = "Stoep (Pty) Ltd"
    body["customer"]["address"].update(postal_code="0181", country="ZA")
    body["order"].update(merchant_reference=90210, basket_count=1, shipping_cost=0)
    body["order"]["items"]["1"]["merchant_reference"] = 501
    assert installed.v1("checkout", body).status_code == 200, installed.v1("checkout", body).get_data()


def test_checkout_refuses_items_that_are_neither_object_nor_array(installed):
    assert error_fields(installed.v1("checkout", v1_checkout_body(items="K-1"))) == {"order.items"}
    item = v1_checkout_body()["order"]["items"]["1"]
    assert error_fields(installed.v1("checkout", v1_checkout_body(items=[{**item, "unit_price": "5"}]))) == {
        "order.items.1.unit_price"
    }
    assert checkout_count(installed) == 0


def test_checkout_outside_the_limits_is_400(installed):
    assert error_fields(installed.v1("checkout", v1_checkout_body(amount=99))) == {"order.amount"}
    assert error_fields(installed.v1("checkout", v1_checkout_body(amount=10_000_001))) == {"order.amount"}


# --- firewall ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "url"),
    [
        ("success_callback_url", "http://localhost:5000/gateway/v1/success"),
        ("success_callback_url", "http://127.0.0.1:5000/gateway/v1/success"),
        ("fail_callback_url", "http://127.0.0.1/gateway/v1/fail"),
        ("fail_callback_url", "http://shop.localhost/gateway/v1/fail"),
        ("success_callback_url", "http://[::1]:8000/ok"),
        ("fail_callback_url", "https://10.0.0.5/fail"),
    ],
)
def test_strict_firewall_refuses_local_merchant_urls(installed, field, url):
    response = installed.v1("checkout", v1_checkout_body(**{field: url}))
    assert response.status_code == 403
    assert response.json == FORBIDDEN
    assert checkout_count(installed) == 0
    # The firewall answers before the application: credentials do not matter.
    unauthenticated = installed.client.post(
        "/api/v1/merchant/checkout", json=v1_checkout_body(**{field: url})
    )
    assert unauthenticated.status_code == 403
    assert unauthenticated.json == FORBIDDEN


def test_allow_local_firewall_accepts_local_merchant_urls(database_url):
    app = make_emulator(database_url, waf_strict=False)
    try:
        gateway = Gateway(app.test_client())
        body = v1_checkout_body(
            success_callback_url="http://127.0.0.1:5000/gateway/v1/success",
            fail_callback_url="http://localhost:5000/gateway/v1/fail",
        )
        assert gateway.v1("checkout", body).status_code == 200
    finally:
        from flask_gateway.emulator.models import db

        with app.app_context():
            db.engine.dispose()


# --- refund ------------------------------------------------------------------------------------------


def test_full_refund(installed, stopped_clock):
    token = paid_order(installed)
    assert emulator_now(installed) == stopped_clock
    response = installed.v1("refund", refund_body(token, 79800, type="full"))
    assert response.status_code == 200, response.get_data(as_text=True)
    data = response.json  # a bare object, as the gateway's documentation prints it
    assert set(data) == {"status", "reason", "refunded_at", "amount_refunded"}
    assert data["status"] == "REFUNDED"
    assert data["reason"] == "Order successfully refunded"
    assert data["amount_refunded"] == 79800
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", data["refunded_at"])
    assert parse_timestamp(data["refunded_at"]) == stopped_clock
    assert status_of(installed, token) == "FULLY_REFUNDED"
    # A second request for a refunded order: the documented refusal.
    again = failed_reason(installed.v1("refund", refund_body(token, 1)))
    assert again.startswith("Amount is greater than available amount refundable.")


def test_partial_refunds_then_full_refund_of_the_rest(installed):
    token = paid_order(installed)
    first = installed.v1("refund", refund_body(token, 10000))
    assert first.status_code == 200
    assert first.json["amount_refunded"] == 10000
    assert status_of(installed, token) == "PARTIALLY_REFUNDED"
    second = installed.v1("refund", refund_body(token, 20000))
    assert second.json["status"] == "REFUNDED"
    assert status_of(installed, token) == "PARTIALLY_REFUNDED"
    # "full" refunds what remains, and only that: neither less nor the original amount
    assert "full refund must be for the remaining 49800" in failed_reason(
        installed.v1("refund", refund_body(token, 100, type="full"))
    )
    assert failed_reason(installed.v1("refund", refund_body(token, 79800, type="full"))).startswith(
        "Amount is greater than available amount refundable."
    )
    assert installed.control(f"checkouts/{token}", method="GET").json["refundedCents"] == 30000
    rest = installed.v1("refund", refund_body(token, 49800, type="full"))
    assert rest.status_code == 200
    assert rest.json["amount_refunded"] == 49800
    assert status_of(installed, token) == "FULLY_REFUNDED"


def test_refund_exceeding_the_remaining_amount_fails(installed):
    token = paid_order(installed)
    assert installed.v1("refund", refund_body(token, 70000)).status_code == 200
    message = failed_reason(installed.v1("refund", refund_body(token, 9801)))
    assert "9800" in message
    assert status_of(installed, token) == "PARTIALLY_REFUNDED"
    detail = installed.control(f"checkouts/{token}", method="GET").json
    assert detail["refundedCents"] == 70000


def test_refund_of_an_unknown_token_fails(installed):
    paid_order(installed)
    assert "No order" in failed_reason(installed.v1("refund", refund_body("0" * 32, 100)))


def test_refund_with_mismatched_merchant_reference_fails(installed):
    token = paid_order(installed)
    message = failed_reason(installed.v1("refund", refund_body(token, 100, reference="order-2")))
    assert "merchant_reference" in message
    assert status_of(installed, token) == "PAID"


def test_refund_of_an_unpaid_order_fails(installed):
    token = create_order(installed)
    assert "PENDING_ORDER" in failed_reason(installed.v1("refund", refund_body(token, 100)))
    assert status_of(installed, token) == "PENDING_ORDER"


def test_refund_of_another_merchants_order_fails(installed):
    token = paid_order(installed)
    issued = installed.control(
        "accounts", {"merchantAccountId": "other", "merchantAccountApiKey": "other-key"}
    )
    assert issued.status_code == 201
    response = installed.v1("refund", refund_body(token, 100), auth=("other", "other-key"))
    assert "No order" in failed_reason(response)
    assert status_of(installed, token) == "PAID"


def test_refund_of_a_v2_checkout_fails(installed):
    created = installed.create()
    installed.pay(created["checkoutToken"])
    failed_reason(installed.v1("refund", refund_body(created["checkoutToken"], 100)))
    assert installed.status(created["checkoutToken"])["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"


def test_refund_with_invalid_fields_is_a_validation_error(installed):
    body = refund_body("0" * 32, 100)
    body["type"] = "half"
    del body["amount"]
    assert error_fields(installed.v1("refund", body)) == {"type", "amount"}


def test_refund_answers_parse_as_v1_refund_results(installed):
    token = paid_order(installed)
    ok = V1RefundResult.model_validate(installed.v1("refund", refund_body(token, 100)).json)
    assert (ok.status, ok.amount_refunded, ok.failure_message) == ("REFUNDED", 100, None)
    refused = V1RefundResult.model_validate(installed.v1("refund", refund_body(token, 10**6)).json)
    assert refused.status == "FAILED"
    assert "greater than available amount refundable" in (refused.failure_message or "")


# --- V1Client against the emulator --------------------------------------------------------------------


@pytest.fixture
def v1_client(installed) -> Iterator[V1Client]:
    session = requests.Session()
    session.mount("http://emulator.test", FlaskAdapter(installed.client))
    yield V1Client(
        v1_base_url="http://emulator.test",
        merchant_account_id=ACCOUNT,
        api_key=API_KEY,
        session=session,
        max_retries=0,
    )
    session.close()


def test_v1_client_configuration(v1_client):
    limits = v1_client.configuration().data
    assert (limits.minimum_amount, limits.maximum_amount, limits.payment_plan) == (100, 10_000_000, None)
    full = v1_client.configuration(amount=1000, customer_email="thandi@example.com").data
    assert (full.minimum_amount, full.maximum_amount) == (100, 10_000_000)
    assert full.payment_plan is not None
    assert (full.payment_plan.amount, full.payment_plan.excess) == (333, 1)


def test_v1_client_checkout_and_refunds(installed, v1_client):
    created = v1_client.checkout(V1CheckoutRequest.model_validate(v1_checkout_body())).data
    assert created.redirect_to == f"http://emulator.test/api/v1/app/checkout/{created.token}"
    with responses.RequestsMock() as merchant:
        merchant.get(
            SUCCESS_URL, json={"token": created.token, "return_url": "https://shop.example/orders/1"}
        )
        assert installed.pay(created.token).json["checkoutPaymentStatus"] == "PAID"

    partial = v1_client.refund(
        V1RefundRequest(
            merchant_reference="order-1", token=created.token, type="partial", amount=800, reason="scratch"
        )
    ).data
    assert (partial.status, partial.amount_refunded) == ("REFUNDED", 800)
    assert partial.reason == "Order successfully refunded"  # the documented text, not the request's reason
    assert partial.refunded_at is not None

    with pytest.raises(V1RefundFailedError) as refused:
        v1_client.refund(
            V1RefundRequest(merchant_reference="order-1", token=created.token, type="partial", amount=10**6)
        )
    assert refused.value.http_status == 400
    assert "greater than available amount refundable" in refused.value.message

    with pytest.raises(V1RefundFailedError) as mismatched:
        v1_client.refund(
            V1RefundRequest(merchant_reference="other", token=created.token, type="full", amount=79000)
        )
    assert "merchant_reference" in mismatched.value.message

    rest = v1_client.refund(
        V1RefundRequest(merchant_reference="order-1", token=created.token, type="full", amount=79000)
    ).data
    assert (rest.status, rest.amount_refunded) == ("REFUNDED", 79000)
    assert status_of(installed, created.token) == "FULLY_REFUNDED"


def test_v1_client_errors(installed, v1_client):
    with pytest.raises(FirewallRejectedError):
        v1_client.checkout(
            V1CheckoutRequest.model_validate(v1_checkout_body(success_callback_url="http://localhost/ok"))
        )
    v1_client._auth.password = "wrong"  # type: ignore[attr-defined]
    with pytest.raises(AuthenticationError) as refused:
        v1_client.configuration()
    assert refused.value.http_status == 401
