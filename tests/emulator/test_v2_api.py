"""The emulator's v2 API, rule by rule: installation, settings, authentication, checkouts, refunds."""

from __future__ import annotations

import json
import re

import pytest
from sqlalchemy import text

from flask_gateway.core.signing import sign
from flask_gateway.core.timestamps import format_timestamp, parse_timestamp
from flask_gateway.core.wire import status_payload_keys
from tests.conftest import new_connection
from tests.emulator.conftest import make_emulator
from tests.emulator.support import ACCOUNT, API_KEY, CALLBACK_URL, Gateway, create_body, service

# --- installation and settings -------------------------------------------------------------------


def install_body(**overrides):
    body = {
        "merchantAccountId": ACCOUNT,
        "merchantAccountApiKey": API_KEY,
        "checkoutStatusCallbackUrl": CALLBACK_URL,
        "minimumCheckoutAmountCents": 100,
        "maximumCheckoutAmountCents": 100_000,
    }
    body.update(overrides)
    return body


def test_install_once_per_account(gateway):
    first = gateway.client.post("/install/v2", json=install_body())
    assert first.status_code == 200
    assert set(first.json) == {"secretSigningKey"}
    assert len(first.json["secretSigningKey"]) >= 32
    again = gateway.client.post("/install/v2", json=install_body())
    assert again.status_code == 403
    assert "already installed" in again.json["message"]


def test_install_with_wrong_api_key_or_unknown_account_is_401(gateway):
    assert (
        gateway.client.post("/install/v2", json=install_body(merchantAccountApiKey="nope")).status_code == 401
    )
    assert gateway.client.post("/install/v2", json=install_body(merchantAccountId="ghost")).status_code == 401
    # Nothing was installed by the refused attempts.
    assert gateway.client.post("/install/v2", json=install_body()).status_code == 200


def test_install_accepts_the_alternative_email_spelling(gateway):
    body = install_body(checkoutCallbackFailuresEmail="ops@shop.example")
    assert gateway.client.post("/install/v2", json=body).status_code == 200
    accounts = gateway.control("accounts", method="GET").json["accounts"]
    assert accounts[0]["callbackFailuresEmail"] == "ops@shop.example"
    assert "demo-api-key" not in json.dumps(accounts)


def test_install_validates_fields(gateway):
    response = gateway.client.post("/install/v2", json=install_body(minimumCheckoutAmountCents="100"))
    assert response.status_code == 400
    assert {"field": "minimumCheckoutAmountCents"}.items() <= response.json["errors"][0].items()


def test_settings_update_changes_given_fields_and_returns_signing_key(installed):
    key = installed.keys[ACCOUNT]
    response = installed.signed(
        "/install/v2",
        {"minimumCheckoutAmountCents": 5000, "callbackFailuresEmail": "a@b.example"},
        method="PATCH",
    )
    assert response.status_code == 200
    assert response.json == {
        "checkoutStatusCallbackUrl": CALLBACK_URL,
        "callbackFailuresEmail": "a@b.example",
        "minimumCheckoutAmountCents": 5000,
        "maximumCheckoutAmountCents": 10_000_000,
        "signingKey": key,
    }
    # The new minimum is enforced at once.
    too_small = installed.signed("/v2/create", create_body(total=4999))
    assert too_small.status_code == 400


def test_settings_update_needs_auth_and_a_consistent_range(installed):
    unsigned = installed.client.patch("/install/v2", json={"minimumCheckoutAmountCents": 1})
    assert unsigned.status_code == 401
    inverted = installed.signed("/install/v2", {"minimumCheckoutAmountCents": 20_000_000}, method="PATCH")
    assert inverted.status_code == 400
    empty = installed.signed("/install/v2", {}, method="PATCH")
    assert empty.status_code == 400


# --- authentication -------------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/v2/create", "/v2/update", "/v2/cancel", "/v2/getstatus", "/v2/refund"])
def test_every_operation_requires_a_valid_signature(installed, path):
    raw = json.dumps(create_body()).encode()
    headers = {"Content-Type": "application/json"}
    assert installed.client.post(path, data=raw, headers=headers).status_code == 401
    headers["X-Merchant-Account-ID"] = ACCOUNT
    missing = installed.client.post(path, data=raw, headers=headers)
    assert missing.status_code == 401
    headers["X-Signature"] = sign(raw, "wrong-key")
    wrong = installed.client.post(path, data=raw, headers=headers)
    assert wrong.status_code == 401
    # Sandbox: the expected signature is in the body, and it is the right one.
    assert wrong.json["expectedSignature"] == sign(raw, installed.keys[ACCOUNT])
    headers["X-Merchant-Account-ID"] = "ghost"
    assert installed.client.post(path, data=raw, headers=headers).status_code == 401


