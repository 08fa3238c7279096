"""``flask gateway checkouts``: the recent checkouts, newest first, one line each (or ``--json``).

A person reads the status in words, the total with the shop's currency symbol and the age; ``--json``
gives the codes, cents and ISO 8601 times in UTC for a script. The order reference it shows is what
``status`` and ``callbacks --checkout`` take.
"""

from __future__ import annotations

import json
from typing import Any

import click
from sqlalchemy import select

from flask_gateway.core.timestamps import utcnow
from flask_gateway.labels import STATUS_LABELS, status_label
from flask_gateway.models import GatewayCheckout
from flask_gateway.operations.cli.group import (
    account_option,
    checked,
    gateway_cli,
    installed_account,
    several_accounts,
)
from flask_gateway.operations.cli.lookup import age, iso_utc
from flask_gateway.state import get_state


def _status_codes(given: tuple[str, ...]) -> list[str]:
    """The status codes ``--status`` names: each a code (``PAID``) or its words (``paid - confirming``),
    in any case. One that names none is a usage error listing the known ones."""
    by_word = {label.text.casefold(): code for code, label in STATUS_LABELS.items()}
    by_code = {code.casefold(): code for code in STATUS_LABELS}
    codes: list[str] = []
    for text in given:
        key = " ".join(text.split()).casefold()
        code = by_code.get(key) or by_word.get(key)
        if code is None:
            known = "; ".join(f"{known} ({label.text})" for known, label in STATUS_LABELS.items())
            raise click.BadParameter(f"{text!r} is no checkout status ({known}).", param_hint="--status")
        codes.append(code)
    return codes


def _described(checkout: GatewayCheckout) -> dict[str, Any]:
    """One checkout as ``--json`` gives it: codes, cents, ISO 8601 UTC times (no secret: none is here)."""
    return {
        "order_reference": checkout.order_reference,
        "token": checkout.token,
        "status": checkout.status,
        "total_cents": checkout.total_cents,
        "paid_cents": checkout.paid_cents,
        "refunded_cents": checkout.refunded_cents,
        "account": checkout.merchant_account_id,
        "api_version": checkout.api_version,
        "flagged": checkout.flagged,
        "created_at": iso_utc(checkout.created_at),
        "updated_at": iso_utc(checkout.updated_at),
        "expires_at": iso_utc(checkout.expires_at),
        "paid_at": iso_utc(checkout.paid_at),
    }


@gateway_cli.command("checkouts")
@click.option(
    "--status",
    "statuses",
    multiple=True,
    metavar="STATUS",
    help='Only checkouts in this status: its code (PAID_PENDING_CALLBACK) or its words ("paid - '
    'confirming"), in any case; repeatable.',
)
@click.option("--limit", type=click.IntRange(min=1, max=10_000), default=20, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="A JSON list: status codes, cents, ISO 8601 UTC times.")
@account_option("Only this merchant account's checkouts [default: every account].")
@checked("checkouts")
def checkouts_command(statuses: tuple[str, ...], limit: int, as_json: bool, account: str | None) -> None:
    """The recent checkouts, newest first: status, order reference, total, age (and the account once there
    are several). `flask gateway status ORDER` shows one of them."""
    codes = _status_codes(statuses)
    account = installed_account(account)
    state = get_state()
    query = (
        select(GatewayCheckout)
        .order_by(GatewayCheckout.created_at.desc(), GatewayCheckout.id.desc())
        .limit(limit)
    )
    if codes:
        query = query.where(GatewayCheckout.status.in_(codes))
    if account is not None:
        query = query.where(GatewayCheckout.merchant_account_id == account)
    rows = state.session.scalars(query).all()
    if as_json:
        click.echo(json.dumps([_described(row) for row in rows], indent=2))
        return
    if not rows:
        what = " or ".join(status_label(code).text for code in codes)
        of = f" of account {account}" if account is not None else ""
        click.echo(f"No {what + ' ' if what else ''}checkouts{of}.")
        return
    named = several_accounts()
    now = utcnow()
    lines = [
        (
            status_label(row.status).text + (" [flagged]" if row.flagged else ""),
            row.order_reference,
            state.money(row.total_cents),
            age(row.created_at, now),
            row.merchant_account_id if named else "",
            row.token or "-",
        )
        for row in rows
    ]
    header = ("Status", "Order", "Total", "Age", "Account" if named else "", "Token")
    widths = [max(len(line[i]) for line in [header, *lines]) for i in range(5)]
    for line in [header, *lines]:
        cells = [line[i].rjust(widths[i]) if i == 2 else line[i].ljust(widths[i]) for i in range(5)]
        shown = [cell for i, cell in enumerate(cells) if i != 4 or named]
        click.echo("  ".join([*shown, line[5]]).rstrip())
