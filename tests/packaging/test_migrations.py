"""Migrations that just work (issue 14; docs/migrations.md): a shop's Flask-Migrate handles the ``gateway_*``
tables with no change to its ``env.py``.

The extension's tables join the shop's metadata as copies with the types the database stores
(``copy_tables_as_stored``): autogenerate writes ``sa.DateTime(timezone=True)``, never
``flask_gateway.core.sql.UTCDateTime(...)`` without its import (the ``NameError`` at ``flask db upgrade``
this used to be). Each test writes a minimal shop in a fresh folder and runs ``flask db ...`` there, on
SQLite and on PostgreSQL: the first test types the commands as a shop developer would (``flask db ...`` in
subprocesses), the upgrade scenarios run the same command line through Click's ``CliRunner`` in this process
(``typed=False``: what they prove is in the scripts written and the rows kept, and a ``flask`` process costs
a second or two of imports per command; issue 30).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from click.testing import CliRunner
from flask import Flask
from flask.cli import cli as flask_cli
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import DateTime, MetaData, Table, create_engine, insert, inspect, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from sqlalchemy.pool import NullPool

from flask_gateway import Gateway, UTCDateTime, alembic_render_item
from flask_gateway.core.signing import sign
from flask_gateway.core.sql import copy_tables_as_stored
from flask_gateway.core.wire.v2 import CheckoutStatusPayload
from flask_gateway.models import GatewayBase, GatewayCheckout
from flask_gateway.payments.accounts import choose_account
from flask_gateway.secrets import SecretBox
from flask_gateway.state import get_state
from tests.conftest import Databases, dispose_engines, fetch_all, new_connection
from tests.extension.conftest import EMULATOR_URL, SHOP_URL

FLASK = Path(sys.executable).with_name("flask")
NO_CHANGES = "No changes in schema detected."

SHOP = '''"""shop.py: a minimal shop whose schema Flask-Migrate manages (tests/packaging/test_migrations.py)."""

import os

import sqlalchemy as sa
from flask import Flask
from flask_migrate import Migrate
from flask_sqlalchemy import SQLAlchemy

from flask_gateway import Gateway, UTCDateTime, alembic_render_item
from flask_gateway.models import GatewayBase

db = SQLAlchemy()
migrate = Migrate()


class Order(db.Model):
    __tablename__ = "shop_orders"
    id = db.Column(db.Integer, primary_key=True)
    reference = db.Column(db.String(40), unique=True, nullable=False)
    total_cents = db.Column(db.Integer, nullable=False)
    placed_at = db.Column(PLACED_AT_TYPE, nullable=True)


def stored_columns(table, *left_out):
    return (
        sa.Column(
            column.name,
            sa.DateTime(timezone=True) if isinstance(column.type, UTCDateTime) else column.type,
            primary_key=column.primary_key,
            autoincrement=column.autoincrement,
            nullable=column.nullable,
            unique=column.unique,
        )
        for column in table.columns
        if column.name not in left_out
    )


def previous_gateway_schema(metadata):
    """The gateway_* tables as an earlier Flask-Gateway had them: gateway_checkouts without the column
    fail_reason and the index ix_gateway_checkouts_reference, no table gateway_rate_limits."""
    current = GatewayBase.metadata.tables["gateway_checkouts"]
    sa.Table(
        current.name,
        metadata,
        *stored_columns(current, "fail_reason"),
        sa.Index("ix_gateway_checkouts_status_updated", "status", "updated_at"),
    )


def gateway_schema_before_accounts(metadata):
    """gateway_installations as it was before several merchant accounts (issue 27): no column retired_at,
    no unique index ux_gateway_installations_account."""
    current = GatewayBase.metadata.tables["gateway_installations"]
    sa.Table(current.name, metadata, *stored_columns(current, "retired_at"))


def create_app():
    app = Flask(__name__)
    app.config.update(
        SECRET_KEY="a secret for the migration tests only",
        SQLALCHEMY_DATABASE_URI=os.environ["SHOP_DATABASE_URL"],
    )
    db.init_app(app)
    previous = os.environ.get("SHOP_GATEWAY_SCHEMA") == "previous"
    if previous:
        previous_gateway_schema(db.metadata)
    if os.environ.get("SHOP_GATEWAY_SCHEMA") == "before-accounts":
        gateway_schema_before_accounts(db.metadata)
    Gateway(app, db=db)
    if previous:
        db.metadata.remove(db.metadata.tables["gateway_rate_limits"])
    migrate.init_app(app, db, MIGRATE_ARGUMENTS)
    return app
'''


def write_shop(folder: Path, *, own_utc_column: bool = False) -> Path:
    """``shop.py`` in ``folder``: ``placed_at`` a ``UTCDateTime`` with the render hook, or a plain ``DateTime``
    with ``Migrate(app, db)`` as it comes."""
    source = SHOP.replace(
        "PLACED_AT_TYPE", "UTCDateTime()" if own_utc_column else "sa.DateTime(timezone=True)"
    ).replace(", MIGRATE_ARGUMENTS", ", render_item=alembic_render_item" if own_utc_column else "")
    (folder / "shop.py").write_text(source, encoding="utf-8")
    return folder


def flask_db(
    folder: Path, url: str, *args: str, previous: bool = False, schema: str = "current", typed: bool = False
) -> str:
    """``flask db ARGS`` in ``folder`` (FLASK_APP=shop); its output (standard output and error).
    ``schema``: ``current``, ``previous`` (also ``previous=True``) or ``before-accounts``. ``typed``: the
    ``flask`` program in a subprocess, as a developer types it; else the same command line in this process
    (``flask_db_in_process``)."""
    shop_env = {
        "FLASK_APP": "shop",
        "SHOP_DATABASE_URL": url,
        "SHOP_GATEWAY_SCHEMA": "previous" if previous else schema,
    }
    if not typed:
        return flask_db_in_process(folder, shop_env, args)
    env = {**os.environ, **shop_env}
    env.pop("FLASK_DEBUG", None)
    result = subprocess.run(
        [str(FLASK), "db", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 0, f"flask db {' '.join(args)} failed:\n{output}"
    return output


@contextmanager
def _logging_kept() -> Iterator[None]:
    """Alembic's ``env.py`` configures logging from ``alembic.ini`` (``fileConfig``: the root logger's handlers
    replaced, every other logger disabled): a process of its own does not mind, this one does (pytest's log
    capture, later tests' ``caplog``). Everything it changes is put back."""
    manager = logging.Logger.manager
    root = logging.getLogger()
    root_state = (root.level, list(root.handlers), root.disabled)
    loggers = {
        name: (logger.level, list(logger.handlers), logger.propagate, logger.disabled)
        for name, logger in list(manager.loggerDict.items())
        if isinstance(logger, logging.Logger)
    }
    try:
        yield
    finally:
        root.setLevel(root_state[0])
        root.handlers[:] = root_state[1]
        root.disabled = root_state[2]
        for name, logger in list(manager.loggerDict.items()):
            if not isinstance(logger, logging.Logger):
                continue
            level, handlers, propagate, disabled = loggers.get(name, (logging.NOTSET, [], True, False))
            logger.setLevel(level)
            logger.handlers[:] = handlers
            logger.propagate = propagate
            logger.disabled = disabled


def flask_db_in_process(folder: Path, shop_env: dict[str, str], args: tuple[str, ...]) -> str:
    """``flask db ARGS`` as the ``flask`` program runs it (Flask's own ``cli``: ``FLASK_APP`` found, the
    app factory called, Flask-Migrate's commands), through Click's ``CliRunner`` in this process, in
    ``folder``. As a fresh process would, it imports ``shop.py`` anew (the module forgotten before and
    after), warns as Python does by default (not this suite's ``filterwarnings = error``: Flask-Migrate's own
    ``env.py`` calls Flask-SQLAlchemy's deprecated ``get_engine``), and closes every database connection."""
    saved_path = list(sys.path)
    sys.modules.pop("shop", None)
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        with _logging_kept(), warnings.catch_warnings():
            warnings.resetwarnings()  # Python's defaults, as a ``flask`` process starts with
            warnings.simplefilter("default")
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning, ResourceWarning):
                warnings.simplefilter("ignore", category)
            result = CliRunner().invoke(
                flask_cli, ["db", *args], env={**shop_env, "FLASK_DEBUG": None}, prog_name="flask"
            )
    finally:
        os.chdir(cwd)
        sys.path[:] = saved_path
        sys.modules.pop("shop", None)
        dispose_engines()
    output = result.output
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise AssertionError(f"flask db {' '.join(args)} raised:\n{output}") from result.exception
    assert result.exit_code == 0, f"flask db {' '.join(args)} failed ({result.exit_code}):\n{output}"
    return output


