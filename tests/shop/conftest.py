"""The example shop (``example_shop.create_app``) wired to the in-process emulator, both ways.

- The shop's gateway clients reach the emulator at ``http://emulator.test`` through a ``requests`` adapter.
- The emulator's callbacks and v1 GETs reach the shop at ``https://shop.example`` the same way.
- A :class:`Shopper` is a browser: one cookie jar, every request on ``https://shop.example``.
No sockets (the end-to-end tests run real processes and a real browser).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import pytest
from flask import Flask
from flask.testing import FlaskClient
from sqlalchemy import func, select
from werkzeug.security import generate_password_hash
from werkzeug.test import TestResponse

from example_shop import create_app
from example_shop.extensions import db
from example_shop.models import Order, OrderEvent
from example_shop.setup import auto_install
from flask_gateway import clear_payment_plan_cache
from flask_gateway.testing import GatewayEmulator, connect
from tests.conftest import Databases, Schema
from tests.emulator.conftest import EMULATOR_TABLES, make_emulator
from tests.emulator.support import Gateway as EmulatorDriver
from tests.extension.conftest import EMULATOR_URL as EMULATOR_URL
from tests.extension.conftest import SHOP_URL as SHOP_URL

OWNER_PASSWORD = "correct horse battery staple"
#: Fast to check in tests; production hashes use werkzeug's default (scrypt).
OWNER_HASH = generate_password_hash(OWNER_PASSWORD, method="pbkdf2:sha256:1000")

CUSTOMER: dict[str, str] = {
    "first_name": "Thandi",
    "last_name": "Mokoena",
    "email": "thandi@example.com",
    "phone": "082 123 4567",
    "billing_line1": "1 Long Street",
    "billing_line2": "",
    "billing_city": "Cape Town",
    "billing_province": "Western Cape",
    "billing_postal_code": "8001",
    "shipping_same": "y",
}

_CSRF = re.compile(r'name="csrf_token"[^>]*value="([^"]+)"')


def csrf_token(html: str) -> str:
    match = _CSRF.search(html)
    assert match, "no CSRF token on the page"
    return match.group(1)


def init_db(app: Flask) -> Flask:
    """``flask --app example_shop shop init-db``, the step docs/example-shop.md has a user run before the
    shop starts (``create_app`` creates no table)."""
    result = app.test_cli_runner().invoke(args=["shop", "init-db"])
    assert result.exit_code == 0, result.output
    return app


def create_shop(config: dict[str, Any]) -> Flask:
    """``create_app(config)`` with its tables created as a user creates them (:func:`init_db`)."""
    return init_db(create_app(config))


def _build_shop_tables(database_url: str) -> None:
    app = create_shop(shop_config(database_url))
    with app.app_context():
        db.engine.dispose()


def shop_config(database_url: str, **config: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "TESTING": True,
        "SECRET_KEY": "shop-secret-key-for-tests",
        "SHOP_DATABASE_URL": database_url,
        "SHOP_ADMIN_PASSWORD_HASH": OWNER_HASH,
        "GATEWAY_ENVIRONMENT": "emulator",
        "GATEWAY_BASE_URL": EMULATOR_URL,
        "GATEWAY_INSTALL_URL": f"{EMULATOR_URL}/install",
        "GATEWAY_V1_BASE_URL": EMULATOR_URL,
        "GATEWAY_PUBLIC_URL": SHOP_URL,
        "GATEWAY_MAX_RETRIES": 0,
        "SHOP_AUTO_INSTALL_DELAYS": (),
    }
    values.update(config)
    return values


#: ``databases.url(name, schema=SHOP_TABLES)``: a database with the tables ``shop init-db`` makes already there
#: (``create_shop`` then runs ``init-db`` on it, as a user might run it twice).
SHOP_TABLES = Schema("example-shop", _build_shop_tables)


class Shopper:
    """A browser on the shop: its own cookies (cart, orders), absolute URLs on ``SHOP_URL``."""

    def __init__(self, client: FlaskClient) -> None:
        self.client = client

    @staticmethod
    def url(path: str) -> str:
        return path if path.startswith("http") else SHOP_URL + path

    def get(self, path: str, **kwargs: Any) -> TestResponse:
        return self.client.get(self.url(path), **kwargs)

    def post(self, path: str, data: dict[str, Any] | None = None, **kwargs: Any) -> TestResponse:
        # A browser sends the page's address as Referer (same origin): Flask-WTF checks it on HTTPS.
        headers = {"Referer": SHOP_URL + "/", **kwargs.pop("headers", {})}
        return self.client.post(self.url(path), data=data or {}, headers=headers, **kwargs)

    def submit(self, page: str, action: str, data: dict[str, Any] | None = None) -> TestResponse:
        """Open ``page`` and post ``data`` to ``action`` with the page's CSRF token, as a browser would."""
        token = csrf_token(self.get(page).get_data(as_text=True))
        return self.post(action, {"csrf_token": token, **(data or {})})

    def add(self, slug: str, quantity: int = 1) -> TestResponse:
        return self.submit(f"/products/{slug}", f"/cart/add/{slug}", {"quantity": str(quantity)})

    def checkout(self, **fields: str | None) -> TestResponse:
        data = {**CUSTOMER, **fields}
        return self.submit("/checkout", "/checkout", {k: v for k, v in data.items() if v is not None})

    def follow(self, response: TestResponse, limit: int = 5) -> TestResponse:
        """Follow redirects on the shop (absolute or relative) with this browser's cookies."""
        for _ in range(limit):
            if response.status_code not in (301, 302, 303, 307, 308):
                return response
            response = self.get(response.headers["Location"])
        return response

    def log_in(self, password: str = OWNER_PASSWORD, next_path: str = "") -> TestResponse:
        page = "/admin/login" + (f"?next={next_path}" if next_path else "")
        token = csrf_token(self.get(page).get_data(as_text=True))
        data = {"csrf_token": token, "password": password}
        if next_path:
            data["next"] = next_path
        return self.post("/admin/login", data)


