"""A faithful, stateful emulator of the checkout gateway.

Two ways to run it (docs/emulator.md says which fits where):

- its own app and process: ``flask --app flask_gateway.emulator run --port 5050`` (:func:`create_app`);
- mounted inside a shop's own app, one process and one ``flask run``: ``GATEWAY_ENVIRONMENT="embedded"``
  does it for a shop with the extension, :func:`mount` by hand for any app.

Neither opens a database connection when it starts: the tables and accounts are made ready on first use
(``flask --app flask_gateway.emulator init-db`` or :func:`prepare_database` does it at once).

Built on ``flask_gateway.core`` (signing, wire models, timestamps); it never imports the extension.
"""

from __future__ import annotations

from flask_gateway.emulator.accounts import seed_accounts
from flask_gateway.emulator.app import create_app
from flask_gateway.emulator.database import prepare_database
from flask_gateway.emulator.embedded import (
    DEFAULT_PREFIX,
    EmbeddedEmulator,
    EmbeddingRefused,
    embedded_emulator,
    mount,
)
from flask_gateway.emulator.merchant import set_merchant_http
from flask_gateway.emulator.settings import EmulatorSettings, SettingsError

__all__ = [
    "DEFAULT_PREFIX",
    "EmbeddedEmulator",
    "EmbeddingRefused",
    "EmulatorSettings",
    "SettingsError",
    "create_app",
    "embedded_emulator",
    "mount",
    "prepare_database",
    "seed_accounts",
    "set_merchant_http",
]
