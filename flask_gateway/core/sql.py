"""SQLAlchemy helpers shared by the emulator and the extension (no Flask here).

- ``UTCDateTime`` stores aware UTC datetimes on every backend (SQLite has no time zones).
- ``storable_text`` makes outside text fit a text column on every backend (PostgreSQL refuses U+0000 and
  enforces ``VARCHAR`` lengths; SQLite takes anything).
- ``configure_sqlite`` makes SQLite safe under a threaded server: WAL (synchronous=NORMAL), a busy timeout,
  and ``BEGIN IMMEDIATE`` so a transaction that reads then writes holds the write lock from its start
  (SQLite's stand-in for the row locks PostgreSQL takes with ``SELECT ... FOR UPDATE``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import DateTime, MetaData, event
from sqlalchemy.engine import Dialect, Engine
from sqlalchemy.types import TypeDecorator

__all__ = ["UTCDateTime", "configure_sqlite", "create_all_safely", "storable_text"]


class UTCDateTime(TypeDecorator[datetime]):
    """An aware UTC datetime on the way in and out, whatever the backend stores."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("refusing to store a naive datetime: attach tzinfo=UTC")
        utc = value.astimezone(UTC)
        return utc.replace(tzinfo=None) if dialect.name == "sqlite" else utc

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        moment = datetime.fromisoformat(value) if isinstance(value, str) else value
        if not isinstance(moment, datetime):
            raise TypeError(f"expected a datetime from the database, got {type(moment).__name__}")
        return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def storable_text(value: str, max_length: int | None = None) -> str:
    """``value`` as a text column keeps it on every backend: U+0000 becomes U+FFFD, cut to ``max_length``."""
    text = value.replace("\x00", "\ufffd")
    return text if max_length is None else text[:max_length]


def configure_sqlite(engine: Engine, *, busy_timeout_ms: int = 30_000) -> None:
    """WAL, busy timeout and ``BEGIN IMMEDIATE`` for a SQLite engine; no-op for other backends."""
    if engine.dialect.name != "sqlite" or getattr(engine, "_flask_gateway_configured", False):
        return

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN instead of the driver's implicit (deferred) one.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        # With WAL, NORMAL syncs at checkpoints rather than at every commit: the database cannot be
        # corrupted, and only a power cut (not a crash of the process) can lose the last commits.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    engine._flask_gateway_configured = True  # type: ignore[attr-defined]
    engine.dispose()  # connections opened before the listeners existed lack the settings


def create_all_safely(engine: Engine, metadata: MetaData) -> None:
    """``metadata.create_all`` that several processes may run at once (PostgreSQL: under an advisory lock)."""
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7305213)")
        metadata.create_all(connection)
