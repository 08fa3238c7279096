"""SQLite writers queue in order, per database file: the threads of a process, and the processes (no Flask).

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
- **Across processes: a lock file** (the default, ``lock``: on the quiet machine it gave the lowest tail and
  the most writes, see docs/performance.md). The thread holding its process's turn
  then takes an exclusive ``flock`` on a file next to the database, ``<database>-writer.lock`` (created when
  missing, never deleted, opened once per process and file), before its ``BEGIN IMMEDIATE``, and gives it back
  with the turn, at every end of the transaction. Writers of other processes (gunicorn's workers) wait in the
  kernel, and are woken as soon as it is given back, instead of sleeping in SQLite's busy handler. The kernel
  hands a freed lock to whichever waiter runs first: no strict order between processes, but no writer sleeps
  while the file is free. A process that dies holding the lock loses it (the kernel releases it with the
  process's descriptors). The wait is bounded by the busy timeout too: a helper thread of the process blocks
  in ``flock`` for the waiting thread, which waits for it at most the busy timeout and then tries ``BEGIN
  IMMEDIATE`` once without waiting, as above (a lock the helper gets afterwards for nobody is given back at
  once). Where the file cannot be opened or locked (a read-only folder, a file system without ``flock``) the
  writers queue within their process only, with one WARNING per file and process; a database in memory needs
  no lock file (no other process can open it).
- **A forked child** (gunicorn's workers) starts with every queue empty: the parent's threads are not in
  it. It opens the lock file again (a descriptor inherited from the parent would share the parent's lock)
  and closes the inherited one, which leaves the parent's lock alone.

The queue and the lock file only decide the order: SQLite's lock still guarantees one writer, and writers
that use neither (the ``sqlite3`` shell, the shop's own engine, another program) still meet SQLite's
lock and its busy handler. A turn or lock given back early costs a wait in the busy handler, never a
wrong write. ``FLASK_GATEWAY_SQLITE_QUEUE`` in the environment chooses, for the engines configured from
then on (a diagnostic: to compare, as ``benchmarks/figure_emulator.py --queue`` does): unset, ``1``,
``on`` or ``true``: the default, ``lock``; ``process``: the queue within each process only (the
processes' writers meet in SQLite's busy handler); ``lock``: the queue and the lock file; ``poll`` (an
experiment): the queue, then the thread holding the turn waits for the other processes in short steps
(0.2 to 1 ms: a ``BEGIN IMMEDIATE`` tried with no busy timeout, rolled back at once when it succeeds);
``0``, ``off`` or ``false``: no queue, SQLite's busy handler alone. Any other value: the default, with a
WARNING.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import sqlite3
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from typing import Any, Final, cast

from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

try:  # POSIX; elsewhere (Windows) the writers queue within their process only
    import fcntl
except ImportError:  # pragma: no cover - not on the platforms the project runs on
    fcntl = None  # type: ignore[assignment]

__all__ = [
    "DEFAULT_MODE",
    "LOCK_FILE_SUFFIX",
    "MODES",
    "QUEUE_ENVIRONMENT_VARIABLE",
    "FileLock",
    "WriteQueue",
    "begin_immediate",
    "install",
    "queue_enabled",
    "queue_mode",
    "queue_of",
]

_log = logging.getLogger(__name__)

#: Chooses the queue for the engines configured from then on (the module's description lists its values).
QUEUE_ENVIRONMENT_VARIABLE: Final = "FLASK_GATEWAY_SQLITE_QUEUE"
#: No queue: SQLite's busy handler alone.
OFF: Final = "off"
#: The queue orders the threads of each process; processes meet in SQLite's busy handler.
PROCESS: Final = "process"
#: ``PROCESS``, and the turn's holder waits for other processes in short steps (an experiment).
POLL: Final = "poll"
#: ``PROCESS``, and the turn's holder takes the lock file shared by the processes.
LOCK: Final = "lock"
MODES: Final = (OFF, PROCESS, POLL, LOCK)
#: What an unset variable (or ``1``, ``on``, ``true``, ``yes``) means.
DEFAULT_MODE: Final = LOCK
#: The lock file is the database file's path with this after it.
LOCK_FILE_SUFFIX: Final = "-writer.lock"
_ON: Final = ("", "1", "on", "true", "yes")
_OFF: Final = ("0", "off", "false", "no")
#: ``Engine`` attribute: the engine's queue (None: configured with the queue off).
_ENGINE_QUEUE: Final = "_flask_gateway_write_queue"
_warned: set[str] = set()


def queue_mode() -> str:
    """The setting of ``FLASK_GATEWAY_SQLITE_QUEUE``: one of ``MODES`` (an unknown value: the default)."""
    value = os.environ.get(QUEUE_ENVIRONMENT_VARIABLE, "").strip().lower()
    if value in _ON:
        return DEFAULT_MODE
    if value in _OFF:
        return OFF
    if value in MODES:
        return value
    if value not in _warned:
        _warned.add(value)
        _log.warning(
            "%s=%r is not one of 1, 0, %s: the default (%s)",
            QUEUE_ENVIRONMENT_VARIABLE,
            value,
            ", ".join(MODES),
            DEFAULT_MODE,
        )
    return DEFAULT_MODE


def queue_enabled() -> bool:
    """The default for ``configure_sqlite``: a queue, unless ``FLASK_GATEWAY_SQLITE_QUEUE`` says off."""
    return queue_mode() != OFF


# --- the lock file shared by the processes ----------------------------------------------------------

#: ``FileLock.acquire``'s answers.
HELD: Final = "held"
TIMED_OUT: Final = "timed out"
UNAVAILABLE: Final = "unavailable"
#: Seconds a helper thread with nothing to wait for stays before it ends.
_HELPER_IDLE: Final = 60.0


class FileLock:
    """An exclusive ``flock`` on one file, taken for its process by one thread at a time (the thread that
    holds the process's turn of the database's ``WriteQueue``): it orders the writers of the processes.

    ``acquire`` tries the lock without blocking; when another process holds it, a helper thread blocks in
    ``flock`` (the kernel wakes it as soon as the lock is free) while the asking thread waits for the
    helper at most its timeout. A lock the helper gets after its asker gave up is given back at once."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._reset()

    def _reset(self) -> None:
        self._fd: int | None = None
        self._changed = threading.Condition(threading.Lock())
        self._wanted = False  # a thread waits for the helper to get the lock
        self._held = False
        self._pending = False  # the helper is blocked in flock
        self._helper: threading.Thread | None = None
        #: Why the file cannot be locked here (then it is not tried again in this process).
        self.unavailable: str | None = None

    def __repr__(self) -> str:
        return f"<FileLock {self.path!r} held={self._held}>"

    def __del__(self) -> None:  # its queue is gone (no engine on the file): close the descriptor
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)

    @property
    def held(self) -> bool:
        """This process holds the lock."""
        return self._held

    def acquire(self, timeout: float) -> str:
        """Take the lock, waiting at most ``timeout`` seconds: ``HELD``, ``TIMED_OUT`` or ``UNAVAILABLE``."""
        with self._changed:
            if self.unavailable is not None:
                return UNAVAILABLE
            if self._held:
                return HELD
            try:
                fd = self._descriptor()
                if not self._pending:  # the helper is not mid-flock on this descriptor: try at once
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    self._held = True
                    return HELD
            except BlockingIOError:
                pass  # another process holds it
            except OSError as error:
                self._give_up(error)
                return UNAVAILABLE
            self._wanted = True
            if self._helper is None:
                self._helper = threading.Thread(
                    target=self._wait_in_flock, name=f"sqlite-writer-lock {self.path}", daemon=True
                )
                self._helper.start()
            self._changed.notify_all()
            deadline = time.monotonic() + timeout
            while not self._held:
                remaining = deadline - time.monotonic()
                if self.unavailable is not None or remaining <= 0:
                    self._wanted = False
                    return UNAVAILABLE if self.unavailable is not None else TIMED_OUT
                self._changed.wait(remaining)
            return HELD

    def release(self) -> None:
        """Give the lock back (harmless when not held)."""
        with self._changed:
            self._wanted = False
            if self._held:
                self._held = False
                self._unlock()

    def _descriptor(self) -> int:
        if fcntl is None:  # pragma: no cover - Windows
            raise OSError(errno.ENOSYS, "no flock on this platform")
        if self._fd is None:
            flags = os.O_CLOEXEC
            try:
                self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | flags, 0o666)
            except OSError as error:
                if error.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
                    raise
                # Made by another user, or on a read-only file system: flock needs no write access.
                self._fd = os.open(self.path, os.O_RDONLY | flags)
        return self._fd

    def _unlock(self) -> None:
        if self._fd is not None:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            except OSError:  # pragma: no cover - unlocking a descriptor we locked does not fail
                _log.exception("could not unlock %s", self.path)

    def _give_up(self, error: OSError) -> None:
        self.unavailable = f"{type(error).__name__}: {error}"
        _log.warning(
            "cannot lock %s (%s): the writers of this SQLite database queue within their process only, "
            "other processes' writers meet in SQLite's busy handler",
            self.path,
            self.unavailable,
        )

    def _wait_in_flock(self) -> None:
        """The helper thread: block in flock whenever a thread of this process wants the lock."""
        changed = self._changed
        while True:
            with changed:
                while not self._wanted or self._held:
                    if not changed.wait(_HELPER_IDLE) and not self._wanted:
                        self._helper = None
                        return
                fd = cast(int, self._fd)  # opened by the asker before it wanted the lock
                self._pending = True
            error: OSError | None = None
            try:
                fcntl.flock(fd, fcntl.LOCK_EX)  # blocks, the GIL released, until the lock is free
            except OSError as exc:
                error = exc
            with changed:
                self._pending = False
                if error is not None:
                    self._give_up(error)
                    self._helper = None
                    changed.notify_all()
                    return
                if self._wanted and not self._held:
                    self._held = True
                    changed.notify_all()
                else:  # its asker gave up meanwhile
                    self._unlock()

    def _after_fork(self) -> None:
        """In a child just forked: the inherited descriptor shares the parent's lock (flock belongs to the
        open file, not the process), so close it (the parent's lock stays) and open the file again."""
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
        self._reset()


