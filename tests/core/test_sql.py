"""flask_gateway.core.sql on both backends: aware UTC datetimes whatever the server's time zone, and text
that every backend can store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, insert, select
from sqlalchemy.pool import NullPool

from flask_gateway.core.sql import UTCDateTime, create_all_safely, storable_text
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
