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

This is the one package that sees both the extension and the emulator (docs/architecture.md). Inside, one
module per job, imported in one direction (``gateway`` -> ``assertions`` -> ``records``; ``gateway`` ->
``wiring``, ``pool``, ``sqlite``; those four import nothing of the package; this ``__init__`` only
re-exports): ``wiring`` (the seam), ``pool`` (emulator apps made and reused), ``sqlite`` (no ``fsync``),
``records`` (what the helpers take and return), ``gateway`` (:class:`GatewayEmulator`), ``assertions``.
"""

from __future__ import annotations

from flask_gateway.testing.gateway import GatewayEmulator
from flask_gateway.testing.pool import (
    DEMO_ACCOUNT,
    DEMO_API_KEY,
    EmulatorPool,
    emulator_settings_for,
    make_emulator,
    reset_tables,
)
from flask_gateway.testing.records import (
    CallbackReply,
    CheckoutRef,
    ConsumerOutcome,
    GatewayEmulatorError,
    GatewayKitWarning,
    SignalRecord,
    token_of,
)
from flask_gateway.testing.sqlite import sqlite_without_fsync
from flask_gateway.testing.wiring import (
    EMULATOR_URL,
    SHOP_URL,
    FlaskAdapter,
    OffTheNetwork,
    Wiring,
    connect,
    connect_configured,
    gateway_config,
    shop_base_url,
)

__all__ = [
    "DEMO_ACCOUNT",
    "DEMO_API_KEY",
    "EMULATOR_URL",
    "SHOP_URL",
    "CallbackReply",
    "CheckoutRef",
    "ConsumerOutcome",
    "EmulatorPool",
    "FlaskAdapter",
    "GatewayEmulator",
    "GatewayEmulatorError",
    "GatewayKitWarning",
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
