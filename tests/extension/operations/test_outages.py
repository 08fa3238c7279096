"""The extension while the database is away (issue 23): it boots, answers 503 with ``Retry-After`` (JSON for
the gateway, a page for people), logs one line when the outage starts and one when it ends, never a
traceback per request, and its teardown and CLI never turn an outage into a 500 or a traceback.

Most tests point the shop at a closed PostgreSQL port (nothing listens: every connection is refused at
once). The recovery test stops and starts a cluster of its own.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import IntegrityError, OperationalError

import flask_gateway
from flask_gateway import (
    DATABASE_ERRORS,
    DatabaseUnavailable,
    Gateway,
    database_unavailable,
    is_database_outage,
)
from flask_gateway.core.outages import RETRY_AFTER_SECONDS, OutageWatch
from flask_gateway.operations.cli import EXIT_CONFIGURATION, EXIT_DATABASE_AWAY
from flask_gateway.state import get_state
from tests.conftest import dispose_engines
from tests.extension.operations.cli_support import run_gateway
from tests.postgres import PostgresCluster, start_cluster
from tests.processes import free_port

OUTAGE_LOGGER = "flask_gateway.outages"


@pytest.fixture(autouse=True)
def _engines_disposed() -> Iterator[None]:
    """These tests use no ``databases`` fixture, which would dispose the engines after each test."""
    yield
    dispose_engines()


def shop_on(database_url: str, **config: Any) -> Flask:
    """A shop with the extension (and an admin guard that lets everyone in); no table is created."""
    app = Flask("outage_shop")
    app.config.update(
        SECRET_KEY="shop-secret-key-for-tests",
        SQLALCHEMY_DATABASE_URI=database_url,
        GATEWAY_MAX_RETRIES=0,
    )
    app.config.update(config)
    db = SQLAlchemy(app)
    gateway = Gateway(app, db=db)
    gateway.admin_guard(lambda: True)
    return app


def closed_port_url() -> str:
    return f"postgresql+psycopg://gateway@127.0.0.1:{free_port()}/shop"


def outage_records(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [record for record in caplog.records if record.name == OUTAGE_LOGGER]


def assert_quiet(caplog: pytest.LogCaptureFixture) -> None:
    """No traceback and nothing at ERROR or above in the log (an outage is not a bug)."""
    loud = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert loud == [], [r.getMessage() for r in loud]
    assert "Traceback" not in caplog.text


# --- booting and answering while the database is away ------------------------------------------------


@pytest.mark.parametrize("environment", ["emulator", "embedded"])
def test_a_shop_boots_with_its_database_away_and_answers_503(
    environment: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    app = shop_on(closed_port_url(), GATEWAY_ENVIRONMENT=environment)  # init_app: no connection tried
    client = app.test_client()

    for _ in range(4):
        answer = client.post("/gateway/callback", data=b"{}", content_type="application/json")
        assert answer.status_code == 503
        assert answer.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
        assert answer.mimetype == "application/json"
        assert set(answer.get_json()) == {"message"}
        assert "try again" in answer.get_json()["message"].lower()

    admin = client.get("/gateway/admin/")
    assert admin.status_code == 503
    assert admin.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    assert admin.mimetype == "text/html"
    assert "right back" in admin.get_data(as_text=True)

    warnings = [r for r in outage_records(caplog) if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    assert "the database is unreachable" in warnings[0].getMessage()
    assert "Connection refused" in warnings[0].getMessage() or "refused" in warnings[0].getMessage()
    assert_quiet(caplog)
    with app.app_context():
        assert get_state().outages.down
        assert get_state().outages.refused >= 5


@pytest.mark.parametrize("environment", ["emulator", "embedded"])
def test_init_app_opens_no_connection(environment: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Neither the database nor the network (nor the embedded emulator's database) at boot."""
    attempts: list[object] = []

    def no_connection(_socket: socket.socket, address: object) -> None:
        attempts.append(address)
        raise OSError("no connection at boot")

    def no_database(engine: Engine, *_args: object, **_kwargs: object) -> None:
        attempts.append(engine.url.render_as_string())
        raise OSError("no database at boot")

    monkeypatch.setattr(socket.socket, "connect", no_connection)
    monkeypatch.setattr(socket.socket, "connect_ex", no_connection)
    monkeypatch.setattr(Engine, "raw_connection", no_database)  # every engine's connections
    shop_on(closed_port_url(), GATEWAY_ENVIRONMENT=environment)
    assert attempts == []

    # The traps do catch a connection of either kind (so the test can fail).
    with pytest.raises(OSError, match="no database"):
        create_engine(closed_port_url()).connect()
    with pytest.raises(requests.ConnectionError):
        requests.get("http://127.0.0.1:9/", timeout=1)
    assert len(attempts) == 2


