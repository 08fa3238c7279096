"""Idempotency claims live and die with the request that holds them (flask_gateway/emulator/idempotency.py).

- A duplicate that arrives while the first request is doing the work: PostgreSQL answers 409 "still in
  flight" at once (the advisory lock is held); SQLite makes it wait for the write lock, then replays.
- A request that dies in the middle of its work (its connection killed by ``pg_terminate_backend``, or an
  exception) leaves no claim: the retry runs the work at once, no 409 and no replay.
- The unique key is the backstop: a duplicate stored while the work ran wins, the work is rolled back.

Replays and the 422 for a different body are tests/emulator/test_v2_api.py.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import func, insert, select, text
from werkzeug.test import TestResponse

from flask_gateway.core.timestamps import utcnow
from flask_gateway.emulator import checkouts
from flask_gateway.emulator.idempotency import _body_hash, lock_key
from flask_gateway.emulator.models import Checkout, IdempotencyKey, db
from tests.conftest import fetch_all, new_connection
from tests.emulator.support import ACCOUNT, Gateway, create_body, write_lock_asked
from tests.processes import WAIT_DEADLINE, wait_for


def postgresql_only(database_backend: str) -> None:
    if database_backend != "postgresql":
        pytest.skip("PostgreSQL's advisory lock (SQLite serialises writers: see the tests above)")


def count(app: Flask, model: type[Any]) -> int:
    with app.app_context():
        found = db.session.scalar(select(func.count()).select_from(model))
        db.session.remove()
    return int(found or 0)


def wrap_create(monkeypatch: pytest.MonkeyPatch, during: Callable[[], None]) -> None:
    """Call ``during`` inside the first create's work (once), then do the real work."""
    real = checkouts.create
    calls = {"n": 0}

    def create(*args: Any, **kwargs: Any) -> Checkout:
        calls["n"] += 1
        if calls["n"] == 1:
            during()
        return real(*args, **kwargs)

    monkeypatch.setattr(checkouts, "create", create)


@pytest.mark.backends
def test_a_duplicate_during_the_work(
    installed: Gateway, emulator_app: Flask, database_backend: str, monkeypatch
):
    inside, release = threading.Event(), threading.Event()

    def hold() -> None:
        inside.set()
        assert release.wait(WAIT_DEADLINE)

    wrap_create(monkeypatch, hold)
    answers: dict[str, TestResponse] = {}
    first = threading.Thread(
        target=lambda: answers.setdefault("first", installed.signed("/v2/create", create_body()))
    )
    first.start()
    assert inside.wait(WAIT_DEADLINE), "the first create never reached its work"
    duplicate = Gateway(emulator_app.test_client())
    duplicate.keys = installed.keys
    if database_backend == "postgresql":
        # The first request holds the key's advisory lock in its transaction: 409 at once.
        answer = duplicate.signed("/v2/create", create_body())
        assert answer.status_code == 409, answer.get_data(as_text=True)
        assert "still in flight" in answer.json["message"]
        release.set()
        first.join(WAIT_DEADLINE)
    else:
        # SQLite: the first holds the write lock; the duplicate waits for its commit, then replays.
        second = threading.Thread(
            target=lambda: answers.setdefault("second", duplicate.signed("/v2/create", create_body()))
        )
        with write_lock_asked(emulator_app, second) as asked:
            second.start()
            assert asked.wait(WAIT_DEADLINE), "the duplicate never asked for the write lock"
            # It asked while the first holds the lock, and gets it only after the first's commit.
            assert second.is_alive()
            release.set()
            first.join(WAIT_DEADLINE)
            second.join(WAIT_DEADLINE)
        answer = answers["second"]
        assert answer.status_code == 200 and answer.headers["idempotent-replay"] == "true"
        assert answer.json == answers["first"].json
    assert answers["first"].status_code == 200
    assert "idempotent-replay" not in answers["first"].headers
    replay = installed.signed("/v2/create", create_body())
    assert replay.headers["idempotent-replay"] == "true" and replay.json == answers["first"].json
    assert count(emulator_app, Checkout) == 1


@pytest.mark.backends
def test_a_request_that_dies_mid_work_leaves_no_claim(
    installed: Gateway, emulator_app: Flask, database_url: str, database_backend: str, monkeypatch
):
    def die() -> None:
        if database_backend == "sqlite":
            raise RuntimeError("the worker died")  # the process's own failure: the same for the claim
        pid = db.session.connection().exec_driver_sql("SELECT pg_backend_pid()").scalar()
        with new_connection(database_url) as admin:  # the database restarting under this request
            assert admin.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid}).scalar()

    wrap_create(monkeypatch, die)
    died = installed.signed("/v2/create", create_body())
    assert died.status_code == (503 if database_backend == "postgresql" else 500), died.get_data(as_text=True)
    if database_backend == "postgresql":
        assert died.headers["Retry-After"] == "5"
    assert count(emulator_app, IdempotencyKey) == 0

    retry = installed.signed("/v2/create", create_body())  # at once: no 409, no replay
    assert retry.status_code == 200, retry.get_data(as_text=True)
    assert "idempotent-replay" not in retry.headers
    assert count(emulator_app, Checkout) == 1 and count(emulator_app, IdempotencyKey) == 1


