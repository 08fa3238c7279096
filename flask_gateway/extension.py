"""``Gateway``: the Flask extension object (``Gateway(app, db=db)`` or ``gateway.init_app(app)``).

The top floor of the extension and the one place that wires it into an app: the state
(``flask_gateway.state``), the blueprints (``flask_gateway.web``), the CLI (``flask_gateway.operations.cli``)
and the tables. Nothing else imports this module but the package's front door.
"""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import click
import requests
from flask import Blueprint, Flask, has_request_context, request

from flask_gateway.config import GatewayConfig
from flask_gateway.core.sql import copy_tables_as_stored
from flask_gateway.core.wsgi import WSGIAdapter
from flask_gateway.emulator import mount
from flask_gateway.errors import ConfigurationError
from flask_gateway.models import GatewayBase
from flask_gateway.operations.cli import gateway_cli
from flask_gateway.operations.outages import watch_recovery
from flask_gateway.operations.ratelimit import RateLimit, make_storage
from flask_gateway.secrets import SecretBox, secret_key_fallbacks
from flask_gateway.state import EXTENSION_KEY, MISCONFIGURED_KEY, AccountChoice, AdminGuard, GatewayState
from flask_gateway.web import admin, public
from flask_gateway.web.admin import outbox as admin_outbox

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

__all__ = ["Gateway"]

# The outbox screen is a part of the admin screens: under their guard, CSRF check and headers (a nested
# blueprint runs its parent's hooks). Nested once per process, before any app registers the admin.
admin.bp.register_blueprint(admin_outbox.bp, url_prefix="/outbox")

#: A guard (with or without ``account``), and the admin's accounts callable.
GuardT = TypeVar("GuardT", bound=Callable[..., Any])
ResolverT = TypeVar("ResolverT", bound=Callable[[Any], "str | None"])


class Gateway:
    """The Flask-Gateway extension.

    ``db`` is the app's Flask-SQLAlchemy instance: the extension's ``gateway_*`` tables join its metadata
    (so ``db.create_all()`` and Flask-Migrate see them); the extension reads and writes them in a session
    of its own, on the same database (``flask_gateway.state``).
    """

    def __init__(self, app: Flask | None = None, *, db: SQLAlchemy | None = None) -> None:
        self.db = db
        self._guard = AdminGuard()
        self._accounts = AccountChoice()
        if app is not None:
            self.init_app(app)

    def admin_guard(self, guard: GuardT) -> GuardT:
        """Register the callback that decides who may use the admin screens.

        It runs before every admin request: return ``True`` to allow, anything falsy to refuse (403), or a
        response (e.g. a redirect to your login page). Without a guard the admin screens answer 403. A guard
        with a parameter named ``account`` is given the merchant account the request acts on, or None for
        a view of every account (the status page, the lists without ``?account=``).
        """
        self._guard.check = guard
        return guard

    def admin_accounts(self, accounts: GuardT) -> GuardT:
        """Register the callback that says which merchant accounts the person signed in may see.

        Called once per admin request, after the admin guard admitted it: return a set of merchant account
        ids, or None for every account. A request for another account is a 404 (as for one that does not
        exist); the views of every account (the status page, the lists, the outbox, the banner) show only
        these accounts.
        """
        self._guard.accounts = accounts
        return accounts

    def account_resolver(self, resolver: ResolverT) -> ResolverT:
        """Register the callback that chooses a new checkout's merchant account (several accounts).

        It is called with the order draft (``OrderDraft``; None where there is none yet, such as a cart
        total's availability), inside the request, when the shop names no account: return a merchant
        account id, or None for the default account (the newest one still open). An id that is not
        installed raises ``UnknownAccountError``; a retired one, ``CheckoutUnavailableError``.
        """
        self._accounts.resolver = resolver
        return resolver

    def init_app(self, app: Flask, *, db: SQLAlchemy | None = None) -> None:
        if EXTENSION_KEY in app.extensions:
            raise ConfigurationError(
                "Flask-Gateway is already registered on this app: call init_app once per app."
            )
        database = db or self.db
        if database is None:
            raise ConfigurationError(
                "Flask-Gateway needs the app's Flask-SQLAlchemy instance: Gateway(app, db=db) or "
                "gateway.init_app(app, db=db)."
            )
        if "sqlalchemy" not in app.extensions:
            raise ConfigurationError(
                "Flask-SQLAlchemy is not set up on this app yet: call db.init_app(app) before "
                "gateway.init_app(app)."
            )
        try:
            config = GatewayConfig.from_mapping(app.config)
            # SECRET_KEY_FALLBACKS (Flask 3.1's older keys) decrypt the secrets encrypted under them.
            box = SecretBox(
                config.encryption_key, app.config.get("SECRET_KEY"), secret_key_fallbacks(app.config)
            )
            storage = make_storage(config.ratelimit_storage_uri)
        except ConfigurationError as error:
            if not _doctor_asked():
                raise  # one line and exit 78 under the flask command (ConfigurationError.show)
            # `flask gateway doctor` reports it as a finding; every other use of the extension raises it.
            app.extensions[MISCONFIGURED_KEY] = error
            app.cli.add_command(gateway_cli)
            return
        state = GatewayState(
            db=database,
            config=config,
            box=box,
            admin_guard=self._guard,
            account_choice=self._accounts,
            callback_limit=(
                RateLimit.build("callback-refusals", config.callback_rate_limit, storage)
                if config.callback_rate_limit
                else None
            ),
            plan_limit=(
                RateLimit.build("plan-lookups", config.plan_rate_limit, storage)
                if config.plan_rate_limit
                else None
            ),
        )
        app.extensions[EXTENSION_KEY] = state
        app.teardown_appcontext(lambda _error: state.remove_session())
        watch_recovery(app, state)
        # Copies with the types the database stores, so that Flask-Migrate's scripts run as written
        # (docs/migrations.md); the extension reads and writes through GatewayBase's own tables.
        copy_tables_as_stored(GatewayBase.metadata, database.metadata)
        self._register(app, config)
        if config.environment == "embedded":
            _embed_emulator(app, config, state)

    @staticmethod
    def _register(app: Flask, config: GatewayConfig) -> None:
        app.register_blueprint(public.bp, url_prefix=config.url_prefix)
        app.register_blueprint(admin.bp, url_prefix=f"{config.url_prefix}/admin")
        # The callback and the v1 URLs are called by the gateway, proven by signatures, never by a form:
        # they are exempt from CSRF whether CSRFProtect was set up before Gateway or after it.
        _exempt_from_csrf(app, public.bp)
        app.cli.add_command(gateway_cli)


