"""Two merchant accounts in one shop (issue 27), for the *_accounts.py tests: the harness's account
(``ACCOUNT``, installed first) and ``OTHER``, created on the emulator through its control API and installed
second (so it is the default account for new checkouts), with its own callback path."""

from __future__ import annotations

from flask_gateway import create_checkout
from flask_gateway.payments.installation import InstallSettings, install
from tests.extension.conftest import ACCOUNT, SHOP_URL, Harness, sample_order

OTHER = "second-brand"
OTHER_KEY = "second-brand-api-key"

__all__ = ["ACCOUNT", "OTHER", "OTHER_KEY", "checkout_of", "install_both", "install_other"]


def install_other(harness: Harness, account: str = OTHER, api_key: str = OTHER_KEY) -> None:
    """Issue ``account`` on the emulator (as the account manager would) and install it in the shop."""
    made = harness.emulator.control(
        "accounts", {"merchantAccountId": account, "merchantAccountApiKey": api_key}
    )
    assert made.status_code in (200, 201), made.get_data(as_text=True)
    with harness.shop.app_context():
        install(
            InstallSettings(
                merchant_account_id=account,
                api_key=api_key,
                callback_url=f"{SHOP_URL}/gateway/callback/{account}",
                callback_failures_email=None,
                minimum_cents=100,
                maximum_cents=10_000_000,
            )
        )


def install_both(harness: Harness) -> Harness:
    harness.install()
    install_other(harness)
    return harness


def checkout_of(harness: Harness, account: str, reference: str) -> tuple[int, str]:
    """A checkout of ``account`` created through the extension: its id and token."""
    with harness.shop.app_context():
        checkout = create_checkout(sample_order(reference), account=account)
        assert checkout.merchant_account_id == account
        assert checkout.token is not None
        return checkout.id, checkout.token


def paid_by(harness: Harness, account: str, reference: str) -> tuple[int, str]:
    """A checkout of ``account`` the shopper paid at the gateway; the shop has heard nothing yet."""
    checkout_id, token = checkout_of(harness, account, reference)
    assert harness.emulator.pay(token).status_code == 200
    return checkout_id, token
