"""The owner: login (hash only; no default password), the orders, refund and cancel, the gateway screens."""

from __future__ import annotations

import re
from html import unescape

import pytest
from sqlalchemy import select
from werkzeug.security import check_password_hash
from werkzeug.test import TestResponse

from example_shop import create_app, login_guard
from example_shop.config import ShopConfigError
from example_shop.extensions import db
from example_shop.models import OrderStatus
from flask_gateway.models import Installation
from tests.shop.conftest import (
    OWNER_HASH,
    OWNER_PASSWORD,
    SHOP_URL,
    ShopHarness,
    Shopper,
    create_shop,
    csrf_token,
    make_harness,
    shop_config,
)


def _paid_order(shop: ShopHarness, shopper: Shopper, *slugs: str) -> str:
    for slug in slugs:
        shopper.add(slug, 1)
    redirect = shopper.checkout()
    shopper.follow(shopper.get(shop.pay_on_gateway(redirect.headers["Location"])["redirectUrl"]))
    reference = shop.latest_reference()
    assert shop.order(reference).status == "paid"
    return reference


def _status_on(html: str) -> str:
    """The payment status's value; the badge shows its label (OrderStatus.label), in words."""
    match = re.search(r'data-payment-status="([a-z-]+)">([^<]+)<', html)
    assert match and match.group(2) == OrderStatus(match.group(1)).label
    return match.group(1)


def test_login_with_the_hashed_password(shopper: Shopper) -> None:
    page = shopper.get("/admin/login").get_data(as_text=True)
    assert re.search(r'<input [^>]*id="password" name="password"[^>]*type="password"', page)
    assert '<label for="password">Password</label>' in page
    assert 'data-action="login"' in page

    wrong = shopper.log_in("not the password")
    assert wrong.status_code == 400
    assert "That password is not right." in wrong.get_data(as_text=True)
    assert shopper.get("/admin/").status_code == 302

    right = shopper.log_in(next_path="/admin/?status=paid")
    assert right.status_code == 303
    assert right.headers["Location"] == "/admin/?status=paid"
    assert shopper.get("/admin/").status_code == 200

    logout = shopper.submit("/admin/", "/admin/logout")
    assert logout.status_code == 303
    assert shopper.get("/admin/").status_code == 302


def test_login_never_sends_the_owner_elsewhere(shop: ShopHarness) -> None:
    for target in ("https://evil.example/", "//evil.example/x", "/\\evil.example", "javascript:alert(1)"):
        answer = shop.shopper().log_in(next_path=target)
        assert answer.headers["Location"] == "/admin/", target


def test_an_owner_already_logged_in_skips_the_form(shopper: Shopper) -> None:
    shopper.log_in()
    answer = shopper.get("/admin/login?next=/gateway/admin/")
    assert answer.status_code == 302
    assert answer.headers["Location"] == "/gateway/admin/"


@pytest.mark.backends
def test_repeated_wrong_passwords_are_slowed_down(shopper: Shopper) -> None:
    for _ in range(login_guard.FREE_ATTEMPTS):
        assert shopper.log_in("wrong").status_code == 400
    blocked = shopper.log_in()  # even the right one, for a while
    assert blocked.status_code == 429
    assert "Too many wrong passwords" in blocked.get_data(as_text=True)


def test_the_extensions_admin_screens_are_behind_the_owner_login(shop: ShopHarness, shopper: Shopper) -> None:
    for path in (
        "/gateway/admin/",
        "/gateway/admin/install",
        "/gateway/admin/settings",
        "/gateway/admin/checkouts",
    ):
        answer = shopper.get(path)
        assert answer.status_code == 302, path
        assert answer.headers["Location"] == f"/admin/login?next={path}"

    shopper.log_in()
    status = shopper.get("/gateway/admin/")
    html = status.get_data(as_text=True)
    assert status.status_code == 200
    assert "demo-merchant" in html
    assert "Stoep admin" in html  # the shop's owner navigation wraps the gateway's screens
    assert 'href="/admin/"' in html
    assert shopper.get("/gateway/admin/install").status_code == 200
    assert shopper.get("/gateway/admin/settings").status_code == 200


