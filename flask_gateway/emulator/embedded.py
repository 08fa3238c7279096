"""The emulator mounted inside another Flask app: one process, one ``flask run`` (docs/emulator.md).

:func:`mount` puts a complete emulator app (the same :func:`~flask_gateway.emulator.app.create_app` the
separate process serves) under a path prefix of the host app, with ``werkzeug``'s ``DispatcherMiddleware``
around the host's ``wsgi_app``: ``/_gateway/v2/create``, the hosted payment pages
(``/_gateway/api/v2/app/checkout/<token>``), the dashboard (``/_gateway/_emulator/``), the test clock and
the faults all answer on the host's own address. It is an app beside the host's, not blueprints inside
it, so it changes nothing of the host: not its error handlers, CSRF protection, body limit, session cookie
or configuration, and the host's hooks never run on the emulator's requests.

- **Its merchant is the host.** The emulator's callbacks and v1 outcome calls are handed to the host app
  in-process (``flask_gateway.core.wsgi.WSGIAdapter``), signed exactly as over HTTP, whatever host their
  URL names: a server that handles one request at a time never waits for itself.
- **Its tables live in the host's database** (``emulator_*``, beside the shop's own), through an engine of
  its own on the host's ``SQLALCHEMY_DATABASE_URI``; ``EMULATOR_DATABASE_URL`` puts them elsewhere. An
  in-memory SQLite host gets an in-memory emulator database of its own (one connection cannot be shared).
  Mounting opens no connection: the tables are created on the emulator's first request that needs them
  (a shop that starts while its database is away starts).
- **Local addresses are allowed** (``EMULATOR_WAF=allow-local``, unless that variable says otherwise): an
  embedded emulator runs where the shop runs, on localhost in development.
- **Never beside the real gateway**: a host whose ``GATEWAY_ENVIRONMENT`` is ``sandbox`` or ``production``
  is refused (:class:`EmbeddingRefused`), so a stray setting cannot put a fake gateway in front of real
  shoppers.

The extension mounts it by itself with ``GATEWAY_ENVIRONMENT="embedded"`` (and points its clients at it,
in-process); :func:`mount` does the mounting by hand for any app.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
from dataclasses import dataclass, replace
from typing import Any, Final

import requests
from flask import Flask
from werkzeug.middleware.dispatcher import DispatcherMiddleware

from flask_gateway.core.secret_keys import SecretKeyFallbacksError, fallback_keys
from flask_gateway.core.wsgi import WSGIAdapter
from flask_gateway.emulator.app import create_app
from flask_gateway.emulator.merchant import set_merchant_http
from flask_gateway.emulator.settings import EmulatorSettings, SettingsError, timezone_name

__all__ = ["DEFAULT_PREFIX", "EmbeddedEmulator", "EmbeddingRefused", "embedded_emulator", "mount"]

#: Where the emulator answers in the host app unless told otherwise (``GATEWAY_EMBEDDED_PREFIX``).
DEFAULT_PREFIX: Final = "/_gateway"

#: ``app.extensions`` key of the host app's :class:`EmbeddedEmulator`.
EMBEDDED_KEY: Final = "gateway_embedded_emulator"

#: Host environments that talk to the real gateway: an emulator is never mounted beside it.
_REAL_GATEWAY: Final = ("sandbox", "production")


class EmbeddingRefused(RuntimeError):
    """The emulator cannot be mounted in this app; the message says why and what to do."""


@dataclass(frozen=True)
class EmbeddedEmulator:
    """An emulator mounted in a host app."""

    #: The emulator's own Flask app (its config, ``app.test_client()``, its control API).
    app: Flask
    #: The app it is mounted in.
    host: Flask
    #: Its path in the host app (``/_gateway``).
    prefix: str


def mount(
    host: Flask, prefix: str = DEFAULT_PREFIX, *, settings: EmulatorSettings | None = None
) -> EmbeddedEmulator:
    """Mount a gateway emulator in ``host`` under ``prefix``; answer what was mounted.

    ``settings``: the emulator's (default: read from the ``EMULATOR_*`` environment variables, with local
    addresses allowed unless ``EMULATOR_WAF`` is set, and ``EMULATOR_PUBLIC_URL`` taken from the host's
    ``GATEWAY_PUBLIC_URL`` plus ``prefix``). Call it after ``db.init_app(host)`` so the emulator finds the
    host's database. Raises :class:`EmbeddingRefused` for a host configured for the real gateway, a bad
    prefix, or a second mount.
    """
    environment = host.config.get("GATEWAY_ENVIRONMENT")
    if environment in _REAL_GATEWAY:
        raise EmbeddingRefused(
            f"The gateway emulator cannot be mounted in an app whose GATEWAY_ENVIRONMENT is {environment!r}: "
            "that app talks to the real gateway, and a fake one beside it could take real shoppers' orders. "
            "Use GATEWAY_ENVIRONMENT='embedded' (or 'emulator') for development and tests."
        )
    if EMBEDDED_KEY in host.extensions:
        raise EmbeddingRefused("A gateway emulator is already mounted in this app: mount it once.")
    prefix = _checked_prefix(prefix)
    settings = _settings(host, prefix, settings)
    config: dict[str, Any] = {
        "EMULATOR_SETTINGS": settings,
        "TESTING": host.testing,
        # The emulator's "reset after commit" fault has no socket to reset in-process: its exception must
        # reach the in-process caller (WSGIAdapter), as it does with the test client.
        "PROPAGATE_EXCEPTIONS": True,
    }
    config.update(_secret_config(host))
    database_url = settings.database_url or _host_database(host)
    if database_url:
        config["SQLALCHEMY_DATABASE_URI"] = database_url
    emulator = create_app(config, instance_path=host.instance_path)

    to_host = requests.Session()
    to_host.mount("http://", WSGIAdapter(host))
    to_host.mount("https://", WSGIAdapter(host))
    set_merchant_http(emulator, to_host)

    host.wsgi_app = DispatcherMiddleware(host.wsgi_app, {prefix: emulator})  # type: ignore[method-assign]
    embedded = EmbeddedEmulator(app=emulator, host=host, prefix=prefix)
    host.extensions[EMBEDDED_KEY] = embedded
    return embedded


def embedded_emulator(host: Flask) -> EmbeddedEmulator | None:
    """The emulator mounted in ``host``, if any."""
    found: EmbeddedEmulator | None = host.extensions.get(EMBEDDED_KEY)
    return found


def _checked_prefix(prefix: str) -> str:
    cleaned = prefix.rstrip("/")
    if not cleaned.startswith("/") or any(c in cleaned for c in "?#\\ "):
        raise EmbeddingRefused(
            f"The emulator's prefix {prefix!r} must be a path such as '/_gateway' (a leading '/', not '/' "
            "alone, no query or fragment)."
        )
    return cleaned


def _settings(host: Flask, prefix: str, given: EmulatorSettings | None) -> EmulatorSettings:
    if given is not None:
        return given
    settings = EmulatorSettings.from_env()
    if "EMULATOR_WAF" not in os.environ:
        settings = replace(settings, waf_strict=False)
    public = host.config.get("GATEWAY_PUBLIC_URL")
    if settings.public_url is None and public:
        settings = replace(settings, public_url=f"{str(public).rstrip('/')}{prefix}")
    # The payment pages show times in the shop's zone unless told otherwise (read, never changed).
    shop_zone = host.config.get("GATEWAY_TIMEZONE")
    if "EMULATOR_TIMEZONE" not in os.environ and isinstance(shop_zone, str) and shop_zone.strip():
        with contextlib.suppress(SettingsError):  # the extension's own check says what is wrong with it
            settings = replace(settings, timezone=timezone_name(shop_zone))
    return settings


def _host_database(host: Flask) -> str | None:
    """The host's database URL (Flask-SQLAlchemy's resolved one: a relative SQLite path is in the host's
    instance folder), or None when the host has none (the emulator's own file in the host's instance folder).
    """
    database = host.extensions.get("sqlalchemy")
    if database is None:
        return None
    with host.app_context():
        url = database.engine.url
    if url.get_backend_name() == "sqlite" and (url.database or ":memory:") == ":memory:":
        return "sqlite://"
    rendered: str = url.render_as_string(hide_password=False)
    return rendered


def _secret_config(host: Flask) -> dict[str, Any]:
    """The emulator's ``SECRET_KEY``, derived from the host's (the host's key is never the emulator's),
    and its ``SECRET_KEY_FALLBACKS``, derived from the host's fallbacks likewise: across a rotation of the
    host's key, the emulator's sessions (a payment page open, the dashboard's sign-in) and its forms' CSRF
    tokens signed with the old key stay valid while the host keeps that key among its fallbacks."""
    secret = host.config.get("SECRET_KEY")
    if not secret:
        return {}
    try:
        fallbacks = fallback_keys(host.config.get("SECRET_KEY_FALLBACKS"))
    except SecretKeyFallbacksError as error:
        raise EmbeddingRefused(str(error)) from None
    config: dict[str, Any] = {"SECRET_KEY": _derived_secret(secret)}
    if fallbacks:
        older = [_derived_secret(key) for key in fallbacks]
        # Flask's sessions read SECRET_KEY_FALLBACKS themselves. Flask-WTF signs and checks its CSRF tokens
        # with WTF_CSRF_SECRET_KEY, given to itsdangerous as it is: a list of keys, the current one last
        # (it signs), every one verifies.
        config["SECRET_KEY_FALLBACKS"] = older
        config["WTF_CSRF_SECRET_KEY"] = [*older, config["SECRET_KEY"]]
    return config


def _derived_secret(secret: str | bytes) -> str:
    key = secret.encode() if isinstance(secret, str) else secret
    return hmac.new(key, b"flask-gateway embedded emulator session", hashlib.sha256).hexdigest()
