"""The shop while its database is away: it boots, answers "We'll be right back" (503 with Retry-After) in
its own look, JSON for its JSON endpoints, one log line per outage and no traceback, and serves again on the
first request after the database is back. Its commands (``shop init-db``, ``shop install``) say so in one
line."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from flask import Flask
from sqlalchemy import inspect, text
from sqlalchemy.exc import ProgrammingError

from example_shop import EXIT_DATABASE_AWAY, create_app
from example_shop.extensions import db
from example_shop.links import order_url
from example_shop.outages import MESSAGE
from flask_gateway.core.outages import OutageWatch
from flask_gateway.state import get_state
from tests import secret_watch
from tests.conftest import Databases
from tests.postgres import PostgresCluster, start_cluster
from tests.processes import WAIT_DEADLINE, child_pids, free_port, wait_for
from tests.shop.conftest import (
    SHOP_URL,
    Shopper,
    create_shop,
    csrf_token,
    init_db,
    make_harness,
    shop_config,
)

pytestmark = pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")

#: The first words of the extension's two outage lines (one when it starts, one when it ends).
UNREACHABLE = "the database is unreachable"
ANSWERS_AGAIN = "the database answers again"


def _away_url() -> str:
    """A PostgreSQL URL on a loopback port nobody listens on: every connection is refused at once."""
    return f"postgresql+psycopg://shop:secret-password@127.0.0.1:{free_port()}/shop"


@pytest.fixture
def away() -> Flask:
    """The shop created while its database is away (as a gunicorn worker booting during a restart)."""
    return create_app(shop_config(_away_url()))


def _order_link(app: Flask, reference: str = "ABCDEF12") -> str:
    with app.test_request_context(base_url=SHOP_URL):
        return SHOP_URL + order_url(reference)


def _lines(caplog: pytest.LogCaptureFixture, words: str) -> list[logging.LogRecord]:
    return [
        r for r in caplog.records if words in r.getMessage() and r.getMessage().startswith("flask_gateway")
    ]


def _no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert [r.getMessage() for r in caplog.records if r.exc_info or r.exc_text] == []
    assert "Traceback" not in caplog.text


def _is_outage_page(answer) -> None:  # type: ignore[no-untyped-def]
    page = answer.get_data(as_text=True)
    assert answer.status_code == 503, page[:500]
    assert answer.headers["Retry-After"] == "5"
    assert answer.mimetype == "text/html"
    assert "We'll be right back" in page
    assert '<header class="site-header">' in page and "Stoep" in page  # the shop's own look
    assert "Traceback" not in page


# --- booting and answering while the database is away -------------------------------------------------


def test_create_app_touches_no_database(away: Flask) -> None:
    """create_app returned with the database away; the liveness probe answers, readiness says why not."""
    client = away.test_client()
    assert client.get(SHOP_URL + "/gateway/livez").status_code == 200
    ready = client.get(SHOP_URL + "/gateway/readyz")
    assert ready.status_code == 503
    assert ready.headers["Retry-After"]
    assert "secret-password" not in ready.get_data(as_text=True)


def test_shopper_pages_answer_we_will_be_right_back(away: Flask, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    shopper = Shopper(away.test_client())
    link = _order_link(away)

    for _ in range(3):
        _is_outage_page(shopper.get(link))
    _is_outage_page(shopper.get("/"))  # the catalog asks the extension for the installed plan
    status = shopper.get(link + "/status.json")

    assert status.status_code == 503
    assert status.headers["Retry-After"] == "5"
    assert status.get_json() == {"message": MESSAGE}
    asked_for_json = shopper.get(link, headers={"Accept": "application/json"})
    assert (asked_for_json.status_code, asked_for_json.get_json()) == (503, {"message": MESSAGE})
    # One line for the whole outage, naming the reason, never the password; no traceback per request.
    [started] = _lines(caplog, UNREACHABLE)
    assert started.levelno == logging.WARNING
    assert "Connection refused" in started.getMessage() or "connection failed" in started.getMessage()
    _no_traceback(caplog)
    assert "secret-password" not in caplog.text


def test_an_owner_meets_the_shops_page_on_the_gateways_screens_too(away: Flask) -> None:
    """With an owner's session the page's owner navigation would ask the database who is logged in: the
    outage page leaves it out, the shop's own and the extension's (its ``gateway/unavailable.html``, which
    the shop overrides with its own look) alike."""
    client = away.test_client()
    with client.session_transaction(base_url=SHOP_URL) as session:
        session["owner"] = {
            "since": time.time(),
            "version": 1,
            "key": away.config["SHOP_OWNER_CREDENTIAL_KEY"],
        }
    owner = Shopper(client)

    for path in ("/admin/", "/gateway/admin/", "/gateway/admin/checkouts"):
        answer = owner.get(path)
        _is_outage_page(answer)
        assert ">Admin</a>" not in answer.get_data(as_text=True)


def test_the_login_answers_the_outage_page_not_a_swallowed_traceback(
    away: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    """The login's rate limit keeps its counters in the database: while it is away the limiter's error is
    the outage page (503), not a 500 or a traceback logged by Flask-Limiter for every attempt."""
    caplog.set_level(logging.DEBUG)
    shopper = Shopper(away.test_client())
    page = shopper.get("/admin/login")
    assert page.status_code == 200  # the form itself needs no database
    token = csrf_token(page.get_data(as_text=True))

    for _ in range(3):
        _is_outage_page(shopper.post("/admin/login", {"csrf_token": token, "password": "a guess"}))

    assert len(_lines(caplog, UNREACHABLE)) == 1
    _no_traceback(caplog)


def test_a_database_error_that_is_neither_an_outage_nor_a_missing_table_stays_a_500(
    databases: Databases,
) -> None:
    """A constraint or a bug is not "try again shortly": Flask's 500, with its traceback (a missing table is
    a 503 naming init-db: tests/shop/test_missing_tables.py)."""
    app = init_db(create_app(shop_config(databases.url())))

    @app.get("/constraint")
    def constraint() -> str:
        raise ProgrammingError("SELECT", {}, Exception('syntax error at or near "FORM"'))

    with pytest.raises(ProgrammingError, match="syntax error"):  # TESTING: Flask raises what a 500 logs
        app.test_client().get("/constraint")


def test_first_use_install_waits_while_the_database_is_away(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """SHOP_AUTO_INSTALL=1 never asks the gateway while the database is away (an installation it could not
    save would leave an account installed at the gateway and not in the shop): it tries on a later request."""
    from example_shop import setup

    asked: list[object] = []
    monkeypatch.setattr(setup, "install", asked.append)
    caplog.set_level(logging.INFO)
    app = create_app(shop_config(_away_url(), SHOP_AUTO_INSTALL=True))

    _is_outage_page(Shopper(app.test_client()).get(_order_link(app)))

    assert asked == []
    assert "Auto-install" not in caplog.text
    _no_traceback(caplog)


# --- the commands --------------------------------------------------------------------------------------


def test_init_db_creates_the_shops_and_the_gateways_tables_and_may_run_again(databases: Databases) -> None:
    app = create_app(shop_config(databases.url()))
    runner = app.test_cli_runner()

    for _ in range(2):  # every deploy runs it: a second run keeps what is there
        result = runner.invoke(args=["shop", "init-db"])
        assert result.exit_code == 0, result.output
        assert "tables and the payment gateway's are ready" in result.output
    with app.app_context():
        tables = set(inspect(db.engine).get_table_names())
    assert {"shop_orders", "shop_order_events", "shop_login_counters", "gateway_checkouts"} <= tables
    assert "gateway_installations" in tables and "gateway_rate_limits" in tables


@pytest.mark.parametrize("command", [["shop", "init-db"], ["shop", "install"]])
def test_commands_say_in_one_line_that_the_database_is_away(away: Flask, command: list[str]) -> None:
    result = away.test_cli_runner().invoke(args=command)

    assert result.exit_code == EXIT_DATABASE_AWAY
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert lines[0].startswith("Error: The shop's database at postgresql+psycopg://shop:***@127.0.0.1:")
    assert "does not answer" in lines[0] and "run this command again" in lines[0]
    assert "secret-password" not in result.output
    assert "Traceback" not in result.output


def test_the_install_command_installs_once(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> None:
    shop = make_harness(databases, monkeypatch, install=False)
    runner = shop.app.test_cli_runner()

    first = runner.invoke(args=["shop", "install"])
    again = runner.invoke(args=["shop", "install"])

    assert (first.exit_code, first.output.strip()) == (0, "The payment gateway is installed."), first.output
    assert (again.exit_code, again.output.strip()) == (0, "The payment gateway was installed already.")


def test_the_install_command_explains_a_missing_public_url(databases: Databases) -> None:
    app = create_shop(shop_config(databases.url(), GATEWAY_PUBLIC_URL=None))
    result = app.test_cli_runner().invoke(args=["shop", "install"])
    assert result.exit_code == 1
    assert "Set GATEWAY_PUBLIC_URL" in result.output


# --- a real PostgreSQL stopped and started -------------------------------------------------------------


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[tuple[PostgresCluster, Databases]]:
    """A PostgreSQL cluster of this test's own (the session's is shared: it must not be stopped)."""
    cluster = start_cluster()
    found = Databases(backend="postgresql", directory=tmp_path, cluster=cluster)
    try:
        yield cluster, found
    finally:
        from tests.conftest import dispose_engines

        dispose_engines()
        cluster.stop()


def test_postgresql_stopped_and_started(
    own_cluster: tuple[PostgresCluster, Databases],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """503 while PostgreSQL is down (for the owner too, without asking the database who they are); the
    first request after it is back succeeds (the pool's pre-ping replaces the connections the stop killed);
    one line when the outage starts, one when it ends."""
    cluster, databases = own_cluster
    shop = make_harness(databases, monkeypatch)
    # The extension's outage watch on a clock of the test's: the probe interval passes when the test says.
    clock = [1000.0]
    state = get_state(shop.app)
    state.outages = OutageWatch(
        state.outages.name, logging.getLogger("flask_gateway.outages"), clock=lambda: clock[0]
    )
    shopper, owner = shop.shopper(), shop.shopper()
    assert owner.log_in().status_code == 303
    shopper.add("enamel-kettle")
    assert shopper.checkout().status_code == 303
    link = _order_link(shop.app, shop.latest_reference())
    assert shopper.get(link).status_code == 200
    assert owner.get("/admin/").status_code == 200
    caplog.set_level(logging.DEBUG)

    cluster.stop_server("fast")
    for _ in range(3):
        _is_outage_page(shopper.get(link))
    admin = owner.get("/admin/")
    _is_outage_page(admin)
    assert ">Admin</a>" not in admin.get_data(as_text=True)  # no owner check without the database
    assert shopper.get(link + "/status.json").status_code == 503

    cluster.start_server()
    back = shopper.get(link)
    assert back.status_code == 200, back.get_data(as_text=True)[:500]
    assert "Enamel stovetop kettle" in back.get_data(as_text=True)
    # The extension probes the database at most once a second while its watch is down (each request
    # above ended with a probe, the first one counted): within that second, no probe and no line yet.
    assert state.outages.down and _lines(caplog, ANSWERS_AGAIN) == []
    clock[0] += 1.0  # the probe interval passed: the line that ends the outage comes with the next request
    assert owner.get("/admin/").status_code == 200  # still logged in
    assert not state.outages.down
    assert len(_lines(caplog, UNREACHABLE)) == 1
    [ended] = _lines(caplog, ANSWERS_AGAIN)
    assert re.search(r"after 1\.0 s \(\d+ request\(s\) answered 503 meanwhile\)", ended.getMessage()), ended
    _no_traceback(caplog)


def test_a_rollback_on_a_killed_connection_does_not_escape_the_request(
    own_cluster: tuple[PostgresCluster, Databases], caplog: pytest.LogCaptureFixture
) -> None:
    """The end of a request rolls back its transaction: on a connection a restart killed meanwhile, that
    rollback fails. It must not escape Flask (gunicorn's "500 POST None"), and the next request gets a
    fresh session on a new connection."""
    cluster, databases = own_cluster
    app = create_shop(shop_config(databases.url()))
    killed: list[int] = []

    @app.get("/test/killed-mid-request")
    def killed_mid_request() -> str:
        pid = db.session.execute(text("SELECT pg_backend_pid()")).scalar_one()  # a transaction is open
        with cluster._admin("killer").cursor() as cursor:
            cursor.execute("SELECT pg_terminate_backend(%s)", (pid,))
        killed.append(pid)
        return "answered"

    @app.get("/test/backend")
    def backend() -> str:
        return str(db.session.execute(text("SELECT pg_backend_pid()")).scalar_one())

    caplog.set_level(logging.DEBUG, logger="example_shop")
    client = app.test_client()
    answer = client.get(SHOP_URL + "/test/killed-mid-request")

    assert (answer.status_code, answer.get_data(as_text=True)) == (200, "answered")
    assert "the session's rollback at the end of the request failed" in caplog.text
    after = client.get(SHOP_URL + "/test/backend")
    assert after.status_code == 200
    assert int(after.get_data(as_text=True)) != killed[0]


def test_gunicorn_workers_booting_while_postgresql_is_down_serve_once_it_is_back(
    own_cluster: tuple[PostgresCluster, Databases], tmp_path: Path
) -> None:
    """The issue's first fault: a worker that boots while the database is down used to exit (code 3) and
    take gunicorn's master with it. Now the workers boot, answer the liveness probe and the outage page,
    and serve as soon as PostgreSQL is back, without a person."""
    cluster, databases = own_cluster
    url = databases.url("shop")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("SHOP_", "GATEWAY_", "FLASK_"))},
        "SHOP_DATABASE_URL": url,
        "SHOP_SECRET_KEY": "shop-secret-for-the-gunicorn-test",
        "GATEWAY_PUBLIC_URL": "http://127.0.0.1:5000",
    }
    init = [sys.executable, "-m", "flask", "--app", "example_shop", "shop", "init-db"]
    subprocess.run(init, env=env, check=True, capture_output=True, timeout=60)
    cluster.stop_server("fast")

    port = free_port()
    log = tmp_path / "gunicorn.log"
    secret_watch.watch_file(log)
    gunicorn = str(Path(sys.executable).parent / "gunicorn")
    command = [gunicorn, "--workers", "2", "--bind", f"127.0.0.1:{port}", "example_shop:create_app()"]
    with log.open("ab") as out:
        server = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"

    def answers(path: str) -> requests.Response | None:
        assert server.poll() is None, log.read_text(errors="replace")
        try:
            return requests.get(base + path, timeout=15)
        except requests.ConnectionError:
            return None

    def get(path: str) -> requests.Response:
        try:
            return requests.get(base + path, timeout=15)
        except requests.RequestException as error:
            raise AssertionError(f"GET {path}: {error!r}\n{log.read_text(errors='replace')}") from error

    try:
        live = wait_for(
            lambda: answers("/gateway/livez"),
            timeout=2 * WAIT_DEADLINE,
            what="gunicorn to answer",
            logs=[log],
        )
        assert live.status_code == 200
        down = get("/")
        assert down.status_code == 503
        assert down.headers["Retry-After"] == "5"
        assert "We'll be right back" in down.text

        cluster.start_server()
        back = get("/")
        assert back.status_code == 200, back.text[:500]
        # The master and both of its workers are there, each booted while the database was down.
        wait_for(lambda: len(child_pids(server.pid)) == 2, what="gunicorn's two workers", logs=[log])
        assert server.poll() is None
        booted = [line for line in log.read_text(errors="replace").splitlines() if "Booting worker" in line]
        assert len(booted) == 2, booted  # none replaced: no worker exited
    finally:
        server.terminate()
        server.wait(timeout=20)
    output = log.read_text(errors="replace")
    assert "Worker failed to boot" not in output
    assert "Traceback" not in output
