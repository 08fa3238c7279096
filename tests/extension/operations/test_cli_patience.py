"""A command waiting on the database says so (issue 36, point 2): ``operations/cli/patience.py``.

The waits are real (another connection holds SQLite's write lock); what is checked is the order of events
(the line comes while the statement waits, the statement goes on once the lock is released), never how
long anything took.
"""

from __future__ import annotations

import sqlite3
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import requests
from sqlalchemy import create_engine, text

from flask_gateway.core.sql import configure_sqlite
from flask_gateway.operations.cli.patience import announce_waits, wait_notice
from tests.processes import wait_for

ORIGINAL_SEND = requests.Session.send


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


def test_a_call_to_a_gateway_that_has_not_answered_says_so_and_goes_on_once_it_answers() -> None:
    """A gateway that takes its time (a real socket): the line names its address and the call's timeout
    while the call waits; the answer then arrives as usual."""
    answer = threading.Event()

    class Slow(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            answer.wait(60)
            body = b'{"ok": true}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/v2/getstatus"
    lines: list[str] = []
    answers: list[int] = []

    def call() -> None:
        with announce_waits(lines.append), requests.Session() as session:
            answers.append(session.post(url, json={}, timeout=(5.0, 120.0)).status_code)

    caller = threading.Thread(target=call, daemon=True)
    caller.start()
    try:
        wait_for(lambda: lines, what="the line saying the call waits for the gateway")
        assert answers == []  # said while it waits
        host = f"127.0.0.1:{server.server_address[1]}"
        assert lines[0].startswith(f"Waiting for the gateway at {host} (")
        assert "gives up after 5 s to connect and 120 s to answer (GATEWAY_TIMEOUT)" in lines[0]
    finally:
        answer.set()
    caller.join(timeout=60)
    server.shutdown()
    server.server_close()
    assert answers == [200] and len(lines) == 1
    assert requests.Session.send is ORIGINAL_SEND  # put back once the command ends
