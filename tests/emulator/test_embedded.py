"""The emulator mounted inside another app (``flask_gateway.emulator.mount``): one process, the same gateway.

The host here is a plain Flask app without the extension, so these tests see the emulator's side alone:
its routes under the prefix, its tables in the host's database, its callbacks handed to the host in-process
and signed as over HTTP, its pages, clock and faults, and a host left as it was.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import requests
from flask import Flask, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import inspect

from flask_gateway.core.signing import sign, verify
from flask_gateway.core.sql import EMULATOR_TABLE_PREFIX, alembic_include_name
from flask_gateway.core.wire import CheckoutStatus
from flask_gateway.core.wsgi import WSGIAdapter
from flask_gateway.emulator import (
    DEFAULT_PREFIX,
    EmbeddingRefused,
    EmulatorSettings,
    embedded_emulator,
    mount,
)
from flask_gateway.emulator.models import db as emulator_db
from tests.emulator.support import Gateway, create_body

SHOP = "http://127.0.0.1:5000"


class Prefixed:
    """A host test client that reaches the emulator under its prefix (the driver in support.py speaks
    the emulator's own paths)."""

    def __init__(self, client: Any, prefix: str) -> None:
        self._client, self._prefix = client, prefix

    def open(self, path: str, **kwargs: Any) -> Any:
        return self._client.open(self._prefix + path, **kwargs)

    def post(self, path: str, **kwargs: Any) -> Any:
        return self.open(path, method="POST", **kwargs)

    def get(self, path: str, **kwargs: Any) -> Any:
        return self.open(path, method="GET", **kwargs)

    def delete(self, path: str, **kwargs: Any) -> Any:
        return self.open(path, method="DELETE", **kwargs)


def make_host(database_url: str, instance: Path, **config: Any) -> tuple[Flask, SQLAlchemy]:
    host = Flask("shop", instance_path=str(instance))  # the test's own folder, never the working directory
    host.config.update(
        SECRET_KEY="host-secret-" + "x" * 20, SQLALCHEMY_DATABASE_URI=database_url, TESTING=True
    )
    host.config.update(config)
    shop_db = SQLAlchemy()
    shop_db.init_app(host)
    received: list[dict[str, Any]] = []
    host.extensions["received"] = received

    @host.post("/hook")
    def hook() -> tuple[str, int]:
        received.append({"body": request.get_data(), "headers": dict(request.headers), "host": request.host})
        return "", 200

    @host.get("/")
    def home() -> str:
        return "the shop's own page"

    return host, shop_db


def settings(**changes: Any) -> EmulatorSettings:
    return replace(EmulatorSettings(worker=False, waf_strict=False), **changes)


@pytest.fixture
def host(database_url: str, tmp_path: Path) -> Iterator[Flask]:
    app, _ = make_host(database_url, tmp_path / "instance")
    mount(app, settings=settings())
    yield app
    embedded = embedded_emulator(app)
    assert embedded is not None
    with embedded.app.app_context():
        emulator_db.engine.dispose()


@pytest.fixture
def gateway(host: Flask) -> Gateway:
    return Gateway(Prefixed(host.test_client(), DEFAULT_PREFIX))  # type: ignore[arg-type]


@pytest.mark.parametrize("environment", ["sandbox", "production"])
def test_never_mounted_beside_the_real_gateway(tmp_path: Path, environment: str) -> None:
    app, _ = make_host(f"sqlite:///{tmp_path / 'shop.db'}", tmp_path, GATEWAY_ENVIRONMENT=environment)
    with pytest.raises(EmbeddingRefused, match=f"GATEWAY_ENVIRONMENT is '{environment}'"):
        mount(app, settings=settings())
    assert embedded_emulator(app) is None
    assert app.test_client().get("/_gateway/_emulator/clock").status_code == 404


def test_mounted_once_under_a_path(tmp_path: Path) -> None:
    app, _ = make_host(f"sqlite:///{tmp_path / 'shop.db'}", tmp_path)
    for bad in ("", "/", "_gateway", "/a?b"):
        with pytest.raises(EmbeddingRefused, match="must be a path"):
            mount(app, bad, settings=settings())
    mount(app, "/pay-emulator/", settings=settings())
    with pytest.raises(EmbeddingRefused, match="already mounted"):
        mount(app, settings=settings())
    client = app.test_client()
    assert client.get("/pay-emulator/_emulator/clock").status_code == 200
    assert client.get("/_gateway/_emulator/clock").status_code == 404


def test_the_host_is_left_as_it_was(database_url: str, tmp_path: Path) -> None:
    app, _ = make_host(database_url, tmp_path)
    config = dict(app.config)
    hooks = {name: dict(getattr(app, name)) for name in ("before_request_funcs", "after_request_funcs")}
    handlers = dict(app.error_handler_spec)
    blueprints = dict(app.blueprints)
    mount(app, settings=settings())
    assert dict(app.config) == config
    assert {name: dict(getattr(app, name)) for name in hooks} == hooks
    assert dict(app.error_handler_spec) == handlers
    assert dict(app.blueprints) == blueprints
    client = app.test_client()
    assert client.get("/").get_data(as_text=True) == "the shop's own page"
    # The host's 404 stays the host's (HTML); the emulator's JSON errors stay under its prefix.
    assert client.get("/v2/create").status_code == 404
    answer = client.post("/_gateway/v2/create", json={})
    assert answer.status_code == 401
    assert answer.json == {"message": "Missing or unknown X-Merchant-Account-ID."}
    # Its session secret is its own, derived from the host's, never the host's key itself.
    embedded = embedded_emulator(app)
    assert embedded is not None
    assert embedded.app.secret_key not in (None, app.secret_key)
    with embedded.app.app_context():
        emulator_db.engine.dispose()


@pytest.mark.backends
def test_its_tables_live_in_the_hosts_database(host: Flask, gateway: Gateway, database_url: str) -> None:
    gateway.install(callback_url=f"{SHOP}/hook")
    with host.app_context():
        shop_engine = host.extensions["sqlalchemy"].engine
        tables = set(inspect(shop_engine).get_table_names())
    assert {"emulator_accounts", "emulator_checkouts", "emulator_deliveries"} <= tables


def test_callbacks_reach_the_host_in_process_signed_as_over_http(host: Flask, gateway: Gateway) -> None:
    key = gateway.install(callback_url="https://shop.invalid/hook")  # no such host: only in-process works
    token = gateway.create()["checkoutToken"]
    assert gateway.pay(token).status_code == 200
    assert gateway.control("deliver").json == {"attempts": 1}
    [callback] = host.extensions["received"]
    assert callback["host"] == "shop.invalid"
    assert verify(callback["body"], key, callback["headers"]["X-Signature"])
    assert callback["headers"]["X-Merchant-Account-Id"] == "demo-merchant"
    status = gateway.status(token)
    assert status["checkoutPaymentStatus"] == CheckoutStatus.PAID  # the host answered 200
    assert status["lastCallbackAttemptStatusMessage"] == "OK"


def test_the_hosted_page_dashboard_and_clock_answer_under_the_prefix(host: Flask, gateway: Gateway) -> None:
    gateway.install(callback_url=f"{SHOP}/hook")
    created = gateway.create()
    client = host.test_client()
    # paymentUrl is on the address the merchant's request used, with the prefix.
    assert (
        created["paymentUrl"]
        == f"http://localhost{DEFAULT_PREFIX}/api/v2/app/checkout/{created['checkoutToken']}"
    )
    page = client.get(created["paymentUrl"].removeprefix("http://localhost"))
    assert page.status_code == 200
    actions = re.findall(r'action="([^"]+)"', page.get_data(as_text=True))
    assert actions and all(action.startswith(f"{DEFAULT_PREFIX}/") for action in actions), actions
    pay = next(action for action in actions if action.endswith("/pay"))
    csrf = re.search(r'name="csrf_token" value="([^"]+)"', page.get_data(as_text=True))
    assert csrf is not None
    paid = client.post(pay, data={"csrf_token": csrf.group(1)})
    assert paid.status_code in (302, 303)
    assert paid.headers["Location"].startswith("https://shop.example/return/ok")
    assert gateway.status(created["checkoutToken"])["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"

    dashboard = client.get(f"{DEFAULT_PREFIX}/_emulator/")
    assert dashboard.status_code == 200
    assert created["checkoutToken"] in dashboard.get_data(as_text=True)
    before = client.get(f"{DEFAULT_PREFIX}/_emulator/clock").json
    after = client.post(f"{DEFAULT_PREFIX}/_emulator/clock/advance", json={"seconds": 3600}).json
    assert after["offsetSeconds"] == before["offsetSeconds"] + 3600


def test_a_dropped_answer_reaches_an_in_process_client_as_a_reset_connection(
    host: Flask, gateway: Gateway
) -> None:
    key = gateway.install(callback_url=f"{SHOP}/hook")
    answer = gateway.control("faults", {"operation": "create", "kind": "drop_response", "count": 1})
    assert answer.status_code in (200, 201), answer.get_data(as_text=True)
    session = requests.Session()
    session.mount("http://gateway.test", WSGIAdapter(host))
    body = json.dumps(create_body()).encode()
    headers = {
        "Content-Type": "application/json",
        "X-Merchant-Account-ID": "demo-merchant",
        "X-Signature": sign(body, key),
    }
    with pytest.raises(requests.ConnectionError):
        session.post(f"http://gateway.test{DEFAULT_PREFIX}/v2/create", data=body, headers=headers)
    # The work was committed before the answer was dropped, as the fault promises.
    listed = gateway.control("checkouts", method="GET").json
    assert len(listed["checkouts"]) == 1


def test_every_emulator_table_has_the_prefix_migrations_leave_alone() -> None:
    names = set(emulator_db.metadata.tables)
    assert names
    assert all(name.startswith(EMULATOR_TABLE_PREFIX) for name in names), names
    assert not any(alembic_include_name(name, "table", {}) for name in names)
    assert alembic_include_name("orders", "table", {})
    assert alembic_include_name("emulator_like_column", "column", {"table_name": "orders"})


def test_the_separate_emulator_still_answers_on_its_own_root(emulator_client: Any) -> None:
    assert emulator_client.get("/_emulator/clock").status_code == 200
    assert emulator_client.post("/v2/create", json={}).status_code == 401


def test_its_payment_pages_show_times_in_the_shops_zone_unless_told(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read from the host's GATEWAY_TIMEZONE (never changed); EMULATOR_TIMEZONE, when set, wins."""
    monkeypatch.delenv("EMULATOR_TIMEZONE", raising=False)
    for name, zone, expected in (
        ("shop", "Africa/Johannesburg", "Africa/Johannesburg"),
        ("unset", None, "UTC"),
        ("wrong", "Mars/Olympus", "UTC"),  # the extension's own check refuses it; the emulator stays UTC
    ):
        config = {} if zone is None else {"GATEWAY_TIMEZONE": zone}
        app, _ = make_host(f"sqlite:///{tmp_path / name}.db", tmp_path / name, **config)
        embedded = mount(app)
        assert embedded.app.extensions["gateway_emulator"].timezone == expected, name
        assert app.config.get("GATEWAY_TIMEZONE") == zone
    monkeypatch.setenv("EMULATOR_TIMEZONE", "Europe/Amsterdam")
    app, _ = make_host(f"sqlite:///{tmp_path / 'told'}.db", tmp_path / "told", GATEWAY_TIMEZONE="Asia/Tokyo")
    assert mount(app).app.extensions["gateway_emulator"].timezone == "Europe/Amsterdam"
