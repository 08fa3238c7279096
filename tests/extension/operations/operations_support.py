"""Helpers for the operations, reconciliation and CLI tests: a spying transport, signal recorders, setup."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from blinker import Signal

from flask_gateway import create_checkout
from flask_gateway.models import GatewayCheckout
from flask_gateway.payments.orders import OrderDraft
from flask_gateway.state import get_state
from flask_gateway.testing import FlaskAdapter
from tests.extension.conftest import ACCOUNT, EMULATOR_URL, Harness, sample_order


@dataclass
class Sent:
    method: str
    path: str
    body: Any


class SpyAdapter(FlaskAdapter):
    """The harness transport, recording every request; an injected dropped answer becomes a reset."""

    def __init__(self, client: Any) -> None:
        super().__init__(client)
        self.sent: list[Sent] = []
        self.before_send: list[Any] = []

    def send(self, request, stream=False, timeout=None, verify=True, cert=None, proxies=None):  # type: ignore[no-untyped-def]
        body = json.loads(request.body) if request.body else None
        sent = Sent(request.method, urlsplit(request.url).path, body)
        self.sent.append(sent)
        for hook in self.before_send:
            hook(sent)
        return super().send(request, stream, timeout, verify, cert, proxies)

    def paths(self) -> list[str]:
        return [s.path for s in self.sent]


def spy(harness: Harness) -> SpyAdapter:
    """Replace the shop-to-emulator transport with a spying one (same emulator)."""
    adapter = SpyAdapter(harness.emulator.client)
    get_state(harness.shop).client_options["session"].mount(EMULATOR_URL, adapter)
    return adapter


def share_signing_key(harness: Harness) -> None:
    """Let the emulator driver make signed calls as the shop's account (e.g. a cancel behind its back)."""
    with harness.shop.app_context():
        state = get_state()
        installation = state.require_installation()
        harness.emulator.keys[ACCOUNT] = state.box.decrypt(installation.signing_key_encrypted)


@dataclass
class Recorder:
    calls: list[dict[str, Any]] = field(default_factory=list)

    def __call__(self, sender: Any, **kwargs: Any) -> None:
        self.calls.append({"sender": sender, **kwargs})

    def __len__(self) -> int:
        return len(self.calls)


@contextmanager
def recording(signal: Signal) -> Iterator[Recorder]:
    recorder = Recorder()
    signal.connect(recorder)
    try:
        yield recorder
    finally:
        signal.disconnect(recorder)


def new_checkout(harness: Harness, order: OrderDraft | None = None) -> tuple[int, str]:
    """Create a checkout through the extension; its id and token."""
    with harness.shop.app_context():
        checkout = create_checkout(order or sample_order())
        assert checkout.token is not None
        return checkout.id, checkout.token


def load(harness: Harness, checkout_id: int) -> GatewayCheckout:
    """The checkout as stored (call inside an app context)."""
    checkout = get_state(harness.shop).session.get(GatewayCheckout, checkout_id, populate_existing=True)
    assert checkout is not None
    return checkout


def emulator_checkout(harness: Harness, token: str) -> dict[str, Any]:
    response = harness.emulator.control(f"checkouts/{token}", method="GET")
    assert response.status_code == 200, response.get_data(as_text=True)
    body: dict[str, Any] = response.get_json()
    return body
