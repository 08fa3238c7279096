"""``flask gateway ...``: create the tables, reconcile, look at one checkout.

- ``flask gateway init-db``: create the extension's ``gateway_*`` tables (only those) when missing.
- ``flask gateway reconcile [--limit N] [--older-than S] [--paid-window HOURS] [--paid-recheck S]
  [--concurrency N]``: poll the checkouts whose outcome the shop may have missed, then the recently paid
  ones for refunds made at the gateway (see :mod:`flask_gateway.reconciliation`); exits 1 when a checkout
  could not be polled, so a cron job reports it.
- ``flask gateway status TOKEN [--refresh]``: the local record and the gateway's getstatus answer.
- ``flask gateway check-settings``: compare the gateway's settings (callback URL, e-mail, limits) with the
  shop's (see :mod:`flask_gateway.drift`); exits 1 when they differ or the gateway cannot be asked.
- ``flask gateway callbacks [--outcome O] [--refused] [--limit N]``: the newest callbacks received.
- ``flask gateway doctor [--no-network] [--timeout S]``: check what breaks integrations (configuration, the
  firewall, CSRF, the tables, the stored keys, the gateway's settings, the callback at its public URL, the
  schedules) and say how to fix each (see :mod:`flask_gateway.doctor`); exits 1 on a problem.
- ``flask gateway prune-callbacks [--older-than-days N] [--refused]``: delete callback log rows older than
  N days, or every refused (never verified) row now (the checkouts' own history,
  ``gateway_checkout_events``, is kept).

Every command first prints one line to stderr saying what it uses: ``Using database ..., gateway ... at
..., account ...`` (the database URL with its password masked, or a SQLite file's absolute path; the
gateway's environment and base URL; the installed account, or ``not installed``). Then it refuses, with
one line and exit status 78 (``EX_CONFIG``), to run where it could only succeed by accident
(:data:`COMMAND_CHECKS` says which command needs what):

- the app says production (``GATEWAY_ENVIRONMENT="production"``) and the database is SQLite: the
  development database, reached because the command did not load the production environment (unless
  ``GATEWAY_SQLITE_IN_PRODUCTION = True``); checked before the database is opened;
- the ``gateway_*`` tables (or some of their columns) are missing;
- the gateway is not installed for the configured environment.

A command that meets a database outage (``core.outages.is_database_outage``: the server restarting,
refusing or dropping connections) stops with one line, ``Error: the database is unreachable (...)``, and
exit status 75 (``EX_TEMPFAIL``): a cron job or timer runs it again later.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections.abc import Callable
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Final, TypeVar

import click
from flask.cli import AppGroup
from sqlalchemy import URL, CursorResult, delete, inspect, select

from flask_gateway.config import MAX_PAID_WINDOW_HOURS, MAX_RECONCILE_CONCURRENCY
from flask_gateway.core.errors import GatewayError
from flask_gateway.core.outages import DATABASE_ERRORS, describe_database_error, is_database_outage
from flask_gateway.core.sql import create_all_safely, sqlite_read_transactions
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import status_payload_keys
from flask_gateway.doctor import DEFAULT_TIMEOUT, run_checks
from flask_gateway.drift import check_settings
from flask_gateway.errors import CallbackRejected, NotInstalledError
from flask_gateway.health import REFUSED
from flask_gateway.inbound import replay_callback
from flask_gateway.models import (
    CallbackLog,
    CallbackOutcome,
    GatewayBase,
    GatewayCheckout,
    OutboxEvent,
    OutboxState,
)
from flask_gateway.outbox import DeliveryReport, backlog, deliver_due, redeliver
from flask_gateway.polling import refresh
from flask_gateway.readiness import missing_schema
from flask_gateway.reconciliation import PAID_RECHECK_SECONDS, reconcile
from flask_gateway.state import GatewayState, get_state, leaves_no_transaction

__all__ = [
    "COMMAND_CHECKS",
    "ENVIRONMENT_FILE",
    "EXIT_CONFIGURATION",
    "EXIT_DATABASE_AWAY",
    "Checks",
    "ConfigurationFault",
    "DatabaseAway",
    "GatewayCommands",
    "describe_database",
    "gateway_cli",
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
    status 75 when the database is away, instead of a traceback; any other error is raised as it is."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
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
EXIT_CONFIGURATION: Final = 78

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


#: Each command's checks (docs/extension.md's "Command line" shows the same table; a test compares them).
#: ``init-db`` makes the tables and ``doctor`` reports them (and the installation) itself; ``callbacks``
#: and ``outbox`` list local rows, for which "not installed" is a normal answer (a failed install's
#: refused callbacks); every command that calls the gateway, delivers, or is scheduled needs both.
COMMAND_CHECKS: Final[dict[str, Checks]] = {
    "init-db": Checks(tables=False, installed=False),
    "doctor": Checks(tables=False, installed=False, database=False),
    "callbacks": Checks(tables=True, installed=False),
    "outbox": Checks(tables=True, installed=False),
    "reconcile": Checks(),
    "deliver": Checks(),
    "redeliver": Checks(),
    "replay-callback": Checks(),
    "status": Checks(),
    "check-settings": Checks(),
    "prune-callbacks": Checks(),
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


def _checked(name: str) -> Callable[[_F], _F]:
    """Run ``name``'s :data:`COMMAND_CHECKS` (after one line saying what the command uses) before it."""
    checks = COMMAND_CHECKS[name]

    def decorate(command: _F) -> _F:
        @functools.wraps(command)
        def run(*args: Any, **kwargs: Any) -> Any:
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
        say(f"account {account}" if account else "not installed")
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
    """The missing tables and columns, and the installed account (None: not installed, or no table)."""
    with sqlite_read_transactions():  # nothing here writes: no SQLite write lock
        missing = missing_schema(state.engine)
        if any(name.split(".")[0] == "gateway_installations" for name in missing):
            return missing, None
        key = state.installation_key()
    return missing, None if key is None else key[0]


