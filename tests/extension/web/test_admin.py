"""The admin screens: guard, CSRF, framing, install (and adopting a key), settings, checkouts and actions."""

from __future__ import annotations

import dataclasses
import logging
import re
from html import unescape
from typing import Any

import pytest
from flask import Flask, redirect, url_for
from flask_sqlalchemy import SQLAlchemy
from jinja2 import DictLoader
from sqlalchemy import select

from flask_gateway import Gateway
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import CallbackLog, GatewayCheckout, Installation, LocalStatus
from flask_gateway.payments.transitions import Observation, apply
from flask_gateway.secrets import mask
from flask_gateway.state import get_state
from flask_gateway.web.forms import format_money, parse_amount
from tests.extension.conftest import ACCOUNT, API_KEY, SHOP_URL, Harness, sample_order

ADMIN = "/gateway/admin"
CALLBACK = f"{SHOP_URL}/gateway/callback"
_TOKEN = re.compile(r'name="csrf_token" type="hidden" value="([^"]+)"')


# --- helpers -------------------------------------------------------------------------------------------


@pytest.fixture
def admin(harness: Harness) -> Harness:
    """The harness with an admin guard that lets everyone in."""
    harness.gateway.admin_guard(lambda: True)
    return harness


def token_of(response: Any) -> str:
    match = _TOKEN.search(response.get_data(as_text=True))
    assert match, "no CSRF token on the page"
    return match.group(1)


def text(response: Any) -> str:
    return response.get_data(as_text=True)


def visible(html: str) -> str:
    """The text a person reads: tags removed, entities decoded, whitespace collapsed."""
    return " ".join(unescape(re.sub(r"<[^>]+>", " ", html)).split())


def admin_rules(app: Flask) -> list[Any]:
    return [rule for rule in app.url_map.iter_rules() if rule.endpoint.startswith("gateway_admin.")]


def url_of(app: Flask, rule: Any, checkout_id: int = 1) -> str:
    values: dict[str, Any] = {
        "checkout_id": checkout_id,
        "event_id": 1,
        "log_id": 1,
        "account": ACCOUNT,  # an account's own screens (retire, reopen)
        "filename": "gateway/admin.css",
    }
    with app.test_request_context():
        return url_for(rule.endpoint, **{name: values[name] for name in rule.arguments})


def methods_of(rule: Any) -> list[str]:
    return sorted(set(rule.methods or ()) - {"HEAD", "OPTIONS"})


def install_form(**overrides: str) -> dict[str, str]:
    data = {
        "merchant_account_id": ACCOUNT,
        "api_key": API_KEY,
        "callback_url": CALLBACK,
        "callback_failures_email": "owner@shop.example",
        "minimum_amount": "1 000.50",
        "maximum_amount": "R 100 000",
    }
    data.update(overrides)
    return data


def emulator_account(harness: Harness, account: str = ACCOUNT) -> dict[str, Any]:
    accounts = harness.emulator.control("accounts", method="GET").json["accounts"]
    return next(a for a in accounts if a["merchantAccountId"] == account)


def stored_installation(harness: Harness) -> Installation | None:
    with harness.shop.app_context():
        installation = get_state().installation()
        if installation is not None:
            get_state().session.expunge(installation)
        return installation


def decrypted_keys(harness: Harness) -> tuple[str, str]:
    with harness.shop.app_context():
        state = get_state()
        installation = state.require_installation()
        return (
            state.box.decrypt(installation.api_key_encrypted),
            state.box.decrypt(installation.signing_key_encrypted),
        )


def set_public_url(harness: Harness, url: str | None) -> None:
    state = get_state(harness.shop)
    state.config = dataclasses.replace(state.config, public_url=url)


def add_checkout(harness: Harness, reference: str, status: str, total: int = 79800, **fields: Any) -> int:
    with harness.shop.app_context():
        now = utcnow()
        checkout = GatewayCheckout(
            api_version="v2",
            order_reference=reference,
            request_id=f"req-{reference}",
            token=fields.pop("token", f"v2.{ACCOUNT}.{reference}"),
            merchant_account_id=ACCOUNT,
            status=status,
            total_cents=total,
            paid_cents=0,
            refunded_cents=0,
            order=fields.pop("order", {"reference": reference}),
            created_at=now,
            updated_at=now,
            **{"flagged": False, **fields},
        )
        session = get_state().session
        session.add(checkout)
        session.commit()
        return checkout.id


def paid_checkout(harness: Harness, reference: str = "ORD-1", client: Any = None) -> int:
    """A real checkout on the emulator, paid by the consumer, the shop told by 'refresh status'."""
    from flask_gateway import create_checkout

    with harness.shop.test_request_context():
        checkout = create_checkout(sample_order(reference))
        checkout_id, token = checkout.id, checkout.token
    assert token
    assert harness.emulator.pay(token).status_code == 200
    client = client or harness.client
    page = client.get(f"{ADMIN}/checkouts/{checkout_id}")
    assert client.post(f"{ADMIN}/checkouts/{checkout_id}/refresh", data={"csrf_token": token_of(page)})
    return checkout_id


def checkout_status(harness: Harness, checkout_id: int) -> str:
    with harness.shop.app_context():
        return get_state().session.get_one(GatewayCheckout, checkout_id).status


# --- access control ------------------------------------------------------------------------------------


def test_the_admin_blueprint_has_the_pinned_screens(harness):
    endpoints = {rule.endpoint: rule.rule for rule in admin_rules(harness.shop)}
    assert endpoints["gateway_admin.index"] == "/gateway/admin/"
    assert endpoints["gateway_admin.install_screen"] == "/gateway/admin/install"
    assert endpoints["gateway_admin.settings_screen"] == "/gateway/admin/settings"
    assert endpoints["gateway_admin.checkouts"] == "/gateway/admin/checkouts"
    assert endpoints["gateway_admin.checkout_detail"] == "/gateway/admin/checkouts/<int:checkout_id>"


def test_without_a_guard_every_admin_url_answers_403(harness):
    harness.shop.config["WTF_CSRF_ENABLED"] = False  # so POSTs reach the guard, not the CSRF check
    add_checkout(harness, "ORD-1", "PAID")
    client = harness.client
    checked = 0
    for rule in admin_rules(harness.shop):
        for method in methods_of(rule):
            response = client.open(url_of(harness.shop, rule), method=method)
            assert response.status_code == 403, (rule.rule, method)
            assert response.headers["X-Frame-Options"] == "DENY"
            checked += 1
    assert checked >= 9
    assert "admin guard" in text(client.get(f"{ADMIN}/"))


