"""Installing the gateway with the shop's settings: ``flask --app example_shop shop install``, and the
demo's auto-install (``SHOP_AUTO_INSTALL=1``) on first use.

Uses ``flask_gateway.install`` as a setup script would. Nothing here runs at import or
in ``create_app`` (a worker must boot while the database or the gateway is away):

- :func:`auto_install` installs when this shop has no installation yet (with ``SHOP_SECOND_ACCOUNT``, each of
  its two merchant accounts that is not installed yet, the second on its own callback path
  ``/gateway/callback/<id>``: example_shop/brands.py), and says what happened; the
  ``shop install`` command runs it (and waits for a gateway that is starting: ``SHOP_AUTO_INSTALL_DELAYS``);
- :func:`install_on_first_use` (``SHOP_AUTO_INSTALL=1``): the first shop request of each process runs it,
  once, without waiting on the gateway. Never fatal: whatever happens is logged with what to do and the
  request goes on. While the database or the gateway is away it tries again on a later request (at most
  every :data:`RETRY_SECONDS`); once it has an answer (installed, installed already, refused) the process
  never tries again. The owner can always install from ``/gateway/admin/install``.

Every worker process of a server (``gunicorn -w 4``) runs it on its first request: one installs, and the
gateway tells the others the account is installed already. Before reporting that as an account installed
elsewhere, a process waits a moment for its sibling's installation to appear in the shared database.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from flask import Flask, request

from example_shop.deployment import METRICS_ENDPOINT
from example_shop.extensions import db
from flask_gateway import (
    DATABASE_ERRORS,
    AlreadyInstalledError,
    AuthenticationError,
    GatewayConnectionError,
    GatewayError,
    GatewayServerError,
    InstallSettings,
    install,
    is_database_outage,
    payment_limits,
)

__all__ = ["FINAL_OUTCOMES", "RETRY_SECONDS", "auto_install", "install_on_first_use"]

log = logging.getLogger("example_shop.setup")

#: Pauses (seconds) while waiting for another process of this shop to save the installation it just made.
SIBLING_WAITS: Final = (0.1, 0.2, 0.4, 0.8, 1.5)
#: The outcomes after which trying again cannot help (the others: the gateway or the database was away).
FINAL_OUTCOMES: Final = frozenset({"installed", "already-here", "already-installed", "refused", "skipped"})
#: Least seconds between two first-use attempts of a process while the gateway or the database is away.
RETRY_SECONDS: Final = 10.0
#: The extension's blueprints (its callback, health and admin endpoints): never delayed by the install.
_GATEWAY_BLUEPRINTS: Final = frozenset({"gateway", "gateway_admin"})


def _installed(app: Flask, account: str | None = None) -> bool:
    """Whether this shop has an installation of ``account`` (None: its one account, as the extension's
    public ``payment_limits`` finds it)."""
    return payment_limits(account=account) is not None


def _installed_by_a_sibling(app: Flask, pause: Callable[[float], None], account: str | None = None) -> bool:
    """The gateway knows the account: True when this shop's installation appears meanwhile (another worker
    process installed it a moment ago and is saving it)."""
    for delay in (0.0, *SIBLING_WAITS):
        if delay:
            pause(delay)
        db.session.rollback()  # a fresh read, and no transaction (SQLite: no write lock) while waiting
        if _installed(app, account):
            return True
    return False


@dataclass(frozen=True)
class _Account:
    """One merchant account the shop installs: its settings, the variables that name it (for messages),
    and how to find its installation (None: the shop's one account, found as the default)."""

    settings: InstallSettings
    variables: str
    lookup: str | None


def _accounts(config: Mapping[str, Any], public_url: str) -> list[_Account]:
    """The second brand's account (``SHOP_SECOND_ACCOUNT``, on its own callback path), then the shop's own.

    In that order so that a shop installed from scratch has its own account as the newest open one: the
    extension's default account (its screens, the ``flask gateway`` commands without ``--account``). The
    shop's checkouts never depend on it: its account resolver always names the brand's account."""
    limits = {"minimum_cents": config["SHOP_MIN_CENTS"], "maximum_cents": config["SHOP_MAX_CENTS"]}
    second = config.get("SHOP_SECOND_ACCOUNT_ID")
    main = str(config["SHOP_GATEWAY_ACCOUNT"])
    accounts = [
        _Account(
            InstallSettings(
                merchant_account_id=main,
                api_key=config["SHOP_GATEWAY_API_KEY"],
                callback_url=f"{public_url}/gateway/callback",
                callback_failures_email=None,
                **limits,
            ),
            "SHOP_GATEWAY_ACCOUNT and SHOP_GATEWAY_API_KEY",
            # With one account, any installation is the shop's (the owner may have installed another id).
            main if second else None,
        )
    ]
    if second:
        accounts.append(
            _Account(
                InstallSettings(
                    merchant_account_id=second,
                    api_key=config["SHOP_SECOND_ACCOUNT_API_KEY"],
                    callback_url=f"{public_url}/gateway/callback/{quote(second, safe='')}",
                    callback_failures_email=None,
                    **limits,
                ),
                "SHOP_SECOND_ACCOUNT",
                second,
            )
        )
    return accounts[::-1]


#: How two accounts' outcomes combine into the one ``auto_install`` answers: the first of these that either
#: had (a failure to report or to retry wins over success).
_PRECEDENCE: Final = ("unreachable", "refused", "already-installed", "installed", "already-here")


def auto_install(
    app: Flask,
    *,
    sleep: Callable[[float], None] | None = None,
    delays: Sequence[float] | None = None,
) -> str:
    """Install the gateway for ``app`` if needed; returns what happened (also logged).

    ``installed``, ``already-here`` (this shop has an installation), ``already-installed`` (the gateway
    knows the account: the owner must adopt the signing key), ``unreachable``, ``refused`` or ``skipped``.
    With a second account (``SHOP_SECOND_ACCOUNT``) each account is installed in turn (the second brand's
    first: :func:`_accounts`), and the answer is the more telling of the two (``unreachable`` before a
    refusal before ``installed`` before ``already-here``). ``delays``: the pauses between attempts while
    the gateway does not answer (``SHOP_AUTO_INSTALL_DELAYS`` by default). A database error is raised (the
    caller decides: the command reports it, the first-use hook tries again later); the gateway is never
    asked while the database is away.
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
    if delays is None:
        delays = tuple(config.get("SHOP_AUTO_INSTALL_DELAYS") or ())
    outcomes = []
    with app.app_context():
        for account in _accounts(config, public_url):
            outcomes.append(_install_one(app, account, delays, pause))
    return next(outcome for outcome in _PRECEDENCE if outcome in outcomes)


def _install_one(
    app: Flask, account: _Account, delays: Sequence[float], pause: Callable[[float], None]
) -> str:
    settings = account.settings
    config = app.config
    if _installed(app, account.lookup):
        log.info(
            "The payment gateway is installed already for account %r; auto-install has nothing to do.",
            settings.merchant_account_id,
        )
        return "already-here"
    for attempt in range(len(delays) + 1):
        try:
            install(settings)
        except AlreadyInstalledError:
            if _installed_by_a_sibling(app, pause, account.lookup):
                log.info(
                    "Auto-install: another process of this shop installed the payment gateway for "
                    "account %r.",
                    settings.merchant_account_id,
                )
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
                "Check %s.",
                settings.merchant_account_id,
                error.message,
                account.variables,
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
                "Auto-install gave up after %d attempt(s): the gateway at %s does not answer (%s). The "
                "shop runs without the payment option meanwhile; start the gateway (emulator): the shop "
                "tries again on a later request, or install with 'flask --app example_shop shop "
                "install' or from /gateway/admin/install.",
                attempt + 1,
                config.get("GATEWAY_INSTALL_URL") or "the configured install URL",
                error.message,
            )
            return "unreachable"
        except GatewayError as error:
            log.error(
                "Auto-install refused by the gateway for account %r: %s. Install from "
                "/gateway/admin/install instead.",
                settings.merchant_account_id,
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


def now() -> float:
    """The clock of the first-use retries (tests replace it)."""
    return time.monotonic()


class _FirstUse:
    """One process's auto-install: not yet, in progress (one thread), or done."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.done = False
        self.next_try = float("-inf")


def install_on_first_use(app: Flask) -> None:
    """``SHOP_AUTO_INSTALL=1``: run :func:`auto_install` before the first shop request of this process, and
    again on later requests until it had an answer (see the module). Static files and the extension's
    endpoints (its health checks above all) never wait for it; a request that arrives while another thread
    installs goes on without waiting."""
    state = _FirstUse()

    def install_before_request() -> None:
        if (
            state.done
            or request.endpoint in ("static", METRICS_ENDPOINT)
            or request.blueprint in _GATEWAY_BLUEPRINTS
        ):
            return
        if now() < state.next_try or not state.lock.acquire(blocking=False):
            return
        try:
            if not state.done:
                state.done = _attempt(app)
                if not state.done:
                    state.next_try = now() + RETRY_SECONDS
        finally:
            state.lock.release()

    app.before_request(install_before_request)


def _attempt(app: Flask) -> bool:
    """One auto-install without pauses (a shopper's request is waiting); True when it had an answer."""
    try:
        outcome = auto_install(app, delays=())
    except DATABASE_ERRORS as error:
        if not is_database_outage(error):
            log.error(
                "Auto-install could not read the shop's database (%s): are the tables there? Run 'flask "
                "--app example_shop shop init-db'. It tries again on a later request.",
                error.__class__.__name__,
            )
        # An outage: the request itself meets it and answers 503 (logged once); try again later.
        return False
    except Exception:  # never fatal: the shop serves without the payment option meanwhile
        log.exception("Auto-install failed; it tries again on a later request.")
        return False
    return outcome in FINAL_OUTCOMES
