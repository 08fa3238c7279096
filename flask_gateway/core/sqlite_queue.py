"""SQLite writers of one process queue in order, per database file (no Flask here).

SQLite lets one transaction write at a time. A connection whose ``BEGIN IMMEDIATE`` finds the write lock
taken waits in SQLite's busy handler: it sleeps (1, 2, 5, 10 ... up to 100 ms a step) and tries again, so a
writer that has been unlucky once waits longer and longer, and a newcomer can overtake it: under
concurrency some writes wait ten times the usual time (the long tail). ``core.sql.configure_sqlite`` puts
a queue in front of ``BEGIN IMMEDIATE`` instead (``install``):

- **One queue per database file** in the process, keyed by the file's resolved path, shared by every
  engine configured on that file (the extension's and the emulator's alike); a database in memory has a
  queue of its own engine.
- **First come, first served.** A thread takes its turn before it issues ``BEGIN IMMEDIATE`` and keeps it
  until that transaction ends; the turn then passes to the thread that has waited longest, which is woken
  at once (no sleep-and-retry).
- **Every end of a transaction gives the turn back**: commit and rollback (the dialect's ``do_commit`` /
  ``do_rollback``, also the pool's reset of a connection checked in without a commit), a connection
  closed or invalidated (``do_close`` / ``do_terminate``, the pool's ``invalidate``), and a connection
  checked in still holding one (a pool without reset-on-return). Giving it back twice is harmless.
- **Read-only transactions** (``sqlite_read_transactions``: ``BEGIN`` DEFERRED) never take a turn.
- **Re-entrancy.** A thread that already holds the turn for a file and begins a write transaction on
  another connection to the same file (a second engine, inside its own open write) does not queue behind
  itself: it issues ``BEGIN IMMEDIATE`` at once, as without the queue, and SQLite's busy handler decides
  (it waits the busy timeout, then "database is locked": the thread's first transaction cannot end while
  the thread waits). That is what happened before the queue, no worse.
- **Bounded wait.** A thread waits for its turn at most the busy timeout. Then (a turn never given back:
  a connection leaked without being closed) it tries ``BEGIN IMMEDIATE`` once without waiting: SQLite's
  own lock says whether the file is free, and "database is locked" comes after the same time as before.
- **Across processes** the queue does not reach: writers of several processes (gunicorn workers) still
  meet in SQLite's busy handler, one per process at a time. ``FLASK_GATEWAY_SQLITE_QUEUE=poll`` (an
  experiment, off by default) makes the thread holding the turn wait for the other processes in short
  steps (0.2 to 1 ms: a ``BEGIN IMMEDIATE`` tried with no busy timeout, rolled back at once when it
  succeeds) before its own ``BEGIN IMMEDIATE``, instead of SQLite's steps of up to 100 ms.
- **A forked child** (gunicorn's workers) starts with every queue empty: the parent's threads are not in it.

The queue only decides the order: SQLite's lock still guarantees one writer, so a turn given back early
costs a wait in the busy handler, never a wrong write. ``FLASK_GATEWAY_SQLITE_QUEUE=0`` in the environment
turns the queue off for the engines configured afterwards (a diagnostic: to compare with the busy handler
alone, as ``benchmarks/figure_emulator.py`` does).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Final

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

__all__ = [
    "QUEUE_ENVIRONMENT_VARIABLE",
    "WriteQueue",
    "begin_immediate",
    "install",
    "queue_enabled",
    "queue_of",
]

_log = logging.getLogger(__name__)

#: ``0`` (or ``false``, ``no``, ``off``) turns the queue off for engines configured from then on.
QUEUE_ENVIRONMENT_VARIABLE: Final = "FLASK_GATEWAY_SQLITE_QUEUE"
#: ``Engine`` attribute: the engine's queue (None: configured with the queue off).
_ENGINE_QUEUE: Final = "_flask_gateway_write_queue"


def queue_enabled() -> bool:
    """The default for ``configure_sqlite``: on, unless ``FLASK_GATEWAY_SQLITE_QUEUE`` says off."""
    value = os.environ.get(QUEUE_ENVIRONMENT_VARIABLE, "").strip().lower()
    return value not in ("0", "false", "no", "off")


class _Turn:
    """One thread's place in a queue: waiting, then holding."""

    __slots__ = ("thread", "wakeup")

    def __init__(self, thread: int) -> None:
        self.thread = thread
        self.wakeup: threading.Condition | None = None


