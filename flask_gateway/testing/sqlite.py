"""A shop's SQLite file databases written without ``fsync`` for a test (:func:`sqlite_without_fsync`).

Imports the extension's state and the core; nothing of this package.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from flask import Flask
from sqlalchemy import event
from sqlalchemy.engine import Engine

from flask_gateway.core.sql import sqlite_in_memory
from flask_gateway.state import get_state


def sqlite_without_fsync(shop: Flask) -> Callable[[], None]:
    """Write the shop's SQLite file databases without ``fsync`` until the returned function is called.

    Every connection the shop's engines (Flask-SQLAlchemy's, each bind, and the extension's own) hand out
    gets ``PRAGMA synchronous=OFF``, and its own setting back when it returns to the pool: what a commit
    proves (locks, transactions, isolation, constraints) is unchanged; only the flush to disk a power cut
    would need is skipped. In-memory databases and other backends are left alone. The returned function
    removes the listeners (connections already handed out get their setting back when returned).
    """
    state = get_state(shop)
    with shop.app_context():
        engines = {id(engine): engine for engine in (*state.db.engines.values(), state.engine)}
    undo: list[Callable[[], None]] = []
    for engine in engines.values():
        if engine.dialect.name != "sqlite" or sqlite_in_memory(engine):
            continue
        undo.append(_without_fsync(engine))

    def restore() -> None:
        for step in undo:
            step()

    return restore


def _without_fsync(engine: Engine) -> Callable[[], None]:
    own: dict[int, Any] = {}  # connection id -> its synchronous setting before the checkout

    def checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        cursor = dbapi_connection.cursor()
        own[id(dbapi_connection)] = cursor.execute("PRAGMA synchronous").fetchone()[0]
        cursor.execute("PRAGMA synchronous=OFF")
        cursor.close()

    def checkin(dbapi_connection: Any, _record: Any) -> None:
        setting = own.pop(id(dbapi_connection), None)
        if setting is not None and dbapi_connection is not None:
            dbapi_connection.execute(f"PRAGMA synchronous={int(setting)}")

    event.listen(engine, "checkout", checkout)
    event.listen(engine, "checkin", checkin)

    def remove() -> None:
        event.remove(engine, "checkout", checkout)
        if not own:  # else a connection is still handed out: it gets its setting back when returned
            event.remove(engine, "checkin", checkin)

    return remove
