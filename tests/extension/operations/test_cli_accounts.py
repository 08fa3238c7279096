"""``flask gateway ...`` with several merchant accounts (issue 27): the line naming every account, ``accounts``
(list, ``--json``, ``retire``, ``reopen``), ``install`` (the API key from the environment or a hidden prompt,
never echoed), ``--account`` on reconcile, status, check-settings, callbacks and outbox, and bad input (an
account not installed, no API key) as one line and a non-zero exit, never a traceback."""

from __future__ import annotations

import dataclasses
import json
import logging
from typing import Any

import pytest
from sqlalchemy import select

from flask_gateway.models import GatewayCheckout, Installation
from flask_gateway.operations.checks import install_warnings
from flask_gateway.operations.cli import EXIT_CONFIGURATION, describe_database
from flask_gateway.operations.cli.accounts import API_KEY_VARIABLE, DEVELOPMENT_ADDRESS
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.extension.conftest import ACCOUNT, API_KEY, EMULATOR_URL, SHOP_URL, Harness, build_harness
from tests.extension.operations.cli_support import (
    SECOND,
    break_signing_key,
    checkout_of,
    install_account,
    run_gateway,
)
from tests.extension.operations.operations_support import load

#: What an unknown account's error line says: the id asked for and the installed ones.
UNKNOWN = (
    "Error: The merchant account 'nope' is not installed for the emulator environment "
    f"(installed: {ACCOUNT}, {SECOND})."
)


@pytest.fixture
def two(harness: Harness) -> Harness:
    """The harness's account and a second one, both installed (the second is the default)."""
    harness.install()
    install_account(harness)
    return harness


def invoke(harness: Harness, *args: str, **kwargs: Any):
    return run_gateway(harness.shop, *args, **kwargs)


def first_line(result: Any) -> str:
    return str(result.stderr.splitlines()[0])


def refused_one_line(result: Any, expected: str = UNKNOWN) -> None:
    """Exit status 1, the preamble and one error line on stderr, nothing on stdout, no traceback."""
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().splitlines()[1:] == [expected]
    assert result.stdout == ""
    assert "Traceback" not in result.output


# --- the line saying what a command uses ---------------------------------------------------------------


@pytest.mark.backends
def test_the_first_line_names_every_account_the_default_and_the_retired(two: Harness) -> None:
    with two.shop.app_context():
        database = describe_database(two.db.engine.url)
    result = invoke(two, "callbacks")
    assert first_line(result) == (
        f"Using database {database}, gateway emulator at {EMULATOR_URL}, accounts {ACCOUNT}, {SECOND} (default)."
    )
    assert invoke(two, "accounts", "retire", SECOND).exit_code == 0
    assert first_line(invoke(two, "callbacks")).endswith(
        f", accounts {ACCOUNT} (default), {SECOND} (retired)."
    )
    assert invoke(two, "accounts", "retire", ACCOUNT).exit_code == 0
    # Every account retired: still installed (their checkouts go on), so scheduled commands still run.
    none_open = invoke(two, "reconcile", "--quiet")
    assert none_open.exit_code == 0, none_open.output
    assert first_line(none_open).endswith(f", accounts {ACCOUNT} (retired), {SECOND} (retired).")


def test_one_account_reads_as_before(harness: Harness) -> None:
    harness.install()
    result = invoke(harness, "accounts")
    assert first_line(result).endswith(f", account {ACCOUNT}.")
    assert result.stdout.splitlines()[0] == ACCOUNT  # the only account: no "(default)" to tell apart


