"""``flask gateway accounts [--json]``, ``accounts retire ID``, ``accounts reopen ID``, ``install`` and
``set-api-key``: the merchant accounts installed in this shop, closing one for new checkouts, installing one
from a terminal, and storing the new API key the account manager issued for one.

The API key ``install`` and ``set-api-key`` send is read from the environment variable
``GATEWAY_INSTALL_API_KEY`` or from a prompt with hidden input, never from an option (it would stay in the
shell's history and show in ``ps``); it is never echoed or logged, nor is the signing key the gateway
answers (stored encrypted, as the install screen stores it).
"""

from __future__ import annotations

import json
import logging
import os
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Final

import click
from flask import current_app
from flask.cli import with_appcontext
from pydantic import ValidationError as ModelValidationError

from flask_gateway.core.errors import (
    AlreadyInstalledError,
    AuthenticationError,
    GatewayConnectionError,
    GatewayError,
    GatewayServerError,
)
from flask_gateway.errors import SecretUnreadable, UnknownAccountError
from flask_gateway.models import Installation
from flask_gateway.operations.checks import install_warnings
from flask_gateway.operations.cli.group import checked, gateway_cli, installed_account, when
from flask_gateway.payments.accounts import open_checkouts, reopen_account, retire_account
from flask_gateway.payments.installation import InstallSettings, install, set_api_key
from flask_gateway.secrets import mask
from flask_gateway.state import get_state
from flask_gateway.urls import callback_url as shop_callback_url
from flask_gateway.urls import external_url

__all__ = ["API_KEY_VARIABLE"]

#: Where ``flask gateway install`` reads the API key from when it is set (else it asks, input hidden).
API_KEY_VARIABLE: Final = "GATEWAY_INSTALL_API_KEY"

#: The admin's logger: installing, retiring and reopening an account are the owner's actions, here from a
#: terminal instead of the screens.
_log = logging.getLogger("flask_gateway.admin")


def _default_account() -> str | None:
    installation = get_state().installation()
    return installation.merchant_account_id if installation is not None else None


def _described(installation: Installation, default: str | None) -> dict[str, Any]:
    """One account as ``accounts --json`` gives it (no secret: neither key, nor a part of one)."""
    return {
        "account": installation.merchant_account_id,
        "default": installation.merchant_account_id == default,
        "state": "retired" if installation.retired else "open",
        "retired_at": installation.retired_at.isoformat() if installation.retired_at else None,
        "installed_at": installation.installed_at.isoformat(),
        "minimum_cents": installation.minimum_cents,
        "maximum_cents": installation.maximum_cents,
        "callback_url": installation.callback_url,
        "callback_failures_email": installation.callback_failures_email,
        "open_checkouts": open_checkouts(installation.merchant_account_id),
    }


