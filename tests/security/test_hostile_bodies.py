"""Malformed JSON answers 400 and an oversize body 413, on every POST/PUT/PATCH route of both apps.

The routes are walked from each app's ``url_map``, so a new route is covered without touching this file;
their URL parameters are filled from real objects (a paid order, its checkout, a product, a token).

What "answers" means, route by route:

- **Emulator JSON API** (v2, v1, install, the ``/_emulator`` control API): the body is checked before
  anything else, also before the credentials (which the test sends valid: a signature over the junk,
  Basic auth), and also on control routes that take no body (``reset``, ``pay``, ``deliver``): a body
  that claims to be JSON and is not is a 400 JSON problem, never processed.
- **HTML forms** (the emulator's hosted payment page and dashboard, every shop and admin form, the
  extension's admin screens): the CSRF check comes first and a JSON body cannot carry the form's token:
  400, for the anonymous shopper and for the logged-in owner alike. The body is never parsed as JSON.
- **The extension's callback**: the junk is signed with the installed key (an unsigned body is a 401
  before any parsing, see test_callback_mutations.py), so it reaches the parser: 400 ``invalid-body``.
- **Oversize**: one byte over the app's ``MAX_CONTENT_LENGTH`` (the emulator: 64 KiB; the shop: 1 MiB;
  the callback has its own 64 KiB) is 413 on every route, before the CSRF check, credentials or the
  route's own logic, and whatever the content type.

Nothing may answer 2xx or 5xx to junk, and the shop's tables (but the callback log) stay as they were.
"""

from __future__ import annotations

import base64
import contextlib
from collections.abc import Callable
from typing import Any

import pytest
from flask import Flask, url_for

from flask_gateway.core.signing import sign
from flask_gateway.emulator.api import MAX_BODY_BYTES
from flask_gateway.inbound import MAX_CALLBACK_BYTES
from flask_gateway.state import get_state
from tests.emulator.conftest import make_emulator
from tests.emulator.support import ACCOUNT, API_KEY, Gateway, create_body
from tests.security.conftest import ShopWorld, methods_of, table_contents
from tests.shop.conftest import SHOP_URL

BODY_METHODS = {"POST", "PUT", "PATCH"}
MALFORMED = [b"{not json", b'{"a": 1', b"\xff\xfe{}", b"{}}", b'{"a":1,}', b"[1, 2", b"\x00"]


def _basic(account: str, key: str) -> str:
    return "Basic " + base64.b64encode(f"{account}:{key}".encode()).decode()


def _signed_headers(raw: bytes, key: str, account: str = ACCOUNT) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "X-Merchant-Account-ID": account,
        "Authorization": _basic(account, API_KEY),
    }
    with contextlib.suppress(UnicodeDecodeError):  # not UTF-8: cannot be signed
        headers["X-Signature"] = sign(raw, key)
    return headers


def _body_routes(app: Flask) -> list[tuple[str, Any]]:
    return sorted(
        ((method, rule) for rule in app.url_map.iter_rules() for method in methods_of(rule) & BODY_METHODS),
        key=lambda pair: (pair[1].rule, pair[0]),
    )


def _url(app: Flask, rule: Any, values: dict[str, Any]) -> str:
    with app.test_request_context():
        return url_for(rule.endpoint, **{name: values[name] for name in rule.arguments})


# --- the emulator ------------------------------------------------------------------------------------


@pytest.fixture
def emulator(database_url: str) -> tuple[Flask, Gateway, dict[str, Any]]:
    app = make_emulator(database_url)
    gateway = Gateway(app.test_client())
    gateway.install()
    token = gateway.create(create_body())["checkoutToken"]
    values = {"token": token, "version": "v2", "delivery_id": 1}
    return app, gateway, values


def test_emulator_routes_answer_400_to_malformed_json(emulator) -> None:
    app, gateway, values = emulator
    routes = _body_routes(app)
    assert len(routes) >= 20, routes
    token = values["token"]
    for method, rule in routes:
        url = _url(app, rule, values)
        for raw in MALFORMED:
            response = gateway.client.open(
                url, method=method, data=raw, headers=_signed_headers(raw, gateway.keys[ACCOUNT])
            )
            assert response.status_code == 400, (method, rule.rule, raw, response.get_data(as_text=True))
    # Nothing happened to the checkout (pay, cancel, refund... all refused before acting).
    assert gateway.status(token)["checkoutPaymentStatus"] == "PENDING_ORDER"


