"""``GATEWAY_ENVIRONMENT="embedded"``: the extension mounts the emulator in the shop's app and uses it.

The emulator's own side (routes under the prefix, tables, in-process callbacks, a host left as it was) is
tests/emulator/test_embedded.py; here: the configuration, the refusals, and a payment taken by a shop whose
only gateway is the one inside it.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_gateway import (
    Address,
    ConfigurationError,
    Customer,
    Gateway,
    InstallSettings,
    OrderDraft,
    OrderLine,
    create_checkout,
    install,
    payment_confirmed,
    setup_warnings,
)
from flask_gateway.emulator import EmbeddingRefused, embedded_emulator, mount
from flask_gateway.emulator.models import db as emulator_db
from flask_gateway.state import get_state
from tests.extension.operations.cli_support import run_gateway


def make_shop(tmp_path: Path, **config: Any) -> Flask:
    app = Flask("embedded_shop", instance_path=str(tmp_path / "instance"))
    app.config.update(
        SECRET_KEY="embedded-shop-secret-key-0123456789",
        SQLALCHEMY_DATABASE_URI=f"sqlite:///{tmp_path / 'shop.db'}",
        GATEWAY_ENVIRONMENT="embedded",
        TESTING=True,
        GATEWAY_MAX_RETRIES=0,
    )
    app.config.update(config)
    db = SQLAlchemy()
    db.init_app(app)
    Gateway(app, db=db)
    with app.app_context():
        db.create_all()
    app.extensions["shop_db"] = db
    return app


def install_the_demo_account() -> None:
    """The emulator's demo account, installed with the shop's callback URL (in a request context)."""
    install(
        InstallSettings(
            merchant_account_id="demo-merchant",
            api_key="demo-api-key",
            callback_url="http://127.0.0.1:5000/gateway/callback",
            callback_failures_email=None,
            minimum_cents=100,
            maximum_cents=10_000_000,
        )
    )


def close(app: Flask) -> None:
    embedded = embedded_emulator(app)
    if embedded is not None:
        with embedded.app.app_context():
            emulator_db.engine.dispose()
    with app.app_context():
        get_state(app).dispose()
        app.extensions["shop_db"].engine.dispose()


@pytest.fixture
def shop(tmp_path: Path) -> Iterator[Flask]:
    app = make_shop(tmp_path)
    yield app
    close(app)


def test_the_extension_points_at_the_emulator_it_mounted(shop: Flask) -> None:
    config = get_state(shop).config
    assert (config.base_url, config.install_url, config.v1_base_url) == (
        "http://localhost/_gateway",
        "http://localhost/_gateway/install",
        "http://localhost/_gateway",
    )
    assert config.waf == "allow-local"
    embedded = embedded_emulator(shop)
    assert embedded is not None
    assert embedded.prefix == "/_gateway"
    assert shop.test_client().get("/_gateway/_emulator/clock").status_code == 200


def test_the_prefix_and_the_public_address_are_the_shops(tmp_path: Path) -> None:
    app = make_shop(tmp_path, GATEWAY_EMBEDDED_PREFIX="/pay/", GATEWAY_PUBLIC_URL="https://shop.example")
    config = get_state(app).config
    assert config.base_url == "https://shop.example/pay"
    assert app.test_client().get("/pay/_emulator/clock").status_code == 200
    assert app.test_client().get("/_gateway/_emulator/clock").status_code == 404
    close(app)


@pytest.mark.parametrize("key", ["GATEWAY_BASE_URL", "GATEWAY_INSTALL_URL", "GATEWAY_V1_BASE_URL"])
def test_an_address_of_another_gateway_is_refused(tmp_path: Path, key: str) -> None:
    with pytest.raises(ConfigurationError, match=f"{key} is set with GATEWAY_ENVIRONMENT='embedded'"):
        make_shop(tmp_path, **{key: "http://127.0.0.1:5050"})


def test_a_prefix_that_is_no_path_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="GATEWAY_EMBEDDED_PREFIX"):
        make_shop(tmp_path, GATEWAY_EMBEDDED_PREFIX="_gateway")


@pytest.mark.parametrize("environment", ["sandbox", "production"])
def test_a_shop_on_the_real_gateway_never_mounts_it(tmp_path: Path, environment: str) -> None:
    urls = {
        "GATEWAY_BASE_URL": "https://gateway.example",
        "GATEWAY_INSTALL_URL": "https://install.gateway.example",
        "GATEWAY_V1_BASE_URL": "https://v1.gateway.example",
        "GATEWAY_PUBLIC_URL": "https://shop.example",
    }
    app = make_shop(tmp_path, GATEWAY_ENVIRONMENT=environment, **urls)
    assert embedded_emulator(app) is None
    assert app.test_client().get("/_gateway/_emulator/clock").status_code == 404
    with pytest.raises(EmbeddingRefused, match=environment):
        mount(app)
    close(app)


def test_a_payment_taken_with_the_gateway_inside_the_shop(shop: Flask) -> None:
    confirmed: list[tuple[str, str]] = []

    def receiver(sender: Any, checkout: Any, source: str, **extra: Any) -> None:
        confirmed.append((checkout.order_reference, source))

    payment_confirmed.connect(receiver)
    try:
        with shop.test_request_context(base_url="http://127.0.0.1:5000"):
            install_the_demo_account()
            assert setup_warnings() == []  # a local address is fine: the gateway is inside the shop
            checkout = create_checkout(
                OrderDraft(
                    reference="E-1",
                    lines=(OrderLine(name="Kettle", sku="K-1", quantity=1, unit_price_cents=49900),),
                    customer=Customer(first_name="Thandi", last_name="Mokoena", email="thandi@example.com"),
                )
            )
        # The shopper's paymentUrl is on the address the shopper used, under the prefix.
        assert checkout.payment_url.startswith("http://127.0.0.1:5000/_gateway/api/v2/app/checkout/v2.")
        client = shop.test_client()
        paid = client.post(f"/_gateway/_emulator/checkouts/{checkout.token}/pay", json={})
        assert paid.json["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"
        assert confirmed == []  # nothing is believed before proof
        assert client.post("/_gateway/_emulator/deliver", json={}).json == {"attempts": 1}
        assert confirmed == [("E-1", "callback")]  # the signed callback, confirmed with getstatus
        status = client.get(f"/_gateway/_emulator/checkouts/{checkout.token}").json
        assert status["checkoutPaymentStatus"] == "PAID"  # the shop answered the callback with 200
        client.post("/_gateway/_emulator/deliver", json={})
        assert confirmed == [("E-1", "callback")]
    finally:
        payment_confirmed.disconnect(receiver)


@pytest.mark.parametrize("refresh", [False, True], ids=["status", "status --refresh"])
def test_the_status_command_asks_the_gateway_inside_the_shop_without_waiting_on_its_own_lock(
    tmp_path: Path, refresh: bool
) -> None:
    # `flask gateway status` reads the local record, then asks the emulator, which answers from the same
    # SQLite file in the same process (and, a new process's first request, checks its tables with a write
    # transaction): the command's reading transaction, still open, held the write lock the emulator waited
    # for until its busy timeout, and the command ended "getstatus: HTTP 503" ("database is locked").
    shop = make_shop(tmp_path)
    with shop.test_request_context(base_url="http://127.0.0.1:5000"):
        install_the_demo_account()
        create_checkout(
            OrderDraft(
                reference="6E238593",
                lines=(OrderLine(name="Kettle", sku="K-1", quantity=1, unit_price_cents=49900),),
                customer=Customer(first_name="Thandi", last_name="Mokoena", email="thandi@example.com"),
            )
        )
    close(shop)
    command_line = make_shop(tmp_path)  # what `flask --app shop gateway status` starts: a new process's app
    try:
        arguments = ["status", "6E238593", *(["--refresh"] if refresh else [])]
        result = run_gateway(command_line, *arguments)
    finally:
        close(command_line)
    assert result.exit_code == 0, result.stdout + result.stderr
    assert "Gateway (getstatus)" in result.stdout
    assert re.search(r"checkoutPaymentStatus\s+PENDING_ORDER", result.stdout), result.stdout
    assert "locked" not in result.stderr and "503" not in result.stderr, result.stderr
    if refresh:
        assert "Refreshed: " in result.stdout


def test_a_v1_payment_taken_with_the_gateway_inside_the_shop(tmp_path: Path) -> None:
    """v1: the gateway calls the shop's success URL (in-process here) and the shop answers its JSON."""
    app = make_shop(tmp_path, GATEWAY_API_VERSION="v1")
    confirmed: list[tuple[str, str]] = []

    def receiver(sender: Any, checkout: Any, source: str, **extra: Any) -> None:
        confirmed.append((checkout.order_reference, source))

    payment_confirmed.connect(receiver)
    try:
        with app.test_request_context(base_url="http://127.0.0.1:5000"):
            install_the_demo_account()
            checkout = create_checkout(
                OrderDraft(
                    reference="V1-1",
                    lines=(OrderLine(name="Kettle", sku="K-1", quantity=1, unit_price_cents=49900),),
                    customer=Customer(
                        first_name="Thandi",
                        last_name="Mokoena",
                        email="thandi@example.com",
                        phone="+27821234567",
                    ),
                    billing_address=Address(
                        line1="1 Long St", city="Cape Town", province="WC", postal_code="8001"
                    ),
                )
            )
        assert checkout.payment_url.startswith("http://127.0.0.1:5000/_gateway/api/v1/app/checkout/")
        paid = app.test_client().post(f"/_gateway/_emulator/checkouts/{checkout.token}/pay", json={})
        assert paid.status_code == 200, paid.get_data(as_text=True)
        # The gateway called the shop's success URL and took its JSON answer's return_url for the shopper.
        assert paid.json["redirectUrl"].startswith("http://127.0.0.1:5000/"), paid.json
        assert confirmed == [("V1-1", "v1")]  # the signed success URL, called once
    finally:
        payment_confirmed.disconnect(receiver)
        close(app)