def test_the_v1_urls_and_the_return_page_answer_503_during_an_outage(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Signed references (the database is only needed after the signature): JSON for the gateway's v1
    URLs, the ``gateway/unavailable.html`` page for the shopper's return page."""
    app = shop_on(closed_port_url(), GATEWAY_API_VERSION="v1")
    with app.test_request_context():
        from flask_gateway.urls import return_url, v1_outcome_url

        success = v1_outcome_url(7, "v1-success")
        back = return_url(7, "confirm")
    client = app.test_client()

    answer = client.get(success.replace("http://localhost", "") + "&token=t-1&status=SUCCESS")
    assert answer.status_code == 503
    assert answer.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    assert set(answer.get_json()) == {"message"}

    page = client.get(back.replace("http://localhost", ""))
    assert page.status_code == 503
    assert page.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    assert page.mimetype == "text/html"
    assert "reload this page" in page.get_data(as_text=True)
    assert page.headers["X-Frame-Options"] == "DENY"  # the blueprint's headers still apply
    assert len([r for r in outage_records(caplog) if r.levelno == logging.WARNING]) == 1
    assert_quiet(caplog)


def test_missing_tables_are_a_503_naming_the_command_not_a_500(tmp_path: Any) -> None:
    """A database without the gateway's tables (never initialised, a migration not run): the callback is
    answered 503 with Retry-After (the gateway sends it again) and the command that creates them."""
    app = shop_on(f"sqlite:///{tmp_path / 'empty.sqlite3'}", TESTING=True)
    answer = app.test_client().post("/gateway/callback", data=b"{}", content_type="application/json")
    assert answer.status_code == 503 and answer.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    assert "`flask gateway init-db` or the migrations" in answer.json["message"]


def test_the_probes_during_an_outage(caplog: pytest.LogCaptureFixture) -> None:
    app = shop_on(closed_port_url())
    client = app.test_client()

    live = client.get("/gateway/livez")
    assert (live.status_code, live.get_json()) == (200, {"status": "ok"})

    ready = client.get("/gateway/readyz")
    assert ready.status_code == 503
    assert ready.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    body = ready.get_json()
    assert body["failing"] == ["database"]
    assert body["checks"]["database"] == {"ok": False, "detail": "unreachable"}
    assert body["checks"]["schema"]["ok"] is None
    assert body["checks"]["installation"]["ok"] is None
    # The database's address stays in the log, not in an answer anyone may read.
    assert "127.0.0.1" not in ready.get_data(as_text=True)
    assert "refused" not in ready.get_data(as_text=True).lower()
    assert len([r for r in outage_records(caplog) if r.levelno == logging.WARNING]) == 1
    assert_quiet(caplog)


# --- database_unavailable, the app's own handlers ----------------------------------------------------


def refused() -> OperationalError:
    return OperationalError("SELECT 1", {}, Exception("connection refused"))


def test_the_front_door_offers_the_outage_names() -> None:
    for name in ("DATABASE_ERRORS", "DatabaseUnavailable", "database_unavailable", "is_database_outage"):
        assert name in flask_gateway.__all__
    assert OperationalError in DATABASE_ERRORS
    assert issubclass(DatabaseUnavailable, flask_gateway.GatewayExtensionError)


def test_database_unavailable_counts_in_the_apps_watch_and_answers_503_json(
    caplog: pytest.LogCaptureFixture,
) -> None:
    app = shop_on(closed_port_url())
    with app.app_context():
        errors = [database_unavailable(refused()) for _ in range(3)]
        watch = get_state().outages
        assert watch.down and watch.refused == 3

    unavailable = errors[0]
    assert isinstance(unavailable, DatabaseUnavailable)
    assert unavailable.code == 503
    assert unavailable.retry_after == RETRY_AFTER_SECONDS
    response = unavailable.get_response()
    assert response.status_code == 503
    assert response.headers["Retry-After"] == str(RETRY_AFTER_SECONDS)
    assert response.headers["Content-Type"] == "application/json"
    assert response.headers["Cache-Control"] == "no-store"
    assert set(response.get_json()) == {"message"}

    warnings = outage_records(caplog)
    assert [r.levelno for r in warnings] == [logging.WARNING]
    assert "connection refused" in warnings[0].getMessage()
    assert "SELECT 1" not in warnings[0].getMessage()  # never the statement (it may hold customer data)
    assert_quiet(caplog)


def test_database_unavailable_works_outside_an_app() -> None:
    assert database_unavailable(refused()).code == 503


def test_an_apps_own_handlers_for_database_errors(caplog: pytest.LogCaptureFixture) -> None:
    """The recipe of ``flask_gateway.operations.outages`` (the example shop's): outages answer the app's own 503 page,
    other database errors stay 500s."""
    app = shop_on(closed_port_url())

    def database_away(error: Exception) -> Any:
        if not is_database_outage(error):
            raise error
        unavailable = database_unavailable(error)
        return "we'll be right back", 503, {"Retry-After": str(unavailable.retry_after)}

    for error_class in DATABASE_ERRORS:
        app.register_error_handler(error_class, database_away)

    @app.get("/products")
    def products() -> str:
        raise refused()

    @app.get("/broken")
    def broken() -> str:
        raise OperationalError("SELECT x", {}, Exception("no such column: x"))

    @app.get("/duplicate")
    def duplicate() -> str:
        raise IntegrityError("INSERT", {}, Exception("duplicate key"))

    client = app.test_client()
    page = client.get("/products")
    assert (page.status_code, page.headers["Retry-After"]) == (503, str(RETRY_AFTER_SECONDS))
    assert page.get_data(as_text=True) == "we'll be right back"
    caplog.clear()
    assert client.get("/broken").status_code == 500
    assert client.get("/duplicate").status_code == 500
    assert any(r.exc_info for r in caplog.records)  # a bug keeps its traceback


# --- recovery ------------------------------------------------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(scope="module")
def cluster() -> Iterator[PostgresCluster]:
    """A cluster of this module's own: its tests stop and start the server."""
    started = start_cluster()
    try:
        yield started
    finally:
        started.stop()


def test_the_outage_ends_on_the_first_request_after_the_database_returns(
    cluster: PostgresCluster, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    url = cluster.create_database()
    # What docs/operations.md asks of the host: a connection broken by the restart is replaced before use.
    app = shop_on(url, SQLALCHEMY_ENGINE_OPTIONS={"pool_pre_ping": True})
    with app.app_context():
        get_state().db.create_all()
        clock = FakeClock()
        get_state().outages = OutageWatch("flask_gateway", logging.getLogger(OUTAGE_LOGGER), clock=clock)
    client = app.test_client()
    assert client.get("/gateway/admin/").status_code == 200  # the pool holds a connection now

    cluster.stop_server("fast")
    try:
        for _ in range(3):
            assert client.get("/gateway/admin/").status_code == 503
            clock.now += 0.2  # the probes after these requests: at most one a second
        assert client.get("/gateway/readyz").status_code == 503
    finally:
        cluster.start_server()

    clock.now += 1.0
    # Any request ends with the probe: the outage is over, said once, before the next request comes.
    assert client.get("/gateway/livez").status_code == 200
    ends = [r.getMessage() for r in outage_records(caplog) if "answers again after" in r.getMessage()]
    assert len(ends) == 1, ends
    assert "4 request(s) answered 503 meanwhile" in ends[0]
    with app.app_context():
        assert not get_state().outages.down

    # The first request after the return succeeds (pool_pre_ping replaced the broken connection).
    assert client.get("/gateway/admin/").status_code == 200
    starts = [r for r in outage_records(caplog) if "unreachable" in r.getMessage()]
    assert len(starts) == 1
    assert_quiet(caplog)


def test_a_ready_process_answers_a_probe_with_one_select(
    cluster: PostgresCluster, caplog: pytest.LogCaptureFixture
) -> None:
    url = cluster.create_database()
    app = shop_on(url, SQLALCHEMY_ENGINE_OPTIONS={"pool_pre_ping": True})
    with app.app_context():
        state = get_state()
        state.db.create_all()
        state.session.execute(
            text(
                "INSERT INTO gateway_installations (environment, merchant_account_id, api_key_encrypted, "
                "signing_key_encrypted, callback_url, minimum_cents, maximum_cents, installed_at, "
                "updated_at) VALUES ('emulator', 'M-SECRET-ACCOUNT', 'x', 'y', 'https://shop.example/cb', "
                "100, 1000, now(), now())"
            )
        )
        state.session.commit()
    client = app.test_client()
    first = client.get("/gateway/readyz")
    assert first.status_code == 200, first.get_json()
    assert "M-SECRET-ACCOUNT" not in first.get_data(as_text=True)

    statements: list[str] = []
    with app.app_context():
        engine = get_state().engine
    from sqlalchemy import event

    def seen(_conn: Any, _cursor: Any, statement: str, *_args: Any) -> None:
        statements.append(statement)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        again = client.get("/gateway/readyz")
    finally:
        event.remove(engine, "before_cursor_execute", seen)
    assert again.status_code == 200
    assert again.get_json() == {
        "status": "ready",
        "checks": {"database": {"ok": True}, "schema": {"ok": True}, "installation": {"ok": True}},
        "background": {  # informational, one more small query (the heartbeats: test_heartbeats.py)
            "deliver": {"age_seconds": None, "overdue": False},
            "reconcile": {"age_seconds": None, "overdue": False},
        },
    }
    queries = [s for s in statements if s.strip().upper() not in ("BEGIN", "COMMIT", "ROLLBACK")]
    assert queries[0] == "SELECT 1"
    assert len(queries) == 2 and "FROM (SELECT" in queries[1] and "gateway_job_runs" in queries[1], queries

    # A success is kept, but the database is asked every time: an outage still shows.
    cluster.stop_server("fast")
    try:
        down = client.get("/gateway/readyz")
        assert down.status_code == 503
        assert down.get_json()["failing"] == ["database"]
    finally:
        cluster.start_server()
    assert client.get("/gateway/readyz").status_code == 200


def test_teardown_survives_a_connection_killed_mid_transaction(
    cluster: PostgresCluster, caplog: pytest.LogCaptureFixture
) -> None:
    """The rollback of a session whose connection the server ended fails; the teardown swallows it, and
    the next request of the thread gets a clean session."""
    caplog.set_level(logging.DEBUG, logger="flask_gateway.state")
    url = cluster.create_database()
    app = shop_on(url)
    with app.app_context():
        get_state().db.create_all()

    @app.get("/killed")
    def killed() -> str:
        session = get_state().session
        pid = session.execute(text("SELECT pg_backend_pid()")).scalar_one()
        with get_state().engine.connect() as other:
            other.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        return "answered"

    client = app.test_client()
    assert client.get("/killed").get_data(as_text=True) == "answered"  # no 500 from the teardown
    said = [r.getMessage() for r in caplog.records if r.name == "flask_gateway.state"]
    assert len(said) == 1 and "could not roll back" in said[0], said
    assert client.get("/gateway/admin/").status_code == 200


def test_remove_session_never_raises_and_clears_the_registry(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Any
) -> None:
    caplog.set_level(logging.DEBUG, logger="flask_gateway.state")
    app = shop_on(f"sqlite:///{tmp_path / 'shop.sqlite3'}")
    with app.app_context():
        state = get_state()
        session = state.session
        assert state._sessions is not None and state._sessions.registry.has()

        def dead_rollback() -> None:
            raise OperationalError("ROLLBACK", {}, Exception("server closed the connection unexpectedly"))

        monkeypatch.setattr(session, "close", dead_rollback)
        state.remove_session()  # does not raise
        assert not state._sessions.registry.has()
    said = [r for r in caplog.records if r.name == "flask_gateway.state"]
    assert [r.levelno for r in said] == [logging.DEBUG]
    assert "server closed the connection" in said[0].getMessage()


# --- the CLI -------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "command",
    [
        ["deliver"],
        ["reconcile", "--quiet"],
        ["status", "tok-1"],
        ["callbacks"],
        ["outbox"],
        ["init-db"],
        ["prune-callbacks", "--refused"],
        ["replay-callback", "1"],
        ["redeliver", "1"],
    ],
    ids=lambda command: command[0],
)
def test_a_command_with_the_database_away_says_so_in_one_line(command: list[str]) -> None:
    """The line saying what the command uses (which database is away), then the error: nothing else."""
    url = closed_port_url()
    app = shop_on(url)
    result = run_gateway(app, *command)
    assert result.exit_code == EXIT_DATABASE_AWAY, result.output
    using, error = result.stderr.strip().splitlines()
    assert using == (
        f"Using database {url}, gateway emulator at http://127.0.0.1:5050, installation not read (the "
        "database does not answer)."
    )
    assert error.startswith("Error: the database is unreachable (OperationalError: ")
    assert "run the command again once it answers" in error
    assert result.stdout == ""
    assert "Traceback" not in result.output


def test_a_command_meeting_a_missing_table_says_so_in_one_line(tmp_path: Any) -> None:
    app = shop_on(f"sqlite:///{tmp_path / 'empty.sqlite3'}")
    result = run_gateway(app, "callbacks")
    assert result.exit_code == EXIT_CONFIGURATION, result.output
    assert result.stderr.strip().splitlines()[1].startswith("Error: the gateway's tables are missing in ")
    assert "run `flask gateway init-db` or your migrations." in result.stderr
    assert "Traceback" not in result.output
