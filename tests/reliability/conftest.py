"""The reliability stack: the emulator and the example shop under gunicorn, both on PostgreSQL.

One stack for the whole package (``reliability_stack``, session scoped: starting it costs a few seconds), on the session's throwaway PostgreSQL cluster (``postgres_cluster``), one database per app:

- the emulator: ``gunicorn 'flask_gateway.emulator:create_app()'``, 3 worker processes x 4 threads, its
  background delivery worker on in every process, callback retries after 0.5 s and 0.5 s of its clock;
- the shop: ``gunicorn tests.reliability.shop_wsgi:app`` (the unchanged shop plus a durable signal
  counter, and a fulfilment a test can make fail), 4 worker processes x 4 threads, ``GATEWAY_TIMEOUT`` 3 s,
  auto-installed on the emulator; an outbox event whose receiver raised is due again after 1 s (then 2 s,
  4 s), dead after 4 attempts.

Both start on empty databases the way a deployment does. The shop's tables come from the deployment's step,
run once before gunicorn starts (``init_shop_database``: ``flask ... shop init-db``, and the test module's own
``reliability init-db``); its workers do no database work when they boot, and the first requests auto-install
it (every worker at the same moment). The emulator's workers create its tables and seeds on first use, at
the same moment too. None may trip over another. Both servers write an access log line per request
(``ACCESS <status> <method> <path>``) and their errors to ``<tmp>/<name>.log``: the tests grep those logs for
500s and tracebacks.

``test_faults.py`` builds stacks of its own from the same pieces (``plan_stack``, ``init_shop_database``,
``launch``) on a cluster of its own that it restarts.

Tests reset nothing between them: each works on its own orders and checkouts, and removes the fault rules it
added (``faults`` fixture). The emulator's clock only moves forward; a test that advances it does so after
its own checkouts are settled.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.conftest import fetch_all, selected_backends
from tests.postgres import PostgresCluster
from tests.processes import WAIT_DEADLINE, Server, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
OWNER_PASSWORD = "owner-password-for-reliability"
ACCESS_FORMAT = "ACCESS %(s)s %(m)s %(U)s"
EMULATOR_WORKERS = 3
SHOP_WORKERS = 4
#: gunicorn's ``--graceful-timeout``: after SIGTERM a worker has this long to finish what it is handling.
GRACEFUL_TIMEOUT = 5
#: The app gunicorn serves as the shop, and the CLI subprocesses' app (cron runs the server's code).
SHOP_APP = "tests.reliability.shop_wsgi:app"
#: The shop's GATEWAY_OUTBOX_RETRY_SECONDS and GATEWAY_OUTBOX_MAX_ATTEMPTS: retries come due within a test.
OUTBOX_RETRY_SECONDS = 1
OUTBOX_MAX_ATTEMPTS = 4


@dataclass
class StackPlan:
    """A stack before its servers start: its databases, ports and environments."""

    emulator_db: str
    shop_db: str
    emulator_port: int
    shop_port: int
    emulator_env: dict[str, str]
    shop_env: dict[str, str]


@dataclass
class Stack:
    emulator: Server
    shop: Server
    emulator_db: str
    shop_db: str
    #: The shop's environment (beyond os.environ), for ``flask --app example_shop ...`` subprocesses.
    shop_env: dict[str, str] = field(default_factory=dict)

    #: Where the current test's part of each server log begins (bytes).
    log_marks: dict[str, int] = field(default_factory=dict)

    def mark_logs(self) -> None:
        """The logs from here on belong to the test that starts now."""
        self.log_marks = {
            server.name: server.log_path.stat().st_size for server in (self.emulator, self.shop)
        }

    def logs(self) -> dict[str, str]:
        """Each server's log since the current test began."""
        found = {}
        for server in (self.emulator, self.shop):
            with server.log_path.open("rb") as log:
                log.seek(self.log_marks.get(server.name, 0))
                found[server.name] = log.read().decode(errors="replace")
        return found


