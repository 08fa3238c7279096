"""The gateway's documented examples, replayed against the emulator and parsed by our clients.

See README.md in this folder. Every test runs in both wire-name sets: ``operator`` (the bytes as the
documentation prints them) and ``spec`` (the same bytes with the spec's neutral words).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import responses
from flask import Flask

from flask_gateway.core import GatewayClient, V1Client
from flask_gateway.core.errors import V1RefundFailedError
from flask_gateway.core.timestamps import format_v1_timestamp
from flask_gateway.core.wire import (
    OPERATOR,
    SPEC,
    WIRE_NAME_SETS,
    CheckoutStatus,
    InstallRequest,
    RefundRequest,
    SettingsUpdateRequest,
    V1CheckoutRequest,
    V1RefundRequest,
    WireNames,
)
from flask_gateway.emulator import checkouts
from flask_gateway.emulator.models import Account, db
from tests.documented.corpus import DOCS_SITE, Exchange, compact, load, names, respell
from tests.emulator.conftest import make_emulator
from tests.emulator.support import Gateway

NAME_SETS = pytest.mark.parametrize("wire", WIRE_NAME_SETS.values(), ids=list(WIRE_NAME_SETS))

#: The examples whose request could be recovered only in part: they are not replayed (FACTS.md).
PARTIAL = {"v2-create", "v2-update"}
#: The documented accounts: "1" (API key "secret", the installation example) and "86" (the newer refund).
ACCOUNTS = {"1": "secret", "86": "secret-86"}
BASE = "https://sandbox-checkout.payjustnow.io"
INSTALL = "https://install.sandbox-checkout.payjustnow.io"
V1_BASE = "https://sandbox.payjustnow.com"
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}\Z")
_FRACTION = re.compile(r"T\d\d:\d\d:\d\d(?:\.(\d+))?Z\Z")


def test_the_corpus_holds_every_documented_example():
    assert names() == [
        "v1-checkout",
        "v1-configuration-all",
        "v1-configuration-amount",
        "v1-configuration-customer",
        "v1-configuration-empty",
        "v1-refund",
        "v1-refund-failed",
        "v1-refund-partial",
        "v2-cancel",
        "v2-create",
        "v2-getstatus",
        "v2-install",
        "v2-refund",
        "v2-refund-without-requestid",
        "v2-settings-update",
        "v2-update",
    ]
    for name in names():
        exchange = load(name)
        assert exchange.source.startswith(DOCS_SITE), name
        assert exchange.partial == (name in PARTIAL), name
        if exchange.request_text is not None and not exchange.partial:
            # The printed text and the parsed body are the same JSON (the e-mail restored in both).
            assert json.loads(exchange.request_text) == exchange.request_body, name


# --- shapes ---------------------------------------------------------------------------------------------


def _kind(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    return type(value).__name__


def _fraction_digits(value: Any) -> int | None:
    match = _FRACTION.search(value) if isinstance(value, str) else None
    return None if match is None else len(match.group(1) or "")


def assert_same_shape(ours: Any, documented: Any, where: str = "body") -> None:
    """The same keys at every level; where both have a value, the same JSON type and, for a v2 timestamp,
    the same number of fractional digits."""
    if isinstance(documented, dict):
        assert isinstance(ours, dict), f"{where}: {ours!r} is not an object"
        assert set(ours) == set(documented), (
            f"{where}: keys {sorted(ours)} != documented {sorted(documented)}"
        )
        for key, value in documented.items():
            assert_same_shape(ours[key], value, f"{where}.{key}")
    elif isinstance(documented, list):
        assert isinstance(ours, list), f"{where}: {ours!r} is not an array"
        for item in ours:
            assert_same_shape(item, documented[0], f"{where}[]")
    elif documented is not None and ours is not None:
        assert _kind(ours) == _kind(documented), f"{where}: {ours!r} is not like {documented!r}"
        digits = _fraction_digits(documented)
        if digits is not None:
            assert _fraction_digits(ours) == digits, f"{where}: {ours!r} is not written like {documented!r}"


# --- the clients ----------------------------------------------------------------------------------------


@pytest.fixture
def rsps() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock() as mock:
        yield mock


def _v2_client(wire: WireNames, account: str = "1", key: str | None = "05bea2b2-a3a0-49c6-99ab-79cd1527ec22"):
    return GatewayClient(
        base_url=BASE,
        install_url=INSTALL,
        merchant_account_id=account,
        signing_key=key,
        sleep=lambda _: None,
        wire_names=wire,
    )


def _v1_client() -> V1Client:
    return V1Client(v1_base_url=V1_BASE, merchant_account_id="1", api_key="secret", sleep=lambda _: None)


def _answer(rsps: responses.RequestsMock, exchange: Exchange, body: Any, status: int = 200) -> None:
    method = exchange.method.upper()
    rsps.add(method, exchange.url, body=compact(body), status=status, content_type="application/json")


def _sent(rsps: responses.RequestsMock) -> Any:
    body = rsps.calls[-1].request.body
    assert isinstance(body, bytes)
    return json.loads(body)


@NAME_SETS
def test_install_and_settings_as_documented(rsps, wire):
    install, settings = load("v2-install"), load("v2-settings-update")
    _answer(rsps, install, respell(install.response_body, wire))
    _answer(rsps, settings, respell(settings.response_body, wire))
    client = _v2_client(wire, key=None)
    key = client.install(InstallRequest.from_wire(install.request_body)).data.secretSigningKey
    assert _sent(rsps) == install.request_body
    assert key.get_secret_value() == "05bea2b2-a3a0-49c6-99ab-79cd1527ec22"
    signed = _v2_client(wire, key=key.get_secret_value())
    answer = signed.update_settings(SettingsUpdateRequest.from_wire(settings.request_body)).data
    assert _sent(rsps) == settings.request_body
    assert rsps.calls[-1].request.headers["X-Merchant-Account-ID"] == "1"
    assert answer.signingKey.get_secret_value() == key.get_secret_value()
    assert (answer.minimumCheckoutAmountCents, answer.maximumCheckoutAmountCents) == (10000, 500000)


@NAME_SETS
def test_cancel_and_getstatus_as_documented(rsps, wire):
    cancel, status = load("v2-cancel"), load("v2-getstatus")
    _answer(rsps, cancel, respell(cancel.response_body, wire))
    _answer(rsps, status, respell(status.response_body, wire))
    client = _v2_client(wire)

    cancelled = client.cancel_checkout(cancel.request_body["checkoutToken"]).data
    assert _sent(rsps) == cancel.request_body
    assert cancelled.checkoutPaymentStatus is CheckoutStatus.CANCELLED_BY_MERCHANT
    assert cancelled.merchantAccountId == "1"
    assert cancelled.cancelledAt == datetime(2023, 3, 17, 9, 45, 4, 793000, tzinfo=UTC)
    echo = cancelled.order_details
    assert echo is not None and echo.orderAmountCents == 360000 and echo.orderItems is not None
    assert echo.orderItems[0].sku == "UGG-BB-PUR-06" and echo.orderItems[0].category is None

    paid = client.get_status(status.request_body["checkoutToken"]).data
    assert _sent(rsps) == status.request_body
    assert paid.checkoutPaymentStatus is CheckoutStatus.PAID
    assert paid.gatewayOrderReference == 8173 and paid.paymentReference == 15468
    assert paid.paidAt == datetime(2023, 3, 20, 13, 7, 51, 363709, tzinfo=UTC)
    assert paid.expiresAt == datetime(2023, 3, 20, 14, 6, 31, tzinfo=UTC)
    assert paid.lastCallbackAttemptStatusMessage == "OK"
    # Written back as the gateway writes it, key for key (what the emulator's getstatus must answer).
    assert paid.to_wire(wire) == respell(status.response_body, wire)


@NAME_SETS
@pytest.mark.parametrize("name", ["v2-refund", "v2-refund-without-requestid"])
def test_refund_as_documented(rsps, wire, name):
    exchange = load(name)
    _answer(rsps, exchange, exchange.response_body)
    account = exchange.request_headers["X-Merchant-Account-ID"]
    answer = _v2_client(wire, account=account).refund(RefundRequest.from_wire(exchange.request_body))
    sent = _sent(rsps)
    if "requestId" not in exchange.request_body:
        # Our client always sends a requestId (generated when the caller has none): refunds retry safely.
        assert UUID.match(sent.pop("requestId"))
    assert sent == exchange.request_body
    assert answer.data.refundedAmountCents == exchange.request_body["refundAmountCents"]
    assert answer.data.refundStatus == "SUCCESS"
    assert answer.data.requestId is None  # the documented answer carries none
    assert answer.data.refundStatusAt is not None and answer.data.refundStatusAt.microsecond > 0


def test_v1_configuration_as_documented(rsps):
    empty, amount, everything = (load(f"v1-configuration-{n}") for n in ("empty", "amount", "all"))
    _answer(rsps, empty, empty.response_body)
    limits = _v1_client().configuration().data
    assert _sent(rsps) == {}
    assert (limits.minimum_amount, limits.maximum_amount, limits.payment_plan) == (10000, 100000, None)

    rsps.replace(
        "POST", everything.url, body=compact(everything.response_body), content_type="application/json"
    )
    answer = _v1_client().configuration(amount=200000, customer_email="customer@payjustnow.co.za").data
    assert _sent(rsps) == everything.request_body
    assert (answer.minimum_amount, answer.maximum_amount) == (10000, 100000)  # printed as text there
    # The page prints the plan's members as empty strings: parsed, and known to say nothing.
    assert answer.payment_plan is not None and answer.payment_plan.amount is None

    rsps.replace("POST", amount.url, body=compact(amount.response_body), content_type="application/json")
    plan_only = _v1_client().configuration(amount=200000).data
    assert plan_only.minimum_amount is None and plan_only.payment_plan is not None


def test_v1_checkout_request_as_documented(rsps):
    exchange = load("v1-checkout")
    # The page prints no answer: the spec's form (``data`` with token, expires_at, redirect_to).
    token = "683b38b558628acbb4aa137d4cfdd337"
    answer = {
        "data": {
            "token": token,
            "expires_at": "2022-04-13 15:36:00",
            "redirect_to": f"{V1_BASE}/api/v1/app/checkout/{token}",
        }
    }
    _answer(rsps, exchange, answer)
    data = _v1_client().checkout(V1CheckoutRequest.from_wire(exchange.request_body)).data
    assert _sent(rsps) == exchange.request_body  # postal_code 1611 stays a number, items keyed "1", "2"
    assert data.token == token


@pytest.mark.parametrize("name", ["v1-refund", "v1-refund-partial"])
def test_v1_refund_as_documented(rsps, name):
    exchange = load(name)
    _answer(rsps, exchange, load("v1-refund").response_body)
    answer = _v1_client().refund(V1RefundRequest.from_wire(exchange.request_body)).data
    assert _sent(rsps) == exchange.request_body
    assert (answer.status, answer.amount_refunded) == ("REFUNDED", 50000)
    assert answer.refunded_at == datetime(2022, 2, 8, 9, 3, 56, 292949, tzinfo=UTC)


@pytest.mark.parametrize("status", [400, 200], ids=["as HTTP 400", "as HTTP 200"])
def test_v1_refund_refusal_as_documented(rsps, status):
    """The page prints no HTTP status for the refusal: either way it is a refusal with its message."""
    exchange = load("v1-refund-failed")
    _answer(rsps, exchange, exchange.response_body, status)
    with pytest.raises(V1RefundFailedError) as refused:
        _v1_client().refund(V1RefundRequest.from_wire(load("v1-refund").request_body))
    assert refused.value.message == "Amount is greater than available amount refundable."


# --- the emulator ---------------------------------------------------------------------------------------


class Replay:
    """An emulator with the documented accounts, installed with the documented installation request."""

    def __init__(self, folder: Path, wire: WireNames) -> None:
        self.wire = wire
        self.app: Flask = make_emulator(
            f"sqlite:///{folder / 'emulator.sqlite3'}", accounts=ACCOUNTS, wire_names=wire
        )
        self.gateway = Gateway(self.app.test_client())
        install = load("v2-install")
        response = self.gateway.client.post(
            "/install/v2", data=install.request_bytes(wire), headers={"Content-Type": "application/json"}
        )
        assert response.status_code == install.response_status, response.get_data(as_text=True)
        self.install_answer = response.json
        self.gateway.keys["1"] = str(response.json["secretSigningKey"])
        self.gateway.install("86", ACCOUNTS["86"], minimum=100, maximum=10**9)

    def send(self, exchange: Exchange, account: str = "1", **replace: str) -> Any:
        """The documented request, as printed, signed as the documentation signs it."""
        raw = exchange.request_bytes(self.wire, **replace)
        if exchange.operation.startswith("v1."):
            return self.gateway.client.post(
                exchange.path,
                data=raw,
                headers={"Content-Type": "application/json"},
                auth=(account, ACCOUNTS[account]),
            )
        return self.gateway.signed(exchange.path, None, account=account, raw=raw, method=exchange.method)

    def paid_checkout(self, total: int, account: str = "1") -> str:
        """A v2 checkout of ``total`` cents, paid by the consumer (its callback not delivered)."""
        item = {"name": "UGG Boots Purple Size 6", "sku": "UGG-BB-PUR-06", "quantity": 1, "priceCents": total}
        body = {
            self.wire.order_details: {
                "merchantOrderReference": f"ref-{uuid.uuid4().hex[:8]}",
                "orderAmountCents": total,
                "orderItems": [item],
                "confirmRedirectUrl": "https://storefront.com/order/3dje30",
                "cancelRedirectUrl": "https://storefront.com/order/3dje30",
            },
            "checkoutTotalCents": total,
        }
        token = str(self.gateway.create(body, account=account)["checkoutToken"])
        assert self.gateway.pay(token).status_code == 200
        return token

    def paid_v1_order(self, reference: str, amount: int) -> str:
        body = json.loads(load("v1-checkout").request_bytes())
        later = self.app.test_client().get("/_emulator/clock").json["now"]
        expires = datetime.fromisoformat(later.replace("Z", "+00:00")) + timedelta(hours=1)
        body["order"].update(
            amount=amount, merchant_reference=reference, expires_at=format_v1_timestamp(expires)
        )
        response = self.gateway.client.post("/api/v1/merchant/checkout", json=body, auth=("1", ACCOUNTS["1"]))
        assert response.status_code == 200, response.get_data(as_text=True)
        token = str(response.json["data"]["token"])
        with self.app.app_context():  # paid directly: the consumer's page would call the shop's URL
            checkout = checkouts.lock(None, token)
            account = db.session.get(Account, checkout.account_id)
            assert account is not None
            checkouts.pay(checkout, account)
            db.session.commit()
        return token


@pytest.fixture(params=list(WIRE_NAME_SETS.values()), ids=list(WIRE_NAME_SETS))
def replay(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Replay]:
    replay = Replay(tmp_path, request.param)
    yield replay
    with replay.app.app_context():
        db.engine.dispose()


def test_emulator_installs_as_documented(replay):
    documented = load("v2-install").response_body
    assert_same_shape(replay.install_answer, documented)
    assert UUID.match(replay.install_answer["secretSigningKey"])  # a UUID, like the documented key
    again = replay.send(load("v2-install"))
    assert again.status_code == 403  # "You can only execute this API successfully once."


def test_emulator_updates_settings_as_documented(replay):
    exchange = load("v2-settings-update")
    response = replay.send(exchange)
    assert response.status_code == exchange.response_status, response.get_data(as_text=True)
    assert_same_shape(response.json, exchange.response_body)
    assert response.json["signingKey"] == replay.install_answer["secretSigningKey"]
    # What was sent is what is set (the documented answer shows the installation's 10000: FACTS.md §9).
    assert response.json["minimumCheckoutAmountCents"] == 20000


def test_emulator_answers_getstatus_as_documented(replay):
    exchange = load("v2-getstatus")
    documented_token = exchange.request_body["checkoutToken"]
    token = replay.paid_checkout(300000)
    refund = {"checkoutToken": token, "merchantRefundReference": "r", "refundAmountCents": 1}
    assert replay.gateway.signed("/v2/refund", refund, account="1").status_code == 200
    # Refused (409): cancelledAt stays null, as it does for every paid checkout.
    assert replay.gateway.signed("/v2/cancel", {"checkoutToken": token}, account="1").status_code == 409
    response = replay.send(exchange, **{documented_token: token})
    assert response.status_code == exchange.response_status, response.get_data(as_text=True)
    documented = respell(exchange.response_body, replay.wire)
    assert list(response.json) == list(documented)  # the 16 keys, in the documented order
    assert_same_shape(response.json, documented)
    assert response.json["checkoutTotalCents"] == 300000
    assert response.json["checkoutPaymentStatus"] == "PARTIALLY_REFUNDED"


def test_emulator_cancels_as_documented(replay):
    exchange = load("v2-cancel")
    documented_token = exchange.request_body["checkoutToken"]
    item = {
        "quantity": 3,
        "searchTerms": ["ugg", "boots", "purple"],
        "imageUrl": "https://merchantstore.com/uggboots/purp6.jpeg",
        "name": "UGG Boots Purple Size 6",
        "priceCents": 120000,
        "pageUrl": "https://merchantstore.com/uggboots",
        "sku": "UGG-BB-PUR-06",
    }
    body = {
        "requestId": str(uuid.uuid4()),
        replay.wire.order_details: {
            "merchantOrderReference": "A26615830",
            "confirmRedirectUrl": "https://storefront.com/order/3dje30",
            "cancelRedirectUrl": "https://storefront.com/order/3dje30",
            "orderAmountCents": 360000,
            "orderItems": [item],
        },
        "checkoutTotalCents": 240000,  # as documented: the gateway does not check it against the order
    }
    token = str(replay.gateway.create(body, account="1")["checkoutToken"])
    response = replay.send(exchange, **{documented_token: token})
    assert response.status_code == exchange.response_status, response.get_data(as_text=True)
    assert_same_shape(response.json, respell(exchange.response_body, replay.wire))
    assert response.json["checkoutPaymentStatus"] == "CANCELLED_BY_MERCHANT"
    assert response.json["merchantAccountId"] == "1"
    assert response.json["paymentUrl"].endswith(f"/api/v2/app/checkout/{token}")


@pytest.mark.parametrize("name", ["v2-refund", "v2-refund-without-requestid"])
def test_emulator_refunds_as_documented(replay, name):
    exchange = load(name)
    account = exchange.request_headers["X-Merchant-Account-ID"]
    token = replay.paid_checkout(300000, account=account)
    replace = {exchange.request_body["checkoutToken"]: token}
    response = replay.send(exchange, account=account, **replace)
    assert response.status_code == exchange.response_status, response.get_data(as_text=True)
    documented = exchange.response_body
    if "requestId" in exchange.request_body:  # echoed, as the spec's common fields say (docs/decisions.md)
        assert response.json["requestId"] == exchange.request_body["requestId"]
        documented = {"requestId": exchange.request_body["requestId"], **documented}
    assert_same_shape(response.json, documented)
    assert response.json["refundedAmountCents"] == exchange.request_body["refundAmountCents"]
    assert response.json["refundStatus"] == "SUCCESS"
    again = replay.send(exchange, account=account, **replace)
    if "requestId" in exchange.request_body:  # the same requestId: the stored answer, marked as a replay
        assert (again.status_code, again.json) == (200, response.json)
        assert again.headers["idempotent-replay"] == "true"
    else:  # no requestId, no idempotency: a second refund
        assert again.status_code == 200 and "idempotent-replay" not in again.headers
    paid = replay.gateway.status(token, account=account)
    assert paid["checkoutPaymentStatus"] == "PARTIALLY_REFUNDED"


@pytest.mark.parametrize(
    ("name", "body"),
    [
        ("v1-configuration-empty", b""),
        ("v1-configuration-empty", b"{}"),
        ("v1-configuration-amount", None),
        ("v1-configuration-all", None),
    ],
)
def test_emulator_answers_v1_configuration_as_documented(replay, name, body):
    exchange = load(name)
    if body is None:  # the amount variant prints no request: the page says "sending the amount parameter"
        body = exchange.request_bytes() if exchange.request_text else b'{"amount": 200000}'
    response = replay.gateway.client.post(
        exchange.path, data=body, headers={"Content-Type": "application/json"}, auth=("1", ACCOUNTS["1"])
    )
    assert response.status_code == 200, response.get_data(as_text=True)
    documented = exchange.response_body
    assert set(response.json["data"]) == set(documented["data"])
    if "payment_plan" in documented["data"]:
        assert set(response.json["data"]["payment_plan"]) == set(documented["data"]["payment_plan"])


def test_emulator_takes_the_documented_v1_checkout(replay):
    exchange = load("v1-checkout")
    # The documented expiry (2022) has passed: a later one, in the documented format.
    later = format_v1_timestamp(datetime.now(UTC) + timedelta(hours=2))
    response = replay.send(exchange, **{"2022-04-13 15:36:00": later})
    assert response.status_code == 200, response.get_data(as_text=True)
    data = response.json["data"]
    assert set(data) == {"token", "expires_at", "redirect_to"}
    assert re.fullmatch(r"[0-9a-f]{32}", data["token"])  # like the documented v1 token
    assert data["expires_at"] == later


def test_emulator_refunds_v1_as_documented(replay):
    full, partial, refused = load("v1-refund"), load("v1-refund-partial"), load("v1-refund-failed")
    documented_token = full.request_body["token"]
    token = replay.paid_v1_order("4456", 50000)
    response = replay.send(full, **{documented_token: token})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert_same_shape(response.json, full.response_body)
    assert response.json["status"] == "REFUNDED" and response.json["amount_refunded"] == 50000
    assert response.json["reason"] == full.response_body["reason"]
    assert re.fullmatch(r"\S+T\S+\.\d{6}Z", response.json["refunded_at"])
    # "If refund has already been issued and another request is sent for the same order": refused.
    again = replay.send(full, **{documented_token: token})
    assert again.status_code == 400
    assert_same_shape(again.json, refused.response_body)
    assert again.json["reason"]["errors"]["message"].startswith(
        refused.response_body["reason"]["errors"]["message"]
    )

    other = replay.paid_v1_order("4456", 50000)
    response = replay.send(partial, **{documented_token: other})
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.json["amount_refunded"] == 10000


def test_spec_named_requests_are_answered_in_the_emulators_names(replay):
    """Either spelling in, the emulator's own out: a spec-named cancel to an operator emulator and back."""
    other = OPERATOR if replay.wire is SPEC else SPEC
    token = replay.paid_checkout(50000)
    raw = load("v2-getstatus").request_bytes(other, **{"v2.1.5d44cf8d-0357-4ec1-b541-f32164962435": token})
    answer = replay.gateway.signed("/v2/getstatus", None, account="1", raw=raw).json
    assert replay.wire.order_reference in answer and other.order_reference not in answer
