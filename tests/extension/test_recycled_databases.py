"""PostgreSQL databases copied from a template are used again by a later test only as a fresh copy would be.

``Databases.drop`` hands a copy of a template back to the cluster (``PostgresCluster.recycle_database``),
which empties it in the background for another test (``tests/conftest.py``, ``tests/postgres.py``). Here,
on a schema of this module's own (so that no other test's database waits beside it): a database is used
again only with no row left and its sequences restarted; one whose shape a test changed (a column, a table,
an index, a function), or that something is still connected to, is dropped; and none can be connected to
while it waits.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Column, ForeignKey, Integer, MetaData, String, Table, create_engine
from sqlalchemy.pool import NullPool

from tests.conftest import Databases, Schema, fetch_all, new_connection, selected_backends
from tests.postgres import PostgresCluster

_metadata = MetaData()
Table(
    "recycled_items",
    _metadata,
    Column("id", Integer, primary_key=True),
    Column("label", String(20), index=True),
)
Table(
    "recycled_parts",
    _metadata,
    Column("id", Integer, primary_key=True),
    Column("item_id", ForeignKey("recycled_items.id")),
)


def _build(url: str) -> None:
    engine = create_engine(url, poolclass=NullPool)
    _metadata.create_all(engine)
    engine.dispose()


SCHEMA = Schema("recycle-test", _build)


@pytest.fixture
def cluster(request: pytest.FixtureRequest) -> PostgresCluster:
    if "postgresql" not in selected_backends(request.config):
        pytest.skip("PostgreSQL is not selected (--database=sqlite)")
    found: PostgresCluster = request.getfixturevalue("postgres_cluster")
    return found


@pytest.fixture
def fresh(cluster: PostgresCluster, tmp_path: Path) -> Iterator[Databases]:
    found = Databases(backend="postgresql", directory=tmp_path, cluster=cluster)
    yield found
    found.drop_all()


def _used(cluster: PostgresCluster, tmp_path: Path, change: str | None = None) -> str:
    """A test's database of ``SCHEMA``, written to (and changed by ``change``), handed back and waited for."""
    used = Databases(backend="postgresql", directory=tmp_path, cluster=cluster)
    url = used.url("main", schema=SCHEMA)
    with new_connection(url) as connection:
        connection.exec_driver_sql("INSERT INTO recycled_items (label) VALUES ('a'), ('b'), ('c')")
        # A value handed out by a table's sequence that holds no row (the parts: only their sequence used).
        connection.exec_driver_sql("SELECT nextval(pg_get_serial_sequence('recycled_parts', 'id'))")
        if change:
            connection.exec_driver_sql(change)
    used.drop_all()
    cluster._to_drop.join()  # the background thread recycled or dropped it
    return url


def _exists(cluster: PostgresCluster, url: str) -> bool:
    name = url.rsplit("/", 1)[1]
    return bool(fetch_all(cluster.url(), "SELECT 1 FROM pg_database WHERE datname = :name", name=name))


def test_a_recycled_database_is_empty_with_its_sequences_restarted(
    cluster: PostgresCluster, fresh: Databases, tmp_path: Path
):
    url = _used(cluster, tmp_path / "used")
    with pytest.raises(psycopg.OperationalError, match="not currently accepting connections"):
        psycopg.connect(url.replace("postgresql+psycopg", "postgresql")).close()  # waiting: nobody gets in
    again = fresh.url("main", schema=SCHEMA)
    assert again == url  # the same database, given to the next test
    assert fetch_all(again, "SELECT count(*) FROM recycled_items") == [(0,)]
    assert fetch_all(again, "SELECT count(*) FROM recycled_parts") == [(0,)]
    with new_connection(again) as connection:
        first = connection.exec_driver_sql("INSERT INTO recycled_items (label) VALUES ('x') RETURNING id")
        assert first.scalar_one() == 1  # as in a fresh copy of the template
        part = connection.exec_driver_sql("INSERT INTO recycled_parts (item_id) VALUES (1) RETURNING id")
        assert part.scalar_one() == 1
    tables = ("public.recycled_items", "public.recycled_parts")
    assert cluster.shape_of(again.rsplit("/", 1)[1]).tables == tables


@pytest.mark.parametrize(
    "change",
    [
        "ALTER TABLE recycled_items ADD COLUMN extra integer",
        "ALTER TABLE recycled_items ALTER COLUMN label TYPE varchar(30)",
        "CREATE TABLE other_items (id integer)",
        "CREATE INDEX ix_recycled_items_id_label ON recycled_items (id, label)",
        "DROP INDEX ix_recycled_items_label",
        "CREATE FUNCTION answer() RETURNS integer LANGUAGE sql AS 'SELECT 42'",
        "CREATE SCHEMA elsewhere",
        "ALTER TABLE recycled_items ALTER COLUMN label SET DEFAULT 'x'",
    ],
    ids=["column", "type", "table", "index", "dropped-index", "function", "schema", "default"],
)
def test_a_database_whose_shape_changed_is_dropped(
    cluster: PostgresCluster, fresh: Databases, tmp_path: Path, change: str
):
    url = _used(cluster, tmp_path / "used", change)
    assert not _exists(cluster, url)
    assert fresh.url("main", schema=SCHEMA) != url


def test_a_database_something_is_still_connected_to_is_dropped(
    cluster: PostgresCluster, fresh: Databases, tmp_path: Path
):
    used = Databases(backend="postgresql", directory=tmp_path / "used", cluster=cluster)
    url = used.url("main", schema=SCHEMA)
    lingering = psycopg.connect(url.replace("postgresql+psycopg", "postgresql"), autocommit=True)
    try:
        used.drop_all()
        cluster._to_drop.join()
        assert not _exists(cluster, url)
    finally:
        lingering.close()
    assert fresh.url("main", schema=SCHEMA) != url
