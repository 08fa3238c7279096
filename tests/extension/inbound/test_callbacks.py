"""POST /gateway/callback: stored first, verified, applied once, answered after the commit."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from flask_gateway import inbound, signals
from flask_gateway.core.signing import sign
from flask_gateway.errors import CallbackRejected
from flask_gateway.inbound import applying
from flask_gateway.labels import describe_detail
from flask_gateway.models import GatewayCheckout
from flask_gateway.state import get_state
from flask_gateway.testing import GatewayEmulator
from tests.conftest import fetch_all
from tests.extension.conftest import ACCOUNT, API_KEY, Harness
from tests.extension.inbound.inbound_support import (
    assert_no_secrets,
    callback_logs,
    create_v2_checkout,
    gateway_status,
    post_callback,
    record_signals,
    return_path,
    signing_key,
    snapshot,
)

received = pytest.fixture(record_signals)


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


def paid_payload(h: Harness, token: str, **changes: Any) -> dict[str, Any]:
    """The gateway's real status payload after the consumer paid, with ``changes`` applied."""
    assert h.emulator.pay(token).status_code == 200
    payload = gateway_status(h, token)
    payload.update(changes)
    return payload


def outcomes(h: Harness) -> list[tuple[str, int]]:
    return [(log["outcome"], log["http_status"]) for log in callback_logs(h)]


# --- through the emulator ----------------------------------------------------------------------------


@pytest.mark.backends
def test_emulator_callback_is_verified_applied_and_logged(
    gateway_emulator: GatewayEmulator, plugin_harness: Harness, received
) -> None:
    installed = plugin_harness
    checkout_id, token = create_v2_checkout(installed)
    assert gateway_emulator.pay(token).status == "PAID_PENDING_CALLBACK"

    assert gateway_emulator.deliver() == 1

    state = snapshot(installed, checkout_id)
    # The callback said PAID_PENDING_CALLBACK; the shop answers it with 200, which makes it PAID at the
    # gateway, so the shop records PAID (docs/decisions.md): both say the same.
    assert state["status"] == "PAID"
    assert state["paid_cents"] == 79800
    assert state["payment_confirmed_at"] is not None
    assert state["last_callback_at"] is not None
    assert [(e[0], e[2], e[3]) for e in state["events"]][-1] == ("callback", "PAID", True)
    detail = state["events"][-1][4]
    assert detail == (
        "callback #1 reported PAID_PENDING_CALLBACK, confirmed by getstatus (PAID_PENDING_CALLBACK), recorded "
        "as PAID"
    )
    assert describe_detail(detail) == (  # as the owner's timeline reads it: what happened
        "callback #1 reported Paid - confirming, confirmed by status check (Paid - confirming), recorded as Paid"
    )
    assert [kw["source"] for kw in received["payment_confirmed"]] == ["callback"]
    assert gateway_emulator.assert_fulfilled_once(token).source == "callback"
    assert received["callback_rejected"] == []
    # Our 200 acknowledged it: the gateway moved to PAID and recorded "OK".
    status = gateway_status(installed, token)
    assert status["checkoutPaymentStatus"] == "PAID"
    assert status["lastCallbackAttemptStatusMessage"] == "OK"

    [log] = callback_logs(installed)
    assert log["outcome"] == "accepted"
    assert log["http_status"] == 200
    assert log["verified"] is True
    assert log["checkout_id"] == checkout_id
    assert log["merchant_account_id"] == ACCOUNT
    assert json.loads(log["body"])["checkoutToken"] == token
    names = {name.lower() for name in log["headers"]}
    assert {"x-merchant-account-id", "content-type", "user-agent"} <= names
    assert_no_secrets([log])


@pytest.mark.backends
def test_consumer_cancel_callback_cancels(installed: Harness, received) -> None:
    # The account manager enabled cancellation callbacks for the account.
    answer = installed.emulator.control(
        "accounts", {"merchantAccountId": ACCOUNT, "merchantAccountApiKey": API_KEY, "cancelCallbacks": True}
    )
    assert answer.status_code == 200
    checkout_id, token = create_v2_checkout(installed)
    assert installed.emulator.consumer_cancel(token).status_code == 200

    installed.emulator.control("deliver")

    assert snapshot(installed, checkout_id)["status"] == "CANCELLED_BY_CONSUMER"
    assert [kw["status"] for kw in received["checkout_cancelled"]] == ["CANCELLED_BY_CONSUMER"]
    assert received["payment_confirmed"] == []
    assert outcomes(installed) == [("accepted", 200)]


