"""Rate limits that every worker process shares: the ``limits`` library (the engine of Flask-Limiter) on a
storage all processes see.

Where the counters live (``GATEWAY_RATELIMIT_STORAGE_URI``):

- unset (the default): the app's own database, table ``gateway_rate_limits`` (:class:`DatabaseStorage`):
  a shop on several gunicorn workers, or several machines on one database, shares them with no extra
  service. Each count is one short upsert (``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``) on a
  connection of its own, committed at once, whatever the request's own transaction does; PostgreSQL and
  SQLite (3.35+) are supported. A read (is the client over its limit?) is one statement on the request's
  own connection when the extension's session runs statement by statement there (a callback's first
  steps on PostgreSQL), else a short read-only transaction on a connection of its own.
- any storage URI of the ``limits`` library: ``redis://host:6379``, ``memcached://host:11211`` (with
  their client packages installed), or ``memory://`` (one process only: tests).

Flask-Limiter can use the same table: ``Limiter(storage_uri="flask-gateway-db://")`` (the example shop
does, for its login form). The storage finds the database through the current app's Flask-Gateway.

A storage that fails (the database or Redis is down) never stops a request: the limit is not applied
("fail open"): the rate limits keep floods cheap, they are not what proves anything. Each process logs
**one WARNING when its storage starts failing** (the error in one line; its traceback only when the
``flask_gateway.ratelimit`` logger is at DEBUG) and **one when it works again**, with how long it failed
and how many requests were let through meanwhile (:class:`StorageWatch`); the failures in between are
DEBUG lines. When the storage is the database and the database is away
(``core.outages.is_database_outage``), every line is a DEBUG one: the request meets the outage again in
its own work, which answers 503 and logs it once per outage (``flask_gateway.operations.outages``).
"""

from __future__ import annotations

import hashlib
import logging
import random
import threading
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar, Final, cast
from urllib.parse import urlsplit, urlunsplit

from flask import current_app
from limits import RateLimitItem, parse
from limits.storage import Storage, storage_from_string
from limits.strategies import FixedWindowRateLimiter
from sqlalchemy import Table, case, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import SQLAlchemyError

from flask_gateway.core.outages import describe_database_error, is_database_outage
from flask_gateway.core.spells import Spells
from flask_gateway.core.sql import sqlite_read_transactions
from flask_gateway.errors import ConfigurationError
from flask_gateway.models import RateLimitCounter
from flask_gateway.state import get_state

__all__ = ["DatabaseStorage", "RateLimit", "StorageWatch", "make_storage"]

_log = logging.getLogger("flask_gateway.ratelimit")

_TABLE: Final = cast(Table, RateLimitCounter.__table__)
#: ``RateLimitCounter.key`` is at most this long; longer keys are hashed.
_KEY_LENGTH: Final = 255
#: About one increment in this many also deletes the counters whose window ended (the table stays small).
_SWEEP_EVERY: Final = 200


class StorageBusy(SQLAlchemyError):
    """SQLite: this thread's own session holds the write lock, so another connection would wait for it."""


def _engine() -> Engine:
    state = get_state(current_app)
    engine = state.engine
    if engine.dialect.name == "sqlite" and state.session.in_transaction():
        # Every SQLite transaction of the extension holds the write lock (BEGIN IMMEDIATE): a connection
        # of its own would wait for this very thread until the busy timeout. Callers end it first.
        raise StorageBusy(
            "the extension's session holds a SQLite transaction in this thread: commit it first"
        )
    return engine


def _request_connection() -> Connection | None:
    """The request's own connection, when a read may share it: the extension's session runs statement by
    statement (PostgreSQL in autocommit: a callback's first steps, ``inbound.intake``), so the read is one
    statement, committed on its own, with no ``BEGIN``/``COMMIT`` and no second connection from the pool.
    None otherwise: inside a real transaction a failing read would abort the request's own work, and on
    SQLite a transaction holds the write lock."""
    state = get_state(current_app)
    if state.engine.dialect.name != "postgresql":
        return None
    session = state.session
    if not session.in_transaction():
        return None
    connection = session.connection()
    if connection.get_execution_options().get("isolation_level") != "AUTOCOMMIT":
        return None
    return connection


def _key(key: str) -> str:
    if len(key) <= _KEY_LENGTH:
        return key
    return key[:180] + "#" + hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()