@gateway_cli.command("init-db")
@_checked("init-db")
def init_db() -> None:
    """Create the gateway_* tables that do not exist yet (your own tables are left alone)."""
    engine = get_state().db.engine
    existing = set(inspect(engine).get_table_names())
    create_all_safely(engine, GatewayBase.metadata)
    names = [table.name for table in GatewayBase.metadata.sorted_tables]
    created = [name for name in names if name not in existing]
    if created:
        click.echo(f"Created {len(created)} table(s): {', '.join(created)}.")
    else:
        click.echo(f"All {len(names)} gateway tables exist already; nothing to do.")


@gateway_cli.command("reconcile")
@click.option("--limit", type=click.IntRange(min=1), default=None, help="Poll at most N checkouts.")
@click.option(
    "--older-than",
    "older_than",
    type=click.FloatRange(min=0),
    default=None,
    help="Only checkouts unchanged and unpolled for this many seconds "
    "[default: GATEWAY_RECONCILE_AFTER_SECONDS].",
)
@click.option(
    "--paid-window",
    "paid_window",
    type=click.FloatRange(0, MAX_PAID_WINDOW_HOURS),
    default=None,
    help="Also ask about checkouts paid within this many hours (refunds made at the gateway); 0: none "
    "[default: GATEWAY_RECONCILE_PAID_WINDOW_HOURS].",
)
@click.option(
    "--paid-recheck",
    "paid_recheck",
    type=click.FloatRange(min=0),
    default=None,
    help="Only paid checkouts unchanged and unpolled for this many seconds "
    f"[default: {PAID_RECHECK_SECONDS}].",
)
@click.option(
    "--concurrency",
    type=click.IntRange(1, MAX_RECONCILE_CONCURRENCY),
    default=None,
    help="Getstatus calls in flight at once; 1: one at a time [default: GATEWAY_RECONCILE_CONCURRENCY].",
)
@click.option("--quiet", is_flag=True, help="No progress bar; only the summary.")
@_checked("reconcile")
def reconcile_command(
    limit: int | None,
    older_than: float | None,
    paid_window: float | None,
    paid_recheck: float | None,
    concurrency: int | None,
    quiet: bool,
) -> None:
    """Ask the gateway about checkouts that are not final, and recently paid ones, and apply the answers."""
    with ExitStack() as stack:
        bar: Any = None

        def progress(done: int, total: int) -> None:
            # The bar starts once the number of checkouts is known (none: no bar at all).
            nonlocal bar
            if quiet or (bar is None and total == 0):
                return
            if bar is None:
                bar = stack.enter_context(
                    click.progressbar(length=total, label="Polling checkouts", show_pos=True)
                )
            bar.update(done - bar.pos)

        report = reconcile(
            limit=limit,
            older_than_seconds=older_than,
            progress=progress,
            paid_window_hours=paid_window,
            paid_recheck_seconds=paid_recheck,
            concurrency=concurrency,
        )
    click.echo(report.summary())
    if report.errors:
        raise SystemExit(1)