def test_the_orders_list_shows_each_order_with_its_payment_status(
    shop: ShopHarness, shopper: Shopper
) -> None:
    paid = _paid_order(shop, shopper, "enamel-kettle")
    shopper.add("ilala-basket", 1)
    shopper.checkout()
    waiting = shop.latest_reference()

    owner = shop.shopper()
    owner.log_in()
    html = owner.get("/admin/").get_data(as_text=True)

    for reference, status in ((paid, "paid"), (waiting, "processing")):
        row = re.search(rf'<tr data-order-reference="{reference}">(.*?)</tr>', html, re.S)
        assert row, reference
        assert _status_on(row.group(1)) == status
        assert "/gateway/admin/checkouts/" in row.group(1)  # the gateway record, with its callbacks
    # The gateway's status in words, its code in the tooltip.
    gateway = dict(re.findall(r'data-gateway-status="([A-Z_]+)" title="[^"]*">([^<]+)<', html))
    assert gateway == {"PAID_PENDING_CALLBACK": "Paid - confirming", "PENDING_ORDER": "Awaiting payment"}
    only_paid = owner.get("/admin/?status=paid").get_data(as_text=True)
    assert paid in only_paid and waiting not in only_paid
    assert "data-setup-warnings" not in html


def test_the_orders_list_says_when_the_gateway_posts_callbacks_elsewhere(shop: ShopHarness) -> None:
    """A second shop (another address) that inherited this installation: the owner is told at once."""
    with shop.app.app_context():
        installation = db.session.scalars(select(Installation)).one()
        installation.callback_url = "http://127.0.0.1:6000/gateway/callback"
        db.session.commit()
    owner = shop.shopper()
    owner.log_in()
    html = unescape(owner.get("/admin/").get_data(as_text=True))
    assert "data-setup-warnings" in html
    assert (
        "The gateway sends its callbacks to http://127.0.0.1:6000/gateway/callback, but this shop receives "
        f"them at {SHOP_URL}/gateway/callback." in html
    )


def _confirmation(html: str) -> dict[str, str]:
    """The hidden fields of the refund confirmation form (what the owner's "Refund R ..." button sends)."""
    form = html.split("data-refund-confirm", 1)[1].split("</form>", 1)[0]
    return dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">', form))


def _refund(owner: Shopper, page: str, data: dict[str, str]) -> TestResponse:
    """Review the refund, then confirm what the confirmation shows."""
    review = owner.submit(page, f"{page}/refund", data)
    assert review.status_code == 200, review.get_data(as_text=True)
    return owner.post(f"{page}/refund", _confirmation(review.get_data(as_text=True)))


