"""``flask gateway deliver [--every S]``, ``outbox`` and ``redeliver EVENT_ID``: the outbox's events."""

from __future__ import annotations

import signal
import threading

import click
from sqlalchemy import select

from flask_gateway.core.outages import DATABASE_ERRORS, is_database_outage
from flask_gateway.models import (
    GatewayCheckout,
    OutboxEvent,
    OutboxState,
)
from flask_gateway.operations.cli.group import (
    account_option,
    checked,
    gateway_cli,
    installed_account,
    several_accounts,
    when,
)
from flask_gateway.payments.outbox import DeliveryReport, backlog, deliver_due, redeliver
from flask_gateway.state import GatewayState, get_state


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
@checked("deliver")
def deliver_command(limit: int, every: float | None) -> None:
    """Deliver the outbox events that are due (run it from cron every minute or two, or with --every).

    Exits 1 when a receiver raised (the event is due again later, or dead after its last attempt)."""
    if every is not None:
        _deliver_forever(limit, every)
        return
    report = deliver_due(limit)
    _echo_delivery(report)
    waiting, oldest = backlog()
    click.echo(f"Waiting: {waiting}" + (f", the oldest written {when(oldest)}." if oldest else "."))
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
@account_option("Only the events of this merchant account's checkouts [default: every account].")
@checked("outbox")
def outbox_command(states: tuple[str, ...], limit: int, account: str | None) -> None:
    """The outbox's events waiting or dead (paid, not yet fulfilled, ...), newest first, one line each."""
    account = installed_account(account)
    wanted = states or (OutboxState.PENDING.value, OutboxState.DEAD.value)
    query = (
        select(OutboxEvent, GatewayCheckout.order_reference, GatewayCheckout.merchant_account_id)
        .join(GatewayCheckout, GatewayCheckout.id == OutboxEvent.checkout_id)
        .where(OutboxEvent.state.in_(wanted))
        .order_by(OutboxEvent.id.desc())
        .limit(limit)
    )
    if account is not None:
        query = query.where(GatewayCheckout.merchant_account_id == account)
    rows = get_state().session.execute(query).all()
    if not rows:
        of = f" of account {account}" if account is not None else ""
        click.echo(f"No outbox events {' or '.join(wanted)}{of}.")
        return
    named = several_accounts()
    for event, reference, checkout_account in rows:
        due = f"  due {when(event.next_attempt_at)}" if event.state == OutboxState.PENDING else ""
        error = f"  last error: {event.last_error}" if event.last_error else ""
        shown = f"account {checkout_account}  " if named else ""
        click.echo(
            f"#{event.id}  {event.kind:<19}  {event.state:<9}  {shown}order {reference}  "
            f"{event.attempts} attempt(s)  written {when(event.created_at)}{due}{error}"
        )


@gateway_cli.command("redeliver")
@click.argument("event_id", type=int)
@checked("redeliver")
def redeliver_command(event_id: int) -> None:
    """Deliver one outbox event now, whatever its state (a dead one after the receiver was fixed)."""
    try:
        report = redeliver(event_id)
    except LookupError as exc:
        raise click.ClickException(str(exc)) from None
    if report.failed:
        raise click.ClickException(f"event #{event_id}: {report.errors[0][1]}")
    click.echo(f"Event #{event_id} delivered.")
