"""Fixtures of the hostile-input tests: the extension + in-process emulator harness, and table snapshots."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, Table, create_engine, event, inspect, select
from sqlalchemy.pool import NullPool

from tests.conftest import Databases, dispose_engines
from tests.extension.conftest import Harness
from tests.extension.inbound_support import make_harness


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
    """The extension's test shop and the in-process emulator (tests/extension/conftest.py), on SQLite."""
    harness = make_harness(sqlite_databases, monkeypatch)
    with harness.shop.app_context():
        # Thousands of small commits: no fsync (a throwaway file; the test is about answers and rows).
        engine = harness.db.engine
        event.listen(engine, "connect", _no_sync)
        engine.dispose()
    yield harness
    with harness.shop.app_context():
        harness.db.engine.dispose()


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