def _doctor_asked(argv: list[str] | None = None) -> bool:
    """Whether the ``flask`` command is loading the app to run ``flask gateway doctor``: a command group
    (not ``flask run``, not a server, not a test) is resolving a sub-command, and the command line names
    ``gateway`` then ``doctor``. The doctor reports a configuration error as a finding; any other command
    stops on it with its one line (exit 78).
    """
    context = click.get_current_context(silent=True)
    if context is None or not isinstance(context.command, click.Group):
        return False
    words = [word for word in (sys.argv[1:] if argv is None else argv) if not word.startswith("-")]
    return any(first == "gateway" and then == "doctor" for first, then in itertools.pairwise(words))


def _embed_emulator(app: Flask, config: GatewayConfig, state: GatewayState) -> None:
    """``GATEWAY_ENVIRONMENT="embedded"``: mount the emulator in ``app`` and point the clients at it.

    The clients reach it in-process (``WSGIAdapter``), never over the network: a server that handles one
    request at a time would otherwise wait for itself. Without ``GATEWAY_PUBLIC_URL`` each call is made on
    the address of the request being served, so the emulator's ``paymentUrl`` is the one the shopper used.
    """
    mount(app, config.embedded_prefix)
    session = requests.Session()
    origin = None if config.public_url else _request_origin
    session.mount(config.base_url, WSGIAdapter(app, origin=origin))
    state.client_options.setdefault("session", session)


def _request_origin() -> str | None:
    return request.host_url if has_request_context() else None


def _exempt_from_csrf(app: Flask, blueprint: Blueprint) -> None:
    csrf = app.extensions.get("csrf")
    if csrf is not None:
        csrf.exempt(blueprint)
        return

    def exempt_late() -> None:
        # Runs first among the app's before_request hooks, so before CSRFProtect's own check.
        late = app.extensions.get("csrf")
        if late is not None and request.blueprint == blueprint.name:
            late.exempt(blueprint)

    app.before_request_funcs.setdefault(None, []).insert(0, exempt_late)
