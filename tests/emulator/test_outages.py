"""The emulator through database outages: it starts without its database, answers 503 with Retry-After while
the database is away (one log line when the outage starts, one when it ends, no traceback per request),
probes as operators expect (``/livez``, ``/readyz``), and serves again as soon as the database answers.

"Unreachable" is a PostgreSQL URL on port 1 (nothing listens: the connection is refused at once); the
restart tests stop and start a throwaway cluster of their own (tests/postgres.py), never the session's.
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import event, inspect
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from flask_gateway.core.outages import RETRY_AFTER_SECONDS, is_database_outage
from flask_gateway.emulator import delivery, mount
from flask_gateway.emulator.database import database_state
from flask_gateway.emulator.delivery import start_worker, stop_worker
from flask_gateway.emulator.models import Account, db
from tests.conftest import dispose_engines
from tests.emulator.conftest import make_emulator
from tests.emulator.support import Gateway, create_body
from tests.postgres import PostgresCluster, start_cluster
from tests.processes import wait_for

UNREACHABLE = "postgresql+psycopg://gateway@127.0.0.1:1/emulator"
LOGGER = "flask_gateway.emulator"
RETRY_AFTER = str(RETRY_AFTER_SECONDS)


def outage_lines(caplog: pytest.LogCaptureFixture, words: str) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and words in r.getMessage()]


def assert_no_traceback(caplog: pytest.LogCaptureFixture) -> None:
    assert [r.getMessage() for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR] == []


def assert_outage_json(response: Any) -> None:
    assert response.status_code == 503, response.get_data(as_text=True)
    assert response.headers["Retry-After"] == RETRY_AFTER
    assert response.mimetype == "application/json"
    assert set(response.json) == {"message"} and "unreachable" in response.json["message"]


# --- nothing at start ---------------------------------------------------------------------------------


def test_create_app_opens_no_connection(tmp_path: Path):
    """The tables and accounts come on first use: a fresh app has not even created its SQLite file."""
    path = tmp_path / "emulator.sqlite3"
    app = make_emulator(f"sqlite:///{path}")
    connects: list[object] = []
    with app.app_context():
        event.listen(db.engine, "connect", lambda *_: connects.append(1))
    assert not path.exists()

    assert app.test_client().get("/livez").status_code == 200
    assert not path.exists() and connects == []  # liveness never touches the database

    Gateway(app.test_client()).install()  # the first request that needs the database prepares it
    with app.app_context():
        assert set(db.metadata.tables) <= set(inspect(db.engine).get_table_names())
        assert db.session.get(Account, "demo-merchant") is not None
        db.engine.dispose()


def test_an_emulator_created_while_its_database_is_away_answers_503_and_probes(caplog):
    caplog.set_level(logging.INFO, LOGGER)
    app = make_emulator(UNREACHABLE)  # returns: no connection at start
    client = app.test_client()

    live = client.get("/livez")
    assert live.status_code == 200 and live.json == {"status": "ok"}

    ready = client.get("/readyz")
    assert ready.status_code == 503 and ready.headers["Retry-After"] == RETRY_AFTER
    assert ready.json["status"] == "unavailable"
    assert ready.json == {
        "status": "unavailable",
        "checks": {
            "database": {"ok": False, "detail": "unreachable"},
            "schema": {"ok": None, "detail": "not checked: the database does not answer"},
            "accounts": {"ok": None, "detail": "not checked: the database does not answer"},
        },
        "failing": ["database"],
        "message": "Not ready: database (unreachable).",
    }
    assert "127.0.0.1" not in ready.get_data(as_text=True)  # open to anyone: no database address

    signed = {"X-Merchant-Account-ID": "demo-merchant", "X-Signature": "x"}
    for _ in range(3):
        assert_outage_json(client.post("/v2/getstatus", json={"checkoutToken": "t"}, headers=signed))
    assert_outage_json(client.post("/v2/create", json=create_body(), headers=signed))
    assert_outage_json(client.post("/api/v1/merchant/configuration", json={}, auth=("a", "b")))
    assert_outage_json(client.get("/_emulator/checkouts"))
    assert client.get("/_emulator/openapi.json").status_code == 200  # the API document needs no database
    for page in ("/api/v2/app/checkout/v2.demo.x", "/_emulator/"):
        answer = client.get(page)
        assert answer.status_code == 503 and answer.headers["Retry-After"] == RETRY_AFTER
        assert answer.mimetype == "text/html" and "right back" in answer.get_data(as_text=True)

    assert len(outage_lines(caplog, "the database is unreachable")) == 1  # one line for the whole outage
    assert_no_traceback(caplog)
    assert database_state(app).watch.refused >= 8


def test_a_mounted_emulator_touches_no_database_at_mount(tmp_path: Path):
    host = Flask("host", instance_path=str(tmp_path / "instance"))
    host.config.update(SQLALCHEMY_DATABASE_URI=UNREACHABLE, SECRET_KEY="host-secret", TESTING=True)
    SQLAlchemy().init_app(host)
    mount(host)  # no connection: the host boots while its database is away

    client = host.test_client()
    assert client.get("/_gateway/livez").status_code == 200
    ready = client.get("/_gateway/readyz")
    assert ready.status_code == 503 and ready.json["failing"] == ["database"]
    assert_outage_json(client.post("/_gateway/v2/getstatus", json={"checkoutToken": "t"}))


# --- init-db ------------------------------------------------------------------------------------------


def test_init_db_creates_the_tables_and_seeds_the_accounts(tmp_path: Path):
    url = f"sqlite:///{tmp_path / 'emulator.sqlite3'}"
    result = make_emulator(url).test_cli_runner().invoke(args=["init-db"])
    assert result.exit_code == 0, result.output
    check = make_emulator(url)
    with check.app_context():
        assert set(db.metadata.tables) <= set(inspect(db.engine).get_table_names())
        assert db.session.get(Account, "demo-merchant") is not None
        db.session.remove()
        db.engine.dispose()


def test_init_db_with_the_database_away_fails_in_one_line(tmp_path: Path):
    """The pinned command, as an operator runs it: exit status 1 and one line saying why, no traceback."""
    env = {"EMULATOR_DATABASE_URL": UNREACHABLE, "EMULATOR_SECRET_KEY": "x" * 32, "PATH": "/usr/bin:/bin"}
    result = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "flask_gateway.emulator", "init-db"],
        capture_output=True,
        text=True,
        env=env,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: the emulator's database is unreachable (")
    assert "Traceback" not in result.stderr + result.stdout


# --- the answer after a failed rollback ---------------------------------------------------------------


def test_a_session_that_cannot_be_closed_never_turns_an_answer_into_a_500(gateway: Gateway, monkeypatch):
    """A rollback on a connection the database dropped fails in the app context's teardown; the answer
    was chosen already and must reach the client (gunicorn logged ``500 POST None``)."""
    gateway.install()

    def dead_connection(self: Session) -> None:
        raise OperationalError("ROLLBACK", {}, Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(Session, "close", dead_connection)
    answer = gateway.client.get("/_emulator/clock")  # raises here if the teardown let it escape
    assert answer.status_code == 200


# --- the delivery worker ------------------------------------------------------------------------------


def test_the_delivery_worker_survives_an_outage_and_logs_it_once(caplog):
    caplog.set_level(logging.INFO, LOGGER)
    app = make_emulator(UNREACHABLE, public_url="http://emulator.test")
    app.config["EMULATOR_WORKER_INTERVAL"] = 0.02
    state = database_state(app)
    ensure = state.ensure
    refused: list[BaseException] = []

    def counted() -> None:  # each poll of the worker starts here
        try:
            ensure()
        except BaseException as error:
            refused.append(error)
            raise

    state.ensure = counted  # type: ignore[method-assign]
    start_worker(app)
    try:
        wait_for(lambda: len(refused) >= 25, what="25 polls of the delivery worker, each refused")
        worker = app.extensions["gateway_emulator_worker"]
        assert worker.is_alive()
    finally:
        stop_worker(app)
    assert all(is_database_outage(error) for error in refused)
    assert len(outage_lines(caplog, "the database is unreachable")) == 1
    assert_no_traceback(caplog)


# --- a real PostgreSQL, stopped and started -----------------------------------------------------------


@pytest.fixture(scope="module")
def restartable() -> Iterator[PostgresCluster]:
    """A cluster of this module's own: the tests stop and start it."""
    cluster = start_cluster()
    try:
        yield cluster
    finally:
        dispose_engines()  # the emulators' pooled connections, before the server goes
        cluster.stop()


