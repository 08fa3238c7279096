"""The pytest plugin for shop developers: an in-process gateway emulator wired to the shop's app.

Installed with the package (the ``pytest11`` entry point ``flask_gateway``), so a shop's tests get its
fixtures without a ``conftest.py`` line. Every fixture is prefixed ``gateway_`` so that none collides with
a shop's own; there is no autouse fixture, and no hook touches a test that does not ask for them. This
module imports nothing heavy: the emulator and the extension load when a test first uses a fixture.

Fixtures (docs/testing.md):

- ``gateway_app``: the shop's Flask app: the fixture named by the ini option ``gateway_app_fixture``
  (default ``app``, the pytest-flask convention); or override ``gateway_app`` itself.
- ``gateway_emulator_pool`` (session): the emulator apps kept for reuse across tests (each test starts
  with a reset); its SQLite file in a session ``tmp_path_factory`` folder.
- ``gateway_emulator_database_url``: where the emulator keeps its state: the pool's SQLite file.
  Override it (e.g. with a PostgreSQL URL) and each test gets an emulator app of its own on it.
- ``gateway_emulator_settings``: the emulator's ``EmulatorSettings``, matched to the shop's configuration.
- ``gateway_emulator``: a :class:`flask_gateway.testing.GatewayEmulator` wired to ``gateway_app`` and,
  unless ``@pytest.mark.gateway_emulator(install=False)``, installed on the shop.
  ``gateway_emulator.install(account="brand-b")`` installs another merchant account beside the first.
  Every helper taking a checkout takes its order reference or its token alike
  (``GatewayEmulator.resolve``).

The ini option ``gateway_sqlite_no_fsync`` (default false) lets ``gateway_emulator`` write the shop's SQLite
file database without ``fsync`` for the test (:func:`flask_gateway.testing.sqlite_without_fsync`).

The marker ``@pytest.mark.gateway_emulator(...)`` takes ``install`` (default True), ``minimum_cents``
(100), ``maximum_cents`` (10,000,000), ``callback_failures_email`` (None) and ``callback_retry_delays``
(the gateway's ``(2.0, 10.0)``, seconds of the emulator's clock).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Final

import pytest

if TYPE_CHECKING:
    from flask import Flask

    from flask_gateway.emulator import EmulatorSettings
    from flask_gateway.testing import EmulatorPool, GatewayEmulator

__all__ = [
    "APP_FIXTURE_INI",
    "MARKER",
    "NO_FSYNC_INI",
    "gateway_app",
    "gateway_emulator",
    "gateway_emulator_database_url",
    "gateway_emulator_pool",
    "gateway_emulator_settings",
]

#: The ini option naming the shop's app fixture.
APP_FIXTURE_INI: Final = "gateway_app_fixture"
#: The ini option that lets the kit write the shop's SQLite file database without fsync.
NO_FSYNC_INI: Final = "gateway_sqlite_no_fsync"
#: The marker with the ``gateway_emulator`` fixture's options.
MARKER: Final = "gateway_emulator"

_INSTALL_OPTIONS: Final = ("minimum_cents", "maximum_cents", "callback_failures_email")
_SETTINGS_OPTIONS: Final = ("callback_retry_delays",)
_OPTIONS: Final = ("install", *_INSTALL_OPTIONS, *_SETTINGS_OPTIONS)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        APP_FIXTURE_INI,
        "flask_gateway plugin: the name of the fixture that gives the shop's Flask app (default: app)",
        default="app",
    )
    parser.addini(
        NO_FSYNC_INI,
        "flask_gateway plugin: write the shop's SQLite file database without fsync during gateway_emulator "
        "tests (PRAGMA synchronous=OFF; default: false, the shop's own setting)",
        type="bool",
        default=False,
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(install=True, minimum_cents=100, maximum_cents=10000000, callback_failures_email=None, "
        "callback_retry_delays=(2.0, 10.0)): options of the flask_gateway plugin's gateway_emulator fixture",
    )


def _options(request: pytest.FixtureRequest) -> dict[str, Any]:
    """The marker's keyword arguments (the closest marker wins: function over class over module)."""
    marker = request.node.get_closest_marker(MARKER)
    if marker is None:
        return {}
    if marker.args:
        pytest.fail(
            f"@pytest.mark.{MARKER} takes keyword arguments only: {', '.join(_OPTIONS)}", pytrace=False
        )
    unknown = sorted(set(marker.kwargs) - set(_OPTIONS))
    if unknown:
        pytest.fail(
            f"@pytest.mark.{MARKER}: unknown option(s) {', '.join(unknown)} (known: {', '.join(_OPTIONS)})",
            pytrace=False,
        )
    return dict(marker.kwargs)


