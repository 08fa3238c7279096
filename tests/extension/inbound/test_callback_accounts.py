"""Several merchant accounts (issue 27): what the gateway sends reaches the right account.

A callback is verified with the key of the account whose checkout it names, on the shared path
(``/gateway/callback``) and on an account's own path (``/gateway/callback/<account>``); one signed with
another account's key, or sent to another account's path, is refused and logged (401, never a 500). The
return pages and the v1 outcome URLs of a second account's checkout use that checkout's account.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import delete, select

from flask_gateway import GatewayCheckout, create_checkout, refund, retire_account
from flask_gateway.core.signing import sign
from flask_gateway.inbound import replay_callback
from flask_gateway.models import CallbackLog, Installation
from flask_gateway.state import get_state
from flask_gateway.testing import GatewayEmulator
from flask_gateway.urls import return_url
from tests.conftest import Databases
from tests.extension.conftest import ACCOUNT, SHOP_URL, Harness, make_shop, sample_order
from tests.extension.inbound.inbound_support import path_of, record_signals

pytestmark = pytest.mark.backends

SECOND = "brand-b"

received = pytest.fixture(record_signals)


@pytest.fixture
def shop(gateway_emulator: GatewayEmulator, plugin_harness: Harness) -> Flask:
    """The shop with the emulator's demo account and a second one (``brand-b``), on its own path."""
    gateway_emulator.install(account=SECOND)
    return plugin_harness.shop


def key_of(shop: Flask, account: str) -> str:
    with shop.app_context():
        state = get_state()
        return state.box.decrypt(state.require_installation(account).signing_key_encrypted)


def paid(shop: Flask, emulator: GatewayEmulator, reference: str, account: str) -> tuple[str, bytes]:
    """A checkout of ``account`` paid at the gateway: its token and the gateway's status payload, as the
    callback the gateway will send carries it (asked with the account's own signed client)."""
    with shop.app_context():
        token = create_checkout(sample_order(reference), account=account).token
        assert token is not None
    emulator.pay(token)
    with shop.app_context():
        payload = get_state().client(account=account).get_status(token).data.to_wire()
    return token, json.dumps(payload).encode()


def post(shop: Flask, body: bytes, key: str, path: str = "/gateway/callback", **headers: str) -> Any:
    sent = {"Content-Type": "application/json", "X-Signature": sign(body, key), **headers}
    return shop.test_client().post(path, data=body, headers=sent)


def logs(shop: Flask) -> list[tuple[str, int, bool, str]]:
    with shop.app_context():
        rows = get_state().session.scalars(select(CallbackLog).order_by(CallbackLog.id))
        return [(r.outcome, r.http_status, r.verified, r.detail or "") for r in rows]


def status_of(shop: Flask, token: str | None) -> str:
    assert token is not None
    with shop.app_context():
        row = get_state().session.scalars(select(GatewayCheckout).filter_by(token=token)).one()
        return row.status


# --- the shared path ---------------------------------------------------------------------------------------


def test_a_callback_signed_with_another_accounts_key_is_refused_and_logged(
    shop: Flask, gateway_emulator: GatewayEmulator, received: dict[str, list[dict[str, Any]]]
) -> None:
    token, body = paid(shop, gateway_emulator, "B-1", SECOND)

    answer = post(shop, body, key_of(shop, ACCOUNT))  # the first account's key, the second's checkout

    assert answer.status_code == 401
    assert answer.get_json()["message"]
    [(outcome, http_status, verified, detail)] = logs(shop)
    assert (outcome, http_status, verified) == ("rejected-signature", 401, False)
    assert f"verified with merchant account {SECOND!r}'s key" in detail
    [rejected] = received["callback_rejected"]
    assert rejected["log_outcome"] == "rejected-signature"
    assert received["payment_confirmed"] == []
    assert status_of(shop, token) == "PENDING_ORDER"  # nothing moved

    # The same body signed with its own account's key is accepted on the shared path.
    assert post(shop, body, key_of(shop, SECOND)).status_code == 200
    assert logs(shop)[-1][:3] == ("accepted", 200, True)
    assert status_of(shop, token) == "PAID"
    gateway_emulator.assert_fulfilled_once("B-1")


