"""Rate limits that every worker process shares: the ``limits`` library (the engine of Flask-Limiter) on a
storage all processes see.

Where the counters live (``GATEWAY_RATELIMIT_STORAGE_URI``):

- unset (the default): the app's own database, table ``gateway_rate_limits`` (:class:`DatabaseStorage`):
  a shop on several gunicorn workers, or several machines on one database, shares them with no extra
  service. Each count is one short upsert (``INSERT ... ON CONFLICT DO UPDATE ... RETURNING``) on a
  connection of its own, committed at once, whatever the request's own transaction does; PostgreSQL and
  SQLite (3.35+) are supported.
- any storage URI of the ``limits`` library: ``redis://host:6379``, ``memcached://host:11211`` (with
  their client packages installed), or ``memory://`` (one process only: tests).

Flask-Limiter can use the same table: ``Limiter(storage_uri="flask-gateway-db://")`` (the example shop
does, for its login form). The storage finds the database through the current app's Flask-Gateway.

A storage that fails (the database or Redis is down) never stops a request: the limit is not applied and
a warning is logged ("fail open"): the rate limits keep floods cheap, they are not what proves anything.
When the storage is the database and the database is away (``core.outages.is_database_outage``), the
line is a DEBUG one: the request meets the outage again in its own work, which answers 503 and logs it
once per outage (``flask_gateway.outages``), not a traceback per request.
"""

from __future__ import annotations

import hashlib
import logging
import random
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Final, cast

from flask import current_app
from limits import RateLimitItem, parse
from limits.storage import Storage, storage_from_string
from limits.strategies import FixedWindowRateLimiter
from sqlalchemy import Table, case, delete, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.engine import Engine
from sqlalchemy.exc import SQLAlchemyError

from flask_gateway.core.outages import describe_database_error, is_database_outage
from flask_gateway.core.sql import sqlite_read_transactions
from flask_gateway.errors import ConfigurationError
from flask_gateway.models import RateLimitCounter
from flask_gateway.state import get_state

__all__ = ["DatabaseStorage", "RateLimit", "make_storage"]

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


def _key(key: str) -> str:
    if len(key) <= _KEY_LENGTH:
        return key
    return key[:180] + "#" + hashlib.sha256(key.encode("utf-8", "replace")).hexdigest()


class DatabaseStorage(Storage):
    """A ``limits`` storage on the current app's database (the ``gateway_rate_limits`` table).

    Fixed windows only (``FixedWindowRateLimiter``, Flask-Limiter's default strategy). Every call is its
    own short transaction on its own connection. On SQLite a connection waits for the write lock: call it
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
        with sqlite_read_transactions(), _engine().begin() as connection:
            row = connection.execute(
                select(table.c.count, table.c.expires_at).where(table.c.key == _key(key))
            ).first()
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


def make_storage(uri: str | None) -> Storage:
    """The storage named by ``GATEWAY_RATELIMIT_STORAGE_URI`` (None: the app's database)."""
    if not uri:
        return DatabaseStorage()
    try:
        storage = storage_from_string(uri)
    except Exception as error:  # limits raises ConfigurationError, or ImportError for a missing client
        raise ConfigurationError(
            f"GATEWAY_RATELIMIT_STORAGE_URI={uri!r} cannot be used: {error}. Leave it unset to keep the "
            "counters in the app's database, or give a limits storage URI such as redis://host:6379 "
            "(with the redis package installed)."
        ) from None
    if not isinstance(storage, Storage):
        raise ConfigurationError(
            f"GATEWAY_RATELIMIT_STORAGE_URI={uri!r} is an async storage: use a sync one (no async+ prefix)."
        )
    return storage


@dataclass(frozen=True)
class RateLimit:
    """One named limit per client (e.g. refused callbacks per client address), on a shared storage."""

    name: str
    item: RateLimitItem
    limiter: FixedWindowRateLimiter

    @classmethod
    def build(cls, name: str, spec: str, storage: Storage) -> RateLimit:
        """``spec`` in the ``limits`` notation: ``"30 per minute"``, ``"100/hour"``."""
        try:
            item = parse(spec)
        except ValueError:
            raise ConfigurationError(
                f"The {name} rate limit {spec!r} is not a limit such as '30 per minute' or '100/hour'."
            ) from None
        return cls(name=name, item=item, limiter=FixedWindowRateLimiter(storage))

    def retry_after(self, client: str) -> int | None:
        """Seconds until ``client`` may try again when it used up the limit, else None (also when the
        storage fails: a limit never stops a request because its own storage is down)."""
        try:
            if self.limiter.test(self.item, self.name, client):
                return None
            reset_at = self.limiter.get_window_stats(self.item, self.name, client).reset_time
        except Exception as error:
            _storage_failed(self.name, "not applied", error)
            return None
        return max(int(reset_at - time.time()) + 1, 1)

    def hit(self, client: str) -> None:
        """Count one request of ``client`` against the limit."""
        try:
            self.limiter.hit(self.item, self.name, client)
        except Exception as error:
            _storage_failed(self.name, "not counted", error)


def _storage_failed(name: str, what: str, error: Exception) -> None:
    if is_database_outage(error):
        _log.debug("rate limit %s: the database is away; %s (%s)", name, what, describe_database_error(error))
    else:
        _log.warning("rate limit %s: the storage failed; %s", name, what, exc_info=True)