def _when(value: Any) -> str:
    return value.isoformat(timespec="seconds") if value is not None else "-"


@gateway_cli.command("status")
@click.argument("token")
@click.option(
    "--refresh",
    "apply_answer",
    is_flag=True,
    help="Apply the gateway's answer to the local record (through the state machine).",
)
@_checked("status")
def status_command(token: str, apply_answer: bool) -> None:
    """Show checkout TOKEN: the local record and what the gateway's getstatus says."""
    state = get_state()
    session = state.session
    checkout = session.scalars(select(GatewayCheckout).where(GatewayCheckout.token == token)).first()
    problems = 0
    if checkout is None:
        click.echo(f"No local checkout has token {token}.")
        problems += 1
    else:
        rows = [
            ("checkout", f"#{checkout.id} ({checkout.api_version})"),
            ("order", checkout.order_reference),
            (
                "status",
                checkout.status
                + ("  [FLAGGED: " + (checkout.flag_reason or "") + "]" if checkout.flagged else ""),
            ),
            ("total", f"{checkout.total_cents} cents"),
            ("paid", f"{checkout.paid_cents} cents"),
            ("refunded", f"{checkout.refunded_cents} cents"),
            ("merchant account", checkout.merchant_account_id),
            ("request id", checkout.request_id),
            ("created", _when(checkout.created_at)),
            ("updated", _when(checkout.updated_at)),
            ("expires", _when(checkout.expires_at)),
            ("paid at", _when(checkout.paid_at)),
            ("last callback", _when(checkout.last_callback_at)),
            ("last polled", _when(checkout.last_polled_at)),
        ]
        click.echo("Local record")
        for label, value in rows:
            click.echo(f"  {label:<17}{value}")
        if checkout.events:
            click.echo("  recent events")
            for event in checkout.events[-5:]:
                mark = "" if event.applied else " (not applied)"
                click.echo(
                    f"    {_when(event.at)}  {event.source:<9} {event.from_status} -> {event.to_status}"
                    f"{mark}{': ' + event.detail if event.detail else ''}"
                )
        if checkout.api_version != "v2":
            click.echo("The v1 API has no status query: the outcome arrives on the success/fail URLs.")
            return
    try:
        if apply_answer and checkout is not None:
            transition = refresh(checkout, source="admin")
            verb = "applied" if transition.applied else f"not applied ({transition.reason})"
            click.echo(f"Refreshed: {transition.before} -> {transition.after}, {verb}.")
        payload = state.client().get_status(token).data.to_wire(state.config.wire_names)
    except (GatewayError, NotInstalledError) as error:
        click.echo(f"The gateway could not be asked: {error}", err=True)
        raise SystemExit(1) from None
    click.echo("Gateway (getstatus)")
    for key in status_payload_keys(state.config.wire_names):
        click.echo(f"  {key:<33}{'-' if payload.get(key) is None else payload[key]}")
    if problems:
        raise SystemExit(1)


@gateway_cli.command("check-settings")
@_checked("check-settings")
def check_settings_command() -> None:
    """Compare the gateway's settings with the shop's and say what differs (exit 1 when something does)."""
    try:
        report = check_settings()
    except (GatewayError, NotInstalledError, ValueError) as error:
        click.echo(f"The gateway's settings could not be checked: {error}", err=True)
        raise SystemExit(1) from None
    click.echo(report.summary())
    if not report.ok:
        raise SystemExit(1)


