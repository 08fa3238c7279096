"""Drift of the gateway's settings is noticed (issue 12): the admin status page and ``check-settings``.

The attack: the sandbox signs a settings update for anyone (``expectedSignature``), so an attacker moves the
callback URL to his own server. The shop compares the gateway's settings with its own and says so.
"""

from __future__ import annotations

import json
import re

import pytest

from flask_gateway.models import Installation
from flask_gateway.state import get_state
from tests.extension.conftest import ACCOUNT, SHOP_URL, Harness
from tests.extension.inbound.inbound_support import signing_key

ATTACKER_URL = "https://attacker.example/steal"


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()

    @harness.gateway.admin_guard
    def allow() -> bool:
        return True

    return harness


def sandbox_signed_patch(h: Harness, body: dict[str, object]) -> None:
    """A settings update signed through the sandbox's 401 answer, as anyone can make one."""
    raw = json.dumps(body).encode()
    headers = {"Content-Type": "application/json", "X-Merchant-Account-ID": ACCOUNT}
    refused = h.emulator.client.patch("/install/v2", data=raw, headers={**headers, "X-Signature": "junk"})
    assert refused.status_code == 401
    signed = {**headers, "X-Signature": refused.json["expectedSignature"]}
    assert h.emulator.client.patch("/install/v2", data=raw, headers=signed).status_code == 200


def invoke(h: Harness, *args: str):
    return h.shop.test_cli_runner().invoke(args=["gateway", *args])


def test_check_settings_agrees_after_installation(installed: Harness) -> None:
    result = invoke(installed, "check-settings")
    assert result.exit_code == 0, result.output
    assert "are the shop's" in result.output


def test_a_callback_url_moved_through_the_sandbox_is_noticed_by_the_cli(installed: Harness) -> None:
    key_before = signing_key(installed)
    sandbox_signed_patch(
        installed, {"checkoutStatusCallbackUrl": ATTACKER_URL, "minimumCheckoutAmountCents": 1}
    )

    # Only compare (the command puts the shop's back without --no-repair: test_drift_repair.py).
    result = invoke(installed, "check-settings", "--no-repair")

    assert result.exit_code == 1
    assert (
        f"callback URL: the shop has '{SHOP_URL}/gateway/callback', the gateway '{ATTACKER_URL}'"
        in result.output
    )
    assert "minimum amount (cents): the shop has 100, the gateway 1" in result.output
    assert signing_key(installed) == key_before  # the check changed nothing of its own
    status = installed.emulator.control("accounts", method="GET").json["accounts"][0]
    assert status["checkoutStatusCallbackUrl"] == ATTACKER_URL  # nor the gateway's settings
    with installed.shop.app_context():
        row = get_state().session.query(Installation).one()
        assert row.settings_checked_at is not None
        assert {d["setting"] for d in row.settings_drift or []} == {"callback URL", "minimum amount (cents)"}


def test_the_admin_status_page_compares_and_shows_what_differs(installed: Harness) -> None:
    client = installed.client
    page = client.get("/gateway/admin/").get_data(as_text=True)
    assert 'data-settings-drift="none"' in page  # the installation answered with these settings
    sandbox_signed_patch(installed, {"callbackFailuresEmail": "attacker@evil.example"})

    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page)
    assert token is not None
    answer = client.post("/gateway/admin/check-settings", data={"csrf_token": token.group(1)})
    assert answer.status_code == 302

    page = client.get("/gateway/admin/").get_data(as_text=True)
    assert 'data-settings-drift="found"' in page
    assert "failure e-mail" in page and "attacker@evil.example" in page


def test_saving_the_settings_puts_the_shops_back(installed: Harness) -> None:
    from flask_gateway.payments.installation import update_settings

    sandbox_signed_patch(installed, {"checkoutStatusCallbackUrl": ATTACKER_URL})
    assert invoke(installed, "check-settings").exit_code == 1
    with installed.shop.app_context():
        update_settings(
            callback_url=f"{SHOP_URL}/gateway/callback",
            callback_failures_email=None,
            minimum_cents=100,
            maximum_cents=10_000_000,
        )
    assert invoke(installed, "check-settings").exit_code == 0


def test_check_settings_reports_an_unreachable_gateway(installed: Harness) -> None:
    fault = {"operation": "v1_configuration", "kind": "status", "status": 500}
    assert installed.emulator.control("faults", fault).status_code == 201
    result = invoke(installed, "check-settings")
    assert result.exit_code == 1
    assert "could not be checked" in result.output
