"""``flask gateway init-db | reconcile | status | ...`` through ``app.test_cli_runner()``, and what every
command checks first (the line saying what it uses; exit status 78 where it could only succeed by
accident)."""

from __future__ import annotations

import logging
import os
import re
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import inspect, make_url
from sqlalchemy.exc import OperationalError

from flask_gateway import Gateway
from flask_gateway.errors import ConfigurationError
from flask_gateway.models import GatewayBase
from flask_gateway.operations.cli import (
    COMMAND_CHECKS,
    EXIT_CONFIGURATION,
    EXIT_DATABASE_AWAY,
    describe_database,
    gateway_cli,
)
from flask_gateway.testing import EMULATOR_URL
from tests.extension.conftest import Harness, sample_order
from tests.extension.operations.cli_support import run_gateway
from tests.extension.operations.operations_support import load, new_checkout


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


def invoke(harness: Harness, *args: str):
    """stdout and stderr apart: ``result.stdout`` is the command's answer, ``result.stderr`` starts with
    the line saying what it uses."""
    return run_gateway(harness.shop, *args)


@pytest.mark.backends
def test_init_db_creates_only_the_gateway_tables(harness):
    db = harness.db

    class Product(db.Model):  # type: ignore[name-defined,misc]  # a shop table the command must not create
        __tablename__ = "shop_products"
        id = db.Column(db.Integer, primary_key=True)

    with harness.shop.app_context():
        GatewayBase.metadata.drop_all(db.engine)
        assert not [t for t in inspect(db.engine).get_table_names() if t.startswith("gateway_")]
    result = invoke(harness, "init-db")
    assert result.exit_code == 0, result.output
    names = [table.name for table in GatewayBase.metadata.sorted_tables]
    assert f"Created {len(names)} table(s): gateway_" in result.stdout
    with harness.shop.app_context():
        tables = set(inspect(db.engine).get_table_names())
    assert {t.name for t in GatewayBase.metadata.sorted_tables} <= tables
    assert "shop_products" not in tables
    again = invoke(harness, "init-db")
    assert again.exit_code == 0
    assert f"All {len(names)} gateway tables exist already" in again.stdout


@pytest.mark.backends
def test_reconcile_command(installed):
    checkout_id, token = new_checkout(installed)
    installed.emulator.control("faults", {"operation": "callback", "kind": "callback_fail"})
    installed.emulator.pay(token)
    result = invoke(installed, "reconcile", "--older-than", "0")
    assert result.exit_code == 0, result.output
    assert "Polling checkouts" in result.output  # the progress bar's label
    assert "Polled 1 of 1 due checkout(s): 1 changed, 1 payment(s) confirmed, 0 expired, 0 failed." in (
        result.output
    )
    assert "Statuses now: Paid - confirming (PAID_PENDING_CALLBACK): 1" in result.output
    with installed.shop.app_context():
        assert load(installed, checkout_id).status == "PAID_PENDING_CALLBACK"

    # The default age (GATEWAY_RECONCILE_AFTER_SECONDS) leaves what just changed alone.
    quiet = invoke(installed, "reconcile", "--quiet")
    assert quiet.exit_code == 0
    assert quiet.stdout.strip().startswith("Polled 0 of 0 due checkout(s)")
    assert "Polling" not in quiet.output


@pytest.mark.backends
def test_reconcile_command_limit_and_failure_exit_code(installed):
    for n in range(2):
        new_checkout(installed, sample_order(f"ORD-{n}"))
    limited = invoke(installed, "reconcile", "--older-than", "0", "--limit", "1")
    assert limited.exit_code == 0
    assert "Polled 1 of 1 due" in limited.output
    assert invoke(installed, "reconcile", "--limit", "0").exit_code == 2  # click refuses it

    installed.emulator.control("faults", {"operation": "getstatus", "kind": "status", "status": 500})
    failed = invoke(installed, "reconcile", "--older-than", "0")
    assert failed.exit_code == 1
    assert "1 failed" in failed.output
    assert "getstatus: HTTP 500 Injected fault" in failed.output


@pytest.mark.parametrize("command", ["reconcile", "deliver", "prune-callbacks", "check-settings"])
def test_a_scheduled_command_without_an_installation_exits_78(harness, command):
    """Run against a database where the gateway is not installed (the wrong one: cron without the
    environment), a scheduled command must fail, not report "nothing to do" and exit 0."""
    args = [command, "--older-than-days", "90"] if command == "prune-callbacks" else [command]
    result = invoke(harness, *args)
    assert result.exit_code == EXIT_CONFIGURATION == 78, result.output
    first, error = result.stderr.strip().splitlines()
    assert first.startswith("Using database ") and first.endswith(", not installed.")
    assert error.startswith("Error: the gateway is not installed for the emulator environment in ")
    assert "--env-file /etc/shop/environment" in error
    assert result.stdout == ""  # refused before it did anything


