"""Real Celery workers on a real Redis: the stack of the task tests.

- ``redis_url`` (session): a throwaway ``redis-server`` (``tests/redis_server.py``), the broker.
- ``task_stack`` (module): a database of the session's PostgreSQL cluster for the shop
  (``tests/tasks/shop_app.py``: installed, tables created by this process), the emulator as a real process
  (``flask --app flask_gateway.emulator run``, its callback worker off: the shop hears of a payment through
  the ``flask_gateway.reconcile`` task), two Celery workers (``--pool prefork --concurrency 1``, each in a
  process group of its own so a test can SIGKILL a whole worker) and one beat sending
  ``flask_gateway.deliver_outbox`` every :data:`DELIVER_EVERY` s (5 s in a shop). The workers' outbox lease
  is :data:`LEASE_SECONDS` (10 s in a shop), renewed every third of it while a receiver runs, and the
  outbox's time in the workers is the stack's :class:`~tests.tasks.shop_app.SharedClock`, which stands
  still until the test moves it (``stack.clock.advance``).
- ``stack`` (each test): the same, with two live workers again (one killed by an earlier test is replaced)
  and the logs marked where the test begins.

A test waits for the events themselves: a row, a marker file, a delivery run that began after a moment
(:meth:`TaskStack.round_since`). Every wait has a deadline as a last resort (``tests.processes.wait_for``'s
60 s), whose failure says what it waited for and shows the processes' logs. Every process is stopped at
the end, on failure too (SIGTERM, then SIGKILL of its process group). The process logs are in the module's
tmp folder and scanned by ``tests/secret_watch.py``.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Final

import pytest
import requests
from flask import Flask

from flask_gateway import Address, Customer, OrderDraft, OrderLine, create_checkout
from flask_gateway.core.timestamps import utcnow
from flask_gateway.payments.installation import InstallSettings, install
from flask_gateway.tasks import RECONCILE
from tests import secret_watch
from tests.conftest import dispose_engines, fetch_all, selected_backends
from tests.postgres import PostgresCluster
from tests.processes import WAIT_DEADLINE, Server, start_flask, wait_for
from tests.redis_server import RedisServer, start_redis
from tests.tasks import shop_app
from tests.tasks.shop_app import SharedClock

ROOT: Final = Path(__file__).resolve().parents[2]
#: The outbox's lease in the worker processes (seconds of the stack's clock; in real time, how often a
#: delivery's heartbeat looks at that clock: every third of it).
LEASE_SECONDS: Final = 3.0
#: Beat's interval for ``flask_gateway.deliver_outbox`` (seconds).
DELIVER_EVERY: Final = 0.5
WORKERS: Final = 2
#: The longest a worker or beat may take to start.
START_TIMEOUT: Final = 60.0


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A throwaway ``redis-server`` for the session (a missing one fails the tests that need it: never a skip)."""
    problem = None
    try:
        server = start_redis()
    except RuntimeError as exc:
        problem = str(exc)
    if problem is not None:
        pytest.fail(f"The task queue tests cannot run. {problem}", pytrace=False)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(redis_server: RedisServer) -> str:
    return redis_server.url


@dataclass
class Worker:
    """A Celery worker (``celery worker``) or beat process, the leader of its own process group."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self, since: int = 0) -> str:
        with self.log_path.open("rb") as log:
            log.seek(since)
            return log.read().decode(errors="replace")

    def log_size(self) -> int:
        return self.log_path.stat().st_size

    def kill(self) -> None:
        """SIGKILL the whole worker, its pool processes too (a machine that vanished)."""
        _signal_group(self.pid, signal.SIGKILL)
        self.process.wait(timeout=10)

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL of the group after 15 s; pool processes never outlive it."""
        if self.alive():
            _signal_group(self.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=15)
        _signal_group(self.pid, signal.SIGKILL)  # whatever of the group is left
        if self.alive():
            self.process.wait(timeout=10)


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError):  # the group is gone already
        os.killpg(pgid, sig)


