"""The shop's configuration from the environment, and the demo auto-install."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from flask import Flask

from example_shop import create_app, setup
from example_shop.config import ORDER_ENDPOINT, ShopConfigError, gateway_from_env, instance_secret, resolve
from example_shop.setup import auto_install
from flask_gateway import InstallSettings, install, is_available
from flask_gateway.config import DEFAULTS
from tests.shop.conftest import SHOP_URL, ShopHarness, create_shop, make_harness, shop_config


def test_gateway_variables_are_copied_and_parsed() -> None:
    parsed = gateway_from_env(
        {
            "GATEWAY_API_VERSION": "v1",
            "GATEWAY_PUBLIC_URL": "https://shop.example",
            "GATEWAY_MAX_RETRIES": "3",
            "GATEWAY_ORDER_EXPIRY_MINUTES": "90",
            "GATEWAY_V1_CANCEL_ON_FAIL": "false",
            "GATEWAY_TIMEOUT": "5,30",
            "GATEWAY_RECONCILE_AFTER_SECONDS": "600",
            "HOME": "/root",
        }
    )
    assert parsed == {
        "GATEWAY_API_VERSION": "v1",
        "GATEWAY_PUBLIC_URL": "https://shop.example",
        "GATEWAY_MAX_RETRIES": 3,
        "GATEWAY_ORDER_EXPIRY_MINUTES": 90,
        "GATEWAY_V1_CANCEL_ON_FAIL": False,
        "GATEWAY_TIMEOUT": (5.0, 30.0),
        "GATEWAY_RECONCILE_AFTER_SECONDS": 600,
    }
    assert gateway_from_env({"GATEWAY_TIMEOUT": "10"})["GATEWAY_TIMEOUT"] == 10.0
    assert gateway_from_env({"GATEWAY_V1_CANCEL_ON_FAIL": "1"})["GATEWAY_V1_CANCEL_ON_FAIL"] is True


def test_every_gateway_key_that_is_not_text_is_parsed() -> None:
    """A number or flag copied as text would stop the extension at start-up: each has its parser, and the
    environment's text of its default parses back to the default."""
    for name, default in DEFAULTS.items():
        if default is None or isinstance(default, str):
            continue
        text = ",".join(map(str, default)) if isinstance(default, tuple) else str(int(default))
        if isinstance(default, float):
            text = str(default)
        assert gateway_from_env({name: text})[name] == default, name


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("GATEWAY_MAX_RETRIES", "two", "not a whole number"),
        ("GATEWAY_RECONCILE_PAID_WINDOW_HOURS", "a day", "not a number"),
        ("GATEWAY_V1_CANCEL_ON_FAIL", "maybe", "not a yes/no value"),
        ("GATEWAY_TIMEOUT", "5,30,60", "one number"),
    ],
)
def test_wrong_gateway_values_name_the_variable(name: str, value: str, message: str) -> None:
    with pytest.raises(ShopConfigError, match=f"{name}=.*{message}"):
        gateway_from_env({name: value})


