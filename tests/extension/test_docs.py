"""The extension's docs stay true: every config key and signal documented, every page indexed, and the
quickstart's example shop runs against the emulator."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from flask_gateway import signals
from flask_gateway.config import DEFAULTS
from flask_gateway.installation import InstallSettings, install
from flask_gateway.testing import EMULATOR_URL, SHOP_URL, connect
from tests.conftest import Databases
from tests.emulator.conftest import make_emulator
from tests.emulator.support import Gateway as EmulatorDriver
from tests.extension.conftest import ACCOUNT, API_KEY

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_configuration_page_documents_every_key_once_in_its_table():
    page = (DOCS / "configuration.md").read_text()
    rows = re.findall(r"^\| `(GATEWAY_[A-Z0-9_]+)` \|", page, flags=re.MULTILINE)
    assert sorted(rows) == sorted(DEFAULTS), "docs/configuration.md's table and config.DEFAULTS differ"
    assert "SECRET_KEY" in page


def test_signals_page_documents_every_signal():
    page = (DOCS / "signals.md").read_text()
    for name in signals.__all__:
        signal = getattr(signals, name)
        assert f"`{name}` (`{signal.name}`)" in page, name
        assert f"{name}.connect" in page, f"no example receiver for {name}"


def test_index_lists_every_page():
    index = (DOCS / "index.md").read_text()
    for page in DOCS.glob("*.md"):
        if page.name != "index.md":
            assert f"]({page.name})" in index, page.name


def _example_source() -> str:
    page = (DOCS / "extension.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)
    return next(block for block in blocks if block.startswith('"""shop.py'))


def test_the_quickstart_example_shop_takes_a_payment(
    tmp_path: Path, databases: Databases, monkeypatch: pytest.MonkeyPatch
):
    from flask_wtf.csrf import generate_csrf

    source = tmp_path / "docs_example_shop.py"
    source.write_text(_example_source())
    spec = importlib.util.spec_from_file_location("docs_example_shop", source)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_example_shop"] = module
    try:
        spec.loader.exec_module(module)
        app = module.create_app(
            {
                "TESTING": True,
                "SECRET_KEY": "docs-example-secret",
                "SQLALCHEMY_DATABASE_URI": databases.url("main"),
                "GATEWAY_BASE_URL": EMULATOR_URL,
                "GATEWAY_INSTALL_URL": f"{EMULATOR_URL}/install",
                "GATEWAY_V1_BASE_URL": EMULATOR_URL,
                "GATEWAY_PUBLIC_URL": SHOP_URL,
                "GATEWAY_MAX_RETRIES": 0,
            }
        )
        emulator = make_emulator(databases.url("emulator"), public_url=EMULATOR_URL)
        connect(app, emulator)
        driver = EmulatorDriver(emulator.test_client())

        db = module.db
        with app.app_context():
            db.create_all()
            install(
                InstallSettings(
                    merchant_account_id=ACCOUNT,
                    api_key=API_KEY,
                    callback_url=f"{SHOP_URL}/gateway/callback",
                    callback_failures_email=None,
                    minimum_cents=100,
                    maximum_cents=10_000_000,
                )
            )
            db.session.add(module.Order(reference="R-1", total_cents=49900))
            db.session.commit()

        client = app.test_client()
        assert client.get("/gateway/admin/").status_code == 403  # the example's guard: owners only
        with client.session_transaction() as session:
            session["is_owner"] = True
        assert client.get("/gateway/admin/").status_code == 200

        with app.test_request_context():
            from flask import session as request_session

            csrf_token = generate_csrf()
            raw_token = request_session["csrf_token"]
        with client.session_transaction() as session:
            session["csrf_token"] = raw_token
        answer = client.post("/orders/R-1/pay", data={"csrf_token": csrf_token})
        assert answer.status_code == 303
        token = answer.headers["Location"].rsplit("/", 1)[1]
        assert driver.pay(token).status_code == 200
        assert driver.control("deliver").status_code == 200  # the signed callback reaches the shop
        assert client.get("/orders/R-1").json == {"reference": "R-1", "paid": True}
    finally:
        sys.modules.pop("docs_example_shop", None)
        if hasattr(module, "mark_paid"):
            signals.payment_confirmed.disconnect(module.mark_paid)
        if "app" in locals():
            with app.app_context():
                module.db.engine.dispose()


ADMIN_CSS = Path(__file__).resolve().parents[2] / "flask_gateway" / "static" / "gateway" / "admin.css"


def _section(page: str, heading: str) -> str:
    return page.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_look_section_lists_every_variable_of_the_stylesheet():
    look = _section((DOCS / "extension.md").read_text(), "Your look")
    table = look.split("**Template blocks.**")[0]
    documented: set[str] = set()
    for name in re.findall(r"`(--gateway-[a-z-]+)`", table):
        documented.add(name)
        if "(each with a `-soft` background)" in table and name.split("--gateway-")[1] in (
            "ok",
            "warn",
            "error",
            "info",
            "refund",
        ):
            documented.add(f"{name}-soft")
    defaults = ADMIN_CSS.read_text().split(":where(:root) {")[1].split("}")[0]
    assert documented == set(re.findall(r"(--gateway-[a-z-]+):", defaults))


def test_the_look_example_gives_the_screens_the_hosts_look(harness):
    from jinja2 import DictLoader

    look = _section((DOCS / "extension.md").read_text(), "Your look")
    (template,) = re.findall(r"```jinja\n(.*?)```", look, flags=re.DOTALL)
    (css,) = re.findall(r"```css\n(.*?)```", look, flags=re.DOTALL)
    assert "--gateway-accent: var(--brand);" in css
    app = harness.shop
    app.jinja_loader = DictLoader(  # type: ignore[assignment]
        {"gateway/admin/base.html": template, "_owner_nav.html": "<nav>THE SHOP'S OWN NAVIGATION</nav>"}
    )
    harness.gateway.admin_guard(lambda: True)
    page = harness.client.get("/gateway/admin/").get_data(as_text=True)
    assert page.index("gateway/admin.css") < page.index("/static/theme.css")  # the host's wins
    assert "THE SHOP'S OWN NAVIGATION" in page
    assert 'aria-label="Payment gateway admin"' in page  # the gateway's tabs, under it
    assert 'class="gateway-topbar"' not in page
