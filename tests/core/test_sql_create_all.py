"""``create_all_safely`` on both backends: it creates what is missing, and finds a complete schema in one
query for the table names."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import (
    Column,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    event,
    inspect,
)
from sqlalchemy.engine import Engine
from sqlalchemy.pool import NullPool

from flask_gateway.core.sql import create_all_safely

# The catalog queries differ between the backends (a PRAGMA a table on SQLite, pg_catalog on PostgreSQL).
pytestmark = pytest.mark.backends


def _metadata() -> MetaData:
    metadata = MetaData()
    Table(
        "parents", metadata, Column("id", Integer, primary_key=True), Column("name", String(20), index=True)
    )
    Table(
        "children",
        metadata,
        Column("id", Integer, primary_key=True),
        Column("parent_id", ForeignKey("parents.id")),
        Column("label", String(20)),
        Index("ix_children_parent_label", "parent_id", "label"),
    )
    return metadata


def _statements(engine: Engine) -> list[str]:
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _record(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        seen.append(statement)

    return seen


def _shape(engine: Engine) -> dict[str, set[str]]:
    found = inspect(engine)
    return {
        name: {index["name"] or "" for index in found.get_indexes(name)} for name in found.get_table_names()
    }


def test_it_creates_the_missing_tables_with_their_indexes(database_url: str):
    engine = create_engine(database_url, poolclass=NullPool)
    metadata = _metadata()
    metadata.tables["parents"].create(engine)
    create_all_safely(engine, metadata)
    assert _shape(engine) == {
        "parents": {"ix_parents_name"},
        "children": {"ix_children_parent_label"},
    }
    engine.dispose()


def test_a_complete_schema_costs_one_query_for_the_table_names(database_url: str, database_backend: str):
    engine = create_engine(database_url, poolclass=NullPool)
    metadata = _metadata()
    create_all_safely(engine, metadata)
    before = _shape(engine)
    statements = _statements(engine)
    create_all_safely(engine, metadata)
    catalog = [s for s in statements if "pg_advisory_xact_lock" not in s and s.strip() != "BEGIN"]
    assert _shape(engine) == before
    assert len(catalog) == 1, catalog
    assert "CREATE" not in catalog[0].upper()
    if database_backend == "postgresql":
        assert "pg_advisory_xact_lock" in statements[0]  # still under the lock
    engine.dispose()


def test_the_metadatas_own_ddl_listeners_still_run(database_url: str):
    engine = create_engine(database_url, poolclass=NullPool)
    metadata = _metadata()
    create_all_safely(engine, metadata)
    called: list[str] = []
    event.listen(metadata, "before_create", lambda *_args, **_kwargs: called.append("before_create"))
    create_all_safely(engine, metadata)
    assert called == ["before_create"]
    engine.dispose()
