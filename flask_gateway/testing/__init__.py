"""A shop app wired to an in-process gateway emulator: the seam for tests, benchmarks and examples.

:func:`connect` routes the shop's gateway clients to the emulator app, and the emulator's calls to the
merchant (signed callbacks, v1 success/fail URLs) back to the shop app. Each request is handed to the
other app's test client through a ``requests`` adapter (:class:`FlaskAdapter`): the same code paths and the
same bytes as over HTTP, without sockets, threads or ports. Nothing is monkeypatched: the shop's clients
take their ``requests.Session`` from the extension's state, the emulator takes its own with
:func:`flask_gateway.emulator.set_merchant_http`.

Two ways to wire:

- :func:`connect` uses two fixed base URLs; the shop must be configured with them (:func:`gateway_config`
  gives the ``GATEWAY_*`` keys)::

      shop = create_shop({**gateway_config(), "SQLALCHEMY_DATABASE_URI": ...})
      emulator = flask_gateway.emulator.create_app({...})
      wiring = connect(shop, emulator)

- :func:`connect_configured` wires to whatever the shop is configured with (``GATEWAY_BASE_URL``,
  ``GATEWAY_INSTALL_URL``, ``GATEWAY_V1_BASE_URL``, ``GATEWAY_PUBLIC_URL``, or the environment's
  defaults), and lets nothing else out: a URL it did not wire is a ``requests.ConnectionError``, never a
  request on the network. :class:`GatewayEmulator` builds on it: an emulator for one shop, installed,
  with helpers named for what a shop's test proves (pay, cancel, expire, fail the next callback, replay
  it, "fulfilled exactly once"). The pytest plugin (``flask_gateway.pytest_plugin``, docs/testing.md)
  hands it to a test as the ``gateway_emulator`` fixture; outside pytest::

      with GatewayEmulator.start(shop, database_url="sqlite:///.../emulator.sqlite3") as gateway:
          ...

This is the one module that sees both the extension and the emulator (docs/architecture.md).
"""

from __future__ import annotations

import math
import secrets
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Final
from urllib.parse import urlsplit

import requests
from flask import Flask, request
from flask.testing import FlaskClient
from requests.adapters import BaseAdapter
from sqlalchemy import event, insert, select
from sqlalchemy.engine import Engine

from flask_gateway.core.errors import AlreadyInstalledError
from flask_gateway.core.sql import sqlite_in_memory
from flask_gateway.core.timestamps import parse_timestamp
from flask_gateway.core.wire import OPEN_STATUSES
from flask_gateway.core.wsgi import WSGIAdapter
from flask_gateway.emulator import (
    EmulatorSettings,
    create_app,
    embedded_emulator,
    prepare_database,
    set_merchant_http,
)
from flask_gateway.emulator import models as emulator_models
from flask_gateway.emulator.merchant import post_callback
from flask_gateway.installation import InstallSettings, install, update_settings
from flask_gateway.plans import clear_payment_plan_cache
from flask_gateway.signals import (
    callback_rejected,
    checkout_cancelled,
    checkout_expired,
    checkout_flagged,
    payment_confirmed,
)
from flask_gateway.state import get_state
from flask_gateway.urls import callback_url

__all__ = [
    "DEMO_ACCOUNT",
    "DEMO_API_KEY",
    "EMULATOR_URL",
    "SHOP_URL",
    "CallbackReply",
    "ConsumerOutcome",
    "EmulatorPool",
    "FlaskAdapter",
    "GatewayEmulator",
    "GatewayEmulatorError",
    "OffTheNetwork",
    "SignalRecord",
    "Wiring",
    "connect",
    "connect_configured",
    "emulator_settings_for",
    "gateway_config",
    "make_emulator",
    "reset_tables",
    "shop_base_url",
    "sqlite_without_fsync",
    "token_of",
]

#: Where the shop's clients find the in-process emulator (any host name works; nothing resolves it).
EMULATOR_URL: Final = "http://emulator.test"
#: Where the emulator finds the in-process shop (its callback URL and v1 URLs are built on it).
SHOP_URL: Final = "https://shop.example"
#: The account an emulator has out of the box (``EMULATOR_ACCOUNTS``' default): what :class:`GatewayEmulator`
#: installs.
DEMO_ACCOUNT: Final = "demo-merchant"
DEMO_API_KEY: Final = "demo-api-key"


class FlaskAdapter(WSGIAdapter):
    """A ``requests`` transport that hands each request to a Flask app's test client's app (no sockets):
    :class:`flask_gateway.core.wsgi.WSGIAdapter`, built from a test client.

    Mount it on a ``requests.Session`` for a base URL. The emulator's "drop the answer after the commit"
    fault (``ResponseDropped``) reaches the caller as the ``requests.ConnectionError`` a reset socket gives.
    ``strip_prefix``, ``add_prefix`` and ``script_root`` map the mounted URL's path onto the app's (see
    ``WSGIAdapter``).
    """

    def __init__(
        self, client: FlaskClient, *, strip_prefix: str = "", add_prefix: str = "", script_root: str = ""
    ) -> None:
        super().__init__(
            client.application, strip_prefix=strip_prefix, add_prefix=add_prefix, script_root=script_root
        )
        self.client = client