def scripts(folder: Path) -> list[Path]:
    return sorted((folder / "migrations" / "versions").glob("*.py"), key=lambda path: path.stat().st_mtime)


def migrate(
    folder: Path,
    url: str,
    message: str,
    *,
    previous: bool = False,
    schema: str = "current",
    typed: bool = False,
) -> str:
    """``flask db migrate -m MESSAGE``: the text of the script it wrote."""
    before = set(scripts(folder))
    output = flask_db(folder, url, "migrate", "-m", message, previous=previous, schema=schema, typed=typed)
    written = [path for path in scripts(folder) if path not in before]
    assert len(written) == 1, output
    return written[0].read_text(encoding="utf-8")


def assert_no_changes(folder: Path, url: str, *, typed: bool = False) -> None:
    before = set(scripts(folder))
    output = flask_db(folder, url, "migrate", "-m", "nothing", typed=typed)
    assert NO_CHANGES in output, output
    assert set(scripts(folder)) == before


def assert_runs_without_imports(script: str) -> None:
    """The script names no type that it does not import: only ``sa.`` and ``op.`` (and the dialect modules
    Alembic imports itself)."""
    assert "flask_gateway" not in script, script
    assert "UTCDateTime" not in script, script
    imports = {line for line in script.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"from alembic import op", "import sqlalchemy as sa"} | {
        line for line in imports if line.startswith("from sqlalchemy.dialects import ")
    }, imports


