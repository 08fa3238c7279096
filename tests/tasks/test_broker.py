"""The broker going away, and beat's schedule file, with real processes: ``redis-server`` stopped and
started again on its port under a running Celery worker, and ``celery beat`` run in an empty folder.

- With the gateway's settings (``RELIABILITY``: ``broker_connection_max_retries = None``) a worker that
  loses Redis keeps retrying, stays up, and runs the tasks sent once Redis is back.
- With Celery's own limit in place (here 1 retry instead of the default 100) the worker gives up and
  exits with status 1: what the setting prevents (docs/operations.md, "While Redis is down").
- ``celery beat`` keeps its schedule file in the Flask app's instance folder (made when beat starts) and
  leaves nothing in its working directory.

The app is ``tests/tasks/broker_app.py`` (no database). Every process is stopped at the end, on failure too.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from flask_gateway.tasks import BEAT_SCHEDULE_FILE, RELIABILITY
from tests import secret_watch
from tests.processes import free_port, wait_for
from tests.redis_server import find_redis_server

ROOT = Path(__file__).resolve().parents[2]
#: The longest a worker, beat or Redis may take to start or to say something (a last resort).
START_TIMEOUT = 60.0
#: How many of the worker's reconnection attempts fail (2 s, then 4 s apart) before Redis is back.
FAILED_ATTEMPTS = 2


@dataclass
class Redis:
    """``redis-server`` on a fixed port, stopped and started again on it (nothing kept on disk)."""

    root: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = find_redis_server()
        if binary is None:
            pytest.fail("redis-server is not installed: run scripts/ensure-system-packages", pytrace=False)
        command = [
            binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--daemonize", "no", "--dir", str(self.root), "--logfile", "",
        ]  # fmt: skip
        with (self.root / "redis.log").open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        wait_for(
            self.ping, interval=0.05, what=f"redis-server on port {self.port}", logs=[self.root / "redis.log"]
        )

    def ping(self) -> bool:
        import socket

        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


@dataclass
class Process:
    """A ``celery`` process (worker or beat), the leader of its own process group."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_bytes().decode(errors="replace")

    def alive(self) -> bool:
        return self.process.poll() is None

    def wait_log(self, text: str, *, timeout: float = START_TIMEOUT) -> None:
        try:
            wait_for(lambda: text in self.log(), timeout=timeout, interval=0.1, what=repr(text))
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.log()[-4000:]}") from None

    def exit_status(self, *, timeout: float = START_TIMEOUT) -> int:
        """Wait for the process to exit; its status. The deadline's failure shows the end of its log."""
        try:
            return self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(
                f"the process did not exit within {timeout} s:\n{self.log()[-4000:]}"
            ) from None

    def stop(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=10)


@pytest.fixture
def redis(tmp_path: Path) -> Iterator[Redis]:
    folder = tmp_path / "redis"
    folder.mkdir()
    server = Redis(root=folder, port=free_port())
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def spawn(tmp_path: Path) -> Iterator[Any]:
    """Start ``celery -A tests.tasks.broker_app:celery <arguments>`` in ``cwd`` with the app's environment."""
    started: list[Process] = []

    def start(*arguments: str, broker: str, instance: Path, cwd: Path, **env: str) -> Process:
        log_path = tmp_path / f"celery-{len(started)}.log"
        environment = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "BROKER_TEST_URL": broker,
            "BROKER_TEST_INSTANCE": str(instance),
            **env,
        }
        command = [sys.executable, "-m", "celery", "-A", "tests.tasks.broker_app:celery", *arguments]
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                command,
                env=environment,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=cwd,
                start_new_session=True,
            )
        secret_watch.watch_file(log_path)
        started.append(Process(process, log_path))
        return started[-1]

    try:
        yield start
    finally:
        for process in started:
            process.stop()


def _worker(spawn: Any, redis: Redis, instance: Path, tmp_path: Path, **env: str) -> Process:
    worker = spawn(
        "worker", "--pool", "solo", "--loglevel", "INFO",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
        broker=redis.url, instance=instance, cwd=tmp_path, **env,
    )  # fmt: skip
    worker.wait_log(" ready.")
    return worker


def _client(redis: Redis) -> Any:
    from celery import Celery

    client = Celery("broker-test-client", broker=redis.url)
    client.conf.broker_connection_retry_on_startup = True
    return client


def test_a_worker_that_loses_redis_keeps_retrying_and_works_again_when_it_is_back(
    redis: Redis, spawn: Any, tmp_path: Path, report: Callable[[str], None]
) -> None:
    assert RELIABILITY["broker_connection_max_retries"] is None  # retry for as long as it takes
    instance = tmp_path / "instance"
    instance.mkdir()
    worker = _worker(spawn, redis, instance, tmp_path)
    client = _client(redis)
    try:
        client.send_task("broker_test.touch", args=["before"])
        wait_for(
            (instance / "ran-before").exists, what="the task sent before the outage", logs=[worker.log_path]
        )

        redis.stop()
        worker.wait_log("Cannot connect to redis://")
        # The worker says what it does: trying again, with no limit ("/None": no maximum of retries); Redis
        # stays down while its attempts fail (the event itself, however long the machine takes).
        worker.wait_log(f"({FAILED_ATTEMPTS}/None)")
        assert worker.alive(), worker.log()[-3000:]

        redis.start()
        client.send_task("broker_test.touch", args=["after"])
        wait_for(
            (instance / "ran-after").exists, what="the task sent once Redis was back", logs=[worker.log_path]
        )
        assert worker.alive()
        assert "Unrecoverable error" not in worker.log()
        attempts = worker.log().count("Trying again in")
        report(f"Redis down for {attempts} failed reconnection attempts; a task sent once it was back ran")
    finally:
        client.close()


def test_with_celerys_own_retry_limit_a_worker_that_loses_redis_exits(
    redis: Redis, spawn: Any, tmp_path: Path
) -> None:
    """What the gateway's setting prevents: Celery's limit (100 by default, about 47 minutes of attempts;
    1 here) used up, the worker logs "Unrecoverable error" and exits with status 1."""
    instance = tmp_path / "instance"
    instance.mkdir()
    worker = _worker(spawn, redis, instance, tmp_path, BROKER_TEST_MAX_RETRIES="1")
    redis.stop()
    worker.wait_log("(1/1)")
    assert worker.exit_status() == 1
    assert "Unrecoverable error" in worker.log()


def test_beat_keeps_its_schedule_file_in_the_instance_folder_and_nothing_in_its_working_directory(
    spawn: Any, tmp_path: Path
) -> None:
    workdir = tmp_path / "srv-shop"
    workdir.mkdir()
    instance = tmp_path / "instance"  # not made yet: beat makes it when it opens its file
    beat = spawn(
        "beat",
        "--loglevel",
        "INFO",
        "--max-interval",
        "1",
        broker="memory://",
        instance=instance,
        cwd=workdir,
    )
    beat.wait_log("beat: Starting...")
    wait_for(
        lambda: any(path.name.startswith(BEAT_SCHEDULE_FILE) for path in instance.glob("*")),
        what="beat's schedule file in the instance folder",
        logs=[beat.log_path],
    )
    beat.wait_log("Sending due task flask-gateway-deliver-outbox")  # it runs the schedule
    beat.stop()
    assert sorted(path.name for path in workdir.iterdir()) == []  # no celerybeat-schedule* left here
    assert str(instance / BEAT_SCHEDULE_FILE) in beat.log()  # the banner's "db ->" line names it