class _Turn:
    """One thread's place in a queue: waiting, then holding (and perhaps holding the lock file too)."""

    __slots__ = ("file_locked", "thread", "wakeup")

    def __init__(self, thread: int) -> None:
        self.thread = thread
        self.wakeup: threading.Condition | None = None
        self.file_locked = False


class WriteQueue:
    """A fair (first come, first served) lock with its turns handed over directly to the next waiter;
    with a ``file_lock``, the holder can also take the lock file the processes share."""

    def __init__(self, name: str, path: str | None = None) -> None:
        self.name = name
        #: The database file's resolved path (None: a database in memory).
        self.path = path
        #: The lock file shared by the processes, when an engine of this queue uses it.
        self.file_lock: FileLock | None = None
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
        """Give the turn back (to the longest waiter), and the lock file with it; False when ``turn`` no
        longer holds it."""
        with self._lock:
            if self._holder is not turn:
                return False
            if turn.file_locked and self.file_lock is not None:
                turn.file_locked = False
                self.file_lock.release()  # first: the other processes' writers may take it now
            self._holder = self._waiting.popleft() if self._waiting else None
            if self._holder is not None and self._holder.wakeup is not None:
                self._holder.wakeup.notify()
            return True

    def use_file_lock(self) -> None:
        """Let the holder of a turn take the lock file next to the database (not for one in memory)."""
        with self._lock:
            if self.file_lock is None and self.path is not None:
                self.file_lock = FileLock(self.path + LOCK_FILE_SUFFIX)

    def lock_file(self, turn: _Turn, timeout: float) -> str:
        """The holder of ``turn`` takes the lock file (``FileLock.acquire``'s answer), given back with it."""
        file_lock = self.file_lock
        if file_lock is None:
            return UNAVAILABLE
        answer = file_lock.acquire(timeout)
        if answer == HELD:
            with self._lock:
                if self._holder is turn:
                    turn.file_locked = True
                    return HELD
            file_lock.release()  # the turn was given back meanwhile: so is the lock
            return TIMED_OUT
        return answer

    def _forget(self) -> None:
        """In a child process just forked: the parent's threads and transactions are not here."""
        self._lock = threading.Lock()
        self._holder = None
        self._waiting = deque()
        if self.file_lock is not None:
            self.file_lock._after_fork()

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