def table_names(url: str) -> set[str]:
    with new_connection(url) as connection:
        return set(inspect(connection).get_table_names())


def column_names(url: str, table: str) -> set[str]:
    with new_connection(url) as connection:
        return {column["name"] for column in inspect(connection).get_columns(table)}


GATEWAY_TABLES = set(GatewayBase.metadata.tables)


@pytest.mark.backends
def test_autogenerate_writes_a_migration_of_the_gateway_tables_that_runs(
    tmp_path: Path, databases: Databases
):
    """Typed as a shop developer would: the ``flask`` program, in a subprocess each time."""
    url = databases.url("shop")
    shop = write_shop(tmp_path)
    flask_db(shop, url, "init", typed=True)
    script = migrate(shop, url, "initial", typed=True)
    assert_runs_without_imports(script)
    assert "sa.DateTime(timezone=True)" in script
    for name in [*GATEWAY_TABLES, "shop_orders"]:
        assert f"op.create_table('{name}'" in script, name

    flask_db(shop, url, "upgrade", typed=True)
    assert table_names(url) == {*GATEWAY_TABLES, "shop_orders", "alembic_version"}
    for name, table in GatewayBase.metadata.tables.items():
        assert column_names(url, name) == set(table.columns.keys()), name

    assert_no_changes(shop, url, typed=True)


