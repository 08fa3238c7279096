"""The checkout form: clear messages for every mistake, tied to their fields, and nothing sent on error."""

from __future__ import annotations

import re
from html import unescape
from urllib.parse import urlsplit

import pytest
from flask.sessions import SecureCookieSessionInterface

from example_shop.forms import normalise_phone, parse_rand
from tests.shop.conftest import CUSTOMER, SHOP_URL, ShopHarness, Shopper


def _field_errors(html: str) -> dict[str, str]:
    """``{field id: message}`` of the messages shown next to the fields."""
    found = re.findall(
        r'<p class="field-error" id="([a-z0-9_]+)-error"><span class="visually-hidden">Error:</span> ([^<]+)</p>',
        html,
    )
    return {field: unescape(message) for field, message in found}


def test_the_empty_form_explains_every_required_field(shop: ShopHarness, shopper: Shopper) -> None:
    shopper.add("enamel-kettle")

    answer = shopper.checkout(**{**dict.fromkeys(CUSTOMER, ""), "shipping_same": "y"})

    assert answer.status_code == 400
    html = answer.get_data(as_text=True)
    assert _field_errors(html) == {
        "first_name": "Enter your first name.",
        "last_name": "Enter your last name.",
        "email": "Enter your email address.",
        "phone": "Enter your mobile number.",
        "billing_line1": "Enter the street address.",
        "billing_city": "Enter the town or city.",
        "billing_province": "Enter the province.",
        "billing_postal_code": "Enter the postal code.",
    }
    # The summary at the top links to each field; the fields point at their messages.
    assert "Please check these 8 details" in html
    assert '<a href="#first_name">Enter your first name.</a>' in html
    assert re.search(
        r'<input aria-describedby="first_name-error" aria-invalid="true"[^>]*id="first_name"', html
    )
    assert "<title>Error: Checkout · Stoep</title>" in html
    assert shop.order_count() == 0  # no order placed, nothing sent to the gateway


def test_wrong_values_get_messages_saying_how_to_fix_them(shopper: Shopper) -> None:
    shopper.add("enamel-kettle")

    answer = shopper.checkout(
        email="thandi.example.com", phone="12345", billing_postal_code="80O1", billing_province="Atlantis"
    )

    assert answer.status_code == 400
    assert _field_errors(answer.get_data(as_text=True)) == {
        "email": "Enter an email address like name@example.com.",
        "phone": "Enter a South African mobile number, such as 082 123 4567 or +27 82 123 4567.",
        "billing_postal_code": "Enter the 4-digit postal code, such as 8001.",
        "billing_province": "Choose the province from the list.",
    }
    # What the shopper typed stays in the form.
    assert 'value="thandi.example.com"' in answer.get_data(as_text=True)


@pytest.mark.backends
def test_control_characters_are_refused_not_stored(shop: ShopHarness, shopper: Shopper) -> None:
    shopper.add("enamel-kettle")

    answer = shopper.checkout(first_name="Tha\x00ndi", billing_line1="1 Long\x07 Street")

    assert answer.status_code == 400
    errors = _field_errors(answer.get_data(as_text=True))
    assert errors["first_name"].startswith("Remove the special characters")
    assert errors["billing_line1"].startswith("Remove the special characters")
    assert shop.order_count() == 0


def test_a_separate_delivery_address_is_required_only_when_asked_for(
    shop: ShopHarness, shopper: Shopper
) -> None:
    shopper.add("enamel-kettle")

    answer = shopper.checkout(shipping_same=None)  # the box unticked

    assert answer.status_code == 400
    assert _field_errors(answer.get_data(as_text=True)) == {
        "shipping_line1": "Enter the delivery street address, or tick 'Deliver to my billing address'.",
        "shipping_city": "Enter the delivery town or city, or tick 'Deliver to my billing address'.",
        "shipping_province": "Enter the delivery province, or tick 'Deliver to my billing address'.",
        "shipping_postal_code": "Enter the delivery postal code, or tick 'Deliver to my billing address'.",
    }

    sent = shopper.checkout(
        shipping_same=None,
        shipping_line1="7 Church Street",
        shipping_city="Stellenbosch",
        shipping_province="Western Cape",
        shipping_postal_code="7600",
    )
    assert sent.status_code == 303
    order = shop.order(shop.latest_reference())
    assert order.shipping_address["city"] == "Stellenbosch"
    assert order.billing_address["city"] == "Cape Town"
    assert order.phone == "+27821234567"


def test_the_checkout_page_shows_the_form_with_delivery_to_billing_ticked(shopper: Shopper) -> None:
    shopper.add("enamel-kettle")
    html = shopper.get("/checkout").get_data(as_text=True)

    for name in (*CUSTOMER, "shipping_line1", "shipping_city", "shipping_province", "shipping_postal_code"):
        assert f'name="{name}"' in html, name
    assert re.search(r'<input[^>]*checked[^>]*id="shipping_same"', html)
    assert 'data-action="pay"' in html
    assert "or 3 x R 133.00" in html
    assert "<form" in html and "novalidate" in html  # the server's messages, not the browser's


