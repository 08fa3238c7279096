"""``flask gateway ...`` through a test runner that keeps stderr apart from stdout, on every click; and a
second merchant account installed beside the harness's (the several-accounts tests).

Every command prints one line to stderr first (what it uses: the database, the gateway, the account),
so a test reads a command's own answer from ``result.stdout`` and that line from ``result.stderr``.
click 8.1 mixes the two unless told (``mix_stderr=False``); click 8.2 and later always keep them apart
(``result.output`` is then both, interleaved) and no longer take the argument.
"""

from __future__ import annotations

from typing import Any

from click.testing import Result
from flask import Flask
from flask.testing import FlaskCliRunner

from flask_gateway import create_checkout
from flask_gateway.payments.installation import InstallSettings, install
from flask_gateway.state import get_state
from tests.extension.conftest import SHOP_URL, Harness, sample_order


def cli_runner(app: Flask) -> FlaskCliRunner:
    try:
        return app.test_cli_runner(mix_stderr=False)
    except TypeError:  # click >= 8.2: stderr is always kept apart
        return app.test_cli_runner()


def run_gateway(app: Flask, *args: str, **kwargs: Any) -> Result:
    """``flask gateway ARGS`` in ``app``."""
    return cli_runner(app).invoke(args=["gateway", *args], **kwargs)


# --- a second merchant account (issue 27) ------------------------------------------------------------------

#: The second merchant account the several-accounts tests install beside the harness's ``demo-merchant``.
SECOND = "second-brand"


def install_account(harness: Harness, account: str = SECOND, *, minimum: int = 100) -> None:
    """Issue ``account`` on the emulator (as its account manager would) and install it on the shop beside
    the accounts installed before, with its own callback path. It becomes the shop's default account (the
    newest one still open): a test names the account of every checkout it creates."""
    api_key = f"{account}-api-key"
    answer = harness.emulator.control(
        "accounts", {"merchantAccountId": account, "merchantAccountApiKey": api_key}
    )
    assert answer.status_code in (200, 201), answer.get_data(as_text=True)
    with harness.shop.app_context():
        install(
            InstallSettings(
                merchant_account_id=account,
                api_key=api_key,
                callback_url=f"{SHOP_URL}/gateway/callback/{account}",
                callback_failures_email=None,
                minimum_cents=minimum,
                maximum_cents=10_000_000,
            )
        )


def checkout_of(harness: Harness, account: str, reference: str) -> tuple[int, str]:
    """A new checkout of ``account`` (created through the extension): its id and token."""
    with harness.shop.app_context():
        checkout = create_checkout(sample_order(reference), account=account)
        assert checkout.token is not None and checkout.merchant_account_id == account
        return checkout.id, checkout.token


def break_signing_key(harness: Harness, account: str, key: str = "not-the-key-the-gateway-issued") -> None:
    """Store a signing key the gateway never issued for ``account``: the gateway refuses its calls (401)."""
    with harness.shop.app_context():
        state = get_state()
        installation = state.require_installation(account)
        installation.signing_key_encrypted = state.box.encrypt(key)
        state.session.commit()
