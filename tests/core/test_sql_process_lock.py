"""The lock file the processes share (``core.sqlite_queue``, ``FLASK_GATEWAY_SQLITE_QUEUE=lock``, not
the default): the thread holding its process's write turn takes an exclusive ``flock`` on
``<database>-writer.lock`` before ``BEGIN IMMEDIATE`` and gives it back with the turn, so a writer in
another process is woken as soon as the file is free instead of sleeping in SQLite's busy handler.

The other processes here are real: a fresh interpreter (``subprocess``, driven line by line through its
stdin and stdout) or a forked child (``multiprocessing``'s fork, as gunicorn forks its workers).
"""

from __future__ import annotations

import fcntl
import logging
import multiprocessing
import multiprocessing.queues
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, insert
from sqlalchemy.engine import Engine

from flask_gateway.core import sqlite_queue
from flask_gateway.core.sql import configure_sqlite
from flask_gateway.core.sqlite_queue import HELD, TIMED_OUT, queue_of
from tests.core.test_sql_queue import (
    PROMPTLY,
    file_locked,
    lock_file_of,
    metadata,
    rows,
    the_queue,
    wait_for,
    write,
    writes_promptly,
    written,
)

ROOT = Path(__file__).resolve().parents[2]
LOGGER = "flask_gateway.core.sqlite_queue"

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


def child_main() -> None:
    """The other process: ``python -c 'from tests.core.test_sql_process_lock import child_main; ...'``
    with the database URL as its argument; answers each command on stdin with a line on stdout."""
    engine = create_engine(sys.argv[1])
    configure_sqlite(engine)
    say("ready")
    holding = None
    for command in sys.stdin:
        match command.split():
            case ["write"]:
                say("starting")
                write(engine, "child")
                say(f"done {time.monotonic()!r}")
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
        self.expect("ready")

    def send(self, command: str) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()

    def expect(self, word: str) -> str:
        assert self.process.stdout is not None
        answer = self.process.stdout.readline().strip()
        assert answer.split(" ", 1)[0] == word, f"expected {word!r} from the child, got {answer!r}"
        return answer

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(PROMPTLY)
        for stream in (self.process.stdin, self.process.stdout):
            if stream is not None:
                stream.close()


def handoffs(engine: Engine, child: Child, rounds: int) -> list[float]:
    """Seconds from this process's commit to the end of the child's write that waited for it, per round:
    the child begins its write while this process holds the write lock for 250 ms (SQLite's busy
    handler would then be sleeping in steps of 100 ms)."""
    delays = []
    for _ in range(rounds):
        with engine.connect() as holder:
            holder.execute(insert(rows).values(value="parent"))
            child.send("write")
            child.expect("starting")
            time.sleep(0.25)
            holder.commit()
            committed = time.monotonic()
        done = float(child.expect("done").split()[1])
        delays.append(done - committed)
    return delays


def test_a_writer_in_another_process_is_woken_within_milliseconds_of_the_commit(
    make_engine: Callable[..., Engine],
):
    engine = make_engine()
    child = Child(str(engine.url))
    try:
        delays = handoffs(engine, child, rounds=5)
    finally:
        child.close()
    assert statistics.median(delays) < 0.03, delays  # SQLite's busy handler: 70 ms or more (below)
    assert len(written(engine)) == 10


def test_without_the_lock_file_the_other_process_sleeps_in_the_busy_handler(
    make_engine: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
):
    """The contrast that shows the test above measures the lock file: each process queued alone."""
    monkeypatch.setenv(sqlite_queue.QUEUE_ENVIRONMENT_VARIABLE, "process")
    engine = make_engine()
    assert the_queue(engine).file_lock is None
    child = Child(str(engine.url), mode="process")
    try:
        delays = handoffs(engine, child, rounds=5)
    finally:
        child.close()
    # The busy handler's sleep ends 0 to 100 ms after the commit, as it falls: one of five rounds at least
    # waits longer than the lock file's median allows (each wait is a lower bound: a load cannot shorten it).
    assert max(delays) > 0.03, delays


def test_the_lock_file_is_held_for_the_whole_write_transaction_of_another_process(
    make_engine: Callable[..., Engine],
):
    engine = make_engine()
    path = lock_file_of(engine)
    child = Child(str(engine.url))
    try:
        child.send("hold")
        child.expect("holding")
        assert file_locked(path)
        child.send("commit")
        child.expect("committed")
        assert not file_locked(path)
        writes_promptly(engine)
    finally:
        child.close()
    assert written(engine) == ["held by the child", "other"]


def test_a_process_killed_holding_the_lock_file_loses_it(make_engine: Callable[..., Engine]):
    engine = make_engine()
    path = lock_file_of(engine)
    child = Child(str(engine.url))
    try:
        child.send("hold")
        child.expect("holding")
        assert file_locked(path)
        child.process.send_signal(signal.SIGKILL)
        child.process.wait(PROMPTLY)
    finally:
        child.close()
    wait_for(lambda: not file_locked(path))
    started = time.monotonic()
    write(engine, "after the kill")
    assert time.monotonic() - started < 5  # SQLite's lock went with the process too
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
    try:
        context = multiprocessing.get_context("fork")
        answers: multiprocessing.queues.Queue[object] = context.Queue()
        child = context.Process(target=_take_in_child, args=(str(engine.url), answers))
        child.start()
        child.join(PROMPTLY * 2)
        assert child.exitcode == 0
        assert answers.get(timeout=1) is False  # the parent's state is not the child's
        assert answers.get(timeout=1) == TIMED_OUT  # the parent holds it: the child waits
        assert file_locked(path)  # still the parent's after the child closed its copy and exited
    finally:
        queue.release(turn)
    assert not file_locked(path)
    writes_promptly(engine)


# --- bounded waits, the fallback, the settings --------------------------------------------------------


def test_a_lock_file_held_elsewhere_holds_writers_up_for_the_busy_timeout_only(
    make_engine: Callable[..., Engine], caplog: pytest.LogCaptureFixture
):
    """Another process holds the lock file, not SQLite's lock (it hangs between the two): the writer waits
    the busy timeout, then SQLite's own lock decides. The helper thread left blocked in flock gives the
    lock back as soon as it gets it."""
    engine = make_engine(busy_timeout_ms=200)
    path = lock_file_of(engine)
    outside = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(outside, fcntl.LOCK_EX)
    try:
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger=LOGGER):
            write(engine, "after the timeout")
        assert 0.15 < time.monotonic() - started < PROMPTLY
        assert any("lock file" in record.getMessage() for record in caplog.records)
    finally:
        fcntl.flock(outside, fcntl.LOCK_UN)
        os.close(outside)
    wait_for(lambda: not file_locked(path))  # the helper got it for nobody: given back
    writes_promptly(engine)
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