def spawn_celery(root: Path, name: str, app: str, env: Mapping[str, str], *arguments: str) -> Worker:
    """``celery -A app <arguments>`` with ``env`` over ``os.environ``, the leader of its own process group,
    its output in ``root/<name>.log`` (scanned for secrets)."""
    log_path = root / f"{name}.log"
    command = [sys.executable, "-m", "celery", "-A", app, *arguments]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command,
            env={**os.environ, **env},
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=ROOT,
            start_new_session=True,  # its own process group: killed whole, never signalled by a Ctrl-C
        )
    secret_watch.watch_file(log_path)
    return Worker(name=name, process=process, log_path=log_path)


def wait_ready(worker: Worker, text: str) -> None:
    """Wait until ``text`` is in the process's log; stop it and raise, with its log, if it exits first or
    the deadline (a last resort) passes."""

    def ready() -> bool:
        if text in worker.log():
            return True
        if not worker.alive():
            raise RuntimeError(f"{worker.name} exited before it logged {text!r}:\n{worker.log()[-3000:]}")
        return False

    try:
        wait_for(ready, timeout=START_TIMEOUT, what=f"{worker.name} to log {text!r}", logs=[worker.log_path])
    except BaseException:
        worker.stop()
        raise


@dataclass
class TaskStack:
    root: Path
    database_url: str
    redis_url: str
    emulator: Server
    shop: Flask
    env: dict[str, str]
    client: Any
    #: The outbox's time in the workers (unless the stack runs on real time: ``running_stack``).
    clock: SharedClock
    workers: list[Worker] = field(default_factory=list)
    beat: Worker | None = None
    started: int = 0
    #: Where each process's log begins for the current test (bytes).
    marks: dict[str, int] = field(default_factory=dict)

    @property
    def markers(self) -> Path:
        return self.root / "markers"

    # --- processes ------------------------------------------------------------------------------------

    def _spawn(self, name: str, *arguments: str) -> Worker:
        return spawn_celery(self.root, name, "tests.tasks.worker_app:celery", self.env, *arguments)

    _ready = staticmethod(wait_ready)

    def _spawn_worker(self) -> Worker:
        self.started += 1
        name = f"worker{self.started}"
        worker = self._spawn(
            name,
            "worker", "--pool", "prefork", "--concurrency", "1", "--hostname", f"{name}@%h",
            "--loglevel", "INFO", "--without-gossip", "--without-mingle", "--without-heartbeat",
        )  # fmt: skip
        self.workers.append(worker)
        return worker

    def start_beat(self) -> None:
        self.beat = self._spawn(
            "beat",
            "beat", "--schedule", str(self.root / "beat-schedule"), "--loglevel", "INFO", "--max-interval", "1",
        )  # fmt: skip
        self._ready(self.beat, "beat: Starting...")

    def live_workers(self) -> list[Worker]:
        return [worker for worker in self.workers if worker.alive()]

    def ensure_workers(self) -> None:
        """Start workers (at once) until :data:`WORKERS` are alive and consuming ("<hostname> ready.")."""
        started = [self._spawn_worker() for _ in range(WORKERS - len(self.live_workers()))]
        for worker in started:
            self._ready(worker, " ready.")

    def worker_of(self, pid: int) -> Worker:
        """The worker whose main process is ``pid``."""
        return next(worker for worker in self.workers if worker.pid == pid)

    def stop(self) -> None:
        for process in [*self.workers, *([self.beat] if self.beat else [])]:
            process.stop()

    # --- logs -----------------------------------------------------------------------------------------

    def mark_logs(self) -> None:
        self.marks = {w.name: w.log_size() for w in [*self.workers, *([self.beat] if self.beat else [])]}

    def logs(self) -> str:
        """Every process's log since the current test began (for failures and for checks)."""
        parts = []
        for worker in [*self.workers, *([self.beat] if self.beat else [])]:
            parts.append(
                f"--- {worker.name} (pid {worker.pid}) ---\n{worker.log(self.marks.get(worker.name, 0))}"
            )
        return "\n".join(parts)

    def wait(self, predicate: Callable[[], Any], *, what: str, timeout: float = WAIT_DEADLINE) -> Any:
        """``wait_for``, with every process's log in the message when it times out."""
        try:
            return wait_for(predicate, timeout=timeout, interval=0.05, what=what)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.logs()[-8000:]}") from None

    def round_since(self, moment: datetime) -> tuple[Any, ...]:
        """Wait until a ``deliver_outbox`` run that began after ``moment`` (real time) has finished: by then
        every event due and free at the stack's clock has been taken. ``(pid, summary)`` of that run (its
        heartbeat: ``gateway_job_runs``, one row written when a run ends)."""

        def finished() -> tuple[Any, ...] | None:
            found = self.rows(
                "SELECT pid, last_summary FROM gateway_job_runs WHERE job = 'deliver' AND last_started_at > :m",
                m=moment,
            )
            return found[0] if found else None

        found: tuple[Any, ...] = self.wait(finished, what=f"a deliver_outbox run begun after {moment}")
        return found

    def round_now(self) -> tuple[Any, ...]:
        """:meth:`round_since` now: what the workers do with the rows and the clock as they are."""
        return self.round_since(utcnow())

    # --- the shop's side ------------------------------------------------------------------------------

    def rows(self, sql: str, **params: Any) -> list[tuple[Any, ...]]:
        return fetch_all(self.database_url, sql, **params)

    def scenario(self, reference: str, *, failures: int, block_on: int | None = None) -> None:
        self.rows(
            "INSERT INTO tasks_scenarios (reference, failures, block_on) VALUES (:r, :f, :b) RETURNING reference",
            r=reference,
            f=failures,
            b=block_on,
        )

    def paid_order(self, reference: str) -> int:
        """A checkout for ``reference``, paid at the gateway (no callback: the shop does not know yet), and
        a reconciliation task sent to the workers; the checkout's id."""
        with self.shop.test_request_context(base_url=shop_app.PUBLIC_URL):
            checkout = create_checkout(order(reference))
        token = checkout.token
        requests.post(
            f"{self.emulator.url}/_emulator/checkouts/{token}/pay", json={}, timeout=10
        ).raise_for_status()
        self.client.send_task(RECONCILE)
        return int(checkout.id)

    def calls(self, reference: str) -> list[tuple[Any, ...]]:
        """``(call, event_id, pid, at)`` of every call of the receiver for the order, in order."""
        return self.rows(
            "SELECT call, event_id, pid, at FROM tasks_calls WHERE reference = :r ORDER BY call", r=reference
        )

    def fulfilments(self, reference: str) -> list[tuple[Any, ...]]:
        return self.rows("SELECT event_id, pid, at FROM tasks_fulfilments WHERE reference = :r", r=reference)

    def events(self, checkout_id: int) -> list[tuple[Any, ...]]:
        """``(id, kind, state, attempts, last_error, created_at, delivered_at, next_attempt_at,
        claimed_until)`` of the checkout's outbox rows."""
        return self.rows(
            "SELECT id, kind, state, attempts, last_error, created_at, delivered_at, next_attempt_at, "
            "claimed_until FROM gateway_outbox WHERE checkout_id = :c ORDER BY id",
            c=checkout_id,
        )

    def event(self, checkout_id: int, what: str, *, attempts: int | None = None) -> tuple[Any, ...]:
        """Wait for the checkout's one outbox row (with ``attempts`` recorded, if given); the row."""

        def found() -> tuple[Any, ...] | None:
            rows = self.events(checkout_id)
            if len(rows) == 1 and (attempts is None or rows[0][3] == attempts):
                return rows[0]
            return None

        row: tuple[Any, ...] = self.wait(found, what=what)
        return row

    def inside(self, reference: str, call: int) -> dict[str, int]:
        """Wait until the receiver's ``call`` for the order is blocked inside it; its pid and parent pid."""
        marker = self.markers / f"inside-{reference}-{call}.json"
        self.wait(marker.exists, what=f"call {call} for {reference} inside the receiver")
        found: dict[str, int] = json.loads(marker.read_text())
        return found


