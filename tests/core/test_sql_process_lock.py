"""The lock file the processes share (``core.sqlite_queue``, ``FLASK_GATEWAY_SQLITE_QUEUE=lock``, the
default): the thread holding its process's write turn takes an exclusive ``flock`` on
``<database>-writer.lock`` before ``BEGIN IMMEDIATE`` and gives it back with the turn, so a writer in
another process is woken as soon as the file is free instead of sleeping in SQLite's busy handler.

The other processes here are real: a fresh interpreter (``subprocess``, driven line by line through its
stdin and stdout) or a forked child (``multiprocessing``'s fork, as gunicorn forks its workers).

Nothing here is timed: the tests follow the order of events (the child's writer waits in ``flock``, this
process commits, the child's ``BEGIN IMMEDIATE`` follows and needs no busy handler). How soon the other
process's writer is woken, against SQLite's busy handler, is figure 8 of ``make bench``
(``benchmarks/sqlite_writers.py --handoff``).
"""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import multiprocessing.queues
import os
import signal
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from queue import Empty, SimpleQueue
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import create_engine, event, insert
from sqlalchemy.engine import Engine
from sqlalchemy.exc import OperationalError

from flask_gateway.core import sqlite_queue
from flask_gateway.core.sql import configure_sqlite
from flask_gateway.core.sqlite_queue import HELD, TIMED_OUT, queue_of
from tests.core.test_sql_queue import (
    DEADLINE,
    FOREVER_MS,
    LOGGER,
    busy_timeouts_at_begin,
    file_locked,
    in_thread,
    lock_file_of,
    metadata,
    rows,
    the_queue,
    turn_given_back,
    wait_for,
    write,
    written,
)

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="flock and fork: POSIX only")


@pytest.fixture(autouse=True)
def lock_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engines here, and those of the child processes (they inherit the environment), use the lock."""
    monkeypatch.setenv(sqlite_queue.QUEUE_ENVIRONMENT_VARIABLE, "lock")


@pytest.fixture
def make_engine(tmp_path: Path) -> Iterator[Callable[..., Engine]]:
    engines: list[Engine] = []

    def make(name: str = "shared.db", **options: object) -> Engine:
        engine = create_engine(f"sqlite:///{tmp_path / name}")
        configure_sqlite(engine, **options)  # type: ignore[arg-type]
        metadata.create_all(engine)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.dispose()


# --- another interpreter, driven line by line --------------------------------------------------------


def say(text: str) -> None:
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


class _SayingFlock:
    """``fcntl`` as ``core.sqlite_queue`` sees it in the child: says ``waiting`` as a ``flock`` that
    blocks begins (the lock file's helper thread, waiting in the kernel for another process's lock)."""

    def __init__(self, module: ModuleType) -> None:
        self._module = module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._module, name)

    def flock(self, fd: int, operation: int) -> None:
        if operation == self._module.LOCK_EX:  # without LOCK_NB: blocks until the file is free
            say("waiting")
        self._module.flock(fd, operation)


def child_main() -> None:
    """The other process: ``python -c 'from tests.core.test_sql_process_lock import child_main; ...'``
    with the database URL as its argument; answers each command on stdin with a line on stdout.

    Its connections never wait in SQLite's busy handler (``busy_timeout`` 0, set after
    ``configure_sqlite``'s own): a ``BEGIN IMMEDIATE`` that meets another process's write lock fails at
    once and the child answers ``locked``, so a write that lands did not need the busy handler. Its waits
    for the turn and the lock file are bounded by an hour (``FOREVER_MS``): none gives up during a test.
    Along a write it says ``waiting`` when its writer blocks in ``flock`` and ``begin`` as it issues
    ``BEGIN IMMEDIATE``."""
    engine = create_engine(sys.argv[1])
    configure_sqlite(engine, busy_timeout_ms=FOREVER_MS)

    @event.listens_for(engine, "connect")
    def _no_busy_handler(dbapi_connection: Any, _record: Any) -> None:
        dbapi_connection.execute("PRAGMA busy_timeout=0")

    @event.listens_for(engine, "before_cursor_execute")
    def _say_begin(_connection: Any, _cursor: Any, statement: str, *_rest: Any) -> None:
        if statement == "BEGIN IMMEDIATE":
            say("begin")

    sqlite_queue.fcntl = _SayingFlock(fcntl)  # type: ignore[attr-defined,assignment]
    say("ready")
    holding = None
    for command in sys.stdin:
        match command.split():
            case ["write"]:
                say("starting")
                try:
                    write(engine, "child")
                except OperationalError as error:
                    say("locked" if "database is locked" in str(error) else f"failed {error!r}")
                else:
                    say("done")
            case ["hold"]:
                holding = engine.connect()
                holding.execute(insert(rows).values(value="held by the child"))
                say("holding")
            case ["commit"] if holding is not None:
                holding.commit()
                say("committed")
            case _:
                say(f"unknown command {command!r}")


class Child:
    """A fresh interpreter writing to the same file (its environment: this one's, with ``mode``)."""

    def __init__(self, url: str, mode: str | None = None) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        if mode is not None:
            env[sqlite_queue.QUEUE_ENVIRONMENT_VARIABLE] = mode
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-c",
                "from tests.core.test_sql_process_lock import child_main; child_main()",
                url,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
            env=env,
        )
        self._lines: SimpleQueue[str | None] = SimpleQueue()
        threading.Thread(target=self._read, name="child's stdout", daemon=True).start()
        self.expect("ready")

    def _read(self) -> None:
        assert self.process.stdout is not None
        for answer in self.process.stdout:
            self._lines.put(answer.strip())
        self._lines.put(None)  # its stdout is closed: it has exited

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def expect(self, word: str) -> str:
        """The child's next line, which must begin with ``word`` (waited for until the ``DEADLINE``)."""
        try:
            answer = self._lines.get(timeout=DEADLINE)
        except Empty:
            raise AssertionError(
                f"waited {DEADLINE:g} s for {word!r} from the child: it said nothing"
            ) from None
        assert answer is not None, f"expected {word!r} from the child, which exited ({self.process.poll()})"
        assert answer.split(" ", 1)[0] == word, f"expected {word!r} from the child, got {answer!r}"
        return answer

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(DEADLINE)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


