"""URL-map walks: framing headers on every HTML answer, and a CSRF token on every form POST.

Both walks read each app's ``url_map``, so a route added later is covered without touching this file.
URL parameters are filled from real objects (a paid order, its gateway checkout, a product, tokens).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from flask import Flask, url_for
from werkzeug.test import TestResponse

from flask_gateway.models import GatewayCheckout
from flask_gateway.state import get_state
from tests.emulator.conftest import make_emulator
from tests.emulator.support import Gateway, create_body
from tests.security.conftest import ShopWorld, methods_of, table_contents
from tests.shop.conftest import CUSTOMER, OWNER_PASSWORD, SHOP_URL

# --- framing -----------------------------------------------------------------------------------------


def assert_not_frameable(response: TestResponse, what: str) -> None:
    """docs/security.md: ``X-Frame-Options: DENY`` and a CSP with ``frame-ancestors 'none'``."""
    assert response.headers.get("X-Frame-Options") == "DENY", (what, response.status_code)
    policy = response.headers.get("Content-Security-Policy", "")
    assert "frame-ancestors 'none'" in policy, (what, response.status_code, policy)
    ancestors = [d for d in policy.split(";") if d.strip().startswith("frame-ancestors")]
    assert len(ancestors) == 1, (what, policy)  # no second, looser directive


def _html(response: TestResponse) -> bool:
    return response.mimetype == "text/html"


def _crash(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a bug in a view (planted by the test)")


def error_pages(app: Flask, get: Callable[[str], TestResponse], urls: dict[str, str]) -> Iterator[str]:
    """Ask for each of ``urls`` (kind -> URL) and check the answer; yields the kinds seen as HTML."""
    for kind, url in urls.items():
        response = get(url)
        assert response.status_code == int(kind.split(":")[0]), (kind, url, response.status_code)
        if _html(response):
            assert_not_frameable(response, f"{kind} {url}")
            yield kind


def plant_crash(app: Flask, monkeypatch: pytest.MonkeyPatch, endpoint: str) -> None:
    """``endpoint`` raises: the app's 500 page (exceptions not propagated to the test client)."""
    monkeypatch.setitem(app.view_functions, endpoint, _crash)
    monkeypatch.setitem(app.config, "PROPAGATE_EXCEPTIONS", False)