def test_postgresql_stopped_then_started(restartable: PostgresCluster, caplog):
    """503 while the database is down, 200 from the first request after it is back (pool pre-ping); an
    emulator that started while it was down becomes ready with it; one log line each way."""
    caplog.set_level(logging.INFO, LOGGER)
    running = make_emulator(restartable.create_database(), public_url="http://emulator.test")
    gateway = Gateway(running.test_client())
    gateway.install()
    token = gateway.create()["checkoutToken"]
    late_url = restartable.create_database()  # empty: the late emulator creates its tables after restart
    running.config["EMULATOR_WORKER_INTERVAL"] = 0.05
    start_worker(running)
    try:
        restartable.stop_server("fast")
        late = make_emulator(late_url)  # boots while the database is away

        for _ in range(3):
            assert_outage_json(gateway.signed("/v2/getstatus", {"checkoutToken": token}))
        assert_outage_json(gateway.signed("/v2/create", create_body(request_id="during")))
        assert late.test_client().get("/readyz").status_code == 503
        assert_outage_json(late.test_client().post("/_emulator/reset", json={}))
        assert running.test_client().get("/livez").status_code == 200

        restartable.start_server()

        status = gateway.signed("/v2/getstatus", {"checkoutToken": token})  # the first request after
        assert status.status_code == 200, status.get_data(as_text=True)
        assert gateway.signed("/v2/create", create_body(request_id="after")).status_code == 200
        ready = late.test_client().get("/readyz")
        assert ready.status_code == 200, ready.json
        assert list(ready.json["checks"]) == ["database", "schema", "accounts"]
        assert all(check["ok"] for check in ready.json["checks"].values()) and "failing" not in ready.json
        Gateway(late.test_client()).install()
        # The worker heals too: it keeps polling, and its own probe ends nothing twice.
        wait_for(
            lambda: not database_state(running).watch.down,
            interval=0.05,
            what="the delivery worker's watch to see the database back",
            logs=[restartable.root / "log"],
        )
        assert running.extensions["gateway_emulator_worker"].is_alive()
    finally:
        stop_worker(running)
        if not restartable.is_running():
            restartable.start_server()

    for name in ("the database is unreachable", "the database answers again after"):
        per_app = len(outage_lines(caplog, name))
        assert per_app == 2, [r.getMessage() for r in caplog.records]  # one per app: running and late
    assert_no_traceback(caplog)


def test_an_attempt_cut_short_by_an_outage_is_made_again_when_the_database_answers(
    installed: Gateway, monkeypatch
):
    """Its lease (60 s) is given back once the database answers: the next run makes the attempt at once."""
    installed.pay(installed.create()["checkoutToken"])
    real_prepare = delivery._prepare

    def database_gone(delivery_id: int) -> object:
        monkeypatch.setattr(delivery, "_prepare", real_prepare)
        raise OperationalError("SELECT", {}, Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(delivery, "_prepare", database_gone)
    cut_short = installed.control("deliver")
    assert cut_short.status_code == 503 and cut_short.headers["Retry-After"] == RETRY_AFTER

    again = installed.control("deliver")
    assert again.status_code == 200 and again.json == {"attempts": 1}
    [attempt] = installed.control("callbacks", method="GET").json["callbacks"]
    assert attempt["number"] == 1