@pytest.mark.backends
def test_upgrading_from_an_earlier_gateway_schema_keeps_the_rows(tmp_path: Path, databases: Databases):
    """The shop's history began with an earlier extension; the next version adds a column, an index and a
    table: ``flask db migrate`` finds exactly those, the upgrade keeps every row."""
    url = databases.url("shop")
    shop = write_shop(tmp_path)
    flask_db(shop, url, "init")
    first = migrate(shop, url, "initial", previous=True)
    assert "gateway_rate_limits" not in first and "fail_reason" not in first
    flask_db(shop, url, "upgrade", previous=True)
    assert "gateway_rate_limits" not in table_names(url)
    assert "fail_reason" not in column_names(url, "gateway_checkouts")

    created = datetime(2026, 3, 1, 9, 30, 15, 123456, tzinfo=UTC)
    with new_connection(url) as connection:
        checkouts = Table("gateway_checkouts", MetaData(), autoload_with=connection)
        connection.execute(
            insert(checkouts),
            {
                "api_version": "v2",
                "order_reference": "ORDER-1",
                "request_id": "request-1",
                "token": "v2.demo-merchant.token-1",
                "merchant_account_id": "demo-merchant",
                "status": "PAID",
                "total_cents": 12_345,
                "paid_cents": 12_345,
                "refunded_cents": 0,
                "order": {"lines": [{"name": "Enamel kettle"}]},
                "created_at": created,
                "updated_at": created,
                "flagged": False,
            },
        )
        orders = Table("shop_orders", MetaData(), autoload_with=connection)
        connection.execute(insert(orders), {"reference": "ORDER-1", "total_cents": 12_345})

    upgrade = migrate(shop, url, "flask-gateway upgrade")
    assert_runs_without_imports(upgrade)
    assert re.search(r"op\.create_table\('gateway_rate_limits'", upgrade), upgrade
    assert re.search(r"add_column\(sa\.Column\('fail_reason'", upgrade), upgrade
    assert "ix_gateway_checkouts_reference" in upgrade
    assert "shop_orders" not in upgrade, "the shop's own table did not change"
    flask_db(shop, url, "upgrade")

    assert table_names(url) == {*GATEWAY_TABLES, "shop_orders", "alembic_version"}
    assert fetch_all(url, "SELECT reference, total_cents FROM shop_orders") == [("ORDER-1", 12_345)]
    engine = create_engine(url, poolclass=NullPool)
    try:
        with Session(engine) as session:
            checkout = session.scalars(select(GatewayCheckout)).one()
            assert (checkout.order_reference, checkout.status, checkout.total_cents) == (
                "ORDER-1",
                "PAID",
                12_345,
            )
            assert checkout.created_at == created and checkout.created_at.tzinfo is UTC
            assert checkout.order == {"lines": [{"name": "Enamel kettle"}]}
            assert checkout.fail_reason is None
    finally:
        engine.dispose()
    with new_connection(url) as connection:
        indexes = {index["name"] for index in inspect(connection).get_indexes("gateway_checkouts")}
    assert "ix_gateway_checkouts_reference" in indexes

    assert_no_changes(shop, url)


SECRET_KEY = "a secret for the migration tests only"  # the SHOP's: it protects the stored keys
ACCOUNT = "demo-merchant"
SIGNING_KEY = "the signing key the gateway sent at install"


def upgraded_shop(url: str) -> tuple[Flask, SQLAlchemy]:
    """The shop's app as it runs after the upgrade (this Flask-Gateway), on the upgraded database: the same
    SECRET_KEY as the shop's, no table created (the migration did that)."""
    app = Flask("upgraded_shop")
    app.config.update(
        TESTING=True,
        SECRET_KEY=SECRET_KEY,
        SQLALCHEMY_DATABASE_URI=url,
        GATEWAY_ENVIRONMENT="emulator",
        GATEWAY_BASE_URL=EMULATOR_URL,
        GATEWAY_INSTALL_URL=f"{EMULATOR_URL}/install",
        GATEWAY_V1_BASE_URL=EMULATOR_URL,
        GATEWAY_PUBLIC_URL=SHOP_URL,
        # No gateway here to confirm with: the callback's signature is what this test is about.
        GATEWAY_CONFIRM_CALLBACKS=False,
        GATEWAY_MAX_RETRIES=0,
    )
    db = SQLAlchemy()
    db.init_app(app)
    Gateway(app, db=db)
    return app, db