def test_a_writer_in_another_process_waits_for_the_lock_file_not_in_sqlites_busy_handler(
    make_engine: Callable[..., Engine],
):
    """While this process holds a write transaction, the child's writer blocks in ``flock``; this process
    commits; only then does the child issue ``BEGIN IMMEDIATE``, which finds the file free (it may not wait
    in the busy handler: it would have answered ``locked``)."""
    engine = make_engine()
    child = Child(str(engine.url))
    try:
        for _ in range(3):
            with engine.connect() as holder:
                holder.execute(insert(rows).values(value="parent"))  # the turn, the lock file, SQLite's lock
                child.send("write")
                child.expect("starting")
                child.expect("waiting")  # in the kernel, for the lock file this process holds
                holder.commit()
            child.expect("begin")
            child.expect("done")
    finally:
        child.close()
    assert written(engine) == ["parent", "child"] * 3


def test_without_the_lock_file_the_other_process_meets_sqlites_lock(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
):
    """The contrast that shows the test above sees the lock file: each process queued alone, the child's
    ``BEGIN IMMEDIATE`` comes at once and meets this process's write lock, where with a busy timeout it
    would sleep in SQLite's busy handler (by how much: figure 8 of ``make bench``)."""
    monkeypatch.setenv(sqlite_queue.QUEUE_ENVIRONMENT_VARIABLE, "process")
    engine = make_engine()
    assert the_queue(engine).file_lock is None
    child = Child(str(engine.url), mode="process")
    try:
        with engine.connect() as holder:
            holder.execute(insert(rows).values(value="parent"))
            child.send("write")
            child.expect("starting")
            child.expect("begin")  # no lock file to wait for
            child.expect("locked")  # SQLite's lock, held by this process
            holder.commit()
        child.send("write")  # the file free: it writes
        child.expect("starting")
        child.expect("begin")
        child.expect("done")
    finally:
        child.close()
    assert written(engine) == ["parent", "child"]


