"""``flask gateway callbacks``, ``replay-callback LOG_ID`` and ``prune-callbacks``: the callback log."""

from __future__ import annotations

from datetime import timedelta

import click
from sqlalchemy import CursorResult, and_, delete, or_, select

from flask_gateway.core.timestamps import utcnow
from flask_gateway.errors import CallbackRejected, NotInstalledError
from flask_gateway.inbound import replay_callback
from flask_gateway.labels import describe_detail
from flask_gateway.models import (
    CallbackLog,
    CallbackOutcome,
    GatewayCheckout,
    VerifyingKey,
)
from flask_gateway.operations.cli.group import (
    account_option,
    checked,
    gateway_cli,
    installed_account,
    several_accounts,
    when,
)
from flask_gateway.operations.cli.lookup import find_checkout
from flask_gateway.operations.health import REFUSED
from flask_gateway.state import get_state


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
@click.option(
    "--checkout",
    "checkout_given",
    metavar="ORDER_OR_TOKEN",
    default=None,
    help="Only the callbacks of this checkout, given by its order reference or its token (an order with "
    "several checkouts: its most recent).",
)
@account_option(
    "Only callbacks for this merchant account's checkouts (a callback naming no checkout: the account its "
    "header claimed) [default: every account]."
)
@checked("callbacks")
def callbacks_command(
    outcome: str | None, refused: bool, limit: int, checkout_given: str | None, account: str | None
) -> None:
    """The newest callbacks received, one line each, naming the order they were about (the body is in the
    admin's callback log)."""
    account = installed_account(account)
    query = (
        select(CallbackLog, GatewayCheckout.merchant_account_id, GatewayCheckout.order_reference)
        .outerjoin(GatewayCheckout, GatewayCheckout.id == CallbackLog.checkout_id)
        .order_by(CallbackLog.id.desc())
        .limit(limit)
    )
    if checkout_given is not None:
        found = find_checkout(checkout_given, account)
        note = found.note()
        if note:
            click.echo(note, err=True)
        query = query.where(CallbackLog.checkout_id == found.checkout.id)
    if outcome:
        query = query.where(CallbackLog.outcome == outcome)
    if refused:
        query = query.where(REFUSED)
    if account is not None:
        query = query.where(
            or_(
                GatewayCheckout.merchant_account_id == account,
                and_(CallbackLog.checkout_id.is_(None), CallbackLog.merchant_account_id == account),
            )
        )
    rows = get_state().session.execute(query).all()
    if not rows:
        click.echo("No callbacks match.")
        return
    named = several_accounts()
    symbol = get_state().config.currency_symbol
    for row, checkout_account, reference in rows:
        answer = "no answer" if row.http_status == 0 else f"HTTP {row.http_status}"
        checkout = f"order {reference}" if row.checkout_id else "no checkout"
        signature = "verified" if row.verified else "NOT verified"
        if (
            row.verified_with == VerifyingKey.PREVIOUS
        ):  # inside GATEWAY_PREVIOUS_SIGNING_KEY_HOURS of a key change
            signature = "verified with the previous key"
        detail = describe_detail(row.detail, symbol)  # statuses in words, money with the symbol
        client = f"from {row.client_address}  " if row.client_address else ""
        # Several accounts: the checkout's account, else (no checkout) the one the request claimed.
        of = checkout_account or row.merchant_account_id
        shown = f"account {of or '-'}  " if named else ""
        click.echo(
            f"#{row.id}  {when(row.received_at)}  {answer:<9}  {row.outcome:<18}  {signature:<12}  "
            f"{client}{shown}{checkout}{': ' + detail if detail else ''}"
        )


@gateway_cli.command("replay-callback")
@click.argument("log_id", type=int)
@checked("replay-callback")
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
@checked("prune-callbacks")
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
    since = f" received before {when(cutoff)}" if cutoff is not None else ""
    click.echo(f"Deleted {deleted} {what}{since}.")
