"""Fixtures of the hostile-input tests: the extension + in-process emulator harness, and table snapshots."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from flask import Flask, url_for
from sqlalchemy import MetaData, Table, create_engine, event, inspect, select
from sqlalchemy.pool import NullPool
from werkzeug.routing import Rule

from example_shop.links import order_token
from flask_gateway import clear_payment_plan_cache
from flask_gateway.models import CallbackLog, GatewayCheckout, OutboxEvent
from flask_gateway.state import get_state
from tests.conftest import Databases, dispose_engines
from tests.extension.conftest import Harness, build_harness
from tests.shop.conftest import SHOP_URL, ShopHarness, Shopper
from tests.shop.conftest import make_harness as make_shop_harness


@pytest.fixture
def sqlite_databases(tmp_path: Path) -> Iterator[Databases]:
    """Fresh SQLite databases only: for the long-running fuzz tests, where one backend is enough
    (the same code paths run on PostgreSQL in tests/extension)."""
    found = Databases(backend="sqlite", directory=tmp_path, cluster=None)
    try:
        yield found
    finally:
        dispose_engines()


@pytest.fixture
def sqlite_harness(sqlite_databases: Databases, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """The extension's test shop and the in-process emulator (tests/extension/conftest.py), on SQLite.

    Its tests send thousands of refused callbacks from one address: the per-client limit is off here
    (tests/extension/inbound/test_callback_claims.py proves it)."""
    harness = build_harness(sqlite_databases, monkeypatch, GATEWAY_CALLBACK_RATE_LIMIT=None)
    with harness.shop.app_context():
        # Thousands of small commits: no fsync (a throwaway file; the test is about answers and rows).
        engine = harness.db.engine
        event.listen(engine, "connect", _no_sync)
        engine.dispose()
    yield harness
    with harness.shop.app_context():
        harness.db.engine.dispose()


@pytest.fixture
def harness(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    """As tests/extension/conftest.py's ``harness``: on the test's backend (``database_backend``)."""
    found = build_harness(databases, monkeypatch)
    yield found
    with found.shop.app_context():
        found.db.engine.dispose()


def _no_sync(dbapi_connection: Any, _record: Any) -> None:
    dbapi_connection.execute("PRAGMA synchronous=OFF")


def table_contents(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of the database at ``url`` (ordered by all columns), by table name."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            contents: dict[str, list[tuple[Any, ...]]] = {}
            for name in inspect(connection).get_table_names():
                table = Table(name, MetaData(), autoload_with=connection)
                rows = [tuple(row) for row in connection.execute(select(table))]
                contents[name] = sorted(rows, key=repr)
            return contents
    finally:
        engine.dispose()


# --- the example shop, with real objects to fill every URL of its map ---------------------------------


@dataclass
class ShopWorld:
    """An installed example shop with one paid order, and the values that fill its URL rules."""

    harness: ShopHarness
    anonymous: Shopper
    owner: Shopper
    values: dict[str, Any]

    @property
    def app(self) -> Flask:
        return self.harness.app

    def url(self, rule: Rule) -> str:
        with self.app.test_request_context(base_url=SHOP_URL):
            return url_for(rule.endpoint, **{name: self.values[name] for name in rule.arguments})


def methods_of(rule: Rule) -> set[str]:
    return set(rule.methods or ()) - {"HEAD", "OPTIONS"}


def build_shop_world(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> ShopWorld:
    for name in list(os.environ):  # as tests/shop/conftest.py: none of the runner's settings leak in
        if name.startswith(("SHOP_", "GATEWAY_")):
            monkeypatch.delenv(name)
    clear_payment_plan_cache()
    # Its tests log in hundreds of times from one address: the login's rate limit (tested in
    # tests/shop/test_login_security.py) is raised out of their way.
    harness = make_shop_harness(databases, monkeypatch, SHOP_LOGIN_RATE_LIMIT="100000 per minute")
    buyer = harness.shopper()
    buyer.add("enamel-kettle", 1)
    redirect = buyer.checkout()
    buyer.follow(buyer.get(harness.pay_on_gateway(redirect.headers["Location"])["redirectUrl"]))
    reference = harness.latest_reference()
    with harness.app.app_context():
        checkout_id = get_state().session.scalars(select(GatewayCheckout.id)).one()
        event_id = get_state().session.scalars(select(OutboxEvent.id).order_by(OutboxEvent.id)).first()
        log_id = get_state().session.scalars(select(CallbackLog.id).order_by(CallbackLog.id)).first()
        token = order_token(reference)
    owner = harness.shopper()
    assert owner.log_in().status_code == 303
    values: dict[str, Any] = {
        "slug": "enamel-kettle",
        "reference": reference,
        "token": token,
        "checkout_id": checkout_id,
        "event_id": event_id,  # the payment's outbox event (delivered)
        "log_id": log_id or 1,  # the payment's callback (verified), for its replay
        "kind": "confirm",
        "account": "demo-merchant",  # an account's own callback path (several merchant accounts)
        "filename": "shop/shop.css",
    }
    return ShopWorld(harness=harness, anonymous=harness.shopper(), owner=owner, values=values)


@pytest.fixture
def shop_world(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> Iterator[ShopWorld]:
    world = build_shop_world(databases, monkeypatch)
    yield world
    clear_payment_plan_cache()
