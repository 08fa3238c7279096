"""Demo auto-install (``SHOP_AUTO_INSTALL=1``): install the gateway at startup when it is not installed.

Uses ``flask_gateway.installation.install`` as a setup script would. Never fatal: whatever happens is
logged with what to do, and the shop starts; the owner can always install from ``/gateway/admin/install``.

Every worker process of a server (``gunicorn -w 4``) runs it at start: one installs, and the gateway tells
the others the account is installed already. Before reporting that as an account installed elsewhere, a
process waits a moment for its sibling's installation to appear in the shared database.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Final

from flask import Flask

from example_shop.extensions import db
from flask_gateway import (
    AlreadyInstalledError,
    AuthenticationError,
    GatewayConnectionError,
    GatewayError,
    GatewayServerError,
    InstallSettings,
    install,
    payment_limits,
)

__all__ = ["auto_install"]

log = logging.getLogger("example_shop.setup")

#: Pauses (seconds) while waiting for another process of this shop to save the installation it just made.
SIBLING_WAITS: Final = (0.1, 0.2, 0.4, 0.8, 1.5)


def _installed(app: Flask) -> bool:
    """Whether this shop has an installation (the extension's public ``payment_limits``)."""
    return payment_limits() is not None


def _installed_by_a_sibling(app: Flask, pause: Callable[[float], None]) -> bool:
    """The gateway knows the account: True when this shop's installation appears meanwhile (another worker
    process installed it a moment ago and is saving it)."""
    for delay in (0.0, *SIBLING_WAITS):
        if delay:
            pause(delay)
        db.session.rollback()  # a fresh read, and no transaction (SQLite: no write lock) while waiting
        if _installed(app):
            return True
    return False


def auto_install(app: Flask, *, sleep: Callable[[float], None] | None = None) -> str:
    """Install the gateway for ``app`` if needed; returns what happened (also logged).

    ``installed``, ``already-here`` (this shop has an installation), ``already-installed`` (the gateway
    knows the account: the owner must adopt the signing key), ``unreachable``, ``refused`` or ``skipped``.
    """
    pause = sleep or time.sleep
    config = app.config
    public_url = (config.get("GATEWAY_PUBLIC_URL") or "").rstrip("/")
    if not public_url:
        log.error(
            "SHOP_AUTO_INSTALL=1 but GATEWAY_PUBLIC_URL is not set: the gateway's callback URL is built on "
            "it. Set GATEWAY_PUBLIC_URL to the shop's address (e.g. http://127.0.0.1:5000), or install "
            "from /gateway/admin/install. The shop starts without the payment option."
        )
        return "skipped"
    settings = InstallSettings(
        merchant_account_id=config["SHOP_GATEWAY_ACCOUNT"],
        api_key=config["SHOP_GATEWAY_API_KEY"],
        callback_url=f"{public_url}/gateway/callback",
        callback_failures_email=None,
        minimum_cents=config["SHOP_MIN_CENTS"],
        maximum_cents=config["SHOP_MAX_CENTS"],
    )
    delays = tuple(config.get("SHOP_AUTO_INSTALL_DELAYS") or ())
    with app.app_context():
        if _installed(app):
            log.info("The payment gateway is installed already; auto-install has nothing to do.")
            return "already-here"
        for attempt in range(len(delays) + 1):
            try:
                install(settings)
            except AlreadyInstalledError:
                if _installed_by_a_sibling(app, pause):
                    log.info("Auto-install: another process of this shop installed the payment gateway.")
                    return "already-here"
                log.warning(
                    "Auto-install: the gateway says account %r is already installed, so it will not send "
                    "the signing key again. Open /gateway/admin/install as the owner and enter the signing "
                    "key you received the first time to adopt it. (With the demo emulator you can also "
                    "start from scratch: POST /_emulator/reset on the emulator, then restart the shop.)",
                    settings.merchant_account_id,
                )
                return "already-installed"
            except AuthenticationError as error:
                log.error(
                    "Auto-install refused: the gateway does not accept account %r with this API key (%s). "
                    "Check SHOP_GATEWAY_ACCOUNT and SHOP_GATEWAY_API_KEY.",
                    settings.merchant_account_id,
                    error.message,
                )
                return "refused"
            except (GatewayConnectionError, GatewayServerError) as error:
                if attempt < len(delays):
                    log.info(
                        "Auto-install: the gateway is not answering yet (%s); trying again in %.1f s.",
                        error.message,
                        delays[attempt],
                    )
                    pause(delays[attempt])
                    continue
                log.error(
                    "Auto-install gave up after %d attempts: the gateway at %s does not answer (%s). The "
                    "shop starts without the payment option; start the gateway (emulator), then restart the "
                    "shop or install from /gateway/admin/install.",
                    attempt + 1,
                    config.get("GATEWAY_INSTALL_URL") or "the configured install URL",
                    error.message,
                )
                return "unreachable"
            except GatewayError as error:
                log.error(
                    "Auto-install refused by the gateway: %s. Install from /gateway/admin/install instead.",
                    error.message,
                )
                return "refused"
            log.info(
                "Auto-install: the payment gateway is installed for account %r (limits %s to %s cents, "
                "callbacks to %s).",
                settings.merchant_account_id,
                settings.minimum_cents,
                settings.maximum_cents,
                settings.callback_url,
            )
            return "installed"
    return "unreachable"  # pragma: no cover - the loop always returns