def test_signature_covers_the_raw_body_with_whitespace_removed(installed):
    raw = json.dumps(create_body(), indent=3).encode()
    response = installed.signed("/v2/create", None, raw=raw)
    assert response.status_code == 200
    tampered = raw.replace(b"79800", b"79801", 1)
    headers = {
        "Content-Type": "application/json",
        "X-Merchant-Account-ID": ACCOUNT,
        "X-Signature": sign(raw, installed.keys[ACCOUNT]),
    }
    assert installed.client.post("/v2/create", data=tampered, headers=headers).status_code == 401


def test_production_mode_hides_the_expected_signature(database_url):
    gateway = Gateway(make_emulator(database_url, sandbox=False).test_client())
    gateway.install()
    raw = b'{"checkoutToken":"x"}'
    headers = {
        "Content-Type": "application/json",
        "X-Merchant-Account-ID": ACCOUNT,
        "X-Signature": sign(raw, "bad"),
    }
    response = gateway.client.post("/v2/getstatus", data=raw, headers=headers)
    assert response.status_code == 401
    assert "expectedSignature" not in response.json


def test_uninstalled_account_cannot_call_checkouts(gateway):
    raw = json.dumps(create_body()).encode()
    headers = {
        "Content-Type": "application/json",
        "X-Merchant-Account-ID": ACCOUNT,
        "X-Signature": sign(raw, "k"),
    }
    response = gateway.client.post("/v2/create", data=raw, headers=headers)
    assert response.status_code == 401
    assert "not installed" in response.json["message"]


# --- create -----------------------------------------------------------------------------------------


def test_create_response_shape(installed):
    created = installed.create(create_body(clickTraceId=None))
    token = created["checkoutToken"]
    prefix, account, uuid_part = token.split(".", 2)
    assert (prefix, account) == ("v2", ACCOUNT)
    assert len(uuid_part) == 36
    assert created["paymentUrl"] == f"http://localhost/api/v2/app/checkout/{token}"
    assert created["requestId"] == "req-1"
    assert created["checkoutPaymentStatus"] == "PENDING_ORDER"
    assert created["merchantOrderReference"] == "order-1"
    assert created["merchantAccountId"] == ACCOUNT
    assert created["payjustnow"]["orderItems"][0]["priceCents"] == 39900
    created_at = parse_timestamp(created["createdAt"])
    assert (parse_timestamp(created["expiresAt"]) - created_at).total_seconds() == 3600  # default 60 minutes
    assert created["createdAt"].endswith("Z")


def test_create_uses_order_expiry_minutes_and_echoes_click_trace(installed):
    body = create_body(orderExpiryMinutes=10)
    body["clickTraceId"] = "trace-42"
    created = installed.create(body)
    delta = parse_timestamp(created["expiresAt"]) - parse_timestamp(created["createdAt"])
    assert delta.total_seconds() == 600
    assert created["clickTraceId"] == "trace-42"
    assert installed.status(created["checkoutToken"])["clickTraceId"] == "trace-42"


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda b: b["payjustnow"].update(orderExpiryMinutes=9), "payjustnow.orderExpiryMinutes"),
        (lambda b: b["payjustnow"].update(orderExpiryMinutes=7201), "payjustnow.orderExpiryMinutes"),
        (
            lambda b: b["payjustnow"]["orderItems"][0].update(priceCents=12.5),
            "payjustnow.orderItems[0].priceCents",
        ),
        (lambda b: b["payjustnow"]["orderItems"][0].pop("sku"), "payjustnow.orderItems[0].sku"),
        (lambda b: b["payjustnow"].pop("confirmRedirectUrl"), "payjustnow.confirmRedirectUrl"),
        (lambda b: b.update(checkoutTotalCents="79800"), "checkoutTotalCents"),
        (lambda b: b["payjustnow"].update(customer={"email": "not-an-email"}), "payjustnow.customer.email"),
    ],
)
def test_create_validation_names_the_field(installed, mutate, field):
    body = create_body()
    mutate(body)
    response = installed.signed("/v2/create", body)
    assert response.status_code == 400
    assert field in [e["field"] for e in response.json["errors"]]
    assert response.json["message"]