class DatabaseStorage(Storage):
    """A ``limits`` storage on the current app's database (the ``gateway_rate_limits`` table).

    Fixed windows only (``FixedWindowRateLimiter``, Flask-Limiter's default strategy). Every call is its
    own short transaction on its own connection, except a read while the extension's session runs
    statement by statement on PostgreSQL (``_request_connection``): one statement on that session's
    connection. On SQLite a connection waits for the write lock: call it
    while the thread's own session holds no transaction (the extension does; Flask-Limiter's check runs in
    ``before_request``, before a view opens one).
    """

    STORAGE_SCHEME = ["flask-gateway-db"]  # noqa: RUF012 - the limits registry reads this list
    #: The storage URI that names this storage (for Flask-Limiter's ``RATELIMIT_STORAGE_URI``).
    URI: ClassVar[str] = "flask-gateway-db://"

    def __init__(self, uri: str | None = None, wrap_exceptions: bool = False, **options: Any) -> None:
        super().__init__(uri, wrap_exceptions=wrap_exceptions, **options)

    @property
    def base_exceptions(self) -> type[Exception] | tuple[type[Exception], ...]:
        return SQLAlchemyError

    def incr(self, key: str, expiry: int, amount: int = 1) -> int:
        engine = _engine()
        now = time.time()
        table = _TABLE
        dialect = engine.dialect.name
        insert: postgresql.Insert | sqlite.Insert
        if dialect == "postgresql":
            insert = postgresql.insert(table)
        elif dialect == "sqlite":
            insert = sqlite.insert(table)
        else:
            raise ConfigurationError(
                f"The database rate-limit storage supports PostgreSQL and SQLite, not {dialect}: set "
                "GATEWAY_RATELIMIT_STORAGE_URI to redis://... or memcached://... (see docs/configuration.md)."
            )
        values = insert.values(key=_key(key), count=amount, expires_at=now + expiry)
        ended = table.c.expires_at <= now
        statement = values.on_conflict_do_update(
            index_elements=[table.c.key],
            set_={
                "count": case((ended, amount), else_=table.c.count + amount),
                "expires_at": case((ended, now + expiry), else_=table.c.expires_at),
            },
        ).returning(table.c.count)
        with engine.begin() as connection:
            count = int(connection.execute(statement).scalar_one())
            if random.randrange(_SWEEP_EVERY) == 0:  # noqa: S311 - not a secret, a sampling rate
                connection.execute(delete(table).where(table.c.expires_at < now))
        return count

    def _row(self, key: str) -> tuple[int, float] | None:
        table = _TABLE
        query = select(table.c.count, table.c.expires_at).where(table.c.key == _key(key))
        shared = _request_connection()
        if shared is not None:
            try:
                row = shared.execute(query).first()
            except SQLAlchemyError:
                # The request's own session holds this connection: a read that fails (a disconnect
                # invalidates it) must not leave the session's transaction invalid for the request's own
                # work, which would meet PendingRollbackError (a 500) instead of reconnecting or a 503.
                get_state(current_app).session.rollback()
                raise
        else:
            with sqlite_read_transactions(), _engine().begin() as connection:
                row = connection.execute(query).first()
        if row is None or row[1] <= time.time():
            return None
        return int(row[0]), float(row[1])

    def get(self, key: str) -> int:
        row = self._row(key)
        return 0 if row is None else row[0]

    def get_expiry(self, key: str) -> float:
        row = self._row(key)
        return time.time() if row is None else row[1]

    def check(self) -> bool:
        try:
            self._row("flask-gateway-health")
        except SQLAlchemyError:
            return False
        return True

    def reset(self) -> int | None:
        with _engine().begin() as connection:
            removed = connection.execute(delete(_TABLE)).rowcount
        return int(removed)

    def clear(self, key: str) -> None:
        table = _TABLE
        with _engine().begin() as connection:
            connection.execute(delete(table).where(table.c.key == _key(key)))


class StorageWatch:
    """One rate-limit storage as this process sees it: working, or failing since when (thread-safe).

    ``label`` names the storage in the log lines (a URI with its password masked); ``clock`` is a monotonic
    clock in seconds (tests replace it).
    """

    def __init__(self, label: str, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.label = label
        self._clock = clock
        self._spells: Spells[None] = Spells(lambda: self._clock())

    @property
    def failing(self) -> bool:
        """True from the first failure until the next success."""
        return self._spells.failing(None)

    @property
    def let_through(self) -> int:
        """Requests let through unlimited during the current failing spell (0 when working)."""
        return self._spells.failures(None)

    def failed(self, name: str, what: str, error: Exception, *, let_through: bool) -> None:
        """A call of limit ``name`` failed (``what``: "not applied", "not counted"); the first failure of a
        spell logs one WARNING, the others a DEBUG line each."""
        first = self._spells.failed(None, count=int(let_through))
        reason = _describe(error)
        if not first:
            _log.debug("rate limit %s: the storage still fails; %s (%s)", name, what, reason)
            return
        _log.warning(
            "rate limits: the storage (%s) fails (%s): the limits are not applied, requests are let "
            "through, until it works again (one line will say when)",
            self.label,
            reason,
            exc_info=_log.isEnabledFor(logging.DEBUG),
        )

    def succeeded(self) -> None:
        """The storage answered; the first success after a failing spell logs one WARNING."""
        spell = self._spells.succeeded(None)
        if spell is None:
            return
        _log.warning(
            "rate limits: the storage (%s) works again after %.1f s; %d request(s) were let through "
            "without their limit meanwhile",
            self.label,
            spell.seconds,
            spell.failures,
        )


#: The watch of each storage (the limits built on one storage share its failing spells).
_WATCHES: weakref.WeakKeyDictionary[Storage, StorageWatch] = weakref.WeakKeyDictionary()
_WATCHES_LOCK = threading.Lock()


def watch_of(storage: Storage, label: str | None = None) -> StorageWatch:
    """The :class:`StorageWatch` of ``storage`` (made on first use, named ``label``)."""
    with _WATCHES_LOCK:
        watch = _WATCHES.get(storage)
        if watch is None:
            watch = _WATCHES[storage] = StorageWatch(label or type(storage).__name__)
        return watch


def _describe(error: Exception) -> str:
    """The error in one line, no traceback (a database error as ``core.outages`` words it)."""
    if isinstance(error, SQLAlchemyError):
        return describe_database_error(error)
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:300]}" if lines else type(error).__name__


