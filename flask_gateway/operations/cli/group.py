"""The ``flask gateway`` group and what every command does first: the line saying which database, gateway
and account(s) it uses, the checks that refuse (exit 78), and one line with exit 75 when the database is
away; the ``--account ID`` option of the commands that act on checkouts."""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final, TypeVar

import click
from flask.cli import AppGroup
from sqlalchemy import URL, select

from flask_gateway.clock import format_time
from flask_gateway.core.outages import DATABASE_ERRORS, describe_database_error, is_database_outage
from flask_gateway.core.sql import sqlite_read_transactions
from flask_gateway.errors import EX_CONFIG, UnknownAccountError
from flask_gateway.models import Installation
from flask_gateway.operations.cli.patience import announce_waits
from flask_gateway.operations.readiness import missing_schema
from flask_gateway.state import GatewayState, get_state, leaves_no_transaction, misconfiguration

__all__ = [
    "COMMAND_CHECKS",
    "ENVIRONMENT_FILE",
    "EXIT_CONFIGURATION",
    "EXIT_DATABASE_AWAY",
    "Checks",
    "ConfigurationFault",
    "DatabaseAway",
    "GatewayCommands",
    "account_option",
    "checked",
    "describe_accounts",
    "describe_database",
    "gateway_cli",
    "installed_account",
    "several_accounts",
    "when",
]


#: The exit status of a command that stopped because the database is unreachable: ``EX_TEMPFAIL``
#: (sysexits.h), "try again later", so a cron wrapper can tell it from a real failure (1).
EXIT_DATABASE_AWAY: Final = 75


class DatabaseAway(click.ClickException):
    """A command met a database outage: one line (``Error: the database is unreachable ...``), no
    traceback, exit status :data:`EXIT_DATABASE_AWAY`."""

    exit_code = EXIT_DATABASE_AWAY

    def __init__(self, error: BaseException) -> None:
        super().__init__(
            f"the database is unreachable ({describe_database_error(error)}): run the command again once "
            "it answers (what it committed before is kept)."
        )