@pytest.mark.parametrize("verdict", [False, None, 0, "", "yes", 1, object()])
def test_a_guard_that_does_not_return_true_refuses(harness, verdict):
    harness.gateway.admin_guard(lambda: verdict)
    client = harness.client
    for rule in admin_rules(harness.shop):
        if "GET" in methods_of(rule):
            assert client.get(url_of(harness.shop, rule)).status_code == 403, rule.rule


def test_a_guard_may_answer_with_a_response(harness):
    @harness.gateway.admin_guard
    def only_logged_in():
        return redirect("/login?next=admin")

    response = harness.client.get(f"{ADMIN}/checkouts")
    assert response.status_code == 302
    assert response.headers["Location"] == "/login?next=admin"


def test_the_guard_sees_the_request(harness):
    from flask import request

    harness.gateway.admin_guard(lambda: request.headers.get("X-Admin") == "yes")
    client = harness.client
    assert client.get(f"{ADMIN}/", headers={"X-Admin": "yes"}).status_code == 200
    assert client.get(f"{ADMIN}/", headers={"X-Admin": "no"}).status_code == 403


def test_every_admin_post_refuses_a_missing_or_wrong_csrf_token(admin):
    admin.shop.config["WTF_CSRF_ENABLED"] = True
    checkout_id = add_checkout(admin, "ORD-1", "PAID")
    client = admin.client
    client.get(f"{ADMIN}/")  # a session with a CSRF secret, so "wrong" is really wrong
    posts = [rule for rule in admin_rules(admin.shop) if "POST" in methods_of(rule)]
    assert {rule.endpoint for rule in posts} >= {
        "gateway_admin.install_screen",
        "gateway_admin.settings_screen",
        "gateway_admin.refresh_checkout",
        "gateway_admin.cancel_checkout",
        "gateway_admin.refund_checkout",
    }
    for rule in posts:
        url = url_of(admin.shop, rule, checkout_id)
        missing = client.post(url, data={"amount": "1.00", **install_form()})
        assert missing.status_code == 400, rule.rule
        assert "CSRF" in text(missing)
        wrong = client.post(url, data={"csrf_token": "forged", "amount": "1.00", **install_form()})
        assert wrong.status_code == 400, rule.rule
    assert emulator_account(admin)["installed"] is False
    assert checkout_status(admin, checkout_id) == "PAID"


def test_admin_posts_are_protected_without_csrfprotect(database_url: str):
    """An app that does not use CSRFProtect: the admin blueprint checks the token itself."""
    app = Flask("bare_shop")
    app.config.update(
        SECRET_KEY="bare-secret",
        SQLALCHEMY_DATABASE_URI=database_url,
        GATEWAY_PUBLIC_URL=SHOP_URL,
    )
    db = SQLAlchemy()
    db.init_app(app)
    gateway = Gateway(app, db=db)
    gateway.admin_guard(lambda: True)
    with app.app_context():
        db.create_all()
    assert "csrf" not in app.extensions
    client = app.test_client()
    page = client.get(f"{ADMIN}/install")
    for rule in admin_rules(app):
        if "POST" in methods_of(rule):
            assert client.post(url_of(app, rule), data=install_form()).status_code == 400, rule.rule
    # With the token the form is processed (here: refused by the form's own check, min above max).
    answer = client.post(
        f"{ADMIN}/install",
        data=install_form(csrf_token=token_of(page), minimum_amount="9", maximum_amount="1"),
    )
    assert answer.status_code == 200
    assert "The maximum must not be below the minimum." in text(answer)
    with app.app_context():
        db.engine.dispose()


def test_framing_headers_on_every_page(admin):
    checkout_id = add_checkout(admin, "ORD-1", "PENDING_ORDER")
    admin.install()
    client = admin.client
    for rule in admin_rules(admin.shop):
        if "GET" not in methods_of(rule):
            continue
        response = client.get(url_of(admin.shop, rule, checkout_id))
        assert response.status_code == 200, rule.rule
        assert response.headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in response.headers["Content-Security-Policy"]
        assert response.headers["X-Content-Type-Options"] == "nosniff"
        response.close()  # the stylesheet is a file response
    assert client.get(f"{ADMIN}/checkouts/999").headers["X-Frame-Options"] == "DENY"
    assert client.get(f"{ADMIN}/checkouts").headers["Cache-Control"] == "no-store"


def test_an_apps_own_policy_keeps_its_directives_but_never_allows_framing(admin):
    from flask import after_this_request

    @admin.shop.before_request
    def policy():  # a header set before the blueprint's after_request runs (by the view or a framework)
        @after_this_request
        def set_policy(response):
            response.headers["Content-Security-Policy"] = (
                "default-src 'self'; frame-ancestors https://x.example"
            )
            return response

    header = admin.client.get(f"{ADMIN}/").headers["Content-Security-Policy"]
    assert "default-src 'self'" in header
    assert "frame-ancestors 'none'" in header
    assert "x.example" not in header


def test_the_extensions_pages_restrict_scripts(admin, harness):
    for path in (f"{ADMIN}/", f"{ADMIN}/install", f"{ADMIN}/checkouts", "/gateway/return/confirm?ref=forged"):
        header = admin.client.get(path).headers["Content-Security-Policy"]
        assert "script-src 'none'" in header, path
        assert "object-src 'none'" in header and "frame-ancestors 'none'" in header, path


def test_an_apps_policy_without_a_script_rule_gets_one(admin):
    from flask import after_this_request

    @admin.shop.before_request
    def policy():
        @after_this_request
        def set_policy(response):
            response.headers["Content-Security-Policy"] = "img-src https://cdn.example"
            return response

    header = admin.client.get(f"{ADMIN}/").headers["Content-Security-Policy"]
    assert header == "img-src https://cdn.example; script-src 'self'; frame-ancestors 'none'"


def test_the_app_can_override_the_base_layout(admin):
    admin.shop.jinja_loader = DictLoader(  # type: ignore[assignment]
        {
            "gateway/admin/base.html": "<html><body><p>MY SHOP LAYOUT</p>"
            "{% include 'gateway/admin/_messages.html' %}{% block content %}{% endblock %}</body></html>"
        }
    )
    page = text(admin.client.get(f"{ADMIN}/install"))
    assert "MY SHOP LAYOUT" in page
    assert "Install the payment gateway" in page