def _mask(uri: str) -> str:
    """``uri`` with its password (if any) replaced by ``***``."""
    try:
        parts = urlsplit(uri)
        password = parts.password
    except ValueError:
        return uri.split("://", 1)[0] + "://..."
    if password is None:
        return uri
    netloc = parts.netloc.rsplit("@", 1)[1]
    user = parts.username or ""
    return urlunsplit((parts.scheme, f"{user}:***@{netloc}", parts.path, parts.query, parts.fragment))


def make_storage(uri: str | None) -> Storage:
    """The storage named by ``GATEWAY_RATELIMIT_STORAGE_URI`` (None: the app's database)."""
    if not uri:
        database = DatabaseStorage()
        watch_of(database, "the app's database")
        return database
    try:
        storage = storage_from_string(uri)
    except Exception as error:  # limits raises ConfigurationError, or ImportError for a missing client
        raise ConfigurationError(
            f"GATEWAY_RATELIMIT_STORAGE_URI={_mask(uri)!r} cannot be used: "
            f"{str(error).replace(uri, _mask(uri))}. Leave it unset to keep the "
            "counters in the app's database, or give a limits storage URI such as redis://host:6379 "
            "(with the redis package installed)."
        ) from None
    if not isinstance(storage, Storage):
        raise ConfigurationError(
            f"GATEWAY_RATELIMIT_STORAGE_URI={_mask(uri)!r} is an async storage: use a sync one (no async+ "
            "prefix)."
        )
    watch_of(storage, _mask(uri))
    return storage


@dataclass(frozen=True)
class RateLimit:
    """One named limit per client (e.g. refused callbacks per client address), on a shared storage."""

    name: str
    item: RateLimitItem
    limiter: FixedWindowRateLimiter
    #: The storage's failing spells, shared with the other limits on the same storage.
    watch: StorageWatch = field(default_factory=lambda: StorageWatch("the rate-limit storage"))

    @classmethod
    def build(cls, name: str, spec: str, storage: Storage) -> RateLimit:
        """``spec`` in the ``limits`` notation: ``"30 per minute"``, ``"100/hour"``."""
        try:
            item = parse(spec)
        except ValueError:
            raise ConfigurationError(
                f"The {name} rate limit {spec!r} is not a limit such as '30 per minute' or '100/hour'."
            ) from None
        return cls(name=name, item=item, limiter=FixedWindowRateLimiter(storage), watch=watch_of(storage))

    def retry_after(self, client: str) -> int | None:
        """Seconds until ``client`` may try again when it used up the limit, else None (also when the
        storage fails: a limit never stops a request because its own storage is down)."""
        try:
            if self.limiter.test(self.item, self.name, client):
                self.watch.succeeded()
                return None
            reset_at = self.limiter.get_window_stats(self.item, self.name, client).reset_time
        except Exception as error:
            self._failed("not applied", error, let_through=True)
            return None
        self.watch.succeeded()
        return max(int(reset_at - time.time()) + 1, 1)

    def hit(self, client: str) -> None:
        """Count one request of ``client`` against the limit."""
        try:
            self.limiter.hit(self.item, self.name, client)
        except Exception as error:
            self._failed("not counted", error, let_through=False)
        else:
            self.watch.succeeded()

    def _failed(self, what: str, error: Exception, *, let_through: bool) -> None:
        # the request's own work logs the outage (flask_gateway.operations.outages)
        if is_database_outage(error):
            _log.debug(
                "rate limit %s: the database is away; %s (%s)",
                self.name,
                what,
                describe_database_error(error),
            )
            return
        self.watch.failed(self.name, what, error, let_through=let_through)
