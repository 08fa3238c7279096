"""The cart in the session: add, change a quantity, remove; its total and the payment option."""

from __future__ import annotations

import re
from html import unescape

from tests.shop.conftest import Shopper, csrf_token


def _total(html: str) -> str:
    match = re.search(r'data-cart-total data-cents="(\d+)">([^<]+)<', html)
    assert match, "no cart total on the page"
    return match.group(2)


def _count(html: str) -> int:
    match = re.search(r"data-cart-count>(\d+)<", html)
    assert match
    return int(match.group(1))


def test_add_to_cart_then_see_it_in_the_cart(shopper: Shopper) -> None:
    added = shopper.add("enamel-kettle", 2)

    assert added.status_code == 302
    assert added.headers["Location"] == "/products/enamel-kettle"
    product = shopper.get("/products/enamel-kettle").get_data(as_text=True)
    assert "Added 2 x Enamel stovetop kettle to your cart." in product
    assert _count(product) == 2

    cart = shopper.get("/cart").get_data(as_text=True)
    assert 'data-cart-line="enamel-kettle"' in cart
    assert _total(cart) == "R 798.00"
    assert "or 3 x R 266.00" in cart
    assert 'data-action="checkout"' in cart and 'href="/checkout"' in cart
    assert 'aria-label="Cart, 2 items"' in cart


def test_adding_again_adds_up_to_the_limit(shopper: Shopper) -> None:
    shopper.add("stoneware-mugs", 6)
    shopper.add("stoneware-mugs", 6)

    page = shopper.get("/products/stoneware-mugs").get_data(as_text=True)
    assert "You can order up to 10 of each item" in page
    assert _total(shopper.get("/cart").get_data(as_text=True)) == "R 2 890.00"


def test_update_and_remove_lines(shopper: Shopper) -> None:
    shopper.add("enamel-kettle", 1)
    shopper.add("ilala-basket", 1)

    updated = shopper.submit("/cart", "/cart/update", {"slug": "enamel-kettle", "quantity": "3"})
    assert updated.status_code == 302
    cart = shopper.get("/cart").get_data(as_text=True)
    assert "Enamel stovetop kettle: quantity updated to 3." in cart
    assert _total(cart) == "R 1 846.00"  # 3 x 399 + 649

    removed = shopper.submit("/cart", "/cart/remove/ilala-basket")
    assert removed.status_code == 302
    cart = shopper.get("/cart").get_data(as_text=True)
    assert "Removed Ilala palm basket from your cart." in cart
    assert 'data-cart-line="ilala-basket"' not in cart
    assert _total(cart) == "R 1 197.00"

    # Quantity 0 removes the line too; the cart is then empty.
    shopper.submit("/cart", "/cart/update", {"slug": "enamel-kettle", "quantity": "0"})
    assert "Your cart is empty." in shopper.get("/cart").get_data(as_text=True)


def test_a_wrong_quantity_is_explained_next_to_its_line(shopper: Shopper) -> None:
    shopper.add("enamel-kettle", 1)

    answer = shopper.submit("/cart", "/cart/update", {"slug": "enamel-kettle", "quantity": "11"})

    assert answer.status_code == 400
    html = answer.get_data(as_text=True)
    assert 'id="quantity-enamel-kettle-error">Choose a quantity from 0 to 10.' in html
    assert 'aria-invalid="true" aria-describedby="quantity-enamel-kettle-error"' in html
    assert _total(html) == "R 399.00"  # unchanged

    refused = shopper.submit("/products/enamel-kettle", "/cart/add/enamel-kettle", {"quantity": "0"})
    assert refused.status_code == 302
    assert "Choose a quantity from 1 to 10." in shopper.get("/products/enamel-kettle").get_data(as_text=True)


def test_unknown_products_and_missing_tokens_are_refused(shopper: Shopper) -> None:
    token = csrf_token(shopper.get("/products/enamel-kettle").get_data(as_text=True))
    assert shopper.post("/cart/add/nope", {"csrf_token": token, "quantity": "1"}).status_code == 404

    forged = shopper.post("/cart/add/enamel-kettle", {"quantity": "1"})  # no CSRF token
    assert forged.status_code == 400
    assert "Please try that again" in forged.get_data(as_text=True)
    assert "Your cart is empty." in shopper.get("/cart").get_data(as_text=True)


def test_the_payment_option_is_hidden_outside_the_merchants_limits(shopper: Shopper) -> None:
    # Below the minimum (R 50.00): one tin of rooibos, R 45.00.
    shopper.add("rooibos-tin", 1)
    cart = shopper.get("/cart").get_data(as_text=True)
    assert _total(cart) == "R 45.00"
    assert 'data-action="checkout"' not in cart
    assert "data-payment-unavailable" in cart
    checkout = shopper.get("/checkout").get_data(as_text=True)
    assert 'data-action="pay"' not in checkout and "data-payment-unavailable" in checkout

    # Within the limits: two tins, R 90.00.
    shopper.add("rooibos-tin", 1)
    cart = shopper.get("/cart").get_data(as_text=True)
    assert 'data-action="checkout"' in cart
    assert 'data-action="pay"' in shopper.get("/checkout").get_data(as_text=True)

    # Above the maximum (R 50 000.00): five rugs, R 62 500.00; the form is refused even when posted.
    shopper.submit("/cart", "/cart/remove/rooibos-tin")
    shopper.add("woven-rug", 5)
    cart = shopper.get("/cart").get_data(as_text=True)
    assert _total(cart) == "R 62 500.00"
    assert 'data-action="checkout"' not in cart
    refused = shopper.checkout()
    assert refused.status_code == 409
    assert "isn't available for this order total" in unescape(refused.get_data(as_text=True))