class OffTheNetwork(BaseAdapter):
    """Mounted on ``http://`` and ``https://`` by :func:`connect_configured`: whatever was not wired to an
    app fails as an unreachable host would, and nothing leaves the process."""

    def send(
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,
        verify: Any = True,
        cert: Any = None,
        proxies: Any = None,
    ) -> requests.Response:
        raise requests.ConnectionError(
            f"{request.method} {request.url}: not wired in-process (flask_gateway.testing sends nothing over "
            "the network; only the gateway's configured URLs and the shop's public URL are wired)",
            request=request,
        )

    def close(self) -> None:
        pass


@dataclass(frozen=True)
class Wiring:
    """The two directions of a :func:`connect`: each a ``requests.Session`` with a :class:`FlaskAdapter`."""

    shop: Flask
    emulator: Flask
    #: The shop's clients to the emulator (installed in the extension's state).
    to_emulator: requests.Session
    #: The emulator's callbacks and v1 outcome calls to the shop (installed in the emulator).
    to_shop: requests.Session


def gateway_config(*, emulator_url: str = EMULATOR_URL, shop_url: str = SHOP_URL) -> dict[str, Any]:
    """The ``GATEWAY_*`` keys of a shop that :func:`connect` wires to an in-process emulator."""
    return {
        "GATEWAY_ENVIRONMENT": "emulator",
        "GATEWAY_BASE_URL": emulator_url,
        "GATEWAY_INSTALL_URL": f"{emulator_url}/install",
        "GATEWAY_V1_BASE_URL": emulator_url,
        "GATEWAY_PUBLIC_URL": shop_url,
    }


def connect(
    shop: Flask,
    emulator: Flask,
    *,
    emulator_url: str = EMULATOR_URL,
    shop_url: str = SHOP_URL,
    pause_retries: bool = False,
) -> Wiring:
    """Wire ``shop`` (an app with the extension) and ``emulator`` (an emulator app) to each other.

    ``pause_retries``: keep the clients' real pauses between retries (off by default: a test does not
    wait out a backoff).
    """
    to_emulator = requests.Session()
    to_emulator.mount(emulator_url, FlaskAdapter(emulator.test_client()))
    _use_session(shop, to_emulator, pause_retries=pause_retries)
    to_shop = requests.Session()
    to_shop.mount(shop_url, FlaskAdapter(shop.test_client()))
    set_merchant_http(emulator, to_shop)
    return Wiring(shop=shop, emulator=emulator, to_emulator=to_emulator, to_shop=to_shop)


def shop_base_url(shop: Flask) -> str:
    """Where the gateway reaches ``shop``: its ``GATEWAY_PUBLIC_URL``, else the address its URLs are built
    on without one (``http://localhost``, or ``SERVER_NAME``), without a trailing slash."""
    public = get_state(shop).config.public_url
    if public:
        return public
    with shop.test_request_context():
        return request.url_root.rstrip("/")


def connect_configured(shop: Flask, emulator: Flask, *, pause_retries: bool = False) -> Wiring:
    """Wire ``shop`` and ``emulator`` on the addresses the shop is configured with.

    The shop's ``GATEWAY_BASE_URL``, ``GATEWAY_INSTALL_URL`` and ``GATEWAY_V1_BASE_URL`` (or its
    ``GATEWAY_ENVIRONMENT``'s: the local emulator's ``http://127.0.0.1:5050`` by default, or the
    sandbox's) lead to ``emulator``, paths mapped (``{install_url}/v2`` is ``/install/v2`` on the emulator);
    the shop's :func:`shop_base_url` leads back to ``shop``. Anything else fails with
    ``requests.ConnectionError`` (:class:`OffTheNetwork`) in both directions. A shop configured for
    ``production`` is refused (``ValueError``): a test has no business with production addresses.
    """
    config = get_state(shop).config
    if config.environment == "production":
        raise ValueError(
            "The shop is configured with GATEWAY_ENVIRONMENT='production': wire a test shop configured "
            "for 'emulator' (the default) or 'sandbox' instead."
        )
    emulator_client = emulator.test_client()
    to_emulator = _offline_session()
    for configured, served_at in (
        (config.base_url, ""),
        (config.v1_base_url, ""),
        (config.install_url, "/install"),
    ):
        path = urlsplit(configured).path.rstrip("/")
        adapter = FlaskAdapter(emulator_client, strip_prefix=path, add_prefix=served_at)
        to_emulator.mount(configured.rstrip("/") + "/", adapter)
    _use_session(shop, to_emulator, pause_retries=pause_retries)
    to_shop = _offline_session()
    shop_url = shop_base_url(shop)
    script_root = urlsplit(shop_url).path.rstrip("/")
    adapter = FlaskAdapter(shop.test_client(), strip_prefix=script_root, script_root=script_root)
    to_shop.mount(shop_url + "/", adapter)
    set_merchant_http(emulator, to_shop)
    return Wiring(shop=shop, emulator=emulator, to_emulator=to_emulator, to_shop=to_shop)


