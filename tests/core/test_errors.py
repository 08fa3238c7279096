"""Error mapping, messages, retryable flags, secrets kept out of errors and logs, bad success answers."""

from __future__ import annotations

import logging

import pytest
import responses
from pydantic import SecretStr

from flask_gateway.core.client import GatewayClient
from flask_gateway.core.errors import (
    AlreadyInstalledError,
    AuthenticationError,
    CheckoutExpiredError,
    ConflictError,
    FirewallRejectedError,
    ForbiddenError,
    GatewayConnectionError,
    GatewayError,
    GatewayServerError,
    GatewayTimeoutError,
    IdempotencyError,
    InvalidRequestError,
    InvalidResponseError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    error_for_status,
)
from flask_gateway.core.wire import InstallRequest

BASE = "https://gateway.test"
ACCOUNT = "merchant-1"
KEY = "signing-key-0123"
TOKEN = "v2.merchant-1.6f1c5a0e-2d59-4a51-9a41-0f4b7e9d3c11"
SECRET = "sk-SECRET-123"


@pytest.fixture
def rsps():
    with responses.RequestsMock(assert_all_requests_are_fired=True) as mock:
        yield mock


@pytest.fixture
def client() -> GatewayClient:
    return GatewayClient(
        base_url=BASE, merchant_account_id=ACCOUNT, signing_key=KEY, max_retries=0, sleep=lambda _: None
    )


# --- error_for_status ----------------------------------------------------------------------------


def test_400_is_invalid_request_with_field_errors():
    body = {
        "message": "Invalid request",
        "errors": [
            {"field": "service.orderItems[0].priceCents", "message": "must be an integer"},
            {"field": "checkoutTotalCents", "message": "required"},
            "junk",
        ],
    }
    error = error_for_status(400, body, {}, operation="create")
    assert type(error) is InvalidRequestError
    assert error.http_status == 400
    assert error.message == "Invalid request"
    assert error.field_errors == [
        {"field": "service.orderItems[0].priceCents", "message": "must be an integer"},
        {"field": "checkoutTotalCents", "message": "required"},
    ]
    text = str(error)
    assert "400" in text
    assert "Invalid request" in text
    assert "service.orderItems[0].priceCents: must be an integer" in text
    assert not error.retryable


def test_401_is_authentication_error_with_expected_signature():
    body = {
        "message": "Invalid signature",
        "expectedSignature": "60brkjy0NWMql+ljwLE5pq4c+eXbzD8C+uMyzgcoIcA=",
    }
    error = error_for_status(401, body, {}, operation="create")
    assert type(error) is AuthenticationError
    assert error.expected_signature == "60brkjy0NWMql+ljwLE5pq4c+eXbzD8C+uMyzgcoIcA="
    assert not error.retryable


def test_401_outside_sandbox_has_no_expected_signature():
    error = error_for_status(401, {"message": "Unauthorized"}, {})
    assert isinstance(error, AuthenticationError)
    assert error.expected_signature is None
    error = error_for_status(401, None, {})
    assert isinstance(error, AuthenticationError)
    assert error.expected_signature is None


@pytest.mark.parametrize(
    ("body", "operation", "expected"),
    [
        ({"message": "Forbidden"}, "create", FirewallRejectedError),
        ({"message": "Forbidden"}, "install", FirewallRejectedError),
        (None, "update", FirewallRejectedError),
        ({"message": "Account already installed"}, "install", AlreadyInstalledError),
        ({"message": "Checkout expired"}, "update", CheckoutExpiredError),
        ({"message": "Not allowed"}, "refund", ForbiddenError),
    ],
)
def test_403_kinds(body, operation, expected):
    error = error_for_status(403, body, {}, operation=operation)
    assert type(error) is expected
    assert isinstance(error, ForbiddenError)
    assert error.http_status == 403
    assert not error.retryable