# --- accounts -------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_accounts_lists_each_account_and_its_open_checkouts(two: Harness) -> None:
    for n in range(2):
        checkout_of(two, SECOND, f"B-{n}")
    checkout_of(two, ACCOUNT, "A-1")
    result = invoke(two, "accounts")
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == ACCOUNT and lines[7] == f"{SECOND} (default)"
    assert lines[1] == "  state            open"
    assert lines[3] == "  limits           R 1.00 to R 100 000.00 (100 to 10000000 cents)"
    assert lines[4] == f"  callback URL     {SHOP_URL}/gateway/callback"
    assert lines[6] == "  open checkouts   1"
    assert lines[11] == f"  callback URL     {SHOP_URL}/gateway/callback/{SECOND}"
    assert lines[13] == "  open checkouts   2"

    as_json = invoke(two, "accounts", "--json")
    assert as_json.exit_code == 0, as_json.output
    accounts = json.loads(as_json.stdout)
    assert [(a["account"], a["default"], a["state"], a["open_checkouts"]) for a in accounts] == [
        (ACCOUNT, False, "open", 1),
        (SECOND, True, "open", 2),
    ]
    assert set(accounts[0]) == {
        "account",
        "default",
        "state",
        "retired_at",
        "installed_at",
        "minimum_cents",
        "maximum_cents",
        "callback_url",
        "callback_failures_email",
        "open_checkouts",
    }
    assert (accounts[1]["minimum_cents"], accounts[1]["maximum_cents"]) == (100, 10_000_000)
    with two.shop.app_context():
        state = get_state()
        secrets = [
            state.box.decrypt(value)
            for row in state.installations()
            for value in (row.api_key_encrypted, row.signing_key_encrypted)
        ]
    for secret in secrets:  # neither key, nor its end
        assert secret[-6:] not in result.output and secret[-6:] not in as_json.output


@pytest.mark.backends
def test_retire_and_reopen(two: Harness) -> None:
    checkout_of(two, SECOND, "B-1")
    retired = invoke(two, "accounts", "retire", SECOND)
    assert retired.exit_code == 0, retired.output
    assert retired.stdout.splitlines() == [
        f"Retired merchant account {SECOND}: it takes no new checkouts; its 1 open checkout(s), refunds and "
        "callbacks go on with its keys.",
        f"The default account is {ACCOUNT}.",
    ]
    with two.shop.app_context():
        assert get_state().require_installation(SECOND).retired
    again = invoke(two, "accounts", "retire", SECOND)
    assert again.exit_code == 0 and again.stdout.startswith(f"Merchant account {SECOND} was retired already")
    listed = json.loads(invoke(two, "accounts", "--json").stdout)
    assert [(a["account"], a["state"], a["default"]) for a in listed] == [
        (ACCOUNT, "open", True),
        (SECOND, "retired", False),
    ]
    assert listed[1]["retired_at"] is not None
    last = invoke(two, "accounts", "retire", ACCOUNT)
    assert last.stdout.splitlines()[-1] == (
        "No account is open now: new checkouts are refused until one is reopened or installed."
    )
    reopened = invoke(two, "accounts", "reopen", SECOND)
    assert reopened.exit_code == 0, reopened.output
    assert reopened.stdout.splitlines() == [
        f"Reopened merchant account {SECOND}: it takes new checkouts again.",
        f"The default account is {SECOND}.",
    ]
    assert invoke(two, "accounts", "reopen", SECOND).stdout.startswith(f"Merchant account {SECOND} is open")


def test_retire_or_reopen_an_unknown_account(two: Harness) -> None:
    refused_one_line(invoke(two, "accounts", "retire", "nope"))
    refused_one_line(invoke(two, "accounts", "reopen", "nope"))
    assert invoke(two, "accounts", "retire").exit_code == 2  # the ID is required (click's usage error)


@pytest.mark.backends
@pytest.mark.parametrize("account", ["x" * 5000, "a\x00b", " ", "demo-merchant "])
def test_an_account_no_installed_one_can_be_is_one_line(two: Harness, account: str) -> None:
    """Too long for the column, a NUL (PostgreSQL refuses it even as a parameter), a space, a near miss."""
    for command in ("reconcile", "status", "check-settings", "callbacks", "outbox"):
        args = [command, "tok-1"] if command == "status" else [command]
        result = invoke(two, *args, "--account", account)
        assert result.exit_code == 1, (command, result.output)
        [line] = result.stderr.strip().splitlines()[1:]
        assert line.startswith("Error: The merchant account ") and line.endswith(
            f"is not installed for the emulator environment (installed: {ACCOUNT}, {SECOND})."
        )
        assert "Traceback" not in result.output and result.stdout == ""


def test_accounts_before_any_installation(harness: Harness) -> None:
    result = invoke(harness, "accounts")
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "No merchant account is installed for the emulator environment."
    assert json.loads(invoke(harness, "accounts", "--json").stdout) == []
    retire = invoke(harness, "accounts", "retire", ACCOUNT)
    assert retire.exit_code == EXIT_CONFIGURATION  # nothing installed: refused before it starts