@gateway_cli.group("accounts", invoke_without_command=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON list, one object per account.")
@with_appcontext  # AppGroup gives its commands an app context, not its groups
@click.pass_context
@checked("accounts")
def accounts_command(context: click.Context, as_json: bool) -> None:
    """The merchant accounts installed (open or retired), oldest first; retire ID and reopen ID change one."""
    if context.invoked_subcommand is not None:
        return
    state = get_state()
    default = _default_account()
    installations = state.installations()
    accounts = [_described(row, default) for row in installations]
    if as_json:
        click.echo(json.dumps(accounts, indent=2))
        return
    if not accounts:
        click.echo(f"No merchant account is installed for the {state.config.environment} environment.")
        return
    for installation, account in zip(installations, accounts, strict=True):
        default_mark = account["default"] and len(accounts) > 1  # one account: nothing to tell apart
        mark = " (default)" if default_mark else " (retired)" if account["retired_at"] else ""
        click.echo(account["account"] + mark)
        # Times for a person in GATEWAY_TIMEZONE (``--json`` keeps ISO 8601).
        since = f"retired since {when(installation.retired_at)}" if installation.retired_at else "open"
        rows = [
            ("state", since),
            ("installed", when(installation.installed_at)),
            (
                "limits",
                f"{state.money(account['minimum_cents'])} to {state.money(account['maximum_cents'])} "
                f"({account['minimum_cents']} to {account['maximum_cents']} cents)",
            ),
            ("callback URL", account["callback_url"]),
            ("failures e-mail", account["callback_failures_email"] or "-"),
            ("open checkouts", str(account["open_checkouts"])),
        ]
        for label, value in rows:
            click.echo(f"  {label:<17}{value}")


@accounts_command.command("retire")
@click.argument("account")
@checked("accounts retire")
def retire_command(account: str) -> None:
    """Close ACCOUNT for new checkouts; its open checkouts, refunds and callbacks go on until settled."""
    try:
        before = get_state().require_installation(account).retired_at
        installation = retire_account(account)
    except UnknownAccountError as error:
        raise click.ClickException(str(error)) from None
    left = open_checkouts(account)
    if before is not None:
        click.echo(f"Merchant account {account} was retired already (since {when(before)}).")
    else:
        click.echo(
            f"Retired merchant account {account}: it takes no new checkouts; its {left} open checkout(s), "
            "refunds and callbacks go on with its keys."
        )
        _log.info("merchant account %s retired (command line)", installation.merchant_account_id)
    default = _default_account()
    click.echo(
        f"The default account is {default}."
        if default
        else "No account is open now: new checkouts are refused until one is reopened or installed."
    )


@accounts_command.command("reopen")
@click.argument("account")
@checked("accounts reopen")
def reopen_command(account: str) -> None:
    """Take new checkouts on the retired ACCOUNT again."""
    try:
        before = get_state().require_installation(account).retired_at
        reopen_account(account)
    except UnknownAccountError as error:
        raise click.ClickException(str(error)) from None
    if before is None:
        click.echo(f"Merchant account {account} is open already.")
    else:
        click.echo(f"Reopened merchant account {account}: it takes new checkouts again.")
        _log.info("merchant account %s reopened (command line)", account)
    click.echo(f"The default account is {_default_account()}.")


def _problem(error: Exception) -> str:
    """The gateway's message and field errors, or the fields refused: never the values (the API key)."""
    if isinstance(error, ModelValidationError):
        return "; ".join(
            f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}"
            for e in error.errors(include_input=False, include_url=False)
        )
    if isinstance(error, GatewayError):
        text = error.message + (f" (HTTP {error.http_status})" if error.http_status is not None else "")
        if error.field_errors:
            text += ": " + "; ".join(f"{e['field']}: {e['message']}" for e in error.field_errors)
        return text
    return str(error)


def _api_key(account: str) -> str:
    """The API key from :data:`API_KEY_VARIABLE`, else typed at a prompt that does not echo it."""
    key = os.environ.get(API_KEY_VARIABLE, "").strip()
    if key:
        return key
    try:
        # default="": an empty answer (or the end of the input) returns at once; without a default, Click
        # before 8.2 asks again forever when its input has ended.
        typed = click.prompt(
            f"API key of {account} (input hidden)", hide_input=True, err=True, default="", show_default=False
        )
    except click.Abort:
        typed = ""
    key = str(typed).strip()
    if not key:
        raise click.ClickException(
            f"no API key given: type it at the prompt, or set {API_KEY_VARIABLE} in the environment (never "
            "as an option: it would stay in the shell's history)."
        )
    return key


#: Where ``flask run`` serves by default: the shop's address in development when GATEWAY_PUBLIC_URL is
#: not set (the install screen takes the address it was opened with; a command has none).
DEVELOPMENT_ADDRESS: Final = "http://127.0.0.1:5000"


def _callback_url(account: str, first: bool) -> str:
    """This shop's callback URL: the first account's ``.../gateway/callback``, a further account's own path
    ``.../gateway/callback/<account>``."""
    return shop_callback_url() if first else external_url("gateway.callback", account=account)


def _where_the_shop_is() -> AbstractContextManager[object]:
    """A request context on the shop's address when GATEWAY_PUBLIC_URL is not set: in development (the
    emulator, embedded or separate), ``flask run``'s default address, said on stderr; elsewhere, a usage
    error (a production callback URL is never guessed)."""
    config = get_state().config
    if config.public_url:
        return nullcontext()
    if config.environment not in ("emulator", "embedded"):
        raise click.UsageError(
            "GATEWAY_PUBLIC_URL is not set, so the shop's callback URL is unknown here: set it to the shop's "
            "public address (https://shop.example), or give --callback-url."
        )
    click.echo(
        f"GATEWAY_PUBLIC_URL is not set: the callback URL is on {DEVELOPMENT_ADDRESS}, where flask run "
        "serves by default (the install screen uses the address it is opened with); set GATEWAY_PUBLIC_URL "
        "or give --callback-url for another.",
        err=True,
    )
    return current_app.test_request_context(base_url=DEVELOPMENT_ADDRESS)