def _offline_session() -> requests.Session:
    session = requests.Session()
    session.trust_env = False  # no proxy from the environment: nothing is sent anywhere
    session.mount("http://", OffTheNetwork())
    session.mount("https://", OffTheNetwork())
    return session


def _use_session(shop: Flask, session: requests.Session, *, pause_retries: bool) -> None:
    options: dict[str, Any] = {"session": session}
    if not pause_retries:
        options["sleep"] = _no_pause
    get_state(shop).client_options.update(options)


def _no_pause(_seconds: float) -> None:
    return None


# --- an emulator for one shop -------------------------------------------------------------------------


def emulator_settings_for(shop: Flask, **overrides: Any) -> EmulatorSettings:
    """Emulator settings that match ``shop``'s configuration, for an in-process emulator.

    No worker thread (callbacks go out on :meth:`GatewayEmulator.deliver` or a clock advance), the
    gateway's own retry delays (2 and 10 s of the test clock), ``paymentUrl`` on the shop's
    ``GATEWAY_BASE_URL``, the shop's wire names, and the firewall the shop says its gateway has
    (``GATEWAY_WAF``: ``strict``, like the real gateway, unless the shop set ``allow-local``).
    ``overrides`` are ``EmulatorSettings`` fields.
    """
    config = get_state(shop).config
    options: dict[str, Any] = {
        "accounts": {DEMO_ACCOUNT: DEMO_API_KEY},
        "worker": False,
        "callback_retry_delays": (2.0, 10.0),
        "public_url": config.base_url,
        "wire_names": config.wire_names,
        "waf_strict": config.waf == "strict",
    }
    options.update(overrides)
    return EmulatorSettings(**options)


def make_emulator(database_url: str, settings: EmulatorSettings) -> Flask:
    """An emulator app for a test (``TESTING``, so no worker thread) on ``database_url``.

    It writes nothing outside its database: a session secret of its own (no secret file in an instance
    folder), and the system's temporary folder as its instance folder (not one beside the package)."""
    return create_app(
        {
            "TESTING": True,
            "SECRET_KEY": secrets.token_hex(32),
            "SQLALCHEMY_DATABASE_URI": database_url,
            "EMULATOR_SETTINGS": settings,
        },
        instance_path=tempfile.gettempdir(),
    )


class EmulatorPool:
    """Emulator apps kept for reuse across tests, one per database URL and settings.

    Building an emulator app (its routes, its tables, its first compiled statements) costs more than a
    whole payment through it; a test suite makes one per kind and starts every use with the control API's
    reset, so no checkout, key, callback, e-mail, fault or clock offset of an earlier test is left.
    ``database_url`` is the pool's own SQLite file in ``folder``; :meth:`close` closes every app's
    connections.
    """

    def __init__(self, folder: Path) -> None:
        self.database_url = f"sqlite:///{folder / 'gateway-emulator.sqlite3'}"
        self._apps: dict[tuple[str, str], Flask] = {}

    def emulator(self, database_url: str, settings: EmulatorSettings) -> Flask:
        """The pool's emulator for ``database_url`` and ``settings`` (made on first use), reset."""
        key = (database_url, repr(settings))
        app = self._apps.get(key)
        if app is None:
            app = self._apps[key] = make_emulator(database_url, settings)
        # Also a new app: another one (other settings) may have used the same database before.
        reset_tables(app, settings)
        return app

    def close(self) -> None:
        """Close every pooled emulator app's database connections and forget the apps."""
        for app in self._apps.values():
            with app.app_context():
                emulator_models.db.engine.dispose()
        self._apps.clear()


def reset_tables(emulator: Flask, settings: EmulatorSettings) -> None:
    """What the control API's reset leaves (``POST /_emulator/reset``: no checkout, key, delivery, e-mail,
    fault or clock offset; the accounts of ``settings`` as issued, not installed), in one transaction on
    one connection: every table of the emulator emptied, the accounts and the clock row inserted again.

    The pool's reset: the view's work without a request, the ORM or a second commit. The emulator keeps
    all of its state in those tables; ``tests/plugin`` compares the two resets row by row.
    """
    prepare_database(emulator)  # the emulator creates its tables on first use: this may be the first
    with emulator.app_context(), emulator_models.db.engine.begin() as connection:
        for table in reversed(emulator_models.db.metadata.sorted_tables):
            connection.execute(table.delete())
        if settings.accounts:
            connection.execute(
                insert(emulator_models.Account),
                [{"merchant_account_id": a, "api_key": k} for a, k in settings.accounts.items()],
            )
        connection.execute(insert(emulator_models.ClockState), [{"id": 1}])