def paid_callback(token: str, total_cents: int, key: str) -> tuple[bytes, dict[str, str]]:
    now = datetime.now(UTC)
    body = CheckoutStatusPayload(
        checkoutToken=token,
        checkoutTotalCents=total_cents,
        checkoutPaymentStatus="PAID",
        paidAt=now,
        paymentReference=700_000_001,
        createdAt=now,
        updatedAt=now,
    ).to_json()
    return body, {
        "Content-Type": "application/json",
        "X-Merchant-Account-ID": ACCOUNT,
        "X-Signature": sign(body, key),
    }


@pytest.mark.backends
def test_upgrading_to_several_accounts_makes_the_installation_the_first_account(
    tmp_path: Path, databases: Databases
):
    """Issue 27: gateway_installations gains retired_at and the unique index on (environment, account).
    ``flask db migrate`` finds exactly those two; after ``upgrade`` the shop's one installation is its first,
    default and open account, and a callback for a checkout created before the upgrade still verifies."""
    url = databases.url("shop")
    shop = write_shop(tmp_path)
    flask_db(shop, url, "init")
    first = migrate(shop, url, "initial", schema="before-accounts")
    assert "retired_at" not in first and "ux_gateway_installations_account" not in first
    flask_db(shop, url, "upgrade", schema="before-accounts")
    assert "retired_at" not in column_names(url, "gateway_installations")

    box = SecretBox(None, SECRET_KEY)
    installed = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
    with new_connection(url) as connection:
        installations = Table("gateway_installations", MetaData(), autoload_with=connection)
        connection.execute(
            insert(installations),
            {
                "environment": "emulator",
                "merchant_account_id": ACCOUNT,
                "api_key_encrypted": box.encrypt("demo-api-key"),
                "signing_key_encrypted": box.encrypt(SIGNING_KEY),
                "callback_url": f"{SHOP_URL}/gateway/callback",
                "callback_failures_email": "ops@shop.example",
                "minimum_cents": 5_000,
                "maximum_cents": 5_000_000,
                "installed_at": installed,
                "updated_at": installed,
            },
        )
        checkouts = Table("gateway_checkouts", MetaData(), autoload_with=connection)
        for number, status in ((1, "PENDING_PAYMENT"), (2, "PAID")):
            connection.execute(
                insert(checkouts),
                {
                    "api_version": "v2",
                    "order_reference": f"ORDER-{number}",
                    "request_id": f"request-{number}",
                    "token": f"v2.{ACCOUNT}.token-{number}",
                    "merchant_account_id": ACCOUNT,
                    "status": status,
                    "total_cents": 12_345,
                    "paid_cents": 12_345 if status == "PAID" else 0,
                    "refunded_cents": 0,
                    "order": {"lines": [{"name": "Enamel kettle"}]},
                    "created_at": installed,
                    "updated_at": installed,
                    "flagged": False,
                },
            )

    upgrade = migrate(shop, url, "flask-gateway: several merchant accounts")
    assert_runs_without_imports(upgrade)
    assert re.search(
        r"add_column\(sa\.Column\('retired_at', sa\.DateTime\(timezone=True\), nullable=True\)", upgrade
    )
    assert re.search(
        r"create_index\('ux_gateway_installations_account', \['environment', 'merchant_account_id'\], "
        r"unique=True\)",
        upgrade,
    ), upgrade
    upgrade_steps = upgrade.split("def downgrade")[0]
    assert "drop" not in upgrade_steps and "alter_column" not in upgrade_steps, upgrade_steps
    for table in GATEWAY_TABLES - {"gateway_installations"}:
        assert table not in upgrade_steps, f"{table} did not change"
    flask_db(shop, url, "upgrade")

    assert "retired_at" in column_names(url, "gateway_installations")
    with new_connection(url) as connection:
        indexes = {index["name"]: index for index in inspect(connection).get_indexes("gateway_installations")}
    assert indexes["ux_gateway_installations_account"]["unique"]
    assert indexes["ux_gateway_installations_account"]["column_names"] == [
        "environment",
        "merchant_account_id",
    ]
    assert_no_changes(shop, url)

    app, db = upgraded_shop(url)
    try:
        with app.app_context():
            state = get_state()
            (only,) = state.installations()
            assert state.installation() is not None and state.installation().id == only.id  # the default
            assert state.installation(ACCOUNT).id == only.id
            assert (only.merchant_account_id, only.retired_at, only.minimum_cents) == (ACCOUNT, None, 5_000)
            assert only.installed_at == installed
            assert state.box.decrypt(only.signing_key_encrypted) == SIGNING_KEY
            assert choose_account().merchant_account_id == ACCOUNT  # open: new checkouts use it

        client = app.test_client()
        # A callback signed with another key is refused: the stored key is the one that verifies.
        body, headers = paid_callback(f"v2.{ACCOUNT}.token-1", 12_345, "not the signing key")
        assert client.post("/gateway/callback", data=body, headers=headers).status_code == 401
        body, headers = paid_callback(f"v2.{ACCOUNT}.token-1", 12_345, SIGNING_KEY)
        answer = client.post("/gateway/callback", data=body, headers=headers)
        assert answer.status_code == 200, answer.get_data(as_text=True)
        # The account's own callback path takes its callbacks too (the paid one again: acknowledged).
        answer = client.post(f"/gateway/callback/{ACCOUNT}", data=body, headers=headers)
        assert answer.status_code == 200, answer.get_data(as_text=True)
    finally:
        with app.app_context():
            db.engine.dispose()
            get_state().dispose()
    assert fetch_all(
        url, "SELECT order_reference, status, paid_cents FROM gateway_checkouts ORDER BY order_reference"
    ) == [("ORDER-1", "PAID", 12_345), ("ORDER-2", "PAID", 12_345)]

    # The index holds: the same account cannot be installed twice for one environment.
    with pytest.raises(IntegrityError), new_connection(url) as connection:
        connection.execute(
            insert(Table("gateway_installations", MetaData(), autoload_with=connection)),
            {
                "environment": "emulator",
                "merchant_account_id": ACCOUNT,
                "api_key_encrypted": "x",
                "signing_key_encrypted": "x",
                "callback_url": "x",
                "minimum_cents": 0,
                "maximum_cents": 0,
                "installed_at": installed,
                "updated_at": installed,
            },
        )


