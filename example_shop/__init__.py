"""The example shop: a small storefront using the Flask-Gateway extension (docs/example-shop.md).

``flask --app example_shop run`` finds :func:`create_app`. The configuration comes from the environment
(``SHOP_*`` and every ``GATEWAY_*`` variable), see :mod:`example_shop.config`.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click
from flask import Flask, request
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.security import generate_password_hash

from example_shop import access_log
from example_shop.config import ShopConfigError, resolve
from flask_gateway import create_all_safely

__all__ = ["ShopConfigError", "create_app"]


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """The shop app. ``config`` (tests) wins over the environment; see docs/example-shop.md."""
    from example_shop import (
        auth,  # noqa: F401 - registers the extension's admin guard
        views,
    )
    from example_shop.extensions import csrf, db, gateway, limiter
    from example_shop.models import EXTENSION_KEY, connect_signals

    access_log.install()  # order links and v1 outcome URLs never reach the access log
    app = Flask(__name__, instance_relative_config=True)
    instance = Path(app.instance_path)
    app.config.from_mapping(resolve(config, environ=os.environ, instance_path=instance))
    _quiet_defaults(app)

    db.init_app(app)
    app.before_request(_refuse_oversize)  # first: a 413, not the CSRF check's 400, whatever the body
    # Then the rate limits: a flood is refused before the CSRF check, and while no transaction is open.
    limiter.init_app(app)
    csrf.init_app(app)  # before the gateway, which exempts its signed callback blueprint
    gateway.init_app(app, db=db)
    app.extensions[EXTENSION_KEY] = True
    connect_signals()
    views.register(app)
    app.cli.add_command(shop_cli)

    with app.app_context():
        # Every worker process of a server (gunicorn -w 4) creates the tables at the same moment: on
        # PostgreSQL concurrent CREATE TABLEs collide, and a worker that fails to boot stops the server.
        create_all_safely(db.engine, db.metadata)

    if app.config["SHOP_AUTO_INSTALL"]:
        from example_shop.setup import auto_install

        auto_install(app)
    return app


def _refuse_oversize() -> None:
    """413 for a body over ``MAX_CONTENT_LENGTH``, before anything runs (a JSON body is never read by
    the CSRF check, so werkzeug's own limit would not trip)."""
    limit = request.max_content_length
    if limit is not None and request.content_length is not None and request.content_length > limit:
        raise RequestEntityTooLarge()


def _quiet_defaults(app: Flask) -> None:
    """Shop log lines at INFO when nothing else configured logging (``flask run`` shows them)."""
    logger = app.logger  # Flask's logger "example_shop", with its stderr handler: our modules log below it
    if logger.level == logging.NOTSET and not app.testing:
        logger.setLevel(logging.INFO)


@click.group("shop", help="The example shop's commands.")
def shop_cli() -> None:
    pass


@shop_cli.command("hash-password")
@click.password_option("--password", prompt="Owner password", help="Prompted (twice) when not given.")
def hash_password(password: str) -> None:
    """Print the werkzeug hash of an owner password, for SHOP_ADMIN_PASSWORD_HASH."""
    if len(password) < 10:
        raise click.BadParameter("use at least 10 characters", param_hint="password")
    click.echo(generate_password_hash(password))