def _reset(emulator: Flask) -> None:
    """The control API's reset: no checkout, key, delivery, e-mail, fault or clock offset is left."""
    answer = emulator.test_client().post("/_emulator/reset", json={})
    if answer.status_code != 200:
        raise GatewayEmulatorError(f"The emulator could not be reset: {answer.get_data(as_text=True)}")


def sqlite_without_fsync(shop: Flask) -> Callable[[], None]:
    """Write the shop's SQLite file databases without ``fsync`` until the returned function is called.

    Every connection the shop's engines (Flask-SQLAlchemy's, each bind, and the extension's own) hand out
    gets ``PRAGMA synchronous=OFF``, and its own setting back when it returns to the pool: what a commit
    proves (locks, transactions, isolation, constraints) is unchanged; only the flush to disk a power cut
    would need is skipped. In-memory databases and other backends are left alone. The returned function
    removes the listeners (connections already handed out get their setting back when returned).
    """
    state = get_state(shop)
    with shop.app_context():
        engines = {id(engine): engine for engine in (*state.db.engines.values(), state.engine)}
    undo: list[Callable[[], None]] = []
    for engine in engines.values():
        if engine.dialect.name != "sqlite" or sqlite_in_memory(engine):
            continue
        undo.append(_without_fsync(engine))

    def restore() -> None:
        for step in undo:
            step()

    return restore


def _without_fsync(engine: Engine) -> Callable[[], None]:
    own: dict[int, Any] = {}  # connection id -> its synchronous setting before the checkout

    def checkout(dbapi_connection: Any, _record: Any, _proxy: Any) -> None:
        cursor = dbapi_connection.cursor()
        own[id(dbapi_connection)] = cursor.execute("PRAGMA synchronous").fetchone()[0]
        cursor.execute("PRAGMA synchronous=OFF")
        cursor.close()

    def checkin(dbapi_connection: Any, _record: Any) -> None:
        setting = own.pop(id(dbapi_connection), None)
        if setting is not None and dbapi_connection is not None:
            dbapi_connection.execute(f"PRAGMA synchronous={int(setting)}")

    event.listen(engine, "checkout", checkout)
    event.listen(engine, "checkin", checkin)

    def remove() -> None:
        event.remove(engine, "checkout", checkout)
        if not own:  # else a connection is still handed out: it gets its setting back when returned
            event.remove(engine, "checkin", checkin)

    return remove


def token_of(checkout: object) -> str:
    """The checkout token in ``checkout``: a ``GatewayCheckout`` (or anything with ``.token``), a token, a
    payment page URL (``.../app/checkout/<token>``), or the shop's response redirecting to one."""
    token = getattr(checkout, "token", None)
    if isinstance(token, str) and token:
        return token
    headers = getattr(checkout, "headers", None)
    if headers is not None and not isinstance(checkout, str):
        location = headers.get("Location")
        status = getattr(checkout, "status_code", None)
        if not location:
            body = getattr(checkout, "get_data", lambda **_: "")(as_text=True)
            raise GatewayEmulatorError(
                f"The shop answered HTTP {status} without a Location: not a redirect to the gateway's "
                f"payment page. Its answer began: {body[:300]!r}"
            )
        return token_of(str(location))
    if isinstance(checkout, str) and checkout:
        if "/" in checkout:
            path = urlsplit(checkout).path.rstrip("/")
            if "/app/checkout/" not in path:
                raise GatewayEmulatorError(
                    f"{checkout!r} is not a payment page URL of the gateway (.../app/checkout/<token>)"
                )
            return path.rsplit("/", 1)[1]
        return checkout
    raise GatewayEmulatorError(
        f"Cannot tell which checkout {checkout!r} is: give a GatewayCheckout, a checkout token, a payment "
        "URL or the shop's redirect to it"
    )


class GatewayEmulatorError(AssertionError):
    """The emulator refused what a helper asked (a test failure: the message says what and why)."""


@dataclass(frozen=True)
class ConsumerOutcome:
    """What the consumer's action on the payment page did (the control API's answer)."""

    #: The checkout's status at the gateway afterwards (e.g. ``PAID_PENDING_CALLBACK``).
    status: str
    #: Where the consumer is sent back to the shop (v2: the confirm or cancel URL; v1: the ``return_url``
    #: of the shop's answer, None when it gave no usable one).
    redirect_url: str | None
    #: v1: what the shop's success/fail URL answered (``OK`` or why it failed).
    merchant_message: str | None = None


