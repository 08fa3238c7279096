"""Below or above the merchant's limits, the cart and the checkout say the range Pay in 3 is offered for
(issue 28, point 4): "Pay in 3 is available from R 50.00 to R 50 000.00", and how far the total is from it;
with two merchant accounts, the range of the cart's account; when the shop does not know the limits (not
installed: the gateway did not answer), they say so and show no number."""

from __future__ import annotations

import re
from html import unescape

import pytest
from sqlalchemy import select

from flask_gateway.models import Installation
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.shop.conftest import Shopper, make_harness
from tests.shop.test_brands import SECOND, STOEP_PRODUCT, VUURHOUT_PRODUCT, two_brand_shop

RANGE = "Pay in 3 is available from R 50.00 to R 50 000.00."


def _notice(html: str) -> str:
    """The text of the payment-unavailable notice, tags stripped and spaces collapsed."""
    match = re.search(r"<div[^>]*data-payment-unavailable[^>]*>(.*?)</div>", html, re.S)
    assert match, "no payment-unavailable notice on the page"
    return " ".join(unescape(re.sub(r"<[^>]+>", "", match.group(1))).split())


def test_below_the_minimum_the_cart_and_the_checkout_say_the_range(shopper: Shopper) -> None:
    shopper.add("rooibos-tin", 1)  # R 45.00

    cart = shopper.get("/cart").get_data(as_text=True)
    assert 'data-action="checkout"' not in cart
    notice = _notice(cart)
    assert notice.startswith(RANGE), notice
    assert "Your total is R 45.00: add R 5.00 or more to pay in 3 interest-free instalments." in notice
    assert "isn't available for this total" not in notice
    assert 'data-minimum-cents="5000" data-maximum-cents="5000000"' in cart

    checkout = shopper.get("/checkout").get_data(as_text=True)
    notice = _notice(checkout)
    assert notice.startswith(RANGE), notice
    assert "add R 5.00 or more" in notice and "Change your cart to continue." in notice


def test_above_the_maximum_the_cart_and_the_refused_checkout_say_the_range(shopper: Shopper) -> None:
    shopper.add("woven-rug", 5)  # R 62 500.00

    notice = _notice(shopper.get("/cart").get_data(as_text=True))
    assert notice.startswith(RANGE), notice
    assert "Your total is R 62 500.00: remove R 12 500.00 or more" in notice

    refused = shopper.checkout()  # posted anyway: refused, and the page says the range
    assert refused.status_code == 409
    assert _notice(refused.get_data(as_text=True)).startswith(RANGE)


def test_within_the_limits_there_is_no_notice(shopper: Shopper) -> None:
    shopper.add("rooibos-tin", 2)  # R 90.00
    cart = shopper.get("/cart").get_data(as_text=True)
    assert "data-payment-unavailable" not in cart and 'data-action="checkout"' in cart


def test_unknown_limits_are_said_without_a_number(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Not installed (the gateway did not answer ``shop install``): no limits, and no invented ones."""
    bare = make_harness(databases, monkeypatch, install=False)
    shopper = bare.shopper()
    shopper.add("rooibos-tin", 1)

    for page in ("/cart", "/checkout"):
        html = shopper.get(page).get_data(as_text=True)
        notice = _notice(html)
        assert notice.startswith("Pay in 3 isn't available right now."), notice
        assert "minimum and maximum order totals" in notice
        assert not re.search(r"R \d", notice), notice  # no amount the shop does not know
        assert "data-limits-unknown" in html and "data-minimum-cents" not in html


@pytest.mark.backends
def test_with_two_accounts_the_range_is_the_cart_accounts(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Vuurhout's account has a higher minimum (R 3 000.00): its cart says Vuurhout's range; a Stoep cart of
    the same total is offered Pay in 3 on Stoep's account."""
    shop = two_brand_shop(databases, monkeypatch)
    with shop.app.app_context():
        session = get_state().session
        vuurhout = session.scalars(
            select(Installation).where(Installation.merchant_account_id == SECOND)
        ).one()
        vuurhout.minimum_cents = 300000
        session.commit()

    buyer = shop.shopper()
    buyer.add(VUURHOUT_PRODUCT)  # R 2 499.00
    notice = _notice(buyer.get("/cart").get_data(as_text=True))
    assert notice.startswith("Pay in 3 is available from R 3 000.00 to R 50 000.00."), notice
    assert "add R 501.00 or more" in notice

    stoep = shop.shopper()
    stoep.add(STOEP_PRODUCT)  # R 1 199.00, within Stoep's account's limits
    assert 'data-action="checkout"' in stoep.get("/cart").get_data(as_text=True)
