"""The emulator's app factory: ``create_app()``, the app ``flask --app flask_gateway.emulator run`` serves."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

from flask import Flask, Response, request
from flask_wtf.csrf import CSRFProtect

from flask_gateway.core.framing import never_framed
from flask_gateway.core.sql import configure_sqlite, create_all_safely
from flask_gateway.emulator.accounts import seed_accounts
from flask_gateway.emulator.api import (
    MAX_BODY_BYTES,
    refuse_malformed_json,
    refuse_oversize,
    register_error_handlers,
)
from flask_gateway.emulator.delivery import start_worker
from flask_gateway.emulator.models import db
from flask_gateway.emulator.settings import EmulatorSettings
from flask_gateway.emulator.views import control, dashboard, deliveries, hosted, v1, v2

__all__ = ["ENGINE_OPTIONS", "create_app"]

#: The engine options of the emulator's database (Flask-SQLAlchemy's ``SQLALCHEMY_ENGINE_OPTIONS``).
ENGINE_OPTIONS: Final[Mapping[str, Any]] = {"pool_pre_ping": True}


def create_app(test_config: Mapping[str, Any] | None = None, *, instance_path: str | None = None) -> Flask:
    """The emulator app. ``test_config`` may carry ``EMULATOR_SETTINGS`` (an ``EmulatorSettings``).

    ``instance_path``: the folder for the default SQLite file and the session secret (default: Flask's
    instance folder of this package). A ``SECRET_KEY`` in ``test_config`` (or ``EMULATOR_SECRET_KEY``)
    means no secret file is written.
    """
    app = Flask(__name__, instance_relative_config=True, instance_path=instance_path)
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

    db.init_app(app)
    app.before_request(refuse_oversize)  # first: before the CSRF check and any credentials
    csrf = CSRFProtect(app)
    register_error_handlers(app)
    _register_blueprints(app, csrf)

    @app.after_request
    def _no_framing(response: Response) -> Response:
        # The hosted payment page must never be framed; the same holds for every other page here.
        # Hosted pages carry checkout tokens in their URLs: never sent on as a Referer.
        never_framed(response.headers, no_referrer=True)
        return response

    with app.app_context():
        configure_sqlite(db.engine)
        create_all_safely(db.engine, db.metadata)
        seed_accounts(settings)

    if settings.worker and not app.testing:
        start_worker(app)
    return app


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
