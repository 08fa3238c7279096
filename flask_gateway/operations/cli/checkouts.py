"""``flask gateway reconcile``, ``status ORDER_OR_TOKEN`` and ``check-settings``: the checkouts and settings
as the gateway sees them."""

from __future__ import annotations

from contextlib import ExitStack
from typing import Any

import click

from flask_gateway.config import MAX_PAID_WINDOW_HOURS, MAX_RECONCILE_CONCURRENCY
from flask_gateway.core.errors import GatewayError
from flask_gateway.core.wire import status_payload_keys
from flask_gateway.errors import NotInstalledError, SecretUnreadable, UnknownAccountError
from flask_gateway.labels import describe_detail, source_label, status_label
from flask_gateway.models import (
    GatewayCheckout,
)
from flask_gateway.operations.cli.group import (
    account_option,
    checked,
    gateway_cli,
    installed_account,
    when,
)
from flask_gateway.operations.cli.lookup import CheckoutNotFound, end_reading, find_checkout, payment_page
from flask_gateway.operations.drift import AccountCheck, check_all_settings, check_settings, scheduled_check
from flask_gateway.operations.reconciliation import PAID_RECHECK_SECONDS, reconcile
from flask_gateway.payments.polling import refresh
from flask_gateway.state import get_state


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
@account_option("Only this merchant account's checkouts [default: every account installed, open or retired].")
@checked("reconcile")
def reconcile_command(
    limit: int | None,
    older_than: float | None,
    paid_window: float | None,
    paid_recheck: float | None,
    concurrency: int | None,
    quiet: bool,
    account: str | None,
) -> None:
    """Ask the gateway about checkouts that are not final, and recently paid ones, and apply the answers."""
    account = installed_account(account)
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
            account=account,
        )
    click.echo(report.summary())
    if report.errors:
        raise SystemExit(1)


def describe(detail: str | None) -> str:
    """A stored detail as a person reads it (statuses in words, money with the configured symbol)."""
    return describe_detail(detail, get_state().config.currency_symbol)


@gateway_cli.command("status")
@click.argument("checkout_given", metavar="ORDER_OR_TOKEN")
@click.option(
    "--refresh",
    "apply_answer",
    is_flag=True,
    help="Apply the gateway's answer to the local record (through the state machine).",
)
@account_option(
    "Only this merchant account's checkouts (an order reference used on several accounts); a checkout is "
    "always asked about with its own account. With --gateway-only: the account to ask [default: the "
    "default account]."
)
@click.option(
    "--gateway-only",
    "gateway_only",
    is_flag=True,
    help="A token this shop's database does not have: ask the gateway about it anyway (exit status 1).",
)
@checked("status")
def status_command(checkout_given: str, apply_answer: bool, account: str | None, gateway_only: bool) -> None:
    """Show one checkout, given by its order reference or its token: the local record and what the
    gateway's getstatus says (an order with several checkouts: its most recent)."""
    account = installed_account(account)
    state = get_state()
    checkout: GatewayCheckout | None = None
    token = checkout_given
    try:
        found = find_checkout(checkout_given, account)
    except CheckoutNotFound:
        if not gateway_only:
            raise
        click.echo(f"No local checkout has token {checkout_given}.")
    else:
        checkout = found.checkout
        token = checkout.token or ""
        note = found.note()
        if note:
            click.echo(note)
    if checkout is not None:
        label = status_label(checkout.status)
        rows = [
            ("order", checkout.order_reference),
            ("token", checkout.token or "- (the gateway gave none)"),
            (
                "status",
                f"{label.text} ({checkout.status})"
                + ("  [FLAGGED: " + describe(checkout.flag_reason) + "]" if checkout.flagged else ""),
            ),
            ("total", state.money(checkout.total_cents)),
            ("paid", state.money(checkout.paid_cents)),
            ("refunded", state.money(checkout.refunded_cents)),
            ("payment page", payment_page(checkout.payment_url)),
            ("checkout", f"#{checkout.id} ({checkout.api_version})"),
            ("merchant account", checkout.merchant_account_id),
            ("request id", checkout.request_id),
            ("created", when(checkout.created_at)),
            ("updated", when(checkout.updated_at)),
            ("expires", when(checkout.expires_at)),
            ("paid at", when(checkout.paid_at)),
            ("last callback", when(checkout.last_callback_at)),
            ("last polled", when(checkout.last_polled_at)),
        ]
        click.echo("Local record")
        for name, value in rows:
            click.echo(f"  {name:<17}{value}")
        if checkout.events:
            click.echo("  recent events")
            for event in checkout.events[-5:]:
                mark = "" if event.applied else " (not applied)"
                before = status_label(event.from_status).text if event.from_status else "-"
                after = status_label(event.to_status).text if event.to_status else "-"
                click.echo(
                    f"    {when(event.at)}  {source_label(event.source)}: {before} -> {after}"
                    f"{mark}{': ' + describe(event.detail) if event.detail else ''}"
                )
        if checkout.api_version != "v2":
            click.echo("The v1 API has no status query: the outcome arrives on the success/fail URLs.")
            return
        if not checkout.token:
            click.echo("The gateway gave this checkout no token: there is nothing to ask it about.")
            raise SystemExit(1)
    try:
        if apply_answer and checkout is not None:
            end_reading()
            transition = refresh(checkout, source="admin")
            verb = "applied" if transition.applied else f"not applied ({transition.reason})"
            click.echo(f"Refreshed: {transition.before} -> {transition.after}, {verb}.")
        asking = checkout.merchant_account_id if checkout is not None else account
        client = state.client(account=asking)
        end_reading()
        payload = client.get_status(token).data.to_wire(state.config.wire_names)
    except (GatewayError, NotInstalledError, UnknownAccountError, SecretUnreadable) as error:
        click.echo(f"The gateway could not be asked: {error}", err=True)
        raise SystemExit(1) from None
    click.echo("Gateway (getstatus)")
    for key in status_payload_keys(state.config.wire_names):
        answer = payload.get(key)
        shown = "-" if answer is None else payment_page(str(answer)) if key == "paymentUrl" else str(answer)
        click.echo(f"  {key:<33}{shown}")
    if checkout is None:
        raise SystemExit(1)


