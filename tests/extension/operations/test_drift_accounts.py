"""Settings drift per merchant account (issue 27): ``check_settings(account)`` compares that account's
settings and records the result on its row; ``check_all_settings()`` checks every account, open and
retired, and one that cannot be checked never stops the others."""

from __future__ import annotations

import json

import pytest

from flask_gateway.errors import UnknownAccountError
from flask_gateway.operations.drift import check_all_settings, check_settings, last_report
from flask_gateway.payments.accounts import retire_account
from flask_gateway.state import get_state
from tests.extension.conftest import Harness
from tests.extension.operations.support_accounts import ACCOUNT, OTHER, install_both

pytestmark = pytest.mark.backends

ATTACKER_URL = "https://attacker.example/steal"


@pytest.fixture
def both(harness: Harness) -> Harness:
    return install_both(harness)


def move_callback_of(h: Harness, account: str) -> None:
    """A settings update of ``account`` signed through the sandbox's 401 answer, as anyone can make one."""
    raw = json.dumps({"checkoutStatusCallbackUrl": ATTACKER_URL}).encode()
    headers = {"Content-Type": "application/json", "X-Merchant-Account-ID": account}
    refused = h.emulator.client.patch("/install/v2", data=raw, headers={**headers, "X-Signature": "junk"})
    assert refused.status_code == 401
    signed = {**headers, "X-Signature": refused.json["expectedSignature"]}
    assert h.emulator.client.patch("/install/v2", data=raw, headers=signed).status_code == 200


def test_each_account_is_compared_with_its_own_settings(both: Harness) -> None:
    move_callback_of(both, ACCOUNT)  # the first account's, not the default (OTHER, installed last)
    with both.shop.app_context():
        default = check_settings()  # the default account, as before
        first = check_settings(ACCOUNT)
        state = get_state()
        first_row, other_row = state.require_installation(ACCOUNT), state.require_installation(OTHER)
        first_drift, other_drift = list(first_row.settings_drift or []), list(other_row.settings_drift or [])
        recorded = last_report(first_row)

    assert (default.account, default.ok) == (OTHER, True)
    assert (first.account, first.ok) == (ACCOUNT, False)
    assert [d.setting for d in first.differences] == ["callback URL"]
    assert first.differences[0].gateway == repr(ATTACKER_URL)
    assert [d["setting"] for d in first_drift] == ["callback URL"]  # on the first account's row
    assert other_drift == []  # the other's row has its own (clean) result
    assert recorded is not None and recorded.account == ACCOUNT and not recorded.ok


def test_an_account_not_installed_is_a_clear_error(both: Harness) -> None:
    with both.shop.app_context(), pytest.raises(UnknownAccountError, match="not installed"):
        check_settings("nobody-here")


def test_check_all_settings_checks_every_account_and_one_failing_never_stops_the_others(
    both: Harness,
) -> None:
    move_callback_of(both, OTHER)
    with both.shop.app_context():
        retire_account(ACCOUNT)  # retired: its callbacks still come, so its settings still matter
        state = get_state()
        row = state.require_installation(ACCOUNT)
        row.signing_key_encrypted = "not-a-token"  # its keys cannot be read: its check fails
        state.session.commit()

        checks = check_all_settings()

        other_drift = state.require_installation(OTHER).settings_drift

    assert [(c.account, c.retired) for c in checks] == [(ACCOUNT, True), (OTHER, False)]  # oldest first
    first, other = checks
    assert first.report is None and first.error is not None and not first.ok
    assert first.error.startswith("SecretUnreadable")
    assert other.report is not None and not other.ok  # checked all the same
    assert [d.setting for d in other.report.differences] == ["callback URL"]
    assert [d["setting"] for d in other_drift or []] == ["callback URL"]


def test_check_all_settings_with_one_account_is_check_settings(harness: Harness) -> None:
    harness.install()
    with harness.shop.app_context():
        [only] = check_all_settings()
    assert (only.account, only.retired, only.ok) == (ACCOUNT, False, True)
    assert only.report is not None and only.report.account == ACCOUNT