#: Queues by file, while an engine holds them (a test suite makes thousands of files: their lock files'
#: descriptors close with their queues).
_QUEUES: weakref.WeakValueDictionary[str, WriteQueue] = weakref.WeakValueDictionary()
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
            queue = WriteQueue(f"memory:{id(engine):x}" if path is None else path, path)
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
    connection: Connection, queue: WriteQueue, busy_timeout_ms: int, *, mode: str = DEFAULT_MODE
) -> None:
    """``BEGIN IMMEDIATE`` on ``connection`` in this thread's turn of ``queue`` (held until it ends); with
    ``mode`` ``LOCK`` the turn takes the lock file shared by the processes first, with ``POLL`` it waits
    for the other processes' writers in short steps."""
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
        _begin_without_waiting(connection, dbapi_connection, busy_timeout_ms)
        return
    _hold(dbapi_connection, queue, turn)
    try:
        if mode == LOCK and queue.lock_file(turn, busy_timeout_ms / 1000) == TIMED_OUT:
            _log.warning(
                "waited %d ms for the lock file %s (another process's writer of SQLite database %s): "
                "trying without it",
                busy_timeout_ms,
                queue.file_lock.path if queue.file_lock is not None else "-",
                queue.name,
            )
            _begin_without_waiting(connection, dbapi_connection, busy_timeout_ms)
            return
        if mode == POLL:
            _await_other_processes(dbapi_connection, busy_timeout_ms)
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    except BaseException:
        _give_back(dbapi_connection)
        raise


def _begin_without_waiting(connection: Connection, dbapi_connection: Any, busy_timeout_ms: int) -> None:
    """One ``BEGIN IMMEDIATE`` with no busy timeout: SQLite's own lock says whether the file is free."""
    dbapi_connection.execute("PRAGMA busy_timeout=0")
    try:
        connection.exec_driver_sql("BEGIN IMMEDIATE")
    finally:
        dbapi_connection.execute(f"PRAGMA busy_timeout={int(busy_timeout_ms)}")


#: Pauses (s) between tries for a write lock another process holds (``FLASK_GATEWAY_SQLITE_QUEUE=poll``).
_POLL_STEPS: Final = (0.0002, 0.0005, 0.001)


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


def install(engine: Engine, mode: str = DEFAULT_MODE) -> WriteQueue:
    """Give ``engine`` its file's queue and release a turn at every end of a transaction (see above);
    ``begin_immediate`` takes the turns (and with ``mode`` ``LOCK`` the lock file next to the database).
    Call once per engine, before it connects."""
    queue = _queue_for(engine)
    if mode == LOCK:
        queue.use_file_lock()
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