def start_gunicorn(
    name: str,
    app_spec: str,
    env: dict[str, str],
    log_dir: Path,
    *,
    port: int,
    workers: int,
    threads: int,
    ready_path: str = "/",
    preload: bool = False,
    options: Sequence[str] = (),
) -> Server:
    """``gunicorn app_spec`` on ``port``, access and error log in ``log_dir/name.log``; waits until it answers
    HTTP on ``ready_path`` (any answer: a 503 while the database is away is one). ``threads`` 1: gunicorn's
    sync workers (one request at a time per process), else gthread. ``preload``: the master imports the app
    once and forks workers from it (a replaced worker starts in milliseconds instead of importing the app
    again); only for an app whose import and ``create_app`` open no connection (forked workers would share
    it). ``options``: more of gunicorn's command-line options, before the app (``-c`` a config file)."""
    log_path = log_dir / f"{name}.log"
    worker_class = ["--worker-class", "sync"] if threads == 1 else ["--threads", str(threads)]
    command = [
        sys.executable, "-m", "gunicorn", "--workers", str(workers), *worker_class,
        "--bind", f"127.0.0.1:{port}", "--timeout", "120", "--graceful-timeout", str(GRACEFUL_TIMEOUT),
        "--keep-alive", "30", "--access-logfile", "-", "--access-logformat", ACCESS_FORMAT,
        "--error-logfile", "-", "--log-level", "info", "--pythonpath", str(ROOT),
        *(["--preload"] if preload else []), *options, app_spec,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
        )
    server = Server(name=name, port=port, process=process, log_path=log_path)

    def answers() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} at start:\n{server.log_tail()}")
        try:
            requests.get(server.url + ready_path, timeout=10)
        except requests.RequestException:
            return False
        return True

    try:
        # A worker imports the app before it answers: as start_flask, twice the usual last resort.
        wait_for(
            answers,
            timeout=2 * WAIT_DEADLINE,
            interval=0.2,
            what=f"{name} to answer HTTP on port {port}",
            logs=[server],
        )
    except BaseException:
        server.stop()
        raise
    return server


def plan_stack(
    cluster: PostgresCluster,
    *,
    emulator_env: dict[str, str] | None = None,
    shop_env: dict[str, str] | None = None,
) -> StackPlan:
    """Two new databases on ``cluster``, two free ports, and both apps' environments (``emulator_env`` and
    ``shop_env`` add to or replace the defaults)."""
    emulator_db = cluster.create_database()
    shop_db = cluster.create_database()
    emulator_port, shop_port = free_port(), free_port()
    emulator_url = f"http://127.0.0.1:{emulator_port}"
    return StackPlan(
        emulator_db=emulator_db,
        shop_db=shop_db,
        emulator_port=emulator_port,
        shop_port=shop_port,
        emulator_env={
            "EMULATOR_DATABASE_URL": emulator_db,
            "EMULATOR_WAF": "allow-local",
            "EMULATOR_CALLBACK_RETRY_DELAYS": "0.5,0.5",
            "EMULATOR_SECRET_KEY": "emulator-secret-for-reliability",
            "EMULATOR_PUBLIC_URL": emulator_url,
            **(emulator_env or {}),
        },
        shop_env={
            "GATEWAY_ENVIRONMENT": "emulator",
            "GATEWAY_BASE_URL": emulator_url,
            "GATEWAY_INSTALL_URL": f"{emulator_url}/install",
            "GATEWAY_V1_BASE_URL": emulator_url,
            "GATEWAY_API_VERSION": "v2",
            "GATEWAY_PUBLIC_URL": f"http://127.0.0.1:{shop_port}",
            "GATEWAY_TIMEOUT": "3",
            "SHOP_DATABASE_URL": shop_db,
            "SHOP_SECRET_KEY": "shop-secret-for-reliability",
            "SHOP_ADMIN_PASSWORD": OWNER_PASSWORD,
            "SHOP_AUTO_INSTALL": "1",
            "GATEWAY_OUTBOX_RETRY_SECONDS": str(OUTBOX_RETRY_SECONDS),
            "GATEWAY_OUTBOX_MAX_ATTEMPTS": str(OUTBOX_MAX_ATTEMPTS),
            **(shop_env or {}),
        },
    )


