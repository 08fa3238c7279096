"""Every test's databases start empty and correctly shaped, though their tables are copied from a template
built once per worker (``databases.url(name, schema=...)``, tests/conftest.py).

The pair below run on the same worker (one xdist group), in either order: each first finds every table of
the shop's and the emulator's databases empty and shaped as the apps' metadata says, then writes rows to
them. Whichever runs second fails if a row of the other leaked (into a template or a reused database).
"""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import MetaData, create_engine, func, inspect, select
from sqlalchemy.pool import NullPool

from example_shop.extensions import db as example_shop_db
from flask_gateway.emulator.models import db as emulator_db
from tests.conftest import Databases
from tests.extension.conftest import build_harness
from tests.shop.conftest import make_harness as make_shop_harness

pytestmark = [pytest.mark.backends, pytest.mark.xdist_group("fresh-databases")]


def _shape_and_rows(url: str) -> tuple[dict[str, set[str]], dict[str, set[str]], dict[str, int]]:
    """Each table's columns, its index names, and its row count, in the database at ``url``."""
    engine = create_engine(url, poolclass=NullPool)
    try:
        with engine.connect() as connection:
            found = MetaData()
            found.reflect(connection)
            shape = {name: {column.name for column in table.columns} for name, table in found.tables.items()}
            indexes = {
                name: {str(index["name"]) for index in inspect(connection).get_indexes(name)}
                for name in found.tables
            }
            rows = {
                name: connection.execute(select(func.count()).select_from(table)).scalar_one()
                for name, table in found.tables.items()
            }
    finally:
        engine.dispose()
    return shape, indexes, rows


def _empty_and_shaped(url: str, metadata: MetaData) -> None:
    shape, indexes, rows = _shape_and_rows(url)
    assert shape == {
        name: {column.name for column in table.columns} for name, table in metadata.tables.items()
    }
    for name, table in metadata.tables.items():
        assert {str(index.name) for index in table.indexes} <= indexes[name], name
    assert {name: count for name, count in rows.items() if count} == {}


def _writes_and_starts_empty(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> None:
    # The extension's test shop and its emulator (tests/extension/conftest.py): before any request.
    harness = build_harness(databases, monkeypatch)
    _empty_and_shaped(databases.url("main"), harness.db.metadata)
    _empty_and_shaped(databases.url("emulator"), emulator_db.metadata)
    harness.install()  # rows on both sides: the shop's installation, the emulator's accounts and keys
    assert _shape_and_rows(databases.url("main"))[2]["gateway_installations"] == 1
    assert _shape_and_rows(databases.url("emulator"))[2]["emulator_accounts"] >= 1

    # The example shop and its emulator (tests/shop/conftest.py), not installed yet.
    shop = make_shop_harness(databases, monkeypatch, install=False)
    with shop.app.app_context():
        metadata: Any = example_shop_db.metadata
    _empty_and_shaped(databases.url("shop"), metadata)
    _empty_and_shaped(databases.url("shop-emulator"), emulator_db.metadata)
    assert shop.install() == "installed"
    assert _shape_and_rows(databases.url("shop"))[2]["gateway_installations"] == 1


@pytest.mark.parametrize("turn", ["one", "two"])
def test_each_test_starts_from_empty_correctly_shaped_tables(databases, monkeypatch, turn):
    _writes_and_starts_empty(databases, monkeypatch)
