"""The extension's docs stay true: every config key and signal documented, every page indexed, the look's
variables and example (the quickstart is followed by tests/docs/test_quickstart.py)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

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


# --- "Taking a payment": the errors a shop handles (issue 28, point 8) ------------------------------------


def test_the_errors_table_names_importable_errors_of_flask_gateway():
    import flask_gateway

    section = _section((DOCS / "extension.md").read_text(), "Taking a payment")
    table = section.split("**The errors a shop handles.**", 1)[1].split("```python", 1)[0]
    rows = [line for line in table.splitlines() if line.startswith("| `")]
    first = [row.split(" | ")[0] for row in rows]
    named = {name for cell in first for name in re.findall(r"`([A-Z][A-Za-z]+Error)`", cell)} - {"ValueError"}
    assert {
        "CheckoutUnavailableError",
        "InvalidOrderError",
        "GatewayError",
        "GatewayConnectionError",
        "GatewayTimeoutError",
        "GatewayServerError",
        "InvalidRequestError",
        "FirewallRejectedError",
        "NotInstalledError",
        "UnknownAccountError",
        "CheckoutStateError",
        "RefundNotAllowedError",
        "RefundDeclinedError",
    } <= named
    for name in named:
        error = getattr(flask_gateway, name)
        assert issubclass(error, flask_gateway.FlaskGatewayError), name
    assert issubclass(flask_gateway.CheckoutUnavailableError, ValueError)  # "catch it before ValueError"
    assert issubclass(flask_gateway.InvalidOrderError, ValueError)


def test_an_order_the_gateway_cannot_take_raises_invalid_order_error():
    """The table's promise: a field the gateway cannot take is an InvalidOrderError naming it (a
    ValueError, so code that caught ValueError before still does)."""
    import flask_gateway

    with pytest.raises(flask_gateway.InvalidOrderError, match="reference"):
        flask_gateway.OrderDraft(reference="", lines=())


def _pay_view(harness):
    """The section's Pay view, added to the harness's shop (its order: the test's sample order)."""
    from tests.extension.conftest import sample_order

    section = _section((DOCS / "extension.md").read_text(), "Taking a payment")
    code = section.split("**The errors a shop handles.**", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]

    def order_draft(reference):  # LOW-...: R 399.00, the others R 798.00
        return sample_order(reference, quantity=1 if reference.startswith("LOW-") else 2)

    namespace = {"app": harness.shop, "order_draft": order_draft}
    exec(compile(code, "docs/extension.md", "exec"), namespace)  # noqa: S102 - our own documentation
    return namespace["pay"]


def _paying(harness, pay, reference):
    """The view's answer and the messages it flashed."""
    from flask import get_flashed_messages

    from tests.extension.conftest import SHOP_URL

    with harness.shop.test_request_context(f"/orders/{reference}/pay", method="POST", base_url=SHOP_URL):
        answer = pay(reference)
        return answer.status_code, answer.headers["Location"], get_flashed_messages()


def test_the_documented_pay_view_handles_what_a_shopper_meets(harness):
    """Below the minimum: CheckoutUnavailableError, a message on the order page; the gateway unanswered
    (503), then refusing (400): GatewayError, a message; then the same order pays: 303 to the payment page."""
    harness.install(minimum=50_000)  # R 500.00
    pay = _pay_view(harness)

    status, location, said = _paying(harness, pay, "LOW-1")
    assert (status, location) == (303, "/orders/LOW-1")
    assert said == ["Pay in 3 is not available for this order: please choose another way to pay."]

    for kind in ({"status": 503}, {"status": 400}):
        answer = harness.emulator.control(
            "faults", {"operation": "create", "kind": "status", "count": 1, **kind}
        )
        assert answer.status_code == 201, answer.get_data(as_text=True)
        status, location, said = _paying(harness, pay, f"ORD-{kind['status']}")
        assert (status, location) == (303, f"/orders/ORD-{kind['status']}")
        assert said == ["The payment service did not answer. Please try again in a minute."]

    status, location, said = _paying(harness, pay, "ORD-503")  # unanswered before: paying again works
    assert status == 303 and "/checkout/" in location, location
    assert said == []


def test_the_database_section_lists_every_gateway_table():
    from flask_gateway.models import GatewayBase

    section = _section((DOCS / "extension.md").read_text(), "Database tables and Flask-Migrate")
    listed = section.split("\n\n", 1)[0]
    assert set(re.findall(r"`(gateway_[a-z_]+)`", listed)) == {
        t.name for t in GatewayBase.metadata.sorted_tables
    }
