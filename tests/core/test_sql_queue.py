"""The SQLite write queue (``core.sqlite_queue``): the threads of a process that write to one file take
turns in arrival order before ``BEGIN IMMEDIATE``, and every end of a transaction gives the turn back.

A turn that is not given back stops every writer of the file (until the busy timeout, 30 s here): the
tests of the ends of a transaction check that nobody holds the turn afterwards, and that another thread
writes.

No test here times anything: a test waits for the event itself (a thread's end, a state of the queue, a
line logged), with ``DEADLINE`` only as a last resort; how fast writers are handed the file is
``benchmarks/sqlite_writers.py``'s (``--handoff``, figure 8 of ``make bench``).
"""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, event, insert, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from flask_gateway.core.sql import begin_writing, configure_sqlite, sqlite_read_transactions
from flask_gateway.core.sqlite_queue import WriteQueue, queue_of

metadata = MetaData()
rows = Table("rows", metadata, Column("id", Integer, primary_key=True), Column("value", String(40)))

#: The last resort of a test waiting for an event (a thread's end, a state, a child's line): never a
#: figure, only how long to wait before saying what did not happen. Generous: CI runs on a loaded 2-core
#: machine, and what it waits for takes milliseconds on a quiet one.
DEADLINE = 60.0
#: A busy timeout no test waits out (an hour): a writer that waits for a turn or a lock file never given
#: back is then still waiting at the ``DEADLINE``, which says so, instead of giving up and writing anyway.
FOREVER_MS = 3_600_000
LOGGER = "flask_gateway.core.sqlite_queue"


@pytest.fixture(autouse=True, params=["process", "lock"])
def queue_setting(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test with the queue in each process only (the default) and with the lock file too."""
    setting: str = request.param
    monkeypatch.setenv("FLASK_GATEWAY_SQLITE_QUEUE", setting)
    return setting


@pytest.fixture
def make_engine(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def make(name: str = "queue.db", **options: object) -> Engine:
        engine = create_engine(f"sqlite:///{tmp_path / name}")
        configure_sqlite(engine, **options)  # type: ignore[arg-type]
        metadata.create_all(engine)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.dispose()


@pytest.fixture
def engine(make_engine: Callable[..., Engine]) -> Engine:
    return make_engine()


def the_queue(engine: Engine) -> WriteQueue:
    queue = queue_of(engine)
    assert queue is not None
    return queue


def wait_for(condition: Callable[[], bool], what: str, seconds: float = DEADLINE) -> None:
    """Wait until ``condition()`` holds (``what`` says what it is, for the failure)."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds:g} s for {what}"
        time.sleep(0.002)


def finish(thread: threading.Thread, what: str) -> None:
    """Join ``thread``, a last-resort deadline: ``what`` says what it was doing, for the failure."""
    thread.join(DEADLINE)
    assert not thread.is_alive(), f"waited {DEADLINE:g} s for {what}"


def in_thread(function: Callable[[], object], what: str) -> None:
    """Run ``function`` in another thread, to its end (its exception raised here)."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            function()
        except BaseException as error:  # handed to the test's thread
            errors.append(error)

    thread = threading.Thread(target=run)
    thread.start()
    finish(thread, what)
    if errors:
        raise errors[0]


def busy_timeouts_at_begin(engine: Engine) -> list[int]:
    """The connection's busy timeout (ms) at each ``BEGIN IMMEDIATE`` the engine issues from now on: 0
    for a ``BEGIN IMMEDIATE`` tried once without waiting."""
    seen: list[int] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _before(connection: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if statement == "BEGIN IMMEDIATE":
            dbapi_connection = connection.connection.dbapi_connection
            seen.append(dbapi_connection.execute("PRAGMA busy_timeout").fetchone()[0])

    return seen


def write(engine: Engine, value: str) -> None:
    with engine.begin() as connection:
        connection.execute(insert(rows).values(value=value))


def written(engine: Engine) -> list[str]:
    with sqlite_read_transactions(), engine.connect() as connection:
        return list(connection.scalars(select(rows.c.value).order_by(rows.c.id)))


def file_locked(path: str | Path) -> bool:
    """Someone holds an exclusive ``flock`` on ``path`` (another open file than any engine's: flock locks
    conflict between open files, in one process too)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing unlocks
    return False


def lock_file_of(engine: Engine) -> str:
    file_lock = the_queue(engine).file_lock
    assert file_lock is not None, "the engine does not use the lock file"
    return file_lock.path


def turn_given_back(engine: Engine, value: str = "other") -> None:
    """Nobody holds the turn nor the lock file, and another thread writes (SQLite's lock is free too: with
    a transaction left open its write would fail with "database is locked")."""
    queue = the_queue(engine)
    assert queue.holder_thread is None and queue.waiting == 0, "the turn was not given back"
    if queue.file_lock is not None:
        assert not file_locked(queue.file_lock.path), "the lock file was not given back"
    in_thread(lambda: write(engine, value), "another thread's write")
    assert queue.holder_thread is None


# --- the queue itself ------------------------------------------------------------------------------


def test_the_queue_serves_threads_in_arrival_order():
    queue = WriteQueue("test")
    first = queue.acquire()
    assert first is not None
    served: list[int] = []

    def take(number: int) -> None:
        turn = queue.acquire()
        assert turn is not None
        served.append(number)
        queue.release(turn)

    threads = []
    for number in range(8):
        threads.append(threading.Thread(target=take, args=(number,)))
        threads[-1].start()
        wait_for(lambda n=number: queue.waiting == n + 1, f"thread {number} in the line")  # type: ignore[misc]
    assert queue.release(first)
    for number, thread in enumerate(threads):
        finish(thread, f"thread {number} to be served")
    assert served == list(range(8))
    assert queue.holder_thread is None and queue.waiting == 0
    assert not queue.release(first)  # twice is harmless


def test_a_wait_for_the_turn_ends_after_its_timeout():
    queue = WriteQueue("test")
    holder = queue.acquire()
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(queue.acquire(timeout=0.05)))
    thread.start()
    finish(thread, "a wait of 0.05 s for a turn held all along to give up")
    assert result == [None] and queue.waiting == 0
    assert holder is not None and queue.release(holder)
    assert queue.acquire(timeout=0) is not None  # free again, and nobody left in the line