def test_create_enforces_the_account_limits_but_not_total_consistency(installed):
    assert installed.signed("/v2/create", create_body(total=99)).status_code == 400
    assert installed.signed("/v2/create", create_body(request_id="r2", total=10_000_001)).status_code == 400
    # The gateway does not check the total against orderAmountCents or the items (DESIGN).
    odd = installed.create(create_body(request_id="r3", total=500, orderAmountCents=12))
    assert odd["checkoutTotalCents"] == 500


@pytest.mark.parametrize(
    "url",
    [
        "http://localhost/ok",
        "http://shop.localhost/ok",
        "http://127.0.0.1:5000/ok",
        "http://[::1]/ok",
        "http://10.0.0.1/ok",
    ],
)
def test_firewall_refuses_local_redirect_urls(installed, url):
    response = installed.signed("/v2/create", create_body(confirmRedirectUrl=url))
    assert response.status_code == 403
    assert response.json == {"message": "Forbidden"}


def test_firewall_can_allow_local_urls(database_url):
    gateway = Gateway(make_emulator(database_url, waf_strict=False).test_client())
    gateway.install()
    created = gateway.create(create_body(confirmRedirectUrl="http://127.0.0.1:5000/ok"))
    assert created["payjustnow"]["confirmRedirectUrl"] == "http://127.0.0.1:5000/ok"


# --- idempotency ------------------------------------------------------------------------------------


@pytest.mark.backends
def test_create_replay_returns_the_same_answer_with_header(installed):
    first = installed.signed("/v2/create", create_body())
    second = installed.signed("/v2/create", create_body())
    assert first.status_code == second.status_code == 200
    assert "idempotent-replay" not in first.headers
    assert second.headers["idempotent-replay"] == "true"
    assert second.json == first.json
    assert len(installed.control("checkouts", method="GET").json["checkouts"]) == 1


@pytest.mark.backends
def test_same_request_id_with_a_different_body_is_422(installed):
    installed.create(create_body())
    response = installed.signed("/v2/create", create_body(total=1000))
    assert response.status_code == 422
    assert len(installed.control("checkouts", method="GET").json["checkouts"]) == 1


@pytest.mark.backends
def test_request_id_is_per_account_and_per_operation(installed):
    installed.control("accounts", {"merchantAccountId": "other", "merchantAccountApiKey": "other-key"})
    installed.install("other", "other-key")
    a = installed.create(create_body())
    b = installed.create(create_body(), account="other")
    assert a["checkoutToken"] != b["checkoutToken"]


@pytest.mark.backends
def test_replays_expire_after_24_hours(installed):
    first = installed.create(create_body(orderExpiryMinutes=7200))
    installed.advance(24 * 3600 + 1)
    again = installed.signed("/v2/create", create_body(orderExpiryMinutes=7200))
    assert again.status_code == 200
    assert "idempotent-replay" not in again.headers
    assert again.json["checkoutToken"] != first["checkoutToken"]


@pytest.mark.backends
def test_refused_create_is_replayed_too(installed):
    first = installed.signed("/v2/create", create_body(total=50))
    assert first.status_code == 400
    installed.signed("/install/v2", {"minimumCheckoutAmountCents": 10}, method="PATCH")
    second = installed.signed("/v2/create", create_body(total=50))
    assert second.status_code == 400
    assert second.headers["idempotent-replay"] == "true"


def test_create_without_request_id_is_not_idempotent(installed):
    a = installed.create(create_body(request_id=None))
    b = installed.create(create_body(request_id=None))
    assert a["checkoutToken"] != b["checkoutToken"]


# --- update -----------------------------------------------------------------------------------------


def update_body(token, total=50_000, **service_overrides):
    return {
        "checkoutToken": token,
        "payjustnow": service(orderAmountCents=total, **service_overrides),
        "checkoutTotalCents": total,
    }


def test_update_replaces_the_order_and_opens_a_new_window(installed):
    created = installed.create()
    installed.advance(1800)
    response = installed.signed("/v2/update", update_body(created["checkoutToken"]))
    assert response.status_code == 200
    body = response.json
    assert body["checkoutTotalCents"] == 50_000
    assert body["payjustnow"]["checkoutPaymentStatus"] == "PENDING_ORDER"
    assert body["updatedAt"] != created["updatedAt"]
    assert (parse_timestamp(body["expiresAt"]) - parse_timestamp(body["updatedAt"])).total_seconds() == 3600
    assert installed.status(created["checkoutToken"])["checkoutTotalCents"] == 50_000