def test_refund_from_the_order_page_partly_then_fully(shop: ShopHarness, shopper: Shopper) -> None:
    reference = _paid_order(shop, shopper, "mohair-throw")  # R 1 199.00
    owner = shop.shopper()
    owner.log_in()
    page = f"/admin/orders/{reference}"
    html = owner.get(page).get_data(as_text=True)
    assert _status_on(html) == "paid"
    assert re.search(r'<input [^>]*name="amount" type="text" value=""[^>]*>', html)  # starts empty
    assert 'data-action="refund"' in html
    assert "Refund everything that is left (R 1 199.00)" in html
    assert re.search(r'href="/gateway/admin/checkouts/\d+"[^>]*data-gateway-checkout', html)

    # The first step only shows the amount: nothing is refunded before the owner confirms it.
    review = owner.submit(page, f"{page}/refund", {"amount": "199.00", "reason": "Scratched"})
    assert review.status_code == 200
    shown = unescape(review.get_data(as_text=True))
    assert "Refund R 199.00?" in shown and "Reason: “Scratched”" in shown
    assert 'data-action="confirm-refund"' in shown
    assert shop.order(reference).refunded_cents == 0
    confirmation = _confirmation(shown)
    assert confirmation["amount"] == "199.00" and confirmation["refunded_before"] == "0"

    partial = owner.post(f"{page}/refund", confirmation)
    assert partial.status_code == 303
    html = unescape(owner.get(page).get_data(as_text=True))
    assert "Refunded R 199.00." in html
    assert _status_on(html) == "partially-refunded"
    assert "refunded R 199.00: Scratched" in html  # the order's history
    assert shop.order(reference).refunded_cents == 19900

    # The same confirmation again (a second tab, a double submit) is shown for a new decision, not sent.
    again = owner.post(f"{page}/refund", confirmation)
    assert again.status_code == 409
    assert "This order was refunded meanwhile" in again.get_data(as_text=True)
    assert shop.order(reference).refunded_cents == 19900

    too_much = owner.submit(page, f"{page}/refund", {"amount": "1000.01"})
    assert too_much.status_code == 400
    assert "You can refund at most R 1 000.00 of this order." in unescape(too_much.get_data(as_text=True))
    nonsense = owner.submit(page, f"{page}/refund", {"amount": "ten"})
    assert nonsense.status_code == 400
    assert "Enter an amount in Rand such as 150.00" in nonsense.get_data(as_text=True)
    empty = owner.submit(page, f"{page}/refund", {"amount": ""})
    assert empty.status_code == 400
    assert "or choose to refund everything that is left" in empty.get_data(as_text=True)

    everything = owner.submit(page, f"{page}/refund", {"amount": "", "everything": "y"})
    assert "Refund R 1 000.00?" in everything.get_data(as_text=True)
    assert "(everything that is left)" in everything.get_data(as_text=True)
    owner.post(f"{page}/refund", _confirmation(everything.get_data(as_text=True)))
    html = owner.get(page).get_data(as_text=True)
    assert _status_on(html) == "refunded"
    assert 'data-action="refund"' not in html
    # The shopper's order page says so too.
    shopper_page = shopper.follow(shopper.get(f"/orders/{reference}")).get_data(as_text=True)
    assert _status_on(shopper_page) == "refunded"


def test_cancel_an_open_checkout_from_the_order_page(shop: ShopHarness, shopper: Shopper) -> None:
    shopper.add("enamel-kettle", 1)
    redirect = shopper.checkout()
    reference = shop.latest_reference()
    owner = shop.shopper()
    owner.log_in()
    page = f"/admin/orders/{reference}"
    assert 'data-action="cancel"' in owner.get(page).get_data(as_text=True)
    assert 'data-action="refund"' not in owner.get(page).get_data(as_text=True)

    owner.submit(page, f"{page}/cancel")

    html = owner.get(page).get_data(as_text=True)
    assert _status_on(html) == "cancelled"
    assert "CANCELLED_BY_MERCHANT" in html
    assert 'data-action="cancel"' not in html
    token = redirect.headers["Location"].rsplit("/", 1)[1]
    assert shop.emulator.pay(token).status_code != 200  # the payment page is closed for good


@pytest.mark.backends
def test_unknown_or_malformed_references_are_404(shop: ShopHarness, shopper: Shopper) -> None:
    shopper.log_in()
    for reference in ("STP-00000000", "nope", "STP-\x00", "x" * 300):
        assert shopper.get(f"/admin/orders/{reference}").status_code == 404, reference


def test_owner_actions_need_the_login_and_a_csrf_token(shop: ShopHarness, shopper: Shopper) -> None:
    reference = _paid_order(shop, shopper, "enamel-kettle")
    page = f"/admin/orders/{reference}"
    token = csrf_token(shopper.get("/products/enamel-kettle").get_data(as_text=True))
    confirmed = {"csrf_token": token, "amount": "10", "confirmed": "y", "refunded_before": "0"}
    assert shopper.post(f"{page}/refund", confirmed).status_code == 302  # to login
    assert shop.order(reference).refunded_cents == 0

    shopper.log_in()
    confirmed = {"amount": "10", "confirmed": "y", "refunded_before": "0"}
    assert shopper.post(f"{page}/refund", confirmed).status_code == 400  # no token
    assert shop.order(reference).refunded_cents == 0