def test_status_command(installed):
    checkout_id, token = new_checkout(installed)
    installed.emulator.pay(token)
    result = invoke(installed, "status", token)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Local record" in out and f"#{checkout_id} (v2)" in out
    assert "ORD-1" in out and "R 798.00" in out  # the total with the configured symbol, not cents
    assert "Awaiting payment (PENDING_ORDER)" in out  # the shop has not heard yet
    assert "Gateway (getstatus)" in out
    assert "checkoutPaymentStatus            PAID_PENDING_CALLBACK" in out
    with installed.shop.app_context():
        assert load(installed, checkout_id).status == "PENDING_ORDER"  # read only

    refreshed = invoke(installed, "status", token, "--refresh")
    assert refreshed.exit_code == 0
    assert "Refreshed: PENDING_ORDER -> PAID_PENDING_CALLBACK, applied." in refreshed.output
    with installed.shop.app_context():
        assert load(installed, checkout_id).status == "PAID_PENDING_CALLBACK"


def test_status_command_unknown_token(installed):
    """Nothing local by that token or order reference: one line, exit 1, the gateway not asked (issue 28:
    it was asked anyway, and answered 404)."""
    result = invoke(installed, "status", "v2.demo-merchant.nope")
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines()[-1] == (
        "Error: no checkout has the token or order reference 'v2.demo-merchant.nope' in this shop's database "
        "(`flask gateway checkouts` lists the recent ones); the gateway was not asked."
    )
    assert result.stdout == ""
    # --gateway-only asks the gateway about a token the shop does not have (it answers 404 here).
    asked = invoke(installed, "status", "v2.demo-merchant.nope", "--gateway-only")
    assert asked.exit_code == 1
    assert "No local checkout has token v2.demo-merchant.nope" in asked.stdout
    assert "HTTP 404" in asked.stderr


def _received_callbacks(installed: Harness) -> int:
    """One accepted callback (delivered by the emulator) and one forged (refused), returns the checkout id."""
    checkout_id, token = new_checkout(installed)
    installed.emulator.pay(token)
    assert installed.emulator.control("deliver").status_code == 200
    forged = installed.client.post(
        "/gateway/callback",
        data=b'{"checkoutToken":"' + token.encode() + b'"}',
        headers={"Content-Type": "application/json", "X-Signature": "bm9wZQ==", "X-Merchant-Account-ID": "x"},
    )
    assert forged.status_code == 401
    return checkout_id


def test_callbacks_command_lists_the_newest_first_and_filters(installed):
    checkout_id = _received_callbacks(installed)
    result = invoke(installed, "callbacks")
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert len(lines) == 2
    assert "HTTP 401" in lines[0] and "rejected-signature" in lines[0] and "NOT verified" in lines[0]
    assert "no checkout" in lines[0]  # nothing of an unverified body is trusted, not even its token
    assert "HTTP 200" in lines[1] and "accepted" in lines[1] and "  order ORD-1: " in lines[1]
    assert f"checkout #{checkout_id}" not in lines[1]  # the order, not the row id (issue 28)

    refused = invoke(installed, "callbacks", "--refused").stdout.strip().splitlines()
    assert len(refused) == 1 and "rejected-signature" in refused[0]
    accepted = invoke(installed, "callbacks", "--outcome", "accepted").stdout.strip().splitlines()
    assert len(accepted) == 1 and "accepted" in accepted[0]
    assert invoke(installed, "callbacks", "--outcome", "mismatch").stdout.strip() == "No callbacks match."
    assert invoke(installed, "callbacks", "--outcome", "bogus").exit_code == 2


