"""What a v2 create costs the database, and that the cheaper create keeps its guarantees (issue 30).

- PostgreSQL: two statements in one transaction: the request state (account, clock, faults) with the
  key's lock and stored answer, and the checkout, its first event and the stored answer in one ``WITH``.
- SQLite: the request state is read without the write lock (a DEFERRED transaction of its own), so that
  authenticating and validating a request never makes the other writers wait; the work's transaction
  begins ``BEGIN IMMEDIATE`` when the work starts.
- A failure while the rows are written leaves none of them; the lock is held until the rows are committed.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import event, func, select, text
from sqlalchemy.engine import Engine
from werkzeug.test import TestResponse

from flask_gateway.core import signing
from flask_gateway.core.wire import OrderDetailsEcho
from flask_gateway.core.wire.names import OPERATOR, SPEC, WireNames
from flask_gateway.emulator import api, checkouts, idempotency
from flask_gateway.emulator.idempotency import lock_key
from flask_gateway.emulator.models import Checkout, CheckoutEvent, IdempotencyKey, db
from tests.conftest import new_connection
from tests.emulator.conftest import make_emulator
from tests.emulator.support import ACCOUNT, Gateway, create_body, write_lock_asked
from tests.processes import WAIT_DEADLINE

pytestmark = pytest.mark.backends


@contextmanager
def counted(app: Flask) -> Iterator[dict[str, Any]]:
    """The statements, commits and pool checkouts of the emulator's engine while the block runs."""
    seen: dict[str, Any] = {"statements": [], "commits": 0, "checkouts": 0}
    with app.app_context():
        engine: Engine = db.engine

    def statement(_conn: Any, _cursor: Any, sql: str, *_args: Any) -> None:
        seen["statements"].append(" ".join(sql.split()))

    def commit(_conn: Any) -> None:
        seen["commits"] += 1

    def checkout(*_args: Any) -> None:
        seen["checkouts"] += 1

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine, "commit", commit)
    event.listen(engine.pool, "checkout", checkout)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(engine, "commit", commit)
        event.remove(engine.pool, "checkout", checkout)


def rows(app: Flask, model: type[Any]) -> int:
    with app.app_context():
        found = db.session.scalar(select(func.count()).select_from(model))
        db.session.remove()
    return int(found or 0)


def test_statements_commits_and_checkouts_of_a_create(
    installed: Gateway, emulator_app: Flask, database_backend: str
):
    installed.create(create_body(request_id="warm-up"))  # first use: the tables, the accounts
    with counted(emulator_app) as seen:
        created = installed.create(create_body(request_id="counted"))
    statements = seen["statements"]
    if database_backend == "postgresql":
        # The request state with the key's advisory lock and stored answer; the rows and the answer in
        # one WITH.
        assert len(statements) == 2, statements
        assert "FROM emulator_accounts LEFT OUTER JOIN emulator_idempotency_keys" in statements[0]
        assert "pg_try_advisory_xact_lock" in statements[0]
        assert statements[1].startswith("WITH new_checkout AS (INSERT INTO emulator_checkouts")
        assert "INSERT INTO emulator_checkout_events" in statements[1]
        assert "INSERT INTO emulator_idempotency_keys" in statements[1]
        assert seen["checkouts"] == 1  # one transaction: one pool checkout (one pre-ping)
    else:
        # The request state in a read transaction of its own; then the work's: the stored answer looked
        # for, the checkout, its event, the key (no round trips: SQLite runs in the process).
        assert statements[0] == "BEGIN", statements
        assert statements[2] == "BEGIN IMMEDIATE", statements
        assert len(statements) == 7, statements
        assert seen["checkouts"] <= 2
    assert seen["commits"] == 1
    # The rows are all there: the checkout, its "created" event, the stored answer.
    with emulator_app.app_context():
        checkout = db.session.scalars(
            select(Checkout).where(Checkout.token == created["checkoutToken"])
        ).one()
        assert [(e.kind, e.detail) for e in checkout.events] == [("created", "total 79800 cents")]
        key = db.session.scalars(select(IdempotencyKey).where(IdempotencyKey.request_id == "counted")).one()
        assert key.completed and key.status_code == 200
        db.session.remove()
    replay = installed.signed("/v2/create", create_body(request_id="counted"))
    assert replay.headers["idempotent-replay"] == "true" and replay.json == created


def test_a_create_without_request_id_writes_its_rows(installed: Gateway, emulator_app: Flask):
    before = rows(emulator_app, CheckoutEvent)
    first = installed.create(create_body(request_id=None))
    second = installed.create(create_body(request_id=None))
    assert first["checkoutToken"] != second["checkoutToken"]
    assert rows(emulator_app, Checkout) == 2
    assert rows(emulator_app, CheckoutEvent) == before + 2
    assert rows(emulator_app, IdempotencyKey) == 0


