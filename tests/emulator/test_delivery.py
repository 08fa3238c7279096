"""Outbox delivery in-process: signed callbacks, retries on the test clock, dead letters, e-mails, faults.

The merchant's callback URL is mocked with ``responses`` (the emulator calls it with ``requests``).
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
import responses
from flask import current_app

from flask_gateway.core.signing import verify
from flask_gateway.core.timestamps import parse_timestamp
from flask_gateway.emulator import delivery
from flask_gateway.emulator.models import Checkout, Delivery, db
from tests.conftest import fetch_all
from tests.emulator.conftest import make_emulator
from tests.emulator.support import ACCOUNT, CALLBACK_URL, Gateway, create_body, v1_checkout_body
from tests.processes import WAIT_DEADLINE, wait_for

# The outbox: SKIP LOCKED claims, leases and due times compared in SQL, no transaction open during a call.
pytestmark = pytest.mark.backends


@pytest.fixture(autouse=True)
def _stopped(stopped_clock: datetime) -> None:
    """The emulator's clock moves only when a test advances it: a retry due in 2 s is not due after 1 s,
    however long the machine takes between the two calls."""


STATUS_KEYS = {
    "requestId",
    "checkoutToken",
    "checkoutTotalCents",
    "paymentUrl",
    "checkoutPaymentStatus",
    "paidAt",
    "paymentReference",
    "merchantOrderReference",
    "payjustnowOrderReference",
    "clickTraceId",
    "createdAt",
    "updatedAt",
    "expiresAt",
    "cancelledAt",
    "lastCallbackAttemptedAt",
    "lastCallbackAttemptStatusMessage",
}
EMAIL = "ops@shop.example"


@pytest.fixture
def merchant() -> Iterator[responses.RequestsMock]:
    """The merchant's side of HTTP: nothing answers unless a test registers it."""
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def answer(mock: responses.RequestsMock, *statuses: int, url: str = CALLBACK_URL) -> None:
    """The callback URL answers ``statuses`` in order, the last one from then on."""
    for status in statuses:
        mock.add(responses.POST, url, status=status, body="")


def json_of(response: Any) -> Any:
    return response.json


