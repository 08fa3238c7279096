"""SQLAlchemy helpers shared by the emulator and the extension (no Flask here).

- ``UTCDateTime`` stores aware UTC datetimes on every backend (SQLite has no time zones).
- ``copy_tables_as_stored`` puts a copy of some tables into another ``MetaData`` (the extension's into the
  shop's) with the types the database stores: Alembic's autogenerate writes those as ``sa.DateTime(...)``,
  a migration script that runs with no import of ours. ``alembic_render_item`` does the same for a shop's
  own ``UTCDateTime`` columns (``Migrate(app, db, render_item=alembic_render_item)``; docs/migrations.md).
- ``StoredText`` is the column type of free text from outside (a callback's body, the gateway's error, a
  status as reported): on every backend it stores what ``storable_text`` makes of a value (PostgreSQL
  refuses U+0000 and enforces ``VARCHAR`` lengths; SQLite takes anything), and ``hold_as_stored`` makes a
  model's attribute hold that value from assignment.
- ``configure_sqlite`` makes SQLite safe under threads and processes writing one file, SQLAlchemy's
  documented pysqlite recipe: the driver's own ``BEGIN`` off, ``BEGIN IMMEDIATE`` from the engine's
  "begin" event, so a transaction that reads then writes holds the write lock from its start (SQLite's
  stand-in for the row locks PostgreSQL takes with ``SELECT ... FOR UPDATE``), and a busy timeout long
  enough that a writer waits for the one before it rather than failing; WAL (synchronous=NORMAL).
- ``sqlite_read_transactions`` lets read-only work (a status poll) begin its transactions DEFERRED: readers
  then never wait for, nor hold up, the write lock. Code inside that may write after all calls
  ``begin_writing`` first, which ends the read transaction so that the next one begins IMMEDIATE.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any, Final, Literal

from sqlalchemy import DateTime, MetaData, String, Table, Text, event, inspect
from sqlalchemy.engine import Connection, Dialect, Engine
from sqlalchemy.orm import Mapper, Session
from sqlalchemy.types import TypeDecorator, TypeEngine

__all__ = [
    "EMULATOR_TABLE_PREFIX",
    "StoredText",
    "UTCDateTime",
    "alembic_include_name",
    "alembic_render_item",
    "begin_writing",
    "commit_keeping_loaded",
    "configure_sqlite",
    "copy_tables_as_stored",
    "create_all_safely",
    "hold_as_stored",
    "sqlite_in_memory",
    "sqlite_read_transactions",
    "statement_by_statement",
    "storable_text",
]

#: True inside ``sqlite_read_transactions``: a new SQLite transaction begins DEFERRED (per thread/context).
_DEFERRED_BEGIN: ContextVar[bool] = ContextVar("flask_gateway_sqlite_deferred_begin", default=False)
#: ``Connection.info`` key: the current transaction on this connection began DEFERRED.
_BEGAN_DEFERRED: Final = "flask_gateway_began_deferred"


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


class StoredText(TypeDecorator[str]):
    """Free text from outside, as every backend stores it: a value written to the column is
    ``storable_text(value, length)`` (U+0000 becomes U+FFFD, cut to ``length``), which PostgreSQL takes
    where it would refuse the value itself and SQLite would keep it whole.

    ``length``: None is a ``TEXT`` column (``Text()``), a number a ``VARCHAR(length)`` (``String(length)``):
    the same DDL as those, so a column that becomes a ``StoredText`` needs no migration.

    A value compared with the column in a query (``==``, ``in_``, ``LIKE``) has U+0000 replaced, so
    PostgreSQL does not refuse the query, but is never cut: a value longer than the column matches no row
    rather than the row of its first ``length`` characters. Still, never use it on a column that
    identifies a row and is looked up (a token, a reference, an account id, a request id): there a value
    no row can hold is refused or finds nothing before the query. ``hold_as_stored`` makes the models'
    attributes hold the stored value from assignment on.
    """

    impl: TypeEngine[Any] | type[TypeEngine[Any]] = Text
    cache_ok = True

    def __init__(self, length: int | None = None) -> None:
        super().__init__()
        self.length = length
        if length is not None:
            self.impl = String(length)

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else storable_text(value, self.length)

    def coerce_compared_value(self, op: Any, value: Any) -> TypeEngine[Any]:
        return _COMPARED_TEXT


#: The type of a value compared with a ``StoredText`` column: U+0000 replaced, the length left whole.
_COMPARED_TEXT: Final = StoredText()


def hold_as_stored(base: type[Any]) -> None:
    """Each ``StoredText`` attribute of the models of ``base`` (a declarative base, before its mappers are
    configured) holds ``storable_text`` of what is assigned to it (constructor arguments included): the
    object says what its row says before it is read again (a signal's receiver, the log line, a page
    rendered after a commit that kept it loaded). Values written without the ORM attributes
    (``insert().values(...)``, ``update().values(...)``) are made storable by the type alone."""

    @event.listens_for(base, "mapper_configured", propagate=True)
    def _configured(mapper: Mapper[Any], class_: type[Any]) -> None:
        for prop in mapper.column_attrs:
            type_ = prop.columns[0].type
            if isinstance(type_, StoredText):
                event.listen(prop.class_attribute, "set", _holder(type_.length), retval=True)


def _holder(length: int | None) -> Any:
    def _as_stored(_target: Any, value: Any, _old: Any, _initiator: Any) -> Any:
        return storable_text(value, length) if isinstance(value, str) else value

    return _as_stored


def stored_type(type_: TypeEngine[Any]) -> TypeEngine[Any]:
    """The type as the database stores it: ``DateTime(timezone=True)`` for a ``UTCDateTime`` (its DDL on
    every backend), ``Text()`` or ``String(length)`` for a ``StoredText``, any other type as it is."""
    if isinstance(type_, UTCDateTime):
        return DateTime(timezone=True)
    if isinstance(type_, StoredText):
        return Text() if type_.length is None else String(type_.length)
    return type_


def copy_tables_as_stored(source: MetaData, target: MetaData) -> list[Table]:
    """Copy each table of ``source`` that ``target`` lacks into ``target``, with the types the database
    stores (``stored_type``); returns the copies.

    The copies describe the schema: ``create_all`` on ``target`` creates the same tables, and Alembic's
    autogenerate (Flask-Migrate) writes their columns as ``sa.DateTime(timezone=True)``, which a migration
    script runs without importing anything of ours (a ``UTCDateTime`` it would write as
    ``flask_gateway.core.sql.UTCDateTime(...)`` without the import: a ``NameError`` at ``upgrade``). Read
    and write the rows through ``source``'s tables (the models mapped to them), which convert the values.
    """
    copies = []
    for table in source.sorted_tables:
        if table.key in target.tables:
            continue
        copy = table.to_metadata(target)
        for column in copy.columns:
            column.type = stored_type(column.type)
        copies.append(copy)
    return copies


def alembic_render_item(type_: str, obj: Any, autogen_context: Any) -> str | Literal[False]:
    """An Alembic ``render_item`` hook: a shop's own ``UTCDateTime`` column is written into migration
    scripts as ``sa.DateTime(timezone=True)`` (what the database stores), so the script needs no import.

    Pass it once: ``Migrate(app, db, render_item=alembic_render_item)`` (Flask-Migrate hands it to
    Alembic's ``context.configure``). Everything else is left to Alembic (``False``). The extension's own
    tables need no hook (``copy_tables_as_stored``). Alembic is not imported here: it calls the hook with
    its ``AutogenContext``, whose ``opts["sqlalchemy_module_prefix"]`` is the ``sa.`` of the scripts.
    """
    if type_ != "type" or not isinstance(obj, UTCDateTime):
        return False
    prefix = autogen_context.opts.get("sqlalchemy_module_prefix") or ""
    return f"{prefix}{stored_type(obj)!r}"


#: The gateway emulator's tables. They are in a shop's database only with the embedded emulator (development
#: and tests), and are never the shop's to migrate.
EMULATOR_TABLE_PREFIX: Final = "emulator_"


def alembic_include_name(name: str | None, type_: str, parent_names: Any) -> bool:
    """An Alembic ``include_name`` hook: autogenerate leaves the embedded emulator's tables alone.

    With ``GATEWAY_ENVIRONMENT="embedded"`` the emulator keeps its ``emulator_*`` tables in the shop's
    database; they are not in the shop's metadata, so autogenerate would write ``op.drop_table`` for each.
    Pass it once: ``Migrate(app, db, include_name=alembic_include_name)`` (docs/migrations.md). Every other
    name is included, so it is harmless where no emulator is embedded.
    """
    return not (type_ == "table" and name is not None and name.startswith(EMULATOR_TABLE_PREFIX))


def sqlite_in_memory(engine: Engine) -> bool:
    """A SQLite database in memory (``sqlite://``, ``:memory:``, ``mode=memory``): no file, and one
    connection for the whole app, so it cannot be shared between threads or reopened by another engine."""
    if engine.dialect.name != "sqlite":
        return False
    database = engine.url.database or ""
    return database in ("", ":memory:") or "mode=memory" in str(engine.url)


#: How long a SQLite writer of the extension or the emulator waits for the write lock before "database is
#: locked" (ms). Their write transactions take milliseconds (none is held across a call to the gateway or
#: the shop), the longest a second or so on a loaded machine (``create_all`` of every table at a first
#: start). 30 s lets a writer wait behind many of them in a row (SQLite's busy handler is not first come,
#: first served), and is short enough that a lock nobody gives back (an open ``sqlite3`` shell) ends in an
#: error a person sees rather than a hang.
BUSY_TIMEOUT_MS: Final = 30_000


def configure_sqlite(engine: Engine, *, busy_timeout_ms: int = BUSY_TIMEOUT_MS, wal: bool = True) -> None:
    """SQLAlchemy's pysqlite recipe on ``engine`` (the extension's own or the emulator's, never the shop's):
    each transaction begins ``BEGIN IMMEDIATE`` (``BEGIN``, no write lock, inside
    ``sqlite_read_transactions``), and each connection waits up to ``busy_timeout_ms`` for the write lock
    before SQLite raises "database is locked" (``OperationalError``); with ``wal`` the file is put in WAL
    mode (``synchronous=NORMAL``; a setting of the file, so every connection to it uses WAL). Also
    ``foreign_keys=ON``. Connections already open are closed. A no-op on other backends and the second
    time."""
    if engine.dialect.name != "sqlite" or getattr(engine, "_flask_gateway_configured", False):
        return

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy's "begin" event issue BEGIN instead of the driver's implicit (deferred) one.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        # First: the PRAGMAs below may wait for the file too (journal_mode=WAL on a file another
        # process is creating).
        cursor.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        if wal:
            cursor.execute("PRAGMA journal_mode=WAL")
            # With WAL, NORMAL syncs at checkpoints rather than at every commit: the database cannot be
            # corrupted, and only a power cut (not a crash of the process) can lose the last commits.
            cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        deferred = _DEFERRED_BEGIN.get()
        connection.info[_BEGAN_DEFERRED] = deferred
        connection.exec_driver_sql("BEGIN" if deferred else "BEGIN IMMEDIATE")

    engine._flask_gateway_configured = True  # type: ignore[attr-defined]
    engine.dispose()  # connections opened before the listeners existed lack the settings


@contextmanager
def sqlite_read_transactions() -> Iterator[None]:
    """Transactions that begin inside the block are read-only ones (SQLite: ``BEGIN`` DEFERRED, no write
    lock; other backends: no change). Anything inside that writes must call ``begin_writing`` first."""
    token = _DEFERRED_BEGIN.set(True)
    try:
        yield
    finally:
        _DEFERRED_BEGIN.reset(token)


def begin_writing(session: Session) -> None:
    """About to write (or take a row lock): leave read-only mode for the rest of the block.

    When the session's current SQLite transaction began DEFERRED it is committed first (it only read), so
    that the next statement begins an IMMEDIATE one: a DEFERRED transaction that tries to write after
    another connection committed fails at once (SQLITE_BUSY_SNAPSHOT) instead of waiting. Objects loaded
    so far are expired by that commit and read again when used. A no-op outside read-only mode.
    """
    if not _DEFERRED_BEGIN.get():
        return
    _DEFERRED_BEGIN.set(False)
    if session.in_transaction() and session.connection().info.get(_BEGAN_DEFERRED):
        session.commit()


def statement_by_statement(session: Session) -> None:
    """Until its next commit or rollback, each statement of ``session`` commits on its own: on PostgreSQL
    autocommit (no ``BEGIN`` and ``COMMIT`` round trips); the pool resets the connection's mode when the
    session gives it back. Other databases keep the transaction (SQLite: ``BEGIN IMMEDIATE`` takes the
    write lock a later INSERT needs). For steps of one statement each with nothing to undo together."""
    if not session.in_transaction() and session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})


def commit_keeping_loaded(session: Session) -> None:
    """Commit without expiring the objects the session holds: for a commit in the middle of a request
    whose rows nobody else changes meanwhile (a log row just written, the account it authenticated), so
    that using them afterwards does not read each one again."""
    before = session.expire_on_commit
    session.expire_on_commit = False
    try:
        session.commit()
    finally:
        session.expire_on_commit = before


def create_all_safely(engine: Engine, metadata: MetaData) -> None:
    """``metadata.create_all`` that several processes may run at once (PostgreSQL: under an advisory lock).

    When every table is there already (each start after the first) it costs one query for the table names,
    not one per table: ``create_all`` would create nothing. It runs whenever a table is missing, or the
    metadata holds sequences, tables in a named schema or its own DDL listeners."""
    with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7305213)")
        if not _all_tables_exist(connection, metadata):
            metadata.create_all(connection)


def _all_tables_exist(connection: Connection, metadata: MetaData) -> bool:
    """Every table of ``metadata`` exists in the connection's default schema, and ``create_all`` would do
    nothing else (no sequence, no table in another schema, no listener of the metadata's own)."""
    tables = list(metadata.tables.values())
    if (
        not tables
        or metadata._sequences
        or metadata.dispatch.before_create
        or metadata.dispatch.after_create
        or any(table.schema is not None for table in tables)
    ):
        return False
    existing = set(inspect(connection).get_table_names())
    return all(table.name in existing for table in tables)
