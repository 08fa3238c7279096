"""``flask gateway init-db`` and ``doctor``: the tables made, and the whole setup checked."""

from __future__ import annotations

import click
from sqlalchemy import inspect

from flask_gateway.core.sql import create_all_safely
from flask_gateway.models import (
    GatewayBase,
)
from flask_gateway.operations.cli.group import (
    checked,
    gateway_cli,
)
from flask_gateway.operations.doctor import DEFAULT_TIMEOUT, run_checks
from flask_gateway.state import get_state


@gateway_cli.command("init-db")
@checked("init-db")
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


_MARK_STYLE = {"ok": "green", "info": "cyan", "warn": "yellow", "problem": "red", "unknown": None}


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
@checked("doctor")
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