def test_403_non_json_answer_through_client_is_firewall(rsps, client):
    rsps.add("POST", f"{BASE}/v2/cancel", status=403, body="<html><body>Request blocked</body></html>")
    with pytest.raises(FirewallRejectedError) as caught:
        client.cancel_checkout(TOKEN)
    assert caught.value.body is None
    assert caught.value.operation == "cancel"
    assert "403" in str(caught.value)


def test_403_json_answer_on_cancel_is_plain_forbidden(rsps, client):
    rsps.add("POST", f"{BASE}/v2/cancel", status=403, json={"message": "nope"})
    with pytest.raises(ForbiddenError) as caught:
        client.cancel_checkout(TOKEN)
    assert type(caught.value) is ForbiddenError
    assert caught.value.body == {"message": "nope"}


@pytest.mark.parametrize(
    ("status", "expected", "retryable"),
    [
        (404, NotFoundError, False),
        (409, ConflictError, False),
        (413, PayloadTooLargeError, False),
        (422, IdempotencyError, False),
        (429, RateLimitError, True),
        (500, GatewayServerError, True),
        (502, GatewayServerError, True),
        (503, GatewayServerError, True),
        (504, GatewayServerError, True),
        (418, GatewayError, False),
    ],
)
def test_status_mapping(status, expected, retryable):
    error = error_for_status(status, {"message": f"gateway says {status}"}, {}, operation="refund")
    assert type(error) is expected
    assert error.retryable is retryable
    assert error.message == f"gateway says {status}"
    assert str(error) == f"refund: HTTP {status} gateway says {status}"
    assert repr(error) == f"{expected.__name__}(http_status={status}, message='gateway says {status}')"


def test_payload_too_large_is_an_invalid_request():
    assert isinstance(error_for_status(413, None, {}), InvalidRequestError)


def test_message_falls_back_to_status_without_json():
    error = error_for_status(502, None, {"Content-Type": "text/html"})
    assert error.message == "the gateway answered HTTP 502"
    assert error.body is None
    assert "502" in str(error)


@pytest.mark.parametrize(
    ("header", "seconds"), [("Retry-After", "7"), ("retry-after", "3.5"), ("Retry-After", "")]
)
def test_429_retry_after(header, seconds):
    error = error_for_status(429, {"message": "slow down"}, {header: seconds})
    assert isinstance(error, RateLimitError)
    assert error.retry_after == (float(seconds) if seconds else None)


def test_429_without_retry_after():
    error = error_for_status(429, {"message": "slow down"}, {})
    assert isinstance(error, RateLimitError)
    assert error.retry_after is None


def test_connection_errors_are_retryable():
    assert GatewayConnectionError().retryable
    assert GatewayTimeoutError().retryable
    assert isinstance(GatewayTimeoutError(), GatewayConnectionError)
    assert str(GatewayConnectionError(operation="cancel")) == "cancel: could not reach the gateway"


# --- secrets -------------------------------------------------------------------------------------


def install_request() -> InstallRequest:
    return InstallRequest(
        merchantAccountId=ACCOUNT,
        merchantAccountApiKey=SecretStr(SECRET),
        checkoutStatusCallbackUrl="https://shop.example/gateway/callback",
        minimumCheckoutAmountCents=1000,
        maximumCheckoutAmountCents=500000,
    )