def test_every_shop_and_extension_page_refuses_framing(
    shop_world: ShopWorld, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = shop_world.app
    seen: set[str] = set()
    for who, shopper in (("anonymous", shop_world.anonymous), ("owner", shop_world.owner)):
        for rule in app.url_map.iter_rules():
            if "GET" not in methods_of(rule):
                continue
            url = shop_world.url(rule)
            response = shopper.get(url)
            response.close()  # static files are file responses
            assert response.status_code < 500, (who, url)
            if _html(response):
                assert_not_frameable(response, f"{who} GET {url}")
                seen.add(rule.endpoint)
        checkout_id = shop_world.values["checkout_id"]
        pages = {
            "404:shop": "/no-such-page",
            "404:product": "/products/no-such-product",
            "404:order": "/orders/view/forged-token",
            "404:gateway": "/gateway/return/sideways",
            "400:return-page": "/gateway/return/confirm?ref=forged",
            "405:shop": "/cart/update",
            "405:gateway-callback": "/gateway/callback",
            "405:gateway-admin": f"/gateway/admin/checkouts/{checkout_id}/refund",
        }
        if who == "owner":  # the anonymous shopper is sent to the login page first
            pages["404:gateway-admin"] = "/gateway/admin/checkouts/999999"
            pages["404:admin"] = "/admin/orders/NO-SUCH-ORDER"
        html = set(error_pages(app, shopper.get, pages))
        assert {"404:shop", "404:product", "405:shop", "400:return-page"} <= html, html
    # Logged in, the walk reached the owner's pages and the extension's admin screens.
    assert {"admin.orders", "admin.order", "gateway_admin.index", "gateway_admin.checkout_detail"} <= seen
    assert {"shop.index", "shop.product", "cart.view", "checkout.checkout", "orders.show"} <= seen

    for endpoint, url in [
        ("shop.index", "/"),
        ("gateway_admin.index", "/gateway/admin/"),
        ("gateway.return_page", "/gateway/return/confirm"),
    ]:
        plant_crash(app, monkeypatch, endpoint)
        response = shop_world.owner.get(url)
        assert response.status_code == 500, endpoint
        assert_not_frameable(response, f"500 {url}")


@pytest.fixture
def emulator_world(database_url: str) -> Iterator[tuple[Flask, Gateway, dict[str, Any]]]:
    app = make_emulator(database_url)
    gateway = Gateway(app.test_client())
    gateway.install()
    token = gateway.create(create_body())["checkoutToken"]
    values = {"token": token, "version": "v2", "delivery_id": 1, "filename": "emulator/hosted.css"}
    yield app, gateway, values
    from flask_gateway.emulator.models import db

    with app.app_context():
        db.engine.dispose()


def test_every_emulator_page_refuses_framing(emulator_world, monkeypatch: pytest.MonkeyPatch) -> None:
    app, gateway, values = emulator_world
    client = gateway.client
    html_pages = 0
    for rule in app.url_map.iter_rules():
        if "GET" not in methods_of(rule):
            continue
        with app.test_request_context():
            url = url_for(rule.endpoint, **{name: values[name] for name in rule.arguments})
        response = client.get(url)
        response.close()
        assert response.status_code < 500, url
        if _html(response):
            assert_not_frameable(response, f"GET {url}")
            html_pages += 1
    assert html_pages >= 5  # the hosted page and the dashboard's pages
    pages = {
        "404:hosted": "/api/v2/app/checkout/v2.nope.nope",
        "404:dashboard": "/_emulator/dashboard/checkouts/v2.nope.nope",
        "404:api": "/v2/nope",
        "405:api": "/v2/create",
        "405:hosted": f"/api/v2/app/checkout/{values['token']}/pay",
    }
    assert {"404:hosted", "404:dashboard", "405:hosted"} <= set(error_pages(app, client.get, pages))
    plant_crash(app, monkeypatch, "emulator_hosted.checkout_page")
    response = client.get(f"/api/v2/app/checkout/{values['token']}")
    assert (response.status_code, response.mimetype) == (500, "text/html")
    assert_not_frameable(response, "500 hosted page")


# --- CSRF --------------------------------------------------------------------------------------------

#: Routes that are proven by something else than a CSRF token (docs/security.md): the gateway's
#: callback carries an HMAC signature instead.
CSRF_EXEMPT = {"gateway.callback"}


def _form_for(world: ShopWorld) -> dict[str, str]:
    """Fields that would make each form succeed, were the token there."""
    return {
        **CUSTOMER,
        "quantity": "1",
        "password": OWNER_PASSWORD,
        "amount": "1.00",
        "reason": "test",
        "merchant_account_id": "demo-merchant",
        "api_key": "demo-api-key",
        "callback_url": f"{SHOP_URL}/gateway/callback",
        "minimum_amount": "50",
        "maximum_amount": "50000",
        f"quantity-{world.values['slug']}": "3",
    }


def test_every_shop_post_refuses_a_missing_or_wrong_csrf_token(shop_world: ShopWorld, databases) -> None:
    """Every POST of the shop app (the shop's forms, the owner's admin, the extension's admin), for the
    logged-in owner and an anonymous shopper: no token or a forged one is a 400 and changes nothing."""
    app = shop_world.app
    posts = [rule for rule in app.url_map.iter_rules() if "POST" in methods_of(rule)]
    endpoints = {rule.endpoint for rule in posts}
    assert {"cart.add", "checkout.checkout", "admin.login", "admin.logout", "admin.refund_order"} <= endpoints
    assert {
        "admin.cancel_order",
        "gateway_admin.refund_checkout",
        "gateway_admin.install_screen",
    } <= endpoints
    form = _form_for(shop_world)
    before = table_contents(databases.url("shop"))
    for shopper in (shop_world.owner, shop_world.anonymous):
        shopper.get("/")  # a session with a CSRF secret, so a forged token is really wrong
        for rule in posts:
            if rule.endpoint in CSRF_EXEMPT:
                continue
            url = shop_world.url(rule)
            for token in (None, "forged", ""):
                data = form if token is None else {**form, "csrf_token": token}
                response = shopper.post(url, data)
                assert response.status_code == 400, (rule.endpoint, token, response.status_code)
    after = table_contents(databases.url("shop"))
    # Rate-limit counters count requests (the pages' instalment hints, the login form): not state.
    after.pop("gateway_rate_limits"), before.pop("gateway_rate_limits")
    assert after == before
    assert shop_world.anonymous.get("/admin/").status_code == 302  # the login without a token did not log in
    assert shop_world.owner.get("/admin/").status_code == 200  # nor did logout log the owner out
    # The exempt callback is exempt because of its signature: unsigned, it is a 401 (not a CSRF 400).
    callback = shop_world.anonymous.client.post(f"{SHOP_URL}/gateway/callback", data=b"{}")
    assert callback.status_code == 401
    with app.app_context():
        status = get_state().session.get(GatewayCheckout, shop_world.values["checkout_id"])
        assert status is not None and status.status in ("PAID", "PAID_PENDING_CALLBACK")


def test_every_emulator_form_post_refuses_a_missing_csrf_token(emulator_world) -> None:
    """The emulator's HTML forms (hosted payment page, dashboard); its JSON API is exempt by design
    (signature / Basic auth / test-only control API)."""
    app, gateway, values = emulator_world
    json_api = ("emulator_v2.", "emulator_v1.", "emulator_control.", "emulator_deliveries.")
    forms = [
        rule
        for rule in app.url_map.iter_rules()
        if "POST" in methods_of(rule) and not rule.endpoint.startswith(json_api)
    ]
    assert {rule.endpoint for rule in forms} >= {"emulator_hosted.pay", "emulator_hosted.cancel"}
    gateway.client.get(f"/api/v2/app/checkout/{values['token']}")  # a session with a CSRF secret
    for rule in forms:
        with app.test_request_context():
            url = url_for(rule.endpoint, **{name: values[name] for name in rule.arguments})
        for data in ({}, {"csrf_token": "forged"}):
            assert gateway.client.post(url, data=data).status_code == 400, (rule.endpoint, data)
    assert gateway.status(values["token"])["checkoutPaymentStatus"] == "PENDING_ORDER"
