"""Wire models: exact names, integer cents, timestamps, tolerance of unknown values, compact ASCII JSON."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from flask_gateway.core.wire import (
    OPERATOR,
    SPEC,
    WIRE_NAME_SETS,
    CheckoutResponse,
    CheckoutStatus,
    CheckoutStatusPayload,
    CreateCheckoutRequest,
    ErrorBody,
    InstallRequest,
    InstallResponse,
    RefundRequest,
    SettingsUpdateRequest,
    V1CheckoutRequest,
    V1Configuration,
    V1MerchantAnswer,
    V1RefundResult,
    WireNames,
    status_payload_keys,
)

ITEM = {
    "name": "Kettle",
    "sku": "K-1",
    "quantity": 2,
    "priceCents": 39900,
    "imageUrl": "https://shop.example/k.png",
    "pageUrl": "https://shop.example/k",
    "searchTerms": ["kettle"],
}
SERVICE = {
    "merchantOrderReference": "order-1",
    "orderAmountCents": 79800,
    "orderItems": [ITEM],
    "confirmRedirectUrl": "https://shop.example/ok",
    "cancelRedirectUrl": "https://shop.example/cancel",
}


def create_body(names: WireNames = OPERATOR, **overrides):
    body = {"requestId": "r-1", names.order_details: copy.deepcopy(SERVICE), "checkoutTotalCents": 79800}
    body.update(overrides)
    return body


@pytest.mark.parametrize("names", WIRE_NAME_SETS.values(), ids=WIRE_NAME_SETS)
def test_smallest_create_request_round_trips_with_exact_names(names):
    body = create_body(names)
    model = CreateCheckoutRequest.from_wire(body)
    assert json.loads(model.to_json(names)) == body
    assert (
        model.order_details.orderItems is not None and model.order_details.orderItems[0].priceCents == 39900
    )


def test_either_spelling_is_read_and_the_operators_is_written_by_default():
    for names in (OPERATOR, SPEC):
        wire = CreateCheckoutRequest.from_wire(create_body(names)).to_wire()
        assert "payjustnow" in wire and "service" not in wire
    assert "service" in CreateCheckoutRequest.from_wire(create_body()).to_wire(SPEC)


def test_the_python_attribute_name_is_not_a_wire_name():
    body = {"requestId": "r-1", "order_details": copy.deepcopy(SERVICE), "checkoutTotalCents": 79800}
    with pytest.raises(ValidationError) as info:
        CreateCheckoutRequest.from_wire(body)
    assert {e["loc"] for e in info.value.errors()} == {("payjustnow",)}


def test_what_real_clients_send_is_read():
    """Items with only name, sku (empty), quantity and priceCents; no orderItems at all."""
    bare_item = {"name": "Gift card", "sku": "", "quantity": 1, "priceCents": 5000}
    body = create_body()
    body["payjustnow"]["orderItems"] = [bare_item]
    item = CreateCheckoutRequest.from_wire(body).order_details.orderItems[0]  # type: ignore[index]
    assert (item.sku, item.imageUrl, item.searchTerms) == ("", None, None)
    del body["payjustnow"]["orderItems"]
    assert CreateCheckoutRequest.from_wire(body).order_details.orderItems is None


def test_serialisation_is_compact_ascii():
    body = create_body()
    body["payjustnow"]["customer"] = {"firstName": "Zoë", "lastName": "Nkosi\u00a0Dlamini"}
    raw = CreateCheckoutRequest.from_wire(body).to_json()
    assert raw.isascii()
    assert b" " not in raw
    assert b"Zo\\u00eb" in raw
    assert json.loads(raw)["payjustnow"]["customer"]["lastName"] == "Nkosi\u00a0Dlamini"


@pytest.mark.parametrize(
    ("path", "value", "location"),
    [
        (("checkoutTotalCents",), 798.0, "checkoutTotalCents"),
        (("checkoutTotalCents",), "79800", "checkoutTotalCents"),
        (("checkoutTotalCents",), True, "checkoutTotalCents"),
        (("checkoutTotalCents",), -1, "checkoutTotalCents"),
        (("payjustnow", "orderItems", 0, "priceCents"), 399.5, "payjustnow.orderItems.0.priceCents"),
        (("payjustnow", "orderItems", 0, "quantity"), 0, "payjustnow.orderItems.0.quantity"),
        (("payjustnow", "orderExpiryMinutes"), 9, "payjustnow.orderExpiryMinutes"),
        (("payjustnow", "orderExpiryMinutes"), 7201, "payjustnow.orderExpiryMinutes"),
        (("payjustnow", "confirmRedirectUrl"), "/relative", "payjustnow.confirmRedirectUrl"),
        (("payjustnow", "orderItems"), [ITEM] * 501, "payjustnow.orderItems"),
        (("payjustnow", "orderItems", 0, "name"), "", "payjustnow.orderItems.0.name"),
    ],
)
def test_invalid_fields_are_refused_with_their_location(path, value, location):
    body = create_body()
    target = body
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    with pytest.raises(ValidationError) as info:
        CreateCheckoutRequest.from_wire(body)
    locations = {".".join(map(str, e["loc"])) for e in info.value.errors()}
    assert location in locations


def test_expiry_minutes_bounds_are_inclusive():
    for minutes in (10, 7200):
        body = create_body()
        body["payjustnow"]["orderExpiryMinutes"] = minutes
        assert CreateCheckoutRequest.from_wire(body).order_details.orderExpiryMinutes == minutes


def test_missing_required_fields_are_named():
    body = create_body()
    del body["payjustnow"]["orderItems"][0]["sku"]
    del body["checkoutTotalCents"]
    with pytest.raises(ValidationError) as info:
        CreateCheckoutRequest.from_wire(body)
    locations = {".".join(map(str, e["loc"])) for e in info.value.errors()}
    assert locations == {"checkoutTotalCents", "payjustnow.orderItems.0.sku"}


def status_payload(**overrides):
    payload = {
        "requestId": "r-1",
        "checkoutToken": "v2.demo-merchant.6f1c1d1e-2b4a-4d5e-9f00-123456789abc",
        "checkoutTotalCents": 79800,
        "paymentUrl": "https://gw.example/api/v2/app/checkout/x",
        "checkoutPaymentStatus": "PAID",
        "paidAt": "2024-05-01T10:00:00.123456Z",
        "paymentReference": 123,
        "merchantOrderReference": "order-1",
        "payjustnowOrderReference": 456,
        "clickTraceId": None,
        "createdAt": "2024-05-01T09:00:00.123Z",
        "updatedAt": "2024-05-01T09:00:00Z",
        "expiresAt": "2024-05-01T10:30:00.000Z",
        "cancelledAt": None,
        "lastCallbackAttemptedAt": "2024-05-01T10:00:01.000Z",
        "lastCallbackAttemptStatusMessage": "OK",
    }
    payload.update(overrides)
    return payload


def test_status_payload_has_exactly_16_keys_with_nulls():
    payload = CheckoutStatusPayload.from_wire(status_payload())
    wire = json.loads(payload.to_json())
    assert tuple(wire) == status_payload_keys() == status_payload_keys(OPERATOR)
    assert len(wire) == 16
    assert wire["payjustnowOrderReference"] == 456 and payload.gatewayOrderReference == 456
    assert wire["clickTraceId"] is None
    # Microseconds where the gateway writes six digits (its getstatus example), milliseconds elsewhere.
    assert wire["paidAt"] == "2024-05-01T10:00:00.123456Z"
    assert wire["expiresAt"] == "2024-05-01T10:30:00.000000Z"
    assert wire["createdAt"] == "2024-05-01T09:00:00.123Z"
    assert payload.paidAt == datetime(2024, 5, 1, 10, 0, 0, 123456, tzinfo=UTC)
    assert payload.checkoutPaymentStatus is CheckoutStatus.PAID


def test_status_payload_in_the_specs_names():
    spec_body = status_payload()
    spec_body["serviceOrderReference"] = spec_body.pop("payjustnowOrderReference")
    payload = CheckoutStatusPayload.from_wire(spec_body)
    assert payload.gatewayOrderReference == 456
    wire = payload.to_wire(SPEC)
    assert tuple(wire) == status_payload_keys(SPEC)
    assert "serviceOrderReference" in wire and "payjustnowOrderReference" not in wire


def test_unknown_status_and_extra_fields_are_kept():
    payload = CheckoutStatusPayload.model_validate(
        status_payload(checkoutPaymentStatus="ON_HOLD", riskScore=7, nested={"a": [1]})
    )
    assert payload.checkoutPaymentStatus == "ON_HOLD"
    assert not isinstance(payload.checkoutPaymentStatus, CheckoutStatus)
    assert payload.model_extra == {"riskScore": 7, "nested": {"a": [1]}}
    assert json.loads(payload.to_json())["riskScore"] == 7


def test_checkout_response_with_reduced_cancel_echo():
    response = CheckoutResponse.model_validate(
        {
            "requestId": "r-1",
            "checkoutToken": "t",
            "checkoutTotalCents": 100,
            "paymentUrl": "https://gw.example/p",
            "checkoutPaymentStatus": "CANCELLED_BY_MERCHANT",
            "merchantOrderReference": "o",
            "createdAt": "2024-05-01T09:00:00.123Z",
            "updatedAt": "2024-05-01T09:00:00.123Z",
            "expiresAt": "2024-05-01T10:00:00.123Z",
            "cancelledAt": "2024-05-01T09:30:00.123456Z",
            "payjustnow": {"merchantOrderReference": "o", "orderAmountCents": 100},
            "merchantAccountId": "demo-merchant",
        }
    )
    assert response.checkoutPaymentStatus is CheckoutStatus.CANCELLED_BY_MERCHANT
    assert response.order_details is not None and response.order_details.orderItems is None
    assert response.cancelledAt == datetime(2024, 5, 1, 9, 30, 0, 123456, tzinfo=UTC)


def test_status_helpers():
    assert CheckoutStatus.PAID_PENDING_CALLBACK.is_paid
    assert CheckoutStatus.PARTIALLY_REFUNDED.is_paid
    assert not CheckoutStatus.PENDING_ORDER.is_paid
    assert CheckoutStatus.CANCELLED_BY_CONSUMER.is_open
    assert not CheckoutStatus.EXPIRED.is_open
    # The real gateway's PENDING_PAYMENT: the consumer is paying; open, not paid, not for the merchant
    # to change (update and cancel only from PENDING_ORDER or CANCELLED_BY_CONSUMER).
    pending = CheckoutStatusPayload.from_wire(status_payload(checkoutPaymentStatus="PENDING_PAYMENT"))
    assert pending.checkoutPaymentStatus is CheckoutStatus.PENDING_PAYMENT
    assert CheckoutStatus.PENDING_PAYMENT.is_open
    assert not CheckoutStatus.PENDING_PAYMENT.is_paid
    assert not CheckoutStatus.PENDING_PAYMENT.is_changeable
    assert CheckoutStatus.CANCELLED_BY_CONSUMER.is_changeable


def test_install_accepts_both_spellings_sends_the_first_and_masks_the_key():
    request = InstallRequest.model_validate(
        {
            "merchantAccountId": "m",
            "merchantAccountApiKey": "sk-live-SECRET",
            "checkoutStatusCallbackUrl": "https://shop.example/gateway/callback",
            "checkoutCallbackFailuresEmail": "ops@shop.example",
            "minimumCheckoutAmountCents": 5000,
            "maximumCheckoutAmountCents": 500000,
        }
    )
    assert "SECRET" not in repr(request) and "SECRET" not in str(request)
    wire = json.loads(request.to_json())
    assert wire["merchantAccountApiKey"] == "sk-live-SECRET"
    assert wire["callbackFailuresEmail"] == "ops@shop.example"
    assert "checkoutCallbackFailuresEmail" not in wire
    response = InstallResponse.model_validate({"secretSigningKey": "whsec-SECRET"})
    assert "SECRET" not in repr(response)
    assert response.secretSigningKey.get_secret_value() == "whsec-SECRET"


def test_install_refuses_minimum_above_maximum():
    with pytest.raises(ValidationError, match="minimumCheckoutAmountCents must not be greater"):
        InstallRequest(
            merchantAccountId="m",
            merchantAccountApiKey="k",  # type: ignore[arg-type]
            checkoutStatusCallbackUrl="https://shop.example/cb",
            minimumCheckoutAmountCents=10,
            maximumCheckoutAmountCents=5,
        )


def test_settings_update_needs_at_least_one_setting():
    with pytest.raises(ValidationError, match="at least one"):
        SettingsUpdateRequest.model_validate({})
    assert SettingsUpdateRequest.model_validate({"minimumCheckoutAmountCents": 100}).to_wire() == {
        "minimumCheckoutAmountCents": 100
    }


def test_refund_amount_must_be_positive_integer():
    base = {"requestId": "r", "checkoutToken": "t", "merchantRefundReference": "rf", "refundAmountCents": 1}
    assert RefundRequest.model_validate(base).refundAmountCents == 1
    for bad in (0, -5, 1.5, "10"):
        with pytest.raises(ValidationError):
            RefundRequest.model_validate({**base, "refundAmountCents": bad})


def test_error_body():
    body = ErrorBody.model_validate(
        {"message": "invalid", "errors": [{"field": "payjustnow.orderItems[0].priceCents", "message": "bad"}]}
    )
    assert body.errors is not None and body.errors[0].field == "payjustnow.orderItems[0].priceCents"


V1_CHECKOUT = {
    "customer": {
        "first_name": "Thandi",
        "last_name": "Mokoena",
        "email": "thandi@example.com",
        "mobile_number": "+27821234567",
        "address": {
            "address_line_1": "1 Long St",
            "city": "Cape Town",
            "province": "WC",
            "postal_code": 8001,
        },
    },
    "order": {
        "amount": 79800,
        "merchant_reference": "order-1",
        "success_callback_url": "https://shop.example/gateway/v1/success?s=abc",
        "fail_callback_url": "https://shop.example/gateway/v1/fail?s=abc",
        "expires_at": "2024-05-01 11:00:00",
        "items": {
            "1": {"merchant_reference": "K-1", "quantity": 1, "description": "Kettle", "unit_price": 39900},
            "2": {"merchant_reference": "K-2", "quantity": 1, "description": "Toaster", "unit_price": 39900},
        },
    },
}


def test_v1_checkout_round_trips():
    model = V1CheckoutRequest.model_validate(V1_CHECKOUT)
    assert json.loads(model.to_json()) == V1_CHECKOUT
    assert model.order.expires_at == datetime(2024, 5, 1, 11, 0, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("mutate", "location"),
    [
        (lambda b: b["customer"].update(mobile_number=""), "customer.mobile_number"),
        (lambda b: b["customer"]["address"].update(postal_code=""), "customer.address.postal_code"),
        (lambda b: b["customer"]["address"].update(postal_code=-1), "customer.address.postal_code"),
        (lambda b: b["order"].update(expires_at="2024-05-01T11:00:00Z"), "order.expires_at"),
        (lambda b: b["order"].update(merchant_reference=""), "order.merchant_reference"),
        (lambda b: b["order"]["items"]["1"].update(unit_price=1.5), "order.items"),
        (lambda b: b["order"].update(amount=0), "order.amount"),
    ],
)
def test_v1_checkout_validation(mutate, location):
    body = json.loads(json.dumps(V1_CHECKOUT))
    mutate(body)
    with pytest.raises(ValidationError) as info:
        V1CheckoutRequest.from_wire(body)
    assert any(".".join(map(str, e["loc"])).startswith(location) for e in info.value.errors())


def test_v1_checkout_reads_what_real_clients_send():
    """Items as an array, a postal code and a mobile number as text, numeric references, extra keys."""
    body = json.loads(json.dumps(V1_CHECKOUT))
    body["customer"]["mobile_number"] = "082 123 4567"
    body["customer"]["company"] = "Stoep (Pty) Ltd"
    body["customer"]["address"].update(postal_code="0181", country="ZA")
    items = list(body["order"]["items"].values())
    items[0]["merchant_reference"] = 501
    body["order"].update(items=items, merchant_reference=1234, basket_count=2, shipping_cost=0)
    order = V1CheckoutRequest.from_wire(body)
    assert order.customer.address.postal_code == "0181"
    assert order.order.merchant_reference == 1234
    assert [item.merchant_reference for item in order.order.item_list] == [501, "K-2"]
    assert order.model_extra == {} and order.order.model_extra == {"basket_count": 2, "shipping_cost": 0}
    written = json.loads(
        order.to_json()
    )  # the extra keys are written back; the items as the documented object
    assert written["order"]["items"] == {"1": items[0], "2": items[1]}
    assert written["order"]["basket_count"] == 2 and written["customer"]["company"] == "Stoep (Pty) Ltd"


def test_v1_amounts_as_numbers_or_numeric_text():
    config = V1Configuration.model_validate(
        {
            "minimum_amount": "5000",
            "maximum_amount": 500000,
            "payment_plan": {"due_at": "2024-06-01 00:00:00", "amount": "26600.00", "excess": 0},
        }
    )
    assert config.minimum_amount == 5000
    assert config.payment_plan is not None and config.payment_plan.amount == 26600
    for bad in ("12.5", "abc", True, 1.5):
        with pytest.raises(ValidationError):
            V1Configuration.model_validate({"minimum_amount": bad})


def test_v1_refund_result_bare_as_documented_or_wrapped():
    bare = V1RefundResult.from_wire(
        {
            "status": "REFUNDED",
            "reason": "Order successfully refunded",
            "refunded_at": "2022-02-08T09:03:56.292949Z",
            "amount_refunded": 50000,
        }
    )
    assert bare.refunded_at == datetime(2022, 2, 8, 9, 3, 56, 292949, tzinfo=UTC)
    assert bare.to_wire()["refunded_at"] == "2022-02-08T09:03:56.292949Z"
    assert bare.amount_refunded == 50000 and bare.failure_message is None
    ok = V1RefundResult.from_wire(
        {
            "data": {
                "status": "REFUNDED",
                "reason": "x",
                "refunded_at": "2024-05-01 10:00:00",
                "amount_refunded": "100",
            }
        }
    )
    assert ok.status == "REFUNDED" and ok.amount_refunded == 100 and ok.failure_message is None
    assert ok.refunded_at == datetime(2024, 5, 1, 10, tzinfo=UTC)
    failed = V1RefundResult.model_validate(
        {"status": "FAILED", "reason": {"errors": {"code": 400, "message": "Amount exceeds paid total"}}}
    )
    assert failed.failure_message == "Amount exceeds paid total"


def test_v1_merchant_answer():
    answer = V1MerchantAnswer.from_wire({"token": "a" * 32, "return_url": "https://shop.example/o/1"})
    assert answer.cancel_on_gateway is None
    with pytest.raises(ValidationError):
        V1MerchantAnswer.from_wire({"token": "a" * 32, "return_url": "/relative"})
    for names in (OPERATOR, SPEC):
        with pytest.raises(ValidationError):
            V1MerchantAnswer.from_wire(
                {"token": "t", "return_url": "https://x.example", names.cancel_on_gateway: "no"}
            )
        kept = V1MerchantAnswer.from_wire(
            {"token": "t", "return_url": "https://x.example", names.cancel_on_gateway: False}
        )
        assert kept.cancel_on_gateway is False
        assert kept.to_wire(names) == {
            "token": "t",
            "return_url": "https://x.example",
            names.cancel_on_gateway: False,
        }
    assert "cancel_on_payjustnow" in kept.to_wire()


def test_v1_configuration_with_the_documented_placeholders():
    """The documentation prints the payment plan's members as empty strings: parsed as not given."""
    config = V1Configuration.from_wire(
        {
            "minimum_amount": "10000",
            "maximum_amount": "100000",
            "payment_plan": {"due_at": "", "amount": "", "excess": ""},
        }
    )
    assert (config.minimum_amount, config.maximum_amount) == (10000, 100000)
    assert config.payment_plan is not None
    assert (config.payment_plan.due_at, config.payment_plan.amount, config.payment_plan.excess) == (None,) * 3


def test_core_never_imports_flask():
    code = (
        "import sys, flask_gateway.core, flask_gateway.core.client, flask_gateway.core.wire, "
        "flask_gateway.signing\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('flask', 'flask_sqlalchemy', 'flask_wtf'))\n"
        "print(','.join(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == ""


def test_money_in_answers_must_be_integers_too():
    with pytest.raises(ValidationError):
        CheckoutStatusPayload.model_validate(status_payload(checkoutTotalCents="79800"))
    with pytest.raises(ValidationError):
        CheckoutStatusPayload.model_validate(status_payload(checkoutTotalCents=798.0))