def test_emulator_routes_answer_413_to_an_oversize_body(emulator) -> None:
    app, gateway, values = emulator
    token = values["token"]
    raw = b'{"pad":"' + b"x" * MAX_BODY_BYTES + b'"}'
    for method, rule in _body_routes(app):
        url = _url(app, rule, values)
        for content_type in ("application/json", "application/x-www-form-urlencoded", "text/plain"):
            headers = _signed_headers(raw, gateway.keys[ACCOUNT]) | {"Content-Type": content_type}
            response = gateway.client.open(url, method=method, data=raw, headers=headers)
            assert response.status_code == 413, (method, rule.rule, content_type, response.status_code)
    assert gateway.status(token)["checkoutPaymentStatus"] == "PENDING_ORDER"


# --- the example shop with the extension -------------------------------------------------------------


def _shop_attempts(world: ShopWorld) -> list[tuple[str, str, Callable[..., Any]]]:
    routes = _body_routes(world.app)
    endpoints = {rule.endpoint for _, rule in routes}
    # The walk sees the shop's own forms, the owner's admin and the extension's blueprints.
    assert {"cart.add", "checkout.checkout", "admin.login", "admin.refund_order"} <= endpoints
    assert {"gateway.callback", "gateway_admin.install_screen", "gateway_admin.refund_checkout"} <= endpoints
    return [
        (method, world.url(rule), shopper.client.open)
        for method, rule in routes
        for shopper in (world.anonymous, world.owner)
    ]


def _callback_key(world: ShopWorld) -> str:
    with world.app.app_context():
        state = get_state()
        return state.box.decrypt(state.require_installation().signing_key_encrypted)


def test_shop_routes_answer_400_to_malformed_json(shop_world: ShopWorld, databases) -> None:
    key = _callback_key(shop_world)
    before = table_contents(databases.url("shop"))
    for method, url, open_ in _shop_attempts(shop_world):
        for raw in MALFORMED:
            headers = _signed_headers(raw, key) | {"Referer": SHOP_URL + "/"}
            response = open_(SHOP_URL + url, method=method, data=raw, headers=headers)
            # A body that is not UTF-8 cannot be signed: the callback refuses it unread (401).
            callback = url.endswith("/callback") or "/callback/" in url  # an account's own path too
            expected = 401 if callback and "X-Signature" not in headers else 400
            assert response.status_code == expected, (method, url, raw, response.status_code)
    after = table_contents(databases.url("shop"))
    new_logs, old_logs = after.pop("gateway_callback_log"), before.pop("gateway_callback_log")
    after.pop("gateway_rate_limits"), before.pop("gateway_rate_limits")  # refusals are counted
    assert after == before
    assert new_logs[: len(old_logs)] == old_logs


def test_shop_routes_answer_413_to_an_oversize_body(shop_world: ShopWorld, databases) -> None:
    limit = shop_world.app.config["MAX_CONTENT_LENGTH"]
    assert isinstance(limit, int) and limit >= MAX_CALLBACK_BYTES  # the callback's own limit must fit
    raw = b"x" * (limit + 1)
    before = table_contents(databases.url("shop"))
    for method, url, open_ in _shop_attempts(shop_world):
        for content_type in ("application/json", "application/x-www-form-urlencoded", "text/plain"):
            headers = {"Content-Type": content_type, "Referer": SHOP_URL + "/"}
            response = open_(SHOP_URL + url, method=method, data=raw, headers=headers)
            assert response.status_code == 413, (method, url, content_type, response.status_code)
    after = table_contents(databases.url("shop"))
    new_logs, old_logs = after.pop("gateway_callback_log"), before.pop("gateway_callback_log")
    after.pop("gateway_rate_limits"), before.pop("gateway_rate_limits")  # refusals are counted
    assert after == before
    assert new_logs[: len(old_logs)] == old_logs