class WriteQueue:
    """A fair (first come, first served) lock with its turns handed over directly to the next waiter."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._lock = threading.Lock()
        self._holder: _Turn | None = None
        self._waiting: deque[_Turn] = deque()

    def __repr__(self) -> str:
        return f"<WriteQueue {self.name!r} held={self._holder is not None} waiting={len(self._waiting)}>"

    def acquire(self, timeout: float | None = None) -> _Turn | None:
        """Wait for this thread's turn (at most ``timeout`` seconds); the turn, or None after the timeout."""
        turn = _Turn(threading.get_ident())
        with self._lock:
            if self._holder is None and not self._waiting:
                self._holder = turn
                return turn
            turn.wakeup = threading.Condition(self._lock)
            self._waiting.append(turn)
            deadline = None if timeout is None else time.monotonic() + timeout
            while self._holder is not turn:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    self._waiting.remove(turn)
                    return None
                turn.wakeup.wait(remaining)
            return turn

    def release(self, turn: _Turn) -> bool:
        """Give the turn back (to the longest waiter); False when ``turn`` no longer holds it."""
        with self._lock:
            if self._holder is not turn:
                return False
            self._holder = self._waiting.popleft() if self._waiting else None
            if self._holder is not None and self._holder.wakeup is not None:
                self._holder.wakeup.notify()
            return True

    def _forget(self) -> None:
        """In a child process just forked: the parent's threads and transactions are not here."""
        self._lock = threading.Lock()
        self._holder = None
        self._waiting = deque()

    @property
    def holder_thread(self) -> int | None:
        """The ``threading.get_ident()`` of the thread holding the turn, if any."""
        holder = self._holder
        return None if holder is None else holder.thread

    @property
    def waiting(self) -> int:
        """How many threads wait for their turn."""
        return len(self._waiting)


# --- queues per database file ---------------------------------------------------------------------

_QUEUES: dict[str, WriteQueue] = {}
_QUEUES_LOCK = threading.Lock()
#: Every queue, those of databases in memory too (for ``_after_fork``).
_EVERY_QUEUE: weakref.WeakSet[WriteQueue] = weakref.WeakSet()


def _database_file(engine: Engine) -> str | None:
    """The resolved path of the engine's database file; None for a database in memory."""
    database = engine.url.database or ""
    if database in ("", ":memory:") or "mode=memory" in str(engine.url):
        return None
    if database.startswith("file:"):  # a URI filename (``?uri=true``): the path before its own query
        database = database.removeprefix("file:").split("?", 1)[0]
    return os.path.realpath(database)


def _queue_for(engine: Engine) -> WriteQueue:
    path = _database_file(engine)
    with _QUEUES_LOCK:
        queue = None if path is None else _QUEUES.get(path)
        if queue is None:
            queue = WriteQueue(f"memory:{id(engine):x}" if path is None else path)
            _EVERY_QUEUE.add(queue)
            if path is not None:
                _QUEUES[path] = queue
        return queue


def queue_of(engine: Engine) -> WriteQueue | None:
    """The write queue ``configure_sqlite`` gave ``engine``; None when it has none."""
    queue: WriteQueue | None = getattr(engine, _ENGINE_QUEUE, None)
    return queue


# --- turns held by connections --------------------------------------------------------------------

#: DB-API connection (by ``id``: sqlite3 connections take no attributes nor weak references) -> its turn.
_HELD: dict[int, tuple[WriteQueue, _Turn]] = {}
_HELD_LOCK = threading.Lock()


def _raw(connection: Any) -> Any:
    """The DB-API connection behind a pool's proxy (or the DB-API connection itself)."""
    return getattr(connection, "dbapi_connection", connection)


def _hold(dbapi_connection: Any, queue: WriteQueue, turn: _Turn) -> None:
    with _HELD_LOCK:
        stale = _HELD.get(id(dbapi_connection))
        _HELD[id(dbapi_connection)] = (queue, turn)
    if stale is not None:  # a connection begins no transaction inside another: left by one that is gone
        stale[0].release(stale[1])