def init_shop_database(plan: StackPlan) -> None:
    """The deployment's step before the servers start: the shop's tables (``flask ... shop init-db``) and
    the reliability tables of ``shop_wsgi`` (``flask ... reliability init-db``), both on the server's app."""
    commands = [
        [sys.executable, "-m", "flask", "--app", SHOP_APP, *group, "init-db"]
        for group in (["shop"], ["reliability"])
    ]
    running = [
        subprocess.Popen(
            command,
            env={**os.environ, **plan.shop_env},
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for command in commands
    ]
    for command, process in zip(commands, running, strict=True):
        output, _ = process.communicate(timeout=120)
        if process.returncode != 0:
            raise RuntimeError(f"{' '.join(command[3:])} exited with {process.returncode}:\n{output}")


def launch(
    plan: StackPlan,
    log_dir: Path,
    *,
    shop_workers: int = SHOP_WORKERS,
    shop_threads: int = 4,
    shop_preload: bool = False,
    names: tuple[str, str] = ("emulator", "shop"),
) -> Stack:
    """Start the emulator and the shop under gunicorn (their logs ``log_dir/<names>.log``); returns once
    both answer HTTP, without waiting for the database (``check_startup`` does)."""
    emulator_name, shop_name = names
    emulator = start_gunicorn(
        emulator_name,
        "flask_gateway.emulator:create_app()",
        plan.emulator_env,
        log_dir,
        port=plan.emulator_port,
        workers=EMULATOR_WORKERS,
        threads=4,
        ready_path="/livez",
    )
    try:
        shop = start_gunicorn(
            shop_name,
            SHOP_APP,
            plan.shop_env,
            log_dir,
            port=plan.shop_port,
            workers=shop_workers,
            threads=shop_threads,
            ready_path="/gateway/livez",
            preload=shop_preload,
        )
    except BaseException:
        emulator.stop()
        raise
    return Stack(
        emulator=emulator,
        shop=shop,
        emulator_db=plan.emulator_db,
        shop_db=plan.shop_db,
        shop_env=plan.shop_env,
    )


def start_stack(cluster: PostgresCluster, log_dir: Path) -> Stack:
    plan = plan_stack(cluster)
    init_shop_database(plan)
    stack = launch(plan, log_dir)
    try:
        # The first shopper request auto-installs the shop (every worker may try at once).
        requests.get(stack.shop.url + "/", timeout=60)
        check_startup(stack)
    except BaseException:
        stack.shop.stop()
        stack.emulator.stop()
        raise
    return stack


def installed_on_first_use(stack: Stack) -> bool:
    """A shopper request (the shop installs on first use, ``SHOP_AUTO_INSTALL``; a worker whose attempt
    found the gateway not answering yet tries again on a request ``RETRY_SECONDS`` later), then: is the
    shop installed?"""
    with suppress(requests.RequestException):
        requests.get(stack.shop.url + "/", timeout=60)
    return fetch_all(stack.shop_db, "SELECT count(*) FROM gateway_installations") == [(1,)]


def check_startup(stack: Stack, *, shop_workers: int = SHOP_WORKERS) -> None:
    """Every worker booted (none died racing its siblings over the tables, seeds or the installation), and
    the shop is installed exactly once."""
    servers = [stack.shop, stack.emulator]
    wait_for(lambda: installed_on_first_use(stack), what="the shop's auto-install", logs=servers)
    wait_for(
        lambda: all(
            text.count("Booting worker") >= n
            for text, n in zip(stack.logs().values(), (EMULATOR_WORKERS, shop_workers), strict=True)
        ),
        what=f"{EMULATOR_WORKERS} emulator and {shop_workers} shop workers to boot",
        logs=servers,
    )
    for name, text in stack.logs().items():
        for bad in ("Traceback", "Worker failed to boot", "exited with code", "already installed"):
            assert bad not in text, f"{name} at start: {bad!r} in its log:\n{text[-3000:]}"


@pytest.fixture(scope="session")
def reliability_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Stack]:
    if "postgresql" not in selected_backends(request.config):
        pytest.skip("the reliability suite runs on PostgreSQL only, and --database=sqlite was chosen")
    postgres_cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    log_dir = tmp_path_factory.mktemp("reliability")
    stack = start_stack(postgres_cluster, log_dir)
    try:
        yield stack
    finally:
        stack.shop.stop()
        stack.emulator.stop()
        for url in (stack.shop_db, stack.emulator_db):
            postgres_cluster.drop_database(url.rsplit("/", 1)[1], wait=False)


@pytest.fixture
def stack(reliability_stack: Stack) -> Iterator[Stack]:
    """The shared stack, its logs marked at the test's start; the fault rules a test added are removed after it."""
    reliability_stack.mark_logs()
    yield reliability_stack
    requests.delete(f"{reliability_stack.emulator.url}/_emulator/faults", timeout=10).raise_for_status()


@pytest.fixture
def report(capsys: pytest.CaptureFixture[str]) -> Callable[[str], None]:
    """Print a line of figures even when pytest captures output (the counts each test checked)."""

    def write(text: str) -> None:
        with capsys.disabled():
            print(f"\n[reliability] {text}", flush=True)  # noqa: T201 - the figures this suite measures

    return write
