"""The storefront: products with their images and the gateway's instalment hint; nothing from elsewhere."""

from __future__ import annotations

import re

from example_shop.catalog import PRODUCTS, find
from tests.shop.conftest import Shopper, make_harness


def test_the_catalog_shows_every_product_with_its_image_price_and_hint(shopper: Shopper) -> None:
    page = shopper.get("/")
    html = page.get_data(as_text=True)

    assert page.status_code == 200
    assert len(PRODUCTS) >= 6
    slugs = re.findall(r'<a class="card-link" href="/products/([^"]+)" data-product-slug="([^"]+)"', html)
    assert [href for href, _ in slugs] == [product.slug for product in PRODUCTS]
    assert all(href == slug for href, slug in slugs)
    for product in PRODUCTS:
        assert f'src="/static/{product.image_path}" alt="{product.name}"' in html
    # Prices as "R 1 234.00"; hints from the gateway's payment plan: amount // 3 each, the cents that do
    # not divide evenly with the first instalment, exactly as the gateway charges them.
    assert "R 399.00" in html and "or 3 x R 133.00" in html
    assert 'data-instalments="13300 13300 13300"' in html
    assert "R 12 500.00" in html and "or R 4 166.68 now, then 2 x R 4 166.66" in html
    assert 'data-instalments="416668 416666 416666"' in html
    cards = re.findall(r'data-product-slug="([^"]+)".*?(?:data-instalments="([\d ]+)"|</li>)', html, re.S)
    for slug, amounts in cards:
        card_product = find(slug)
        assert card_product is not None
        if amounts:  # the instalments add up to the price, the first carrying the odd cents
            cents = [int(a) for a in amounts.split()]
            price = card_product.price_cents
            assert sum(cents) == price and cents[0] - cents[1] == price % 3
    # R 45.00 is below the merchant's minimum (R 50.00): no hint for the rooibos tin.
    assert html.count("data-instalment-hint") == len(PRODUCTS) - 1


def test_every_product_image_is_a_shipped_svg(shopper: Shopper) -> None:
    for product in PRODUCTS:
        image = shopper.get(f"/static/{product.image_path}")
        assert image.status_code == 200, product.image
        assert image.mimetype == "image/svg+xml"
        svg = image.get_data(as_text=True)
        assert "<title" in svg  # an accessible name when opened on its own
        assert "http://" not in svg.replace("http://www.w3.org/2000/svg", "")
        assert "https://" not in svg
        image.close()


def test_a_category_filters_the_catalog(shopper: Shopper) -> None:
    html = shopper.get("/?category=Lighting").get_data(as_text=True)
    assert 'data-product-slug="brass-desk-lamp"' in html
    assert 'data-product-slug="enamel-kettle"' not in html
    # An unknown category shows everything rather than an empty page.
    assert shopper.get("/?category=Nope").get_data(as_text=True).count("data-product-slug=") == len(PRODUCTS)


def test_the_product_page_has_the_hint_quantity_and_add_button(shopper: Shopper) -> None:
    page = shopper.get("/products/enamel-kettle")
    html = page.get_data(as_text=True)

    assert page.status_code == 200
    assert "<h1>Enamel stovetop kettle</h1>" in html
    assert "or 3 x R 133.00" in html
    assert re.search(r'<input id="quantity" name="quantity" type="number"[^>]*value="1"', html)
    assert '<label for="quantity">Quantity</label>' in html
    assert 'data-action="add-to-cart"' in html
    assert shopper.get("/products/no-such-thing").status_code == 404


def test_pages_load_nothing_from_elsewhere_and_forbid_it(shopper: Shopper) -> None:
    for path in ("/", "/products/ilala-basket", "/cart"):
        page = shopper.get(path)
        html = page.get_data(as_text=True)
        assert not re.search(r'(?:src|href)="(?:https?:)?//', html), path
        policy = page.headers["Content-Security-Policy"]
        assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
        assert "<script>" not in html and " style=" not in html  # nothing inline: the policy allows none


def test_without_an_installation_there_is_no_hint_and_no_checkout(databases, monkeypatch) -> None:
    bare = make_harness(databases, monkeypatch, install=False)
    shopper = bare.shopper()
    assert "data-instalment-hint" not in shopper.get("/").get_data(as_text=True)
    shopper.add("enamel-kettle")
    cart = shopper.get("/cart").get_data(as_text=True)
    assert 'data-action="checkout"' not in cart
    assert "data-payment-unavailable" in cart


def test_the_catalog_module_is_consistent() -> None:
    slugs = [product.slug for product in PRODUCTS]
    skus = [product.sku for product in PRODUCTS]
    assert len(set(slugs)) == len(slugs) and len(set(skus)) == len(skus)
    assert all(isinstance(p.price_cents, int) and p.price_cents > 0 for p in PRODUCTS)
    assert find("enamel-kettle") is PRODUCTS[0]
    assert find("nope") is None


def test_the_favicon_is_the_shipped_svg(shopper: Shopper) -> None:
    answer = shopper.get("/favicon.ico")
    assert answer.status_code == 301
    assert answer.headers["Location"] == "/static/shop/favicon.svg"