@pytest.mark.backends
def test_prune_callbacks_deletes_only_old_rows_and_keeps_the_history(installed):
    from datetime import timedelta

    from sqlalchemy import func, select, update

    from flask_gateway.models import CallbackLog, CheckoutEvent
    from flask_gateway.state import get_state

    checkout_id = _received_callbacks(installed)
    with installed.shop.app_context():
        session = get_state().session
        oldest = session.scalars(select(CallbackLog).order_by(CallbackLog.id)).first()
        assert oldest is not None
        session.execute(
            update(CallbackLog)
            .where(CallbackLog.id == oldest.id)
            .values(received_at=oldest.received_at - timedelta(days=91))
        )
        session.commit()
        events = session.scalar(select(func.count()).select_from(CheckoutEvent))

    result = invoke(installed, "prune-callbacks", "--older-than-days", "90")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("Deleted 1 callback log row(s) received before ")
    with installed.shop.app_context():
        session = get_state().session
        left = session.scalars(select(CallbackLog)).all()
        assert [row.outcome for row in left] == ["rejected-signature"]
        assert session.scalar(select(func.count()).select_from(CheckoutEvent)) == events
        assert load(installed, checkout_id).status == "PAID"  # the checkout is untouched
    assert invoke(installed, "prune-callbacks").exit_code == 2  # --older-than-days or --refused is required


def test_prune_callbacks_refused_purges_a_flood_now_and_keeps_verified_rows(installed):
    from sqlalchemy import select

    from flask_gateway.models import CallbackLog
    from flask_gateway.state import get_state

    checkout_id = _received_callbacks(installed)  # one accepted, one refused, both just now
    for _ in range(3):
        installed.client.post("/gateway/callback", data=b"{}", headers={"X-Signature": "bm9wZQ=="})

    result = invoke(installed, "prune-callbacks", "--refused")

    assert result.exit_code == 0, result.output
    assert result.stdout.strip() == "Deleted 4 refused (never verified) callback log row(s)."
    with installed.shop.app_context():
        left = get_state().session.scalars(select(CallbackLog)).all()
        assert [(row.outcome, row.verified, row.checkout_id) for row in left] == [
            ("accepted", True, checkout_id)
        ]
    assert invoke(installed, "prune-callbacks").exit_code == 2  # says what to delete


# --- what every command checks first ------------------------------------------------------------------


def _args(command: str) -> list[str]:
    """The fewest arguments each command runs with."""
    return {
        "status": ["status", "tok-1"],
        "refund": ["refund", "tok-1", "--all", "--yes"],
        "redeliver": ["redeliver", "1"],
        "replay-callback": ["replay-callback", "1"],
        "prune-callbacks": ["prune-callbacks", "--refused"],
        "doctor": ["doctor", "--no-network"],
        "reconcile": ["reconcile", "--quiet"],
        "install": ["install", "--account", "a", "--minimum-cents", "100", "--maximum-cents", "1000"],
        "accounts retire": ["accounts", "retire", "a"],
        "accounts reopen": ["accounts", "reopen", "a"],
        "set-api-key": ["set-api-key", "--account", "a"],
    }.get(command, command.split())


def _shop(database_url: str, **config: Any) -> Flask:
    """A shop with the extension on ``database_url``; no table is created, nothing is installed."""
    app = Flask("cli_shop")
    app.config.update(SECRET_KEY="shop-secret-key-for-the-cli-tests", SQLALCHEMY_DATABASE_URI=database_url)
    app.config.update(config)
    Gateway(app, db=SQLAlchemy(app))
    return app


PRODUCTION: dict[str, Any] = {
    "GATEWAY_ENVIRONMENT": "production",
    "GATEWAY_BASE_URL": "https://checkout.gateway.example",
    "GATEWAY_INSTALL_URL": "https://install.gateway.example",
    "GATEWAY_V1_BASE_URL": "https://v1.gateway.example",
    "GATEWAY_PUBLIC_URL": "https://shop.example",
}


@pytest.mark.backends
def test_every_command_first_says_on_stderr_which_database_gateway_and_account_it_uses(installed):
    with installed.shop.app_context():
        url = installed.db.engine.url
    result = invoke(installed, "callbacks")
    assert result.exit_code == 0, result.output
    first = result.stderr.splitlines()[0]
    assert first == (
        f"Using database {describe_database(url)}, gateway emulator at {EMULATOR_URL}, account demo-merchant."
    )
    assert "Using database" not in result.stdout  # a script reading the answer gets only the answer
    if url.get_backend_name() == "sqlite":
        assert first.startswith(f"Using database SQLite file {url.database}, ")
        assert os.path.isabs(str(url.database))
    else:
        assert first.startswith(f"Using database postgresql+psycopg://{url.username}@")
        if url.password:
            assert str(url.password) not in result.output


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        (
            "postgresql+psycopg://shop:s3cret-pw@db.internal:5432/shop",
            "postgresql+psycopg://shop:***@db.internal:5432/shop",
        ),
        (
            "postgresql+psycopg://shop@/shop?host=/run/postgresql&sslpassword=hunter2",
            "postgresql+psycopg://shop@/shop?host=%2Frun%2Fpostgresql&sslpassword=***",
        ),
        ("sqlite://", "SQLite in memory"),
        ("sqlite:///:memory:", "SQLite in memory"),
        ("sqlite:////srv/shop/instance/shop.sqlite3", "SQLite file /srv/shop/instance/shop.sqlite3"),
    ],
)
def test_describe_database_masks_passwords_and_gives_sqlite_files_absolute(url, shown):
    assert describe_database(make_url(url)) == shown
    assert "s3cret-pw" not in describe_database(make_url(url))