# --- install --------------------------------------------------------------------------------------------

THIRD = "third-brand"
THIRD_KEY = "third-brand-api-key-7f3a"


def issue(harness: Harness, account: str = THIRD, api_key: str = THIRD_KEY) -> None:
    """The account manager issues ``account`` on the emulator."""
    answer = harness.emulator.control(
        "accounts", {"merchantAccountId": account, "merchantAccountApiKey": api_key}
    )
    assert answer.status_code in (200, 201)


def install_args(account: str = THIRD, *extra: str) -> list[str]:
    return ["install", "--account", account, "--minimum-cents", "5000", "--maximum-cents", "2000000", *extra]


@pytest.mark.backends
def test_install_reads_the_api_key_from_the_environment_and_never_shows_it(
    two: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    issue(two)
    monkeypatch.setenv(API_KEY_VARIABLE, THIRD_KEY)
    caplog.set_level(logging.DEBUG)
    result = invoke(two, *install_args(THIRD, "--email", "ops@shop.example"))
    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == (
        f"Installed merchant account {THIRD} (emulator): the signing key is stored encrypted. Callbacks go "
        f"to {SHOP_URL}/gateway/callback/{THIRD}. The default account is {THIRD}."
    )
    with two.shop.app_context():
        state = get_state()
        row = state.require_installation(THIRD)
        assert (row.minimum_cents, row.maximum_cents, row.callback_failures_email) == (
            5000,
            2_000_000,
            "ops@shop.example",
        )
        assert state.box.decrypt(row.api_key_encrypted) == THIRD_KEY
        signing_key = state.box.decrypt(row.signing_key_encrypted)
        assert [r.merchant_account_id for r in state.installations()] == [ACCOUNT, SECOND, THIRD]
    logged = "\n".join(record.getMessage() for record in caplog.records)
    for secret in (THIRD_KEY, signing_key):
        assert secret not in result.output and secret not in logged
    # The new account pays: its key works.
    checkout_of(two, THIRD, "C-1")


def test_install_asks_for_the_api_key_with_hidden_input(
    two: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    issue(two)
    monkeypatch.delenv(API_KEY_VARIABLE, raising=False)
    result = invoke(
        two, *install_args(THIRD, "--callback-url", f"{SHOP_URL}/payments/callback"), input=f"{THIRD_KEY}\n"
    )
    assert result.exit_code == 0, result.output
    assert f"API key of {THIRD} (input hidden):" in result.stderr
    assert THIRD_KEY not in result.output  # not echoed
    with two.shop.app_context():
        assert get_state().require_installation(THIRD).callback_url == f"{SHOP_URL}/payments/callback"


def test_install_without_an_api_key_sends_nothing(two: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    issue(two)
    monkeypatch.delenv(API_KEY_VARIABLE, raising=False)
    result = invoke(two, *install_args(), input="")
    assert result.exit_code == 1, result.output
    # The end of the input answers the prompt (Click before 8.2 ends the prompt's line with no newline).
    assert result.stderr.strip().endswith(
        f"Error: no API key given: type it at the prompt, or set {API_KEY_VARIABLE} in the environment "
        "(never as an option: it would stay in the shell's history)."
    )
    assert "Traceback" not in result.output
    assert invoke(two, *install_args(), "--api-key", THIRD_KEY).exit_code == 2  # no such option
    with two.shop.app_context():
        assert get_state().installation(THIRD) is None


def test_install_bad_input(two: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    issue(two)
    monkeypatch.setenv(API_KEY_VARIABLE, "not-the-key")
    refused = invoke(two, *install_args())
    assert refused.exit_code == 1, refused.output
    assert (
        refused.stderr.strip()
        .splitlines()[-1]
        .startswith("Error: the gateway refused the merchant account id or API key (")
    )
    assert "not-the-key" not in refused.output
    monkeypatch.setenv(API_KEY_VARIABLE, THIRD_KEY)
    already = invoke(two, *install_args(SECOND))
    assert already.exit_code == 1
    assert (
        already.stderr.strip()
        .splitlines()[-1]
        .startswith(
            f"Error: the merchant account {SECOND} is installed here already: change its settings on "
        )
    )
    upside_down = invoke(
        two, "install", "--account", THIRD, "--minimum-cents", "900", "--maximum-cents", "100"
    )
    assert (
        upside_down.exit_code == 2
        and "--minimum-cents (900) is more than --maximum-cents (100)" in upside_down.stderr
    )
    not_a_url = invoke(two, *install_args(THIRD, "--callback-url", "not a url"))
    assert (
        not_a_url.exit_code == 1
        and "Error: the settings were not sent: checkoutStatusCallbackUrl" in not_a_url.stderr
    )
    bad_email = invoke(two, *install_args(THIRD, "--email", "nobody"))
    assert bad_email.exit_code == 1 and "callbackFailuresEmail" in bad_email.stderr
    assert invoke(two, "install", "--account", THIRD).exit_code == 2  # the limits are required
    with two.shop.app_context():
        assert get_state().installation(THIRD) is None  # nothing stored by any of them


def test_installing_the_first_account_by_command_line(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(API_KEY_VARIABLE, API_KEY)
    result = invoke(harness, *install_args(ACCOUNT))
    assert result.exit_code == 0, result.output
    assert f"Callbacks go to {SHOP_URL}/gateway/callback. The default account is {ACCOUNT}." in result.stdout
    assert first_line(invoke(harness, "accounts")).endswith(f", account {ACCOUNT}.")


def test_install_warns_in_the_install_screens_words(two: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command prints what the install screen shows for the same callback URL (one source:
    install_warnings), and nothing for the account's own path, nor for a local URL the emulator reaches."""
    issue(two)
    monkeypatch.setenv(API_KEY_VARIABLE, THIRD_KEY)
    elsewhere = "https://other.example/gateway/callback"
    result = invoke(two, *install_args(THIRD, "--callback-url", elsewhere))
    assert result.exit_code == 0, result.output
    with two.shop.test_request_context(base_url=SHOP_URL):
        (shown,) = install_warnings(elsewhere, THIRD)
    own = f"{SHOP_URL}/gateway/callback/{THIRD}"
    assert shown.kind == "callback-mismatch" and shown.detail == own.rsplit("/", 1)[0]
    assert f"Warning: {shown.summary} {shown.advice}" in result.stderr.splitlines()
    with two.shop.test_request_context(base_url=SHOP_URL):
        assert install_warnings(own, THIRD) == []
        local = install_warnings("http://127.0.0.1:5000/gateway/callback", THIRD)
    # The harness's gateway (http://emulator.test) is not on this machine: it cannot reach a local address.
    assert [w.kind for w in local] == ["unreachable-callback", "callback-mismatch"]


def test_plain_http_in_production_says_use_https_before_anything_is_installed(two: Harness) -> None:
    with two.shop.test_request_context(base_url=SHOP_URL), pytest.MonkeyPatch.context() as patch:
        state = get_state()
        patch.setattr(state, "config", dataclasses.replace(state.config, environment="production"))
        warnings = install_warnings("http://shop.example/gateway/callback", "brand-new")
    kinds = [warning.kind for warning in warnings]
    assert kinds[0] == "insecure-callback", kinds
    insecure = warnings[0]
    assert insecure.summary == (
        "The callback URL http://shop.example/gateway/callback is plain http: in production the callbacks "
        "must use https."
    )
    assert insecure.advice == f"Use an https address ({SHOP_URL}/gateway/callback)."


def test_install_without_a_public_url_uses_flask_runs_address_in_development(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The install screen takes the address it is opened with; the command, with none, says which it uses
    (flask run's) instead of refusing. A production callback URL is never guessed."""
    harness = build_harness(databases, monkeypatch, GATEWAY_PUBLIC_URL=None)
    monkeypatch.setenv(API_KEY_VARIABLE, API_KEY)
    result = invoke(harness, *install_args(ACCOUNT))
    assert result.exit_code == 0, result.output
    assert (
        f"GATEWAY_PUBLIC_URL is not set: the callback URL is on {DEVELOPMENT_ADDRESS}, where flask run serves "
        "by default" in " ".join(result.stderr.split())
    )
    assert f"Callbacks go to {DEVELOPMENT_ADDRESS}/gateway/callback." in result.stdout
    with harness.shop.app_context():
        assert (
            get_state().require_installation(ACCOUNT).callback_url
            == f"{DEVELOPMENT_ADDRESS}/gateway/callback"
        )


# --- --account on the commands that act on checkouts -----------------------------------------------------


@pytest.mark.backends
def test_reconcile_every_account_with_one_failing_and_one_account_only(two: Harness) -> None:
    two.emulator.control("faults", {"operation": "callback", "kind": "callback_fail"})
    paid_id, paid_token = checkout_of(two, ACCOUNT, "A-1")
    assert two.emulator.pay(paid_token).status_code == 200
    checkout_of(two, SECOND, "B-1")
    break_signing_key(two, SECOND)

    result = invoke(two, "reconcile", "--older-than", "0", "--quiet")
    assert result.exit_code == 1, result.output  # a checkout could not be polled
    assert "Per account:" in result.stdout
    assert (
        f"  {ACCOUNT}: polled 1 of 1 due, 1 changed, 1 payment(s) confirmed, 0 expired, 0 failed."
        in result.stdout
    )
    assert (
        f"  {SECOND} (default): polled 0 of 1 due" in result.stdout
        and "STOPPED: the gateway refused" in result.stdout
    )
    with two.shop.app_context():
        assert load(two, paid_id).status == "PAID_PENDING_CALLBACK"  # found despite the other account

    with two.shop.app_context():
        get_state().session.execute(
            GatewayCheckout.__table__.update().values(last_polled_at=None)  # type: ignore[attr-defined]
        )
        get_state().session.commit()
    only = invoke(two, "reconcile", "--older-than", "0", "--quiet", "--account", ACCOUNT)
    assert only.exit_code == 0, only.output
    assert only.stdout.startswith("Polled 1 of 1 due checkout(s)") and "Per account:" not in only.stdout
    refused_one_line(invoke(two, "reconcile", "--account", "nope"))


@pytest.mark.backends
def test_status_asks_with_the_checkouts_own_account(two: Harness) -> None:
    checkout_id, token = checkout_of(two, ACCOUNT, "A-1")  # not the default account
    result = invoke(two, "status", token)
    assert result.exit_code == 0, result.output
    assert f"merchant account {ACCOUNT}" in result.stdout
    assert "checkoutPaymentStatus            PENDING_ORDER" in result.stdout
    refreshed = invoke(two, "status", token, "--refresh")
    assert refreshed.exit_code == 0 and "Refreshed: PENDING_ORDER -> PENDING_ORDER" in refreshed.stdout
    mismatch = invoke(two, "status", token, "--account", SECOND)
    refused_one_line(
        mismatch,
        f"Error: checkout {token} belongs to the merchant account {ACCOUNT}, not {SECOND}: a checkout is asked "
        "about with its own account (leave --account out).",
    )
    refused_one_line(invoke(two, "status", token, "--account", "nope"))
    # A token with no local checkout: the account named, else the default one.
    with two.shop.app_context():
        get_state().session.execute(
            GatewayCheckout.__table__.update()  # type: ignore[attr-defined]
            .where(GatewayCheckout.id == checkout_id)
            .values(token="elsewhere")
        )
        get_state().session.commit()
    named = invoke(two, "status", token, "--account", ACCOUNT, "--gateway-only")
    assert named.exit_code == 1  # no local checkout
    assert f"No local checkout has token {token}." in named.stdout
    assert "checkoutPaymentStatus            PENDING_ORDER" in named.stdout  # the gateway answered
    default = invoke(two, "status", token, "--gateway-only")  # asked as the default account: not its own
    assert default.exit_code == 1 and "The gateway could not be asked: getstatus: HTTP " in default.stderr
    unasked = invoke(two, "status", token)  # without --gateway-only: not asked at all (issue 28)
    assert unasked.exit_code == 1 and "getstatus" not in unasked.output


@pytest.mark.backends
def test_check_settings_every_account_and_one(two: Harness) -> None:
    agreed = invoke(two, "check-settings")
    assert agreed.exit_code == 0, agreed.output
    assert agreed.stdout.splitlines() == [
        f"{ACCOUNT}: The gateway's settings are the shop's (callback URL, e-mail, limits, signing key).",
        f"{SECOND} (default): The gateway's settings are the shop's (callback URL, e-mail, limits, signing key).",
    ]
    with two.shop.app_context():
        get_state().require_installation(ACCOUNT).minimum_cents = 4242
        get_state().session.commit()
    differs = invoke(two, "check-settings", "--no-repair")  # only compared: the difference stays (#29)
    assert differs.exit_code == 1
    assert f"{ACCOUNT}: The gateway's settings differ from the shop's:" in differs.stdout
    assert "4242" in differs.stdout
    assert f"{SECOND} (default): The gateway's settings are the shop's" in differs.stdout
    assert differs.stderr.strip().splitlines()[-1] == f"Not the shop's, or not checked: {ACCOUNT}."
    one = invoke(two, "check-settings", "--account", SECOND)
    assert one.exit_code == 0, one.output
    assert one.stdout.splitlines()[0] == f"Merchant account {SECOND}:"
    assert invoke(two, "check-settings", "--account", ACCOUNT, "--no-repair").exit_code == 1
    break_signing_key(two, SECOND)  # the gateway refuses that account: the other is still checked
    broken = invoke(two, "check-settings", "--no-repair")
    assert broken.exit_code == 1
    assert f"{SECOND} (default): could not be checked: " in broken.stdout
    assert f"{ACCOUNT}: The gateway's settings differ" in broken.stdout
    refused_one_line(invoke(two, "check-settings", "--account", "nope"))


@pytest.mark.backends
def test_callbacks_and_outbox_by_account(two: Harness) -> None:
    first_id, first_token = checkout_of(two, ACCOUNT, "A-1")
    second_id, second_token = checkout_of(two, SECOND, "B-1")
    for token in (first_token, second_token):
        assert two.emulator.pay(token).status_code == 200
    assert two.emulator.control("deliver").status_code == 200
    with two.shop.app_context():
        assert load(two, first_id).status == load(two, second_id).status == "PAID"

    every = invoke(two, "callbacks")
    assert every.exit_code == 0, every.output
    lines = every.stdout.strip().splitlines()
    assert len(lines) == 2
    assert {line.split("account ")[1].split()[0] for line in lines} == {ACCOUNT, SECOND}
    mine = invoke(two, "callbacks", "--account", SECOND).stdout.strip().splitlines()
    assert len(mine) == 1 and f"account {SECOND}" in mine[0] and "  order B-1: " in mine[0]
    refused_one_line(invoke(two, "callbacks", "--account", "nope"))

    outbox = invoke(two, "outbox", "--state", "delivered", "--account", ACCOUNT)
    assert outbox.exit_code == 0, outbox.output
    rows = outbox.stdout.strip().splitlines()
    assert rows and all(f"account {ACCOUNT}  order A-1" in row for row in rows)
    every_event = invoke(two, "outbox", "--state", "delivered").stdout
    assert "order B-1" in every_event and "order A-1" in every_event
    assert invoke(two, "outbox", "--account", SECOND).stdout.strip() == (
        f"No outbox events pending or dead of account {SECOND}."
    )
    refused_one_line(invoke(two, "outbox", "--account", "nope"))


def test_a_shop_with_one_account_sees_no_account_in_the_lines(harness: Harness) -> None:
    harness.install()
    _, token = checkout_of(harness, ACCOUNT, "A-1")
    harness.emulator.pay(token)
    harness.emulator.control("deliver")
    lines = invoke(harness, "callbacks").stdout.strip().splitlines()
    assert len(lines) == 1 and "account " not in lines[0]
    assert "account " not in invoke(harness, "outbox", "--state", "delivered").stdout
    assert invoke(harness, "check-settings").stdout.startswith("The gateway's settings are the shop's")


def test_every_account_retired_can_still_be_checked(two: Harness) -> None:
    invoke(two, "accounts", "retire", ACCOUNT)
    invoke(two, "accounts", "retire", SECOND)
    result = invoke(two, "check-settings")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0].startswith(
        f"{ACCOUNT} (retired): The gateway's settings are the shop's"
    )
    with two.shop.app_context():
        rows = get_state().session.scalars(select(Installation).order_by(Installation.id)).all()
        assert all(row.settings_checked_at is not None for row in rows)
