"""The example shop: a small storefront using the Flask-Gateway extension (docs/example-shop.md).

``flask --app example_shop run`` finds :func:`create_app`. The configuration comes from the environment
(``SHOP_*`` and every ``GATEWAY_*`` variable), see :mod:`example_shop.config`.

:func:`create_app` touches neither the database nor the network: a worker process that starts while the
database restarts boots, answers 503 "We'll be right back" meanwhile (:mod:`example_shop.outages`) and
serves as soon as the database answers. The tables come from ``flask --app example_shop shop init-db``;
the gateway's installation from ``shop install``, or on first use (``SHOP_AUTO_INSTALL=1``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final

import click
from flask import Flask, current_app, request
from flask.cli import with_appcontext
from sqlalchemy.exc import DBAPIError
from werkzeug.exceptions import RequestEntityTooLarge
from werkzeug.security import generate_password_hash

from example_shop import access_log, deployment, outages
from example_shop.config import ShopConfigError, resolve
from flask_gateway import DATABASE_ERRORS, create_all_safely, is_database_outage

__all__ = ["EXIT_DATABASE_AWAY", "ShopConfigError", "create_app"]

#: The exit status of a ``shop`` command that found the database away (``EX_TEMPFAIL``, as the extension's
#: ``flask gateway`` commands): a deploy step or a timer runs it again later.
EXIT_DATABASE_AWAY: Final = 75


def create_app(config: Mapping[str, Any] | None = None) -> Flask:
    """The shop app. ``config`` (tests) wins over the environment; see docs/example-shop.md."""
    from example_shop import (
        auth,  # noqa: F401 - registers the extension's admin guard
        brands,  # noqa: F401 - registers the extension's account resolver
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
    outages.register(app)
    deployment.install(app)  # ProxyFix (SHOP_TRUSTED_PROXIES), GET /metrics (SHOP_METRICS_TOKEN)
    app.cli.add_command(shop_cli)
    # No tables, no installation here: a worker booting while the database is away would exit, and
    # gunicorn's master stops when a worker fails to boot. ``shop init-db`` creates the tables.
    if app.config["SHOP_AUTO_INSTALL"]:
        from example_shop.setup import install_on_first_use

        install_on_first_use(app)
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


class _DatabaseAway(click.ClickException):
    exit_code = EXIT_DATABASE_AWAY


def _database_error(error: Exception) -> click.ClickException:
    """The one line a command prints when the database does not answer (or refuses otherwise): the
    driver's first line of reason, never a statement or its parameters."""
    original = error.orig if isinstance(error, DBAPIError) and error.orig is not None else error
    first_line = (str(original).strip().splitlines() or [""])[0][:200]
    reason = f"{type(original).__name__}: {first_line}"
    if not is_database_outage(error):
        return click.ClickException(f"The shop's database at {_masked_url()} refused ({reason}).")
    return _DatabaseAway(
        f"The shop's database at {_masked_url()} does not answer ({reason}). Start it (or check "
        "SHOP_DATABASE_URL), then run this command again."
    )


def _masked_url() -> str:
    """The shop's database URL with its password masked (for messages)."""
    from example_shop.extensions import db

    return db.engine.url.render_as_string(hide_password=True)


@shop_cli.command("init-db")
@with_appcontext
def init_db() -> None:
    """Create the shop's tables and the payment gateway's (those missing; existing ones are kept)."""
    from example_shop.extensions import db

    try:
        # Several processes may run it at once (every container of a deploy): on PostgreSQL under an
        # advisory lock, so concurrent CREATE TABLEs never collide.
        create_all_safely(db.engine, db.metadata)
    except DATABASE_ERRORS as error:
        raise _database_error(error) from None
    click.echo(f"The shop's tables and the payment gateway's are ready in {_masked_url()}.")


#: ``shop install``'s exit code and closing line for each outcome of ``auto_install``.
_INSTALL_OUTCOMES: dict[str, tuple[int, str]] = {
    "installed": (0, "The payment gateway is installed."),
    "already-here": (0, "The payment gateway was installed already."),
    "already-installed": (
        1,
        "The gateway knows this account already: adopt it from /gateway/admin/install with the signing key "
        "you received the first time.",
    ),
    "unreachable": (1, "The gateway did not answer: start it, then run this command again."),
    "refused": (1, "The gateway refused the installation (see the message above)."),
    "skipped": (1, "Set GATEWAY_PUBLIC_URL to the shop's address, then run this command again."),
}


@shop_cli.command("install")
@with_appcontext
def install_gateway() -> None:
    """Install the payment gateway with the shop's settings (SHOP_GATEWAY_ACCOUNT, SHOP_GATEWAY_API_KEY,
    SHOP_MIN_CENTS, SHOP_MAX_CENTS, GATEWAY_PUBLIC_URL), then the second brand's account of
    SHOP_SECOND_ACCOUNT when it is set; each account installed already is left as it is."""
    from example_shop.setup import auto_install

    try:
        outcome = auto_install(current_app._get_current_object())  # type: ignore[attr-defined]
    except DATABASE_ERRORS as error:
        raise _database_error(error) from None
    code, line = _INSTALL_OUTCOMES[outcome]
    if code:
        raise click.ClickException(line)
    click.echo(line)


@shop_cli.command("hash-password")
@click.password_option("--password", prompt="Owner password", help="Prompted (twice) when not given.")
def hash_password(password: str) -> None:
    """Print the werkzeug hash of an owner password, for SHOP_ADMIN_PASSWORD_HASH."""
    if len(password) < 10:
        raise click.BadParameter("use at least 10 characters", param_hint="password")
    click.echo(generate_password_hash(password))