# --- engines configured with the queue --------------------------------------------------------------


def test_writers_on_one_file_are_served_in_arrival_order(engine: Engine):
    queue = the_queue(engine)
    with engine.connect() as holder:
        holder.execute(insert(rows).values(value="first"))  # BEGIN IMMEDIATE: holds the turn
        assert queue.holder_thread == threading.get_ident()
        threads = []
        for number in range(6):
            threads.append(threading.Thread(target=write, args=(engine, f"w{number}")))
            threads[-1].start()
            wait_for(lambda n=number: queue.waiting == n + 1, f"writer w{number} in the line")  # type: ignore[misc]
        holder.commit()
    for number, thread in enumerate(threads):
        finish(thread, f"writer w{number}")
    assert written(engine) == ["first", *(f"w{number}" for number in range(6))]


def test_engines_on_one_file_share_its_queue(make_engine: Callable[..., Engine], tmp_path: Path):
    one = make_engine()
    again = create_engine(f"sqlite:///{tmp_path}/./queue.db")
    configure_sqlite(again)
    other = make_engine("other.db")
    assert queue_of(one) is queue_of(again)
    assert queue_of(one) is not queue_of(other)
    again.dispose()


def test_databases_in_memory_have_a_queue_each():
    one, two = create_engine("sqlite://"), create_engine("sqlite://")
    configure_sqlite(one)
    configure_sqlite(two)
    assert queue_of(one) is not None and queue_of(one) is not queue_of(two)


def test_the_queue_can_be_turned_off(make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch):
    assert queue_of(make_engine("a.db", write_queue=False)) is None
    monkeypatch.setenv("FLASK_GATEWAY_SQLITE_QUEUE", "0")
    off = make_engine("b.db")
    assert queue_of(off) is None
    write(off, "still writes")
    assert written(off) == ["still writes"]
    assert queue_of(make_engine("c.db", write_queue=True)) is not None


def test_the_host_apps_engine_is_left_alone(tmp_path: Path):
    engine = create_engine(f"sqlite:///{tmp_path / 'host.db'}")
    assert queue_of(engine) is None


# --- every end of a transaction gives the turn back -------------------------------------------------