def test_v1_orders_are_refunded_and_cannot_be_cancelled(databases, monkeypatch: pytest.MonkeyPatch) -> None:
    shop = make_harness(databases, monkeypatch, GATEWAY_API_VERSION="v1")
    shopper = shop.shopper()
    reference = _paid_order(shop, shopper, "brass-desk-lamp")
    shopper.add("enamel-kettle", 1)
    shopper.checkout()
    waiting = shop.latest_reference()
    owner = shop.shopper()
    owner.log_in()

    html = owner.get(f"/admin/orders/{waiting}").get_data(as_text=True)
    assert 'data-action="cancel"' not in html
    assert "A classic checkout cannot be cancelled by the shop" in html

    page = f"/admin/orders/{reference}"
    _refund(owner, page, {"amount": "1850"})
    assert _status_on(owner.get(page).get_data(as_text=True)) == "refunded"


# --- the password in the configuration --------------------------------------------------------------------


def test_production_refuses_to_start_without_a_hash(databases) -> None:
    config = shop_config(databases.url(), SHOP_ENV="production", SHOP_ADMIN_PASSWORD_HASH=None)
    with pytest.raises(ShopConfigError, match="SHOP_ADMIN_PASSWORD_HASH"):
        create_app(config)


def test_production_refuses_a_plain_password(databases) -> None:
    config = shop_config(databases.url(), SHOP_ENV="production", SHOP_ADMIN_PASSWORD="owner-password")
    with pytest.raises(ShopConfigError, match="development only"):
        create_app(config)


def test_production_starts_with_a_hash_and_secure_cookies(databases, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOP_ENV", "production")
    monkeypatch.setenv("SHOP_ADMIN_PASSWORD_HASH", OWNER_HASH)
    config = shop_config(databases.url())
    del config["SHOP_ADMIN_PASSWORD_HASH"]  # from the environment
    app = create_app(config)
    assert app.config["SHOP_ADMIN_PASSWORD_HASH"] == OWNER_HASH
    assert app.config["SESSION_COOKIE_SECURE"] is True


def test_a_plain_password_in_development_is_kept_only_as_a_hash(databases) -> None:
    app = create_app(
        shop_config(databases.url(), SHOP_ADMIN_PASSWORD_HASH=None, SHOP_ADMIN_PASSWORD="demo-owner")
    )
    stored = app.config["SHOP_ADMIN_PASSWORD_HASH"]
    assert check_password_hash(stored, "demo-owner")
    assert "SHOP_ADMIN_PASSWORD" not in app.config
    assert "demo-owner" not in repr(dict(app.config))


def test_without_any_password_nobody_can_log_in(databases) -> None:
    app = create_shop(shop_config(databases.url(), SHOP_ADMIN_PASSWORD_HASH=None))
    shopper = Shopper(app.test_client())
    assert "No owner password is set up" in shopper.get("/admin/login").get_data(as_text=True)
    for guess in ("", "admin", "password", OWNER_PASSWORD):
        assert shopper.log_in(guess).status_code == 400
    assert shopper.get("/gateway/admin/").status_code == 302


def test_a_malformed_hash_is_refused(databases) -> None:
    with pytest.raises(ShopConfigError, match="not a werkzeug password hash"):
        create_app(shop_config(databases.url(), SHOP_ADMIN_PASSWORD_HASH="owner-password"))


def test_the_hash_password_command(databases) -> None:
    app = create_app(shop_config(databases.url()))
    result = app.test_cli_runner().invoke(
        args=["shop", "hash-password", "--password", "a long owner password"]
    )
    assert result.exit_code == 0, result.output
    assert check_password_hash(result.output.strip(), "a long owner password")
    short = app.test_cli_runner().invoke(args=["shop", "hash-password", "--password", "short"])
    assert short.exit_code != 0