def _give_back(dbapi_connection: Any) -> None:
    """The transaction of ``dbapi_connection`` has ended (or the connection has): release its turn."""
    if dbapi_connection is None:
        return
    with _HELD_LOCK:
        held = _HELD.pop(id(dbapi_connection), None)
    if held is not None and held[0].release(held[1]) and held[0].holder_thread is not None:
        time.sleep(0)  # the GIL to the thread just handed the turn now, not after this one's time slice


def begin_immediate(
    connection: Connection, queue: WriteQueue, busy_timeout_ms: int, *, poll: bool = False
) -> None:
    """``BEGIN IMMEDIATE`` on ``connection`` in this thread's turn of ``queue`` (held until it ends)."""
    if queue.holder_thread == threading.get_ident():
        # Re-entrant: this thread's other transaction holds the turn; waiting for it would wait forever.
        connection.exec_driver_sql("BEGIN IMMEDIATE")
        return
    dbapi_connection: Any = connection.connection.dbapi_connection
    turn = queue.acquire(busy_timeout_ms / 1000)
    if turn is None:
        _log.warning(
            "waited %d ms for the write turn of SQLite database %s: trying without it",
            busy_timeout_ms,
            queue.name,
        )
        dbapi_connection.execute("PRAGMA busy_timeout=0")
        try:
            connection.exec_driver_sql("BEGIN IMMEDIATE")
        finally:
            dbapi_connection.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")
        return
    _hold(dbapi_connection, queue, turn)
    try:
        if poll:
            _await_other_processes(dbapi_connection, busy_timeout_ms)
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    except BaseException:
        _give_back(dbapi_connection)
        raise


#: Pauses (s) between tries for a write lock another process holds (``FLASK_GATEWAY_SQLITE_QUEUE=poll``).
_POLL_STEPS: Final = (0.0002, 0.0005, 0.001)


def poll_enabled() -> bool:
    return os.environ.get(QUEUE_ENVIRONMENT_VARIABLE, "").strip().lower() == "poll"


def _await_other_processes(dbapi_connection: Any, busy_timeout_ms: int) -> None:
    """Wait in short steps (not SQLite's growing ones) until no other process holds the write lock."""
    dbapi_connection.execute("PRAGMA busy_timeout=0")
    try:
        deadline = time.monotonic() + busy_timeout_ms / 1000
        step = 0
        while True:
            try:
                dbapi_connection.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError:
                if time.monotonic() >= deadline:
                    return
                time.sleep(_POLL_STEPS[min(step, len(_POLL_STEPS) - 1)])
                step += 1
                continue
            dbapi_connection.execute("ROLLBACK")
            return
    finally:
        dbapi_connection.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")


def _after_fork() -> None:
    """A forked child (gunicorn's workers) starts with no turn held nor waited for: a thread of the parent
    that held one does not exist in the child, and would otherwise hold up its writers."""
    global _QUEUES_LOCK, _HELD_LOCK
    _QUEUES_LOCK, _HELD_LOCK = threading.Lock(), threading.Lock()
    _HELD.clear()
    for queue in list(_EVERY_QUEUE):
        queue._forget()


if hasattr(os, "register_at_fork"):  # not on Windows
    os.register_at_fork(after_in_child=_after_fork)


def _releasing(method: Callable[[Any], None]) -> Callable[[Any], None]:
    def wrapper(dbapi_connection: Any) -> None:
        try:
            method(dbapi_connection)
        finally:
            _give_back(_raw(dbapi_connection))

    return wrapper


def install(engine: Engine) -> WriteQueue:
    """Give ``engine`` its file's queue and release a turn at every end of a transaction (see above);
    ``begin_immediate`` takes the turns. Call once per engine, before it connects."""
    queue = _queue_for(engine)
    dialect = engine.dialect  # the engine's own (the pool resets and closes connections through it too)
    for name in ("do_commit", "do_rollback", "do_close", "do_terminate"):
        setattr(dialect, name, _releasing(getattr(dialect, name)))

    @event.listens_for(engine, "checkin")
    def _on_checkin(dbapi_connection: Any, _record: Any) -> None:
        _give_back(dbapi_connection)  # a pool that does not reset on return: the transaction is left open

    @event.listens_for(engine, "invalidate")
    def _on_invalidate(dbapi_connection: Any, _record: Any, _exception: Any) -> None:
        _give_back(dbapi_connection)

    setattr(engine, _ENGINE_QUEUE, queue)
    return queue