def test_the_app_gives_the_screens_its_look_through_the_layout_blocks(admin):
    admin.shop.jinja_loader = DictLoader(  # type: ignore[assignment]
        {
            "gateway/admin/base.html": '{% extends "gateway/admin/layout.html" %}'
            '{% block head %}<link rel="stylesheet" href="/static/my-theme.css">{% endblock %}'
            "{% block header %}<header>MY SHOP NAVIGATION</header>{% endblock %}"
        }
    )
    page = text(admin.client.get(f"{ADMIN}/install"))
    # The host's stylesheet comes after admin.css, so its --gateway-* variables win.
    assert page.index("gateway/admin.css") < page.index("my-theme.css")
    assert "MY SHOP NAVIGATION" in page and 'class="gateway-topbar"' not in page
    assert '<main id="gateway-main"' in page and "Install the payment gateway" in page


def test_the_stylesheet_takes_its_colours_and_fonts_from_variables(admin):
    response = admin.client.get(f"{ADMIN}/static/gateway/admin.css")
    css = response.get_data(as_text=True)
    response.close()
    defaults = css.split(":where(:root) {")[1].split("}")[0]
    declared = set(re.findall(r"(--gateway-[a-z-]+):", defaults))
    used = set(re.findall(r"var\((--gateway-[a-z-]+)\)", css))
    assert used <= declared and len(declared) >= 20
    rules = css.split("}", 1)[1]
    # Outside the defaults, no colour is written out: every one is a variable the host can set.
    assert re.findall(r"#[0-9a-fA-F]{3,6}\b|rgb\(", rules) == []
    assert "font-family: var(--gateway-font)" in rules


def test_a_status_this_version_does_not_know_is_shown_as_its_code(admin):
    checkout_id = add_checkout(admin, "NEW-1", "SOMETHING_NEW")
    for path in ("/", "/checkouts", f"/checkouts/{checkout_id}"):
        response = admin.client.get(f"{ADMIN}{path}")
        assert response.status_code == 200
        assert 'gateway-status--unknown" data-status="SOMETHING_NEW"' in text(response)
        assert ">SOMETHING_NEW</span>" in text(response)


# --- install -------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_install_through_the_screen(admin, databases):
    client = admin.client
    page = client.get(f"{ADMIN}/install")
    assert page.status_code == 200
    assert f'value="{CALLBACK}"' in text(page)  # prefilled: GATEWAY_PUBLIC_URL + the callback route
    assert "Check the shop's addresses" not in text(page)

    response = client.post(f"{ADMIN}/install", data=install_form(csrf_token=token_of(page)))
    assert response.status_code == 302
    assert response.headers["Location"] == f"{ADMIN}/"

    installation = stored_installation(admin)
    assert installation is not None
    assert installation.merchant_account_id == ACCOUNT
    assert (installation.minimum_cents, installation.maximum_cents) == (100050, 10_000_000)
    assert installation.callback_url == CALLBACK
    assert installation.callback_failures_email == "owner@shop.example"
    account = emulator_account(admin)
    assert account["installed"] is True
    assert account["minimumCheckoutAmountCents"] == 100050
    assert account["maximumCheckoutAmountCents"] == 10_000_000

    api_key, signing_key = decrypted_keys(admin)
    assert api_key == API_KEY
    status = text(client.get(f"{ADMIN}/"))
    assert "The gateway is installed." in status
    assert mask(API_KEY) in status and mask(signing_key) in status
    assert API_KEY not in status and signing_key not in status
    assert "R 1 000.50" in status and "R 100 000.00" in status

    # At rest: neither secret is in any column of the gateway's tables, nor anywhere in the database's
    # files (SQLite: the file and its WAL; PostgreSQL: the database's data files): the ciphertexts are.
    values = databases.text_values()
    assert installation.api_key_encrypted in values
    assert not [v for v in values if API_KEY in v or signing_key in v]
    raw = databases.raw_bytes()
    assert installation.api_key_encrypted.encode() in raw
    assert API_KEY.encode() not in raw
    assert signing_key.encode() not in raw


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("minimum_amount", "1.005", "at most 2 decimals"),
        ("minimum_amount", "-5", "must not be negative"),
        ("maximum_amount", "1,5", "Use &#39;.&#39; before the cents"),
        ("maximum_amount", "1e6", "Enter an amount such as 1234.50"),
        ("maximum_amount", "", "This field is required."),
        ("maximum_amount", "999.99", "The maximum must not be below the minimum."),
        ("callback_url", "gateway/callback", "absolute http(s) URL"),
        ("callback_failures_email", "owner", "e-mail address"),
        ("api_key", "", "This field is required."),
    ],
)
def test_install_form_refuses_bad_input_before_calling_the_gateway(admin, field, value, message):
    client = admin.client
    page = client.get(f"{ADMIN}/install")
    data = install_form(csrf_token=token_of(page), minimum_amount="1000")
    data[field] = value
    response = client.post(f"{ADMIN}/install", data=data)
    assert response.status_code == 200
    assert message in text(response)
    assert 'aria-invalid="true"' in text(response)
    assert emulator_account(admin)["installed"] is False
    assert stored_installation(admin) is None


@pytest.mark.parametrize(
    ("typed", "cents"),
    [
        ("0", 0),
        ("1", 100),
        ("1.5", 150),
        ("1.50", 150),
        (".5", 50),
        ("1 234.56", 123456),
        ("R 10", 1000),
        ("R1\u00a0000", 100000),
        ("10000000000", 10**12),
    ],
)
def test_amounts_are_parsed_exactly_in_the_major_unit(typed, cents):
    assert parse_amount(typed, symbol="R") == cents


@pytest.mark.parametrize(
    "typed",
    ["1.001", "-1", "1,00", "1e3", "NaN", "Infinity", "1.2.3", ".", "", "R", "٣", "10000000000.01", "+1"],
)
def test_amounts_that_are_not_exact_cents_are_refused(typed):
    with pytest.raises(ValueError, match=r"."):
        parse_amount(typed, symbol="R")


def test_money_is_shown_with_the_currency_symbol_and_grouped_thousands():
    assert format_money(123400, "R") == "R 1 234.00"
    assert format_money(5, "R") == "R 0.05"
    assert format_money(100_000_000, "R") == "R 1 000 000.00"
    assert format_money(-250, "R") == "-R 2.50"