def test_describe_database_makes_a_relative_sqlite_path_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert describe_database(make_url("sqlite:///shop.sqlite3")) == f"SQLite file {tmp_path / 'shop.sqlite3'}"


def _every_command(group: click.Group, prefix: str = "") -> dict[str, click.Command]:
    """Every command of the group, a sub-command named with its group (``accounts retire``)."""
    found: dict[str, click.Command] = {}
    for name, command in group.commands.items():
        found[prefix + name] = command
        if isinstance(command, click.Group):
            found.update(_every_command(command, f"{prefix}{name} "))
    return found


def test_every_command_declares_its_checks_and_the_docs_table_shows_them():
    commands = _every_command(gateway_cli)
    assert "accounts retire" in commands
    assert set(commands) == set(COMMAND_CHECKS)
    for name, command in commands.items():
        assert command.callback is not None
        assert getattr(command.callback, "gateway_checks", None) is COMMAND_CHECKS[name], name
    documented = {}
    section = (Path(__file__).parents[3] / "docs" / "extension.md").read_text().split("## Command line")[1]
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0].startswith("`") and cells[1].split()[0].rstrip(":") in ("yes", "no"):
            documented[cells[0].strip("`")] = (
                cells[1].startswith("yes"),
                cells[2].startswith("yes"),
                cells[3].split()[0],
                "a database that does not answer" in cells[1],
            )
    assert documented == {
        name: (checks.tables, checks.installed, "yes", not checks.database)
        for name, checks in COMMAND_CHECKS.items()
    }


@pytest.mark.parametrize("command", sorted(COMMAND_CHECKS))
def test_a_production_app_on_a_sqlite_database_is_refused_before_the_database_is_opened(tmp_path, command):
    database = tmp_path / "instance" / "shop.sqlite3"
    app = _shop(f"sqlite:///{database}", **PRODUCTION)
    result = run_gateway(app, *_args(command))
    assert result.exit_code == EXIT_CONFIGURATION, result.output
    first, error = result.stderr.strip().splitlines()
    assert first == (
        f"Using database SQLite file {database}, gateway production at https://checkout.gateway.example, "
        "installation not read."
    )
    assert error.startswith(
        f"Error: GATEWAY_ENVIRONMENT is 'production' but the database is SQLite file {database}"
    )
    assert "GATEWAY_SQLITE_IN_PRODUCTION = True" in error
    assert not database.exists()  # SQLite makes the file it is asked to open: not even that


def test_gateway_sqlite_in_production_lets_a_one_machine_shop_run_on_its_sqlite_file(tmp_path):
    database = tmp_path / "shop.sqlite3"
    app = _shop(f"sqlite:///{database}", GATEWAY_SQLITE_IN_PRODUCTION=True, **PRODUCTION)
    created = run_gateway(app, "init-db")
    assert created.exit_code == 0, created.output
    assert created.stdout.startswith("Created ")
    listed = run_gateway(app, "callbacks")
    assert (listed.exit_code, listed.stdout.strip()) == (0, "No callbacks match."), listed.output
    assert listed.stderr.strip().endswith(
        "gateway production at https://checkout.gateway.example, not installed."
    )
    assert run_gateway(app, "reconcile").exit_code == EXIT_CONFIGURATION  # still: not installed
    with pytest.raises(ConfigurationError, match="GATEWAY_SQLITE_IN_PRODUCTION='yes': True or False"):
        _shop(f"sqlite:///{database}", GATEWAY_SQLITE_IN_PRODUCTION="yes", **PRODUCTION)