@pytest.mark.backends
def test_a_shops_own_utc_column_needs_the_render_hook_only(tmp_path: Path, databases: Databases):
    """A shop that uses ``flask_gateway.UTCDateTime`` in its own models passes
    ``render_item=alembic_render_item`` to ``Migrate``: its column is written as ``sa.DateTime(timezone=True)``."""
    url = databases.url("shop")
    shop = write_shop(tmp_path, own_utc_column=True)
    flask_db(shop, url, "init")
    script = migrate(shop, url, "initial")
    assert_runs_without_imports(script)
    assert "sa.Column('placed_at', sa.DateTime(timezone=True), nullable=True)" in script
    flask_db(shop, url, "upgrade")
    assert "placed_at" in column_names(url, "shop_orders")
    assert_no_changes(shop, url)


def test_the_shops_metadata_holds_the_gateway_tables_in_sqlalchemys_own_types():
    """What autogenerate renders without an import: every column type of the copies is SQLAlchemy's."""
    metadata = MetaData()
    copies = copy_tables_as_stored(GatewayBase.metadata, metadata)
    assert {table.name for table in copies} == GATEWAY_TABLES
    for table in copies:
        for column in table.columns:
            assert type(column.type).__module__.startswith("sqlalchemy."), f"{table.name}.{column.name}"
    # The extension's own tables keep their UTCDateTime; a second copy adds nothing.
    assert isinstance(GatewayBase.metadata.tables["gateway_checkouts"].c.created_at.type, UTCDateTime)
    assert copy_tables_as_stored(GatewayBase.metadata, metadata) == []


def test_the_render_hook_renders_utc_datetime_only():
    context = SimpleNamespace(opts={"sqlalchemy_module_prefix": "sa."})  # Alembic's AutogenContext
    assert alembic_render_item("type", UTCDateTime(), context) == "sa.DateTime(timezone=True)"
    assert alembic_render_item("type", DateTime(timezone=True), context) is False
    assert alembic_render_item("column", UTCDateTime(), context) is False