@pytest.mark.parametrize(
    ("status", "answer", "error_type"),
    [
        (
            400,
            {"message": "Invalid request", "errors": [{"field": "merchantAccountId", "message": "unknown"}]},
            None,
        ),
        (401, {"message": "Invalid merchant account API key"}, AuthenticationError),
        (500, {"message": "Internal error"}, GatewayServerError),
    ],
)
def test_install_errors_and_logs_never_hold_the_api_key(rsps, caplog, status, answer, error_type):
    caplog.set_level(logging.DEBUG, logger="flask_gateway")
    client = GatewayClient(base_url=BASE, merchant_account_id=ACCOUNT, max_retries=1, sleep=lambda _: None)
    # install is not idempotent, so a 500 is not retried; register it once.
    rsps.add("POST", f"{BASE}/install/v2", json=answer, status=status)

    with pytest.raises(GatewayError) as caught:
        client.install(install_request())

    # The key did go out (the gateway needs it) ...
    assert SECRET.encode() in rsps.calls[0].request.body
    error = caught.value
    if error_type is not None:
        assert isinstance(error, error_type)
    assert error.http_status == status
    # ... but the error and the logs never carry it.
    assert SECRET not in str(error)
    assert SECRET not in repr(error)
    assert SECRET not in repr(error.body)
    assert SECRET not in repr(error.headers)
    assert SECRET not in repr(error.args)
    assert caplog.records, "the attempt should be logged"
    for record in caplog.records:
        assert SECRET not in record.getMessage()
        assert SECRET not in repr(record.args)


def test_install_request_repr_masks_the_api_key():
    request = install_request()
    assert SECRET not in repr(request)
    assert SECRET not in str(request)
    assert SECRET in request.to_json().decode()


def test_install_response_repr_masks_the_signing_key(rsps):
    client = GatewayClient(base_url=BASE, merchant_account_id=ACCOUNT)
    rsps.add("POST", f"{BASE}/install/v2", json={"secretSigningKey": "very-secret-signing-key"})

    answer = client.install(install_request())

    assert answer.data.secretSigningKey.get_secret_value() == "very-secret-signing-key"
    assert "very-secret-signing-key" not in repr(answer.data)
    assert "very-secret-signing-key" not in str(answer.data)
    assert "very-secret-signing-key" not in repr(answer)


# --- success answers that do not match the API ---------------------------------------------------


def test_success_without_json_is_invalid_response(rsps, client):
    rsps.add("POST", f"{BASE}/v2/getstatus", body="<html>OK</html>", status=200)
    with pytest.raises(InvalidResponseError) as caught:
        client.get_status(TOKEN)
    assert caught.value.http_status == 200
    assert "JSON" in caught.value.message


def test_success_with_json_array_is_invalid_response(rsps, client):
    rsps.add("POST", f"{BASE}/v2/getstatus", json=[1, 2], status=200)
    with pytest.raises(InvalidResponseError):
        client.get_status(TOKEN)


@pytest.mark.parametrize(
    ("answer", "location", "value"),
    [
        (
            {"checkoutToken": TOKEN, "checkoutTotalCents": "lots-of-money", "checkoutPaymentStatus": "PAID"},
            "checkoutTotalCents",
            "lots-of-money",
        ),
        (
            {
                "checkoutToken": TOKEN,
                "checkoutTotalCents": 1,
                "checkoutPaymentStatus": "PAID",
                "paidAt": "yesterday-ish",
            },
            "paidAt",
            "yesterday-ish",
        ),
        ({"checkoutTotalCents": 1, "checkoutPaymentStatus": "PAID"}, "checkoutToken", None),
    ],
)
def test_wrongly_shaped_success_names_field_not_value(rsps, client, answer, location, value):
    rsps.add("POST", f"{BASE}/v2/getstatus", json=answer, status=200)
    with pytest.raises(InvalidResponseError) as caught:
        client.get_status(TOKEN)
    message = caught.value.message
    assert location in message
    assert location in str(caught.value)
    if value is not None:
        assert value not in message
        assert value not in str(caught.value)
    assert caught.value.__cause__ is None


def test_install_response_with_wrong_key_type_does_not_echo_it(rsps):
    client = GatewayClient(base_url=BASE, merchant_account_id=ACCOUNT)
    rsps.add("POST", f"{BASE}/install/v2", json={"secretSigningKey": 918273645})
    with pytest.raises(InvalidResponseError) as caught:
        client.install(install_request())
    assert "secretSigningKey" in str(caught.value)
    assert "918273645" not in str(caught.value)
    assert "918273645" not in repr(caught.value)
