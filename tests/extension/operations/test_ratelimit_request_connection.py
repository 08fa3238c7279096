"""The callback rate limit's read on the request's own connection (flask_gateway/operations/ratelimit.py,
flask_gateway/inbound/intake.py, issue 30): on PostgreSQL the read is one statement in autocommit on the
connection the callback goes on with (no ``BEGIN``/``COMMIT``, no second connection from the pool); the
limit still limits; a storage that fails still lets the callback through, logged once per spell
(docs/logging.md), and the callback's own work on that connection is not hurt by the failed read."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from sqlalchemy import event, text

from flask_gateway.core.signing import sign
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.extension.conftest import Harness, build_harness
from tests.extension.inbound.inbound_support import (
    callback_logs,
    create_v2_checkout,
    gateway_status,
    signing_key,
    snapshot,
)

pytestmark = pytest.mark.backends

LOGGER = "flask_gateway.ratelimit"
CLIENT = {"REMOTE_ADDR": "203.0.113.9"}


@pytest.fixture
def limited(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    harness = build_harness(databases, monkeypatch, GATEWAY_CALLBACK_RATE_LIMIT="3 per minute")
    harness.install()
    yield harness
    with harness.shop.app_context():
        harness.db.engine.dispose()


@contextmanager
def recorded(h: Harness) -> Iterator[dict[str, list[Any]]]:
    """The statements the extension's engine sends (with their DBAPI connection and its autocommit flag)
    and the pool's checkouts, inside the block."""
    with h.shop.app_context():
        engine = get_state().engine
    seen: dict[str, list[Any]] = {"statements": [], "checkouts": []}

    def statement(conn: Any, _cursor: Any, sql: str, *_args: Any) -> None:
        dbapi = conn.connection.dbapi_connection
        seen["statements"].append(
            (" ".join(sql.split()), id(dbapi), bool(getattr(dbapi, "autocommit", False)))
        )

    def checkout(*_args: Any) -> None:
        seen["checkouts"].append(1)

    event.listen(engine, "before_cursor_execute", statement)
    event.listen(engine.pool, "checkout", checkout)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", statement)
        event.remove(engine.pool, "checkout", checkout)


def genuine_callback(h: Harness, reference: str) -> tuple[int, bytes, dict[str, str]]:
    checkout_id, token = create_v2_checkout(h, reference)
    assert h.emulator.pay(token).status_code == 200
    raw = json.dumps(gateway_status(h, token)).encode()
    headers = {"Content-Type": "application/json", "X-Signature": sign(raw, signing_key(h))}
    return checkout_id, raw, headers


def dialect(h: Harness) -> str:
    with h.shop.app_context():
        return get_state().engine.dialect.name


def test_the_read_is_one_statement_on_the_callbacks_own_connection(limited: Harness) -> None:
    h = limited
    checkout_id, raw, headers = genuine_callback(h, "ORD-RL-1")

    with recorded(h) as seen:
        answer = h.client.post("/gateway/callback", data=raw, headers=headers, environ_base=CLIENT)

    assert (answer.status_code, answer.json["outcome"]) == (200, "accepted")
    statements = seen["statements"]
    read = next(i for i, (sql, _c, _a) in enumerate(statements) if "FROM gateway_rate_limits" in sql)
    if dialect(h) == "postgresql":
        _sql, connection, autocommit = statements[read]
        following = statements[read + 1]
        assert "gateway_installations" in following[0], statements
        assert autocommit and following[1] == connection, "the read shares the callback's connection"
        # The read, the first steps, the change's transaction, the outbox mark: three connections from the
        # pool (before: a fourth for the read, in a transaction of its own).
        assert len(seen["checkouts"]) == 3, seen["checkouts"]
    else:
        # SQLite: the read in a read-only transaction of its own (no write lock for it), as before.
        assert statements[read - 1][0] == "BEGIN", statements
    assert snapshot(h, checkout_id)["status"] == "PAID"


def test_the_limit_still_limits_when_the_read_shares_the_connection(limited: Harness) -> None:
    h = limited
    forged = {"Content-Type": "application/json", "X-Signature": "bm9wZQ=="}
    answers = [
        h.client.post("/gateway/callback", data=b"{}", headers=forged, environ_base=CLIENT).status_code
        for _ in range(3)
    ]
    _checkout_id, raw, headers = genuine_callback(h, "ORD-RL-2")

    with recorded(h) as seen:
        limited_answer = h.client.post("/gateway/callback", data=raw, headers=headers, environ_base=CLIENT)

    assert answers == [401, 401, 401]
    assert limited_answer.status_code == 429
    assert int(limited_answer.headers["Retry-After"]) >= 1
    assert len(callback_logs(h)) == 3  # nothing stored for the 429
    if dialect(h) == "postgresql":
        reads = [entry for entry in seen["statements"] if "gateway_rate_limits" in entry[0]]
        assert reads and all(autocommit for _sql, _c, autocommit in reads), reads
        assert len({connection for _sql, connection, _a in reads}) == 1
        assert len(seen["checkouts"]) == 1


def test_a_failing_storage_lets_the_callback_through_and_says_so_once(
    limited: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """The counters' table gone (a migration not applied): the read fails, the callback is processed all
    the same on the same connection (accepted, logged), one WARNING; the table back, one WARNING more."""
    h = limited
    with h.shop.app_context():
        with get_state().engine.begin() as connection:
            connection.execute(text("ALTER TABLE gateway_rate_limits RENAME TO gateway_rate_limits_away"))
        get_state().engine.dispose()
    first_id, first_raw, first_headers = genuine_callback(h, "ORD-RL-3")
    second_id, second_raw, second_headers = genuine_callback(h, "ORD-RL-4")

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        first = h.client.post("/gateway/callback", data=first_raw, headers=first_headers, environ_base=CLIENT)
        with h.shop.app_context():
            with get_state().engine.begin() as connection:
                connection.execute(text("ALTER TABLE gateway_rate_limits_away RENAME TO gateway_rate_limits"))
            get_state().engine.dispose()
        second = h.client.post(
            "/gateway/callback", data=second_raw, headers=second_headers, environ_base=CLIENT
        )

    assert (first.status_code, first.json["outcome"]) == (200, "accepted")
    assert (second.status_code, second.json["outcome"]) == (200, "accepted")
    assert snapshot(h, first_id)["status"] == snapshot(h, second_id)["status"] == "PAID"
    assert [log["outcome"] for log in callback_logs(h)] == ["accepted", "accepted"]
    warnings = [r.getMessage() for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "fails" in warnings[0] and "works again" in warnings[1], warnings
    assert "1 request(s) were let through" in warnings[1]
