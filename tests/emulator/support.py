"""A small driver for the in-process emulator: install, signed calls, request builders."""

from __future__ import annotations

import copy
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine
from werkzeug.test import TestResponse

from flask_gateway.core.signing import sign
from flask_gateway.core.sql import _DEFERRED_BEGIN
from flask_gateway.emulator.models import db

ACCOUNT = "demo-merchant"
API_KEY = "demo-api-key"
CALLBACK_URL = "http://127.0.0.1:9/gateway/callback"  # the callback URL is not firewall-checked

ITEM: dict[str, Any] = {
    "name": "Kettle",
    "sku": "K-1",
    "quantity": 2,
    "priceCents": 39900,
    "imageUrl": "https://shop.example/k.png",
    "pageUrl": "https://shop.example/k",
    "searchTerms": ["kettle"],
}


def service(**overrides: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "merchantOrderReference": "order-1",
        "orderAmountCents": 79800,
        "orderItems": [copy.deepcopy(ITEM)],
        "confirmRedirectUrl": "https://shop.example/return/ok",
        "cancelRedirectUrl": "https://shop.example/return/cancel",
    }
    body.update(overrides)
    return body


def create_body(
    request_id: str | None = "req-1", total: int = 79800, **service_overrides: Any
) -> dict[str, Any]:
    body: dict[str, Any] = {"payjustnow": service(**service_overrides), "checkoutTotalCents": total}
    if request_id is not None:
        body["requestId"] = request_id
    return body


V1_CHECKOUT: dict[str, Any] = {
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
        "items": {
            "1": {"merchant_reference": "K-1", "quantity": 2, "description": "Kettle", "unit_price": 39900},
        },
    },
}


def v1_checkout_body(**order_overrides: Any) -> dict[str, Any]:
    body = copy.deepcopy(V1_CHECKOUT)
    body["order"].update(order_overrides)
    return body


class Gateway:
    """Drives the emulator through its HTTP interface, as a merchant and as the test harness."""

    def __init__(self, client: FlaskClient) -> None:
        self.client = client
        self.keys: dict[str, str] = {}

    def install(
        self,
        account: str = ACCOUNT,
        api_key: str = API_KEY,
        *,
        callback_url: str = CALLBACK_URL,
        email: str | None = None,
        minimum: int = 100,
        maximum: int = 10_000_000,
    ) -> str:
        body: dict[str, Any] = {
            "merchantAccountId": account,
            "merchantAccountApiKey": api_key,
            "checkoutStatusCallbackUrl": callback_url,
            "minimumCheckoutAmountCents": minimum,
            "maximumCheckoutAmountCents": maximum,
        }
        if email:
            body["callbackFailuresEmail"] = email
        response = self.client.post("/install/v2", json=body)
        assert response.status_code == 200, response.get_data(as_text=True)
        key = str(response.json["secretSigningKey"])  # type: ignore[index]
        self.keys[account] = key
        return key

    def signed(
        self, path: str, body: Any, *, account: str = ACCOUNT, method: str = "POST", raw: bytes | None = None
    ) -> TestResponse:
        data = raw if raw is not None else json.dumps(body).encode()
        try:
            signature = sign(data, self.keys[account])
        except UnicodeDecodeError:  # a deliberately broken body: nothing can sign it
            signature = "unsignable"
        headers = {
            "Content-Type": "application/json",
            "X-Merchant-Account-ID": account,
            "X-Signature": signature,
        }
        return self.client.open(path, method=method, data=data, headers=headers)

    def create(self, body: dict[str, Any] | None = None, *, account: str = ACCOUNT) -> dict[str, Any]:
        response = self.signed("/v2/create", body or create_body(), account=account)
        assert response.status_code == 200, response.get_data(as_text=True)
        return response.json  # type: ignore[return-value]

    def status(self, token: str, *, account: str = ACCOUNT) -> dict[str, Any]:
        response = self.signed("/v2/getstatus", {"checkoutToken": token}, account=account)
        assert response.status_code == 200, response.get_data(as_text=True)
        return response.json  # type: ignore[return-value]

    def control(self, path: str, body: Any = None, *, method: str = "POST") -> TestResponse:
        """A control API call; POSTs are JSON (``{}`` without a body), as the emulator requires."""
        if body is None and method == "POST":
            body = {}
        return self.client.open(f"/_emulator/{path}", method=method, json=body)

    def pay(self, token: str) -> TestResponse:
        return self.control(f"checkouts/{token}/pay")

    def consumer_cancel(self, token: str) -> TestResponse:
        return self.control(f"checkouts/{token}/cancel")

    def advance(self, seconds: float) -> dict[str, Any]:
        response = self.control("clock/advance", {"seconds": seconds})
        assert response.status_code == 200, response.get_data(as_text=True)
        return response.json  # type: ignore[return-value]

    def v1(self, operation: str, body: Any, *, auth: tuple[str, str] = (ACCOUNT, API_KEY)) -> TestResponse:
        return self.client.post(f"/api/v1/merchant/{operation}", json=body, auth=auth)


@contextmanager
def write_lock_asked(app: Flask, thread: threading.Thread) -> Iterator[threading.Event]:
    """SQLite: an event set when ``thread`` begins a writing transaction on ``app``'s database, that is
    when it asks for the write lock (``BEGIN IMMEDIATE``), just before it may have to wait for it. A
    read-only transaction (``BEGIN`` DEFERRED) does not count."""
    asked = threading.Event()
    with app.app_context():
        engine = db.engine

    def began(connection: Connection) -> None:
        if connection.engine is engine and threading.current_thread() is thread and not _DEFERRED_BEGIN.get():
            asked.set()

    # Listened for on the Engine class, whose listeners run first: one on the engine itself would run after
    # the engine's listener that takes the lock, registered before it (insert=True notwithstanding).
    event.listen(Engine, "begin", began, insert=True)
    try:
        yield asked
    finally:
        event.remove(Engine, "begin", began)