@pytest.mark.parametrize(
    ("public_url", "kind", "unset"),
    [
        ("http://localhost:5000", "on localhost", False),
        ("http://shop.localhost", "on localhost", False),
        ("http://192.168.1.20:8000", "on an IP address", False),
        ("http://[::1]:8000", "on an IP address", False),
        (None, "on localhost", True),  # no GATEWAY_PUBLIC_URL: the test client's host, localhost
    ],
)
def test_install_warns_about_a_local_public_url_and_needs_a_confirmation(admin, public_url, kind, unset):
    set_public_url(admin, public_url)
    client = admin.client
    page = client.get(f"{ADMIN}/install")
    body = text(page)
    assert "Check the shop's addresses" in body
    assert 'data-setup-warning="firewall"' in body
    assert kind in body
    assert "firewall refuses redirect URLs" in body
    assert "GATEWAY_PUBLIC_URL" in body and "tunnel" in body
    assert ("is not set" in body) is unset
    assert 'name="confirm_local"' in body

    data = install_form(
        csrf_token=token_of(page), callback_url=f"{public_url or 'http://localhost'}/gateway/callback"
    )
    refused = client.post(f"{ADMIN}/install", data=data)
    assert refused.status_code == 200
    assert "Tick this box to install with this address anyway" in text(refused)
    assert emulator_account(admin)["installed"] is False

    accepted = client.post(f"{ADMIN}/install", data={**data, "confirm_local": "y"})
    assert accepted.status_code == 302
    assert emulator_account(admin)["installed"] is True


def test_a_real_public_url_needs_no_confirmation(admin):
    page = admin.client.get(f"{ADMIN}/install")
    assert 'name="confirm_local"' not in text(page)


def test_already_installed_explains_and_adopts_the_existing_signing_key(admin):
    existing_key = admin.emulator.install(callback_url="https://old-shop.example/gateway/callback")
    client = admin.client
    page = client.get(f"{ADMIN}/install")
    data = install_form(csrf_token=token_of(page))

    answer = client.post(f"{ADMIN}/install", data=data)
    assert answer.status_code == 200
    body = text(answer)
    assert "This merchant account is already installed" in body
    assert "Enter the signing key you received" in body
    assert "<details open>" in body
    assert API_KEY not in body  # the password field is not echoed back
    assert stored_installation(admin) is None

    wrong = client.post(f"{ADMIN}/install", data={**data, "signing_key": "not-the-key-at-all"})
    assert "did not accept this signing key" in text(wrong)
    assert "not-the-key-at-all" not in text(wrong)
    assert stored_installation(admin) is None

    adopted = client.post(f"{ADMIN}/install", data={**data, "signing_key": existing_key})
    assert adopted.status_code == 302
    api_key, signing_key = decrypted_keys(admin)
    assert (api_key, signing_key) == (API_KEY, existing_key)
    # The adoption sent this form's settings to the gateway.
    assert emulator_account(admin)["checkoutStatusCallbackUrl"] == CALLBACK
    status = text(client.get(f"{ADMIN}/"))
    assert mask(existing_key) in status and existing_key not in status


def test_wrong_api_key_is_explained(admin):
    client = admin.client
    page = client.get(f"{ADMIN}/install")
    answer = client.post(
        f"{ADMIN}/install", data=install_form(csrf_token=token_of(page), api_key="wrong-key-123")
    )
    assert answer.status_code == 200
    assert "refused the merchant account id or API key" in text(answer)
    assert "wrong-key-123" not in text(answer)
    assert stored_installation(admin) is None


def test_secrets_never_reach_the_logs(admin, caplog):
    caplog.set_level(logging.DEBUG)
    existing = admin.emulator.install(api_key=API_KEY)
    client = admin.client
    page = client.get(f"{ADMIN}/install")
    data = install_form(csrf_token=token_of(page))
    client.post(f"{ADMIN}/install", data=data)  # already installed
    client.post(f"{ADMIN}/install", data={**data, "signing_key": "a-wrong-signing-key"})
    client.post(f"{ADMIN}/install", data={**data, "signing_key": existing})
    settings = client.get(f"{ADMIN}/settings")
    client.post(
        f"{ADMIN}/settings",
        data={
            "csrf_token": token_of(settings),
            "callback_url": CALLBACK,
            "minimum_amount": "2",
            "maximum_amount": "3",
        },
    )
    assert stored_installation(admin) is not None
    assert caplog.records, "expected log lines (installation, client requests)"
    logged = caplog.text + "".join(repr(r.args) for r in caplog.records)
    for secret in (API_KEY, existing, "a-wrong-signing-key"):
        assert secret not in logged


# --- settings ------------------------------------------------------------------------------------------


def test_settings_without_installation_send_the_owner_to_install(admin):
    response = admin.client.get(f"{ADMIN}/settings")
    assert response.status_code == 302
    assert response.headers["Location"] == f"{ADMIN}/install"


def test_settings_update(admin):
    admin.install(minimum=100, maximum=10_000_000)
    _, old_key = decrypted_keys(admin)
    client = admin.client
    page = client.get(f"{ADMIN}/settings")
    body = text(page)
    assert 'value="1.00"' in body and 'value="100000.00"' in body
    assert f'value="{CALLBACK}"' in body

    response = client.post(
        f"{ADMIN}/settings",
        data={
            "csrf_token": token_of(page),
            "callback_url": f"{SHOP_URL}/gateway/callback?v=2",
            "callback_failures_email": "alerts@shop.example",
            "minimum_amount": "5",
            "maximum_amount": "2 500.25",
        },
    )
    assert response.status_code == 302
    installation = stored_installation(admin)
    assert installation is not None
    assert (installation.minimum_cents, installation.maximum_cents) == (500, 250025)
    assert installation.callback_failures_email == "alerts@shop.example"
    assert installation.callback_url == f"{SHOP_URL}/gateway/callback?v=2"
    account = emulator_account(admin)
    assert (account["minimumCheckoutAmountCents"], account["maximumCheckoutAmountCents"]) == (500, 250025)
    assert account["callbackFailuresEmail"] == "alerts@shop.example"
    _, key = decrypted_keys(admin)
    assert key == old_key  # the returned signingKey, stored again (the emulator does not rotate it)
    status = text(client.get(f"{ADMIN}/"))
    assert "Settings saved on the gateway." in status
    assert "R 5.00" in status and "R 2 500.25" in status


