"""``flask_gateway.core.outages``: which database errors are outages, the one-line description, and the
watch that logs one line when an outage starts and one when it ends (no Flask)."""

from __future__ import annotations

import logging
import threading

import pytest
from sqlalchemy import create_engine
from sqlalchemy.exc import (
    DBAPIError,
    DisconnectionError,
    IntegrityError,
    InterfaceError,
    OperationalError,
    ProgrammingError,
)
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from flask_gateway.core.outages import (
    OutageWatch,
    describe_database_error,
    is_database_outage,
    ping,
)

LOGGER = "tests.outages"


def operational(message: str, statement: str = "SELECT 1") -> OperationalError:
    return OperationalError(statement, {}, Exception(message))


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def watch(clock: Clock) -> OutageWatch:
    return OutageWatch("shop", logging.getLogger(LOGGER), clock=clock)


def lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == LOGGER]


# --- is_database_outage ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error",
    [
        operational('connection to server at "db", port 5432 failed: Connection refused'),
        operational("server closed the connection unexpectedly"),
        operational("terminating connection due to administrator command"),
        operational("database is locked"),
        InterfaceError("SELECT 1", {}, Exception("connection already closed")),
        DisconnectionError("the pool's pre-ping failed"),
        PoolTimeoutError("QueuePool limit of size 5 overflow 10 reached"),
        DBAPIError("SELECT 1", {}, Exception("lost"), connection_invalidated=True),
    ],
    ids=[
        "refused",
        "closed",
        "terminated",
        "sqlite-locked",
        "interface",
        "disconnection",
        "pool-timeout",
        "invalidated",
    ],
)
def test_what_is_an_outage(error: Exception) -> None:
    """Each of these answers 503 (``DATABASE_ERRORS`` are the classes to register handlers for)."""
    assert is_database_outage(error)


@pytest.mark.parametrize(
    "error",
    [
        operational("no such table: gateway_checkouts"),
        operational("no such column: gateway_checkouts.flag_reason"),
        operational('near "SELEC": syntax error'),
        IntegrityError("INSERT", {}, Exception("duplicate key value violates unique constraint")),
        ProgrammingError("SELECT", {}, Exception('relation "gateway_refunds" does not exist')),
        ValueError("not a database error at all"),
    ],
    ids=["no-table", "no-column", "syntax", "integrity", "programming", "value"],
)
def test_what_is_not_an_outage(error: Exception) -> None:
    assert not is_database_outage(error)


def test_an_outage_raised_from_or_during_another_error_counts() -> None:
    def from_cause() -> None:
        try:
            raise operational("Connection refused")
        except OperationalError as cause:
            raise RuntimeError("the view failed") from cause

    def during() -> None:
        try:
            raise operational("server closed the connection unexpectedly")
        except OperationalError:
            raise KeyError("while handling it")  # noqa: B904 - the implicit context is what is tested

    with pytest.raises(RuntimeError) as wrapped:
        from_cause()
    assert is_database_outage(wrapped.value)
    with pytest.raises(KeyError) as context:
        during()
    assert is_database_outage(context.value)


def test_a_cycle_of_causes_ends() -> None:
    first, second = RuntimeError("a"), RuntimeError("b")
    first.__cause__, second.__cause__ = second, first
    assert not is_database_outage(first)


# --- describe_database_error -------------------------------------------------------------------------


def test_the_description_is_the_drivers_first_line_never_the_statement() -> None:
    error = operational(
        "connection failed: server closed the connection\n\tThis probably means the server terminated",
        statement="UPDATE shop_customers SET email = 'thandi@example.com'",
    )
    said = describe_database_error(error)
    assert said == "Exception: connection failed: server closed the connection"
    assert "thandi" not in said and "UPDATE" not in said
    assert describe_database_error(PoolTimeoutError("")) == "TimeoutError"
    assert len(describe_database_error(operational("x" * 1000))) < 250


# --- OutageWatch -----------------------------------------------------------------------------------


def test_one_line_when_an_outage_starts_and_one_when_it_ends(
    watch: OutageWatch, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    assert not watch.down
    assert watch.succeeded() is False  # up already: nothing said

    assert watch.failed(operational("Connection refused")) is True
    for _ in range(4):
        clock.now += 1
        assert watch.failed(operational("Connection refused")) is False
    assert watch.down and watch.refused == 5

    clock.now += 2.5
    assert watch.succeeded() is True
    assert watch.succeeded() is False
    assert not watch.down and watch.refused == 0
    assert lines(caplog) == [
        "shop: the database is unreachable (Exception: Connection refused): answering 503 with "
        "Retry-After until it answers again",
        "shop: the database answers again after 6.5 s (5 request(s) answered 503 meanwhile)",
    ]
    assert all(record.levelno == logging.WARNING and not record.exc_info for record in caplog.records)

    watch.failed(operational("Connection refused"))  # a second outage is announced again
    assert len(lines(caplog)) == 3


def test_many_threads_failing_at_once_say_it_once(
    watch: OutageWatch, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    barrier = threading.Barrier(8)

    def fail() -> None:
        barrier.wait()
        for _ in range(50):
            watch.failed(operational("Connection refused"))

    threads = [threading.Thread(target=fail) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert watch.refused == 400
    assert len(lines(caplog)) == 1


def test_a_probe_runs_only_while_down_and_at_most_once_per_interval(
    watch: OutageWatch, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger=LOGGER)
    calls: list[float] = []

    def refused() -> None:
        calls.append(clock.now)
        raise operational("Connection refused")

    assert watch.probe(refused) is True and calls == []  # up: not even tried

    watch.failed(operational("Connection refused"))
    assert watch.probe(refused) is False
    clock.now += 0.5
    assert watch.probe(refused) is False  # too soon: not tried
    clock.now += 0.6
    assert watch.probe(refused) is False
    assert calls == [100.0, 101.1]

    clock.now += 1
    assert watch.probe(lambda: None) is True
    assert not watch.down
    assert "answers again after 2.1 s" in lines(caplog)[-1]


def test_a_probe_that_meets_another_error_raises_it(watch: OutageWatch) -> None:
    watch.failed(operational("Connection refused"))

    def missing_table() -> None:
        raise operational("no such table: x")

    with pytest.raises(OperationalError, match="no such table"):
        watch.probe(missing_table)
    assert watch.down


def test_ping_makes_one_round_trip() -> None:
    engine = create_engine("sqlite://")
    ping(engine)
    broken = create_engine("sqlite:////nonexistent-directory/for/sure/db.sqlite3")
    with pytest.raises(OperationalError) as raised:
        ping(broken)
    assert is_database_outage(raised.value)
    engine.dispose()
    broken.dispose()
