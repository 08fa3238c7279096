from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import pytest
from flask import Flask
from flask.testing import FlaskClient

from flask_gateway.core.sql import create_all_safely
from flask_gateway.core.timestamps import utcnow
from flask_gateway.emulator import EmulatorSettings, create_app
from flask_gateway.emulator import clock as emulator_clock
from tests.conftest import Databases, Schema
from tests.emulator.support import Gateway


def make_emulator(database_url: str, **settings: object) -> Flask:
    """An in-process emulator (no worker thread) on ``database_url`` (the ``database_url`` fixture)."""
    options: dict[str, object] = {"worker": False, "callback_retry_delays": (2.0, 10.0)}
    options.update(settings)
    return create_app(
        {
            "TESTING": True,
            "SQLALCHEMY_DATABASE_URI": database_url,
            "EMULATOR_SETTINGS": EmulatorSettings(**options),  # type: ignore[arg-type]
        }
    )


def _build_emulator_tables(database_url: str) -> None:
    """The emulator's tables, as its first request creates them (no account seeded: no row)."""
    from flask_gateway.emulator.models import db

    app = make_emulator(database_url)
    with app.app_context():
        create_all_safely(db.engine, db.metadata)
        db.engine.dispose()


#: ``databases.url(name, schema=EMULATOR_TABLES)``: a database with the emulator's tables already there (its
#: first request then only seeds the accounts).
EMULATOR_TABLES = Schema("emulator", _build_emulator_tables)


@pytest.fixture
def emulator_app(databases: Databases) -> Iterator[Flask]:
    """An emulator on the test's main database (``database_url``), its tables there already."""
    app = make_emulator(databases.url("main", schema=EMULATOR_TABLES))
    yield app
    from flask_gateway.emulator.models import db

    with app.app_context():
        db.engine.dispose()


@pytest.fixture
def emulator_client(emulator_app: Flask) -> FlaskClient:
    return emulator_app.test_client()


@pytest.fixture
def gateway(emulator_client: FlaskClient) -> Gateway:
    return Gateway(emulator_client)


@pytest.fixture
def installed(gateway: Gateway) -> Gateway:
    """A gateway with the demo account installed (limits 100..10,000,000 cents)."""
    gateway.install()
    return gateway


@pytest.fixture
def stopped_clock(monkeypatch: pytest.MonkeyPatch) -> datetime:
    """The emulator's clock stopped at the last whole second (never ahead of the wall clock, which the
    delivery worker's leases and its look for due work still read); only its offset moves it
    (``/_emulator/clock/advance``). A time it stamps is exactly the one expected, and a delay not yet due
    stays so, however long the test takes on a loaded machine."""
    at = utcnow().replace(microsecond=0)
    monkeypatch.setattr(emulator_clock, "utcnow", lambda: at)
    return at