NEW_API_KEY = "the-new-api-key-issued-7f3a"


def stored_api_key(harness: Harness) -> str:
    with harness.shop.app_context():
        state = get_state()
        return state.box.decrypt(state.require_installation(ACCOUNT).api_key_encrypted)


def post_api_key(admin: Harness, key: str, client: Any = None) -> Any:
    client = client or admin.client
    page = client.get(f"{ADMIN}/settings")
    return client.post(f"{ADMIN}/settings/api-key", data={"csrf_token": token_of(page), "api_key": key})


def test_the_settings_screen_takes_a_new_api_key_once_the_gateway_accepts_it(admin, caplog):
    caplog.set_level(logging.DEBUG)
    admin.install()
    page = visible(text(admin.client.get(f"{ADMIN}/settings")))
    assert "A new API key" in page and f"The stored key: {mask(API_KEY)}" in page
    answer = admin.emulator.control(
        "accounts", {"merchantAccountId": ACCOUNT, "merchantAccountApiKey": NEW_API_KEY}
    )
    assert answer.status_code == 200  # the account manager issued a new key

    client = admin.client
    response = post_api_key(admin, f"  {NEW_API_KEY} ", client)

    assert response.status_code == 302 and response.headers["Location"].endswith(
        f"{ADMIN}/settings?account={ACCOUNT}"
    )
    assert stored_api_key(admin) == NEW_API_KEY
    shown = visible(text(client.get(response.headers["Location"])))
    assert f"Stored the new API key of {ACCOUNT} (****7f3a), encrypted" in shown
    assert f"The stored key: {mask(NEW_API_KEY)}" in shown
    with admin.shop.app_context():  # the shop's v1 calls go on with it
        assert get_state().v1_client(account=ACCOUNT).configuration().data.minimum_amount is not None
    assert NEW_API_KEY not in caplog.text + "".join(repr(r.args) for r in caplog.records)


@pytest.mark.parametrize(
    ("fault", "message"),
    [
        (None, "The gateway refused this API key"),
        (
            {"operation": "v1_configuration", "kind": "status", "status": 503, "count": 1},
            "could not be proved",
        ),
    ],
    ids=["refused", "unanswered"],
)
def test_a_new_api_key_the_gateway_does_not_accept_leaves_the_stored_one(admin, fault, message):
    admin.install()
    key = "a-key-nobody-issued-0000"
    if fault is not None:  # the key is right, but the gateway does not answer the proof
        admin.emulator.control(
            "accounts", {"merchantAccountId": ACCOUNT, "merchantAccountApiKey": NEW_API_KEY}
        )
        assert admin.emulator.control("faults", fault).status_code == 201
        key = NEW_API_KEY

    response = post_api_key(admin, key)

    assert response.status_code == 200
    body = text(response)
    assert message in visible(body) and "the stored key is unchanged" in visible(body)
    assert key not in body  # a password field: the typed key is not sent back
    assert 'aria-invalid="true"' in body
    assert stored_api_key(admin) == API_KEY


def test_an_empty_new_api_key_is_refused_before_the_gateway_is_called(admin):
    admin.install()
    response = post_api_key(admin, "   ")
    assert response.status_code == 200
    assert "Enter the new API key." in text(response)
    assert stored_api_key(admin) == API_KEY


def test_settings_errors_from_the_gateway_are_flashed(admin):
    admin.install()
    with admin.shop.app_context():  # the gateway no longer accepts the stored key
        state = get_state()
        installation = state.require_installation()
        installation.signing_key_encrypted = state.box.encrypt("a-stale-signing-key")
        state.session.commit()
    client = admin.client
    page = client.get(f"{ADMIN}/settings")
    response = client.post(
        f"{ADMIN}/settings",
        data={
            "csrf_token": token_of(page),
            "callback_url": CALLBACK,
            "minimum_amount": "1",
            "maximum_amount": "2",
        },
        follow_redirects=True,
    )
    assert "refused the stored signing key" in text(response)
    assert "a-stale-signing-key" not in text(response)
    stored = stored_installation(admin)
    assert stored is not None and stored.maximum_cents == 10_000_000


def test_status_page_explains_an_unreadable_secret(admin):
    admin.install()
    with admin.shop.app_context():
        state = get_state()
        installation = state.require_installation()
        installation.api_key_encrypted = "gAAAA-not-a-token"
        state.session.commit()
    body = text(admin.client.get(f"{ADMIN}/"))
    assert "cannot be decrypted" in body


# --- checkouts -----------------------------------------------------------------------------------------


@pytest.mark.backends
def test_checkouts_list_filters_by_status_and_paginates(admin):
    for n in range(5):
        add_checkout(admin, f"PAID-{n}", "PAID")
    for n in range(3):
        add_checkout(admin, f"OPEN-{n}", "PENDING_ORDER")
    add_checkout(admin, "ODD-1", "PENDING_ORDER", flagged=True, flag_reason="total mismatch")
    client = admin.client

    everything = text(client.get(f"{ADMIN}/checkouts"))
    assert "9 checkouts" in everything
    assert "PAID-0" in everything and "OPEN-0" in everything

    paid = text(client.get(f"{ADMIN}/checkouts?status=PAID"))
    assert "5 checkouts “Paid”" in paid
    assert "OPEN-" not in paid and "ODD-1" not in paid
    assert '<option value="PAID" selected>Paid</option>' in paid
    assert '<option value="PAID_PENDING_CALLBACK">Paid - confirming</option>' in paid

    flagged = text(client.get(f"{ADMIN}/checkouts?flagged=1"))
    assert "ODD-1" in flagged and "PAID-0" not in flagged

    found = text(client.get(f"{ADMIN}/checkouts?q=open-1"))
    assert "OPEN-1" in found and "OPEN-2" not in found
    nul = client.get(f"{ADMIN}/checkouts?q=OPEN-1%00")  # PostgreSQL refuses U+0000 in a query
    assert nul.status_code == 200 and "No checkouts" in text(nul)

    first = text(client.get(f"{ADMIN}/checkouts?status=PAID&per_page=2"))
    assert "page 1 of 3" in first
    assert "PAID-4" in first and "PAID-3" in first and "PAID-2" not in first  # newest first
    assert "page=2" in first and "status=PAID" in first
    third = text(client.get(f"{ADMIN}/checkouts?status=PAID&per_page=2&page=3"))
    assert "PAID-0" in third and "PAID-1" not in third
    assert "No checkouts" in text(client.get(f"{ADMIN}/checkouts?status=PAID&per_page=2&page=9"))
    # An unknown status is ignored rather than an error.
    assert "9 checkouts" in text(client.get(f"{ADMIN}/checkouts?status=BOGUS"))
    assert "R 798.00" in everything