def test_the_lock_file_is_held_for_the_whole_write_transaction_of_another_process(
    make_engine: Callable[..., Engine],
):
    engine = make_engine()
    path = lock_file_of(engine)
    child = Child(str(engine.url))
    try:
        child.send("hold")
        child.expect("begin")
        child.expect("holding")
        assert file_locked(path)
        child.send("commit")
        child.expect("committed")
        assert not file_locked(path)
        turn_given_back(engine)
    finally:
        child.close()
    assert written(engine) == ["held by the child", "other"]


def test_a_process_killed_holding_the_lock_file_loses_it(make_engine: Callable[..., Engine]):
    engine = make_engine()
    path = lock_file_of(engine)
    child = Child(str(engine.url))
    try:
        child.send("hold")
        child.expect("begin")
        child.expect("holding")
        assert file_locked(path)
        child.process.send_signal(signal.SIGKILL)
        child.process.wait(DEADLINE)
    finally:
        child.close()
    wait_for(lambda: not file_locked(path), "the kernel to release the lock file of the killed process")
    # SQLite's lock went with the process too: a BEGIN IMMEDIATE that may not wait gets it.
    probe = sqlite3.connect(the_queue(engine).path or "", timeout=0, isolation_level=None)
    try:
        probe.execute("BEGIN IMMEDIATE")
        probe.execute("ROLLBACK")
    finally:
        probe.close()
    with engine.connect() as connection:
        connection.execute(insert(rows).values(value="after the kill"))
        assert the_queue(engine).file_lock.held and file_locked(path)  # type: ignore[union-attr]
        connection.commit()
    assert written(engine) == ["after the kill"]  # the child's transaction was never committed


# --- fork ------------------------------------------------------------------------------------------------


def _take_in_child(url: str, answers: multiprocessing.queues.Queue[object]) -> None:
    engine = create_engine(url)
    configure_sqlite(engine)
    queue = queue_of(engine)
    assert queue is not None and queue.file_lock is not None
    answers.put(queue.file_lock.held)
    answers.put(queue.file_lock.acquire(0.3))


def test_a_forked_child_does_not_share_its_parents_lock_and_leaves_it_held(
    make_engine: Callable[..., Engine],
):
    """A descriptor inherited through fork shares the parent's flock: the child opens the file again, and
    its exit (closing the inherited descriptor) does not give the parent's lock back."""
    engine = make_engine()
    queue = the_queue(engine)
    path = lock_file_of(engine)
    engine.dispose()  # no SQLite connection open across the fork (SQLite's own rule)
    turn = queue.acquire()
    assert turn is not None and queue.lock_file(turn, 1.0) == HELD
    context = multiprocessing.get_context("fork")
    answers: multiprocessing.queues.Queue[object] = context.Queue()
    child = context.Process(target=_take_in_child, args=(str(engine.url), answers))
    try:
        child.start()
        child.join(DEADLINE)
        assert child.exitcode == 0, f"the forked child has not ended in {DEADLINE:g} s ({child.exitcode})"
        assert answers.get(timeout=DEADLINE) is False  # the parent's state is not the child's
        assert answers.get(timeout=DEADLINE) == TIMED_OUT  # the parent holds it: the child's wait ends
        assert file_locked(path)  # still the parent's after the child closed its copy and exited
    finally:
        queue.release(turn)
        if child.is_alive():
            child.kill()
            child.join(DEADLINE)
    assert not file_locked(path)
    turn_given_back(engine)


# --- bounded waits, the fallback, the settings --------------------------------------------------------