@pytest.fixture
def gateway_app(request: pytest.FixtureRequest) -> Flask:
    """The shop's Flask app (with ``Gateway`` registered): the fixture named by the ini option
    ``gateway_app_fixture`` (default ``app``). Override this fixture to hand the app over another way."""
    name = str(request.config.getini(APP_FIXTURE_INI))
    try:
        app: Flask = request.getfixturevalue(name)
    except pytest.FixtureLookupError:
        pytest.fail(
            f"The gateway_emulator fixture needs the shop's Flask app from a fixture named {name!r}, and "
            f"there is none. Define it (a fixture returning your app), set {APP_FIXTURE_INI} = <your "
            "fixture's name> in your pytest configuration, or override the gateway_app fixture.",
            pytrace=False,
        )
    return app


@pytest.fixture(scope="session")
def gateway_emulator_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmulatorPool]:
    """The emulator apps of the session, kept for reuse: one per database URL and settings, reset at the
    start of every test that uses it."""
    # Imported here, not at the top: the plugin loads in every pytest run, the emulator only when used.
    from flask_gateway.testing import EmulatorPool

    pool = EmulatorPool(tmp_path_factory.mktemp("gateway-emulator"))
    yield pool
    pool.close()


@pytest.fixture
def gateway_emulator_database_url(gateway_emulator_pool: EmulatorPool) -> str:
    """Where the emulator keeps its state: the pool's SQLite file, reused (reset) by every test. Override
    it to use another database (e.g. PostgreSQL): each test then gets an emulator app of its own."""
    return gateway_emulator_pool.database_url


@pytest.fixture
def gateway_emulator_settings(request: pytest.FixtureRequest, gateway_app: Flask) -> EmulatorSettings:
    """The emulator's settings: matched to the shop's configuration
    (:func:`flask_gateway.testing.emulator_settings_for`), with the marker's ``callback_retry_delays``."""
    # Imported here, not at the top: the plugin loads in every pytest run, the emulator only when used.
    from flask_gateway.testing import emulator_settings_for

    options = _options(request)
    overrides = {key: options[key] for key in _SETTINGS_OPTIONS if key in options}
    if "callback_retry_delays" in overrides:
        overrides["callback_retry_delays"] = tuple(float(d) for d in overrides["callback_retry_delays"])
    return emulator_settings_for(gateway_app, **overrides)


@pytest.fixture
def gateway_emulator(
    request: pytest.FixtureRequest,
    gateway_app: Flask,
    gateway_emulator_database_url: str,
    gateway_emulator_settings: EmulatorSettings,
    gateway_emulator_pool: EmulatorPool,
) -> Iterator[GatewayEmulator]:
    """An in-process emulator wired to the shop (on the addresses the shop is configured with) and the
    gateway installed on the shop with the emulator's account, ready to take a payment. Records the
    extension's signals for the shop until the test ends (``assert_fulfilled_once``)."""
    # Imported here, not at the top: the plugin loads in every pytest run, the emulator only when used.
    from flask_gateway.testing import GatewayEmulator

    options = _options(request)
    pooled = gateway_emulator_database_url == gateway_emulator_pool.database_url
    gateway = GatewayEmulator.start(
        gateway_app,
        database_url=gateway_emulator_database_url,
        settings=gateway_emulator_settings,
        pool=gateway_emulator_pool if pooled else None,
        install=bool(options.get("install", True)),
        sqlite_no_fsync=bool(request.config.getini(NO_FSYNC_INI)),
        **{key: options[key] for key in _INSTALL_OPTIONS if key in options},
    )
    try:
        yield gateway
    finally:
        gateway.close()