def test_commit_gives_the_turn_back_even_on_a_connection_kept_open(engine: Engine):
    with engine.connect() as connection:
        connection.execute(insert(rows).values(value="mine"))
        assert the_queue(engine).holder_thread == threading.get_ident()
        connection.commit()
        assert the_queue(engine).holder_thread is None
        turn_given_back(engine)
    assert written(engine) == ["mine", "other"]


def test_the_turn_and_the_lock_file_are_given_back_after_the_commit_not_before(engine: Engine):
    """A writer woken before SQLite has run the ``COMMIT`` would meet SQLite's lock: the order is seen as
    SQLite starts the ``COMMIT`` (its trace callback), when this thread must still hold both."""
    queue = the_queue(engine)
    at_commit: list[tuple[int | None, bool]] = []

    def trace(statement: str) -> None:
        if statement == "COMMIT":
            held_file = queue.file_lock is None or file_locked(queue.file_lock.path)
            at_commit.append((queue.holder_thread, held_file))

    with engine.connect() as connection:
        connection.execute(insert(rows).values(value="mine"))
        dbapi_connection = connection.connection.dbapi_connection
        assert dbapi_connection is not None
        dbapi_connection.set_trace_callback(trace)
        try:
            connection.commit()
        finally:
            dbapi_connection.set_trace_callback(None)
    assert at_commit == [(threading.get_ident(), True)]
    assert queue.holder_thread is None


def test_rollback_gives_the_turn_back(engine: Engine):
    with engine.connect() as connection:
        connection.execute(insert(rows).values(value="undone"))
        connection.rollback()
        turn_given_back(engine)
    assert written(engine) == ["other"]


def test_an_exception_inside_a_session_gives_the_turn_back(engine: Engine):
    def fails() -> None:
        with Session(engine) as session, session.begin():
            session.execute(insert(rows).values(value="undone"))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError):
        fails()
    turn_given_back(engine)
    assert written(engine) == ["other"]


def test_a_session_closed_without_commit_gives_the_turn_back(engine: Engine):
    session = Session(engine)
    session.execute(insert(rows).values(value="undone"))
    session.close()
    turn_given_back(engine)
    assert written(engine) == ["other"]


def test_an_invalidated_connection_gives_the_turn_back(engine: Engine):
    connection = engine.connect()
    connection.execute(insert(rows).values(value="lost"))
    connection.invalidate()
    turn_given_back(engine)
    connection.close()
    assert written(engine) == ["other"]


def test_a_connection_checked_in_without_commit_gives_the_turn_back(engine: Engine):
    connection = engine.connect()
    connection.execute(insert(rows).values(value="undone"))
    connection.close()  # the pool rolls back on return
    turn_given_back(engine)
    assert written(engine) == ["other"]


def test_a_pool_that_does_not_reset_on_return_gives_the_turn_back_at_checkin(tmp_path: Path):
    engine = create_engine(f"sqlite:///{tmp_path / 'noreset.db'}", pool_reset_on_return=None)
    configure_sqlite(engine)
    metadata.create_all(engine)
    try:
        connection = engine.connect()
        connection.execute(insert(rows).values(value="left open"))
        connection.connection.dbapi_connection.rollback()  # type: ignore[union-attr]
        connection.close()  # checked in with SQLAlchemy's transaction never ended
        turn_given_back(engine)
    finally:
        engine.dispose()


def test_a_detached_connection_closed_gives_the_turn_back(make_engine: Callable[..., Engine]):
    engine = make_engine()
    other = make_engine()  # the same file: the same queue
    connection = engine.connect()
    connection.execute(insert(rows).values(value="closed"))
    connection.detach()  # out of the pool: closing it closes the DB-API connection
    connection.close()
    turn_given_back(other)
    assert written(other) == ["other"]


def test_a_begin_that_fails_gives_the_turn_back(make_engine: Callable[..., Engine], tmp_path: Path):
    engine = make_engine(busy_timeout_ms=50)
    other_process = sqlite3.connect(tmp_path / "queue.db", isolation_level=None)  # the queue cannot see it
    other_process.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(OperationalError, match="database is locked"):
            write(engine, "refused")
        assert the_queue(engine).holder_thread is None
    finally:
        other_process.execute("ROLLBACK")
        other_process.close()
    turn_given_back(engine)


