"""The extension's docs stay true: every config key and signal documented, every page indexed, the look's
variables and example (the quickstart is followed by tests/docs/test_quickstart.py)."""

from __future__ import annotations

import re
from pathlib import Path

from flask_gateway import signals
from flask_gateway.config import DEFAULTS

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


ADMIN_CSS = Path(__file__).resolve().parents[2] / "flask_gateway" / "web" / "static" / "gateway" / "admin.css"


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