def test_checkout_detail_shows_the_timeline_and_the_callbacks(admin):
    checkout_id = add_checkout(admin, "ORD-7", LocalStatus.CREATING.value, token=None)
    with admin.shop.app_context():
        session = get_state().session
        apply(session, checkout_id, Observation(status="PENDING_ORDER", source="create", token="v2.x.y"))
        apply(session, checkout_id, Observation(status="CANCELLED_BY_CONSUMER", source="callback"))
        apply(session, checkout_id, Observation(status="PENDING_ORDER", source="poll"))  # reopened
        apply(session, checkout_id, Observation(status="CREATING", source="poll"))  # backward: refused
        session.add(
            CallbackLog(
                received_at=utcnow(),
                checkout_id=checkout_id,
                merchant_account_id=ACCOUNT,
                headers={"Content-Type": "application/json"},
                body='{"checkoutPaymentStatus":"CANCELLED_BY_CONSUMER"}',
                verified=True,
                outcome="accepted",
                http_status=200,
            )
        )
        session.commit()
    body = text(admin.client.get(f"{ADMIN}/checkouts/{checkout_id}"))
    assert f'Checkout #{checkout_id}: order <span class="ref">ORD-7</span>' in body  # kept whole on a phone
    timeline = body.split('id="gateway-timeline"')[1].split('id="gateway-refunds"')[0]
    assert timeline.count("<tr") == 5  # the header and four events
    # People's words, the gateway's codes in the tooltips (and the detail line).
    assert "Checkout created Being created → Awaiting payment" in visible(timeline)
    assert "Gateway callback Awaiting payment → Cancelled by the shopper" in visible(timeline)
    assert "Status check Cancelled by the shopper → Awaiting payment" in visible(timeline)
    assert 'title="CANCELLED_BY_CONSUMER: The shopper cancelled' in timeline
    assert "does not move back" in timeline
    facts = visible(body.split('<dl class="facts">')[1].split("</dl>")[0])
    # The code in the status's tooltip and data-status-code, not in the text (issue 28).
    assert facts.startswith("Status Awaiting payment Created; the shopper has not paid yet. Total R 798.00")
    assert 'data-status-code="PENDING_ORDER"' in body and "PENDING_ORDER" not in facts
    callbacks = body.split('id="gateway-callbacks"')[1]
    assert "Recorded" in visible(callbacks) and 'title="accepted: Verified and recorded."' in callbacks
    assert "HTTP 200" in callbacks and "verified" in callbacks
    assert "Cancel checkout" in body and "Refresh status from the gateway" in body
    assert f'action="/gateway/admin/checkouts/{checkout_id}/refund"' not in body  # not paid: no refund
    assert "R 798.00" in body


def test_the_order_as_sent_reads_as_an_order(admin):
    admin.install()
    checkout_id = paid_checkout(admin)
    body = text(admin.client.get(f"{ADMIN}/checkouts/{checkout_id}"))
    order = visible(body.split('id="gateway-order"')[1])
    assert "Enamel kettle K-1 2 R 399.00 R 798.00" in order
    assert "Customer Thandi Mokoena thandi@example.com · +27821234567" in order
    assert "Billing address 1 Long St, Cape Town, WC, 8001 Delivery address The billing address" in order
    assert "Everything stored with the checkout" in order and "unit_price_cents" in order  # all of it
    # A stored order of another shape is shown as stored, never a 500.
    odd = add_checkout(admin, "ODD-SHAPE", "PENDING_ORDER", order={"lines": [{"name": "x"}], "customer": 7})
    assert admin.client.get(f"{ADMIN}/checkouts/{odd}").status_code == 200


def test_unknown_checkout_is_404(admin):
    assert admin.client.get(f"{ADMIN}/checkouts/12345").status_code == 404


def test_refresh_button_asks_the_gateway(admin):
    admin.install()
    client = admin.client
    checkout_id = paid_checkout(admin, client=client)
    assert checkout_status(admin, checkout_id) == "PAID_PENDING_CALLBACK"
    page = client.get(f"{ADMIN}/checkouts/{checkout_id}")
    assert "The gateway says “Paid - confirming” (was “Awaiting payment”)." in text(page)
    again = client.post(
        f"{ADMIN}/checkouts/{checkout_id}/refresh", data={"csrf_token": token_of(page)}, follow_redirects=True
    )
    assert "The gateway says “Paid - confirming”: no change." in text(again)
    with admin.shop.app_context():
        sources = [e.source for e in get_state().session.get_one(GatewayCheckout, checkout_id).events]
    assert sources[-1] == "admin"


def test_refresh_errors_are_flashed(admin):
    admin.install()
    checkout_id = add_checkout(admin, "GHOST", "PENDING_ORDER", token=f"v2.{ACCOUNT}.unknown")
    client = admin.client
    page = client.get(f"{ADMIN}/checkouts/{checkout_id}")
    response = client.post(
        f"{ADMIN}/checkouts/{checkout_id}/refresh", data={"csrf_token": token_of(page)}, follow_redirects=True
    )
    assert "Could not ask the gateway for the status" in text(response)
    assert "HTTP 404" in text(response)


def refunded_at_the_gateway(harness: Harness, checkout_id: int) -> int:
    with harness.shop.app_context():
        token = get_state().session.get_one(GatewayCheckout, checkout_id).token
    return int(harness.emulator.control(f"checkouts/{token}", method="GET").json["refundedCents"])


