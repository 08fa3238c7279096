"""The documented callback body, posted to the extension's callback endpoint as the gateway would post it.

The getstatus page says its answer "is the same payload that is posted back to your server to the
checkoutStatusCallbackUrl". No page shows the callback's headers: it is signed as the documentation signs
(base64 HMAC-SHA256 of the body without whitespace, in ``X-Signature``) and carries no
``X-Merchant-Account-ID`` (docs/decisions.md). Compact and pretty-printed bodies alike, in both wire-name
sets; the shop confirms the claim with getstatus before the payment counts.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask_sqlalchemy import SQLAlchemy

from flask_gateway import create_checkout, signals
from flask_gateway.core.signing import sign
from flask_gateway.core.wire import WIRE_NAME_SETS, WireNames
from flask_gateway.models import CallbackLog, GatewayCheckout
from flask_gateway.payments.installation import InstallSettings, install
from flask_gateway.payments.orders import OrderDraft, OrderLine
from flask_gateway.state import get_state
from flask_gateway.testing import EMULATOR_URL, SHOP_URL, connect
from tests.documented.corpus import compact, load, respell, respell_text
from tests.emulator.conftest import make_emulator
from tests.emulator.support import Gateway as EmulatorDriver
from tests.extension.conftest import make_shop

DOCUMENTED = load("v2-getstatus")
DOCUMENTED_TOKEN = DOCUMENTED.response_body["checkoutToken"]
TOTAL = DOCUMENTED.response_body["checkoutTotalCents"]  # 300000


class Shop:
    """The shop (wire names ``wire``) and the emulator (account "1", as in the documentation)."""

    def __init__(self, folder: Path, wire: WireNames, monkeypatch: pytest.MonkeyPatch) -> None:
        self.wire = wire
        emulator_app = make_emulator(
            f"sqlite:///{folder / 'emulator.sqlite3'}",
            public_url=EMULATOR_URL,
            accounts={"1": "secret"},
            wire_names=wire,
        )
        self.emulator_app = emulator_app
        self.app, self.db, _ = make_shop(f"sqlite:///{folder / 'shop.sqlite3'}", GATEWAY_WIRE_NAMES=wire.key)
        connect(self.app, emulator_app)
        self.emulator = EmulatorDriver(emulator_app.test_client())
        with self.app.app_context():
            install(
                InstallSettings(
                    merchant_account_id="1",
                    api_key="secret",
                    callback_url=f"{SHOP_URL}/gateway/callback",
                    callback_failures_email=None,
                    minimum_cents=10000,
                    maximum_cents=500000,
                )
            )

    def signing_key(self) -> str:
        with self.app.app_context():
            state = get_state()
            return state.box.decrypt(state.require_installation().signing_key_encrypted)

    def paid_checkout(self) -> str:
        """A checkout of the documented total, created by the shop and paid on the gateway (the gateway's
        own callback is not delivered: the documented one stands in for it)."""
        order = OrderDraft(
            reference="yourorderref",
            lines=(OrderLine(name="UGG Boots", sku="UGG-BB-PUR-06", quantity=1, unit_price_cents=TOTAL),),
        )
        with self.app.test_request_context(base_url=SHOP_URL):
            token = create_checkout(order).token
        assert token is not None
        assert self.emulator.pay(token).status_code == 200
        return token

    def post(self, body: bytes) -> Any:
        headers = {"Content-Type": "application/json", "X-Signature": sign(body, self.signing_key())}
        return self.app.test_client().post("/gateway/callback", data=body, headers=headers)

    def checkout(self, token: str) -> GatewayCheckout:
        with self.app.app_context():
            found = get_state().session.query(GatewayCheckout).filter_by(token=token).one()
            get_state().session.expunge(found)
            return found

    def logs(self) -> list[tuple[str, int]]:
        with self.app.app_context():
            rows = get_state().session.query(CallbackLog).order_by(CallbackLog.id).all()
            return [(row.outcome, row.http_status) for row in rows]


@pytest.fixture(params=list(WIRE_NAME_SETS.values()), ids=list(WIRE_NAME_SETS))
def shop(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Shop]:
    built = Shop(tmp_path, request.param, monkeypatch)
    yield built
    for app, db in ((built.app, built.db), (built.emulator_app, None)):
        with app.app_context():
            engine_owner: SQLAlchemy = db or app.extensions["sqlalchemy"]
            engine_owner.engine.dispose()


@pytest.fixture
def confirmed() -> Iterator[list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        seen.append(kwargs)

    signals.payment_confirmed.connect(receiver)
    yield seen
    signals.payment_confirmed.disconnect(receiver)


def test_the_documented_callback_pays_once_compact_or_pretty_printed(shop, confirmed):
    token = shop.paid_checkout()
    assert DOCUMENTED.response_body_text is not None
    pretty = respell_text(DOCUMENTED.response_body_text, shop.wire).replace(DOCUMENTED_TOKEN, token)
    documented = respell(DOCUMENTED.response_body, shop.wire)

    first = shop.post(compact({**documented, "checkoutToken": token}))
    assert first.status_code == 200, first.get_data(as_text=True)
    assert first.json["outcome"] == "accepted"
    assert shop.checkout(token).payment_confirmed_at is not None
    assert [call["source"] for call in confirmed] == ["callback"]

    again = shop.post(pretty.encode())  # the same payload as the page prints it, whitespace and all
    assert again.status_code == 200, again.get_data(as_text=True)
    assert again.json["outcome"] == "duplicate"
    assert len(confirmed) == 1
    assert [status for _, status in shop.logs()] == [200, 200]


def test_the_documented_callback_with_another_key_is_refused(shop, confirmed):
    token = shop.paid_checkout()
    body = compact({**respell(DOCUMENTED.response_body, shop.wire), "checkoutToken": token})
    headers = {
        "Content-Type": "application/json",
        "X-Signature": sign(body, "05bea2b2-a3a0-49c6-99ab-79cd1527ec22"),
    }
    answer = shop.app.test_client().post("/gateway/callback", data=body, headers=headers)
    assert answer.status_code == 401
    assert shop.checkout(token).payment_confirmed_at is None and confirmed == []


def test_the_pretty_printed_body_is_signed_over_its_text_without_whitespace():
    """What the documentation's reference code signs: the pretty text and the compact JSON are one message."""
    text = DOCUMENTED.response_body_text
    assert text is not None and "\n" in text
    assert sign(text.encode(), "k") == sign(compact(json.loads(text)), "k")