@pytest.mark.backends
def test_replayed_identical_callback_is_a_200_no_op(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    installed.emulator.pay(token)
    installed.emulator.control("deliver")
    [first] = callback_logs(installed)
    before = snapshot(installed, checkout_id)

    # Exactly the bytes the gateway sent, and (HMAC being deterministic) exactly its signature.
    raw = first["body"].encode()
    replay = post_callback(installed, raw)

    assert replay.status_code == 200
    assert replay.json == {"status": "ok", "outcome": "duplicate"}
    after = snapshot(installed, checkout_id)
    assert after["status"] == before["status"] == "PAID"
    assert after["payment_confirmed_at"] == before["payment_confirmed_at"]
    assert len(received["payment_confirmed"]) == 1
    assert outcomes(installed) == [("accepted", 200), ("duplicate", 200)]
    assert_no_secrets(callback_logs(installed), signatures=(sign(raw, signing_key(installed)),))


@pytest.mark.backends
def test_emulator_retry_after_a_failed_attempt_confirms_once(
    gateway_emulator: GatewayEmulator, plugin_harness: Harness, received
) -> None:
    installed = plugin_harness
    checkout_id, token = create_v2_checkout(installed)
    gateway_emulator.pay(token)
    # The first attempt is lost on the way (the shop never sees it); the gateway retries later.
    gateway_emulator.time_out_next_callback()
    gateway_emulator.deliver()
    assert callback_logs(installed) == []
    gateway_emulator.assert_not_fulfilled(token)
    gateway_emulator.advance_clock(3)

    assert snapshot(installed, checkout_id)["status"] == "PAID"
    assert gateway_status(installed, token)["checkoutPaymentStatus"] == "PAID"
    assert len(received["payment_confirmed"]) == 1
    gateway_emulator.assert_fulfilled_once(token)
    assert outcomes(installed) == [("accepted", 200)]


# --- callback and return page, in either order ---------------------------------------------------------


@pytest.mark.backends
def test_callback_before_the_return_page_confirms_once(
    gateway_emulator: GatewayEmulator, plugin_harness: Harness, received
) -> None:
    installed = plugin_harness
    checkout_id, token = create_v2_checkout(installed)
    gateway_emulator.pay(token)
    gateway_emulator.deliver()
    assert gateway_status(installed, token)["checkoutPaymentStatus"] == "PAID"

    answer = installed.client.get(return_path(installed, checkout_id, "confirm"))

    assert answer.status_code == 303
    assert snapshot(installed, checkout_id)["status"] == "PAID"
    assert [kw["source"] for kw in received["payment_confirmed"]] == ["callback"]
    assert gateway_emulator.assert_fulfilled_once(token).source == "callback"


@pytest.mark.backends
def test_callback_after_the_return_page_confirms_once(
    gateway_emulator: GatewayEmulator, plugin_harness: Harness, received
) -> None:
    installed = plugin_harness
    checkout_id, token = create_v2_checkout(installed)
    gateway_emulator.pay(token)
    assert installed.client.get(return_path(installed, checkout_id, "confirm")).status_code == 303
    assert snapshot(installed, checkout_id)["status"] == "PAID_PENDING_CALLBACK"

    gateway_emulator.deliver()

    # The payment was known (no second confirmation); acknowledging the callback makes it PAID on both
    # sides.
    assert snapshot(installed, checkout_id)["status"] == "PAID"
    assert [kw["source"] for kw in received["payment_confirmed"]] == ["return"]
    assert gateway_emulator.assert_fulfilled_once(token).source == "return"
    assert outcomes(installed) == [("accepted", 200)]
    assert callback_logs(installed)[0]["detail"] == "PAID_PENDING_CALLBACK -> PAID"
    assert gateway_status(installed, token)["checkoutPaymentStatus"] == "PAID"


# --- hand-crafted, signed with the installed key -----------------------------------------------------


def test_duplicated_callbacks_apply_once(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    payload = paid_payload(installed, token)

    answers = [post_callback(installed, payload) for _ in range(3)]

    assert [a.status_code for a in answers] == [200, 200, 200]
    assert [a.json["outcome"] for a in answers] == ["accepted", "duplicate", "duplicate"]
    assert len(received["payment_confirmed"]) == 1
    events = snapshot(installed, checkout_id)["events"]
    assert [(e[0], e[3]) for e in events if e[0] == "callback"] == [
        ("callback", True),
        ("callback", False),
        ("callback", False),
    ]


@pytest.mark.backends
def test_concurrent_duplicates_confirm_once(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    payload = paid_payload(installed, token)
    raw = json.dumps(payload).encode()
    key = signing_key(installed)
    answers: list[int] = []
    start = threading.Barrier(4)

    def send() -> None:
        start.wait()
        answers.append(post_callback(installed, raw, key=key).status_code)

    threads = [threading.Thread(target=send) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert answers == [200] * 4
    assert len(received["payment_confirmed"]) == 1
    assert sorted(o for o, _ in outcomes(installed)) == ["accepted", "duplicate", "duplicate", "duplicate"]
    assert snapshot(installed, checkout_id)["status"] == "PAID"


def test_out_of_order_callbacks_never_move_back(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    payload = paid_payload(installed, token)

    paid = post_callback(installed, {**payload, "checkoutPaymentStatus": "PAID"})
    late = post_callback(installed, {**payload, "checkoutPaymentStatus": "PAID_PENDING_CALLBACK"})

    assert (paid.status_code, paid.json["outcome"]) == (200, "accepted")
    # A late PAID_PENDING_CALLBACK (the gateway's retry of an answer it lost) finds the payment recorded.
    assert (late.status_code, late.json["outcome"]) == (200, "duplicate")
    assert snapshot(installed, checkout_id)["status"] == "PAID"
    assert [e[2] for e in snapshot(installed, checkout_id)["events"]][-2:] == ["PAID", "PAID"]
    assert len(received["payment_confirmed"]) == 1


def test_cancel_callback_after_payment_changes_nothing(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    payload = paid_payload(installed, token)
    post_callback(installed, payload)

    answer = post_callback(installed, {**payload, "checkoutPaymentStatus": "CANCELLED_BY_CONSUMER"})

    assert (answer.status_code, answer.json["outcome"]) == (200, "ignored")
    assert snapshot(installed, checkout_id)["status"] == "PAID"
    assert received["checkout_cancelled"] == []


@pytest.mark.backends
def test_amount_mismatch_is_flagged_and_never_paid(installed: Harness, received) -> None:
    # The gateway's checkout is for more than the shop's order: its real, signed callback disagrees.
    checkout_id, token = create_v2_checkout(installed, total=79800, gateway_total=100)
    installed.emulator.pay(token)

    installed.emulator.control("deliver")

    state = snapshot(installed, checkout_id)
    assert state["flagged"] is True
    assert "total 100 cents" in state["flag_reason"]
    assert state["status"] == "PENDING_ORDER"
    assert state["paid_cents"] == 0
    assert state["payment_confirmed_at"] is None
    assert received["payment_confirmed"] == []
    [rejected] = received["callback_rejected"]
    assert rejected["checkout_id"] == checkout_id
    assert "total" in rejected["reason"]
    assert rejected["log_outcome"] == "mismatch"
    # Acknowledged (retrying cannot fix it), so the gateway stops retrying.
    assert outcomes(installed) == [("mismatch", 200)]
    assert gateway_status(installed, token)["lastCallbackAttemptStatusMessage"] == "OK"

    # getstatus says the same amount: the return page cannot pay it either.
    assert installed.client.get(return_path(installed, checkout_id, "confirm")).status_code == 303
    assert snapshot(installed, checkout_id)["payment_confirmed_at"] is None
    assert received["payment_confirmed"] == []


def test_account_mismatch_is_flagged_and_never_paid(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    payload = paid_payload(installed, token)
    # The checkout belongs to an account the shop used before (the shop was installed again since).
    with installed.shop.app_context():
        session = get_state().session
        row = session.get(GatewayCheckout, checkout_id)
        row.merchant_account_id = "previous-merchant"
        session.commit()

    answer = post_callback(installed, payload)

    assert (answer.status_code, answer.json["outcome"]) == (200, "mismatch")
    state = snapshot(installed, checkout_id)
    assert state["flagged"] is True
    assert "previous-merchant" in state["flag_reason"]
    assert state["status"] == "PENDING_ORDER"
    assert received["payment_confirmed"] == []
    assert len(received["callback_rejected"]) == 1


# --- refusals ----------------------------------------------------------------------------------------


def _assert_refused(h: Harness, answer: Any, status: int, outcome: str, received, *, verified: bool) -> None:
    assert answer.status_code == status
    assert answer.mimetype == "application/json"
    assert set(answer.json) == {"message"}
    [log] = callback_logs(h)
    assert (log["outcome"], log["http_status"], log["verified"]) == (outcome, status, verified)
    assert_no_secrets([log])
    [rejected] = received["callback_rejected"]
    assert (rejected["log_id"], rejected["log_outcome"]) == (log["id"], outcome)
    assert rejected["reason"] == log["detail"]


@pytest.mark.parametrize(
    "forge",
    ["wrong-key", "no-signature", "garbage", "tampered-body", "signature-of-other-body", "empty-signature"],
)
def test_forged_signature_is_401_and_changes_nothing(installed: Harness, received, forge: str) -> None:
    checkout_id, token = create_v2_checkout(installed)
    payload = paid_payload(installed, token)
    raw = json.dumps(payload).encode()
    key = signing_key(installed)
    signature = {
        "wrong-key": sign(raw, "not-the-key"),
        "garbage": "c2lnbmF0dXJl!!",
        "tampered-body": sign(raw, key),
        "signature-of-other-body": sign(b"{}", key),
        "empty-signature": "",
    }.get(forge)
    body = raw.replace(b"79800", b"1") if forge == "tampered-body" else raw
    omit = ("X-Signature",) if forge == "no-signature" else ()
    before = snapshot(installed, checkout_id)

    answer = post_callback(installed, body, signature=signature or "", omit=omit)

    _assert_refused(installed, answer, 401, "rejected-signature", received, verified=False)
    assert snapshot(installed, checkout_id) == before
    assert received["payment_confirmed"] == []
    assert received["callback_rejected"][0]["checkout"] is None
    assert_no_secrets(callback_logs(installed), signatures=tuple(s for s in (signature,) if s))


@pytest.mark.parametrize("account", ["other-merchant", "", "demo-merchant "])
def test_wrong_account_header_is_401(installed: Harness, received, account: str | None) -> None:
    checkout_id, token = create_v2_checkout(installed)
    payload = paid_payload(installed, token)
    before = snapshot(installed, checkout_id)

    answer = post_callback(installed, payload, account=account)  # correctly signed with our key

    _assert_refused(installed, answer, 401, "rejected-signature", received, verified=False)
    assert snapshot(installed, checkout_id) == before
    assert "X-Merchant-Account-ID" in callback_logs(installed)[0]["detail"]


def test_not_installed_is_401(harness: Harness, received) -> None:
    answer = post_callback(harness, {"checkoutToken": "x"}, signature=sign(b"x", "k"))

    _assert_refused(harness, answer, 401, "rejected-signature", received, verified=False)
    assert "not installed" in callback_logs(harness)[0]["detail"]


def test_unknown_token_is_404(installed: Harness, received) -> None:
    _, token = create_v2_checkout(installed)
    payload = paid_payload(
        installed, token, checkoutToken="v2.demo-merchant.00000000-0000-4000-8000-0000000000"
    )

    answer = post_callback(installed, payload)

    _assert_refused(installed, answer, 404, "unknown-checkout", received, verified=True)
    assert received["callback_rejected"][0]["checkout"] is None
    assert received["payment_confirmed"] == []


@pytest.mark.backends
def test_a_token_with_nul_is_an_unknown_checkout(installed: Harness, received) -> None:
    """No token has U+0000 (and PostgreSQL refuses it in a query): a signed callback naming one is a 404."""
    _, token = create_v2_checkout(installed)

    answer = post_callback(installed, paid_payload(installed, token, checkoutToken=token + "\x00"))

    _assert_refused(installed, answer, 404, "unknown-checkout", received, verified=True)
    assert received["payment_confirmed"] == []


@pytest.mark.parametrize(
    "body",
    [
        b"{not json",
        b"[]",
        b'"PAID"',
        b'{"checkoutToken": "v2.x.y"}',
        b'{"checkoutToken": "v2.x.y", "checkoutTotalCents": "lots", "checkoutPaymentStatus": "PAID"}',
        b"",
    ],
)
def test_malformed_body_is_400_and_changes_nothing(installed: Harness, received, body: bytes) -> None:
    checkout_id, _ = create_v2_checkout(installed)
    before = snapshot(installed, checkout_id)

    answer = post_callback(installed, body)  # correctly signed

    _assert_refused(installed, answer, 400, "invalid-body", received, verified=True)
    assert snapshot(installed, checkout_id) == before
    assert callback_logs(installed)[0]["body"] == body.decode()


def test_body_that_is_not_utf8_is_refused_and_logged_readably(installed: Harness, received) -> None:
    answer = post_callback(installed, b'{"a": "\xff\xfe"}', signature=sign(b"{}", signing_key(installed)))

    _assert_refused(installed, answer, 401, "rejected-signature", received, verified=False)
    assert callback_logs(installed)[0]["body"] == '{"a": "\ufffd\ufffd"}'


@pytest.mark.backends
def test_a_body_with_u0000_is_logged_as_every_backend_stores_it(installed: Harness, received) -> None:
    """PostgreSQL refuses U+0000 in text: the log keeps it as U+FFFD, in its row and in the log object the
    signal's receivers are given."""
    bodies: list[str] = []

    def receiver(sender: Any, log: Any, **kwargs: Any) -> None:
        bodies.append(log.body)

    signals.callback_rejected.connect(receiver)
    try:
        answer = post_callback(installed, b'{"a": "\x00"}', signature=sign(b"{}", signing_key(installed)))
    finally:
        signals.callback_rejected.disconnect(receiver)

    _assert_refused(installed, answer, 401, "rejected-signature", received, verified=False)
    assert callback_logs(installed)[0]["body"] == '{"a": "\ufffd"}'
    assert bodies == ['{"a": "\ufffd"}']


def test_oversize_body_is_413_and_not_read(installed: Harness, received) -> None:
    body = b"{" + b" " * inbound.MAX_CALLBACK_BYTES + b"}"

    answer = post_callback(installed, body)

    _assert_refused(installed, answer, 413, "too-large", received, verified=False)
    assert callback_logs(installed)[0]["body"] == ""


@pytest.mark.backends
def test_a_body_of_exactly_the_limit_is_read(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    raw = json.dumps(paid_payload(installed, token)).encode()
    # Whitespace is not signed (the gateway strips it), so the padded body still verifies.
    padded = raw[:-1] + b" " * (inbound.MAX_CALLBACK_BYTES - len(raw)) + b"}"
    assert len(padded) == inbound.MAX_CALLBACK_BYTES

    answer = post_callback(installed, padded)

    assert (answer.status_code, answer.json["outcome"]) == (200, "accepted")
    assert snapshot(installed, checkout_id)["status"] == "PAID"


@pytest.mark.backends
@pytest.mark.parametrize(
    "status",
    ["EXPIRED", "PENDING_ORDER", "SOMETHING_NEW", "PA\x00ID"],
)
def test_statuses_not_acted_on_are_recorded_with_200(installed: Harness, received, status: str) -> None:
    checkout_id, token = create_v2_checkout(installed)
    payload = paid_payload(installed, token, checkoutPaymentStatus=status)

    answer = post_callback(installed, payload)

    assert (answer.status_code, answer.json) == (200, {"status": "ok", "outcome": "ignored"})
    state = snapshot(installed, checkout_id)
    assert state["status"] == "PENDING_ORDER"
    assert state["payment_confirmed_at"] is None
    source, _, _, applied, detail = state["events"][-1]
    assert (source, applied) == ("callback", False)
    assert status.replace("\x00", "\ufffd") in detail  # PostgreSQL refuses U+0000 in text
    assert received["payment_confirmed"] == received["checkout_cancelled"] == []
    [log] = callback_logs(installed)
    assert (log["outcome"], log["checkout_id"], log["verified"]) == ("ignored", checkout_id, True)


def test_secret_headers_are_never_stored(installed: Harness, received) -> None:
    _, token = create_v2_checkout(installed)
    payload = paid_payload(installed, token)
    raw = json.dumps(payload).encode()
    signature = sign(raw, signing_key(installed))

    post_callback(
        installed,
        raw,
        headers={
            "Authorization": "Bearer top-secret",
            "Cookie": "session=top-secret",
            "X-Api-Key": "top-secret",
            "X-Request-Id": "trace-1",
        },
    )

    [log] = callback_logs(installed)
    assert log["outcome"] == "accepted"
    assert "top-secret" not in json.dumps(log)
    assert {k.lower(): v for k, v in log["headers"].items()}["x-request-id"] == "trace-1"
    assert_no_secrets([log], signatures=(signature,))


# --- commit before answer and signals ------------------------------------------------------------------


@pytest.mark.backends
def test_signals_fire_after_the_commit(installed: Harness, database_url: str) -> None:
    checkout_id, token = create_v2_checkout(installed)
    payload = paid_payload(installed, token)
    seen: list[tuple[str, str]] = []

    def committed_status(sender, **kwargs) -> None:
        # A separate connection (SQLite: a read in WAL mode waits for no one; PostgreSQL: MVCC) sees
        # only committed data.
        [(status,)] = fetch_all(
            database_url, "SELECT status FROM gateway_checkouts WHERE id = :id", id=checkout_id
        )
        [(outcome,)] = fetch_all(
            database_url, "SELECT outcome FROM gateway_callback_log ORDER BY id DESC LIMIT 1"
        )
        seen.append((status, outcome))

    with signals.payment_confirmed.connected_to(committed_status):
        post_callback(installed, payload)
    assert seen == [("PAID", "accepted")]


@pytest.mark.backends
def test_an_unexpected_error_is_logged_and_rolled_back(
    installed: Harness, received, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkout_id, token = create_v2_checkout(installed)
    payload = paid_payload(installed, token)
    before = snapshot(installed, checkout_id)

    def broken(*args, **kwargs):
        raise RuntimeError("database went away")

    monkeypatch.setattr(applying, "apply", broken)  # _process applies through it
    with pytest.raises(RuntimeError):  # TESTING propagates it; in production the answer is 500
        post_callback(installed, payload)

    assert snapshot(installed, checkout_id) == before
    [log] = callback_logs(installed)
    assert (log["outcome"], log["http_status"]) == ("error", 500)
    assert "RuntimeError" in log["detail"]


def test_an_app_can_shape_the_refusal(installed: Harness) -> None:
    @installed.shop.errorhandler(CallbackRejected)
    def shaped(error: CallbackRejected):
        return {"refused": error.outcome, "log": error.log.id if error.log else None}, error.code

    answer = post_callback(installed, {"checkoutToken": "x"}, signature="bad")

    assert answer.status_code == 401
    assert answer.json == {"refused": "rejected-signature", "log": callback_logs(installed)[0]["id"]}


def test_callbacks_are_csrf_exempt_whatever_the_init_order(database_url):
    """CSRFProtect set up after Gateway(app) must not refuse the gateway's callbacks with a CSRF 400."""
    from flask import Flask
    from flask_sqlalchemy import SQLAlchemy
    from flask_wtf.csrf import CSRFProtect

    from flask_gateway import Gateway

    app = Flask("late_csrf")
    app.config.update(SECRET_KEY="k", SQLALCHEMY_DATABASE_URI=database_url)
    db = SQLAlchemy()
    db.init_app(app)
    Gateway(app, db=db)
    CSRFProtect(app)  # after the extension
    with app.app_context():
        db.create_all()
    response = app.test_client().post(
        "/gateway/callback", data=b"{}", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 401  # refused for its signature, not for CSRF
    assert "CSRF" not in response.get_data(as_text=True)
    admin = app.test_client().post("/gateway/admin/install", data={})
    assert admin.status_code in (400, 403)  # the admin keeps CSRF (and the guard)