def test_refund_button_asks_for_confirmation_before_the_call(admin):
    admin.install()
    checkout_id = paid_checkout(admin)
    client = admin.client
    page = client.get(f"{ADMIN}/checkouts/{checkout_id}")
    body = text(page)
    assert "Up to R 798.00 can be refunded" in body
    assert 'name="amount" type="text" value=""' in body  # the form starts empty
    assert "Refund everything that is left (R 798.00)" in body

    review = client.post(
        f"{ADMIN}/checkouts/{checkout_id}/refund",
        data={"csrf_token": token_of(page), "amount": "100.50", "reason": "damaged lid"},
    )
    assert review.status_code == 200
    shown = visible(text(review))
    assert "Refund R 100.50?" in shown and "Reason: “damaged lid”" in shown
    assert refunded_at_the_gateway(admin, checkout_id) == 0  # nothing sent yet
    assert checkout_status(admin, checkout_id) == "PAID_PENDING_CALLBACK"

    confirm = {
        "csrf_token": token_of(review),
        "amount": "100.50",
        "reason": "damaged lid",
        "refunded_before": "0",
        "confirmed": "y",
    }
    response = client.post(f"{ADMIN}/checkouts/{checkout_id}/refund", data=confirm, follow_redirects=True)
    assert "Refunded R 100.50." in text(response)
    assert checkout_status(admin, checkout_id) == "PARTIALLY_REFUNDED"
    assert refunded_at_the_gateway(admin, checkout_id) == 10050
    assert "damaged lid" in text(response)

    # The same confirmation again (a second tab, a double submit): the refunded total moved, so it is
    # shown again for a new decision, not sent.
    again = client.post(f"{ADMIN}/checkouts/{checkout_id}/refund", data=confirm)
    assert again.status_code == 409
    assert "The refunded total changed since you reviewed this refund" in text(again)
    assert refunded_at_the_gateway(admin, checkout_id) == 10050

    everything = client.post(
        f"{ADMIN}/checkouts/{checkout_id}/refund",
        data={"csrf_token": token_of(page), "amount": "", "everything": "y"},
    )
    assert "Refund R 697.50?" in visible(text(everything))
    assert "(everything that is left)" in text(everything)
    assert 'name="refunded_before" value="10050"' in text(everything)
    assert refunded_at_the_gateway(admin, checkout_id) == 10050


def test_refund_form_refuses_wrong_amounts_before_anything_is_sent(admin):
    admin.install()
    checkout_id = paid_checkout(admin)
    client = admin.client
    token = token_of(client.get(f"{ADMIN}/checkouts/{checkout_id}"))
    url = f"{ADMIN}/checkouts/{checkout_id}/refund"

    too_much = client.post(url, data={"csrf_token": token, "amount": "1 000"})
    assert too_much.status_code == 400
    assert "At most R 798.00 can be refunded." in text(too_much)
    empty = client.post(url, data={"csrf_token": token, "amount": ""})
    assert empty.status_code == 400
    assert "Enter the amount to refund, or choose to refund everything that is left." in text(empty)
    bad = client.post(url, data={"csrf_token": token, "amount": "1.001"})
    assert bad.status_code == 400
    assert "at most 2 decimals" in text(bad)
    zero = client.post(url, data={"csrf_token": token, "amount": "0"})
    assert "more than zero" in text(zero)
    # A confirmed refund the gateway refuses (more than is left there) is reported, not a 500.
    over = client.post(
        url,
        data={"csrf_token": token, "amount": "900", "refunded_before": "0", "confirmed": "y"},
        follow_redirects=True,
    )
    assert "The refund was not made:" in text(over)
    assert checkout_status(admin, checkout_id) == "PAID_PENDING_CALLBACK"
    assert refunded_at_the_gateway(admin, checkout_id) == 0


def test_cancel_button(admin):
    from flask_gateway import create_checkout

    admin.install()
    with admin.shop.test_request_context():
        checkout_id = create_checkout(sample_order("ORD-C")).id
    client = admin.client
    page = client.get(f"{ADMIN}/checkouts/{checkout_id}")
    response = client.post(
        f"{ADMIN}/checkouts/{checkout_id}/cancel", data={"csrf_token": token_of(page)}, follow_redirects=True
    )
    assert "Checkout cancelled; its status is now “Cancelled by the shop”." in text(response)
    assert checkout_status(admin, checkout_id) == "CANCELLED_BY_MERCHANT"
    assert "Cancel checkout" not in text(response)  # no second cancel button


def test_cancel_of_a_paid_checkout_is_refused_with_a_message(admin):
    admin.install()
    checkout_id = paid_checkout(admin)
    client = admin.client
    page = client.get(f"{ADMIN}/checkouts/{checkout_id}")
    assert "Cancel checkout" not in text(page)
    response = client.post(
        f"{ADMIN}/checkouts/{checkout_id}/cancel", data={"csrf_token": token_of(page)}, follow_redirects=True
    )
    assert "The checkout was not cancelled" in text(response)
    assert "refund it instead" in text(response)
    assert checkout_status(admin, checkout_id) == "PAID_PENDING_CALLBACK"


def test_the_status_page_counts_checkouts(admin):
    add_checkout(admin, "A", "PAID")
    add_checkout(admin, "B", "PAID", flagged=True, flag_reason="x")
    body = text(admin.client.get(f"{ADMIN}/"))
    assert "Not installed" in body
    assert "1 flagged" in body
    with admin.shop.app_context():
        assert len(get_state().session.scalars(select(GatewayCheckout)).all()) == 2