@dataclass(frozen=True)
class CallbackReply:
    """What the shop answered to a callback sent by :meth:`GatewayEmulator.replay_callback` or
    :meth:`GatewayEmulator.redeliver`."""

    #: Only HTTP 200 acknowledges a callback.
    ok: bool
    http_status: int | None
    #: ``OK``, ``HTTP 500``, ``Timeout after 10 s``...
    message: str


@dataclass(frozen=True)
class SignalRecord:
    """One signal the extension sent for the shop while the emulator was running."""

    #: ``payment_confirmed``, ``checkout_cancelled``, ``checkout_expired``, ``callback_rejected`` or
    #: ``checkout_flagged``.
    signal: str
    token: str | None
    order_reference: str | None
    #: ``callback``, ``return``, ``poll``, ``reconcile``, ``v1``, ``admin`` (when the signal has one).
    source: str | None = None
    #: Why (``callback_rejected``, ``checkout_flagged``).
    reason: str | None = None


_WATCHED: Final = {
    "payment_confirmed": payment_confirmed,
    "checkout_cancelled": checkout_cancelled,
    "checkout_expired": checkout_expired,
    "callback_rejected": callback_rejected,
    "checkout_flagged": checkout_flagged,
}


@dataclass
class GatewayEmulator:
    """An in-process emulator wired to one shop, with helpers for the shop's tests (docs/testing.md).

    Build it with :meth:`start` and end it with :meth:`close` (or use it as a context manager). While it
    runs it records the extension's signals for the shop (:attr:`signals`), so a test can assert that an
    order was fulfilled exactly once. Every helper drives the emulator through its control API
    (``/_emulator/...``) with its test client: the code paths of the real emulator.
    """

    shop: Flask
    #: The emulator app.
    app: Flask
    #: How the two are wired; None for an emulator embedded in the shop (``GATEWAY_ENVIRONMENT="embedded"``:
    #: the extension wires it itself).
    wiring: Wiring | None
    #: The emulator's test client (the control API, or anything else of the emulator).
    client: FlaskClient
    account: str = DEMO_ACCOUNT
    api_key: str = DEMO_API_KEY
    #: Every watched signal the extension sent for the shop since :meth:`start`, oldest first.
    signals: list[SignalRecord] = field(default_factory=list)
    _receivers: list[tuple[Any, Callable[..., None]]] = field(default_factory=list, repr=False)
    _client_options: dict[str, Any] = field(default_factory=dict, repr=False)
    #: Called by :meth:`close`: what :meth:`start` changed on the shop for the test, undone.
    _undo: list[Callable[[], None]] = field(default_factory=list, repr=False)
    _closed: bool = field(default=False, repr=False)
    #: The emulator app was made for this object alone (closed with it).
    _owned: bool = field(default=False, repr=False)

    # --- life ---------------------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        shop: Flask,
        *,
        database_url: str,
        settings: EmulatorSettings | None = None,
        install: bool = True,
        minimum_cents: int = 100,
        maximum_cents: int = 10_000_000,
        callback_failures_email: str | None = None,
        pool: EmulatorPool | None = None,
        sqlite_no_fsync: bool = False,
    ) -> GatewayEmulator:
        """An emulator on ``database_url`` wired to ``shop`` (:func:`connect_configured`) and, unless
        ``install`` is false, the gateway installed on the shop with the emulator's demo account.

        With ``pool`` the emulator app comes from it (reset) and stays there after :meth:`close`; without,
        a new one is made and closed with this object. A shop with ``GATEWAY_ENVIRONMENT="embedded"``
        brings its own emulator, already wired: that one is used (reset), and ``database_url``,
        ``settings`` and ``pool`` do not apply.

        ``sqlite_no_fsync``: while it runs, the shop's SQLite file database is written without ``fsync``
        (:func:`sqlite_without_fsync`): a test's database needs no durability against a power cut, and a
        commit then costs microseconds instead of one or more disk flushes. Only when asked: it is the
        shop's database."""
        state = get_state(shop)
        saved = dict(state.client_options)
        embedded = embedded_emulator(shop)
        wiring: Wiring | None = None
        if embedded is not None:
            emulator = embedded.app
            settings = emulator.extensions["gateway_emulator"]
            _reset(emulator)
        else:
            settings = settings or emulator_settings_for(shop)
            emulator = (
                pool.emulator(database_url, settings) if pool else make_emulator(database_url, settings)
            )
            wiring = connect_configured(shop, emulator)
        account, api_key = next(iter(settings.accounts.items()), (DEMO_ACCOUNT, DEMO_API_KEY))
        gateway = cls(
            shop=shop,
            app=emulator,
            wiring=wiring,
            client=emulator.test_client(),
            account=account,
            api_key=api_key,
            _client_options=saved,
            _owned=embedded is None and pool is None,
        )
        gateway._watch()
        if sqlite_no_fsync:
            gateway._undo.append(sqlite_without_fsync(shop))
        clear_payment_plan_cache()  # plans cached by another test's gateway must not leak into this one
        try:
            if install:
                gateway.install(
                    minimum_cents=minimum_cents,
                    maximum_cents=maximum_cents,
                    callback_failures_email=callback_failures_email,
                )
        except BaseException:
            gateway.close()
            raise
        return gateway

    def close(self) -> None:
        """Stop recording signals, give the shop back its own HTTP settings, close the database connections
        the emulator (and the extension's own SQLite engine) opened."""
        if self._closed:
            return
        self._closed = True
        for signal, receiver in self._receivers:
            # From every sender: blinker keeps a receiver disconnected from one sender only (and with it
            # this object, the shop app and the wiring) for the rest of the process.
            signal.disconnect(receiver)
        self._receivers.clear()
        while self._undo:
            self._undo.pop()()
        state = get_state(self.shop)
        state.client_options.clear()
        state.client_options.update(self._client_options)
        with self.shop.app_context():
            state.dispose()  # the connections the shop's callbacks opened on the extension's own engine
        clear_payment_plan_cache()
        if self._owned:
            with self.app.app_context():
                emulator_models.db.engine.dispose()
        if self.wiring is not None:
            self.wiring.to_emulator.close()
            self.wiring.to_shop.close()

    def __enter__(self) -> GatewayEmulator:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def _watch(self) -> None:
        for name, signal in _WATCHED.items():

            def receiver(sender: Flask, *, _name: str = name, **kwargs: Any) -> None:
                checkout = kwargs.get("checkout")
                self.signals.append(
                    SignalRecord(
                        signal=_name,
                        token=getattr(checkout, "token", None),
                        order_reference=getattr(checkout, "order_reference", None),
                        source=kwargs.get("source"),
                        reason=kwargs.get("reason"),
                    )
                )

            signal.connect(receiver, sender=self.shop, weak=False)
            self._receivers.append((signal, receiver))

    # --- the shop's side ------------------------------------------------------------------------------

    def install(
        self,
        *,
        minimum_cents: int = 100,
        maximum_cents: int = 10_000_000,
        callback_failures_email: str | None = None,
    ) -> None:
        """Install the gateway on the shop with the emulator's account (what the owner's install screen
        does), the callback URL on the shop's public address. Once the account is installed, the same
        call changes the installed settings instead (the settings screen's update: the gateway installs
        an account only once)."""
        with self.shop.test_request_context(base_url=shop_base_url(self.shop)):
            url = callback_url()
            try:
                install(
                    InstallSettings(
                        merchant_account_id=self.account,
                        api_key=self.api_key,
                        callback_url=url,
                        callback_failures_email=callback_failures_email,
                        minimum_cents=minimum_cents,
                        maximum_cents=maximum_cents,
                    )
                )
            except AlreadyInstalledError:
                update_settings(
                    callback_url=url,
                    callback_failures_email=callback_failures_email,
                    minimum_cents=minimum_cents,
                    maximum_cents=maximum_cents,
                )

    # --- the control API ------------------------------------------------------------------------------

    def control(self, path: str, body: Mapping[str, Any] | None = None, *, method: str = "POST") -> Any:
        """Call ``/_emulator/<path>`` and return its JSON answer; an error answer is a
        :class:`GatewayEmulatorError` carrying the emulator's message."""
        payload = dict(body or {}) if method != "GET" else None
        answer = self.client.open(f"/_emulator/{path}", method=method, json=payload)
        data = answer.get_json(silent=True)
        if answer.status_code >= 400:
            message = data.get("message") if isinstance(data, dict) else answer.get_data(as_text=True)[:300]
            raise GatewayEmulatorError(
                f"The emulator refused {method} /_emulator/{path}: HTTP {answer.status_code}: {message}"
            )
        return data

    def checkout(self, checkout: object) -> dict[str, Any]:
        """The emulator's view of one checkout (``GET /_emulator/checkouts/<token>``): its status,
        ``status`` (the getstatus payload), refunds and timeline (``events``)."""
        data: dict[str, Any] = self.control(f"checkouts/{token_of(checkout)}", method="GET")
        return data

    def status(self, checkout: object) -> str:
        """The checkout's status at the gateway (``checkoutPaymentStatus``)."""
        return str(self.checkout(checkout)["checkoutPaymentStatus"])

    def callbacks(self, checkout: object | None = None) -> list[dict[str, Any]]:
        """Every callback attempt (of one checkout), oldest first: ``url``, ``httpStatus``, ``message``,
        ``ok``, ``requestBody``... (docs/emulator.md)."""
        query = f"?checkoutToken={token_of(checkout)}&kind=callback" if checkout is not None else ""
        attempts: list[dict[str, Any]] = self.control(f"callbacks{query}", method="GET")["callbacks"]
        return attempts

    # --- the consumer ---------------------------------------------------------------------------------

    def pay(self, checkout: object) -> ConsumerOutcome:
        """The shopper pays on the gateway's payment page (the hosted page's Pay button).

        The checkout is then ``PAID_PENDING_CALLBACK`` at the gateway and its callback is due: the shop
        hears of it on :meth:`deliver` (or when the shopper comes back, ``redirect_url``)."""
        return self._outcome(self.control(f"checkouts/{token_of(checkout)}/pay"))

    def cancel_as_consumer(self, checkout: object) -> ConsumerOutcome:
        """The shopper cancels on the gateway's payment page (its Cancel button)."""
        return self._outcome(self.control(f"checkouts/{token_of(checkout)}/cancel"))

    @staticmethod
    def _outcome(data: Mapping[str, Any]) -> ConsumerOutcome:
        return ConsumerOutcome(
            status=str(data["checkoutPaymentStatus"]),
            redirect_url=data.get("redirectUrl"),
            merchant_message=data.get("merchantMessage"),
        )

    # --- time ---------------------------------------------------------------------------------------

    def advance_clock(self, seconds: float) -> dict[str, Any]:
        """Move the gateway's clock forward: what became due happens (expiries, callback retries).

        Answers ``{"now", "offsetSeconds", "expired", "deliveryAttempts"}``. Only the emulator's clock
        moves; the shop's is the real one."""
        data: dict[str, Any] = self.control("clock/advance", {"seconds": seconds})
        return data

    def expire(self, checkout: object) -> dict[str, Any]:
        """Let the checkout's time run out at the gateway: the clock is moved to just past its
        ``expiresAt`` (so every checkout due by then expires too). The shop learns of it as it would
        from the real gateway: on a status poll (``flask_gateway.refresh``, ``reconcile``), or for v1
        from the ABANDONED notice the clock advance delivers."""
        token = token_of(checkout)
        detail = self.checkout(token)
        status = detail["checkoutPaymentStatus"]
        if status not in OPEN_STATUSES:
            raise GatewayEmulatorError(
                f"Checkout {token} is {status} at the gateway: only an open checkout ("
                f"{', '.join(sorted(OPEN_STATUSES))}) can expire. The clock was not moved."
            )
        now = parse_timestamp(self.control("clock", method="GET")["now"])
        due = (parse_timestamp(detail["expiresAt"]) - now).total_seconds()
        answer = self.advance_clock(max(0.0, due) + 1.0)
        status = self.status(token)
        if status != "EXPIRED":  # a v1 checkout the consumer cancelled, for one, does not expire
            raise GatewayEmulatorError(
                f"Checkout {token} is {status} at the gateway after the clock passed its expiresAt, not "
                "EXPIRED."
            )
        return answer

    # --- callbacks ------------------------------------------------------------------------------------

    def deliver(self) -> int:
        """Send the callbacks that are due now (and apply due expiries); how many attempts were made."""
        return int(self.control("deliver")["attempts"])

    def fail_next_callback(self, times: int = 1) -> None:
        """The next ``times`` callback attempts fail as if the shop had answered HTTP 500 (nothing reaches
        the shop); the gateway retries after its delays (:meth:`advance_clock`), then dead-letters."""
        self.control("faults", {"operation": "callback", "kind": "callback_fail", "count": times})

    def time_out_next_callback(self, times: int = 1) -> None:
        """The next ``times`` callback attempts time out (nothing reaches the shop)."""
        self.control("faults", {"operation": "callback", "kind": "callback_timeout", "count": times})

    def replay_callback(self, checkout: object) -> CallbackReply:
        """Send the checkout's last callback again: the same body, freshly signed with the account's key,
        posted to the same URL by the emulator's own callback sender. A shop must answer it (HTTP 200)
        without fulfilling twice."""
        token = token_of(checkout)
        attempts = self.callbacks(token)
        if not attempts:
            raise GatewayEmulatorError(
                f"No callback was sent for checkout {token} yet: pay it and call deliver() first."
            )
        last = attempts[-1]
        with self.app.app_context():
            row = emulator_models.db.session.scalars(
                select(emulator_models.Checkout).where(emulator_models.Checkout.token == token)
            ).one()
            account = emulator_models.db.session.get_one(emulator_models.Account, row.account_id)
            account_id, signing_key = account.merchant_account_id, account.signing_key
            emulator_models.db.session.rollback()
            if not signing_key:
                raise GatewayEmulatorError(f"Account {account_id} has no signing key: is it installed?")
            reply = post_callback(
                last["url"],
                str(last["requestBody"]).encode("utf-8"),
                merchant_account_id=account_id,
                signing_key=signing_key,
            )
        return CallbackReply(ok=reply.ok, http_status=reply.http_status, message=reply.message)

    def redeliver(self, checkout: object) -> CallbackReply:
        """Redeliver the checkout's dead letter (a callback that failed every attempt), as the emulator's
        dashboard button does: back in the outbox and attempted at once."""
        token = token_of(checkout)
        dead = [
            d
            for d in self.control("dead-letters", method="GET")["deadLetters"]
            if d["checkoutToken"] == token
        ]
        if not dead:
            raise GatewayEmulatorError(
                f"Checkout {token} has no dead letter (its callbacks: {self._attempts(token)})"
            )
        answer = self.control(f"dead-letters/{dead[-1]['id']}/redeliver")
        attempt = answer.get("attempt") or {}
        return CallbackReply(
            ok=bool(answer.get("ok")),
            http_status=attempt.get("httpStatus"),
            message=str(attempt.get("message")),
        )

    # --- what the shop did ----------------------------------------------------------------------------

    def confirmations(self, checkout: object) -> list[SignalRecord]:
        """The ``payment_confirmed`` signals sent for ``checkout`` (a checkout, its token, its payment URL,
        the shop's redirect to it, or the order's reference) since the emulator started."""
        return self._records("payment_confirmed", checkout)

    def assert_fulfilled_once(self, checkout: object) -> SignalRecord:
        """Assert that the extension sent ``payment_confirmed`` (the shop's cue to fulfil) exactly once for
        ``checkout`` (a checkout, its token, its payment URL, the shop's redirect to it, or the order's
        reference) during this test; returns that signal's record."""
        found = self.confirmations(checkout)
        if len(found) == 1:
            return found[0]
        what = self._describe(checkout)
        if not found:
            raise AssertionError(
                f"Expected {what} to be fulfilled exactly once, but payment_confirmed was never sent for "
                f"it.\n{self._diagnosis(checkout)}"
            )
        sources = ", ".join(str(record.source) for record in found)
        raise AssertionError(
            f"Expected {what} to be fulfilled exactly once, but payment_confirmed was sent {len(found)} "
            f"times (sources: {sources}).\n{self._diagnosis(checkout)}"
        )

    def assert_not_fulfilled(self, checkout: object) -> None:
        """Assert that ``payment_confirmed`` was never sent for ``checkout`` during this test."""
        found = self.confirmations(checkout)
        if found:
            sources = ", ".join(str(record.source) for record in found)
            raise AssertionError(
                f"Expected {self._describe(checkout)} not to be fulfilled, but payment_confirmed was sent "
                f"{len(found)} time(s) (sources: {sources}).\n{self._diagnosis(checkout)}"
            )

    def _key(self, checkout: object) -> str:
        try:
            return token_of(checkout)
        except GatewayEmulatorError:
            if isinstance(checkout, str):
                return checkout
            raise

    def _records(self, signal: str, checkout: object) -> list[SignalRecord]:
        key = self._key(checkout)
        return [r for r in self.signals if r.signal == signal and key in (r.token, r.order_reference)]

    def _token_for(self, checkout: object) -> str | None:
        """The token of ``checkout``, also when it is an order reference the emulator knows."""
        key = self._key(checkout)
        for record in self.signals:
            if key in (record.token, record.order_reference) and record.token:
                return record.token
        rows = self.control("checkouts", method="GET")["checkouts"]
        for row in rows:  # newest first
            if key in (row["checkoutToken"], row["merchantOrderReference"]):
                return str(row["checkoutToken"])
        return None

    def _describe(self, checkout: object) -> str:
        key = self._key(checkout)
        token = self._token_for(checkout)
        if token is None:
            return f"the order or checkout {key!r}"
        if token == key:
            return f"checkout {key}"
        return f"order {key} (checkout {token})"

    def _attempts(self, token: str) -> str:
        attempts = self.callbacks(token)
        if not attempts:
            return "none"
        return "; ".join(
            f"#{a['number']} {a['message']}" + ("" if a["ok"] else " (not acknowledged)") for a in attempts
        )

    def _diagnosis(self, checkout: object) -> str:
        token = self._token_for(checkout)
        if token is None:
            return (
                "The gateway has no checkout by that token or order reference: did the shop create one "
                "(start_checkout) with this emulator?"
            )
        lines = [f"At the gateway it is {self.status(token)}; callback attempts: {self._attempts(token)}."]
        others = [r for r in self.signals if r.token == token and r.signal != "payment_confirmed"]
        if others:
            lines.append(
                "Other signals for it: "
                + "; ".join(
                    f"{r.signal}" + (f" ({r.reason or r.source})" if r.reason or r.source else "")
                    for r in others
                )
                + "."
            )
        now = parse_timestamp(self.control("clock", method="GET")["now"])
        for waiting in self.control("deliveries?state=pending", method="GET")["deliveries"]:
            if waiting["checkoutToken"] != token or waiting["kind"] != "callback":
                continue
            due = (parse_timestamp(waiting["nextAttemptAt"]) - now).total_seconds()
            lines.append(
                "A callback for it waits in the gateway's outbox, "
                + (
                    f"due in {due:.1f} s of the gateway's clock: advance_clock({math.ceil(due)}) sends it."
                    if due > 0
                    else "due now: deliver() sends it."
                )
            )
        return "\n".join(lines)