def test_the_account_header_must_be_the_checkouts_account(
    shop: Flask, gateway_emulator: GatewayEmulator
) -> None:
    token, body = paid(shop, gateway_emulator, "B-1", SECOND)
    answer = post(shop, body, key_of(shop, SECOND), **{"X-Merchant-Account-ID": ACCOUNT})
    assert answer.status_code == 401
    assert logs(shop)[-1][:3] == ("rejected-signature", 401, False)
    assert "X-Merchant-Account-ID is not the merchant account of the checkout" in logs(shop)[-1][3]
    assert status_of(shop, token) == "PENDING_ORDER"
    answer = post(shop, body, key_of(shop, SECOND), **{"X-Merchant-Account-ID": SECOND})
    assert answer.status_code == 200


# --- an account's own path ---------------------------------------------------------------------------------


def test_an_accounts_own_path_takes_that_accounts_callbacks_only(
    shop: Flask, gateway_emulator: GatewayEmulator, received: dict[str, list[dict[str, Any]]]
) -> None:
    token, body = paid(shop, gateway_emulator, "B-1", SECOND)
    first_key, second_key = key_of(shop, ACCOUNT), key_of(shop, SECOND)

    # Signed with the first account's key, on the first account's path: still the second's checkout.
    assert post(shop, body, first_key, f"/gateway/callback/{ACCOUNT}").status_code == 401
    # The second account's own callback, on the first account's path: refused too.
    assert post(shop, body, second_key, f"/gateway/callback/{ACCOUNT}").status_code == 401
    refused = logs(shop)
    assert [r[:3] for r in refused] == [("rejected-signature", 401, False)] * 2
    assert all(f"than this callback path's ({ACCOUNT!r})" in r[3] for r in refused)
    assert len(received["callback_rejected"]) == 2
    assert status_of(shop, token) == "PENDING_ORDER"

    # On its own path, accepted.
    assert post(shop, body, second_key, f"/gateway/callback/{SECOND}").status_code == 200
    assert logs(shop)[-1][:3] == ("accepted", 200, True)
    assert status_of(shop, token) == "PAID"
    gateway_emulator.assert_fulfilled_once("B-1")


def test_the_emulator_sends_each_account_to_its_own_path(
    shop: Flask, gateway_emulator: GatewayEmulator
) -> None:
    with shop.app_context():
        first = create_checkout(sample_order("A-1"), account=ACCOUNT).token
        second = create_checkout(sample_order("B-1"), account=SECOND).token
    gateway_emulator.pay(first)
    gateway_emulator.pay(second)
    assert gateway_emulator.deliver() == 2
    assert [a["url"] for a in gateway_emulator.callbacks(second)] == [f"{SHOP_URL}/gateway/callback/{SECOND}"]
    assert [a["url"] for a in gateway_emulator.callbacks(first)] == [f"{SHOP_URL}/gateway/callback"]
    assert [r[:3] for r in logs(shop)] == [("accepted", 200, True)] * 2

    # The test kit's replay (the emulator signs again with the checkout's account) and the shop's own
    # replay of the stored callback (verified again with the checkout's account's key): duplicates.
    assert gateway_emulator.replay_callback(second).http_status == 200
    with shop.app_context():
        log_id = (
            get_state()
            .session.scalars(
                select(CallbackLog.id)
                .where(CallbackLog.merchant_account_id == SECOND)
                .order_by(CallbackLog.id)
            )
            .first()
        )
        assert log_id is not None
        assert replay_callback(log_id).outcome.value == "duplicate"
    assert [r[0] for r in logs(shop)][2:] == ["duplicate", "duplicate"]
    gateway_emulator.assert_fulfilled_once("B-1")


@pytest.mark.parametrize(
    "path",
    [
        "/gateway/callback/brand-x",
        "/gateway/callback/" + "x" * 400,
        "/gateway/callback/brand-b/extra",
        "/gateway/callback/%00",
        "/gateway/callback/br%C3%A4nd",
    ],
    ids=["unknown", "long", "nested", "nul", "non-ascii"],
)
def test_a_path_naming_no_installed_account_is_refused_never_a_500(
    shop: Flask, gateway_emulator: GatewayEmulator, path: str
) -> None:
    token, body = paid(shop, gateway_emulator, "B-1", SECOND)
    second_key = key_of(shop, SECOND)
    # A body naming one of our checkouts: it is another account's than the path's.
    assert post(shop, body, second_key, path).status_code == 401
    # A body naming no checkout of ours: no key to verify with on that path.
    stranger = json.dumps({**json.loads(body), "checkoutToken": "v2.brand-x.unknown"}).encode()
    assert post(shop, stranger, second_key, path).status_code == 401
    # Not JSON at all.
    assert post(shop, b"not json {", second_key, path).status_code == 401
    assert [r[:3] for r in logs(shop)] == [("rejected-signature", 401, False)] * 3
    assert status_of(shop, token) == "PENDING_ORDER"


