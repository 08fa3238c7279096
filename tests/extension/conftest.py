"""A shop app with the extension, talking to the in-process emulator (and the emulator back to the shop).

- The shop's clients reach the emulator at ``http://emulator.test`` through a ``requests`` adapter.
- The emulator's callbacks and v1 GETs reach the shop at ``https://shop.example`` the same way.
No sockets: real HTTP between processes is tested in the end-to-end tests.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from flask_wtf.csrf import CSRFProtect

from flask_gateway import Gateway
from flask_gateway.payments.installation import InstallSettings, install
from flask_gateway.payments.orders import Address, Customer, OrderDraft, OrderLine
from flask_gateway.testing import EMULATOR_URL as EMULATOR_URL
from flask_gateway.testing import SHOP_URL as SHOP_URL
from flask_gateway.testing import GatewayEmulator, connect
from tests.conftest import Databases, Schema
from tests.emulator.conftest import EMULATOR_TABLES, make_emulator
from tests.emulator.support import Gateway as EmulatorDriver

ACCOUNT = "demo-merchant"
API_KEY = "demo-api-key"


def make_shop(
    database_url: str, *, create_tables: bool = True, **config: Any
) -> tuple[Flask, SQLAlchemy, Gateway]:
    """A shop app with the extension on ``database_url`` (the ``database_url`` fixture), tables created.

    ``create_tables=False`` for a database that holds them already (``databases.url(name,
    schema=SHOP_TABLES)``, built by this function): its ``create_all`` would find every table there."""
    app = Flask("test_shop")
    app.config.update(
        TESTING=True,
        SECRET_KEY="shop-secret-key-for-tests",
        SQLALCHEMY_DATABASE_URI=database_url,
        GATEWAY_ENVIRONMENT="emulator",
        GATEWAY_BASE_URL=EMULATOR_URL,
        GATEWAY_INSTALL_URL=f"{EMULATOR_URL}/install",
        GATEWAY_V1_BASE_URL=EMULATOR_URL,
        GATEWAY_PUBLIC_URL=SHOP_URL,
        GATEWAY_ORDER_ENDPOINT="order_page",
        GATEWAY_MAX_RETRIES=0,
    )
    app.config.update(config)
    db = SQLAlchemy()
    db.init_app(app)
    CSRFProtect(app)
    gateway = Gateway(app, db=db)

    @app.get("/orders/<reference>")
    def order_page(reference: str) -> str:
        return f"order {reference}"

    if create_tables:
        with app.app_context():
            db.create_all()
    return app, db, gateway


def _build_shop_tables(database_url: str) -> None:
    app, db, _ = make_shop(database_url)
    with app.app_context():
        db.engine.dispose()


#: ``databases.url(name, schema=SHOP_TABLES)``: a database with ``make_shop``'s tables already there.
SHOP_TABLES = Schema("extension-shop", _build_shop_tables)


@dataclass
class Harness:
    """The shop and the emulator, wired together."""

    shop: Flask
    db: SQLAlchemy
    gateway: Gateway
    emulator: EmulatorDriver

    @property
    def client(self):  # the shop's test client
        return self.shop.test_client()

    def install(self, *, minimum: int = 100, maximum: int = 10_000_000) -> None:
        with self.shop.app_context():
            install(
                InstallSettings(
                    merchant_account_id=ACCOUNT,
                    api_key=API_KEY,
                    callback_url=f"{SHOP_URL}/gateway/callback",
                    callback_failures_email=None,
                    minimum_cents=minimum,
                    maximum_cents=maximum,
                )
            )


def sample_order(reference: str = "ORD-1", *, quantity: int = 2, price: int = 39900) -> OrderDraft:
    return OrderDraft(
        reference=reference,
        lines=(
            OrderLine(
                name="Enamel kettle",
                sku="K-1",
                quantity=quantity,
                unit_price_cents=price,
                image_url=f"{SHOP_URL}/static/kettle.png",
                page_url=f"{SHOP_URL}/products/kettle",
            ),
        ),
        customer=Customer(
            first_name="Thandi", last_name="Mokoena", email="thandi@example.com", phone="+27821234567"
        ),
        billing_address=Address(line1="1 Long St", city="Cape Town", province="WC", postal_code="8001"),
        shipping_address=Address(line1="1 Long St", city="Cape Town", province="WC", postal_code="8001"),
    )


@pytest.fixture
def harness(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """The shop on ``database_url``, the emulator on a database of its own (same backend)."""
    built = build_harness(databases, monkeypatch)
    yield built
    with built.shop.app_context():
        built.db.engine.dispose()


def build_harness(databases: Databases, monkeypatch: pytest.MonkeyPatch, **config: Any) -> Harness:
    """The ``harness`` fixture's wiring, with extra shop configuration (e.g. ``GATEWAY_API_VERSION="v1"``)."""
    emulator_app = make_emulator(databases.url("emulator", schema=EMULATOR_TABLES), public_url=EMULATOR_URL)
    shop, db, gateway = make_shop(databases.url("main", schema=SHOP_TABLES), create_tables=False, **config)
    connect(shop, emulator_app)
    return Harness(shop=shop, db=db, gateway=gateway, emulator=EmulatorDriver(emulator_app.test_client()))


# --- the same shop through the pytest plugin (docs/testing.md) ----------------------------------------


@pytest.fixture
def plugin_parts(databases: Databases) -> tuple[Flask, SQLAlchemy, Gateway]:
    """The shop of ``harness`` (``make_shop`` on the test's backend), for the plugin to wire."""
    return make_shop(databases.url("main", schema=SHOP_TABLES), create_tables=False)


@pytest.fixture
def gateway_app(plugin_parts: tuple[Flask, SQLAlchemy, Gateway]) -> Flask:
    """The plugin's shop (its ``gateway_emulator`` wires it to an emulator and installs it)."""
    return plugin_parts[0]


@pytest.fixture
def gateway_emulator_database_url(databases: Databases) -> str:
    """The plugin's emulator on the test's backend, beside the shop (where ``build_harness`` puts it)."""
    return databases.url("emulator", schema=EMULATOR_TABLES)


@pytest.fixture
def plugin_harness(
    gateway_emulator: GatewayEmulator, plugin_parts: tuple[Flask, SQLAlchemy, Gateway]
) -> Harness:
    """``harness``, installed, built by the plugin: its helpers work on it unchanged."""
    shop, db, gateway = plugin_parts
    return Harness(shop=shop, db=db, gateway=gateway, emulator=EmulatorDriver(gateway_emulator.client))
