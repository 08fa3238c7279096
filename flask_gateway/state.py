"""The extension's state in an app: its configuration, secrets, database session and gateway clients.

The ground floor of the extension: every service reaches the app's state through :func:`get_state`, and
nothing here knows of the services, views or CLI above it (``flask_gateway.extension`` wires those).

**A guest in the shop's database.** The extension works in a session of its own, so a commit of the
extension commits what the extension wrote and never the shop's pending changes. On PostgreSQL (and every
server database) that session shares the shop's engine and pool. On a SQLite file it uses an engine of its
own on the same file, with the settings its row locks need (a busy timeout and ``BEGIN IMMEDIATE``, see
``core/sql.py``); the shop's engine is left as the shop configured it, and WAL (a setting of the database
file, so the shop's too) only with ``GATEWAY_SQLITE_WAL``. An in-memory SQLite database has one connection
for the whole app: there the extension uses the shop's session (and commits it), as a file cannot be
shared.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import wraps
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

import requests
from flask import Flask, current_app
from flask.globals import app_ctx
from sqlalchemy import bindparam, create_engine, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, scoped_session, sessionmaker

from flask_gateway.config import GatewayConfig
from flask_gateway.core.client import GatewayClient, V1Client
from flask_gateway.core.money import format_money
from flask_gateway.core.outages import OutageWatch, describe_database_error, is_database_outage
from flask_gateway.core.sql import commit_keeping_loaded, configure_sqlite, sqlite_in_memory
from flask_gateway.errors import ConfigurationError, NotInstalledError, UnknownAccountError
from flask_gateway.models import Installation
from flask_gateway.secrets import SecretBox

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

__all__ = [
    "EXTENSION_KEY",
    "MISCONFIGURED_KEY",
    "AccountChoice",
    "AdminGuard",
    "GatewayState",
    "Limit",
    "get_state",
    "leaves_no_transaction",
    "misconfiguration",
]

#: ``app.extensions`` key of the state.
EXTENSION_KEY = "gateway"
#: Where ``init_app`` keeps the configuration error it deferred for ``flask gateway doctor`` (the doctor
#: reports it as a finding; every other use of the extension raises it).
MISCONFIGURED_KEY = "gateway.misconfigured"

_log = logging.getLogger("flask_gateway.state")

#: ``GatewayState.installation_key``: built once. The default account: the newest one still open.
_INSTALLATION_KEY = (
    select(Installation.merchant_account_id, Installation.signing_key_encrypted)
    .where(Installation.environment == bindparam("environment"), Installation.retired_at.is_(None))
    .order_by(Installation.id.desc())
    .limit(1)
)
#: The same for a named account (open or retired: its checkouts' callbacks still come).
_ACCOUNT_KEY = select(Installation.merchant_account_id, Installation.signing_key_encrypted).where(
    Installation.environment == bindparam("environment"),
    Installation.merchant_account_id == bindparam("account"),
)


class Limit(Protocol):
    """A rate limit per client (``flask_gateway.operations.ratelimit.RateLimit`` is the one the extension
    builds)."""

    def retry_after(self, client: str) -> int | None:
        """Seconds until ``client`` may go on, or None when it may now."""

    def hit(self, client: str) -> None:
        """Count one use by ``client``."""


def missing_tables_watch() -> OutageWatch:
    """A watch of missing tables (never created, a migration not run): one WARNING when requests start
    failing on them, one when a request is answered again."""
    return OutageWatch(
        "flask_gateway",
        logging.getLogger("flask_gateway.outages"),
        problem="tables are missing in the database",
        until="they are created (`flask gateway init-db`, the shop's init command or the migrations)",
        back="the tables are there again",
    )


@dataclass
class AdminGuard:
    """Who may use the admin screens: the callback the app registers with ``Gateway.admin_guard``.

    It runs before every admin request: ``True`` allows, anything falsy refuses (403), a response (e.g. a
    redirect to the app's login page) is answered instead; a callback that takes ``account`` is given the
    merchant account the request acts on (None: a view of every account). Without a callback the screens
    answer 403.
    One guard is shared by the ``Gateway`` object and the state of every app it is registered on.
    """

    check: Callable[..., Any] | None = None
    #: The accounts the person signed in may see (``Gateway.admin_accounts``): a set of merchant account
    #: ids, or None for every account; called after ``check`` admitted the request. Without it, the
    #: accounts ``check`` admits when asked about each (``flask_gateway.web.admin.access``).
    accounts: Callable[[], Any] | None = None


@dataclass
class AccountChoice:
    """How a new checkout's merchant account is chosen when the shop names none: the callback the app
    registers with ``Gateway.account_resolver`` (given the order draft, or None where there is none yet,
    inside the request), which answers an account id, or None for the default account (the newest one
    still open). Shared, like :class:`AdminGuard`, by the ``Gateway`` object and every app's state."""

    resolver: Callable[[Any], str | None] | None = None


def _storable_account(account: str) -> bool:
    """Whether ``account`` can be an installed merchant account id: at most 255 characters, no U+0000
    (which PostgreSQL refuses even in a query's parameter). Any other id is simply not installed."""
    return len(account) <= 255 and "\x00" not in account


def _app_context_id() -> int:
    return id(app_ctx._get_current_object())  # type: ignore[attr-defined]


@dataclass
class GatewayState:
    """Everything the extension keeps per app (``app.extensions["gateway"]``)."""

    db: SQLAlchemy
    config: GatewayConfig
    box: SecretBox
    admin_guard: AdminGuard = field(default_factory=AdminGuard)
    account_choice: AccountChoice = field(default_factory=AccountChoice)
    #: Refused callbacks per client address (``GATEWAY_CALLBACK_RATE_LIMIT``); None: no limit.
    callback_limit: Limit | None = None
    #: Payment-plan lookups per client address (``GATEWAY_PLAN_RATE_LIMIT``); None: no limit.
    plan_limit: Limit | None = None
    #: Test seams: replace to inject a ``requests.Session`` or a fake sleep (``flask_gateway.testing``).
    client_options: dict[str, Any] = field(default_factory=dict)
    #: One ``requests.Session`` per thread, shared by every client this app makes in that thread: its
    #: connections to the gateway are kept alive and reused (a session per call would open a new TCP and
    #: TLS connection for every poll of a reconciliation run, and leave it for the garbage collector).
    _http: threading.local = field(default_factory=threading.local, repr=False)
    #: This process's view of the database (``flask_gateway.operations.outages``): one WARNING when an outage
    #: starts, one when it ends, whatever the number of requests refused meanwhile.
    outages: OutageWatch = field(
        default_factory=lambda: OutageWatch("flask_gateway", logging.getLogger("flask_gateway.outages")),
        repr=False,
    )
    #: The same for tables that are missing (never created, a migration not run): one WARNING when
    #: requests start failing on them, one when they answer again.
    missing_tables: OutageWatch = field(default_factory=lambda: missing_tables_watch(), repr=False)
    _sessions: scoped_session[Session] | None = field(default=None, repr=False)
    _engine: Engine | None = field(default=None, repr=False)
    _uses_host_session: bool = field(default=False, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    # --- the database ---------------------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The engine of the extension's session: the shop's, or the extension's own on a SQLite file."""
        return self._open()[0]

    @property
    def session(self) -> Session:
        """The extension's session in the current app context (removed when the context ends)."""
        sessions = self._open()[1]
        if self._uses_host_session:
            host: Session = self.db.session()
            return host
        return sessions()

    def remove_session(self) -> None:
        """End the current app context's session (``teardown_appcontext``): its transaction rolls back.

        Never raises. A teardown that raises escapes Flask after the answer was chosen (the server logs a
        500 of its own, with a traceback), and the rollback of a connection the database dropped (a
        restart) does fail: the session's connections are then invalidated (the pool opens new ones) and
        the registry is cleared all the same, so the next request of this thread starts clean."""
        sessions = self._sessions
        if sessions is None:
            return
        try:
            sessions.remove()
        except Exception as error:
            if is_database_outage(error):
                _log.debug("the extension's session could not roll back: %s", describe_database_error(error))
            else:
                _log.error("the extension's session could not be closed", exc_info=True)
            try:
                if sessions.registry.has():
                    sessions.registry().invalidate()
            except Exception as again:  # the connection is gone either way; the pool replaces it
                _log.debug("invalidating the session failed too: %s", describe_database_error(again))
            sessions.registry.clear()

    def _open(self) -> tuple[Engine, scoped_session[Session]]:
        if self._engine is not None and self._sessions is not None:
            return self._engine, self._sessions
        with self._lock:
            if self._engine is not None and self._sessions is not None:
                return self._engine, self._sessions
            try:
                host = self.db.engine
            except (KeyError, RuntimeError):
                raise ConfigurationError(
                    "Flask-SQLAlchemy is not set up on this app: call db.init_app(app) before "
                    "gateway.init_app(app)."
                ) from None
            engine = host
            if host.dialect.name == "sqlite":
                if sqlite_in_memory(host):
                    self._uses_host_session = True
                else:
                    engine = create_engine(host.url)
                    configure_sqlite(engine, wal=self.config.sqlite_wal)
            sessions = scoped_session(sessionmaker(bind=engine), scopefunc=_app_context_id)
            self._engine, self._sessions = engine, sessions
            return engine, sessions

    def dispose(self) -> None:
        """Close the extension's own engine, if it has one (tests; an app being shut down)."""
        if self._engine is not None and not self._uses_host_session and self._engine is not self.db.engine:
            self._engine.dispose()

    # --- the installation ---------------------------------------------------------------------------

    def installations(self) -> list[Installation]:
        """Every account installed for the configured environment, open and retired, oldest first."""
        return list(
            self.session.scalars(
                select(Installation)
                .where(Installation.environment == self.config.environment)
                .order_by(Installation.id)
            )
        )

    def installation(self, account: str | None = None) -> Installation | None:
        """The installation of ``account`` for the configured environment (open or retired), or with no
        account the default one: the newest installation still open (a shop with one account: its only
        one). None when there is none."""
        if account is not None and not _storable_account(account):
            return None  # no installed account has that id (and PostgreSQL refuses U+0000 in a query)
        query = select(Installation).where(Installation.environment == self.config.environment)
        if account is None:
            query = query.where(Installation.retired_at.is_(None)).order_by(Installation.id.desc()).limit(1)
        else:
            query = query.where(Installation.merchant_account_id == account)
        return self.session.scalars(query).first()

    def installation_key(self, account: str | None = None) -> tuple[str, str] | None:
        """The account and its encrypted signing key, as ``installation(account)`` finds the row.

        Two columns, no ORM entity: what a callback needs to be verified, on its hot path."""
        if account is None:
            row = self.session.execute(_INSTALLATION_KEY, {"environment": self.config.environment}).first()
        elif not _storable_account(account):
            row = None  # a callback path or argument no installed account can have: nothing to ask
        else:
            row = self.session.execute(
                _ACCOUNT_KEY, {"environment": self.config.environment, "account": account}
            ).first()
        return None if row is None else (row[0], row[1])

    def require_installation(self, account: str | None = None) -> Installation:
        """:meth:`installation`, or the error that says what to do: ``UnknownAccountError`` for an account
        that is not installed, ``NotInstalledError`` when no account is (or every one is retired)."""
        installation = self.installation(account)
        if installation is not None:
            return installation
        if account is not None:
            raise self.unknown_account(account)
        if any(True for _ in self.installations()):
            raise NotInstalledError(
                "Every merchant account installed here is retired (closed for new checkouts): reopen one "
                f"or install another at {self.config.url_prefix}/admin/install."
            )
        raise NotInstalledError(
            "The payment gateway is not installed: an administrator must open the gateway's install "
            f"screen ({self.config.url_prefix}/admin/install) and enter the merchant account."
        )

    def unknown_account(self, account: str) -> UnknownAccountError:
        """The error for an account id that is not installed here, listing those that are."""
        installed = ", ".join(row.merchant_account_id for row in self.installations()) or "none"
        return UnknownAccountError(
            f"The merchant account {account[:255]!r} is not installed for the {self.config.environment} "
            f"environment (installed: {installed}).",
            account=account,
        )

    # --- the gateway's clients ----------------------------------------------------------------------

    def _client_options(self) -> dict[str, Any]:
        if "session" in self.client_options:
            return self.client_options
        session = getattr(self._http, "session", None)
        if session is None:
            session = self._http.session = requests.Session()
        return {**self.client_options, "session": session}

    def client(
        self, installation: Installation | None = None, *, account: str | None = None
    ) -> GatewayClient:
        """A v2 client signed with the stored signing key (decrypted only here, only in memory): of
        ``installation``, else of ``account`` (a checkout's, retired or not), else of the default account."""
        installation = installation or self.require_installation(account)
        return self.signed_client(
            installation.merchant_account_id, self.box.decrypt_cached(installation.signing_key_encrypted)
        )

    def signed_client(self, merchant_account_id: str, signing_key: str | None) -> GatewayClient:
        """A v2 client for an account; unsigned (installation only) when ``signing_key`` is None."""
        return GatewayClient(
            base_url=self.config.base_url,
            install_url=self.config.install_url,
            merchant_account_id=merchant_account_id,
            signing_key=signing_key,
            timeout=self.config.timeout,
            max_retries=self.config.max_retries,
            wire_names=self.config.wire_names,
            **self._client_options(),
        )

    def install_client(self, merchant_account_id: str) -> GatewayClient:
        """An unsigned v2 client for the installation call."""
        return self.signed_client(merchant_account_id, None)

    def v1_client(
        self,
        installation: Installation | None = None,
        *,
        account: str | None = None,
        api_key: str | None = None,
    ) -> V1Client:
        """A v1 client with the stored API key (or ``api_key``, one being proved), chosen as :meth:`client`
        chooses."""
        installation = installation or self.require_installation(account)
        return V1Client(
            v1_base_url=self.config.v1_base_url,
            merchant_account_id=installation.merchant_account_id,
            api_key=api_key if api_key is not None else self.box.decrypt(installation.api_key_encrypted),
            timeout=self.config.timeout,
            max_retries=self.config.max_retries,
            **self._client_options(),
        )

    # --- words for people ---------------------------------------------------------------------------

    def money(self, cents: int) -> str:
        """``R 1 234.00``: an amount with ``GATEWAY_CURRENCY_SYMBOL``, as the admin screens show it."""
        return format_money(cents, self.config.currency_symbol)


P = ParamSpec("P")
R = TypeVar("R")


def leaves_no_transaction(verb: Callable[P, R]) -> Callable[P, R]:
    """The extension's public verbs end with no transaction of the extension's open.

    On SQLite a transaction of the extension holds the database's write lock (``BEGIN IMMEDIATE``): one
    left open after a verb returns would make the shop's own next commit in the same request wait for it,
    and time out. So a verb that returns commits what is left (what it only read), keeping the objects it
    hands back loaded (reading them needs no new transaction); one that raises rolls back.
    """

    @wraps(verb)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        try:
            result = verb(*args, **kwargs)
        except BaseException:
            _end(commit=False)
            raise
        _end(commit=True)
        return result

    return wrapper


def _end(*, commit: bool) -> None:
    state = current_app.extensions.get(EXTENSION_KEY)
    if not isinstance(state, GatewayState) or state._sessions is None:
        return
    session = state.session
    if not session.in_transaction():
        return
    if commit:
        commit_keeping_loaded(session)
    else:
        session.rollback()


def misconfiguration(app: Flask | None = None) -> ConfigurationError | None:
    """The configuration error ``init_app`` deferred on ``app`` (default: the current app) so that
    ``flask gateway doctor`` could report it, or None."""
    found = (app or current_app).extensions.get(MISCONFIGURED_KEY)
    return found if isinstance(found, ConfigurationError) else None


def get_state(app: Flask | None = None) -> GatewayState:
    """The extension state of ``app`` (default: the current app)."""
    target = app or current_app
    try:
        state: GatewayState = target.extensions[EXTENSION_KEY]
    except KeyError:
        deferred = misconfiguration(target)
        if deferred is not None:
            raise ConfigurationError(deferred.message) from None
        raise ConfigurationError(
            "Flask-Gateway is not registered on this app. Did you forget to call Gateway(app, db=db) or "
            "gateway.init_app(app)?"
        ) from None
    return state