# --- readers, re-entrancy, a turn never given back -------------------------------------------------


def test_read_transactions_take_no_turn_and_never_wait_for_one(engine: Engine):
    write(engine, "before")
    queue = the_queue(engine)
    with engine.connect() as writer:
        writer.execute(insert(rows).values(value="pending"))  # holds the turn
        seen: list[list[str]] = []

        def read() -> None:
            seen.append(written(engine))

        thread = threading.Thread(target=read)
        thread.start()
        finish(thread, "a reader while another thread holds the write turn")
        assert seen == [["before"]]  # read beside the writer, before its commit
        # In the writer's own thread: a read transaction on another connection, nested in the write.
        assert written(engine) == ["before"]
        assert queue.holder_thread == threading.get_ident() and queue.waiting == 0
        writer.commit()
    assert queue.holder_thread is None


def test_a_read_transaction_that_goes_on_to_write_queues_for_its_write(engine: Engine):
    queue = the_queue(engine)
    with sqlite_read_transactions(), Session(engine) as session:
        assert session.scalars(select(rows.c.value)).all() == []
        assert queue.holder_thread is None  # reading: no turn
        begin_writing(session)
        session.execute(insert(rows).values(value="written"))
        assert queue.holder_thread == threading.get_ident()
        session.commit()
    assert queue.holder_thread is None
    assert written(engine) == ["written"]