def test_a_lock_file_held_elsewhere_holds_writers_up_for_the_busy_timeout_only(
    make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture
):
    """Another process holds the lock file, not SQLite's lock (it hangs between the two): the writer waits
    for it at most the busy timeout, then tries ``BEGIN IMMEDIATE`` once without waiting and SQLite's own
    lock decides. Seen by the order of events, not their time: the writer's helper thread blocks in
    ``flock``, the WARNING that it waited, one ``BEGIN IMMEDIATE`` with the connection's busy timeout 0,
    the write landed, all while the lock file is still held elsewhere. The helper left blocked in ``flock``
    gives the lock back as soon as it gets it."""
    engine = make_engine(busy_timeout_ms=200)
    path = lock_file_of(engine)
    begins = busy_timeouts_at_begin(engine)
    outside = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(outside, fcntl.LOCK_EX)
    try:
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            in_thread(
                lambda: write(engine, "after the timeout"),
                "a writer behind a lock file held elsewhere (its wait is bounded by the busy timeout, 0.2 s)",
            )
        assert file_locked(path)  # still held elsewhere: the writer did not wait for it to be given back
        helpers = {thread.name for thread in threading.enumerate()}
        assert f"sqlite-writer-lock {path}" in helpers  # it waited in flock first, and the helper still does
    finally:
        fcntl.flock(outside, fcntl.LOCK_UN)
        os.close(outside)
    warnings = [record.getMessage() for record in caplog.records if record.name == LOGGER]
    assert len(warnings) == 1 and warnings[0].startswith("waited 200 ms for the lock file"), warnings
    assert begins == [0]
    # The helper's flock returns once the lock is free: until it has given the lock back and left flock
    # (no longer pending), a probe may find the file free for the instant before the helper takes it.
    lock = the_queue(engine).file_lock
    assert lock is not None
    wait_for(
        lambda: not lock._pending and not file_locked(path),
        "the helper thread to give back the lock it got for nobody",
    )
    turn_given_back(engine)
    assert written(engine) == ["after the timeout", "other"]


def test_a_lock_file_that_cannot_be_made_leaves_the_queue_in_the_process_with_one_warning(
    make_engine: Callable[..., Engine], tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    lock = tmp_path / f"unlockable.db{sqlite_queue.LOCK_FILE_SUFFIX}"
    lock.symlink_to(tmp_path / "no such folder" / "lock")  # cannot be created, even by root
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        engine = make_engine("unlockable.db")
        for number in range(3):
            write(engine, f"w{number}")
    warnings = [record for record in caplog.records if record.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(lock) in warnings[0].getMessage()
    assert the_queue(engine).file_lock.unavailable  # type: ignore[union-attr]
    assert written(engine) == ["w0", "w1", "w2"]
    assert the_queue(engine).holder_thread is None


def test_a_database_in_memory_needs_no_lock_file(caplog: pytest.LogCaptureFixture):
    engine = create_engine("sqlite://")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        configure_sqlite(engine)
        metadata.create_all(engine)
        write(engine, "in memory")
    assert the_queue(engine).file_lock is None and not caplog.records
    assert written(engine) == ["in memory"]


@pytest.mark.parametrize(
    ("value", "file_lock"),
    [(None, True), ("1", True), ("on", True), ("lock", True), ("process", False), ("poll", False)],
)
def test_the_setting_chooses_the_lock_file(
    value: str | None, file_lock: bool, make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
):
    if value is None:
        monkeypatch.delenv(sqlite_queue.QUEUE_ENVIRONMENT_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(sqlite_queue.QUEUE_ENVIRONMENT_VARIABLE, value)
    engine = make_engine()
    assert (the_queue(engine).file_lock is not None) is file_lock
    with engine.connect() as connection:
        connection.execute(insert(rows).values(value="x"))
        assert file_locked(f"{the_queue(engine).path}{sqlite_queue.LOCK_FILE_SUFFIX}") is file_lock
        connection.commit()


def test_an_unknown_setting_is_the_default_with_a_warning(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    monkeypatch.setenv(sqlite_queue.QUEUE_ENVIRONMENT_VARIABLE, "sometimes")
    monkeypatch.setattr(sqlite_queue, "_warned", set())  # warned once per value and process
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        engine = make_engine()
    assert the_queue(engine).file_lock is not None  # the default: the lock file across processes
    assert "'sometimes'" in caplog.text and sqlite_queue.DEFAULT_MODE in caplog.text
    assert sqlite_queue.DEFAULT_MODE == sqlite_queue.LOCK


def test_write_queue_true_or_false_overrides_the_setting(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv(sqlite_queue.QUEUE_ENVIRONMENT_VARIABLE, "0")
    assert queue_of(make_engine("off.db")) is None
    assert the_queue(make_engine("forced.db", write_queue=True)).file_lock is not None  # the default
    monkeypatch.setenv(sqlite_queue.QUEUE_ENVIRONMENT_VARIABLE, "lock")
    assert queue_of(make_engine("unqueued.db", write_queue=False)) is None
