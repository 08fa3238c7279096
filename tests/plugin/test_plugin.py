"""The pytest plugin for shop developers (docs/testing.md): the docs' example runs, and every helper does
what it says (each test fails if its helper broke)."""

from __future__ import annotations

import gc
import os
import re
import subprocess
import sys
import tempfile
import time
import weakref
from pathlib import Path
from typing import Any

import pytest
import requests
from flask import Flask
from sqlalchemy import Engine, select

from flask_gateway import (
    GatewayCheckout,
    callback_rejected,
    checkout_cancelled,
    checkout_expired,
    checkout_flagged,
    create_checkout,
    payment_confirmed,
    refresh,
)
from flask_gateway.emulator import embedded_emulator
from flask_gateway.emulator import models as emulator_models
from flask_gateway.models import CallbackLog, Installation
from flask_gateway.state import get_state
from flask_gateway.testing import (
    EmulatorPool,
    GatewayEmulator,
    GatewayEmulatorError,
    SignalRecord,
    connect_configured,
    emulator_settings_for,
    make_emulator,
    reset_tables,
    token_of,
)
from tests.plugin.conftest import close_shop, db, make_shop, place_order, shipments

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs" / "testing.md"


# --- the docs' example, in a pytest of its own ---------------------------------------------------------


def example_files() -> dict[str, str]:
    """docs/testing.md's example: every python block whose first line names its file (``# shop.py``)."""
    files = {}
    for block in re.findall(r"```python\n(.*?)```", DOCS.read_text(), flags=re.DOTALL):
        first, _, rest = block.partition("\n")
        if re.fullmatch(r"# \w+\.py", first):
            files[first[2:]] = rest
    return files


def test_the_docs_example_has_a_shop_a_conftest_and_its_tests() -> None:
    files = example_files()
    assert sorted(files) == ["conftest.py", "shop.py", "test_payment.py"]
    assert "start_checkout(draft)" in files["shop.py"]
    assert "@payment_confirmed.connect" in files["shop.py"]
    assert "def test_create_pay_callback_fulfilled_once(app, gateway_emulator):" in files["test_payment.py"]


@pytest.mark.parametrize("database", ["file", "memory"])
def test_the_docs_example_passes_with_the_installed_plugin(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, database: str
) -> None:
    files = example_files()
    if database == "memory":
        configured = "f\"sqlite:///{tmp_path / 'shop.sqlite3'}\""
        assert configured in files["conftest.py"]
        files["conftest.py"] = files["conftest.py"].replace(configured, '"sqlite://"')
    for name, source in files.items():
        pytester.path.joinpath(name).write_text(source)
    # The same strictness as ours; the plugin comes from the package's entry point, nothing else loads it.
    pytester.makeini("[pytest]\nfilterwarnings = error\naddopts = --strict-markers\n")
    monkeypatch.delenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", raising=False)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-v")
    result.assert_outcomes(passed=6)
    result.stdout.fnmatch_lines(["*test_create_pay_callback_fulfilled_once PASSED*"])


MISUSES = """
import pytest
from sqlalchemy import text

from shop import create_app, db


@pytest.fixture
def shop_app(tmp_path):
    app = create_app({"TESTING": True, "SQLALCHEMY_DATABASE_URI": f"sqlite:///{tmp_path / 's.db'}",
                      "GATEWAY_PUBLIC_URL": "https://shop.example"})
    with app.app_context():
        db.create_all()
    yield app
    with app.app_context():
        db.engine.dispose()


def test_the_app_fixture_named_in_the_ini(gateway_emulator, shop_app):
    assert gateway_emulator.shop is shop_app


def test_the_ini_lets_the_shop_database_skip_fsync(gateway_emulator, shop_app):
    with shop_app.app_context():
        assert db.session.execute(text("PRAGMA synchronous")).scalar_one() == 0  # OFF


@pytest.mark.gateway_emulator(instal=False)
def test_a_misspelt_option(gateway_emulator):
    pass


@pytest.mark.gateway_emulator(False)
def test_a_positional_option(gateway_emulator):
    pass
"""


def test_the_ini_options_and_misuses_are_explained(pytester: pytest.Pytester) -> None:
    pytester.path.joinpath("shop.py").write_text(example_files()["shop.py"])
    pytester.makepyfile(test_misuses=MISUSES)
    pytester.makeini(
        "[pytest]\nfilterwarnings = error\ngateway_app_fixture = shop_app\ngateway_sqlite_no_fsync = true\n"
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2, errors=2)
    result.stdout.fnmatch_lines(
        [
            "*@pytest.mark.gateway_emulator: unknown option(s) instal (known: install, minimum_cents,*",
            "*@pytest.mark.gateway_emulator takes keyword arguments only*",
        ]
    )

    pytester.makeini("[pytest]\nfilterwarnings = error\n")  # the default name, app: the shop has none
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-k", "in_the_ini")
    result.assert_outcomes(errors=1)
    result.stdout.fnmatch_lines(
        ["*needs the shop's Flask app from a fixture named 'app', and there is none*gateway_app_fixture*"]
    )


