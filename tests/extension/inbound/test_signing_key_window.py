"""A new signing key without refusals: the key a settings update replaced still verifies callbacks for
``GATEWAY_PREVIOUS_SIGNING_KEY_HOURS``, each log row names the key that verified it, and after the window
the previous key is refused (docs/operations.md, "A new signing key")."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest

from flask_gateway.core.timestamps import utcnow
from flask_gateway.emulator.models import Account
from flask_gateway.emulator.models import db as emulator_db
from flask_gateway.errors import ConfigurationError
from flask_gateway.models import CallbackLog
from flask_gateway.operations.drift import check_settings
from flask_gateway.payments.installation import update_settings
from flask_gateway.state import get_state
from tests.extension.conftest import ACCOUNT, SHOP_URL, Harness, make_shop
from tests.extension.inbound.inbound_support import (
    create_v2_checkout,
    gateway_status,
    post_callback,
    signing_key,
    snapshot,
)


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


def the_gateway_issues_a_new_key(h: Harness) -> None:
    """The next settings update answers a new signing key (the emulator's ``new_signing_key`` rule)."""
    rule = {"operation": "settings", "kind": "new_signing_key", "count": 1}
    assert h.emulator.control("faults", rule).status_code == 201


def the_gateways_key(h: Harness) -> str:
    with h.emulator.client.application.app_context():
        account = emulator_db.session.get(Account, ACCOUNT)
        assert account is not None and account.signing_key
        return account.signing_key


def update_the_settings(h: Harness) -> None:
    with h.shop.app_context():
        update_settings(
            callback_url=f"{SHOP_URL}/gateway/callback",
            callback_failures_email=None,
            minimum_cents=100,
            maximum_cents=10_000_000,
        )


def paid_payload(h: Harness, reference: str) -> tuple[int, dict[str, object]]:
    checkout_id, token = create_v2_checkout(h, reference)
    assert h.emulator.pay(token).status_code == 200
    return checkout_id, gateway_status(h, token)


def last_log(h: Harness) -> tuple[str, int, str | None, str]:
    with h.shop.app_context():
        row = get_state().session.query(CallbackLog).order_by(CallbackLog.id.desc()).first()
        assert row is not None
        return row.outcome, row.http_status, row.verified_with, row.detail


def test_a_callback_signed_with_the_replaced_key_is_accepted_confirmed_and_named(installed: Harness) -> None:
    h = installed
    old = signing_key(h)
    # Signed before the change (in flight, or a retry of an attempt made before it).
    checkout_id, payload = paid_payload(h, "ORD-OLD-KEY")
    the_gateway_issues_a_new_key(h)
    update_the_settings(h)
    new = signing_key(h)
    assert new != old and new == the_gateways_key(h)
    with h.shop.app_context():
        row = get_state().require_installation()
        assert row.previous_signing_key_encrypted is not None
        assert get_state().box.decrypt(row.previous_signing_key_encrypted) == old
        assert row.signing_key_replaced_at is not None

    answer = post_callback(h, payload, key=old)

    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert last_log(h)[:3] == ("accepted", 200, "previous")
    state = snapshot(h, checkout_id)
    assert state["status"] == "PAID"
    # Confirmed with getstatus like any other: the shop asked the gateway with the new key.
    assert "confirmed by getstatus" in state["events"][-1][4]

    # One signed with the new key says so too.
    second_id, second = paid_payload(h, "ORD-NEW-KEY")
    assert post_callback(h, second, key=new).status_code == 200
    assert last_log(h)[:3] == ("accepted", 200, "current")
    assert snapshot(h, second_id)["status"] == "PAID"

    # The owner's screens say which key verified each: the callback log and each checkout's page.
    h.gateway.admin_guard(lambda: True)
    client = h.client
    log_page = client.get("/gateway/admin/callbacks").get_data(as_text=True)
    assert log_page.count('<span data-verified-with="previous">verified with the previous key</span>') == 1
    old_page = client.get(f"/gateway/admin/checkouts/{checkout_id}").get_data(as_text=True)
    new_page = client.get(f"/gateway/admin/checkouts/{second_id}").get_data(as_text=True)
    assert "verified with the previous key" in old_page
    assert "verified with the previous key" not in new_page and ">verified</td>" in new_page


def test_after_the_window_the_replaced_key_is_refused_and_the_refusal_says_why(installed: Harness) -> None:
    h = installed
    old = signing_key(h)
    checkout_id, payload = paid_payload(h, "ORD-LATE")
    the_gateway_issues_a_new_key(h)
    update_the_settings(h)
    with h.shop.app_context():
        row = get_state().require_installation()
        # The change happened 24 h ago (the default window) and a moment.
        row.signing_key_replaced_at = utcnow() - timedelta(hours=24, seconds=1)
        get_state().session.commit()

    answer = post_callback(h, payload, key=old)

    assert answer.status_code == 401
    outcome, status, verified_with, detail = last_log(h)
    assert (outcome, status, verified_with) == ("rejected-signature", 401, None)
    assert "previous key" in detail and "GATEWAY_PREVIOUS_SIGNING_KEY_HOURS" in detail
    assert snapshot(h, checkout_id)["status"] != "PAID"


def test_a_key_that_was_never_the_accounts_is_refused_inside_the_window(installed: Harness) -> None:
    h = installed
    checkout_id, payload = paid_payload(h, "ORD-FORGED")
    the_gateway_issues_a_new_key(h)
    update_the_settings(h)

    assert post_callback(h, payload, key=str(uuid.uuid4())).status_code == 401
    assert post_callback(h, payload, omit=("X-Signature",)).status_code == 401
    assert last_log(h)[:3] == ("rejected-signature", 401, None)
    assert snapshot(h, checkout_id)["status"] != "PAID"


def test_an_update_that_answers_the_same_key_keeps_the_window_of_the_last_change(installed: Harness) -> None:
    h = installed
    old = signing_key(h)
    the_gateway_issues_a_new_key(h)
    update_the_settings(h)
    with h.shop.app_context():
        changed_at = get_state().require_installation().signing_key_replaced_at

    update_the_settings(h)  # the same key again: nothing was replaced

    with h.shop.app_context():
        row = get_state().require_installation()
        assert row.signing_key_replaced_at == changed_at
        assert row.previous_signing_key_encrypted is not None
        assert get_state().box.decrypt(row.previous_signing_key_encrypted) == old


def test_the_settings_check_that_finds_a_new_key_keeps_the_old_one_for_the_window(installed: Harness) -> None:
    h = installed
    old = signing_key(h)
    checkout_id, payload = paid_payload(h, "ORD-DRIFT")
    the_gateway_issues_a_new_key(h)
    with h.shop.app_context():
        report = check_settings()
    assert [d.setting for d in report.differences] == ["signing key"]
    summary = report.summary()
    assert "the previous one still verifies them for 24 h" in summary
    assert "someone else signed" not in summary  # the gateway's own key change: no alarm
    assert signing_key(h) == the_gateways_key(h) != old

    assert post_callback(h, payload, key=old).status_code == 200
    assert last_log(h)[:3] == ("accepted", 200, "previous")
    assert snapshot(h, checkout_id)["status"] == "PAID"


@pytest.mark.parametrize("value", [-1, 721, 1.5, "24", True])
def test_the_window_setting_must_be_whole_hours_up_to_thirty_days(value: object) -> None:
    with pytest.raises(ConfigurationError, match="GATEWAY_PREVIOUS_SIGNING_KEY_HOURS"):
        make_shop("sqlite://", GATEWAY_PREVIOUS_SIGNING_KEY_HOURS=value)