@gateway_cli.command("callbacks")
@click.option(
    "--outcome",
    type=click.Choice([o.value for o in CallbackOutcome]),
    default=None,
    help="Only callbacks with this outcome.",
)
@click.option(
    "--refused",
    is_flag=True,
    help="Only callbacks answered 4xx/5xx or not answered at all (not the doctor's own probe).",
)
@click.option("--limit", type=click.IntRange(min=1), default=20, show_default=True)
@_checked("callbacks")
def callbacks_command(outcome: str | None, refused: bool, limit: int) -> None:
    """The newest callbacks received, one line each (the body is in the admin's callback log)."""
    query = select(CallbackLog).order_by(CallbackLog.id.desc()).limit(limit)
    if outcome:
        query = query.where(CallbackLog.outcome == outcome)
    if refused:
        query = query.where(REFUSED)
    rows = get_state().session.scalars(query).all()
    if not rows:
        click.echo("No callbacks match.")
        return
    for row in rows:
        answer = "no answer" if row.http_status == 0 else f"HTTP {row.http_status}"
        checkout = f"checkout #{row.checkout_id}" if row.checkout_id else "no checkout"
        signature = "verified" if row.verified else "NOT verified"
        client = f"from {row.client_address}  " if row.client_address else ""
        click.echo(
            f"#{row.id}  {_when(row.received_at)}  {answer:<9}  {row.outcome:<18}  {signature:<12}  "
            f"{client}{checkout}{': ' + row.detail if row.detail else ''}"
        )


@gateway_cli.command("deliver")
@click.option(
    "--limit", default=100, show_default=True, type=click.IntRange(1, 100_000), help="Events at most."
)
@click.option(
    "--every",
    type=click.FloatRange(0.5, 3600),
    default=None,
    metavar="SECONDS",
    help="Keep running: deliver what is due every SECONDS until stopped (SIGTERM or Ctrl-C), through "
    "database outages. For a shop without a task queue: a systemd service instead of a cron line.",
)
@_checked("deliver")
def deliver_command(limit: int, every: float | None) -> None:
    """Deliver the outbox events that are due (run it from cron every minute or two, or with --every).

    Exits 1 when a receiver raised (the event is due again later, or dead after its last attempt)."""
    if every is not None:
        _deliver_forever(limit, every)
        return
    report = deliver_due(limit)
    _echo_delivery(report)
    waiting, oldest = backlog()
    click.echo(f"Waiting: {waiting}" + (f", the oldest written {_when(oldest)}." if oldest else "."))
    if report.failed:
        raise SystemExit(1)


def _echo_delivery(report: DeliveryReport) -> None:
    click.echo(f"Outbox: {report}.")
    for event_id, error in report.errors:
        click.echo(f"  event #{event_id}: {error}")


def _deliver_forever(limit: int, every: float) -> None:
    """``deliver --every``: a round every ``every`` seconds; a round that met a database outage is counted
    by the extension's outage watch (one line when it starts, one when it ends) and the loop goes on. A
    SIGTERM lets the round in progress finish (its receivers run to the end) and then stops."""
    state = get_state()
    stop = threading.Event()
    previous = {
        signum: signal.signal(signum, lambda _signum, _frame: stop.set())
        for signum in (signal.SIGTERM, signal.SIGINT)
    }
    click.echo(f"Delivering the outbox every {every:g} s (SIGTERM or Ctrl-C stops).")
    try:
        _deliver_rounds(state, limit, every, stop)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    click.echo("Stopped.")


