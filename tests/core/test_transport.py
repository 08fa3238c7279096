"""Transport: retries, backoff, Retry-After, retry modes, timeouts."""

from __future__ import annotations

import json
import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
import requests
import responses
from responses import matchers
from responses.registries import OrderedRegistry

from flask_gateway.core import retry_after
from flask_gateway.core.client import GatewayClient
from flask_gateway.core.errors import (
    AuthenticationError,
    ConflictError,
    GatewayConnectionError,
    GatewayServerError,
    GatewayTimeoutError,
    IdempotencyError,
    InvalidRequestError,
    RateLimitError,
)
from flask_gateway.core.http import RetryPolicy, Transport
from flask_gateway.core.wire import CreateCheckoutRequest, CreateOrderDetails, OrderItem, RefundRequest
from tests.processes import free_port

BASE = "https://gateway.test"
ACCOUNT = "merchant-1"
KEY = "signing-key-0123"
TOKEN = "v2.merchant-1.6f1c5a0e-2d59-4a51-9a41-0f4b7e9d3c11"
CREATE = f"{BASE}/v2/create"
CANCEL = f"{BASE}/v2/cancel"
REFUND = f"{BASE}/v2/refund"

CHECKOUT = {
    "checkoutToken": TOKEN,
    "checkoutTotalCents": 3000,
    "paymentUrl": f"{BASE}/api/v2/app/checkout/{TOKEN}",
    "checkoutPaymentStatus": "PENDING_ORDER",
}
CANCELLED = {**CHECKOUT, "checkoutPaymentStatus": "CANCELLED_BY_MERCHANT"}


@pytest.fixture
def rsps():
    with responses.RequestsMock(assert_all_requests_are_fired=True, registry=OrderedRegistry) as mock:
        yield mock


@pytest.fixture
def sleeps() -> list[float]:
    return []


@pytest.fixture
def client(sleeps: list[float]) -> GatewayClient:
    return GatewayClient(base_url=BASE, merchant_account_id=ACCOUNT, signing_key=KEY, sleep=sleeps.append)


def create_request(request_id: str | None = None) -> CreateCheckoutRequest:
    item = OrderItem(
        name="Mug",
        sku="MUG-1",
        quantity=1,
        priceCents=3000,
        imageUrl="https://shop.example/mug.png",
        pageUrl="https://shop.example/mug",
        searchTerms=[],
    )
    service = CreateOrderDetails(
        merchantOrderReference="order-7",
        orderAmountCents=3000,
        orderItems=[item],
        confirmRedirectUrl="https://shop.example/ok",
        cancelRedirectUrl="https://shop.example/cancel",
    )
    return CreateCheckoutRequest(requestId=request_id, order_details=service, checkoutTotalCents=3000)


def bodies(rsps: responses.RequestsMock) -> list[bytes]:
    sent = []
    for call in rsps.calls:
        assert isinstance(call.request.body, bytes)
        sent.append(call.request.body)
    return sent


def request_ids(rsps: responses.RequestsMock) -> list[str]:
    return [json.loads(body)["requestId"] for body in bodies(rsps)]


# --- retries that succeed -----------------------------------------------------------------------


def test_503_then_200_succeeds_on_second_attempt(rsps, client, sleeps):
    rsps.add("POST", CREATE, json={"message": "unavailable"}, status=503)
    rsps.add("POST", CREATE, json=CHECKOUT)

    answer = client.create_checkout(create_request())

    assert answer.attempts == 2
    assert len(rsps.calls) == 2
    assert len(sleeps) == 1
    # Every attempt carries the same generated requestId, the one reported back.
    ids = request_ids(rsps)
    assert ids[0] == ids[1] == answer.request_id
    assert bodies(rsps)[0] == bodies(rsps)[1]
    signatures = [call.request.headers["X-Signature"] for call in rsps.calls]
    assert signatures[0] == signatures[1]


def test_read_timeout_then_success_retries_create_with_same_request_id(rsps, client, sleeps):
    rsps.add("POST", CREATE, body=requests.exceptions.ReadTimeout("slow"))
    rsps.add("POST", CREATE, json={"message": "boom"}, status=500)
    rsps.add("POST", CREATE, json=CHECKOUT)

    answer = client.create_checkout(create_request())

    assert answer.attempts == 3
    assert len(sleeps) == 2
    assert len(set(request_ids(rsps))) == 1
    assert request_ids(rsps)[0] == answer.request_id


