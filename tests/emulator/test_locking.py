"""Locks and races: what SQLite's one-writer-at-a-time gives for free must hold on PostgreSQL too.

On SQLite every transaction holds the write lock from its first statement (``BEGIN IMMEDIATE``), so no other
transaction commits between a read and a later lock in the same transaction. On PostgreSQL (READ
COMMITTED) one may: a row read first and locked afterwards must be re-read under the lock, and a row that
does not exist yet cannot be locked at all.

The tests make that interleaving happen: the other transaction runs in a thread while this one is between
its read and its lock. On PostgreSQL it commits at once; on SQLite it waits for this transaction's write
lock and commits after it. Either way the outcome must be consistent; on PostgreSQL the test also checks
that the other transaction really came first.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import responses

from flask_gateway.emulator import api, checkouts
from flask_gateway.emulator.views import v2
from tests.emulator.support import CALLBACK_URL, Gateway, create_body

# Locks and races: what SQLite's single writer gives for free must hold on PostgreSQL.
pytestmark = pytest.mark.backends

#: How long this transaction waits for the other one: on PostgreSQL it finishes at once (the limit only
#: guards against a slow machine); on SQLite it cannot finish before this transaction ends.
WAIT_SECONDS = {"postgresql": 10.0, "sqlite": 0.5}


class Meanwhile:
    """Run ``action`` in another thread, once, the first time the main thread calls ``trigger()``."""

    def __init__(self, action: Callable[[], Any], backend: str) -> None:
        self.action = action
        self.wait = WAIT_SECONDS[backend]
        self.main = threading.current_thread()
        self.thread: threading.Thread | None = None
        self.result: Any = None
        #: True when the other transaction finished before this one went on (always so on PostgreSQL).
        self.came_first: bool | None = None

    def trigger(self) -> None:
        if threading.current_thread() is not self.main or self.thread is not None:
            return
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        self.thread.join(self.wait)
        self.came_first = not self.thread.is_alive()

    def _run(self) -> None:
        self.result = self.action()

    def finish(self) -> Any:
        assert self.thread is not None, "the other transaction never started"
        self.thread.join(60)
        assert not self.thread.is_alive()
        return self.result


@pytest.fixture
def merchant() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        mock.add(responses.POST, CALLBACK_URL, status=200, body="")
        yield mock


def second_driver(emulator_app: Any, installed: Gateway) -> Gateway:
    other = Gateway(emulator_app.test_client())  # a client of its own: another thread, another session
    other.keys.update(installed.keys)
    return other


def test_a_callback_carries_the_status_committed_before_its_lock(
    emulator_app, installed: Gateway, merchant, monkeypatch, database_backend
):
    """The delivery reads its checkout, a refund commits, then the attempt locks the checkout: the body
    must carry the status the lock sees (not the one read before it)."""
    token = installed.create(create_body())["checkoutToken"]
    assert installed.pay(token).status_code == 200
    other = second_driver(emulator_app, installed)
    refund = {"checkoutToken": token, "merchantRefundReference": "r-1", "refundAmountCents": 100}
    meanwhile = Meanwhile(lambda: other.signed("/v2/refund", refund).status_code, database_backend)
    real_lock = checkouts.lock

    def lock(account_id: str | None, locked_token: str) -> Any:
        meanwhile.trigger()
        return real_lock(account_id, locked_token)

    monkeypatch.setattr(checkouts, "lock", lock)
    assert installed.control("deliver").json["attempts"] == 1
    assert meanwhile.finish() == 200

    [call] = merchant.calls
    sent = json.loads(call.request.body)["checkoutPaymentStatus"]
    if database_backend == "postgresql":
        assert meanwhile.came_first
    assert sent == ("PARTIALLY_REFUNDED" if meanwhile.came_first else "PAID_PENDING_CALLBACK")
    assert installed.status(token)["checkoutPaymentStatus"] == "PARTIALLY_REFUNDED"


def test_settings_are_checked_against_the_row_as_locked(
    emulator_app, installed: Gateway, monkeypatch, database_backend
):
    """Two settings updates at once (a minimum above the other's new maximum): never min > max."""
    other = second_driver(emulator_app, installed)
    patch = {"maximumCheckoutAmountCents": 50_000}
    meanwhile = Meanwhile(
        lambda: other.signed("/install/v2", patch, method="PATCH").status_code, database_backend
    )
    real_authenticate = api.authenticate_v2

    def authenticate() -> Any:
        account = real_authenticate()  # read: the row is locked only after this
        meanwhile.trigger()
        return account

    monkeypatch.setattr(v2, "authenticate_v2", authenticate)
    mine = installed.signed("/install/v2", {"minimumCheckoutAmountCents": 60_000}, method="PATCH").status_code
    theirs = meanwhile.finish()

    if database_backend == "postgresql":
        assert meanwhile.came_first
    assert (mine, theirs) == ((400, 200) if meanwhile.came_first else (200, 400))
    [account] = [a for a in installed.control("accounts", method="GET").json["accounts"] if a["installed"]]
    assert account["minimumCheckoutAmountCents"] <= account["maximumCheckoutAmountCents"]


def test_concurrent_creation_of_one_account_is_one_201(emulator_app):
    start = threading.Barrier(4)
    statuses: list[int] = []

    def create() -> None:
        client = emulator_app.test_client()
        start.wait()
        body = {"merchantAccountId": "new-merchant", "merchantAccountApiKey": "new-merchant-key"}
        statuses.append(client.post("/_emulator/accounts", json=body).status_code)

    threads = [threading.Thread(target=create) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(statuses) == [200, 200, 200, 201]