class GatewayCommands(AppGroup):
    """``AppGroup`` (every command runs inside the app context) whose commands end with one line and exit
    status 75 when the database is away, instead of a traceback (any other error is raised as it is), and
    say so on stderr when a statement waits on the database (``patience.announce_waits``)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with announce_waits():  # a statement waiting on a lock says so (operations/cli/patience.py)
                return super().invoke(ctx)
        except DATABASE_ERRORS as error:
            if not is_database_outage(error):
                raise
            raise DatabaseAway(error) from None


gateway_cli = GatewayCommands(
    "gateway", help="Flask-Gateway: database tables, reconciliation, checkout status."
)

#: The exit status of a command refused because of how it is configured (the app says production but the
#: database is SQLite, the tables are missing, the gateway is not installed): ``EX_CONFIG`` (sysexits.h).
#: Running it again changes nothing; a person must fix the environment (unlike 75, an outage).
EXIT_CONFIGURATION: Final = EX_CONFIG

#: The environment file every documented cron line, systemd unit and Celery command loads (docs).
ENVIRONMENT_FILE: Final = "/etc/shop/environment"


class ConfigurationFault(click.ClickException):
    """A command refused to run where it could only succeed by accident: one line (``Error: ...``), exit
    status :data:`EXIT_CONFIGURATION`."""

    exit_code = EXIT_CONFIGURATION


@dataclass(frozen=True)
class Checks:
    """What a command needs before it runs (every command is refused on a SQLite database when the app
    says production, unless ``GATEWAY_SQLITE_IN_PRODUCTION``)."""

    #: Every ``gateway_*`` table and column exists.
    tables: bool = True
    #: The gateway is installed for ``GATEWAY_ENVIRONMENT``.
    installed: bool = True
    #: The database must answer for the command to start (else exit status 75); the doctor reports an
    #: outage as a finding, with everything else it checks.
    database: bool = True
    #: The app's configuration must be valid (else its one line, exit status 78); the doctor reports a
    #: configuration error as a finding.
    configured: bool = True


#: Each command's checks (docs/extension.md's "Command line" shows the same table; a test compares them).
#: ``init-db`` makes the tables and ``doctor`` reports them (and the installation) itself; ``callbacks``,
#: ``checkouts``, ``outbox`` and ``accounts`` list local rows, for which "not installed" is a normal answer
#: (a failed install's refused callbacks); ``rotate-secrets`` re-encrypts every environment's stored
#: secrets, none being an answer; ``install`` installs; every command that calls the gateway,
#: delivers, or is scheduled needs both. A sub-command is named with its group: ``accounts retire``.
COMMAND_CHECKS: Final[dict[str, Checks]] = {
    "init-db": Checks(tables=False, installed=False),
    "doctor": Checks(tables=False, installed=False, database=False, configured=False),
    "install": Checks(tables=True, installed=False),
    "accounts": Checks(tables=True, installed=False),
    "accounts retire": Checks(),
    "accounts reopen": Checks(),
    "callbacks": Checks(tables=True, installed=False),
    "checkouts": Checks(tables=True, installed=False),
    "outbox": Checks(tables=True, installed=False),
    "reconcile": Checks(),
    "deliver": Checks(),
    "redeliver": Checks(),
    "replay-callback": Checks(),
    "status": Checks(),
    "refund": Checks(),
    "check-settings": Checks(),
    "set-api-key": Checks(),
    "prune-callbacks": Checks(),
    "rotate-secrets": Checks(tables=True, installed=False),
}

_F = TypeVar("_F", bound=Callable[..., Any])

#: Query parameters of a database URL whose values are not shown (``sslpassword``, ``password``, ...).
_SECRET_QUERY_WORDS: Final = ("pass", "secret", "token", "key")


def describe_database(url: URL) -> str:
    """The database a URL names, safe to print: SQLite as ``SQLite file /abs/path`` or ``SQLite in
    memory``; any other with its password (and any password-like query value) masked."""
    if url.get_backend_name() == "sqlite":
        database = url.database or ""
        if database in ("", ":memory:") or "mode=memory" in str(url.query):
            return "SQLite in memory"
        if database.startswith("file:"):
            return f"SQLite {database.split('?', 1)[0]}"
        return f"SQLite file {os.path.abspath(database)}"
    mask = "MASKED-BY-FLASK-GATEWAY"  # "***" itself would be percent-encoded in the query
    query = {
        name: (mask if any(word in name.lower() for word in _SECRET_QUERY_WORDS) else value)
        for name, value in url.query.items()
    }
    return url.set(query=query).render_as_string(hide_password=True).replace(mask, "***")


def checked(name: str) -> Callable[[_F], _F]:
    """Run ``name``'s :data:`COMMAND_CHECKS` (after one line saying what the command uses) before it. On a
    group's callback they run only when the group itself is the command (``flask gateway accounts``); a
    sub-command (``accounts retire``) runs its own."""
    checks = COMMAND_CHECKS[name]

    def decorate(command: _F) -> _F:
        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
            context = click.get_current_context(silent=True)
            if context is not None and context.invoked_subcommand is not None:
                return command(*args, **kwargs)
            if not checks.configured and misconfiguration() is not None:
                return command(*args, **kwargs)  # it reports the configuration error itself
            # A service (`deliver --every`) waits for the database instead of exiting 75: started while it
            # is away, systemd would restart it in a loop, and give up after five tries in ten seconds.
            every = kwargs.get("every")
            _preflight(checks, wait_every=every if isinstance(every, float | int) else None)
            return command(*args, **kwargs)

        run.gateway_checks = checks  # type: ignore[attr-defined]  # tests: no command goes unchecked
        return run  # type: ignore[return-value]  # same signature

    return decorate


def _preflight(checks: Checks, *, wait_every: float | None = None) -> None:
    """Say what the command uses, then refuse where it could only succeed by accident. ``wait_every``:
    while the database does not answer, try again every that many seconds (one log line when the outage
    starts, one when it ends) instead of stopping with exit status 75."""
    state = get_state()
    config = state.config
    url = state.db.engine.url  # creating the engine connects nothing
    database = describe_database(url)
    gateway = f"gateway {config.environment} at {config.base_url}"

    def say(installation: str) -> None:
        click.echo(f"Using database {database}, {gateway}, {installation}.", err=True)

    if (
        config.environment == "production"
        and url.get_backend_name() == "sqlite"
        and not config.sqlite_in_production
    ):
        say("installation not read")
        raise ConfigurationFault(
            f"GATEWAY_ENVIRONMENT is 'production' but the database is {database}, a development "
            "database: this command did not load the web workers' environment (run it as `flask "
            f"--env-file {ENVIRONMENT_FILE} --app ... gateway ...`, docs/operations.md#cron). A "
            "one-machine shop whose production database is SQLite sets GATEWAY_SQLITE_IN_PRODUCTION = True."
        )
    while True:
        try:
            missing, account = _read_setup(state)
        except DATABASE_ERRORS as error:
            if not is_database_outage(error):
                raise
            if wait_every is None:
                say("installation not read (the database does not answer)")
                if not checks.database:
                    state.remove_session()
                    return
                raise DatabaseAway(error) from None
            state.outages.failed(error)
            state.remove_session()
            time.sleep(wait_every)
            continue
        if wait_every is not None:
            state.outages.succeeded()
        break
    if missing and account is None:
        say("installation not read (tables missing)")
    else:
        say(account or "not installed")
    if missing and checks.tables:
        shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
        raise ConfigurationFault(
            f"the gateway's tables are missing in {database} ({shown}): run `flask gateway init-db` or "
            "your migrations."
        )
    if account is None and checks.installed:
        raise ConfigurationFault(
            f"the gateway is not installed for the {config.environment} environment in {database}. If the "
            "web app is installed, this command uses another database or environment than it: load the "
            f"same environment (`flask --env-file {ENVIRONMENT_FILE} ...`, docs/operations.md#cron); "
            f"else install it at {config.url_prefix}/admin/install."
        )


@leaves_no_transaction
def _read_setup(state: GatewayState) -> tuple[list[str], str | None]:
    """The missing tables and columns, and the installed accounts in words (None: not installed, or no
    table): ``account a`` for one, ``accounts a, b (default), c (retired)`` for several."""
    with sqlite_read_transactions():  # nothing here writes: no SQLite write lock
        missing = missing_schema(state.engine)
        if any(name.split(".")[0] == "gateway_installations" for name in missing):
            return missing, None
        rows = state.session.execute(
            select(Installation.merchant_account_id, Installation.retired_at)
            .where(Installation.environment == state.config.environment)
            .order_by(Installation.id)
        ).all()
    return missing, describe_accounts([(row[0], row[1] is not None) for row in rows]) if rows else None


def describe_accounts(accounts: list[tuple[str, bool]]) -> str:
    """``account a`` (one open account: the line as before several existed), else ``accounts a, b
    (default), c (retired)``: ``accounts`` are (id, retired) pairs, oldest first; the default account is
    the newest one still open."""
    if len(accounts) == 1 and not accounts[0][1]:
        return f"account {accounts[0][0]}"
    open_ = [name for name, retired in accounts if not retired]
    default = open_[-1] if open_ else None
    labels = [
        name + (" (retired)" if retired else " (default)" if name == default else "")
        for name, retired in accounts
    ]
    return ("account " if len(accounts) == 1 else "accounts ") + ", ".join(labels)


def account_option(text: str) -> Callable[[_F], _F]:
    """``--account ID``: the merchant account a command acts on (checked by :func:`installed_account`)."""
    return click.option("--account", "account", metavar="ID", default=None, help=text)


def installed_account(account: str | None) -> str | None:
    """``account`` when it is installed for the environment (open or retired); None stays None. An
    account not installed stops the command with one line naming the installed ones, exit status 1."""
    if account is None:
        return None
    state = get_state()
    # An id no account can have (U+0000, which PostgreSQL refuses even as a parameter; over 255 characters)
    # is not looked up (``installation_key``): it is simply not installed.
    if state.installation_key(account) is None:
        error: UnknownAccountError = state.unknown_account(account.replace("\x00", "\ufffd"))
        state.session.rollback()
        raise click.ClickException(str(error))
    return account


def several_accounts() -> bool:
    """Whether more than one account is installed for the environment (the commands then name each
    row's account; with one, their lines are as they always were)."""
    state = get_state()
    return len(state.installations()) > 1


def when(value: datetime | None) -> str:
    """A stored time as every command prints it for a person: in ``GATEWAY_TIMEZONE`` with the zone's name
    (``2026-11-27 13:51:09 SAST``, :func:`flask_gateway.clock.format_time`; ``-`` for none). ``--json``
    keeps ISO 8601 in UTC."""
    return format_time(value, get_state().config.zone)