def test_the_plugin_is_registered_and_imports_nothing_heavy() -> None:
    code = (
        "import importlib.metadata as m, sys\n"
        "[entry] = [e for e in m.entry_points(group='pytest11') if e.name == 'flask_gateway']\n"
        "assert entry.value == 'flask_gateway.pytest_plugin', entry\n"
        "entry.load()\n"
        "heavy = sorted(n for n in ('flask', 'sqlalchemy', 'flask_gateway.emulator', 'flask_gateway.testing')"
        " if n in sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT, env={**os.environ})


# --- the fixture ---------------------------------------------------------------------------------------


def test_the_fixture_wires_installs_and_records_for_this_shop_only(app: Flask, gateway_emulator) -> None:
    assert gateway_emulator.shop is app
    with app.app_context():
        installation = get_state().require_installation()
        assert installation.merchant_account_id == gateway_emulator.account == "demo-merchant"
        assert installation.callback_url == "https://shop.example/gateway/callback"
        assert (installation.minimum_cents, installation.maximum_cents) == (100, 10_000_000)
    # The default emulator address (GATEWAY_ENVIRONMENT="emulator") is wired, in-process.
    assert get_state(app).config.base_url == "http://127.0.0.1:5050"
    assert gateway_emulator.control("accounts", method="GET")["accounts"][0]["installed"] is True

    other = make_shop("sqlite://")
    try:
        place_order(other, "R-OTHER")
        with other.app_context():
            payment_confirmed.send(other, checkout=_Fake("v2.x.other", "R-OTHER"), source="callback")
    finally:
        close_shop(other)
    assert gateway_emulator.signals == []


class _Fake:
    def __init__(self, token: str, order_reference: str) -> None:
        self.token, self.order_reference = token, order_reference


@pytest.mark.gateway_emulator(install=False)
def test_the_marker_can_leave_the_shop_uninstalled(app: Flask, gateway_emulator) -> None:
    with app.app_context():
        assert get_state().installation() is None
    gateway_emulator.install(
        minimum_cents=5000, maximum_cents=60000, callback_failures_email="ops@shop.example"
    )
    with app.app_context():
        installation = get_state().require_installation()
        assert (installation.minimum_cents, installation.maximum_cents) == (5000, 60000)
        assert installation.callback_failures_email == "ops@shop.example"
    gateway_emulator.install(minimum_cents=7000, maximum_cents=80000)  # installed: the settings change
    with app.app_context():
        installation = get_state().require_installation()
        assert (installation.minimum_cents, installation.maximum_cents) == (7000, 80000)
    [account] = gateway_emulator.control("accounts", method="GET")["accounts"]
    assert (account["minimumCheckoutAmountCents"], account["maximumCheckoutAmountCents"]) == (7000, 80000)


@pytest.mark.gateway_emulator(minimum_cents=5000, maximum_cents=60000, callback_retry_delays=(0, 0))
def test_the_marker_sets_the_limits_and_the_retry_delays(app: Flask, gateway_emulator) -> None:
    with app.app_context():
        installation = get_state().require_installation()
        assert (installation.minimum_cents, installation.maximum_cents) == (5000, 60000)
    assert gateway_emulator.app.extensions["gateway_emulator"].callback_retry_delays == (0.0, 0.0)
    place_order(app)
    gateway_emulator.pay(app.test_client().post("/orders/R-1/pay"))
    gateway_emulator.fail_next_callback()
    assert gateway_emulator.deliver() == 1
    assert gateway_emulator.deliver() == 1  # no delay: the retry is due at once
    gateway_emulator.assert_fulfilled_once("R-1")


def test_the_emulator_matches_the_shop(app: Flask) -> None:
    settings = emulator_settings_for(app)
    assert settings.worker is False
    assert settings.public_url == "http://127.0.0.1:5050"
    assert settings.waf_strict is True
    assert settings.callback_retry_delays == (2.0, 10.0)
    loose = make_shop("sqlite://", GATEWAY_WAF="allow-local", GATEWAY_WIRE_NAMES="spec")
    try:
        settings = emulator_settings_for(loose, accounts={"shop-42": "k"})
        assert settings.waf_strict is False
        assert settings.wire_names.key == "spec"
        assert dict(settings.accounts) == {"shop-42": "k"}
    finally:
        close_shop(loose)


def test_closing_gives_the_shop_its_http_back_and_stops_recording(app: Flask, tmp_path: Path) -> None:
    state = get_state(app)
    state.client_options["sleep"] = own_sleep = time.sleep
    gateway = GatewayEmulator.start(app, database_url=f"sqlite:///{tmp_path / 'e.sqlite3'}")
    assert "session" in state.client_options
    assert state.client_options["sleep"] is not own_sleep
    gateway.close()
    assert state.client_options == {"sleep": own_sleep}
    place_order(app)  # for the shop's own receiver
    with app.app_context():
        payment_confirmed.send(app, checkout=_Fake("v2.x.y", "R-1"), source="callback")
    assert gateway.signals == []


def test_closing_leaves_nothing_connected_to_the_signals(app: Flask, tmp_path: Path) -> None:
    """A closed emulator is no longer reachable from the extension's signals: each test's emulator, shop app
    and wiring would otherwise live (and be walked by the garbage collector) until the process ends."""
    watched = (payment_confirmed, checkout_cancelled, checkout_expired, callback_rejected, checkout_flagged)
    before = [len(signal.receivers) for signal in watched]
    gateway = GatewayEmulator.start(app, database_url=f"sqlite:///{tmp_path / 'e.sqlite3'}")
    assert [len(signal.receivers) for signal in watched] == [n + 1 for n in before]
    gateway.close()
    assert [len(signal.receivers) for signal in watched] == before
    gone = weakref.ref(gateway)
    del gateway
    gc.collect()
    assert gone() is None


def synchronous(engine: Engine) -> int:
    """The ``PRAGMA synchronous`` of a connection from ``engine`` (0 OFF, 1 NORMAL, 2 FULL)."""
    with engine.connect() as connection:
        setting: int = connection.exec_driver_sql("PRAGMA synchronous").scalar_one()
        return setting


def test_sqlite_no_fsync_is_only_while_the_emulator_runs(app: Flask, tmp_path: Path) -> None:
    with app.app_context():
        host, own = db.engine, get_state(app).engine
    assert (synchronous(host), synchronous(own)) == (2, 2)  # FULL: the shop's (SQLite's default) setting
    unasked = GatewayEmulator.start(app, database_url=f"sqlite:///{tmp_path / 'e.sqlite3'}")
    assert (synchronous(host), synchronous(own)) == (2, 2)  # not asked: the shop's database is the shop's
    unasked.close()

    gateway = GatewayEmulator.start(
        app, database_url=f"sqlite:///{tmp_path / 'e.sqlite3'}", sqlite_no_fsync=True
    )
    assert (synchronous(host), synchronous(own)) == (0, 0)
    answer = pay_button(app)
    gateway.pay(answer)
    assert gateway.deliver() == 1  # the same payment, callback and fulfilment as with every flush
    gateway.assert_fulfilled_once("R-1")
    assert shipments(app) == 1
    held = host.connect()  # handed out when the emulator closes: its own setting comes back when returned
    gateway.close()
    assert held.exec_driver_sql("PRAGMA synchronous").scalar_one() == 0
    held.close()
    with host.connect() as first, host.connect() as second:  # both pooled connections are back at FULL
        assert [c.exec_driver_sql("PRAGMA synchronous").scalar_one() for c in (first, second)] == [2, 2]
    assert synchronous(own) == 2


def test_sqlite_no_fsync_leaves_an_in_memory_shop_alone(tmp_path: Path) -> None:
    shop = make_shop("sqlite://")
    try:
        with GatewayEmulator.start(
            shop, database_url=f"sqlite:///{tmp_path / 'e.sqlite3'}", sqlite_no_fsync=True
        ) as gateway:
            gateway.pay(pay_button(shop))
            assert gateway.deliver() == 1
            gateway.assert_fulfilled_once("R-1")
            with shop.app_context():
                assert not db.engine.pool.dispatch.checkout  # nothing listens: no file, no fsync
    finally:
        close_shop(shop)


def test_the_pool_hands_out_one_emulator_reset_for_each_use(app: Flask, tmp_path: Path) -> None:
    pool = EmulatorPool(tmp_path)
    try:
        with GatewayEmulator.start(app, database_url=pool.database_url, pool=pool) as first:
            place_order(app)
            first.pay(app.test_client().post("/orders/R-1/pay"))
            first.fail_next_callback(times=5)
            first.advance_clock(60)
        with GatewayEmulator.start(app, database_url=pool.database_url, pool=pool) as second:
            assert second.app is first.app
            assert second.control("checkouts", method="GET")["checkouts"] == []
            assert second.control("faults", method="GET")["faults"] == []
            assert second.control("clock", method="GET")["offsetSeconds"] == 0
        other = emulator_settings_for(app, callback_retry_delays=(1.0,))
        with GatewayEmulator.start(app, database_url=pool.database_url, settings=other, pool=pool) as third:
            assert third.app is not first.app
    finally:
        pool.close()


def emulator_rows(emulator: Flask) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every table of ``emulator``, by table."""
    with emulator.app_context(), emulator_models.db.engine.connect() as connection:
        return {
            table.name: sorted((tuple(row) for row in connection.execute(select(table))), key=repr)
            for table in emulator_models.db.metadata.sorted_tables
        }


def test_the_pools_reset_leaves_what_the_control_apis_reset_leaves(app: Flask, tmp_path: Path) -> None:
    def make_a_mess(gateway: GatewayEmulator, paid: str, dead: str) -> None:
        """A row in every table: a checkout paid and refunded, one whose callbacks all fail (a dead
        letter, an e-mail), a fault waiting, the clock moved."""
        answer = pay_button(app, paid)
        gateway.pay(answer)
        gateway.deliver()
        gateway.control(f"checkouts/{token_of(answer)}/refund", {"amountCents": 100})
        gateway.pay(pay_button(app, dead))
        gateway.fail_next_callback(times=3)
        gateway.deliver()
        gateway.advance_clock(60)
        gateway.control("faults", {"operation": "create", "kind": "status", "status": 503, "count": 1})

    pool = EmulatorPool(tmp_path)
    email = "ops@shop.example"
    try:
        with GatewayEmulator.start(
            app, database_url=pool.database_url, pool=pool, callback_failures_email=email
        ) as gateway:
            settings = gateway.app.extensions["gateway_emulator"]
            make_a_mess(gateway, "R-1", "R-2")
            messy = emulator_rows(gateway.app)
            assert [name for name, rows in messy.items() if not rows] == []
            gateway.control("reset")
            by_the_view = emulator_rows(gateway.app)
            gateway.install(callback_failures_email=email)
            make_a_mess(gateway, "R-3", "R-4")
            assert emulator_rows(gateway.app) != by_the_view
            reset_tables(gateway.app, settings)
            assert emulator_rows(gateway.app) == by_the_view
            assert by_the_view["emulator_accounts"] != []  # the accounts seeded again
    finally:
        pool.close()


# --- the wiring --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("config", "shop_url"),
    [
        pytest.param({"GATEWAY_ENVIRONMENT": "sandbox"}, "https://shop.example", id="sandbox"),
        pytest.param(
            {"GATEWAY_PUBLIC_URL": "https://shop.example/store"}, "https://shop.example/store", id="path"
        ),
        pytest.param(
            {"GATEWAY_PUBLIC_URL": None, "GATEWAY_WAF": "allow-local"}, "http://localhost", id="no-public-url"
        ),
    ],
)
def test_the_shop_is_wired_on_the_addresses_it_is_configured_with(
    tmp_path: Path, config: dict[str, Any], shop_url: str
) -> None:
    shop = make_shop(f"sqlite:///{tmp_path / 'shop.sqlite3'}", **config)
    try:
        with GatewayEmulator.start(shop, database_url=f"sqlite:///{tmp_path / 'e.sqlite3'}") as gateway:
            place_order(shop)
            answer = shop.test_client().post("/orders/R-1/pay")
            assert answer.headers["Location"].startswith(get_state(shop).config.base_url + "/api/v2/app/")
            outcome = gateway.pay(answer)
            assert outcome.redirect_url and outcome.redirect_url.startswith(shop_url + "/gateway/return/")
            assert gateway.deliver() == 1
            [attempt] = gateway.callbacks(answer)
            assert (attempt["url"], attempt["ok"]) == (shop_url + "/gateway/callback", True)
            gateway.assert_fulfilled_once("R-1")
            assert shipments(shop) == 1
    finally:
        close_shop(shop)


def test_a_shop_with_the_embedded_emulator_is_tested_with_that_one(tmp_path: Path) -> None:
    shop = make_shop(f"sqlite:///{tmp_path / 'shop.sqlite3'}", GATEWAY_ENVIRONMENT="embedded")
    try:
        embedded = embedded_emulator(shop)
        assert embedded is not None
        unused = f"sqlite:///{tmp_path / 'unused.sqlite3'}"
        with GatewayEmulator.start(shop, database_url=unused) as gateway:
            assert gateway.app is embedded.app
            assert gateway.wiring is None
            place_order(shop)
            answer = shop.test_client().post("/orders/R-1/pay")
            assert answer.headers["Location"].startswith("https://shop.example/_gateway/api/v2/app/checkout/")
            gateway.pay(answer)
            assert gateway.deliver() == 1
            gateway.assert_fulfilled_once("R-1")
            assert gateway.replay_callback(answer).ok
            gateway.assert_fulfilled_once("R-1")
            assert shipments(shop) == 1
        assert not (tmp_path / "unused.sqlite3").exists()
        with GatewayEmulator.start(shop, database_url=unused) as again:  # reset: a clean gateway each time
            assert again.control("checkouts", method="GET")["checkouts"] == []
    finally:
        close_shop(shop)


def test_nothing_unwired_leaves_the_process(app: Flask, tmp_path: Path) -> None:
    emulator = make_emulator(f"sqlite:///{tmp_path / 'e.sqlite3'}", emulator_settings_for(app))
    assert emulator.instance_path == tempfile.gettempdir()  # nothing written beside the package
    wiring = connect_configured(app, emulator)
    with pytest.raises(requests.ConnectionError, match="not wired in-process"):
        wiring.to_emulator.get("https://example.com/")
    with pytest.raises(requests.ConnectionError, match="not wired in-process"):
        wiring.to_shop.post("http://127.0.0.1:5050/v2/create")  # the shop's side knows only the shop
    assert wiring.to_emulator.post("http://127.0.0.1:5050/v2/getstatus", json={}).status_code == 401


def test_a_production_shop_is_refused(tmp_path: Path) -> None:
    production = {
        "GATEWAY_ENVIRONMENT": "production",
        "GATEWAY_BASE_URL": "https://gateway.example",
        "GATEWAY_INSTALL_URL": "https://install.gateway.example",
        "GATEWAY_V1_BASE_URL": "https://gateway.example",
    }
    shop = make_shop("sqlite://", **production)
    try:
        with pytest.raises(ValueError, match="production"):
            GatewayEmulator.start(shop, database_url=f"sqlite:///{tmp_path / 'e.sqlite3'}")
    finally:
        close_shop(shop)


# --- the helpers -------------------------------------------------------------------------------------


def pay_button(app: Flask, reference: str = "R-1") -> Any:
    place_order(app, reference)
    answer = app.test_client().post(f"/orders/{reference}/pay")
    assert answer.status_code == 303, answer.get_data(as_text=True)
    return answer


def shop_checkout(app: Flask, reference: str = "R-1") -> GatewayCheckout:
    with app.app_context():
        session = get_state().session
        checkout = session.scalars(select(GatewayCheckout).filter_by(order_reference=reference)).one()
        session.expunge(checkout)
        return checkout


def test_a_checkout_is_named_by_its_row_token_url_or_redirect(app: Flask, gateway_emulator) -> None:
    answer = pay_button(app)
    checkout = shop_checkout(app)
    assert checkout.token and checkout.payment_url
    assert (
        token_of(answer) == token_of(checkout) == token_of(checkout.payment_url) == token_of(checkout.token)
    )
    assert checkout.token.startswith("v2.demo-merchant.")
    with pytest.raises(GatewayEmulatorError, match="HTTP 404 without a Location"):
        token_of(app.test_client().post("/orders/NOPE/pay"))
    with pytest.raises(GatewayEmulatorError, match="not a payment page URL"):
        token_of("https://shop.example/orders/R-1")


def test_pay(app: Flask, gateway_emulator) -> None:
    answer = pay_button(app)
    outcome = gateway_emulator.pay(answer)
    assert outcome.status == "PAID_PENDING_CALLBACK"
    assert outcome.redirect_url and outcome.redirect_url.startswith(
        "https://shop.example/gateway/return/confirm"
    )
    assert gateway_emulator.status(answer) == "PAID_PENDING_CALLBACK"
    gateway_emulator.assert_not_fulfilled("R-1")  # the shop has heard nothing yet
    with pytest.raises(GatewayEmulatorError, match="HTTP 409: Cannot pay a checkout in status PAID_PENDING"):
        gateway_emulator.pay(answer)


def test_cancel_as_consumer(app: Flask, gateway_emulator) -> None:
    answer = pay_button(app)
    outcome = gateway_emulator.cancel_as_consumer(shop_checkout(app))
    assert outcome.status == "CANCELLED_BY_CONSUMER"
    assert outcome.redirect_url and outcome.redirect_url.startswith(
        "https://shop.example/gateway/return/cancel"
    )
    assert gateway_emulator.status(answer) == "CANCELLED_BY_CONSUMER"
    assert app.test_client().get(outcome.redirect_url).status_code == 303  # the shop's return page asks
    assert [(s.signal, s.order_reference) for s in gateway_emulator.signals] == [
        ("checkout_cancelled", "R-1")
    ]


def test_expire(app: Flask, gateway_emulator) -> None:
    answer = pay_button(app)
    clock = gateway_emulator.expire(answer)
    assert clock["expired"] == 1
    assert clock["offsetSeconds"] >= 59 * 60  # the shop's checkouts last GATEWAY_ORDER_EXPIRY_MINUTES (60)
    assert gateway_emulator.status(answer) == "EXPIRED"
    with app.app_context():
        assert refresh(shop_checkout(app)).checkout.status == "EXPIRED"
    assert [s.signal for s in gateway_emulator.signals] == ["checkout_expired"]

    paid = pay_button(app, "R-2")
    gateway_emulator.pay(paid)
    with pytest.raises(GatewayEmulatorError, match="is PAID_PENDING_CALLBACK at the gateway: only an open"):
        gateway_emulator.expire(paid)
    assert gateway_emulator.status(paid) == "PAID_PENDING_CALLBACK"  # the clock did not move


def test_advance_clock(app: Flask, gateway_emulator) -> None:
    start = gateway_emulator.control("clock", method="GET")["offsetSeconds"]
    assert gateway_emulator.advance_clock(90)["offsetSeconds"] == start + 90
    answer = pay_button(app)
    gateway_emulator.pay(answer)
    gateway_emulator.fail_next_callback()
    assert gateway_emulator.deliver() == 1
    assert gateway_emulator.advance_clock(1)["deliveryAttempts"] == 0  # the retry is due 2 s after
    assert gateway_emulator.advance_clock(1.5)["deliveryAttempts"] == 1
    gateway_emulator.assert_fulfilled_once(answer)


def test_deliver(app: Flask, gateway_emulator) -> None:
    assert gateway_emulator.deliver() == 0
    answer = pay_button(app)
    gateway_emulator.pay(answer)
    assert shipments(app) == 0
    assert gateway_emulator.deliver() == 1
    assert shipments(app) == 1
    assert gateway_emulator.status(answer) == "PAID"
    assert gateway_emulator.deliver() == 0


@pytest.mark.parametrize(
    ("fault", "message"),
    [("fail_next_callback", "HTTP 500"), ("time_out_next_callback", "Timeout after 10 s")],
)
def test_a_callback_fault_reaches_nothing_then_the_retry_does(
    app: Flask, gateway_emulator, fault: str, message: str
) -> None:
    answer = pay_button(app)
    gateway_emulator.pay(answer)
    getattr(gateway_emulator, fault)()
    gateway_emulator.deliver()
    assert [(a["message"], a["ok"]) for a in gateway_emulator.callbacks(answer)] == [(message, False)]
    assert _callback_logs(app) == 0  # the shop never saw it
    gateway_emulator.assert_not_fulfilled("R-1")
    gateway_emulator.advance_clock(2)
    assert [a["ok"] for a in gateway_emulator.callbacks(answer)] == [False, True]
    gateway_emulator.assert_fulfilled_once("R-1")


def test_failing_every_attempt_makes_a_dead_letter_which_redeliver_sends(
    app: Flask, gateway_emulator
) -> None:
    answer = pay_button(app)
    gateway_emulator.pay(answer)
    with pytest.raises(GatewayEmulatorError, match="has no dead letter"):
        gateway_emulator.redeliver(answer)
    gateway_emulator.fail_next_callback(times=3)
    gateway_emulator.deliver()
    gateway_emulator.advance_clock(2)
    gateway_emulator.advance_clock(10)
    [dead] = gateway_emulator.control("dead-letters", method="GET")["deadLetters"]
    assert dead["checkoutToken"] == token_of(answer)
    gateway_emulator.assert_not_fulfilled("R-1")

    reply = gateway_emulator.redeliver(answer)
    assert (reply.ok, reply.http_status, reply.message) == (True, 200, "OK")
    gateway_emulator.assert_fulfilled_once("R-1")


def _callback_logs(app: Flask) -> int:
    with app.app_context():
        return len(get_state().session.scalars(select(CallbackLog)).all())


def test_replay_callback(app: Flask, gateway_emulator) -> None:
    answer = pay_button(app)
    gateway_emulator.pay(answer)
    with pytest.raises(GatewayEmulatorError, match=r"No callback was sent for checkout .* yet"):
        gateway_emulator.replay_callback(answer)
    gateway_emulator.deliver()
    [sent] = gateway_emulator.callbacks(answer)

    reply = gateway_emulator.replay_callback(answer)

    assert (reply.ok, reply.http_status, reply.message) == (True, 200, "OK")
    with app.app_context():
        logs = get_state().session.scalars(select(CallbackLog).order_by(CallbackLog.id)).all()
        assert [(log.outcome, log.verified) for log in logs] == [("accepted", True), ("duplicate", True)]
        assert logs[1].body == sent["requestBody"]  # the same bytes, signed again
    gateway_emulator.assert_fulfilled_once("R-1")
    assert shipments(app) == 1


def test_a_replay_the_shop_refuses_is_reported(app: Flask, gateway_emulator) -> None:
    answer = pay_button(app)
    gateway_emulator.pay(answer)
    gateway_emulator.deliver()
    with app.app_context():  # the shop was re-installed meanwhile: the gateway's old key no longer signs
        session = get_state().session
        installation = session.scalars(select(Installation)).one()
        installation.signing_key_encrypted = get_state().box.encrypt("another-key")
        session.commit()
    reply = gateway_emulator.replay_callback(answer)
    assert (reply.ok, reply.http_status, reply.message) == (False, 401, "HTTP 401")


def test_assert_fulfilled_once(app: Flask, gateway_emulator) -> None:
    answer = pay_button(app)
    gateway_emulator.pay(answer)
    token = token_of(answer)
    with pytest.raises(AssertionError) as never:
        gateway_emulator.assert_fulfilled_once("R-1")
    assert str(never.value).splitlines() == [
        f"Expected order R-1 (checkout {token}) to be fulfilled exactly once, but payment_confirmed was "
        "never sent for it.",
        "At the gateway it is PAID_PENDING_CALLBACK; callback attempts: none.",
        "A callback for it waits in the gateway's outbox, due now: deliver() sends it.",
    ]

    gateway_emulator.deliver()
    record = gateway_emulator.assert_fulfilled_once("R-1")
    assert record == SignalRecord("payment_confirmed", token, "R-1", source="callback")
    assert gateway_emulator.assert_fulfilled_once(answer) == gateway_emulator.assert_fulfilled_once(token)
    assert gateway_emulator.confirmations(shop_checkout(app)) == [record]

    with app.app_context():  # a second confirmation, as a broken extension would send it
        payment_confirmed.send(app, checkout=_Fake(token, "R-1"), source="return")
    with pytest.raises(AssertionError) as twice:
        gateway_emulator.assert_fulfilled_once("R-1")
    assert str(twice.value).startswith(
        f"Expected order R-1 (checkout {token}) to be fulfilled exactly once, but payment_confirmed was sent "
        "2 times (sources: callback, return).\nAt the gateway it is PAID; callback attempts: #1 OK."
    )

    with pytest.raises(
        AssertionError, match=r"Expected the order or checkout 'R-9' .* never sent"
    ) as unknown:
        gateway_emulator.assert_fulfilled_once("R-9")
    assert "The gateway has no checkout by that token or order reference" in str(unknown.value)


def test_assert_not_fulfilled(app: Flask, gateway_emulator) -> None:
    answer = pay_button(app)
    gateway_emulator.assert_not_fulfilled(answer)
    gateway_emulator.pay(answer)
    gateway_emulator.fail_next_callback()
    gateway_emulator.deliver()
    gateway_emulator.assert_not_fulfilled("R-1")
    gateway_emulator.advance_clock(2)
    with pytest.raises(AssertionError) as fulfilled:
        gateway_emulator.assert_not_fulfilled("R-1")
    assert str(fulfilled.value).splitlines()[:2] == [
        f"Expected order R-1 (checkout {token_of(answer)}) not to be fulfilled, but payment_confirmed was "
        "sent 1 time(s) (sources: callback).",
        "At the gateway it is PAID; callback attempts: #1 HTTP 500 (not acknowledged); #2 OK.",
    ]


def test_a_failed_callback_is_explained_with_the_retry_to_wait_for(app: Flask, gateway_emulator) -> None:
    gateway_emulator.pay(pay_button(app))
    gateway_emulator.fail_next_callback()
    gateway_emulator.deliver()
    with pytest.raises(AssertionError) as failed:
        gateway_emulator.assert_fulfilled_once("R-1")
    assert re.search(
        r"waits in the gateway's outbox, due in [12]\.\d s of the gateway's clock: advance_clock\(2\) sends it",
        str(failed.value),
    )


def test_the_control_api_answers_and_refusals_carry_the_emulators_message(gateway_emulator) -> None:
    assert gateway_emulator.control("emails", method="GET") == {"emails": []}
    with pytest.raises(GatewayEmulatorError, match=r"POST /_emulator/checkouts/v2\.nope/pay: HTTP 404"):
        gateway_emulator.control("checkouts/v2.nope/pay")


# --- several merchant accounts ---------------------------------------------------------------------------


def _section(heading: str) -> str:
    return DOCS.read_text().split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_docs_example_of_two_accounts_passes(app: Flask, gateway_emulator) -> None:
    """docs/testing.md, "Several merchant accounts": its test, run on the plugin's shop."""
    (code,) = re.findall(r"```python\n(.*?)```", _section("Several merchant accounts"), flags=re.DOTALL)
    namespace: dict[str, Any] = {}
    exec(compile(code, "docs/testing.md", "exec"), namespace)  # noqa: S102 - our own documentation
    place_order(app, "K-1", 79_900)
    place_order(app, "B-1", 79_900)
    namespace["test_two_brands_pay_side_by_side"](app, gateway_emulator)
    assert shipments(app, "K-1") == shipments(app, "B-1") == 1


def test_install_another_account(app: Flask, gateway_emulator) -> None:
    gateway_emulator.install(account="brand-b", minimum_cents=5000, maximum_cents=60000)
    accounts = {
        a["merchantAccountId"]: a for a in gateway_emulator.control("accounts", method="GET")["accounts"]
    }
    assert set(accounts) == {"demo-merchant", "brand-b"}
    assert accounts["brand-b"]["installed"] is True
    assert accounts["brand-b"]["checkoutStatusCallbackUrl"] == "https://shop.example/gateway/callback/brand-b"
    with app.app_context():
        state = get_state()
        first, second = state.installations()
        assert (first.merchant_account_id, second.merchant_account_id) == ("demo-merchant", "brand-b")
        assert state.box.decrypt(second.api_key_encrypted) == "brand-b-api-key"
        assert (second.minimum_cents, second.maximum_cents) == (5000, 60000)
        assert first.callback_url == "https://shop.example/gateway/callback"
    assert gateway_emulator.account == "demo-merchant"  # the first account's, as before

    # Again: that account's settings change; the first account's stay (and the reverse).
    gateway_emulator.install(account="brand-b", minimum_cents=7000, maximum_cents=60000)
    gateway_emulator.install(minimum_cents=300)
    with app.app_context():
        first, second = get_state().installations()
        assert (first.minimum_cents, second.minimum_cents) == (300, 7000)
    accounts = {
        a["merchantAccountId"]: a for a in gateway_emulator.control("accounts", method="GET")["accounts"]
    }
    assert accounts["brand-b"]["minimumCheckoutAmountCents"] == 7000
    assert accounts["demo-merchant"]["minimumCheckoutAmountCents"] == 300


@pytest.fixture
def two_account_settings(app: Flask) -> Any:
    return emulator_settings_for(
        app, accounts={"demo-merchant": "demo-api-key", "seller-7": "key-of-seller-7"}
    )


def test_an_account_the_emulator_has_keeps_its_key(app: Flask, tmp_path: Path, two_account_settings) -> None:
    with GatewayEmulator.start(
        app, database_url=f"sqlite:///{tmp_path / 'e.sqlite3'}", settings=two_account_settings
    ) as gateway:
        gateway.install(account="seller-7")
        with app.app_context():
            state = get_state()
            assert (
                state.box.decrypt(state.require_installation("seller-7").api_key_encrypted)
                == "key-of-seller-7"
            )
        # An account not installed yet takes the key the test gives (the account manager issued another).
        gateway.control("accounts", {"merchantAccountId": "seller-8", "merchantAccountApiKey": "old-key"})
        gateway.install(account="seller-8", api_key="new-key")
        with app.app_context():
            state = get_state()
            assert state.box.decrypt(state.require_installation("seller-8").api_key_encrypted) == "new-key"
        # An id the emulator cannot issue is its refusal, with its message; nothing is installed.
        with pytest.raises(GatewayEmulatorError, match="HTTP 400"):
            gateway.install(account="not an id!")
        with app.app_context():
            assert [i.merchant_account_id for i in get_state().installations()] == [
                "demo-merchant",
                "seller-7",
                "seller-8",
            ]


def test_every_helper_works_for_a_checkout_of_the_second_account(app: Flask, gateway_emulator) -> None:
    gateway_emulator.install(account="brand-b")
    for reference in ("B-1", "B-2", "B-3"):
        place_order(app, reference)
    with app.app_context():
        paid = create_checkout(_draft("B-1"), account="brand-b").token
        cancelled = create_checkout(_draft("B-2"), account="brand-b").token
        expired = create_checkout(_draft("B-3"), account="brand-b").token
    assert paid and cancelled and expired and paid.startswith("v2.brand-b.")
    gateway_emulator.pay(paid)
    gateway_emulator.fail_next_callback()
    assert gateway_emulator.deliver() == 1
    gateway_emulator.assert_not_fulfilled("B-1")
    gateway_emulator.advance_clock(2)  # the retry, to the account's own path
    assert [a["url"] for a in gateway_emulator.callbacks(paid)][-1].endswith("/gateway/callback/brand-b")
    gateway_emulator.assert_fulfilled_once("B-1")
    assert gateway_emulator.replay_callback(paid).http_status == 200
    gateway_emulator.assert_fulfilled_once("B-1")
    assert shipments(app, "B-1") == 1
    assert gateway_emulator.cancel_as_consumer(cancelled).status == "CANCELLED_BY_CONSUMER"
    gateway_emulator.expire(expired)
    with app.app_context():
        assert refresh(_shop_row(expired)).after == "EXPIRED"
    assert gateway_emulator.status(expired) == "EXPIRED"


def _draft(reference: str) -> Any:
    from flask_gateway import Customer, OrderDraft, OrderLine

    line = OrderLine(name="Enamel kettle", sku="K-1", quantity=1, unit_price_cents=49900)
    customer = Customer(first_name="Thandi", last_name="Mokoena", email="thandi@example.com")
    return OrderDraft(reference=reference, lines=(line,), customer=customer)


def _shop_row(token: str) -> GatewayCheckout:
    return get_state().session.scalars(select(GatewayCheckout).filter_by(token=token)).one()