def paid(gateway: Gateway) -> str:
    token = str(gateway.create(create_body())["checkoutToken"])
    response = gateway.pay(token)
    assert response.status_code == 200
    assert json_of(response)["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"
    return token


def deliver(gateway: Gateway) -> int:
    response = gateway.control("deliver")
    assert response.status_code == 200, response.get_data(as_text=True)
    return int(json_of(response)["attempts"])


def callbacks(gateway: Gateway, **query: str) -> Any:
    response = gateway.client.get("/_emulator/callbacks", query_string=query)
    assert response.status_code == 200
    return json_of(response)["callbacks"]


def dead_letters(gateway: Gateway) -> Any:
    response = gateway.client.get("/_emulator/dead-letters")
    assert response.status_code == 200
    return json_of(response)["deadLetters"]


def emails(gateway: Gateway) -> Any:
    response = gateway.client.get("/_emulator/emails")
    assert response.status_code == 200
    return json_of(response)["emails"]


def sent_bodies(mock: responses.RequestsMock) -> Any:
    return [json.loads(call.request.body or b"") for call in mock.calls]


def test_paid_callback_is_signed_carries_the_status_and_turns_paid(installed, merchant):
    key = installed.keys[ACCOUNT]
    answer(merchant, 200)
    created = installed.create(create_body())
    token = created["checkoutToken"]
    installed.pay(token)
    assert len(merchant.calls) == 0  # nothing is sent before the outbox runs

    assert deliver(installed) == 1
    assert len(merchant.calls) == 1
    sent = merchant.calls[0].request
    assert sent.method == "POST"
    assert sent.url == CALLBACK_URL
    assert sent.headers["X-Merchant-Account-ID"] == ACCOUNT
    assert sent.headers["Content-Type"] == "application/json"
    assert verify(sent.body, key, sent.headers["X-Signature"])
    assert not verify(sent.body, "another-key", sent.headers["X-Signature"])
    body = json.loads(sent.body)
    assert set(body) == STATUS_KEYS
    assert body["checkoutToken"] == token
    assert body["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"
    assert body["paymentUrl"] == created["paymentUrl"]
    assert body["paidAt"] is not None
    # The body carries this attempt's own time and the previous attempt's message (none yet).
    assert body["lastCallbackAttemptedAt"] is not None
    assert body["lastCallbackAttemptStatusMessage"] is None

    status = installed.status(token)
    assert status["checkoutPaymentStatus"] == "PAID"
    assert status["lastCallbackAttemptStatusMessage"] == "OK"
    assert parse_timestamp(status["lastCallbackAttemptedAt"]) == parse_timestamp(
        body["lastCallbackAttemptedAt"]
    )

    [attempt] = callbacks(installed)
    assert attempt["checkoutToken"] == token
    assert attempt["kind"] == "callback"
    assert attempt["number"] == 1
    assert attempt["ok"] is True
    assert attempt["httpStatus"] == 200
    assert attempt["message"] == "OK"
    assert attempt["url"] == CALLBACK_URL
    assert attempt["requestBody"].encode() == sent.body  # exactly the signed bytes
    assert parse_timestamp(attempt["at"]) == parse_timestamp(body["lastCallbackAttemptedAt"])
    assert isinstance(attempt["durationMs"], int)

    # Delivered once: nothing more goes out, however far the clock moves.
    assert deliver(installed) == 0
    assert installed.advance(3600)["deliveryAttempts"] == 0
    assert len(merchant.calls) == 1
    assert dead_letters(installed) == []
    assert emails(installed) == []


def test_only_http_200_acknowledges_and_retries_follow_the_delays(installed, merchant):
    answer(merchant, 500, 201, 200)
    token = paid(installed)

    assert deliver(installed) == 1
    status = installed.status(token)
    assert status["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"
    assert status["lastCallbackAttemptStatusMessage"] == "HTTP 500"

    # The second attempt is due 2 s (test clock) after the first failure, not before.
    assert installed.advance(1.0)["deliveryAttempts"] == 0
    assert installed.advance(1.1)["deliveryAttempts"] == 1
    status = installed.status(token)
    assert status["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"  # 201 is not an acknowledgement
    assert status["lastCallbackAttemptStatusMessage"] == "HTTP 201"

    # The third is due 10 s after the second.
    assert installed.advance(8.0)["deliveryAttempts"] == 0
    assert installed.advance(2.1)["deliveryAttempts"] == 1
    status = installed.status(token)
    assert status["checkoutPaymentStatus"] == "PAID"
    assert status["lastCallbackAttemptStatusMessage"] == "OK"

    bodies = sent_bodies(merchant)
    assert [b["lastCallbackAttemptStatusMessage"] for b in bodies] == [None, "HTTP 500", "HTTP 201"]
    assert all(b["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK" for b in bodies)
    times = [parse_timestamp(b["lastCallbackAttemptedAt"]) for b in bodies]
    assert times[1] - times[0] >= timedelta(seconds=2)
    assert times[2] - times[1] >= timedelta(seconds=10)

    log = callbacks(installed, checkoutToken=token)
    assert [(a["number"], a["httpStatus"], a["ok"], a["message"]) for a in log] == [
        (1, 500, False, "HTTP 500"),
        (2, 201, False, "HTTP 201"),
        (3, 200, True, "OK"),
    ]
    assert dead_letters(installed) == []


def test_three_failures_make_a_dead_letter_with_one_email_each(gateway, merchant):
    key = gateway.install(email=EMAIL)
    answer(merchant, 500)
    token = paid(gateway)

    assert deliver(gateway) == 1
    assert gateway.advance(2.1)["deliveryAttempts"] == 1
    assert dead_letters(gateway) == []
    assert gateway.advance(10.1)["deliveryAttempts"] == 1
    assert len(merchant.calls) == 3
    assert all(verify(c.request.body, key, c.request.headers["X-Signature"]) for c in merchant.calls)

    [dead] = dead_letters(gateway)
    assert dead["checkoutToken"] == token
    assert dead["state"] == "dead"
    assert dead["kind"] == "callback"
    assert dead["attempts"] == 3
    assert dead["url"] == CALLBACK_URL
    assert dead["lastStatusMessage"] == "HTTP 500"
    assert [a["number"] for a in dead["attemptLog"]] == [1, 2, 3]
    assert not any(a["ok"] for a in dead["attemptLog"])

    status = gateway.status(token)
    assert status["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"  # stays when every attempt fails
    assert status["lastCallbackAttemptStatusMessage"] == "HTTP 500"
    last_at = parse_timestamp(status["lastCallbackAttemptedAt"])
    assert last_at == parse_timestamp(dead["attemptLog"][-1]["at"])

    # A dead letter is not retried any more.
    assert gateway.advance(3600)["deliveryAttempts"] == 0
    assert len(merchant.calls) == 3

    mails = emails(gateway)
    assert len(mails) == 3
    for number, mail in enumerate(mails, start=1):
        assert mail["to"] == EMAIL
        assert mail["from"] == "gateway-emulator@localhost"
        assert mail["merchantAccountId"] == ACCOUNT
        assert mail["subject"] == f"Checkout callback failed (attempt {number} of 3): {token}"
        assert "Error:            HTTP 500" in mail["body"]
        assert mail["smtpResult"] is None  # no SMTP server configured: the outbox only
        detail = json.loads(mail["body"].split("Checkout detail at the time of failure:\n", 1)[1])
        assert set(detail) == STATUS_KEYS
        assert detail["checkoutToken"] == token
        assert detail["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"
        assert detail["lastCallbackAttemptStatusMessage"] == "HTTP 500"
        assert parse_timestamp(detail["lastCallbackAttemptedAt"]) == parse_timestamp(
            dead["attemptLog"][number - 1]["at"]
        )
    assert "another attempt at" in mails[0]["body"]
    assert "dead letter queue" in mails[2]["body"]

    # Redelivery of the dead letter: the merchant now answers 200, so the checkout becomes PAID.
    merchant.replace(responses.POST, CALLBACK_URL, status=200, body="")
    response = gateway.control(f"dead-letters/{dead['id']}/redeliver")
    assert response.status_code == 200, response.get_data(as_text=True)
    assert response.json["ok"] is True
    assert response.json["checkoutPaymentStatus"] == "PAID"
    assert response.json["attempt"]["number"] == 1  # the redelivered message starts a new schedule
    assert response.json["attempt"]["httpStatus"] == 200
    assert response.json["delivery"]["state"] == "delivered"
    assert len(merchant.calls) == 4
    assert verify(merchant.calls[3].request.body, key, merchant.calls[3].request.headers["X-Signature"])
    assert json.loads(merchant.calls[3].request.body)["lastCallbackAttemptStatusMessage"] == "HTTP 500"
    assert gateway.status(token)["checkoutPaymentStatus"] == "PAID"
    assert gateway.status(token)["lastCallbackAttemptStatusMessage"] == "OK"
    assert dead_letters(gateway) == []
    assert len(emails(gateway)) == 3  # no e-mail for a success

    # Only a dead letter can be redelivered; unknown ids are 404.
    again = gateway.control(f"dead-letters/{dead['id']}/redeliver")
    assert again.status_code == 409
    assert "not dead" in again.json["message"]
    assert gateway.control("dead-letters/999999/redeliver").status_code == 404


def test_redelivery_that_fails_again_restarts_the_schedule(gateway, merchant):
    gateway.install(email=EMAIL)
    answer(merchant, 500)
    token = paid(gateway)
    deliver(gateway)
    gateway.advance(2.1)
    gateway.advance(10.1)
    [dead] = dead_letters(gateway)

    response = gateway.control(f"dead-letters/{dead['id']}/redeliver")
    assert response.status_code == 200
    assert response.json["ok"] is False
    assert response.json["delivery"]["state"] == "pending"
    assert response.json["delivery"]["attempts"] == 1
    assert dead_letters(gateway) == []
    assert len(emails(gateway)) == 4
    # A pending delivery is not a dead letter.
    assert gateway.control(f"dead-letters/{dead['id']}/redeliver").status_code == 409
    gateway.advance(2.1)
    gateway.advance(10.1)
    assert [d["id"] for d in dead_letters(gateway)] == [dead["id"]]
    assert gateway.status(token)["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"
    assert len(emails(gateway)) == 6


def test_no_email_without_callback_failures_email(installed, merchant):
    answer(merchant, 500)
    paid(installed)
    deliver(installed)
    installed.advance(2.1)
    installed.advance(10.1)
    assert len(dead_letters(installed)) == 1
    assert emails(installed) == []


def test_unreachable_merchant_counts_as_a_failed_attempt(installed, merchant):
    # Nothing registered: the connection fails.
    token = paid(installed)
    assert deliver(installed) == 1
    [attempt] = callbacks(installed)
    assert attempt["ok"] is False
    assert attempt["httpStatus"] is None
    assert attempt["message"].startswith("Connection failed")
    assert installed.status(token)["lastCallbackAttemptStatusMessage"] == attempt["message"]


def test_cancel_callbacks_only_for_accounts_that_have_them(installed, merchant):
    other_url = "https://other.example/gateway/callback"
    answer(merchant, 200)
    answer(merchant, 200, url=other_url)

    # The demo account has no cancel callbacks.
    token = installed.create(create_body())["checkoutToken"]
    assert installed.consumer_cancel(token).status_code == 200
    assert deliver(installed) == 0
    assert len(merchant.calls) == 0
    assert installed.status(token)["lastCallbackAttemptStatusMessage"] is None

    # An account issued with cancelCallbacks gets a signed callback on consumer cancellation.
    issued = installed.control(
        "accounts",
        {
            "merchantAccountId": "cancel-merchant",
            "merchantAccountApiKey": "cancel-api-key",
            "cancelCallbacks": True,
        },
    )
    assert issued.status_code == 201
    key = installed.install("cancel-merchant", "cancel-api-key", callback_url=other_url)
    token = installed.create(create_body(), account="cancel-merchant")["checkoutToken"]
    installed.consumer_cancel(token)
    assert deliver(installed) == 1
    [call] = merchant.calls
    assert call.request.url == other_url
    assert call.request.headers["X-Merchant-Account-ID"] == "cancel-merchant"
    assert verify(call.request.body, key, call.request.headers["X-Signature"])
    body = json.loads(call.request.body)
    assert set(body) == STATUS_KEYS
    assert body["checkoutPaymentStatus"] == "CANCELLED_BY_CONSUMER"
    status = installed.status(token, account="cancel-merchant")
    assert status["checkoutPaymentStatus"] == "CANCELLED_BY_CONSUMER"  # acknowledged; no transition
    assert status["lastCallbackAttemptStatusMessage"] == "OK"


def test_callback_fail_fault_records_http_500_without_sending(installed, merchant):
    answer(merchant, 200)
    fault = installed.control("faults", {"operation": "callback", "kind": "callback_fail", "count": 2})
    assert fault.status_code == 201
    token = paid(installed)

    assert deliver(installed) == 1
    assert installed.advance(2.1)["deliveryAttempts"] == 1
    assert len(merchant.calls) == 0  # an injected failure sends nothing
    assert installed.status(token)["lastCallbackAttemptStatusMessage"] == "HTTP 500"
    assert installed.client.get("/_emulator/faults").json["faults"] == []  # both uses consumed

    assert installed.advance(10.1)["deliveryAttempts"] == 1
    assert len(merchant.calls) == 1
    assert installed.status(token)["checkoutPaymentStatus"] == "PAID"
    assert [(a["httpStatus"], a["message"], a["ok"]) for a in callbacks(installed)] == [
        (500, "HTTP 500", False),
        (500, "HTTP 500", False),
        (200, "OK", True),
    ]


def test_callback_timeout_fault(installed, merchant):
    answer(merchant, 200)
    installed.control("faults", {"operation": "callback", "kind": "callback_timeout", "count": 1})
    token = paid(installed)
    assert deliver(installed) == 1
    assert len(merchant.calls) == 0
    [attempt] = callbacks(installed)
    assert attempt["message"] == "Timeout after 10 s"
    assert attempt["httpStatus"] is None
    assert installed.status(token)["lastCallbackAttemptStatusMessage"] == "Timeout after 10 s"
    installed.advance(2.1)
    assert installed.status(token)["checkoutPaymentStatus"] == "PAID"


def test_v1_order_expiry_calls_the_fail_url_with_abandoned(gateway, merchant):
    merchant.add(
        responses.GET,
        re.compile(r"https://shop\.example/gateway/v1/fail\?.*"),
        json={"token": "ignored", "return_url": "https://shop.example/cart"},
    )
    response = gateway.v1("checkout", v1_checkout_body())
    assert response.status_code == 200, response.get_data(as_text=True)
    token = response.json["data"]["token"]

    assert deliver(gateway) == 0
    assert gateway.advance(59 * 60)["deliveryAttempts"] == 0
    result = gateway.advance(61)
    assert result["expired"] == 1
    assert result["deliveryAttempts"] == 1

    [call] = merchant.calls
    assert call.request.method == "GET"
    url = urlsplit(call.request.url)
    assert (url.scheme, url.netloc, url.path) == ("https", "shop.example", "/gateway/v1/fail")
    assert parse_qs(url.query) == {
        "s": ["abc"],
        "token": [token],
        "status": ["FAIL"],
        "reason": ["ABANDONED"],
    }

    [attempt] = callbacks(gateway, kind="v1_abandoned")
    assert attempt["checkoutToken"] == token
    assert attempt["ok"] is True
    # The shop's fail URL with the order's token: not for anonymous eyes (no control token here).
    assert attempt["url"] == "https://shop.example/gateway/v1/fail?s=****&token=****&status=****&reason=****"
    assert attempt["requestBody"] == ""
    assert callbacks(gateway, kind="callback") == []
    detail = gateway.client.get(f"/_emulator/checkouts/{token}").json
    assert detail["checkoutPaymentStatus"] == "EXPIRED"
    assert any(e["kind"] == "v1-abandoned-delivered" for e in detail["events"])
    assert gateway.advance(3600)["deliveryAttempts"] == 0
    assert emails(gateway) == []


def test_v1_abandoned_notice_is_retried_then_dead_lettered(gateway, merchant):
    merchant.add(responses.GET, re.compile(r"https://shop\.example/gateway/v1/fail\?.*"), status=503)
    token = gateway.v1("checkout", v1_checkout_body()).json["data"]["token"]
    assert gateway.advance(3601)["deliveryAttempts"] == 1
    assert gateway.advance(2.1)["deliveryAttempts"] == 1
    assert gateway.advance(10.1)["deliveryAttempts"] == 1
    [dead] = dead_letters(gateway)
    assert dead["kind"] == "v1_abandoned"
    assert dead["checkoutToken"] == token
    assert [a["message"] for a in dead["attemptLog"]] == ["HTTP 503"] * 3


def test_timeline_records_each_attempt(installed, merchant):
    answer(merchant, 500, 200)
    token = paid(installed)
    deliver(installed)
    installed.advance(2.1)
    kinds = [e["kind"] for e in installed.client.get(f"/_emulator/checkouts/{token}").json["events"]]
    assert kinds[-3:] == ["callback-failed", "callback-delivered", "callback-acknowledged"]


def test_smtp_failure_never_breaks_delivery(database_url, merchant):
    app = make_emulator(database_url, smtp_url="smtp://127.0.0.1:1")  # nothing listens on port 1
    try:
        gateway = Gateway(app.test_client())
        gateway.install(email=EMAIL)
        answer(merchant, 500, 200)
        token = paid(gateway)
        assert deliver(gateway) == 1
        [mail] = emails(gateway)
        assert mail["smtpResult"].startswith("error: ")
        assert gateway.advance(2.1)["deliveryAttempts"] == 1
        assert gateway.status(token)["checkoutPaymentStatus"] == "PAID"
    finally:
        with app.app_context():
            db.engine.dispose()


def test_public_url_is_the_payment_url_base(database_url, merchant):
    app = make_emulator(database_url, public_url="https://gateway.example")
    try:
        gateway = Gateway(app.test_client())
        gateway.install()
        answer(merchant, 200)
        token = paid(gateway)
        deliver(gateway)
        assert (
            sent_bodies(merchant)[0]["paymentUrl"] == f"https://gateway.example/api/v2/app/checkout/{token}"
        )
    finally:
        with app.app_context():
            db.engine.dispose()


def test_background_worker_delivers_and_starts_once(emulator_app, installed, merchant):
    answer(merchant, 200)
    emulator_app.config["EMULATOR_WORKER_INTERVAL"] = 0.05
    delivery.start_worker(emulator_app)
    delivery.start_worker(emulator_app)
    try:
        workers = [t for t in threading.enumerate() if t.name == "gateway-emulator-delivery"]
        assert len(workers) == 1
        token = paid(installed)
        wait_for(
            lambda: installed.status(token)["checkoutPaymentStatus"] == "PAID",
            interval=0.05,
            what="the worker to deliver the callback (the checkout PAID)",
        )
        # Outside a request the worker uses the address the app was last reached at.
        assert sent_bodies(merchant)[0]["paymentUrl"] == f"http://localhost/api/v2/app/checkout/{token}"
    finally:
        delivery.stop_worker(emulator_app)
    assert not any(t.name == "gateway-emulator-delivery" and t.is_alive() for t in threading.enumerate())
    with emulator_app.app_context():
        assert db.session.query(Delivery).one().claimed_until is None


def test_claimed_deliveries_are_not_attempted_twice(emulator_app, installed, merchant):
    answer(merchant, 200)
    paid(installed)
    with emulator_app.test_request_context():
        row = db.session.query(Delivery).one()
        row.claimed_until = datetime.now(UTC) + delivery.CLAIM_LEASE
        db.session.commit()
        assert delivery.run_due() == 0  # another worker holds the lease
        row = db.session.query(Delivery).one()
        row.claimed_until = datetime.now(UTC) - delivery.CLAIM_LEASE
        db.session.commit()
        assert delivery.run_due() == 1  # an expired lease (a crashed worker) is taken over
    assert len(merchant.calls) == 1


def test_no_database_transaction_is_open_while_calling_the_merchant(
    emulator_app, database_url, installed, merchant
):
    """The merchant may be slow (10 s): the attempt must hold no transaction (no lock) meanwhile.

    SQLite: nobody holds the write lock (``BEGIN IMMEDIATE`` succeeds at once). PostgreSQL: no other
    session of the emulator's database is inside a transaction (``pg_stat_activity``).
    """
    seen: list[str] = []

    def merchant_answers(request):
        seen.append(open_transactions(database_url))
        return (500, {}, "")

    merchant.add_callback(responses.POST, CALLBACK_URL, callback=merchant_answers)
    paid(installed)
    deliver(installed)
    assert seen == ["free"]


def open_transactions(database_url: str) -> str:
    """``"free"`` when no other connection to the database is inside a transaction, else what is open."""
    if database_url.startswith("sqlite"):
        connection = sqlite3.connect(database_url.removeprefix("sqlite:///"), timeout=0)
        try:
            connection.execute("BEGIN IMMEDIATE")  # raises "database is locked" if a writer is open
            connection.rollback()
            return "free"
        except sqlite3.OperationalError as exc:
            return str(exc)
        finally:
            connection.close()
    rows = fetch_all(
        database_url,
        "SELECT state, query FROM pg_stat_activity WHERE datname = current_database() "
        "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL",
    )
    return "free" if not rows else repr(rows)


def test_worker_waits_until_it_knows_the_emulators_address(
    database_url, emulator_app, installed, merchant, monkeypatch
):
    answer(merchant, 200)
    token = paid(installed)
    # A second process on the same database that has served no request yet: it does not deliver.
    fresh = make_emulator(database_url)
    fresh.config["EMULATOR_WORKER_INTERVAL"] = 0.02
    unknown = threading.Semaphore(0)  # released at each tick of the fresh worker that knew no address
    known = delivery.address_known

    def counted() -> bool:
        found = known()
        if not found and current_app._get_current_object() is fresh:  # type: ignore[attr-defined]
            unknown.release()
        return found

    monkeypatch.setattr(delivery, "address_known", counted)
    delivery.start_worker(fresh)
    try:
        for tick in range(1, 6):  # five ticks with the callback due and no address: nothing sent
            assert unknown.acquire(timeout=WAIT_DEADLINE), f"the fresh worker's tick {tick} never came"
        assert len(merchant.calls) == 0
        assert (
            fresh.test_client().get("/_emulator/clock", base_url="http://gateway.test:8080").status_code
            == 200
        )
        wait_for(
            lambda: installed.status(token)["checkoutPaymentStatus"] == "PAID",
            interval=0.02,
            what="the fresh worker to deliver the callback once it knows its address",
        )
    finally:
        delivery.stop_worker(fresh)
        with fresh.app_context():
            db.engine.dispose()
    assert sent_bodies(merchant)[0]["paymentUrl"] == f"http://gateway.test:8080/api/v2/app/checkout/{token}"


def test_a_changed_callback_url_is_followed_by_retries_and_redelivery(installed, merchant):
    fixed_url = "https://fixed.example/gateway/callback"
    answer(merchant, 404)
    answer(merchant, 200, url=fixed_url)
    token = paid(installed)
    deliver(installed)
    installed.advance(2.1)
    installed.advance(10.1)
    [dead] = dead_letters(installed)
    assert [c.request.url for c in merchant.calls] == [CALLBACK_URL] * 3

    changed = installed.signed("/install/v2", {"checkoutStatusCallbackUrl": fixed_url}, method="PATCH")
    assert changed.status_code == 200, changed.get_data(as_text=True)
    response = installed.control(f"dead-letters/{dead['id']}/redeliver")
    assert json_of(response)["ok"] is True
    assert json_of(response)["delivery"]["url"] == fixed_url
    assert merchant.calls[-1].request.url == fixed_url
    assert installed.status(token)["checkoutPaymentStatus"] == "PAID"
    events = installed.client.get(f"/_emulator/checkouts/{token}").json["events"]
    assert any(e["kind"] == "callback-url-changed" for e in events)


@pytest.mark.backends
def test_the_worker_looks_for_due_work_without_taking_the_write_lock(
    emulator_app, installed, merchant, stopped_clock
):
    """``anything_due`` (the worker's check before ``run_due``) sees exactly what ``run_due`` would do:
    nothing, a due attempt, a held one, an expiry."""
    answer(merchant, 200)
    with emulator_app.test_request_context():
        assert delivery.anything_due() is False  # nothing at all
    token = installed.create(create_body(request_id="due-1"))["checkoutToken"]
    with emulator_app.test_request_context():
        assert delivery.anything_due() is False  # a checkout that expires in an hour
    assert installed.pay(token).status_code == 200
    with emulator_app.test_request_context():
        assert delivery.anything_due() is True  # its callback is due
        row = db.session.query(Delivery).one()
        row.claimed_until = datetime.now(UTC) + delivery.CLAIM_LEASE
        db.session.commit()
    with emulator_app.test_request_context():
        assert delivery.anything_due() is False  # another worker holds it
        assert delivery.run_due() == 0
    second = installed.create(create_body(request_id="due-2"))["checkoutToken"]
    with emulator_app.test_request_context():
        overdue = db.session.query(Checkout).filter_by(token=second).one()
        overdue.expires_at = stopped_clock - timedelta(seconds=1)  # past, by the emulator's clock
        db.session.commit()
    with emulator_app.test_request_context():
        assert delivery.anything_due() is True  # the second checkout's expiry is due
        assert delivery.run_due() == 0  # it expires (no attempt: the first callback is still held)
    with emulator_app.test_request_context():
        assert delivery.anything_due() is False