def order(reference: str) -> OrderDraft:
    address = Address(line1="1 Long St", city="Cape Town", province="WC", postal_code="8001")
    return OrderDraft(
        reference=reference,
        lines=(
            OrderLine(
                name="Enamel kettle",
                sku="K-1",
                quantity=1,
                unit_price_cents=39900,
                image_url=f"{shop_app.PUBLIC_URL}/static/kettle.png",
                page_url=f"{shop_app.PUBLIC_URL}/products/kettle",
            ),
        ),
        customer=Customer(
            first_name="Thandi", last_name="Mokoena", email="thandi@example.com", phone="+27821234567"
        ),
        billing_address=address,
        shipping_address=address,
    )


@contextlib.contextmanager
def running_stack(
    root: Path,
    cluster: PostgresCluster,
    redis_url: str,
    *,
    lease_seconds: float = LEASE_SECONDS,
    deliver_every: float = DELIVER_EVERY,
    controlled_clock: bool = True,
) -> Iterator[TaskStack]:
    """The stack of the module docstring in the folder ``root``, on a new database of ``cluster``, stopped
    and dropped at the end. ``controlled_clock=False``: the outbox in the workers goes by real time, as in
    a shop (``benchmarks/figure_takeover.py`` times what the tests leave to the clock)."""
    (root / "markers").mkdir()
    clock = SharedClock(root / "clock")
    clock.set(utcnow().replace(microsecond=0))
    database_url = cluster.create_database()
    emulator = start_flask(
        "emulator",
        "flask_gateway.emulator",
        {
            "EMULATOR_DATABASE_URL": f"sqlite:///{root / 'emulator.sqlite3'}",
            "EMULATOR_WORKER": "0",  # no callbacks: the shop learns of payments through the reconcile task
            "EMULATOR_SECRET_KEY": "emulator-secret-for-the-task-tests",
        },
        root,
        ready_path="/_emulator/clock",
    )
    client = None
    stack = None
    try:
        shop = shop_app.create_app(
            database_url=database_url,
            emulator_url=emulator.url,
            redis_url=redis_url,
            markers=root / "markers",
            deliver_every=deliver_every,
        )
        shop_app.create_tables(shop)
        with shop.app_context():
            install(
                InstallSettings(
                    merchant_account_id="demo-merchant",
                    api_key="demo-api-key",
                    callback_url=f"{shop_app.PUBLIC_URL}/gateway/callback",
                    callback_failures_email=None,
                    minimum_cents=5000,
                    maximum_cents=5_000_000,
                )
            )
        from celery import Celery  # only where the task tests run: celery is an optional dependency

        client = Celery("tasks-test-client", broker=redis_url)
        client.conf.broker_connection_retry_on_startup = True
        env = {
            "TASKS_DATABASE_URL": database_url,
            "TASKS_EMULATOR_URL": emulator.url,
            "TASKS_REDIS_URL": redis_url,
            "TASKS_MARKERS": str(root / "markers"),
            "TASKS_LEASE_SECONDS": str(lease_seconds),
            "TASKS_DELIVER_EVERY": str(deliver_every),
            **({"TASKS_CLOCK": str(clock.path)} if controlled_clock else {}),
        }
        stack = TaskStack(
            root=root,
            database_url=database_url,
            redis_url=redis_url,
            emulator=emulator,
            shop=shop,
            env=env,
            client=client,
            clock=clock,
        )
        stack.ensure_workers()
        stack.start_beat()
        yield stack
    finally:
        if stack is not None:
            stack.stop()
        if client is not None:
            client.close()
        emulator.stop()
        dispose_engines()  # the shop's pool in this process
        cluster.drop_database(database_url.rsplit("/", 1)[1], wait=False)


@pytest.fixture(scope="module")
def task_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[TaskStack]:
    if "postgresql" not in selected_backends(request.config):
        pytest.skip(
            "the task queue tests run on PostgreSQL only (SKIP LOCKED), and --database=sqlite was chosen"
        )
    redis_url: str = request.getfixturevalue("redis_url")
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    with running_stack(tmp_path_factory.mktemp("tasks"), cluster, redis_url) as stack:
        yield stack


@pytest.fixture
def stack(task_stack: TaskStack) -> TaskStack:
    """The module's stack with two live workers, its logs marked where the test begins."""
    task_stack.ensure_workers()
    task_stack.mark_logs()
    return task_stack


@pytest.fixture
def report(capsys: pytest.CaptureFixture[str]) -> Callable[[str], None]:
    """Print a line of figures even when pytest captures output."""

    def write(text: str) -> None:
        with capsys.disabled():
            print(f"\n[tasks] {text}", flush=True)  # noqa: T201 - the figures these tests measure

    return write
