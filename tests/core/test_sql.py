"""flask_gateway.core.sql on both backends: aware UTC datetimes whatever the server's time zone, and text
that every backend can store (``storable_text``, the ``StoredText`` column type)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, Text, create_engine, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import DataError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column
from sqlalchemy.pool import NullPool
from sqlalchemy.schema import CreateColumn

from flask_gateway.core.sql import (
    StoredText,
    UTCDateTime,
    create_all_safely,
    hold_as_stored,
    storable_text,
    stored_type,
)
from flask_gateway.emulator.models import EmulatorBase
from flask_gateway.models import GatewayBase
from tests.conftest import fetch_all
from tests.postgres import TIMEZONE

# Time zones, U+0000 and column lengths: what each backend stores in its own way.
pytestmark = pytest.mark.backends

metadata = MetaData()
moments = Table(
    "moments",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("at", UTCDateTime()),
    Column("label", String(10)),
)


def test_utc_datetimes_round_trip_whatever_the_session_time_zone(database_url, database_backend):
    if database_backend == "postgresql":  # the test cluster's sessions are not on UTC: that is the point
        assert fetch_all(database_url, "SHOW timezone") == [(TIMEZONE,)]
    engine = create_engine(database_url, poolclass=NullPool)
    create_all_safely(engine, metadata)
    create_all_safely(engine, metadata)  # a second run (another process starting) finds the tables
    johannesburg = datetime(2024, 2, 29, 23, 30, 15, 123456, tzinfo=timezone(timedelta(hours=2)))
    with engine.begin() as connection:
        connection.execute(insert(moments).values(id=1, at=johannesburg, label="x"))
        stored = connection.execute(select(moments.c.at)).scalar_one()
        later = connection.execute(
            select(moments.c.id).where(moments.c.at > datetime(2024, 2, 29, 21, 30, 15, tzinfo=UTC))
        ).all()
    assert stored == johannesburg and stored.tzinfo is UTC
    assert stored.isoformat() == "2024-02-29T21:30:15.123456+00:00"
    assert later == [(1,)]
    engine.dispose()


def test_naive_datetimes_are_refused(database_url):
    engine = create_engine(database_url, poolclass=NullPool)
    create_all_safely(engine, metadata)
    with pytest.raises(Exception, match="naive datetime"), engine.begin() as connection:
        connection.execute(insert(moments).values(id=1, at=datetime(2024, 1, 1)))
    engine.dispose()


def test_storable_text_fits_every_backend(database_url):
    engine = create_engine(database_url, poolclass=NullPool)
    create_all_safely(engine, metadata)
    label = storable_text("a\x00b" + "c" * 20, 10)
    with engine.begin() as connection:
        connection.execute(insert(moments).values(id=1, label=label))
        assert connection.execute(select(moments.c.label)).scalar_one() == "a\ufffdbccccccc"
    engine.dispose()
    assert storable_text("plain") == "plain"


class NotesBase(DeclarativeBase):
    pass


hold_as_stored(NotesBase)


class Note(NotesBase):
    """Outside text in ``StoredText`` columns beside an identifier in a plain ``String``."""

    __tablename__ = "notes"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    token: Mapped[str] = mapped_column(String(10), unique=True)
    status: Mapped[str | None] = mapped_column(StoredText(10))
    body: Mapped[str | None] = mapped_column(StoredText())


NUL_AND_LONG = "a\x00b" + "c" * 20


def test_stored_text_stores_what_storable_text_makes_on_every_backend(database_url):
    """PostgreSQL would refuse U+0000 and a value over ``VARCHAR(10)``, SQLite would keep both: each
    stores ``storable_text(value, length)``, through the ORM and through Core statements alike."""
    engine = create_engine(database_url, poolclass=NullPool)
    create_all_safely(engine, NotesBase.metadata)
    with Session(engine) as session:
        note = Note(id=1, token="tok-1", status=NUL_AND_LONG, body=NUL_AND_LONG)
        # The object holds what its row will hold from assignment on (hold_as_stored), as it does after
        # it is read again.
        assert (note.status, note.body) == ("a\ufffdbccccccc", "a\ufffdb" + "c" * 20)
        session.add(note)
        session.commit()
        assert (note.status, note.body) == ("a\ufffdbccccccc", "a\ufffdb" + "c" * 20)
        note.body = "\x00z"
        assert note.body == "\ufffdz"
        session.rollback()
    table = NotesBase.metadata.tables["notes"]
    with engine.begin() as connection:
        connection.execute(insert(table).values(id=2, token="tok-2", status="\x00" * 30, body="x\x00"))
        connection.execute(update(table).where(table.c.id == 1).values(body="\x00y"))
        rows = connection.execute(select(table.c.status, table.c.body).order_by(table.c.id)).all()
        assert [tuple(row) for row in rows] == [("a\ufffdbccccccc", "\ufffdy"), ("\ufffd" * 10, "x\ufffd")]
        # A compared value has U+0000 replaced (no refusal from PostgreSQL) but is never cut: the value
        # over the column's length matches no row, not the row its first 10 characters would.
        found = connection.execute(select(table.c.id).where(table.c.body == "x\x00")).scalars().all()
        assert found == [2]
        assert connection.execute(select(table.c.id).where(table.c.status == NUL_AND_LONG)).all() == []
        cut = storable_text(NUL_AND_LONG, 10)
        assert connection.execute(select(table.c.id).where(table.c.status.in_([cut]))).scalars().all() == [1]
    engine.dispose()


def test_an_identifier_column_is_never_altered_for_a_lookup(database_url, database_backend):
    """A plain ``String`` identifier compares the value as given: U+0000 or a value over the length never
    becomes the token of another row (PostgreSQL refuses U+0000 even in a query: what the lookups that
    guard against it, such as a callback's token, answer as not found)."""
    engine = create_engine(database_url, poolclass=NullPool)
    create_all_safely(engine, NotesBase.metadata)
    table = NotesBase.metadata.tables["notes"]
    with engine.begin() as connection:
        connection.execute(insert(table).values(id=1, token="tok-\ufffd"))
        connection.execute(insert(table).values(id=2, token="tok-123456"))
        assert connection.execute(select(table.c.id).where(table.c.token == "tok-1234567")).all() == []
    lookup = select(table.c.id).where(table.c.token == "tok-\x00")
    if database_backend == "postgresql":
        with pytest.raises(DataError), engine.begin() as connection:
            connection.execute(lookup)
    else:
        with engine.begin() as connection:
            assert connection.execute(lookup).all() == []
    engine.dispose()


def test_stored_text_has_the_ddl_of_text_and_string():
    """The same DDL as ``Text()`` and ``String(length)`` (a column that becomes one needs no migration),
    and those are the types migrations are written with (``stored_type``)."""
    for dialect in (postgresql.dialect(), sqlite.dialect()):
        for name, type_ in (("status", String(10)), ("body", Text())):
            ours = CreateColumn(NotesBase.metadata.tables["notes"].c[name]).compile(dialect=dialect)
            assert str(ours) == str(CreateColumn(Column(name, type_)).compile(dialect=dialect))
    assert isinstance(stored_type(StoredText()), Text)
    stored = stored_type(StoredText(40))
    assert isinstance(stored, String) and type(stored) is String and stored.length == 40
    assert repr(StoredText(40)) == "StoredText(length=40)"


@pytest.mark.parametrize("base", [GatewayBase, EmulatorBase], ids=["extension", "emulator"])
def test_no_identifier_column_is_stored_text(base):
    """What identifies a row and is looked up (a key, a unique or indexed column, a token, a reference, an
    account or request id) keeps a plain type: a value no row can hold must find nothing, never be made
    into another row's value."""
    identifying = ("token", "reference", "account", "request_id", "key", "job")
    for table in base.metadata.tables.values():
        indexed = {column.name for index in table.indexes for column in index.columns}
        for column in table.columns:
            if not isinstance(column.type, StoredText):
                continue
            where = f"{table.name}.{column.name}"
            assert not (column.primary_key or column.unique or column.foreign_keys), where
            assert column.name not in indexed, where
            assert not any(word in column.name for word in identifying), where