def test_the_environment_configures_the_app(databases, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOP_DATABASE_URL", databases.url())
    monkeypatch.setenv("SHOP_SECRET_KEY", "from-the-environment")
    monkeypatch.setenv("SHOP_ADMIN_PASSWORD", "demo-owner")
    monkeypatch.setenv("SHOP_MIN_CENTS", "10000")
    monkeypatch.setenv("GATEWAY_API_VERSION", "v1")
    monkeypatch.setenv("GATEWAY_MAX_RETRIES", "0")
    monkeypatch.setenv("GATEWAY_PUBLIC_URL", SHOP_URL)

    app = create_app({"TESTING": True})

    assert app.config["SQLALCHEMY_DATABASE_URI"] == databases.url()
    assert app.config["SECRET_KEY"] == "from-the-environment"
    assert app.config["SHOP_MIN_CENTS"] == 10000
    assert app.config["GATEWAY_API_VERSION"] == "v1"
    assert app.config["GATEWAY_MAX_RETRIES"] == 0
    assert app.config["GATEWAY_ORDER_ENDPOINT"] == ORDER_ENDPOINT
    assert app.config["SESSION_COOKIE_NAME"] != "session"  # not the emulator's cookie on 127.0.0.1
    assert "SHOP_SECRET_KEY" not in app.config


def test_the_defaults_live_in_the_instance_folder(tmp_path: Path) -> None:
    config = resolve({}, environ={}, instance_path=tmp_path)

    assert config["SQLALCHEMY_DATABASE_URI"] == f"sqlite:///{tmp_path / 'example_shop.sqlite3'}"
    assert config["SECRET_KEY"] == (tmp_path / "shop-secret-key").read_text()
    assert len(config["SECRET_KEY"]) == 64
    assert (tmp_path / "shop-secret-key").stat().st_mode & 0o777 == 0o600
    # The same key on the next start (and in every worker process).
    assert resolve({}, environ={}, instance_path=tmp_path)["SECRET_KEY"] == config["SECRET_KEY"]
    assert instance_secret(tmp_path) == config["SECRET_KEY"]
    assert config["SHOP_ENV"] == "development"
    assert config["SHOP_AUTO_INSTALL"] is False
    assert (config["SHOP_MIN_CENTS"], config["SHOP_MAX_CENTS"]) == (5000, 5000000)
    assert config["SHOP_ADMIN_PASSWORD_HASH"] is None  # no default password, ever


def test_production_needs_its_own_secret_key(tmp_path: Path) -> None:
    environ = {
        "SHOP_ENV": "production",
        "SHOP_ADMIN_PASSWORD_HASH": "scrypt:32768:8:1$salt$hash",
        "SHOP_DATABASE_URL": f"sqlite:///{tmp_path / 'shop.sqlite3'}",
    }
    with pytest.raises(ShopConfigError, match="SHOP_SECRET_KEY"):
        resolve({}, environ=environ, instance_path=tmp_path)
    assert not (tmp_path / "shop-secret-key").exists()
    config = resolve({}, environ={**environ, "SHOP_SECRET_KEY": "k" * 64}, instance_path=tmp_path)
    assert config["SECRET_KEY"] == "k" * 64


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"SHOP_ENV": "staging"}, "SHOP_ENV='staging'"),
        ({"SHOP_AUTO_INSTALL": "perhaps"}, "SHOP_AUTO_INSTALL="),
        ({"SHOP_MIN_CENTS": "50.00"}, "SHOP_MIN_CENTS="),
        ({"SHOP_MIN_CENTS": "9000", "SHOP_MAX_CENTS": "100"}, "SHOP_MIN_CENTS is above SHOP_MAX_CENTS"),
    ],
)
def test_wrong_shop_values_are_explained(tmp_path: Path, environ: dict[str, str], message: str) -> None:
    with pytest.raises(ShopConfigError, match=message):
        resolve({}, environ=environ, instance_path=tmp_path)


# --- auto-install -----------------------------------------------------------------------------------------


def test_auto_install_installs_with_the_shop_settings(shop: ShopHarness) -> None:
    # The ``shop`` fixture installed through auto_install: limits R 50.00 to R 50 000.00.
    with shop.app.app_context():
        assert is_available(5000) and is_available(5000000)
        assert not is_available(4999) and not is_available(5000001)
    accounts = shop.emulator.control("accounts", method="GET").json
    assert "demo-merchant" in str(accounts)
    # Running again (every start) does nothing.
    assert shop.install() == "already-here"


