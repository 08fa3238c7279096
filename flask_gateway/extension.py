"""``Gateway``: the Flask extension object (``Gateway(app, db=db)`` or ``gateway.init_app(app)``)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import requests
from flask import Flask, current_app
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from flask_gateway.config import ConfigurationError, GatewayConfig
from flask_gateway.core.client import GatewayClient, V1Client
from flask_gateway.core.sql import configure_sqlite
from flask_gateway.models import GatewayBase, Installation
from flask_gateway.secrets import SecretBox

#: ``GatewayState.installation_key``: built once (the newest installation of an environment).
_INSTALLATION_KEY = (
    select(Installation.merchant_account_id, Installation.signing_key_encrypted)
    .where(Installation.environment == bindparam("environment"))
    .order_by(Installation.id.desc())
    .limit(1)
)

if TYPE_CHECKING:
    from flask_sqlalchemy import SQLAlchemy

__all__ = ["Gateway", "GatewayState", "NotInstalledError", "get_state"]

EXTENSION_KEY = "gateway"
GuardT = TypeVar("GuardT", bound=Callable[[], Any])


class NotInstalledError(RuntimeError):
    """The gateway is not installed yet: an administrator must complete the install screen."""


@dataclass
class GatewayState:
    """Everything the extension keeps per app (``app.extensions["gateway"]``)."""

    db: SQLAlchemy
    config: GatewayConfig
    box: SecretBox
    extension: Gateway
    #: Test seams: replace to inject a ``requests.Session`` or a fake sleep.
    client_options: dict[str, Any] = field(default_factory=dict)
    #: One ``requests.Session`` per thread, shared by every client this app makes in that thread: its
    #: connections to the gateway are kept alive and reused (a session per call would open a new TCP and
    #: TLS connection for every poll of a reconciliation run, and leave it for the garbage collector).
    _http: threading.local = field(default_factory=threading.local, repr=False)

    def _client_options(self) -> dict[str, Any]:
        if "session" in self.client_options:
            return self.client_options
        session = getattr(self._http, "session", None)
        if session is None:
            session = self._http.session = requests.Session()
        return {**self.client_options, "session": session}

    @property
    def session(self) -> Session:
        # The scoped session's current Session (Flask-SQLAlchemy scopes it to the app context).
        session: Session = self.db.session()
        return session

    def installation(self) -> Installation | None:
        """The installation for the configured environment (the newest, if several)."""
        from sqlalchemy import select

        return self.session.scalars(
            select(Installation)
            .where(Installation.environment == self.config.environment)
            .order_by(Installation.id.desc())
            .limit(1)
        ).first()

    def installation_key(self) -> tuple[str, str] | None:
        """The installed account and its encrypted signing key, as ``installation()`` finds the row.

        Two columns, no ORM entity: what a callback needs to be verified, on its hot path."""
        row = self.session.execute(_INSTALLATION_KEY, {"environment": self.config.environment}).first()
        return None if row is None else (row[0], row[1])

    def require_installation(self) -> Installation:
        installation = self.installation()
        if installation is None:
            raise NotInstalledError(
                "The payment gateway is not installed: an administrator must open the gateway's install "
                f"screen ({self.config.url_prefix}/admin/install) and enter the merchant account."
            )
        return installation

    def client(self, installation: Installation | None = None) -> GatewayClient:
        """A v2 client signed with the stored signing key (decrypted only here, only in memory)."""
        installation = installation or self.require_installation()
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

    def v1_client(self, installation: Installation | None = None) -> V1Client:
        installation = installation or self.require_installation()
        return V1Client(
            v1_base_url=self.config.v1_base_url,
            merchant_account_id=installation.merchant_account_id,
            api_key=self.box.decrypt(installation.api_key_encrypted),
            timeout=self.config.timeout,
            max_retries=self.config.max_retries,
            **self._client_options(),
        )


def get_state(app: Flask | None = None) -> GatewayState:
    """The extension state of ``app`` (default: the current app)."""
    target = app or current_app
    try:
        state: GatewayState = target.extensions[EXTENSION_KEY]
    except KeyError:
        raise RuntimeError(
            "Flask-Gateway is not registered on this app. Did you forget to call Gateway(app, db=db) or "
            "gateway.init_app(app)?"
        ) from None
    return state


class Gateway:
    """The Flask-Gateway extension.

    ``db`` is the app's Flask-SQLAlchemy instance: the extension's ``gateway_*`` tables join its metadata
    and its session (so ``db.create_all()`` and Flask-Migrate see them).
    """

    def __init__(self, app: Flask | None = None, *, db: SQLAlchemy | None = None) -> None:
        self.db = db
        self._admin_guard: Callable[[], Any] | None = None
        if app is not None:
            self.init_app(app)

    def admin_guard(self, guard: GuardT) -> GuardT:
        """Register the callback that decides who may use the admin screens.

        It runs before every admin request: return ``True`` to allow, anything falsy to refuse (403), or a
        response (e.g. a redirect to your login page). Without a guard the admin screens answer 403.
        """
        self._admin_guard = guard
        return guard

    def init_app(self, app: Flask, *, db: SQLAlchemy | None = None) -> None:
        if EXTENSION_KEY in app.extensions:
            raise RuntimeError("Flask-Gateway is already registered on this app: call init_app once per app.")
        database = db or self.db
        if database is None:
            raise ConfigurationError(
                "Flask-Gateway needs the app's Flask-SQLAlchemy instance: Gateway(app, db=db) or "
                "gateway.init_app(app, db=db)."
            )
        config = GatewayConfig.from_mapping(app.config)
        box = SecretBox(config.encryption_key, app.config.get("SECRET_KEY"))
        app.extensions[EXTENSION_KEY] = GatewayState(db=database, config=config, box=box, extension=self)
        with app.app_context():
            try:
                engine = database.engine
            except (KeyError, RuntimeError):
                raise ConfigurationError(
                    "Flask-SQLAlchemy is not set up on this app yet: call db.init_app(app) before "
                    "gateway.init_app(app)."
                ) from None
            # SQLite: BEGIN IMMEDIATE stands in for the row locks the state machine takes on PostgreSQL.
            configure_sqlite(engine)
        for table in GatewayBase.metadata.sorted_tables:
            if table.name not in database.metadata.tables:
                table.to_metadata(database.metadata)
        from flask_gateway.blueprints import register

        register(app, config)
