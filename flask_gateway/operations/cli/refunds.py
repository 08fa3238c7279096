"""``flask gateway refund ORDER_OR_TOKEN [AMOUNT | --all]``: the admin screen's refund, from a terminal.

The admin's rules: the amount in the shop's money (``100.00``, ``R 1 234.50``) or everything that is left;
never more than is left; shown for confirmation first (unless ``--yes``), and refused when the refunded
total changed while the owner read it; one refund however often the command is run again after a lost
answer (the pending refund is retried with its own ``requestId``).

Exit status by outcome: 0 refunded; 1 not refunded (the shop's rules, the gateway declined, not confirmed);
75 (``EX_TEMPFAIL``) no answer from the gateway: the refund is pending, and the same command retries it.
"""

from __future__ import annotations

from typing import Final

import click

from flask_gateway.core.errors import GatewayError
from flask_gateway.core.money import format_money, parse_amount
from flask_gateway.core.wire import REFUNDABLE_STATUSES, CheckoutStatus
from flask_gateway.errors import (
    NotInstalledError,
    RefundDeclinedError,
    RefundNotAllowedError,
    SecretUnreadable,
)
from flask_gateway.labels import describe_detail, status_label
from flask_gateway.models import GatewayCheckout, RefundState
from flask_gateway.operations.cli.group import account_option, checked, gateway_cli, installed_account
from flask_gateway.operations.cli.lookup import end_reading, find_checkout
from flask_gateway.payments.refunds import refund
from flask_gateway.state import get_state

__all__ = ["EXIT_REFUND_PENDING", "refund_command"]

#: The refund was asked for and no answer came: it is pending (``EX_TEMPFAIL``, as for a database outage),
#: and running the same command again retries it with the same ``requestId``.
EXIT_REFUND_PENDING: Final = 75


class RefundPending(click.ClickException):
    """No answer from the gateway: one line, exit status :data:`EXIT_REFUND_PENDING`."""

    exit_code = EXIT_REFUND_PENDING


@gateway_cli.command("refund")
@click.argument("checkout_given", metavar="ORDER_OR_TOKEN")
@click.argument("amount_given", metavar="[AMOUNT]", required=False)
@click.option("--all", "everything", is_flag=True, help="Refund everything that is left (instead of AMOUNT).")
@click.option("--reason", default="", help="Why (sent to the gateway, at most 1000 characters).")
@click.option("--yes", "confirmed", is_flag=True, help="Refund without asking for confirmation.")
@account_option("Only this merchant account's checkouts (an order reference used on several accounts).")
@checked("refund")
def refund_command(
    checkout_given: str,
    amount_given: str | None,
    everything: bool,
    reason: str,
    confirmed: bool,
    account: str | None,
) -> None:
    """Refund AMOUNT (in the shop's money, e.g. 100.00) of a paid checkout, or --all that is left. The
    checkout is given by its order reference or its token (an order with several: its most recent). Asks
    for confirmation unless --yes. Exit 0 refunded, 1 not refunded, 75 no answer (the refund is pending:
    run the same command again to retry it; the gateway refunds once)."""
    if (amount_given is None) == (not everything):
        raise click.UsageError(
            "give the amount to refund (for example 100.00) or --all, not both"
            if everything
            else "give the amount to refund (for example 100.00), or --all for everything that is left"
        )
    account = installed_account(account)
    state = get_state()
    symbol = state.config.currency_symbol
    found = find_checkout(checkout_given, account)
    checkout = found.checkout
    note = found.note()
    if note:
        click.echo(note)
    order = f"order {checkout.order_reference} ({checkout.token or f'checkout #{checkout.id}'})"
    left = max(checkout.paid_cents - checkout.refunded_cents, 0)
    # A fully refunded checkout is told "nothing is left" below, as the admin screen tells it.
    if checkout.status not in REFUNDABLE_STATUSES and checkout.status != CheckoutStatus.FULLY_REFUNDED:
        raise click.ClickException(
            f"{order} is {status_label(checkout.status).text.lower()} ({checkout.status}): only a paid "
            "checkout can be refunded."
        )
    if amount_given is None:
        amount = left
    else:
        try:
            amount = parse_amount(amount_given, symbol=symbol)
        except ValueError as error:
            raise click.BadParameter(str(error), param_hint="AMOUNT") from None
        if amount <= 0:
            raise click.BadParameter("The refund must be more than zero.", param_hint="AMOUNT")
    if amount > left or amount <= 0:
        raise click.ClickException(
            f"at most {format_money(left, symbol)} of {order} can be refunded."
            if left
            else f"nothing is left to refund of {order}."
        )
    refunded_before = checkout.refunded_cents
    paid, before, rest = (
        format_money(cents, symbol) for cents in (checkout.paid_cents, refunded_before, left)
    )
    because = f"; reason: {reason}" if reason else ""
    click.echo(
        f"Refund {format_money(amount, symbol)} of {order}: paid {paid}, refunded so far {before}, "
        f"left {rest}{because}."
    )
    end_reading()  # nothing is held while the owner reads
    if not confirmed:
        try:
            agreed = click.confirm(f"Refund {format_money(amount, symbol)}?", err=True)
        except click.Abort:  # no terminal, or Ctrl-C/Ctrl-D at the question: the line after it says why
            click.echo(err=True)
            agreed = False
        if not agreed:
            raise click.ClickException(
                f"nothing was refunded: the refund of {format_money(amount, symbol)} was not confirmed "
                "(answer y at the question, or pass --yes)."
            )
        # Read again: a refund made meanwhile (the admin screen, another terminal) is not repeated unseen.
        state.session.refresh(checkout)
        if checkout.refunded_cents != refunded_before:
            raise click.ClickException(
                f"the refunded total of {order} changed while you read this (now "
                f"{format_money(checkout.refunded_cents, symbol)}): nothing was refunded; run the command "
                "again to review the amount."
            )
    _refund(checkout, amount, reason, order)


def _refund(checkout: GatewayCheckout, amount: int, reason: str, order: str) -> None:
    state = get_state()
    symbol = state.config.currency_symbol
    shown = format_money(amount, symbol)
    try:
        record = refund(checkout, amount, reason=reason)
    except RefundNotAllowedError as error:
        raise click.ClickException(f"the refund of {shown} was not made: {error}.") from None
    except RefundDeclinedError as error:
        raise click.ClickException(f"the gateway declined the refund of {shown}: {error.cause}.") from None
    except (NotInstalledError, SecretUnreadable) as error:
        raise click.ClickException(f"the refund of {shown} was not made: {error}") from None
    except GatewayError as error:
        raise RefundPending(
            f"no answer from the gateway ({error}): the refund of {shown} of {order} is pending. Run the "
            "same command again to retry it: it goes with the same request id, so the gateway refunds once."
        ) from None
    if record.state == RefundState.SUCCEEDED:
        click.echo(
            f"Refunded {shown} of {order}: refunded {format_money(checkout.refunded_cents, symbol)} of "
            f"{format_money(checkout.paid_cents, symbol)} in all; status "
            f"{status_label(checkout.status).text} ({checkout.status})."
        )
        return
    why = describe_detail(record.error, symbol) or "see `flask gateway status`"
    if record.state == RefundState.PENDING:
        raise RefundPending(
            f"the refund of {shown} of {order} is pending: {why}. Run the same command again."
        )
    raise click.ClickException(f"the refund of {shown} of {order} failed: {why}.")