def test_a_thread_holding_the_turn_does_not_queue_behind_itself(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    engine = make_engine()
    second = make_engine(busy_timeout_ms=200)  # the same file, another engine: as before the queue
    queue = the_queue(engine)
    asked: list[int] = []  # the threads that asked for a turn
    acquire = queue.acquire

    def spy(timeout: float | None = None) -> object:
        asked.append(threading.get_ident())
        return acquire(timeout)

    monkeypatch.setattr(queue, "acquire", spy)
    with engine.connect() as first:
        first.execute(insert(rows).values(value="first"))
        assert asked == [threading.get_ident()]
        with (
            caplog.at_level(logging.WARNING, logger=LOGGER),
            pytest.raises(OperationalError, match="database is locked"),
        ):
            write(second, "second")  # SQLite's busy handler, its timeout: not a wait for ever
        # It never asked for a turn (nor waited for one, which would have been logged): BEGIN IMMEDIATE at
        # once, and SQLite's lock, held by this thread's first transaction, refused it.
        assert asked == [threading.get_ident()]
        assert not [record for record in caplog.records if record.name == LOGGER], caplog.text
        assert queue.holder_thread == threading.get_ident() and queue.waiting == 0
        first.commit()
    write(second, "second")
    assert written(engine) == ["first", "second"]


def test_a_turn_never_given_back_holds_writers_up_for_the_busy_timeout_only(
    make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture
):
    """The writer waits for its turn at most the busy timeout, then tries ``BEGIN IMMEDIATE`` once without
    waiting: seen by its order, not its time. It writes while the turn is still held elsewhere, after the
    WARNING that it waited, with the connection's busy timeout 0 for that one ``BEGIN IMMEDIATE``."""
    engine = make_engine(busy_timeout_ms=200)
    queue = the_queue(engine)
    leaked: list[object] = []
    parked = threading.Event()

    def leak() -> None:
        leaked.append(queue.acquire())
        # It stays alive: a thread started later could otherwise be given its identity (the values of
        # threading.get_ident are reused) and pass for the holder writing again.
        parked.wait(DEADLINE)

    thread = threading.Thread(target=leak)
    thread.start()
    wait_for(lambda: bool(leaked), "a thread taking the turn")  # it keeps it; SQLite's lock is free
    begins = busy_timeouts_at_begin(engine)
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            in_thread(
                lambda: write(engine, "after the timeout"),
                "a writer behind a turn never given back (its wait is bounded by the busy timeout, 0.2 s)",
            )
        assert queue.holder_thread is not None and queue.waiting == 0  # still held; the writer left the line
    finally:
        queue.release(leaked[0])  # type: ignore[arg-type]
        parked.set()
        finish(thread, "the thread that held the turn")
    warnings = [record.getMessage() for record in caplog.records if record.name == LOGGER]
    assert len(warnings) == 1 and warnings[0].startswith("waited 200 ms for the write turn"), warnings
    assert begins == [0]  # then one BEGIN IMMEDIATE that does not wait
    assert written(engine) == ["after the timeout"]


def _write_in_child(url: str, busy_timeout_ms: int) -> None:
    engine = create_engine(url)
    configure_sqlite(engine, busy_timeout_ms=busy_timeout_ms)
    write(engine, "child")
    engine.dispose()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork: POSIX only")
def test_a_forked_child_does_not_wait_for_a_turn_its_parent_held(engine: Engine):
    """gunicorn forks its workers: a turn a thread of the parent held is not the child's to wait for. The
    child's busy timeout is an hour: waiting for that turn, it would still wait at the deadline."""
    queue = the_queue(engine)
    engine.dispose()  # no SQLite connection open across the fork (SQLite's own rule)
    held: list[object] = []  # as a writer thread of the parent would hold it at the fork
    holder = threading.Thread(target=lambda: held.append(queue.acquire()))
    holder.start()
    finish(holder, "a thread taking the turn")
    turn = held[0]
    context = multiprocessing.get_context("fork")
    child = context.Process(target=_write_in_child, args=(str(engine.url), FOREVER_MS))
    try:
        child.start()
        child.join(DEADLINE)
        assert child.exitcode == 0, (
            f"the forked child has not written in {DEADLINE:g} s (exit code {child.exitcode}): it waits for "
            "the turn its parent's thread held at the fork"
        )
        assert queue.holder_thread is not None  # the parent's turn was held all along
    finally:
        queue.release(turn)  # type: ignore[arg-type]
        if child.is_alive():
            child.kill()
            child.join(DEADLINE)
    assert written(engine) == ["child"]


# --- many writers -------------------------------------------------------------------------------------


def contended_writes(engine: Engine, threads: int = 4, each: int = 40) -> None:
    """``threads`` threads make ``each`` write transactions each (a read, then a write), all at once."""
    start = threading.Barrier(threads + 1)

    def work(number: int) -> None:
        start.wait()
        for step in range(each):
            with engine.begin() as connection:
                connection.execute(select(rows.c.id).order_by(rows.c.id.desc()).limit(1)).first()
                connection.execute(insert(rows).values(value=f"{number}-{step}"))

    workers = [threading.Thread(target=work, args=(number,)) for number in range(threads)]
    for worker in workers:
        worker.start()
    start.wait()
    for number, worker in enumerate(workers):
        finish(worker, f"writer thread {number}'s {each} transactions")


def test_contended_writes_all_land_with_and_without_the_queue(make_engine: Callable[..., Engine]):
    # How fast is for the benchmarks (benchmarks/sqlite_writers.py, and figure 4 on SQLite), not for a
    # test: on a loaded machine a time bound here failed by chance. What must hold is that every write lands.
    queued = make_engine("queued.db")
    unqueued = make_engine("unqueued.db", write_queue=False)
    for _ in range(3):
        contended_writes(queued)
        contended_writes(unqueued)
    assert len(written(queued)) == len(written(unqueued)) == 3 * 4 * 40
    assert queue_of(queued) is not None and queue_of(unqueued) is None


# --- the engines the extension and the emulator configure -------------------------------------------


def test_the_extension_and_the_emulator_queue_on_one_file_and_the_shops_engine_does_not(tmp_path: Path):
    from flask_gateway.emulator.models import db as emulator_db
    from flask_gateway.state import get_state
    from tests.emulator.conftest import make_emulator
    from tests.extension.conftest import make_shop

    url = f"sqlite:///{tmp_path / 'shop.db'}"
    shop, db, _gateway = make_shop(url)
    emulator = make_emulator(url)  # embedded-style: the emulator's tables in the shop's file
    with shop.app_context():
        extension_engine, shop_engine = get_state().engine, db.engine
    with emulator.app_context():
        emulator_engine = emulator_db.engine
    try:
        queue = queue_of(extension_engine)
        assert queue is not None and queue.name == str((tmp_path / "shop.db").resolve())
        assert queue_of(emulator_engine) is queue
        assert queue_of(shop_engine) is None  # the host app's engine: exactly as the shop configured it
    finally:
        for engine in (extension_engine, shop_engine, emulator_engine):
            engine.dispose()
