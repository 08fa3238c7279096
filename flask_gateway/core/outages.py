"""Database outages: telling "the database is away" from other errors, and saying so once per outage.

Shared by the extension and the emulator (no Flask here). A process serving requests while its database
restarts meets the same failure in every request: logging a traceback for each would bury the one line an
operator needs. :class:`OutageWatch` keeps one state per process:

- the first failure logs one WARNING (``the database is unreachable: ...``, the driver's one-line reason,
  never a statement or its parameters), later failures only count;
- the first success afterwards (:meth:`OutageWatch.succeeded`, or a :meth:`OutageWatch.probe` that
  connects) logs one WARNING with the outage's length and the number of requests refused meanwhile.

:func:`is_database_outage` says which errors mean "try again shortly" (an HTTP 503 with ``Retry-After``):
a connection refused, dropped or invalidated by a restart, a pool that could not give a connection in time,
SQLite's "database is locked". Anything else (a constraint, a missing table, a bug) is not an outage.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Final

from sqlalchemy import text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, DisconnectionError, InterfaceError, OperationalError, ProgrammingError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError

from flask_gateway.core.spells import Spells

__all__ = [
    "DATABASE_ERRORS",
    "RETRY_AFTER_SECONDS",
    "SCHEMA_ERRORS",
    "OutageWatch",
    "describe_database_error",
    "is_database_outage",
    "is_missing_schema",
    "ping",
]

#: The exception classes that may mean the database is away (``is_database_outage`` decides for each
#: instance): register HTTP error handlers for these, and re-raise what is not an outage.
DATABASE_ERRORS: Final[tuple[type[Exception], ...]] = (
    OperationalError,
    InterfaceError,
    DisconnectionError,
    PoolTimeoutError,
)

#: The ``Retry-After`` (seconds) of a 503 answered while the database is away: about the time a
#: PostgreSQL restart or failover takes, short enough for a gateway's callback retry to land after it.
RETRY_AFTER_SECONDS: Final = 5

#: The exception classes a missing table or column raises (SQLite: ``OperationalError`` "no such table";
#: PostgreSQL: ``ProgrammingError``, SQLSTATE 42P01 or 42703): ``is_missing_schema`` decides for each.
SCHEMA_ERRORS: Final[tuple[type[Exception], ...]] = (OperationalError, ProgrammingError)

#: PostgreSQL's SQLSTATEs for a table or a column that does not exist.
_UNDEFINED_SQLSTATES: Final = frozenset({"42P01", "42703"})
_MISSING_MARKERS: Final = ("no such table", "no such column")

#: A missing table is an ``OperationalError`` on SQLite, but a schema problem, not an outage.
_NOT_OUTAGES: Final = ("no such table", "no such column", "syntax error")


def is_database_outage(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) means the database cannot answer right now."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, (DisconnectionError, PoolTimeoutError)):
            return True
        if isinstance(current, DBAPIError):
            if current.connection_invalidated:
                return True
            if isinstance(current, (OperationalError, InterfaceError)):
                message = str(current.orig).lower()
                return not any(marker in message for marker in _NOT_OUTAGES)
        current = current.__cause__ or current.__context__
    return False


def is_missing_schema(error: BaseException) -> bool:
    """Whether ``error`` (or an error it was raised from) says a table or column does not exist: the tables
    were never created, or a migration was not run. Not an outage: waiting does not fix it, a command does."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, SCHEMA_ERRORS) and isinstance(current, DBAPIError):
            original = current.orig
            sqlstate = getattr(original, "sqlstate", None) or getattr(original, "pgcode", None)
            if sqlstate in _UNDEFINED_SQLSTATES:
                return True
            message = str(original).lower()
            return any(marker in message for marker in _MISSING_MARKERS)
        current = current.__cause__ or current.__context__
    return False


def describe_database_error(error: BaseException) -> str:
    """One line for a log: the driver's error class and the first line of its message (no SQL, no
    parameters: those may hold customer data)."""
    original = error.orig if isinstance(error, DBAPIError) and error.orig is not None else error
    first_line = (str(original).strip().splitlines() or [""])[0][:200]
    name = type(original).__name__
    return f"{name}: {first_line}" if first_line else name


def ping(engine: Engine) -> None:
    """One round trip to ``engine``'s database (raises what the driver raises when it cannot)."""
    with engine.connect() as connection:
        connection.execute(text("SELECT 1"))


class OutageWatch:
    """One process's view of its database: up, or away since when (thread-safe).

    ``name`` starts each log line (``"flask_gateway"``, ``"emulator"``); ``clock`` is a monotonic clock in
    seconds (tests replace it); ``probe_interval`` is the least time between two probes while away.
    ``problem``, ``until`` and ``back`` word the two lines, for a spell of another failure than an outage
    (the tables missing).
    """

    def __init__(
        self,
        name: str,
        logger: logging.Logger,
        *,
        clock: Callable[[], float] = time.monotonic,
        probe_interval: float = 1.0,
        problem: str = "the database is unreachable",
        until: str = "it answers again",
        back: str = "the database answers again",
    ) -> None:
        self.name = name
        self._problem, self._until, self._back = problem, until, back
        self._log = logger
        self._clock = clock
        self._probe_interval = probe_interval
        self._lock = threading.Lock()
        self._spells: Spells[None] = Spells(lambda: self._clock())
        self._last_probe = float("-inf")

    @property
    def down(self) -> bool:
        """True from the first failure until the next success."""
        return self._spells.failing(None)

    @property
    def refused(self) -> int:
        """Failures counted during the current outage (0 when up)."""
        return self._spells.failures(None)

    def failed(self, error: BaseException) -> bool:
        """Count a failure; the first of an outage logs one WARNING. True when this one started it."""
        if not self._spells.failed(None):
            return False
        self._log.warning(
            "%s: %s (%s): answering 503 with Retry-After until %s",
            self.name,
            self._problem,
            describe_database_error(error),
            self._until,
        )
        return True

    def succeeded(self) -> bool:
        """The database answered; the first success after an outage logs one WARNING. True when this one
        ended an outage."""
        spell = self._spells.succeeded(None)
        if spell is None:
            return False
        self._log.warning(
            "%s: %s after %.1f s (%d request(s) answered 503 meanwhile)",
            self.name,
            self._back,
            spell.seconds,
            spell.failures,
        )
        return True

    def probe(
        self,
        connect: Callable[[], object],
        *,
        still_down: Callable[[BaseException], bool] = is_database_outage,
    ) -> bool:
        """While down, call ``connect`` (a round trip, e.g. ``lambda: ping(engine)``) at most once per
        ``probe_interval``; a success ends the spell. A database error ``still_down`` accepts keeps it (any
        other is raised). True when the database is (now) up."""
        if not self.down:
            return True
        now = self._clock()
        with self._lock:
            if now - self._last_probe < self._probe_interval:
                return False
            self._last_probe = now
        try:
            connect()
        except (*DATABASE_ERRORS, *SCHEMA_ERRORS) as error:
            if still_down(error):
                return False
            raise
        self.succeeded()
        return True