def test_refund_retries_with_callers_request_id(rsps, client):
    rsps.add("POST", REFUND, status=502, body="Bad Gateway")
    rsps.add(
        "POST", REFUND, json={"requestId": "mine-1", "refundedAmountCents": 5, "refundStatus": "SUCCESS"}
    )
    request = RefundRequest(
        requestId="mine-1", checkoutToken=TOKEN, merchantRefundReference="r", refundAmountCents=5
    )

    answer = client.refund(request)

    assert request_ids(rsps) == ["mine-1", "mine-1"]
    assert answer.request_id == "mine-1"
    assert answer.attempts == 2


def test_refund_generated_request_id_is_the_same_on_every_retry(rsps, client):
    rsps.add("POST", REFUND, body=requests.exceptions.ReadTimeout("slow"))
    rsps.add("POST", REFUND, status=503)
    rsps.add("POST", REFUND, json={"refundedAmountCents": 5, "refundStatus": "SUCCESS"})
    request = RefundRequest(checkoutToken=TOKEN, merchantRefundReference="r", refundAmountCents=5)

    answer = client.refund(request)

    ids = request_ids(rsps)
    assert len(ids) == 3
    assert len(set(ids)) == 1
    assert ids[0] == answer.request_id


# --- errors that are never retried --------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "error"),
    [(400, InvalidRequestError), (401, AuthenticationError), (409, ConflictError), (422, IdempotencyError)],
)
def test_client_errors_are_not_retried(rsps, client, sleeps, status, error):
    rsps.add("POST", CREATE, json={"message": "no"}, status=status)

    with pytest.raises(error):
        client.create_checkout(create_request())

    assert len(rsps.calls) == 1
    assert sleeps == []


# --- Retry-After ---------------------------------------------------------------------------------


def test_429_retry_after_seconds_is_slept_exactly(rsps, client, sleeps):
    rsps.add("POST", CREATE, json={"message": "slow down"}, status=429, headers={"Retry-After": "7"})
    rsps.add("POST", CREATE, json=CHECKOUT)

    assert client.create_checkout(create_request()).attempts == 2
    assert sleeps == [7.0]


def test_429_retry_after_http_date(rsps, client, sleeps, monkeypatch):
    now = datetime(2024, 5, 1, 10, 0, 0, tzinfo=UTC)
    monkeypatch.setattr(retry_after, "utcnow", lambda: now)
    when = format_datetime(now + timedelta(seconds=12), usegmt=True)
    rsps.add("POST", CREATE, json={"message": "slow down"}, status=429, headers={"Retry-After": when})
    rsps.add("POST", CREATE, json=CHECKOUT)

    client.create_checkout(create_request())

    assert sleeps == [12.0]


def test_retry_after_beyond_maximum_stops_retrying(rsps, sleeps):
    client = GatewayClient(
        base_url=BASE,
        merchant_account_id=ACCOUNT,
        signing_key=KEY,
        transport=Transport(retry=RetryPolicy(max_retries=3, retry_after_max=30.0), sleep=sleeps.append),
    )
    rsps.add("POST", CREATE, json={"message": "slow down"}, status=429, headers={"Retry-After": "31"})

    with pytest.raises(RateLimitError) as caught:
        client.create_checkout(create_request())

    assert caught.value.retry_after == 31.0
    assert len(rsps.calls) == 1
    assert sleeps == []


def test_503_retry_after_is_honoured(rsps, client, sleeps):
    rsps.add("POST", CREATE, status=503, headers={"Retry-After": "2"})
    rsps.add("POST", CREATE, json=CHECKOUT)
    client.create_checkout(create_request())
    assert sleeps == [2.0]


# --- exhaustion ----------------------------------------------------------------------------------