# --- retired, and removed ---------------------------------------------------------------------------------


def test_a_retired_accounts_callbacks_and_refunds_go_on(
    shop: Flask, gateway_emulator: GatewayEmulator
) -> None:
    with shop.app_context():
        token = create_checkout(sample_order("B-1"), account=SECOND).token
        retire_account(SECOND)
    gateway_emulator.pay(token)
    assert gateway_emulator.deliver() == 1
    assert gateway_emulator.callbacks(token)[0]["url"] == f"{SHOP_URL}/gateway/callback/{SECOND}"
    assert logs(shop)[-1][:3] == ("accepted", 200, True)
    assert status_of(shop, token) == "PAID"
    gateway_emulator.assert_fulfilled_once("B-1")
    with shop.app_context():
        checkout = get_state().session.scalars(select(GatewayCheckout).filter_by(token=token)).one()
        assert refund(checkout, 79800).state == "SUCCEEDED"


def test_a_return_page_of_a_removed_accounts_checkout_shows_the_order_as_it_is(
    shop: Flask, gateway_emulator: GatewayEmulator
) -> None:
    """An account removed while one of its checkouts is open: the shopper's return is answered (the order
    page, the checkout as the shop knows it), never a 500; the callback for it is refused (401)."""
    token, body = paid(shop, gateway_emulator, "B-1", SECOND)
    with shop.app_context():
        session = get_state().session
        checkout = session.scalars(select(GatewayCheckout).filter_by(token=token)).one()
        checkout_id = checkout.id
        session.execute(delete(Installation).where(Installation.merchant_account_id == SECOND))
        session.commit()
    with shop.test_request_context(base_url=SHOP_URL):
        url = return_url(checkout_id, "confirm")
    answer = shop.test_client().get(path_of(url))
    assert answer.status_code == 303
    assert answer.headers["Location"].endswith("/orders/B-1")
    assert status_of(shop, token) == "PENDING_ORDER"
    assert post(shop, body, "any-key").status_code == 401


# --- return pages and the v1 URLs of the second account ---------------------------------------------------


def test_the_return_page_asks_the_checkouts_own_account(
    shop: Flask, gateway_emulator: GatewayEmulator
) -> None:
    with shop.app_context():
        token = create_checkout(sample_order("B-1"), account=SECOND).token
    outcome = gateway_emulator.pay(token)
    assert outcome.redirect_url is not None
    answer = shop.test_client().get(path_of(outcome.redirect_url))
    assert answer.status_code == 303
    # getstatus with the second account's key said paid (the first account's would be refused).
    assert status_of(shop, token) == "PAID_PENDING_CALLBACK"
    gateway_emulator.assert_fulfilled_once("B-1")
    assert gateway_emulator.confirmations("B-1")[0].source == "return"


def test_a_v1_order_of_the_second_account(databases: Databases) -> None:
    """v1: the second account's order is created with its own API key; the gateway's success URL pays it
    and the fail URL of another order of it cancels; its refund goes out with its API key."""
    shop, db, _gateway = make_shop(databases.url("main"), GATEWAY_API_VERSION="v1")
    with GatewayEmulator.start(shop, database_url=databases.url("emulator")) as emulator:
        emulator.install(account=SECOND)
        with shop.app_context():
            paid_one = create_checkout(sample_order("B-1"), account=SECOND)
            cancelled = create_checkout(sample_order("B-2"), account=SECOND)
            assert (paid_one.api_version, paid_one.merchant_account_id) == ("v1", SECOND)
            paid_token, cancelled_token = paid_one.token, cancelled.token
        assert emulator.pay(paid_token).status == "PAID"
        assert emulator.cancel_as_consumer(cancelled_token).status == "CANCELLED_BY_CONSUMER"
        assert status_of(shop, paid_token) == "PAID"
        assert status_of(shop, cancelled_token) == "CANCELLED_BY_CONSUMER"
        emulator.assert_fulfilled_once("B-1")
        emulator.assert_not_fulfilled("B-2")
        with shop.app_context():
            checkout = get_state().session.scalars(select(GatewayCheckout).filter_by(token=paid_token)).one()
            assert refund(checkout, 10000).state == "SUCCEEDED"
        assert emulator.status(paid_token) == "PARTIALLY_REFUNDED"
    with shop.app_context():
        db.engine.dispose()