def test_update_with_explicit_expiry(installed):
    created = installed.create()
    target = parse_timestamp(created["createdAt"]).replace(microsecond=0)
    future = format_timestamp(target.replace(year=target.year + 1))
    response = installed.signed("/v2/update", update_body(created["checkoutToken"], expiresAt=future))
    assert response.json["expiresAt"] == future
    past = format_timestamp(target.replace(year=target.year - 1))
    refused = installed.signed("/v2/update", update_body(created["checkoutToken"], expiresAt=past))
    assert refused.status_code == 400
    assert refused.json["errors"][0]["field"] == "payjustnow.expiresAt"


@pytest.mark.backends
def test_update_after_expiry_is_403(installed):
    created = installed.create()
    installed.advance(3601)
    response = installed.signed("/v2/update", update_body(created["checkoutToken"]))
    assert response.status_code == 403
    assert "expired" in response.json["message"]
    assert installed.status(created["checkoutToken"])["checkoutPaymentStatus"] == "EXPIRED"


def test_update_reopens_a_consumer_cancelled_checkout(installed):
    created = installed.create()
    installed.consumer_cancel(created["checkoutToken"])
    response = installed.signed("/v2/update", update_body(created["checkoutToken"]))
    assert response.json["checkoutPaymentStatus"] == "PENDING_ORDER"
    assert installed.pay(created["checkoutToken"]).json["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"


@pytest.mark.parametrize("setup", ["pay", "cancel"])
def test_update_from_a_wrong_state_is_409(installed, setup):
    token = installed.create()["checkoutToken"]
    if setup == "pay":
        installed.pay(token)
    else:
        installed.signed("/v2/cancel", {"checkoutToken": token})
    assert installed.signed("/v2/update", update_body(token)).status_code == 409


# --- cancel, getstatus, unknown tokens --------------------------------------------------------------


def test_cancel_answers_the_reduced_echo(installed):
    token = installed.create()["checkoutToken"]
    response = installed.signed("/v2/cancel", {"checkoutToken": token})
    assert response.status_code == 200
    body = response.json
    assert body["checkoutPaymentStatus"] == "CANCELLED_BY_MERCHANT"
    assert body["cancelledAt"].endswith("Z")
    assert set(body["payjustnow"]) == {
        "merchantOrderReference",
        "confirmRedirectUrl",
        "cancelRedirectUrl",
        "orderAmountCents",
        "orderItems",
    }
    assert body["merchantAccountId"] == ACCOUNT
    assert installed.signed("/v2/cancel", {"checkoutToken": token}).status_code == 409


def test_cancel_after_consumer_cancel_is_allowed(installed):
    token = installed.create()["checkoutToken"]
    installed.consumer_cancel(token)
    assert (
        installed.signed("/v2/cancel", {"checkoutToken": token}).json["checkoutPaymentStatus"]
        == "CANCELLED_BY_MERCHANT"
    )


def test_getstatus_has_exactly_the_16_keys(installed):
    token = installed.create()["checkoutToken"]
    status = installed.status(token)
    assert tuple(status) == status_payload_keys()
    assert status["paidAt"] is None
    installed.pay(token)
    paid = installed.status(token)
    assert paid["paidAt"].endswith("Z")
    assert len(paid["paidAt"].split(".")[1]) == 7  # microseconds and Z
    assert isinstance(paid["paymentReference"], int)
    assert isinstance(paid["payjustnowOrderReference"], int)


def test_another_merchants_or_unknown_token_is_404(installed):
    installed.control("accounts", {"merchantAccountId": "other", "merchantAccountApiKey": "other-key"})
    installed.install("other", "other-key")
    token = installed.create()["checkoutToken"]
    for path in ("/v2/getstatus", "/v2/cancel"):
        assert installed.signed(path, {"checkoutToken": token}, account="other").status_code == 404
        assert installed.signed(path, {"checkoutToken": "v2.x.nope"}).status_code == 404


@pytest.mark.backends
def test_expired_checkout_cannot_be_paid(installed):
    token = installed.create(create_body(orderExpiryMinutes=10))["checkoutToken"]
    installed.advance(599)
    assert installed.status(token)["checkoutPaymentStatus"] == "PENDING_ORDER"
    installed.advance(2)
    assert installed.status(token)["checkoutPaymentStatus"] == "EXPIRED"
    assert installed.pay(token).status_code == 409
    assert installed.signed("/v2/cancel", {"checkoutToken": token}).status_code == 409


# --- refunds ----------------------------------------------------------------------------------------


def refund_body(token, amount, request_id="refund-1"):
    return {
        "requestId": request_id,
        "checkoutToken": token,
        "merchantRefundReference": "rf-1",
        "refundAmountCents": amount,
        "refundDescription": "returned kettle",
    }


def test_partial_then_full_refund(installed):
    token = installed.create()["checkoutToken"]
    installed.pay(token)
    first = installed.signed("/v2/refund", refund_body(token, 30_000))
    assert first.status_code == 200
    assert first.json["refundedAmountCents"] == 30_000
    assert first.json["refundStatus"] == "SUCCESS"
    # The requestId echoed (the spec's common fields, issue 29); "OK" and microseconds as the gateway's
    # examples answer.
    assert set(first.json) == {
        "requestId",
        "refundedAmountCents",
        "refundStatus",
        "refundStatusAt",
        "refundStatusDescription",
    }
    assert first.json["refundStatusDescription"] == "OK"
    assert re.fullmatch(r"\S+T\S+\.\d{6}Z", first.json["refundStatusAt"])
    assert installed.status(token)["checkoutPaymentStatus"] == "PARTIALLY_REFUNDED"
    too_much = installed.signed("/v2/refund", refund_body(token, 49_801, "refund-2"))
    assert too_much.status_code == 409
    assert "49800" in too_much.json["message"]
    rest = installed.signed("/v2/refund", refund_body(token, 49_800, "refund-3"))
    assert rest.status_code == 200
    assert installed.status(token)["checkoutPaymentStatus"] == "FULLY_REFUNDED"
    assert installed.signed("/v2/refund", refund_body(token, 1, "refund-4")).status_code == 409


@pytest.mark.backends
def test_refund_of_unpaid_checkout_is_409_and_replay_is_idempotent(installed):
    token = installed.create()["checkoutToken"]
    assert installed.signed("/v2/refund", refund_body(token, 100)).status_code == 409
    installed.pay(token)
    ok = installed.signed("/v2/refund", refund_body(token, 100, "refund-2"))
    again = installed.signed("/v2/refund", refund_body(token, 100, "refund-2"))
    assert again.headers["idempotent-replay"] == "true"
    assert again.json == ok.json
    detail = installed.control(f"checkouts/{token}", method="GET").json
    assert detail["refundedCents"] == 100


@pytest.mark.parametrize("amount", [0, -1, 1.5])
def test_refund_amount_must_be_a_positive_integer(installed, amount):
    token = installed.create()["checkoutToken"]
    installed.pay(token)
    assert installed.signed("/v2/refund", refund_body(token, amount)).status_code == 400


# --- bad input --------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"", b"{nope", b"[1,2]", b'"text"', b"\xff\xfe"])
def test_malformed_bodies_are_400_never_500(installed, raw):
    response = installed.signed("/v2/create", None, raw=raw)
    assert response.status_code == 400
    assert response.json["message"]


def test_oversize_body_is_413(installed):
    raw = json.dumps(create_body(clickTraceId="x" * 70_000)).encode()
    response = installed.signed("/v2/create", None, raw=raw)
    assert response.status_code == 413
    assert "KiB" in response.json["message"]


def test_unknown_path_and_wrong_method_answer_json(installed):
    assert installed.client.post("/v2/nothing").json == {"message": "Not found."}
    assert installed.client.get("/v2/create").status_code == 405


# --- faults -----------------------------------------------------------------------------------------


def test_status_fault_answers_then_stops(installed):
    rule = installed.control(
        "faults", {"operation": "create", "kind": "status", "status": 503, "retryAfter": 2, "count": 2}
    )
    assert rule.status_code == 201
    for _ in range(2):
        response = installed.signed("/v2/create", create_body())
        assert response.status_code == 503
        assert response.headers["Retry-After"] == "2"
    assert installed.signed("/v2/create", create_body()).status_code == 200
    assert installed.control("faults", method="GET").json == {"faults": []}


@pytest.mark.backends
def test_a_fault_rule_used_up_elsewhere_right_after_a_use_still_answers_the_fault(
    installed, database_url, monkeypatch
):
    """Every worker process takes uses of the same rules. Right after this request took its use (and
    committed), another process may take the last one and delete the rule: the request still answers its
    fault (503), where reading the rule's expired row again raised ObjectDeletedError (a 500 here, and a
    crash of the delivery worker's run for callback faults)."""
    from flask_gateway.emulator.models import db

    installed.control("faults", {"operation": "create", "kind": "status", "status": 503, "count": 3})
    real_commit = db.session.commit
    used_up: list[bool] = []

    def commit_then_another_process_uses_the_rule_up() -> None:
        real_commit()
        if not used_up:
            used_up.append(True)
            with new_connection(database_url) as connection:
                connection.execute(text("DELETE FROM emulator_faults"))

    monkeypatch.setattr(db.session, "commit", commit_then_another_process_uses_the_rule_up)
    assert installed.signed("/v2/create", create_body()).status_code == 503
    monkeypatch.undo()
    assert used_up == [True]
    assert installed.signed("/v2/create", create_body()).status_code == 200


@pytest.mark.backends
def test_drop_response_commits_then_drops(installed):
    from flask_gateway.emulator.faults import ResponseDropped

    installed.control("faults", {"operation": "create", "kind": "drop_response", "count": 1})
    with pytest.raises(ResponseDropped):
        installed.signed("/v2/create", create_body())
    # The work was committed: the retry is a replay of the stored answer.
    retry = installed.signed("/v2/create", create_body())
    assert retry.headers["idempotent-replay"] == "true"
    assert len(installed.control("checkouts", method="GET").json["checkouts"]) == 1


def test_fault_rules_are_validated_and_cleared(installed):
    assert installed.control("faults", {"operation": "getstatus", "kind": "drop_response"}).status_code == 400
    assert installed.control("faults", {"operation": "create", "kind": "status"}).status_code == 400
    installed.control("faults", {"operation": "getstatus", "kind": "status", "status": 500})
    assert installed.control("faults", method="DELETE").json == {"removed": 1}


@pytest.mark.backends
def test_reset_forgets_everything(installed):
    installed.create()
    installed.advance(100)
    assert installed.control("reset").status_code == 200
    assert installed.control("checkouts", method="GET").json["checkouts"] == []
    assert installed.control("clock", method="GET").json["offsetSeconds"] == 0
    # The account is back to "issued, not installed".
    assert installed.client.post("/install/v2", json=install_body()).status_code == 200


@pytest.mark.backends
def test_expiry_found_by_a_refused_action_is_kept(installed):
    from flask_gateway.emulator.models import ClockState, db

    token = installed.create(create_body(orderExpiryMinutes=10))["checkoutToken"]
    with installed.client.application.app_context():
        # Move time without processing what became due: only the refused pay can notice the expiry.
        db.session.get(ClockState, 1).offset_seconds += 601
        db.session.commit()
    assert installed.pay(token).status_code == 409
    detail = installed.control(f"checkouts/{token}", method="GET").json
    assert detail["checkoutPaymentStatus"] == "EXPIRED"


def test_a_new_signing_key_rule_makes_the_next_settings_update_issue_one(installed):
    """The account manager's key change, for a shop to rehearse: verified with the old key, answered with
    the new one, which alone signs from then on."""
    old = installed.keys[ACCOUNT]
    rule = {"operation": "settings", "kind": "new_signing_key", "count": 1}
    assert installed.control("faults", rule).status_code == 201

    answer = installed.signed("/install/v2", {"minimumCheckoutAmountCents": 100}, method="PATCH")

    assert answer.status_code == 200
    new = answer.json["signingKey"]
    assert new != old
    assert installed.signed("/v2/create", create_body()).status_code == 401  # the old key no longer signs
    installed.keys[ACCOUNT] = new
    assert installed.signed("/v2/create", create_body()).status_code == 200
    again = installed.signed("/install/v2", {"minimumCheckoutAmountCents": 100}, method="PATCH")
    assert again.json["signingKey"] == new  # one use: the next update answers the same key


def test_a_new_signing_key_rule_goes_with_settings_only(installed):
    answer = installed.control("faults", {"operation": "create", "kind": "new_signing_key"})
    assert answer.status_code == 400
    assert "new_signing_key applies to settings" in answer.get_data(as_text=True)