def test_create_app_neither_installs_nor_asks_the_gateway(
    databases, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """SHOP_AUTO_INSTALL=1 installs on first use, never in create_app (a worker must boot whatever the
    gateway and the database do)."""
    calls: list[object] = []
    monkeypatch.setattr(setup, "install", lambda settings: calls.append(settings))
    caplog.set_level(logging.INFO, logger="example_shop")

    create_app(shop_config(databases.url(), SHOP_AUTO_INSTALL=True))

    assert calls == []
    assert "Auto-install" not in caplog.text


def test_auto_install_on_the_first_request(databases, monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    shop = make_harness(databases, monkeypatch, install=False, SHOP_AUTO_INSTALL=True)
    with shop.app.app_context():
        assert not is_available(10000)
    caplog.set_level(logging.INFO, logger="example_shop")

    assert shop.shopper().get("/").status_code == 200

    assert "Auto-install: the payment gateway is installed for account 'demo-merchant'" in caplog.text
    with shop.app.app_context():
        assert is_available(10000)
    caplog.clear()
    assert shop.shopper().get("/cart").status_code == 200
    assert "Auto-install" not in caplog.text  # once per process


def test_auto_install_on_first_use_waits_for_no_gateway_and_tries_again_later(
    databases, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """The gateway does not answer: the first request makes one attempt (no pauses: a shopper waits),
    the shop serves without the payment option, and a request after RETRY_SECONDS tries again."""
    caplog.set_level(logging.INFO, logger="example_shop")
    sleeps: list[float] = []
    monkeypatch.setattr("example_shop.setup.time.sleep", sleeps.append)
    now = [1000.0]
    monkeypatch.setattr(setup, "now", lambda: now[0])
    attempts: list[object] = []

    def counted(settings: InstallSettings) -> object:
        attempts.append(settings)
        return install(settings)

    monkeypatch.setattr(setup, "install", counted)
    config = shop_config(
        databases.url(),
        SHOP_AUTO_INSTALL=True,
        SHOP_AUTO_INSTALL_DELAYS=(0.5, 1.0),
        GATEWAY_BASE_URL="http://127.0.0.1:9",
        GATEWAY_INSTALL_URL="http://127.0.0.1:9/install",
        GATEWAY_V1_BASE_URL="http://127.0.0.1:9",
        GATEWAY_TIMEOUT=0.5,
    )
    app = create_shop(config)
    client = app.test_client()

    assert client.get(SHOP_URL + "/").status_code == 200
    assert (len(attempts), sleeps) == (1, [])
    assert "Auto-install gave up after 1 attempt(s)" in caplog.text
    assert "tries again on a later request" in caplog.text

    assert client.get(SHOP_URL + "/").status_code == 200
    assert len(attempts) == 1  # not before RETRY_SECONDS
    assert client.get(SHOP_URL + "/gateway/livez").status_code == 200
    now[0] += setup.RETRY_SECONDS
    assert client.get(SHOP_URL + "/gateway/livez").status_code == 200
    assert len(attempts) == 1  # the extension's endpoints never wait for it
    assert client.get(SHOP_URL + "/").status_code == 200
    assert len(attempts) == 2


def test_auto_install_without_a_public_url_explains_itself(databases, caplog) -> None:
    app = create_app(shop_config(databases.url(), GATEWAY_PUBLIC_URL=None))
    with caplog.at_level(logging.ERROR, logger="example_shop"):
        assert auto_install(app) == "skipped"
    assert "GATEWAY_PUBLIC_URL is not set" in caplog.text


def test_an_account_installed_elsewhere_is_reported_not_reset(
    shop: ShopHarness, databases, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    # A second shop (a fresh database) for the account the first one installed: "already installed".
    other = make_harness(databases, monkeypatch, install=False, name="other")
    other.emulator = shop.emulator
    from flask_gateway.state import get_state

    get_state(other.app).client_options.update(get_state(shop.app).client_options)
    before = shop.emulator.control("accounts", method="GET").json

    with caplog.at_level(logging.WARNING, logger="example_shop"):
        assert other.install() == "already-installed"

    assert "/gateway/admin/install" in caplog.text and "adopt" in caplog.text
    assert shop.emulator.control("accounts", method="GET").json == before  # nothing was reset
    with other.app.app_context():
        assert not is_available(10000)


@pytest.mark.backends
def test_a_sibling_process_installing_first_is_not_an_account_installed_elsewhere(
    shop: ShopHarness, monkeypatch: pytest.MonkeyPatch, caplog
) -> None:
    """gunicorn -w 4: every worker runs the auto-install at once. One installs; the gateway tells the others
    the account is installed, and their first look at the database came before their sibling saved it:
    they find the installation a moment later, instead of asking the owner to adopt a signing key."""
    real_installed = setup._installed
    looks: list[bool] = []

    def not_there_at_the_first_look(app: Flask, account: str | None = None) -> bool:
        looks.append(True)
        return len(looks) > 1 and real_installed(app, account)

    monkeypatch.setattr(setup, "_installed", not_there_at_the_first_look)
    with caplog.at_level(logging.INFO, logger="example_shop"):
        assert shop.install() == "already-here"

    assert "another process of this shop installed the payment gateway" in caplog.text
    assert "adopt" not in caplog.text
    with shop.app.app_context():
        assert is_available(10000)
