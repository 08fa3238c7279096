"""A command waiting on the database says so (issue 36, point 2): ``operations/cli/patience.py``.

The waits are real (another connection holds SQLite's write lock); what is checked is the order of events
(the line comes while the statement waits, the statement goes on once the lock is released), never how
long anything took.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

from sqlalchemy import create_engine, text

from flask_gateway.core.sql import configure_sqlite
from flask_gateway.operations.cli.patience import announce_waits, wait_notice
from tests.processes import wait_for


def test_a_write_that_waits_for_the_lock_says_so_and_goes_on_once_it_is_free(tmp_path: Path) -> None:
    path = tmp_path / "shop.db"
    engine = create_engine(f"sqlite:///{path}")
    configure_sqlite(engine)
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE orders (reference TEXT)"))
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process's writer, mid-transaction
    lines: list[str] = []
    done = threading.Event()

    def write() -> None:
        with announce_waits(lines.append), engine.begin() as connection:
            connection.execute(text("INSERT INTO orders VALUES ('R-1')"))
        done.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        wait_for(lambda: lines, what="the line saying the write waits")
        assert not done.is_set()  # said while it waits
        assert lines[0].startswith("Waiting for the database (")
        assert "another process is writing to the SQLite file" in lines[0]
        assert "gives up after SQLite's busy timeout, 30 s" in lines[0]
    finally:
        holder.execute("COMMIT")
        holder.close()
    writer.join(timeout=60)
    assert done.is_set()
    assert len(lines) == 1  # once per wait
    with engine.connect() as connection:
        assert connection.execute(text("SELECT reference FROM orders")).scalars().all() == ["R-1"]
    engine.dispose()


def test_the_listeners_live_only_as_long_as_the_command() -> None:
    engine = create_engine("sqlite://")

    def listening() -> tuple[int, ...]:
        dispatch = engine.dispatch
        return len(dispatch.begin), len(dispatch.before_cursor_execute), len(dispatch.after_cursor_execute)

    assert listening() == (0, 0, 0)
    with announce_waits(lambda line: None):
        assert listening() == (1, 1, 1)
    assert listening() == (0, 0, 0)
    engine.dispose()


def test_postgresql_waits_are_named_for_what_they_can_be() -> None:
    line = wait_notice("postgresql", 2.2)
    assert line.startswith("Waiting for the database (2 s so far): the postgresql server has not answered")
    assert "a lock another session holds" in line and "Ctrl-C" in line