def _deliver_rounds(state: GatewayState, limit: int, every: float, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            report = deliver_due(limit)
        except DATABASE_ERRORS as error:
            if not is_database_outage(error):
                raise
            state.outages.failed(error)
        else:
            state.outages.succeeded()
            if report.delivered or report.failed or report.dead:
                _echo_delivery(report)
        finally:
            state.remove_session()  # a fresh session each round: nothing read in one is trusted in the next
        stop.wait(every)


@gateway_cli.command("outbox")
@click.option(
    "--state",
    "states",
    multiple=True,
    type=click.Choice([state.value for state in OutboxState]),
    help="Only events in this state (repeatable). Default: pending and dead.",
)
@click.option("--limit", default=20, show_default=True, type=click.IntRange(1, 10_000))
@_checked("outbox")
def outbox_command(states: tuple[str, ...], limit: int) -> None:
    """The outbox's events waiting or dead (paid, not yet fulfilled, ...), newest first, one line each."""
    wanted = states or (OutboxState.PENDING.value, OutboxState.DEAD.value)
    rows = (
        get_state()
        .session.execute(
            select(OutboxEvent, GatewayCheckout.order_reference)
            .join(GatewayCheckout, GatewayCheckout.id == OutboxEvent.checkout_id)
            .where(OutboxEvent.state.in_(wanted))
            .order_by(OutboxEvent.id.desc())
            .limit(limit)
        )
        .all()
    )
    if not rows:
        click.echo(f"No outbox events {' or '.join(wanted)}.")
        return
    for event, reference in rows:
        due = f"  due {_when(event.next_attempt_at)}" if event.state == OutboxState.PENDING else ""
        error = f"  last error: {event.last_error}" if event.last_error else ""
        click.echo(
            f"#{event.id}  {event.kind:<19}  {event.state:<9}  order {reference}  "
            f"{event.attempts} attempt(s)  written {_when(event.created_at)}{due}{error}"
        )


@gateway_cli.command("redeliver")
@click.argument("event_id", type=int)
@_checked("redeliver")
def redeliver_command(event_id: int) -> None:
    """Deliver one outbox event now, whatever its state (a dead one after the receiver was fixed)."""
    try:
        report = redeliver(event_id)
    except LookupError as exc:
        raise click.ClickException(str(exc)) from None
    if report.failed:
        raise click.ClickException(f"event #{event_id}: {report.errors[0][1]}")
    click.echo(f"Event #{event_id} delivered.")


@gateway_cli.command("replay-callback")
@click.argument("log_id", type=int)
@_checked("replay-callback")
def replay_callback_command(log_id: int) -> None:
    """Process a stored callback again (one that was verified when it arrived): confirmed with the gateway
    and applied as a callback is; a new row of the callback log says how it went."""
    try:
        result = replay_callback(log_id)
    except (LookupError, ValueError, NotInstalledError) as exc:
        raise click.ClickException(str(exc)) from None
    except CallbackRejected as exc:
        raise click.ClickException(
            f"callback #{log_id} replayed as #{exc.log.id if exc.log else '?'}: refused ({exc.outcome}): "
            f"{exc.description}"
        ) from None
    click.echo(
        f"Callback #{log_id} replayed as #{result.log.id}: {result.outcome} "
        f"({result.log.detail or result.transition.reason})."
    )


@gateway_cli.command("prune-callbacks")
@click.option(
    "--older-than-days",
    "days",
    type=click.IntRange(min=1),
    default=None,
    help="Delete callback log rows received more than this many days ago.",
)
@click.option(
    "--refused",
    is_flag=True,
    help="Delete the rows of refused, never verified requests (bad signature, too large), whatever their "
    "age: a flood in progress can be purged now. With --older-than-days, only the older ones.",
)
@_checked("prune-callbacks")
def prune_callbacks_command(days: int | None, refused: bool) -> None:
    """Delete callback log rows (the checkouts and their history stay)."""
    if days is None and not refused:
        raise click.UsageError("Say what to delete: --older-than-days N, --refused, or both.")
    session = get_state().session
    query = delete(CallbackLog)
    described = []
    if refused:
        query = query.where(CallbackLog.verified.is_(False))
        described.append("refused (never verified)")
    cutoff = None
    if days is not None:
        cutoff = utcnow() - timedelta(days=days)
        query = query.where(CallbackLog.received_at < cutoff)
    result = session.execute(query)
    deleted = result.rowcount if isinstance(result, CursorResult) else 0
    session.commit()
    what = " ".join([*described, "callback log row(s)"])
    since = f" received before {_when(cutoff)}" if cutoff is not None else ""
    click.echo(f"Deleted {deleted} {what}{since}.")


_MARK_STYLE = {"ok": "green", "warn": "yellow", "problem": "red", "unknown": None}


@gateway_cli.command("doctor")
@click.option(
    "--no-network",
    "no_network",
    is_flag=True,
    help="Skip the checks that call the gateway (its settings) or the shop's public URL (the callback).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0.1),
    default=DEFAULT_TIMEOUT,
    show_default=True,
    help="Seconds to wait for the shop's public URL (the gateway's own calls use GATEWAY_TIMEOUT).",
)
@_checked("doctor")
def doctor_command(no_network: bool, timeout: float) -> None:
    """Check what breaks integrations and say how to fix each; exit 1 on a problem."""
    report = run_checks(network=not no_network, timeout=timeout)
    for finding in report.shown:
        first, *rest = finding.lines()
        mark = finding.mark
        click.echo(click.style(mark, fg=_MARK_STYLE[finding.level], bold=True) + first[len(mark) :])
        for line in rest:
            click.echo(line)
    click.echo(report.summary())
    if not report.ok:
        raise SystemExit(1)
