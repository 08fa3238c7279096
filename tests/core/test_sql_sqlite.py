"""SQLite under concurrent writers (``core.sql.configure_sqlite``): SQLAlchemy's pysqlite recipe, each
transaction ``BEGIN IMMEDIATE`` (``BEGIN`` inside ``sqlite_read_transactions``) and a busy timeout, is
what keeps "database is locked" from reaching a person.

The concurrency the project has: the threads of a server (``flask run``, gunicorn's ``--threads``), the
embedded emulator's engine and the extension's writing one file in one process, and other processes on
the same file (gunicorn's ``--workers``, a ``flask gateway`` command beside the server). The other
processes here are fresh interpreters (``subprocess``), started before anyone writes and all let go at
once. Nothing is timed: every write must land, and none may see an error.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, event, func, insert, select
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from flask_gateway.core.sql import begin_writing, configure_sqlite, sqlite_read_transactions

ROOT = Path(__file__).resolve().parents[2]

metadata = MetaData()
#: As the extension's tables and the embedded emulator's share the shop's file.
shop_rows = Table(
    "gateway_rows", metadata, Column("id", Integer, primary_key=True), Column("value", String(60))
)
emulator_rows = Table(
    "emulator_rows", metadata, Column("id", Integer, primary_key=True), Column("value", String(60))
)

#: The last resort of a test waiting for a thread or a process: only how long to wait before saying what
#: did not happen (CI runs on a loaded 2-core machine; what it waits for takes a second on a quiet one).
DEADLINE = 300.0
#: Threads per process and write transactions per thread in the concurrency test.
THREADS = 4
EACH = 25
#: Other processes writing beside this one.
PROCESSES = 3


@pytest.fixture
def make_engine(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def make(name: str = "shared.db", **options: Any) -> Engine:
        engine = create_engine(f"sqlite:///{tmp_path / name}")
        configure_sqlite(engine, **options)
        metadata.create_all(engine)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.dispose()


def statements(engine: Engine) -> list[str]:
    """The statements ``engine`` sends through a cursor from now on: ``BEGIN IMMEDIATE`` and ``BEGIN`` as
    they are, the others by their first word (the driver's commits and rollbacks are not among them)."""
    seen: list[str] = []

    @event.listens_for(engine, "before_cursor_execute")
    def _before(_connection: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        seen.append(statement.split()[0] if statement.startswith(("INSERT", "SELECT")) else statement)

    return seen


def values(engine: Engine, table: Table = shop_rows) -> list[str]:
    with sqlite_read_transactions(), engine.connect() as connection:
        return list(connection.scalars(select(table.c.value).order_by(table.c.id)))


# --- many writers, threads and processes -----------------------------------------------------------------


def write_concurrently(engines: list[Engine], name: str, start: threading.Event) -> list[str]:
    """``THREADS`` threads of ``EACH`` write transactions each, all let go by ``start``; the errors they met.

    Thread ``n`` writes through ``engines[n % len(engines)]`` (the extension's and the emulator's engine in
    one process). Even threads read, then write in the same transaction (``BEGIN IMMEDIATE``); odd threads
    begin as the status poll does, reading in ``sqlite_read_transactions``, then ``begin_writing``. Each
    transaction writes a row to both tables, ``<name>-<thread>-<step>``."""
    errors: list[str] = []
    lock = threading.Lock()

    def work(number: int) -> None:
        engine = engines[number % len(engines)]
        start.wait()
        for step in range(EACH):
            value = f"{name}-{number}-{step}"
            try:
                if number % 2 == 0:
                    with engine.begin() as connection:
                        connection.execute(select(func.count()).select_from(shop_rows)).scalar()
                        connection.execute(insert(shop_rows).values(value=value))
                        connection.execute(insert(emulator_rows).values(value=value))
                else:
                    with sqlite_read_transactions(), Session(engine) as session:
                        session.execute(select(func.count()).select_from(emulator_rows)).scalar()
                        begin_writing(session)
                        session.execute(insert(shop_rows).values(value=value))
                        session.execute(insert(emulator_rows).values(value=value))
                        session.commit()
            except OperationalError as error:
                with lock:
                    errors.append(f"{value}: {error.orig}")

    threads = [threading.Thread(target=work, args=(number,)) for number in range(THREADS)]
    for thread in threads:
        thread.start()
    for number, thread in enumerate(threads):
        thread.join(DEADLINE)
        assert not thread.is_alive(), f"writer thread {name}-{number} has not ended in {DEADLINE:g} s"
    return errors


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def writer_main() -> None:
    """Another process: ``python -c 'from tests.core.test_sql_sqlite import writer_main; writer_main()'``
    with the database URL and its name as arguments. It says ``ready`` once its engines are set up, writes
    when it reads ``go`` on stdin, then prints the errors its writers met as one JSON list."""
    url, name = sys.argv[1], sys.argv[2]
    engines = [create_engine(url), create_engine(url)]  # the extension's and the emulator's
    for engine in engines:
        configure_sqlite(engine)
    start = threading.Event()
    say("ready")
    if sys.stdin.readline().strip() == "go":
        start.set()
    errors = write_concurrently(engines, name, start)
    for engine in engines:
        engine.dispose()
    say(json.dumps(errors))


def test_threads_of_several_processes_write_one_file_and_every_write_lands(
    make_engine: Callable[..., Engine],
):
    """4 processes of 4 threads, each process with two engines on the file (embedded: the extension's and
    the emulator's): every transaction commits, none sees "database is locked", nothing is written twice."""
    engines = [make_engine(), make_engine()]
    url = str(engines[0].url)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    children = {
        f"p{n}": subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from tests.core.test_sql_sqlite import writer_main; writer_main()",
                url,
                f"p{n}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        for n in range(PROCESSES)
    }
    try:
        for name, child in children.items():
            assert child.stdout is not None
            assert child.stdout.readline().strip() == "ready", f"writer process {name} did not start"
        start = threading.Event()
        for child in children.values():
            assert child.stdin is not None
            child.stdin.write("go\n")
            child.stdin.flush()
        start.set()
        errors = write_concurrently(engines, "here", start)
        for name, child in children.items():
            out, _ = child.communicate(timeout=DEADLINE)
            assert child.returncode == 0, f"writer process {name} failed ({child.returncode})"
            errors += json.loads(out.strip().splitlines()[-1])
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait(DEADLINE)
    assert errors == []
    expected = sorted(
        f"{name}-{number}-{step}"
        for name in ["here", *children]
        for number in range(THREADS)
        for step in range(EACH)
    )
    assert sorted(values(engines[0], shop_rows)) == expected
    assert sorted(values(engines[1], emulator_rows)) == expected


# --- what each transaction begins with -------------------------------------------------------------------


def test_a_write_transaction_begins_immediate_and_a_read_transaction_deferred(
    make_engine: Callable[..., Engine],
):
    engine = make_engine()
    sent = statements(engine)
    with engine.begin() as connection:
        connection.execute(insert(shop_rows).values(value="written"))
    assert values(engine) == ["written"]
    assert sent == ["BEGIN IMMEDIATE", "INSERT", "BEGIN", "SELECT"]


def test_a_read_transaction_neither_takes_nor_waits_for_the_write_lock(make_engine: Callable[..., Engine]):
    """With a read transaction open, another connection writes and commits without waiting (busy timeout
    0), and while a write transaction is open, a read sees the last commit, also without waiting."""
    reader, writer = make_engine(busy_timeout_ms=0), make_engine(busy_timeout_ms=0)
    with writer.begin() as first:
        first.execute(insert(shop_rows).values(value="before"))
    with sqlite_read_transactions(), reader.connect() as reading:
        assert list(reading.scalars(select(shop_rows.c.value))) == ["before"]
        with writer.begin() as writing:
            writing.execute(insert(shop_rows).values(value="beside a reader"))
    with writer.connect() as writing:
        writing.execute(insert(shop_rows).values(value="pending"))  # holds the write lock
        assert values(reader) == ["before", "beside a reader"]
        writing.commit()
    assert values(reader) == ["before", "beside a reader", "pending"]


def test_begin_writing_after_another_commit_writes_where_the_read_transaction_would_fail(
    make_engine: Callable[..., Engine],
):
    """A read transaction is a snapshot: after another connection committed, writing in it fails at once
    with "database is locked" (SQLITE_BUSY_SNAPSHOT, which no busy timeout waits out). ``begin_writing``
    ends it first, so the write begins IMMEDIATE on the newest data and lands."""
    engine, other = make_engine(), make_engine()
    with sqlite_read_transactions(), Session(engine) as stale:
        stale.execute(select(shop_rows.c.value)).all()
        write_one(other, "meanwhile")
        with pytest.raises(OperationalError, match="database is locked"):
            stale.execute(insert(shop_rows).values(value="refused"))
        stale.rollback()
    sent = statements(engine)
    with sqlite_read_transactions(), Session(engine) as session:
        session.execute(select(shop_rows.c.value)).all()
        write_one(other, "meanwhile again")
        begin_writing(session)
        session.execute(insert(shop_rows).values(value="written"))
        session.commit()
    assert sent == ["BEGIN", "SELECT", "BEGIN IMMEDIATE", "INSERT"]  # begin_writing committed the read
    assert values(engine) == ["meanwhile", "meanwhile again", "written"]


def write_one(engine: Engine, value: str) -> None:
    with engine.begin() as connection:
        connection.execute(insert(shop_rows).values(value=value))


def test_a_write_lock_held_past_the_busy_timeout_is_database_is_locked_then_the_file_writes_again(
    make_engine: Callable[..., Engine], tmp_path: Path
):
    """The busy timeout bounds the wait: a lock held longer (here a ``sqlite3`` shell's open transaction)
    ends in SQLite's own error; the engine writes once the lock is given back."""
    engine = make_engine(busy_timeout_ms=50)
    shell = sqlite3.connect(tmp_path / "shared.db", isolation_level=None)
    shell.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(OperationalError, match="database is locked"):
            write_one(engine, "refused")
    finally:
        shell.execute("ROLLBACK")
        shell.close()
    write_one(engine, "after")
    assert values(engine) == ["after"]


def test_the_connection_settings(make_engine: Callable[..., Engine]):
    engine = make_engine(busy_timeout_ms=1234)
    with engine.connect() as connection:
        pragma = connection.connection.dbapi_connection.execute  # type: ignore[union-attr]
        assert pragma("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert pragma("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
        assert pragma("PRAGMA busy_timeout").fetchone()[0] == 1234
        assert pragma("PRAGMA foreign_keys").fetchone()[0] == 1
    default = make_engine("default.db")
    with default.connect() as connection:
        pragma = connection.connection.dbapi_connection.execute  # type: ignore[union-attr]
        assert pragma("PRAGMA busy_timeout").fetchone()[0] == 30_000


# --- the engines the extension and the emulator configure ------------------------------------------------


def test_the_extension_and_the_emulator_begin_immediate_on_one_file_and_the_shops_engine_is_left_alone(
    tmp_path: Path,
):
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
        for engine in (extension_engine, emulator_engine):
            assert engine is not shop_engine
            sent = statements(engine)
            with engine.begin() as connection:
                connection.exec_driver_sql("SELECT 1")
            assert sent[0] == "BEGIN IMMEDIATE"
        assert not getattr(shop_engine, "_flask_gateway_configured", False)
        sent = statements(shop_engine)
        with shop_engine.begin() as connection:
            connection.exec_driver_sql("SELECT 1")
        assert "BEGIN IMMEDIATE" not in sent  # the host app's engine: exactly as the shop configured it
    finally:
        for engine in (extension_engine, shop_engine, emulator_engine):
            engine.dispose()