@pytest.mark.backends
def test_a_refund_that_dies_mid_work_leaves_no_claim(installed: Gateway, emulator_app: Flask, monkeypatch):
    token = installed.create()["checkoutToken"]
    assert installed.pay(token).status_code == 200
    body = {
        "checkoutToken": token,
        "refundAmountCents": 100,
        "merchantRefundReference": "r-1",
        "refundDescription": "returned kettle",
        "requestId": "refund-1",
    }
    real = checkouts.refund

    def dies(*args: Any, **kwargs: Any) -> Any:
        monkeypatch.setattr(checkouts, "refund", real)
        raise RuntimeError("the worker died")

    monkeypatch.setattr(checkouts, "refund", dies)
    assert installed.signed("/v2/refund", body).status_code == 500
    retry = installed.signed("/v2/refund", body)
    assert retry.status_code == 200, retry.get_data(as_text=True)
    assert "idempotent-replay" not in retry.headers
    assert installed.signed("/v2/refund", body).headers["idempotent-replay"] == "true"
    assert installed.status(token)["checkoutPaymentStatus"] == "PARTIALLY_REFUNDED"


@pytest.mark.backends
def test_a_held_lock_is_409_and_its_release_lets_the_request_run(
    installed: Gateway, database_url: str, database_backend: str
):
    """The lock key is what a holder takes: held by another session, the request is in flight."""
    postgresql_only(database_backend)
    key = lock_key(ACCOUNT, "create", "req-1")
    with new_connection(database_url) as holder:
        assert holder.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar()
        held = installed.signed("/v2/create", create_body())
        assert held.status_code == 409 and "still in flight" in held.json["message"]
        assert installed.signed("/v2/create", create_body(request_id="req-2")).status_code == 200
        holder.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})
    assert installed.signed("/v2/create", create_body()).status_code == 200


@pytest.mark.backends
def test_a_duplicate_stored_during_the_work_wins(
    installed: Gateway, emulator_app: Flask, database_url: str, database_backend: str, monkeypatch
):
    """The unique key backs the lock up (work that commits midway ends the lock early): the answer stored
    first stands, the second work is rolled back and its request answers the stored one."""
    postgresql_only(database_backend)  # SQLite: no other writer can store anything while the work runs
    raw = json.dumps(create_body()).encode()
    stored = '{"checkoutToken": "stored-first"}'

    def store_a_duplicate() -> None:
        with new_connection(database_url) as other:
            other.execute(
                insert(IdempotencyKey),
                {
                    "account_id": ACCOUNT,
                    "operation": "create",
                    "request_id": "req-1",
                    "body_hash": _body_hash(raw),
                    "completed": True,
                    "status_code": 200,
                    "response_body": stored,
                    "created_at": utcnow(),
                },
            )

    wrap_create(monkeypatch, store_a_duplicate)
    answer = installed.signed("/v2/create", None, raw=raw)
    assert answer.status_code == 200
    assert answer.headers["idempotent-replay"] == "true" and answer.get_data(as_text=True) == stored
    assert count(emulator_app, Checkout) == 0  # the work was rolled back


#: A server worker that dies in the middle of a create (gunicorn's SIGKILL): the work never returns.
_KILLED_WORKER = """
import sys, time
from flask_gateway.core.signing import sign
from flask_gateway.emulator import EmulatorSettings, checkouts, create_app

url, key, instance = sys.argv[1:4]
body = sys.stdin.buffer.read()
app = create_app(
    {"TESTING": True, "SQLALCHEMY_DATABASE_URI": url, "SECRET_KEY": "k" * 32,
     "EMULATOR_SETTINGS": EmulatorSettings(worker=False)},
    instance_path=instance,
)

def create(*args, **kwargs):
    from flask_gateway.emulator.models import db
    # PostgreSQL: the server process of the connection that holds the claim (its advisory lock).
    connection = db.session.connection()
    pid = connection.exec_driver_sql("SELECT pg_backend_pid()").scalar() if connection.dialect.name == "postgresql" else ""
    print(f"inside the work {pid}", flush=True)
    time.sleep(120)

checkouts.create = create
headers = {"Content-Type": "application/json", "X-Merchant-Account-ID": "demo-merchant",
           "X-Signature": sign(body, key)}
app.test_client().post("/v2/create", data=body, headers=headers)
"""


@pytest.mark.backends
def test_a_request_whose_process_is_killed_mid_work_leaves_no_claim(
    installed: Gateway, emulator_app: Flask, database_url: str, tmp_path
):
    """No cleanup code runs in a killed process: the claim must end with its transaction (the old claim,
    committed on its own, answered 409 "still in flight" for 60 s)."""
    raw = json.dumps(create_body()).encode()
    with subprocess.Popen(
        [sys.executable, "-c", _KILLED_WORKER, database_url, installed.keys[ACCOUNT], str(tmp_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    ) as worker:
        try:
            assert worker.stdin is not None and worker.stdout is not None
            worker.stdin.write(raw)
            worker.stdin.close()
            said = worker.stdout.readline().decode()
            assert said.startswith("inside the work"), said
        finally:
            worker.kill()
    backend = said.split()[-1] if said.split()[-1].isdigit() else None
    if backend is not None:
        # PostgreSQL ends the dead client's session (its transaction, so its lock) once it reads the
        # closed socket: the retry comes after that, the one event the claim may last until.
        wait_for(
            lambda: (
                not fetch_all(
                    database_url, "SELECT 1 FROM pg_stat_activity WHERE pid = :pid", pid=int(backend)
                )
            ),
            what=f"PostgreSQL to end the killed client's session (backend {backend})",
        )
    retry = installed.signed("/v2/create", None, raw=raw)  # once: no 409 to wait out
    assert retry.status_code == 200, retry.get_data(as_text=True)
    assert "idempotent-replay" not in retry.headers
    assert count(emulator_app, Checkout) == 1
