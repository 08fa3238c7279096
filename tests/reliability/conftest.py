"""The reliability stack: the emulator and the example shop under gunicorn, both on PostgreSQL.

One stack for the whole package (``reliability_stack``, session scoped: starting it costs a few seconds), on the session's throwaway PostgreSQL cluster (``postgres_cluster``), one database per app:

- the emulator: ``gunicorn 'flask_gateway.emulator:create_app()'``, 3 worker processes x 4 threads, its
  background delivery worker on in every process, callback retries after 0.5 s and 0.5 s of its clock;
- the shop: ``gunicorn tests.reliability.shop_wsgi:app`` (the unchanged shop plus a durable signal
  counter, and a fulfilment a test can make fail), 4 worker processes x 4 threads, ``GATEWAY_TIMEOUT`` 3 s,
  auto-installed on the emulator; an outbox event whose receiver raised is due again after 1 s (then 2 s,
  4 s), dead after 4 attempts.

Both start on empty databases the way a deployment does: every worker process creates the tables, seeds
(emulator) or auto-installs (shop) at the same moment, and they must not trip over each other. Both servers write an access log line per
request (``ACCESS <status> <method> <path>``) and their errors to ``<tmp>/<name>.log``: the tests grep those
logs for 500s and tracebacks.

Tests reset nothing between them: each works on its own orders and checkouts, and removes the fault rules it
added (``faults`` fixture). The emulator's clock only moves forward; a test that advances it does so after
its own checkouts are settled.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.conftest import fetch_all, selected_backends
from tests.postgres import PostgresCluster
from tests.processes import Server, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
OWNER_PASSWORD = "owner-password-for-reliability"
ACCESS_FORMAT = "ACCESS %(s)s %(m)s %(U)s"
EMULATOR_WORKERS = 3
SHOP_WORKERS = 4
#: The shop's GATEWAY_OUTBOX_RETRY_SECONDS and GATEWAY_OUTBOX_MAX_ATTEMPTS: retries come due within a test.
OUTBOX_RETRY_SECONDS = 1
OUTBOX_MAX_ATTEMPTS = 4


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
    name: str, app_spec: str, env: dict[str, str], log_dir: Path, *, port: int, workers: int, threads: int
) -> Server:
    """``gunicorn app_spec`` on ``port``, access and error log in ``log_dir/name.log``; waits for HTTP."""
    log_path = log_dir / f"{name}.log"
    command = [
        sys.executable, "-m", "gunicorn", "--workers", str(workers), "--threads", str(threads),
        "--bind", f"127.0.0.1:{port}", "--timeout", "120", "--graceful-timeout", "5", "--keep-alive", "30",
        "--access-logfile", "-", "--access-logformat", ACCESS_FORMAT, "--error-logfile", "-",
        "--log-level", "info", "--pythonpath", str(ROOT), app_spec,
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT
        )
    server = Server(name=name, port=port, process=process, log_path=log_path)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} at start:\n{server.log_tail()}")
        try:
            requests.get(
                server.url + "/_emulator/clock" if name == "emulator" else server.url + "/", timeout=2
            )
            return server
        except requests.RequestException:
            time.sleep(0.2)
    server.stop()
    raise RuntimeError(f"{name} did not answer on port {port}:\n{server.log_tail()}")


def start_stack(cluster: PostgresCluster, log_dir: Path) -> Stack:
    emulator_db = cluster.create_database()
    shop_db = cluster.create_database()
    emulator_port, shop_port = free_port(), free_port()
    emulator_url = f"http://127.0.0.1:{emulator_port}"
    emulator_env = {
        "EMULATOR_DATABASE_URL": emulator_db,
        "EMULATOR_WAF": "allow-local",
        "EMULATOR_CALLBACK_RETRY_DELAYS": "0.5,0.5",
        "EMULATOR_SECRET_KEY": "emulator-secret-for-reliability",
        "EMULATOR_PUBLIC_URL": emulator_url,
    }
    emulator = start_gunicorn(
        "emulator",
        "flask_gateway.emulator:create_app()",
        emulator_env,
        log_dir,
        port=emulator_port,
        workers=EMULATOR_WORKERS,
        threads=4,
    )
    shop_env = {
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
    }
    try:
        shop = start_gunicorn(
            "shop",
            "tests.reliability.shop_wsgi:app",
            shop_env,
            log_dir,
            port=shop_port,
            workers=SHOP_WORKERS,
            threads=4,
        )
    except BaseException:
        emulator.stop()
        raise
    stack = Stack(emulator=emulator, shop=shop, emulator_db=emulator_db, shop_db=shop_db, shop_env=shop_env)
    try:
        check_startup(stack)
    except BaseException:
        shop.stop()
        emulator.stop()
        raise
    return stack


def check_startup(stack: Stack) -> None:
    """Every worker booted (none died racing its siblings over the tables, seeds or the installation), and
    the shop is installed exactly once."""
    wait_for(
        lambda: fetch_all(stack.shop_db, "SELECT count(*) FROM gateway_installations") == [(1,)],
        timeout=30,
        what="the shop's auto-install",
    )
    for _ in range(60):
        logs = stack.logs()
        if all(
            text.count("Booting worker") >= n
            for text, n in zip(logs.values(), (EMULATOR_WORKERS, SHOP_WORKERS), strict=True)
        ):
            break
        time.sleep(0.5)
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
