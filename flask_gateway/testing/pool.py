"""Emulator apps for tests: settings that match a shop, one app made for a test, a pool of them reused.

:class:`EmulatorPool` keeps one app per database URL and settings and starts every use with
:func:`reset_tables`. Imports the extension's state and the emulator; nothing of this package.
"""

from __future__ import annotations

import secrets
import tempfile
from pathlib import Path
from typing import Any, Final

from flask import Flask
from sqlalchemy import insert

from flask_gateway.emulator import EmulatorSettings, create_app, prepare_database
from flask_gateway.emulator import models as emulator_models
from flask_gateway.state import get_state

#: The account an emulator has out of the box (``EMULATOR_ACCOUNTS``' default): what :class:`GatewayEmulator`
#: installs.
DEMO_ACCOUNT: Final = "demo-merchant"
DEMO_API_KEY: Final = "demo-api-key"


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