def _value(html: str, name: str) -> str | None:
    tag = re.search(rf'<(?:input|select)[^>]*name="{name}"[^>]*>', html)
    assert tag, name
    if tag[0].startswith("<select"):
        selected = re.search(rf'name="{name}".*?<option selected value="([^"]*)"', html, re.S)
        return unescape(selected[1]) if selected else None
    value = re.search(r'value="([^"]*)"', tag[0])
    return unescape(value[1]) if value else None


def test_a_second_order_starts_with_the_shoppers_details(shop: ShopHarness, shopper: Shopper) -> None:
    shopper.add("enamel-kettle")
    first = shopper.checkout(
        shipping_same=None,
        shipping_line1="9 Dorp Street",
        shipping_city="Stellenbosch",
        shipping_province="Western Cape",
        shipping_postal_code="7600",
    )
    shopper.follow(shopper.get(shop.pay_on_gateway(first.headers["Location"])["redirectUrl"]))
    assert shopper.get("/cart").get_data(as_text=True).count("data-cart-line") == 0  # paid: cart emptied

    shopper.add("stoneware-mugs")
    html = shopper.get("/checkout").get_data(as_text=True)
    assert _value(html, "first_name") == "Thandi" and _value(html, "last_name") == "Mokoena"
    assert _value(html, "email") == "thandi@example.com"
    assert _value(html, "phone") == "+27821234567"
    assert _value(html, "billing_line1") == "1 Long Street" and _value(html, "billing_postal_code") == "8001"
    assert _value(html, "billing_province") == "Western Cape"
    assert not re.search(r'<input[^>]*checked[^>]*id="shipping_same"', html)  # delivered elsewhere last time
    assert (
        _value(html, "shipping_line1") == "9 Dorp Street" and _value(html, "shipping_city") == "Stellenbosch"
    )
    # Read from the shop's order, never kept in the session cookie (which the browser can read).
    cookie = shopper.client.get_cookie("stoep_session", domain=urlsplit(SHOP_URL).hostname or "")
    assert cookie is not None
    interface = shop.app.session_interface
    assert isinstance(interface, SecureCookieSessionInterface)
    serializer = interface.get_signing_serializer(shop.app)
    assert serializer is not None
    session = serializer.loads(cookie.value)
    assert "orders" in session and "Mokoena" not in repr(session) and "Long Street" not in repr(session)

    # Another browser starts with an empty form.
    other = shop.shopper()
    other.add("stoneware-mugs")
    assert _value(other.get("/checkout").get_data(as_text=True), "first_name") in (None, "")


def test_an_empty_cart_goes_back_to_the_cart(shopper: Shopper) -> None:
    answer = shopper.get("/checkout")
    assert answer.status_code == 302
    assert answer.headers["Location"] == "/cart"


def test_phone_numbers_and_amounts() -> None:
    assert normalise_phone("082 123 4567") == "+27821234567"
    assert normalise_phone("+27 (82) 123-4567") == "+27821234567"
    assert normalise_phone("27821234567") == "+27821234567"
    for wrong in ("021 123 4567", "0821234567 8", "+44 20 7946 0958", "phone"):
        try:
            normalise_phone(wrong)
        except ValueError:
            continue
        raise AssertionError(f"{wrong!r} was accepted")
    assert parse_rand("150") == 15000
    assert parse_rand("R 1 234.5") == 123450
    assert parse_rand("0.01") == 1
    for wrong in ("1,50", "-5", "1.234", "1e3", ""):
        try:
            parse_rand(wrong)
        except ValueError:
            continue
        raise AssertionError(f"{wrong!r} was accepted")


def test_an_email_that_would_write_into_the_owners_mailto_link_is_refused(
    shop: ShopHarness, shopper: Shopper
) -> None:
    shopper.add("enamel-kettle")
    for email in (
        "thandi@example.com?subject=Refund%20me&body=Pay%20to%20...",
        "thandi@example.com&cc=all@example.com",
        "thandi@example.com#x",
        "thandi@example.com/x",
    ):
        answer = shopper.checkout(email=email)
        assert answer.status_code == 400, email
        assert _field_errors(answer.get_data(as_text=True)) == {
            "email": "Enter an email address like name@example.com."
        }
    assert shop.order_count() == 0


def test_the_owners_mailto_link_is_encoded(shop: ShopHarness, shopper: Shopper) -> None:
    from example_shop.extensions import db
    from example_shop.models import Order

    shopper.add("enamel-kettle")
    shopper.checkout()
    reference = shop.latest_reference()
    with shop.app.app_context():  # an address stored before the stricter check
        order = db.session.query(Order).filter_by(reference=reference).one()
        order.email = "a@b.com?subject=x&body=y"
        db.session.commit()
    owner = shop.shopper()
    owner.log_in()
    html = owner.get(f"/admin/orders/{reference}").get_data(as_text=True)
    assert 'href="mailto:a%40b.com%3Fsubject%3Dx%26body%3Dy"' in html
    assert "mailto:a@b.com?subject" not in html
