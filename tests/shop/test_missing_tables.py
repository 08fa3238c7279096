"""A shop started before its tables exist (``flask --app example_shop run`` before ``shop init-db``): its
pages, the admin screens and the gateway-facing URLs answer 503 naming the command that creates them, with
one log line per spell, never a 500 and a traceback per request."""

from __future__ import annotations

import logging

import pytest

from example_shop import create_app
from example_shop.outages import INIT_COMMAND
from flask_gateway.core.outages import is_missing_schema
from tests.conftest import Databases
from tests.shop.conftest import init_db, shop_config

MISSING = "tables are missing in the database"


def _lines(caplog: pytest.LogCaptureFixture, words: str) -> list[logging.LogRecord]:
    return [record for record in caplog.records if words in record.getMessage()]


@pytest.mark.backends
def test_every_kind_of_page_answers_503_naming_the_command_and_logs_once(
    databases: Databases, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    app = create_app(shop_config(databases.url()))  # no init-db
    client = app.test_client()

    home = client.get("/")
    assert home.status_code == 503 and home.headers["Retry-After"] == "5"
    assert "flask --app example_shop shop init-db" in home.get_data(as_text=True)
    as_json = client.get("/", headers={"Accept": "application/json"})
    assert as_json.status_code == 503
    assert INIT_COMMAND in as_json.json["message"]
    callback = client.post("/gateway/callback", data=b"{}", content_type="application/json")
    assert callback.status_code == 503 and "Retry-After" in callback.headers  # the gateway retries it
    assert "init-db" in callback.json["message"]
    admin = client.get("/gateway/admin/")
    assert admin.status_code in (302, 503), admin.status_code  # the shop's login wall first, or the page

    assert len(_lines(caplog, MISSING)) == 1  # one line for the spell, whatever the number of requests
    # No 500 ("Exception on / [GET]" with its traceback) for any of them.
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]

    init_db(app)
    assert client.get("/").status_code == 200
    assert len(_lines(caplog, "the tables are there again")) == 1


def test_a_missing_table_is_told_from_an_outage_and_from_other_errors() -> None:
    from sqlalchemy.exc import IntegrityError, OperationalError, ProgrammingError

    class Driver(Exception):
        def __init__(self, message: str, sqlstate: str | None = None) -> None:
            super().__init__(message)
            self.sqlstate = sqlstate

    assert is_missing_schema(OperationalError("SELECT", {}, Driver("no such table: shop_orders")))
    assert is_missing_schema(OperationalError("SELECT", {}, Driver("no such column: shop_orders.note")))
    assert is_missing_schema(ProgrammingError("SELECT", {}, Driver('relation "x" does not exist', "42P01")))
    assert is_missing_schema(ProgrammingError("SELECT", {}, Driver('column "y" does not exist', "42703")))
    assert not is_missing_schema(OperationalError("SELECT", {}, Driver("database is locked")))
    assert not is_missing_schema(ProgrammingError("SELECT", {}, Driver("syntax error", "42601")))
    assert not is_missing_schema(IntegrityError("INSERT", {}, Driver("UNIQUE constraint failed")))