@dataclass
class ShopHarness:
    app: Flask
    emulator: EmulatorDriver

    def shopper(self) -> Shopper:
        return Shopper(self.app.test_client())

    def install(self) -> str:
        return auto_install(self.app, sleep=lambda seconds: None)

    def order(self, reference: str) -> Order:
        with self.app.app_context():
            order = db.session.scalars(select(Order).where(Order.reference == reference)).one()
            db.session.expunge(order)
            return order

    def events(self, reference: str, kind: str) -> int | None:
        with self.app.app_context():
            return db.session.scalar(
                select(func.count(OrderEvent.id))
                .join(Order)
                .where(Order.reference == reference, OrderEvent.kind == kind)
            )

    def latest_reference(self) -> str:
        """The reference of the newest order (there must be one)."""
        with self.app.app_context():
            reference = db.session.scalars(select(Order.reference).order_by(Order.id.desc())).first()
        assert reference is not None, "no order was placed"
        return reference

    def order_count(self) -> int:
        with self.app.app_context():
            return len(db.session.scalars(select(Order.id)).all())

    def pay_on_gateway(self, location: str) -> Any:
        """The shopper pays on the payment page ``location``; the emulator's outcome (``redirectUrl``)."""
        token = urlsplit(location).path.rsplit("/", 1)[1]
        answer = self.emulator.pay(token)
        assert answer.status_code == 200, answer.get_data(as_text=True)
        return answer.json

    def cancel_on_gateway(self, location: str) -> Any:
        token = urlsplit(location).path.rsplit("/", 1)[1]
        answer = self.emulator.consumer_cancel(token)
        assert answer.status_code == 200, answer.get_data(as_text=True)
        return answer.json


def make_harness(
    databases: Databases,
    monkeypatch: pytest.MonkeyPatch,
    *,
    install: bool = True,
    name: str = "shop",
    emulator_accounts: dict[str, str] | None = None,
    **config: Any,
) -> ShopHarness:
    """The example shop on the database ``name``, the emulator on ``name-emulator`` (same backend);
    ``emulator_accounts``: the emulator's accounts (id to API key) instead of its demo account."""
    emulator_settings: dict[str, Any] = {"public_url": EMULATOR_URL}
    if emulator_accounts is not None:
        emulator_settings["accounts"] = emulator_accounts
    emulator_app = make_emulator(
        databases.url(f"{name}-emulator", schema=EMULATOR_TABLES), **emulator_settings
    )
    app = create_shop(shop_config(databases.url(name, schema=SHOP_TABLES), **config))

    connect(app, emulator_app)

    harness = ShopHarness(app=app, emulator=EmulatorDriver(emulator_app.test_client()))
    if install:
        assert harness.install() == "installed"
    return harness


@pytest.fixture(autouse=True)
def _clean_environment(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The shop reads SHOP_* and GATEWAY_* from the environment: none of the runner's may leak in."""
    for name in list(os.environ):
        if name.startswith(("SHOP_", "GATEWAY_")):
            monkeypatch.delenv(name)
    clear_payment_plan_cache()
    yield
    clear_payment_plan_cache()


@pytest.fixture
def shop(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> ShopHarness:
    """An installed shop (limits R 50.00 to R 50 000.00, the v2 flow), on the test's backend."""
    return make_harness(databases, monkeypatch)


@pytest.fixture
def shopper(shop: ShopHarness) -> Shopper:
    return shop.shopper()


# --- the same shop through the pytest plugin (docs/testing.md) ----------------------------------------


@pytest.fixture
def gateway_app(databases: Databases) -> Flask:
    """The plugin's shop: the example shop configured as ``shop`` is, not yet installed (the plugin's
    ``gateway_emulator`` wires it to an emulator and installs it)."""
    return create_shop(shop_config(databases.url("shop", schema=SHOP_TABLES)))


@pytest.fixture
def gateway_emulator_database_url(databases: Databases) -> str:
    """The plugin's emulator on the test's backend, beside the shop (where ``make_harness`` puts it)."""
    return databases.url("shop-emulator", schema=EMULATOR_TABLES)


@pytest.fixture
def plugin_shop(gateway_emulator: GatewayEmulator) -> ShopHarness:
    """``shop`` built by the plugin: the example shop, its emulator in-process, the gateway installed
    with the example shop's limits (R 50.00 to R 50 000.00), as ``shop`` has them."""
    config = gateway_emulator.shop.config
    gateway_emulator.install(minimum_cents=config["SHOP_MIN_CENTS"], maximum_cents=config["SHOP_MAX_CENTS"])
    return ShopHarness(app=gateway_emulator.shop, emulator=EmulatorDriver(gateway_emulator.client))