@pytest.mark.parametrize("max_retries", [0, 1, 3])
def test_max_retries_exhausted_raises_server_error(rsps, sleeps, max_retries):
    client = GatewayClient(
        base_url=BASE,
        merchant_account_id=ACCOUNT,
        signing_key=KEY,
        max_retries=max_retries,
        sleep=sleeps.append,
    )
    for _ in range(max_retries + 1):
        rsps.add("POST", CREATE, json={"message": "down"}, status=503)

    with pytest.raises(GatewayServerError) as caught:
        client.create_checkout(create_request())

    assert caught.value.http_status == 503
    assert len(rsps.calls) == max_retries + 1
    assert len(sleeps) == max_retries


def test_timeouts_exhausted_raise_timeout_error(rsps, client, sleeps):
    for _ in range(3):
        rsps.add("POST", CREATE, body=requests.exceptions.ReadTimeout("slow"))

    with pytest.raises(GatewayTimeoutError):
        client.create_checkout(create_request())

    assert len(rsps.calls) == 3


# --- UNSAFE operations (cancel) ------------------------------------------------------------------


def test_cancel_not_retried_after_read_timeout(rsps, client, sleeps):
    rsps.add("POST", CANCEL, body=requests.exceptions.ReadTimeout("slow"))

    with pytest.raises(GatewayTimeoutError):
        client.cancel_checkout(TOKEN)

    assert len(rsps.calls) == 1
    assert sleeps == []


def test_cancel_not_retried_after_503(rsps, client, sleeps):
    rsps.add("POST", CANCEL, json={"message": "down"}, status=503)

    with pytest.raises(GatewayServerError):
        client.cancel_checkout(TOKEN)

    assert len(rsps.calls) == 1
    assert sleeps == []


def test_cancel_retried_after_429(rsps, client, sleeps):
    rsps.add("POST", CANCEL, json={"message": "slow down"}, status=429, headers={"Retry-After": "1"})
    rsps.add("POST", CANCEL, json=CANCELLED)

    answer = client.cancel_checkout(TOKEN)

    assert answer.attempts == 2
    assert sleeps == [1.0]


def test_cancel_retried_after_connect_timeout(rsps, client, sleeps):
    rsps.add("POST", CANCEL, body=requests.exceptions.ConnectTimeout("no connection"))
    rsps.add("POST", CANCEL, json=CANCELLED)
    assert client.cancel_checkout(TOKEN).attempts == 2


def test_refused_connection_is_retried_for_unsafe_operation_then_raises():
    sleeps: list[float] = []
    client = GatewayClient(
        base_url=f"http://127.0.0.1:{free_port()}",
        merchant_account_id=ACCOUNT,
        signing_key=KEY,
        timeout=(2.0, 2.0),
        max_retries=2,
        sleep=sleeps.append,
    )

    with pytest.raises(GatewayConnectionError) as caught:
        client.cancel_checkout(TOKEN)

    assert not isinstance(caught.value, GatewayTimeoutError)
    assert caught.value.http_status is None
    # Two retries: the request never reached a server, so repeating it is safe even for cancel.
    assert len(sleeps) == 2


# --- backoff -------------------------------------------------------------------------------------


def test_backoff_is_exponential_with_equal_jitter():
    policy = RetryPolicy(backoff_base=0.5, backoff_max=8.0)
    transport = Transport(retry=policy, rng=random.Random(1234))
    for retry_number in range(1, 10):
        ceiling = min(8.0, 0.5 * 2 ** (retry_number - 1))
        for _ in range(50):
            delay = transport.backoff(retry_number)
            assert ceiling / 2 <= delay <= ceiling
    # Before the cap the ranges do not overlap, so each wait is longer than the one before.
    delays = [transport.backoff(n) for n in range(1, 6)]
    assert delays == sorted(delays)
    assert delays[-1] >= 4.0


def test_backoff_jitter_is_seeded():
    first = Transport(rng=random.Random(7))
    second = Transport(rng=random.Random(7))
    values = [first.backoff(3) for _ in range(20)]
    assert values == [second.backoff(3) for _ in range(20)]
    assert len(set(values)) > 1


