"""The v2 refund answer echoes the request's ``requestId`` (issue 29, point 3), in both wire-name sets.

The spec's common fields: ``requestId`` is the idempotency key of create and refund, and "Response echoes
it"; a real integration's refund answer type requires it. The documented examples print none (see
docs/decisions.md): a request without one is still answered without one.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests
from flask import Flask

from flask_gateway.core.client import GatewayClient
from flask_gateway.core.wire import RefundRequest, RefundResponse
from flask_gateway.core.wire.names import WIRE_NAME_SETS, WireNames
from flask_gateway.core.wsgi import WSGIAdapter
from flask_gateway.emulator.models import db
from tests.emulator.conftest import make_emulator
from tests.emulator.support import ACCOUNT, Gateway


@pytest.fixture(params=list(WIRE_NAME_SETS.values()), ids=list(WIRE_NAME_SETS))
def names(request: pytest.FixtureRequest) -> WireNames:
    """``EMULATOR_WIRE_NAMES``: the operator's names and the spec's."""
    wire: WireNames = request.param
    return wire


@pytest.fixture
def emulator(names: WireNames, database_url: str) -> Iterator[Flask]:
    app = make_emulator(database_url, wire_names=names)
    yield app
    with app.app_context():
        db.engine.dispose()


@pytest.fixture
def paid(emulator: Flask) -> tuple[Gateway, str]:
    gateway = Gateway(emulator.test_client())
    gateway.install()
    token = str(gateway.create()["checkoutToken"])
    assert gateway.pay(token).status_code == 200
    return gateway, token


def refund(gateway: Gateway, token: str, amount: int, request_id: str | None) -> dict[str, object]:
    body: dict[str, object] = {
        "checkoutToken": token,
        "merchantRefundReference": "rf-29",
        "refundAmountCents": amount,
        "refundDescription": "returned kettle",
    }
    if request_id is not None:
        body = {"requestId": request_id, **body}
    response = gateway.signed("/v2/refund", body)
    assert response.status_code == 200, response.get_data(as_text=True)
    assert isinstance(response.json, dict)
    return response.json


def test_the_refund_answer_echoes_the_request_id(paid: tuple[Gateway, str]) -> None:
    gateway, token = paid
    answer = refund(gateway, token, 30_000, "refund-29-a")
    assert answer["requestId"] == "refund-29-a"
    assert list(answer) == [
        "requestId",
        "refundedAmountCents",
        "refundStatus",
        "refundStatusAt",
        "refundStatusDescription",
    ]
    # The client's model reads it; a replay of the same key answers the same, echo included.
    assert RefundResponse.from_wire(answer).requestId == "refund-29-a"
    again = gateway.signed(
        "/v2/refund",
        {
            "requestId": "refund-29-a",
            "checkoutToken": token,
            "merchantRefundReference": "rf-29",
            "refundAmountCents": 30_000,
            "refundDescription": "returned kettle",
        },
    )
    assert again.headers["idempotent-replay"] == "true"
    assert again.json == answer
    # Each refund echoes its own key.
    assert refund(gateway, token, 1_000, "refund-29-b")["requestId"] == "refund-29-b"


def test_a_refund_sent_without_a_request_id_is_answered_without_one(paid: tuple[Gateway, str]) -> None:
    gateway, token = paid
    answer = refund(gateway, token, 500, None)
    assert "requestId" not in answer  # as the documented example without one (no null either)
    assert answer["refundedAmountCents"] == 500
    assert RefundResponse.from_wire(answer).requestId is None


def test_the_client_reads_the_echoed_request_id_from_the_emulator(
    emulator: Flask, names: WireNames, paid: tuple[Gateway, str]
) -> None:
    """The shop's own client, over the emulator's HTTP interface (in-process), in the emulator's wire names."""
    gateway, token = paid
    session = requests.Session()
    session.mount("http://gateway.test/", WSGIAdapter(emulator))
    client = GatewayClient(
        base_url="http://gateway.test",
        merchant_account_id=ACCOUNT,
        signing_key=gateway.keys[ACCOUNT],
        session=session,
        wire_names=names,
    )
    request = RefundRequest(
        requestId="refund-29-client",
        checkoutToken=token,
        merchantRefundReference="rf-29",
        refundAmountCents=700,
    )
    answer = client.refund(request)
    assert answer.request_id == "refund-29-client"  # what was sent
    assert answer.data.requestId == "refund-29-client"  # what the gateway answered
    assert answer.data.refundedAmountCents == 700
    generated = client.refund(request.model_copy(update={"requestId": None}))
    assert generated.data.requestId == generated.request_id  # the key the client generated, echoed