def test_a_failure_while_the_rows_are_written_leaves_none(
    installed: Gateway, emulator_app: Flask, monkeypatch: pytest.MonkeyPatch
):
    """The key row is written last (SQLite) or in the same statement (PostgreSQL): it fails, nothing stays."""
    real = idempotency._stored

    def broken(*args: Any) -> dict[str, Any]:
        return {**real(*args), "request_id": None}  # NOT NULL: the key's INSERT fails

    monkeypatch.setattr(idempotency, "_stored", broken)
    failed = installed.signed("/v2/create", create_body(request_id="broken"))
    assert failed.status_code == 500, failed.get_data(as_text=True)
    assert rows(emulator_app, Checkout) == 0
    assert rows(emulator_app, CheckoutEvent) == 0
    assert rows(emulator_app, IdempotencyKey) == 0
    monkeypatch.setattr(idempotency, "_stored", real)
    retry = installed.signed("/v2/create", create_body(request_id="broken"))
    assert retry.status_code == 200 and "idempotent-replay" not in retry.headers
    assert rows(emulator_app, Checkout) == 1 and rows(emulator_app, CheckoutEvent) == 1


def test_the_claim_is_held_until_the_rows_are_written(
    installed: Gateway, emulator_app: Flask, database_backend: str, monkeypatch: pytest.MonkeyPatch
):
    """A duplicate arriving while the first request writes its rows: 409 on PostgreSQL (the advisory lock
    is held through the write), on SQLite it waits for the write lock and replays."""
    inside, release = threading.Event(), threading.Event()
    real = checkouts._insert_created

    def held(*args: Any) -> int:
        if not inside.is_set():
            inside.set()
            assert release.wait(WAIT_DEADLINE)
        return real(*args)

    monkeypatch.setattr(checkouts, "_insert_created", held)
    answers: dict[str, TestResponse] = {}
    first = threading.Thread(
        target=lambda: answers.setdefault("first", installed.signed("/v2/create", create_body()))
    )
    first.start()
    assert inside.wait(WAIT_DEADLINE), "the first create never reached the write of its rows"
    duplicate = Gateway(emulator_app.test_client())
    duplicate.keys = installed.keys
    if database_backend == "postgresql":
        answer = duplicate.signed("/v2/create", create_body())
        assert answer.status_code == 409 and "still in flight" in answer.json["message"]
        release.set()
        first.join(WAIT_DEADLINE)
    else:
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
        assert answers["second"].headers["idempotent-replay"] == "true"
        assert answers["second"].json == answers["first"].json
    assert answers["first"].status_code == 200 and "idempotent-replay" not in answers["first"].headers
    assert rows(emulator_app, Checkout) == 1


def test_sqlite_validates_the_request_without_the_write_lock(
    installed: Gateway, emulator_app: Flask, database_backend: str, database_url: str, monkeypatch
):
    """While a create checks its signature, another connection can take the write lock at once."""
    if database_backend != "sqlite":
        pytest.skip("SQLite's database-wide write lock")
    path = database_url.removeprefix("sqlite:///")
    taken: list[bool] = []
    real = signing.verify  # what api.verify is

    def verify(*args: Any) -> bool:
        other = sqlite3.connect(path, timeout=0, isolation_level=None)
        try:
            other.execute("BEGIN IMMEDIATE")
            other.execute("ROLLBACK")
            taken.append(True)
        except sqlite3.OperationalError:  # database is locked: this request holds it
            taken.append(False)
        finally:
            other.close()
        return real(*args)

    monkeypatch.setattr(api, "verify", verify)
    assert installed.signed("/v2/create", create_body()).status_code == 200
    assert installed.signed("/v2/update", {"checkoutToken": "none", "payjustnow": {}}).status_code == 400
    assert taken == [True, True]


def test_a_request_refused_before_its_work_is_not_in_flight(
    installed: Gateway, database_url: str, database_backend: str
):
    """PostgreSQL takes the key's lock with the request state, before the request is checked: the outcome
    counts only for a request that is authenticated and valid (401 and 400 stay 401 and 400)."""
    if database_backend != "postgresql":
        pytest.skip("PostgreSQL's advisory lock")
    with new_connection(database_url) as holder:
        assert holder.execute(
            text("SELECT pg_try_advisory_lock(:k)"), {"k": lock_key(ACCOUNT, "create", "req-1")}
        ).scalar()
        installed.keys[ACCOUNT], real_key = "not-the-key", installed.keys[ACCOUNT]
        assert installed.signed("/v2/create", create_body()).status_code == 401
        installed.keys[ACCOUNT] = real_key
        assert installed.signed("/v2/create", create_body(total=-1)).status_code == 400
        held = installed.signed("/v2/create", create_body())
        assert held.status_code == 409 and "still in flight" in held.json["message"]