def test_install_without_an_answer_explains_what_to_do(admin):
    import requests
    from requests.adapters import BaseAdapter

    class Unreachable(BaseAdapter):
        def send(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
            raise requests.ConnectionError("connection refused")

        def close(self) -> None:
            pass

    down = requests.Session()
    down.mount("http://", Unreachable())
    get_state(admin.shop).client_options["session"] = down
    client = admin.client
    page = client.get(f"{ADMIN}/install")
    answer = client.post(f"{ADMIN}/install", data=install_form(csrf_token=token_of(page)))
    assert answer.status_code == 200
    assert "No usable answer from the gateway" in text(answer)
    assert "account manager" in text(answer)
    assert stored_installation(admin) is None


@pytest.mark.backends
def test_the_callback_log_lists_refused_callbacks_too(admin):
    admin.install()
    checkout_id = paid_checkout(admin)
    with admin.shop.app_context():
        token = get_state().session.get_one(GatewayCheckout, checkout_id).token
    assert admin.emulator.control("deliver").status_code == 200  # the real, signed callback
    forged = admin.client.post(
        "/gateway/callback",
        data=b'{"checkoutToken":"%s"}' % token.encode(),
        headers={
            "Content-Type": "application/json",
            "X-Signature": "bm9wZQ==",
            "X-Merchant-Account-ID": ACCOUNT,
        },
    )
    assert forged.status_code == 401

    page = admin.client.get(f"{ADMIN}/callbacks")
    assert page.status_code == 200
    html = text(page)
    assert 'data-callback-outcome="rejected-signature"' in html
    # Newest first. The real callback said PAID_PENDING_CALLBACK; the shop knew the payment (the refresh)
    # and recorded PAID with its 200: "Recorded", the statuses in words on the detail line (issue 28), the
    # stored detail with the codes in its tooltip.
    assert html.index("rejected-signature") < html.index('data-callback-outcome="accepted"')
    shown = visible(html)
    assert "Refused: not signed by the gateway" in shown
    assert "Recorded verified HTTP 200 Paid - confirming → Paid" in shown
    assert 'title="PAID_PENDING_CALLBACK -&gt; PAID"' in html
    assert f'href="{ADMIN}/checkouts/{checkout_id}"' in html
    assert "2 callbacks" in html

    refused = text(admin.client.get(f"{ADMIN}/callbacks?refused=1"))
    assert "1 callback" in refused and 'data-callback-outcome="accepted"' not in refused
    only = text(admin.client.get(f"{ADMIN}/callbacks?outcome=accepted"))
    assert 'data-callback-outcome="accepted"' in only and 'data-callback-outcome="rejected' not in only
    assert "2 callbacks “Recorded”" not in only and "1 callback “Recorded”" in only
    assert "2 callbacks" in text(admin.client.get(f"{ADMIN}/callbacks?outcome=not-an-outcome"))  # ignored


@pytest.mark.backends
def test_the_callback_log_pages_keep_their_filter(admin):
    admin.install()
    for n in range(26):  # PER_PAGE is 25
        forged = admin.client.post(
            "/gateway/callback",
            data=b'{"n":%d}' % n,
            headers={
                "Content-Type": "application/json",
                "X-Signature": "bm9wZQ==",
                "X-Merchant-Account-ID": ACCOUNT,
            },
        )
        assert forged.status_code == 401
    first = text(admin.client.get(f"{ADMIN}/callbacks?refused=1"))
    assert "26 callbacks, page 1 of 2" in first
    assert first.count('data-callback-outcome="rejected-signature"') == 25
    assert 'rel="next" href="/gateway/admin/callbacks?page=2&amp;refused=1"' in first
    second = text(admin.client.get(f"{ADMIN}/callbacks?refused=1&page=2"))
    assert second.count('data-callback-outcome="rejected-signature"') == 1
    assert "{&#34;n&#34;:0}" in second  # the oldest, on the last page


# --- warnings that are true where the shop runs ----------------------------------------------------------


def set_config(harness: Harness, **changes: Any) -> None:
    state = get_state(harness.shop)
    state.config = dataclasses.replace(state.config, **changes)


def warnings_on(harness: Harness, path: str = "/") -> list[str]:
    return re.findall(r'data-setup-warning="([a-z-]+)"', text(harness.client.get(f"{ADMIN}{path}")))


def test_the_firewall_warning_shows_only_where_the_gateway_enforces_it(admin):
    set_public_url(admin, "http://127.0.0.1:5000")
    set_config(admin, base_url="http://127.0.0.1:5050")  # an emulator on this machine: it reaches the shop
    assert warnings_on(admin, "/install") == ["firewall"]  # strict: the default, and the real gateway
    set_config(admin, waf="allow-local")  # an emulator started with EMULATOR_WAF=allow-local
    page = admin.client.get(f"{ADMIN}/install")
    assert warnings_on(admin, "/install") == []
    assert 'name="confirm_local"' not in text(page)  # nothing to confirm: checkouts will work


def test_a_local_callback_url_is_a_problem_only_for_a_gateway_elsewhere(admin):
    set_public_url(admin, "http://127.0.0.1:5000")
    set_config(admin, waf="allow-local")
    admin.install()  # the gateway now posts to the harness's callback URL
    with admin.shop.app_context():
        installation = get_state().require_installation()
        installation.callback_url = "http://127.0.0.1:5000/gateway/callback"
        get_state().session.commit()
    assert warnings_on(admin) == ["unreachable-callback"]  # the gateway is http://emulator.test
    set_config(admin, base_url="http://127.0.0.1:5050")  # the gateway on this machine reaches it
    assert warnings_on(admin) == []


def test_a_callback_url_that_is_not_this_shops_is_reported_until_the_settings_are_saved(admin):
    admin.install()
    assert warnings_on(admin) == []
    set_public_url(admin, "https://shop-two.example")  # the installation still names shop.example
    page = text(admin.client.get(f"{ADMIN}/"))
    assert warnings_on(admin) == ["callback-mismatch"]
    assert "The gateway sends its callbacks to https://shop.example/gateway/callback" in visible(page)
    assert "this shop receives them at https://shop-two.example/gateway/callback" in visible(page)
    client = admin.client  # one cookie jar: the CSRF token belongs to its session
    settings = client.get(f"{ADMIN}/settings")
    assert "change the callback URL below to" in visible(text(settings))

    saved = client.post(
        f"{ADMIN}/settings",
        data={
            "csrf_token": token_of(settings),
            "callback_url": "https://shop-two.example/gateway/callback",
            "minimum_amount": "1.00",
            "maximum_amount": "100 000.00",
        },
    )
    assert saved.status_code == 302
    assert warnings_on(admin) == []
    assert emulator_account(admin)["checkoutStatusCallbackUrl"] == "https://shop-two.example/gateway/callback"


def test_setup_warnings_for_a_shops_own_pages(admin):
    from flask_gateway.operations.checks import setup_warnings

    admin.install()
    set_public_url(admin, "https://elsewhere.example")
    with admin.shop.app_context():
        (warning,) = setup_warnings()
    assert warning.kind == "callback-mismatch"
    assert warning.summary == (
        "The gateway sends its callbacks to https://shop.example/gateway/callback, but this shop receives "
        "them at https://elsewhere.example/gateway/callback."
    )


def test_before_anything_is_installed_plain_http_in_production_says_use_https(admin):
    """The install screen (nothing installed in production yet) tells the owner to use an https address,
    never to open the settings of an installation that does not exist; ``flask gateway install`` prints the
    same words (install_warnings)."""
    set_public_url(admin, "http://shop.example")
    set_config(admin, environment="production")
    page = visible(text(admin.client.get(f"{ADMIN}/install")))
    assert warnings_on(admin, "/install") == ["insecure-callback"]
    assert "The callback URL http://shop.example/gateway/callback is plain http" in page
    assert "use an https address" in page
    assert "open the settings" not in page
