"""``flask gateway set-api-key --account ID``: the new API key the account manager issued, from the
environment or a hidden prompt (never an option), proved with an authenticated call before it is stored;
the old key is kept when the proof fails, and nothing of either key is ever printed."""

from __future__ import annotations

import pytest

from flask_gateway.core.errors import AuthenticationError
from flask_gateway.payments.installation import set_api_key
from flask_gateway.state import get_state
from tests.extension.conftest import ACCOUNT, API_KEY, Harness
from tests.extension.operations.cli_support import SECOND, install_account, run_gateway

NEW_KEY = "the-new-api-key-issued-7f3a"


@pytest.fixture
def two(harness: Harness) -> Harness:
    harness.install()
    install_account(harness)
    return harness


def stored_key(h: Harness, account: str) -> str:
    with h.shop.app_context():
        state = get_state()
        return state.box.decrypt(state.require_installation(account).api_key_encrypted)


def the_account_manager_issues(h: Harness, account: str, key: str) -> None:
    answer = h.emulator.control("accounts", {"merchantAccountId": account, "merchantAccountApiKey": key})
    assert answer.status_code == 200, answer.get_data(as_text=True)


def test_a_new_key_typed_at_the_hidden_prompt_is_proved_and_stored_for_that_account_only(
    two: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("GATEWAY_INSTALL_API_KEY", raising=False)
    second_before = stored_key(two, SECOND)
    the_account_manager_issues(two, ACCOUNT, NEW_KEY)

    result = run_gateway(two.shop, "set-api-key", "--account", ACCOUNT, input=f"{NEW_KEY}\n")

    assert result.exit_code == 0, result.output
    assert f"Stored the new API key of {ACCOUNT} (****7f3a), encrypted" in result.stdout
    assert NEW_KEY not in result.output  # the prompt does not echo it, the answer masks it
    assert stored_key(two, ACCOUNT) == NEW_KEY
    assert stored_key(two, SECOND) == second_before
    # The shop goes on with it: the v1 configuration is asked with the stored key.
    with two.shop.app_context():
        assert get_state().v1_client(account=ACCOUNT).configuration().data.minimum_amount is not None


def test_a_key_the_gateway_refuses_is_not_stored_and_the_old_one_still_works(
    two: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_INSTALL_API_KEY", "a-key-nobody-issued-0000")

    result = run_gateway(two.shop, "set-api-key", "--account", ACCOUNT)

    assert result.exit_code == 1
    assert result.stdout == ""
    assert f"Error: the gateway refused the new API key of {ACCOUNT}" in result.stderr
    assert "the stored key is unchanged" in result.stderr
    assert "a-key-nobody-issued" not in result.output and "Traceback" not in result.output
    assert stored_key(two, ACCOUNT) == API_KEY
    with two.shop.app_context():
        assert get_state().v1_client(account=ACCOUNT).configuration().data.minimum_amount is not None


def test_the_key_is_never_an_option_and_an_unknown_account_is_one_line(
    two: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GATEWAY_INSTALL_API_KEY", NEW_KEY)
    as_option = run_gateway(two.shop, "set-api-key", "--account", ACCOUNT, "--api-key", NEW_KEY)
    assert as_option.exit_code == 2 and "No such option" in as_option.stderr

    unknown = run_gateway(two.shop, "set-api-key", "--account", "nope")
    assert unknown.exit_code == 1
    assert "Error: The merchant account 'nope' is not installed" in unknown.stderr
    assert stored_key(two, ACCOUNT) == API_KEY

    monkeypatch.delenv("GATEWAY_INSTALL_API_KEY")
    empty = run_gateway(two.shop, "set-api-key", "--account", ACCOUNT, input="\n")
    assert empty.exit_code == 1 and "Error: no API key given" in empty.stderr
    assert stored_key(two, ACCOUNT) == API_KEY


def test_the_function_keeps_the_old_key_when_the_gateway_refuses(two: Harness) -> None:
    with two.shop.app_context(), pytest.raises(AuthenticationError):
        set_api_key(ACCOUNT, "a-key-nobody-issued-0000")
    assert stored_key(two, ACCOUNT) == API_KEY
    with two.shop.app_context(), pytest.raises(ValueError, match="empty"):
        set_api_key(ACCOUNT, "   ")