def test_backoff_waits_recorded_between_retries(rsps, sleeps):
    client = GatewayClient(
        base_url=BASE,
        merchant_account_id=ACCOUNT,
        signing_key=KEY,
        transport=Transport(retry=RetryPolicy(max_retries=3), sleep=sleeps.append, rng=random.Random(3)),
    )
    for _ in range(3):
        rsps.add("POST", CREATE, status=503)
    rsps.add("POST", CREATE, json=CHECKOUT)

    assert client.create_checkout(create_request()).attempts == 4

    assert len(sleeps) == 3
    for retry_number, delay in enumerate(sleeps, start=1):
        ceiling = 0.5 * 2 ** (retry_number - 1)
        assert ceiling / 2 <= delay <= ceiling


# --- timeouts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("timeout", [None, (None, 5.0), (5.0, None)])
def test_timeout_is_required(timeout):
    with pytest.raises(ValueError, match="timeout"):
        Transport(timeout=timeout)


def test_client_refuses_no_timeout():
    with pytest.raises(ValueError, match="timeout"):
        GatewayClient(base_url=BASE, merchant_account_id=ACCOUNT, timeout=None)  # type: ignore[arg-type]


@pytest.mark.parametrize("timeout", [(5.0, 30.0), 2.5, (1.0, 4.0)])
def test_timeout_is_passed_to_requests(rsps, timeout):
    client = GatewayClient(base_url=BASE, merchant_account_id=ACCOUNT, signing_key=KEY, timeout=timeout)
    rsps.add("POST", CANCEL, json=CANCELLED, match=[matchers.request_kwargs_matcher({"timeout": timeout})])
    client.cancel_checkout(TOKEN)
    assert rsps.calls[0].request.req_kwargs["timeout"] == timeout


def test_default_timeout_is_passed_on_every_attempt(rsps, client):
    for status in (503, 200):
        rsps.add(
            "POST",
            CREATE,
            status=status,
            json=CHECKOUT,
            match=[matchers.request_kwargs_matcher({"timeout": (5.0, 30.0)})],
        )
    client.create_checkout(create_request())
    assert len(rsps.calls) == 2


def test_retry_policy_refuses_negative_retries():
    with pytest.raises(ValueError, match="max_retries"):
        RetryPolicy(max_retries=-1)


class _RecordingSession(requests.Session):
    """Answers every request with 200 ``{}`` and records the settings ``send`` got."""

    def __init__(self) -> None:
        super().__init__()
        self.sent: list[dict[str, object]] = []
        self.merges = 0

    def merge_environment_settings(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        self.merges += 1
        return super().merge_environment_settings(*args, **kwargs)

    def send(self, request, **kwargs):  # type: ignore[no-untyped-def]
        self.sent.append(kwargs)
        response = requests.Response()
        response.status_code = 200
        response._content = b"{}"
        response.request = request
        return response


def test_environment_proxies_are_read_once_per_session_and_origin(monkeypatch):
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy-one.test:3128")
    monkeypatch.delenv("https_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    session = _RecordingSession()
    transport = Transport(session=session)
    for _ in range(3):
        transport.send("POST", f"{BASE}/v2/getstatus", operation="status", body=b"{}")
    assert session.merges == 1
    assert [kwargs["proxies"] for kwargs in session.sent] == [{"https": "http://proxy-one.test:3128"}] * 3
    session.sent[0]["proxies"]["https"] = "mutated"  # type: ignore[index]
    transport.send("POST", "https://other.test/v2/getstatus", operation="status", body=b"{}")
    transport.send("POST", f"{BASE}/v2/getstatus", operation="status", body=b"{}")
    assert session.merges == 2  # a new origin is read; the cached one is a copy, not what requests got
    assert session.sent[-1]["proxies"] == {"https": "http://proxy-one.test:3128"}

    monkeypatch.setenv("HTTPS_PROXY", "http://proxy-two.test:3128")
    fresh = _RecordingSession()
    Transport(session=fresh).send("POST", f"{BASE}/v2/getstatus", operation="status", body=b"{}")
    assert fresh.sent[0]["proxies"] == {"https": "http://proxy-two.test:3128"}
    session.trust_env = False  # a changed session setting is a new entry
    transport.send("POST", f"{BASE}/v2/getstatus", operation="status", body=b"{}")
    assert session.merges == 3
    assert session.sent[-1]["proxies"] == {}
