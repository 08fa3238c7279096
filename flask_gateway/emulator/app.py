"""The emulator's app factory: ``create_app()``, the app ``flask --app flask_gateway.emulator run`` serves.

``create_app()`` opens no database connection (``emulator/database.py``): the tables and accounts are made
ready on first use, and ``flask --app flask_gateway.emulator init-db`` makes them ready at once.
"""

from __future__ import annotations

import logging
import os
import secrets
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any, Final

import click
from flask import Flask, Response, request
from flask_wtf.csrf import CSRFProtect

from flask_gateway.core.framing import never_framed
from flask_gateway.core.outages import DATABASE_ERRORS, describe_database_error, is_database_outage
from flask_gateway.core.routing import SharedBuilderRule
from flask_gateway.core.sql import configure_sqlite
from flask_gateway.core.templates import SHARED_TEMPLATE_CODE
from flask_gateway.emulator.api import (
    MAX_BODY_BYTES,
    refuse_malformed_json,
    refuse_oversize,
    register_error_handlers,
)
from flask_gateway.emulator.database import STATE_KEY, DatabaseState, database_state, prepare_database
from flask_gateway.emulator.delivery import start_worker
from flask_gateway.emulator.models import db
from flask_gateway.emulator.settings import EmulatorSettings
from flask_gateway.emulator.views import control, dashboard, deliveries, health, hosted, v1, v2

__all__ = ["ENGINE_OPTIONS", "create_app"]

_log = logging.getLogger("flask_gateway.emulator")

#: The engine options of the emulator's database (Flask-SQLAlchemy's ``SQLALCHEMY_ENGINE_OPTIONS``).
ENGINE_OPTIONS: Final[Mapping[str, Any]] = {"pool_pre_ping": True}


def create_app(test_config: Mapping[str, Any] | None = None, *, instance_path: str | None = None) -> Flask:
    """The emulator app. ``test_config`` may carry ``EMULATOR_SETTINGS`` (an ``EmulatorSettings``).

    ``instance_path``: the folder for the default SQLite file and the session secret (default: Flask's
    instance folder of this package). A ``SECRET_KEY`` in ``test_config`` (or ``EMULATOR_SECRET_KEY``)
    means no secret file is written.
    """
    app = Flask(__name__, instance_relative_config=True, instance_path=instance_path)
    # Its URL builders and templates compiled once per process, not once per app (a test suite builds many).
    app.url_rule_class = SharedBuilderRule
    app.jinja_options = {"bytecode_cache": SHARED_TEMPLATE_CODE, **app.jinja_options}
    config = dict(test_config or {})
    settings = config.pop("EMULATOR_SETTINGS", None) or EmulatorSettings.from_env()
    Path(app.instance_path).mkdir(parents=True, exist_ok=True)
    secret = config.pop("SECRET_KEY", None) or os.environ.get("EMULATOR_SECRET_KEY")
    app.config.from_mapping(
        SECRET_KEY=secret or _instance_secret(Path(app.instance_path)),
        SQLALCHEMY_DATABASE_URI=settings.database_url
        or f"sqlite:///{Path(app.instance_path) / 'emulator.sqlite3'}",
        SQLALCHEMY_ENGINE_OPTIONS=dict(ENGINE_OPTIONS),
        MAX_CONTENT_LENGTH=MAX_BODY_BYTES,
        WTF_CSRF_TIME_LIMIT=None,
        # Cookies on one host are shared across ports: a shop on 127.0.0.1 must keep its own session.
        SESSION_COOKIE_NAME="gateway_emulator_session",
        JSON_SORT_KEYS=False,
    )
    app.config.update(config)
    app.extensions["gateway_emulator"] = settings
    app.extensions[STATE_KEY] = DatabaseState(settings)

    db.init_app(app)
    # Registered after Flask-SQLAlchemy's own teardown, so it runs first (Flask runs them in reverse).
    app.teardown_appcontext(_release_session)
    app.before_request(refuse_oversize)  # first: before the CSRF check and any credentials
    csrf = CSRFProtect(app)
    register_error_handlers(app)
    app.before_request(_database_ready)
    _register_blueprints(app, csrf)
    app.cli.add_command(_init_db_command(app))

    @app.after_request
    def _no_framing(response: Response) -> Response:
        # The hosted payment page must never be framed; the same holds for every other page here.
        # Hosted pages carry checkout tokens in their URLs: never sent on as a Referer.
        never_framed(response.headers, no_referrer=True)
        return response

    with app.app_context():
        configure_sqlite(db.engine)  # event listeners only: no connection is opened

    if settings.worker and not app.testing:
        start_worker(app)
    return app


#: Endpoints that never touch the database (and so work while it is away; ``readyz`` prepares it itself).
_NO_DATABASE: Final = frozenset(
    {"static", "emulator_health.livez", "emulator_health.readyz", "emulator_dashboard.openapi"}
)


def _database_ready() -> None:
    """Before a request that needs the database: the tables and accounts (first request of the process),
    or one round trip while an outage is on. Raises the driver's error: the error handlers answer 503."""
    if request.endpoint is None or request.endpoint in _NO_DATABASE:
        return
    database_state().ensure()


def _release_session(_error: BaseException | None) -> None:
    """End the app context's session; never raise. A rollback on a connection the database dropped fails
    (the connection is gone, and its transaction with it): that failure must not escape Flask as a 500
    after the answer was chosen. The connection is invalidated, so the pool never hands it out again."""
    try:
        db.session.remove()
    except Exception as error:
        with suppress(Exception):  # invalidating only discards the connections
            db.session().invalidate()
        db.session.registry.clear()
        if not is_database_outage(error):
            _log.warning("gateway emulator: ending a session failed (%s)", describe_database_error(error))


def _init_db_command(app: Flask) -> click.Command:
    """``flask --app flask_gateway.emulator init-db``: what the first request would do, now."""

    @click.command("init-db", help="Create the emulator's tables and seed the accounts of EMULATOR_ACCOUNTS.")
    def init_db() -> None:
        try:
            prepare_database(app)
        except DATABASE_ERRORS as error:
            if not is_database_outage(error):
                raise
            # One line, exit status 1: no traceback for a database that is simply not up yet.
            raise click.ClickException(
                f"the emulator's database is unreachable ({describe_database_error(error)}): "
                "start it and run init-db again."
            ) from None
        click.echo("The emulator's tables are in place and its accounts are seeded.")

    return init_db


def _register_blueprints(app: Flask, csrf: CSRFProtect) -> None:
    json_apis = (v2.bp, v1.bp, control.bp, deliveries.bp)
    for json_api in json_apis:
        csrf.exempt(json_api)  # machine-to-machine JSON: authenticated by signature/Basic, or test-only
        app.register_blueprint(json_api)
    names = frozenset(json_api.name for json_api in json_apis)

    @app.before_request
    def _json_body_first() -> None:
        if request.blueprint in names:
            refuse_malformed_json()

    app.register_blueprint(health.bp)
    app.register_blueprint(hosted.bp)
    app.register_blueprint(dashboard.bp)


def _instance_secret(instance: Path) -> str:
    """A secret shared by every worker process: created once in the instance folder."""
    path = instance / "emulator-secret-key"
    try:
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
            handle.write(secrets.token_hex(32))
    except FileExistsError:
        pass
    return path.read_text().strip()