@gateway_cli.command("check-settings")
@account_option("Only this merchant account [default: every account installed, open or retired].")
@click.option(
    "--no-repair",
    "no_repair",
    is_flag=True,
    help="Only compare: put nothing back and record no incident.",
)
@checked("check-settings")
def check_settings_command(account: str | None, no_repair: bool) -> None:
    """Compare the gateway's settings with the shop's, put the shop's callback URL, e-mail and limits back
    where they differ (not with --no-repair), and say what differed (exit 1 when something did). For cron:
    it checks whenever it runs, whatever GATEWAY_SETTINGS_CHECK_SECONDS says (the schedules' bound)."""
    account = installed_account(account)
    installed = get_state().installations()
    # Every account with repairs: the schedules' check, recorded as theirs (the doctor reads it).
    every: list[AccountCheck] | None = (
        scheduled_check(force=True).checks if account is None and not no_repair else None
    )
    if account is not None or (len(installed) == 1 and not installed[0].retired):
        # One account (named, or the shop's only one): its report, as the command always printed it.
        try:
            if every is not None:
                (check,) = every
                if check.report is None:
                    raise ValueError(check.error)
                report = check.report
            else:
                report = check_settings(account, repair=not no_repair)
        except (GatewayError, NotInstalledError, UnknownAccountError, SecretUnreadable, ValueError) as error:
            click.echo(f"The gateway's settings could not be checked: {error}", err=True)
            raise SystemExit(1) from None
        if len(installed) > 1:
            click.echo(f"Merchant account {account}:")
        click.echo(report.summary())
        if not report.ok:
            raise SystemExit(1)
        return
    # Several accounts: each one checked, one failing never stopping the others.
    checks = every if every is not None else check_all_settings()
    open_ = [check.account for check in checks if not check.retired]
    default = open_[-1] if open_ else None
    for check in checks:
        mark = " (default)" if check.account == default else " (retired)" if check.retired else ""
        if check.report is not None:
            click.echo(f"{check.account}{mark}: {check.report.summary()}")
        else:
            click.echo(f"{check.account}{mark}: could not be checked: {check.error}")
    failing = [check.account for check in checks if not check.ok]
    if failing:
        click.echo(f"Not the shop's, or not checked: {', '.join(failing)}.", err=True)
        raise SystemExit(1)
