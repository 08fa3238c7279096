"""A command that waits on the database says so: one line on stderr once a statement has waited
:data:`NOTICE_AFTER` seconds, naming what it waits for and when it gives up.

Every ``flask gateway`` command runs under :func:`announce_waits` (``GatewayCommands.invoke``). It listens
to SQLAlchemy's transaction and cursor events of every engine (the shop's, and the embedded emulator's in
the same process) for the command's duration only, and a daemon thread watches the statement in flight. A
SQLite database another process is writing to makes a writer wait in SQLite's busy handler (up to its busy
timeout, 30 s, ``core.sql.configure_sqlite``); a PostgreSQL row or table lock makes a statement wait until
it is released. Without the line the command looks hung; with it the owner knows what to look at. The
statement's own error, when it gives up, ends the command with one line as before (``DatabaseAway``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final

import click
from sqlalchemy import event
from sqlalchemy.engine import Engine

__all__ = ["NOTICE_AFTER", "announce_waits", "wait_notice"]

#: Seconds one statement may take before the command says it is waiting (the line comes within 2 s).
NOTICE_AFTER: Final = 1.5
#: How often the watching thread looks (a fraction of :data:`NOTICE_AFTER`).
_LOOK_EVERY: Final = 0.2


def wait_notice(dialect: str, seconds: float) -> str:
    """The line a command prints once a statement on ``dialect`` has waited ``seconds``."""
    if dialect == "sqlite":
        why = (
            "another process is writing to the SQLite file (a server, a worker, another command); "
            "this command gives up after SQLite's busy timeout, 30 s in all"
        )
    else:
        why = (
            f"the {dialect} server has not answered: a lock another session holds, or a slow or "
            "unreachable server; stop it with Ctrl-C"
        )
    return f"Waiting for the database ({seconds:.0f} s so far): {why}."


class _Watch:
    def __init__(self, echo: Callable[[str], None], after: float) -> None:
        self._echo = echo
        self._after = after
        self._lock = threading.Lock()
        #: (when the statement in flight started, its dialect, whether its wait was announced)
        self._current: tuple[float, str, bool] | None = None
        self._stop = threading.Event()

    def started(self, conn: Any, *_: Any) -> None:
        with self._lock:
            self._current = (time.monotonic(), conn.dialect.name, False)

    def ended(self, *_: Any) -> None:
        with self._lock:
            self._current = None

    def run(self) -> None:
        while not self._stop.wait(_LOOK_EVERY):
            with self._lock:
                current = self._current
                if current is None or current[2]:
                    continue
                waited = time.monotonic() - current[0]
                if waited < self._after:
                    continue
                self._current = (current[0], current[1], True)
            self._echo(wait_notice(current[1], waited))

    def stop(self) -> None:
        self._stop.set()


@contextmanager
def announce_waits(
    echo: Callable[[str], None] | None = None, *, after: float = NOTICE_AFTER
) -> Iterator[None]:
    """While the block runs, a statement that waits ``after`` seconds is announced once (``echo``, by
    default one line on stderr)."""
    watch = _Watch(echo or (lambda line: click.echo(line, err=True)), after)
    # A transaction's start too, before the engine's own "begin" listeners: on SQLite the writer first
    # waits for the lock file other processes' writers share (``core.sqlite_queue``), before its BEGIN
    # IMMEDIATE is a statement.
    listeners = [
        ("begin", watch.started),
        ("before_cursor_execute", watch.started),
        ("after_cursor_execute", watch.ended),
        ("handle_error", watch.ended),
    ]
    for name, listener in listeners:
        event.listen(Engine, name, listener, insert=name == "begin")
    thread = threading.Thread(target=watch.run, name="flask-gateway-patience", daemon=True)
    thread.start()
    try:
        yield
    finally:
        watch.stop()
        for name, listener in listeners:
            event.remove(Engine, name, listener)
        thread.join(timeout=1)