def test_a_fault_used_before_the_work_ends_the_early_claim(
    installed: Gateway, emulator_app: Flask, database_url: str, database_backend: str
):
    """A fault rule's use commits (its count goes down) and with it the lock taken with the request state:
    the key is claimed again in the work's transaction, so a duplicate in flight is still a 409."""
    if database_backend != "postgresql":
        pytest.skip("PostgreSQL's advisory lock")
    rule = {"operation": "create", "kind": "delay", "delayMs": 0}
    assert installed.control("faults", rule).status_code in (200, 201)
    with new_connection(database_url) as holder:
        assert holder.execute(
            text("SELECT pg_try_advisory_lock(:k)"), {"k": lock_key(ACCOUNT, "create", "req-1")}
        ).scalar()
        with counted(emulator_app) as seen:
            held = installed.signed("/v2/create", create_body())
        assert held.status_code == 409 and "still in flight" in held.json["message"]
        assert sum("pg_try_advisory_xact_lock" in statement for statement in seen["statements"]) == 2
    created = installed.signed("/v2/create", create_body())
    assert created.status_code == 200 and "idempotent-replay" not in created.headers
    assert installed.signed("/v2/create", create_body()).headers["idempotent-replay"] == "true"


def _bodies() -> list[dict[str, Any]]:
    full = create_body(request_id="full", orderExpiryMinutes=30)
    full["clickTraceId"] = "trace-1"
    details = full["payjustnow"]
    details["customer"] = {"firstName": "Thandi", "email": "thandi@example.com", "loyalty": {"tier": 2}}
    details["billingAddress"] = {"addressLine1": "1 Long St", "city": "Cape Town", "postalCode": "8001"}
    details["shippingAddress"] = {"city": "Durban", "note": "back door"}
    details["giftWrap"] = True  # unknown fields are kept and echoed, in every object
    details["orderItems"][0]["colour"] = "red"
    clashing = create_body(request_id="clash")
    clashing["payjustnow"].update({"expiresAt": "2030-01-01T00:00:00.000Z", "checkoutPaymentStatus": "PAID"})
    bare = create_body(request_id=None)
    del bare["payjustnow"]["orderItems"]
    return [create_body(request_id="plain"), full, clashing, bare]


@pytest.mark.parametrize("names", [OPERATOR, SPEC], ids=["operator", "spec"])
def test_the_create_answer_is_the_models_answer(
    database_url: str, names: WireNames, monkeypatch: pytest.MonkeyPatch
):
    """The create's answer is built without validating its values again: byte for byte what the wire
    models give for the stored checkout (``checkout_response``, as update answers)."""
    app = make_emulator(database_url, wire_names=names)
    gateway = Gateway(app.test_client())
    gateway.install()
    validated: list[object] = []
    real = OrderDetailsEcho.model_validate

    def model_validate(*args: Any, **kwargs: Any) -> Any:
        validated.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(OrderDetailsEcho, "model_validate", model_validate)
    for body in _bodies():
        answer = gateway.signed("/v2/create", body)
        assert answer.status_code == 200, answer.get_data(as_text=True)
        assert validated == []  # the echo was not validated again
        with app.test_request_context(base_url="http://localhost"):
            token = answer.json["checkoutToken"]
            stored = db.session.scalars(select(Checkout).where(Checkout.token == token)).one()
            expected = api.json_response(checkouts.checkout_response(stored, api.base_url())).get_data()
            db.session.remove()
        assert answer.get_data() == expected
        validated.clear()
    with app.app_context():
        db.engine.dispose()


def test_getstatus_reads_in_one_transaction(installed: Gateway, emulator_app: Flask, database_backend: str):
    """getstatus only reads: its request state is read in the transaction it reads the checkout in (SQLite:
    one DEFERRED ``BEGIN``, no second transaction)."""
    token = installed.create()["checkoutToken"]
    with counted(emulator_app) as seen:
        installed.status(token)
    expected = ["BEGIN"] if database_backend == "sqlite" else []
    assert seen["statements"][: len(expected)] == expected
    assert len(seen["statements"]) == len(expected) + 2, seen["statements"]
    assert seen["checkouts"] == 1