@gateway_cli.command("install")
@click.option("--account", "account", metavar="ID", required=True, help="The merchant account id to install.")
@click.option(
    "--callback-url",
    default=None,
    help="Where the gateway sends this account's callbacks [default: GATEWAY_PUBLIC_URL's callback route; "
    "for an account beside others, its own path .../gateway/callback/ID].",
)
@click.option("--minimum-cents", type=click.IntRange(min=0), required=True, help="The smallest order, cents.")
@click.option("--maximum-cents", type=click.IntRange(min=0), required=True, help="The largest order, cents.")
@click.option("--email", default=None, help="Where the gateway e-mails callback failures (optional).")
@checked("install")
def install_command(
    account: str, callback_url: str | None, minimum_cents: int, maximum_cents: int, email: str | None
) -> None:
    """Install the merchant account ID with the gateway and store its signing key (encrypted), beside the
    accounts installed before. The API key is read from GATEWAY_INSTALL_API_KEY, or asked for (hidden)."""
    state = get_state()
    account = account.strip()
    if not account:
        raise click.UsageError("--account is empty: give the merchant account id.")
    if minimum_cents > maximum_cents:
        raise click.UsageError(
            f"--minimum-cents ({minimum_cents}) is more than --maximum-cents ({maximum_cents})."
        )
    installed = state.installations()
    if any(row.merchant_account_id == account for row in installed):
        raise click.ClickException(
            f"the merchant account {account} is installed here already: change its settings on "
            f"{state.config.url_prefix}/admin/settings?account={account} (or retire or reopen it: flask "
            "gateway accounts)."
        )
    with _where_the_shop_is():
        url = callback_url or _callback_url(account, first=not installed)
        # The install screen's warnings, in its words (a callback URL the gateway cannot reach, plain http in
        # production, not this shop's).
        for warning in install_warnings(url, account):
            click.echo(f"Warning: {warning.summary} {warning.advice}", err=True)
    api_key = _api_key(account)
    if not api_key:
        raise click.ClickException("the API key is empty: nothing was sent.")
    settings = InstallSettings(
        merchant_account_id=account,
        api_key=api_key,
        callback_url=url,
        callback_failures_email=email or None,
        minimum_cents=minimum_cents,
        maximum_cents=maximum_cents,
    )
    state.session.commit()  # no transaction (SQLite: no write lock) while the gateway answers
    try:
        install(settings)
    except AlreadyInstalledError as error:
        raise click.ClickException(
            f"the gateway says {account} is installed already ({_problem(error)}): adopt the signing key "
            f"you were given then, on {state.config.url_prefix}/admin/install."
        ) from None
    except AuthenticationError as error:
        raise click.ClickException(
            f"the gateway refused the merchant account id or API key ({_problem(error)}): check both against "
            f"what the account manager issued for the {state.config.environment} environment."
        ) from None
    except ModelValidationError as error:
        raise click.ClickException(f"the settings were not sent: {_problem(error)}") from None
    except (GatewayConnectionError, GatewayServerError) as error:
        raise click.ClickException(
            f"no usable answer from the gateway ({_problem(error)}); nothing was stored. Try again; if the "
            "gateway did install the account it now answers 'already installed'."
        ) from None
    except (GatewayError, SecretUnreadable) as error:
        raise click.ClickException(f"the gateway refused the installation: {_problem(error)}") from None
    _log.info(
        "gateway installed for merchant account %s (%s, command line)", account, state.config.environment
    )
    default = _default_account()
    click.echo(
        f"Installed merchant account {account} ({state.config.environment}): the signing key is stored "
        f"encrypted. Callbacks go to {url}. The default account is {default}."
    )


@gateway_cli.command("set-api-key")
@click.option(
    "--account",
    "account",
    metavar="ID",
    required=True,
    help="The installed merchant account whose key changes.",
)
@checked("set-api-key")
def set_api_key_command(account: str) -> None:
    """Store the new API key the account manager issued for the installed account ID, once the gateway
    accepts it (one authenticated, read-only call with it); the stored key is kept when it does not. The
    key is read from GATEWAY_INSTALL_API_KEY, or asked for (hidden), never from an option."""
    state = get_state()
    account = installed_account(account.strip()) or ""
    api_key = _api_key(account)
    state.session.commit()  # no transaction (SQLite: no write lock) while the gateway answers
    try:
        set_api_key(account, api_key)
    except AuthenticationError as error:
        raise click.ClickException(
            f"the gateway refused the new API key of {account} ({_problem(error)}): the stored key is "
            "unchanged. Check the key against what the account manager issued for the "
            f"{state.config.environment} environment."
        ) from None
    except (GatewayError, SecretUnreadable) as error:
        raise click.ClickException(
            f"the new API key of {account} could not be proved ({_problem(error)}): the stored key is "
            "unchanged. Try again once the gateway answers."
        ) from None
    _log.info("new API key stored for merchant account %s (command line)", account)
    click.echo(
        f"Stored the new API key of {account} ({mask(api_key)}), encrypted: the gateway accepted it. The "
        "old one is no longer used here."
    )
