"""A command that waits says so: one line on stderr once a database statement or a call to the gateway
has waited :data:`NOTICE_AFTER` seconds, naming what it waits for and when it gives up.

Every ``flask gateway`` command runs under :func:`announce_waits` (``GatewayCommands.invoke``). It listens
to SQLAlchemy's transaction and cursor events of every engine (the shop's, and the embedded emulator's in
the same process) for the command's duration only, and a daemon thread watches the statement in flight. A
SQLite database another process is writing to makes a writer wait in SQLite's busy handler (up to its busy
timeout, 30 s, ``core.sql.configure_sqlite``); a PostgreSQL row or table lock makes a statement wait until
it is released. Without the line the command looks hung; with it the owner knows what to look at. The
statement's own error, when it gives up, ends the command with one line as before (``DatabaseAway``).

The gateway's calls are watched the same way: ``requests.Session.send`` is wrapped for the command's
duration (the process is the command's own), so a gateway that is slow to answer, or an address that
does not answer at all, is named with the call's own timeout (``GATEWAY_TIMEOUT``) while the command
waits for it; the timeout then ends it with the client's one line, or its retry.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, Final
from urllib.parse import urlsplit

import click
import requests
from sqlalchemy import event
from sqlalchemy.engine import Engine

__all__ = ["NOTICE_AFTER", "announce_waits", "gateway_wait_notice", "wait_notice"]

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


def gateway_wait_notice(url: str, timeout: object, seconds: float) -> str:
    """The line a command prints once a call to the gateway at ``url`` has waited ``seconds``."""
    host = urlsplit(url).netloc or url
    if isinstance(timeout, tuple) and len(timeout) == 2:
        limit = f"{timeout[0]:g} s to connect and {timeout[1]:g} s to answer (GATEWAY_TIMEOUT)"
    elif isinstance(timeout, (int, float)):
        limit = f"{timeout:g} s (GATEWAY_TIMEOUT)"
    else:
        limit = "its timeout"
    return (
        f"Waiting for the gateway at {host} ({seconds:.0f} s so far): it has not answered yet; this call "
        f"gives up after {limit}, and is then retried or reported."
    )


class _Watch:
    def __init__(self, echo: Callable[[str], None], after: float) -> None:
        self._echo = echo
        self._after = after
        self._lock = threading.Lock()
        #: (when the wait in flight started, the line that names it, whether it was announced)
        self._current: tuple[float, Callable[[float], str], bool] | None = None
        self._stop = threading.Event()

    def started(self, conn: Any, *_: Any) -> None:
        dialect = conn.dialect.name
        self.waiting(lambda seconds: wait_notice(dialect, seconds))

    def waiting(self, line: Callable[[float], str]) -> None:
        with self._lock:
            self._current = (time.monotonic(), line, False)

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
            self._echo(current[1](waited))

    def stop(self) -> None:
        self._stop.set()


@contextmanager
def announce_waits(
    echo: Callable[[str], None] | None = None, *, after: float = NOTICE_AFTER
) -> Iterator[None]:
    """While the block runs, a statement that waits ``after`` seconds is announced once (``echo``, by
    default one line on stderr)."""
    watch = _Watch(echo or (lambda line: click.echo(line, err=True)), after)
    # A transaction's start too, before the engine's own "begin" listeners: on SQLite a writer waits in
    # its ``BEGIN IMMEDIATE`` (``core.sql.configure_sqlite``), which the start of the transaction issues.
    listeners = [
        ("begin", watch.started),
        ("before_cursor_execute", watch.started),
        ("after_cursor_execute", watch.ended),
        ("handle_error", watch.ended),
    ]
    for name, listener in listeners:
        event.listen(Engine, name, listener, insert=name == "begin")
    # The gateway's calls: every ``requests`` session's send (the clients', the embedded emulator's
    # in-process adapter), for the command's duration, in this process only.
    send = requests.Session.send

    def patient_send(session: requests.Session, request: Any, **settings: Any) -> Any:
        url, timeout = str(request.url), settings.get("timeout")
        watch.waiting(lambda seconds: gateway_wait_notice(url, timeout, seconds))
        try:
            return send(session, request, **settings)
        finally:
            watch.ended()

    requests.Session.send = patient_send  # type: ignore[method-assign,assignment]
    thread = threading.Thread(target=watch.run, name="flask-gateway-patience", daemon=True)
    thread.start()
    try:
        yield
    finally:
        requests.Session.send = send  # type: ignore[method-assign]
        watch.stop()
        for name, listener in listeners:
            event.remove(Engine, name, listener)
        thread.join(timeout=1)