def test_missing_tables_refuse_every_command_but_init_db_and_doctor(tmp_path):
    database = tmp_path / "empty.sqlite3"
    app = _shop(f"sqlite:///{database}")
    for command in sorted(set(COMMAND_CHECKS) - {"init-db"}):
        result = run_gateway(app, *_args(command))
        first = result.stderr.splitlines()[0]
        assert first.endswith(", installation not read (tables missing)."), (command, result.output)
        if COMMAND_CHECKS[command].tables:
            assert result.exit_code == EXIT_CONFIGURATION, (command, result.output)
            error = result.stderr.strip().splitlines()[1]
            assert error.startswith(
                f"Error: the gateway's tables are missing in SQLite file {database} (gateway_"
            )
            assert error.endswith("run `flask gateway init-db` or your migrations.")
        elif command == "doctor":  # it reports them itself, with the rest
            assert result.exit_code == 1, result.output
            assert "init-db" in result.stdout
    created = run_gateway(app, "init-db")
    assert created.exit_code == 0 and created.stdout.startswith("Created "), created.output
    listed = run_gateway(app, "outbox")
    assert listed.exit_code == 0, listed.output  # not installed: a normal answer for a local listing
    assert listed.stderr.strip().endswith(", not installed.")
    assert listed.stdout.startswith("No outbox events")


def test_a_missing_column_counts_as_missing_tables(tmp_path):
    database = tmp_path / "old.sqlite3"
    app = _shop(f"sqlite:///{database}")
    assert run_gateway(app, "init-db").exit_code == 0
    with sqlite3.connect(database) as connection:
        connection.execute("ALTER TABLE gateway_outbox DROP COLUMN last_error")
    result = run_gateway(app, "outbox")
    assert result.exit_code == EXIT_CONFIGURATION
    assert "(gateway_outbox.last_error): run `flask gateway init-db` or your migrations." in result.stderr


def test_deliver_every_waits_for_the_database_at_start_instead_of_exiting_75(installed, monkeypatch, caplog):
    """A service started while the database is away (a machine booting before its database) keeps trying:
    exiting 75 would have systemd restart it in a loop and give up after five tries in ten seconds."""
    from flask_gateway.operations.cli import group, outbox

    real, calls, rounds = group._read_setup, [], []

    def away_twice(state):
        calls.append(1)
        if len(calls) <= 2:
            raise OperationalError("SELECT 1", {}, Exception("connection refused"))
        return real(state)

    monkeypatch.setattr(group, "_read_setup", away_twice)
    monkeypatch.setattr(outbox, "_deliver_forever", lambda limit, every: rounds.append((limit, every)))
    caplog.set_level(logging.WARNING, logger="flask_gateway.outages")

    result = invoke(installed, "deliver", "--every", "0.5")

    assert result.exit_code == 0, result.output
    assert len(calls) == 3 and rounds == [(100, 0.5)]
    assert result.stderr.strip().splitlines() == [
        f"Using database {_database_of(installed)}, gateway emulator at {EMULATOR_URL}, account demo-merchant."
    ]
    said = [record.getMessage() for record in caplog.records if record.name == "flask_gateway.outages"]
    assert len(said) == 2  # one line when the outage starts, one when it ends
    assert "connection refused" in said[0] and "answers again" in said[1]

    calls.clear()  # without --every: one line and 75, as any command
    once = invoke(installed, "deliver")
    assert once.exit_code == EXIT_DATABASE_AWAY and len(calls) == 1, once.output


def _database_of(harness: Harness) -> str:
    with harness.shop.app_context():
        return describe_database(harness.db.engine.url)


def test_the_doctor_reports_a_database_that_does_not_answer_instead_of_exiting_75():
    """Every other command stops with 75; the doctor says so as a finding, with all it can still check."""
    from tests.extension.operations.test_outages import closed_port_url, shop_on

    app = shop_on(closed_port_url())
    result = run_gateway(app, "doctor", "--no-network")
    assert result.exit_code == 1, result.output
    assert result.stderr.strip().endswith(", installation not read (the database does not answer).")
    assert "[PROBLEM] database: the database cannot be read" in result.stdout
    assert "[ok]      configuration:" in result.stdout
    assert run_gateway(app, "callbacks").exit_code == EXIT_DATABASE_AWAY


def _commands(
    command: click.Command, path: tuple[str, ...]
) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


def test_no_help_text_shows_markup() -> None:
    """``--help`` is read in a terminal: no reST (double backquotes, roles like :func:, bold) in any
    command's help, options included."""
    shown = {}
    for path, command in _commands(gateway_cli, ("gateway",)):
        text = command.get_help(click.Context(command, info_name=" ".join(path)))
        shown[" ".join(path)] = re.findall(r"``|:[a-z]+:`|\*\*", text)
    assert len(shown) > 15  # every command was read
    assert {name: marks for name, marks in shown.items() if marks} == {}
