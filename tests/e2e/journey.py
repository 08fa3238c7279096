"""What a shopper and the owner do in the browser, step by step, shared by the e2e tests and
scripts/take-screenshots.py. Selectors are the stable ones of docs/example-shop.md ("Selectors for
browser tests"); form fields are found by their labels, as a person finds them.

The emulator's control API (``/_emulator/...``) is read over real HTTP with ``requests``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import requests
from playwright.sync_api import Page, expect

from tests.e2e.conftest import OWNER_PASSWORD, Stack

ROOT = Path(__file__).resolve().parents[2]
#: The longest wait for something the shop or the emulator does by itself (a callback, a poll): a last
#: resort (about a second on a quiet machine), as long as ``tests.processes.WAIT_DEADLINE``.
SETTLE_MS = 60_000
#: The emulator's hosted payment pages (v2 ``paymentUrl``, v1 ``redirect_to``); group 1 is the token.
#: (Plain groups: Playwright hands the pattern to the browser's JavaScript RegExp.)
PAYMENT_PAGE = re.compile(r"/api/v[12]/app/checkout/([^/?#]+)$")
ORDER_PAGE = re.compile(r"/orders/view/[^/]+$")


@dataclass(frozen=True)
class Customer:
    first_name: str = "Thandi"
    last_name: str = "Nkosi"
    email: str = "thandi@example.com"
    phone: str = "082 123 4567"
    street: str = "12 Long Street"
    city: str = "Cape Town"
    province: str = "Western Cape"
    postal_code: str = "8001"


THANDI = Customer()


# --- the shopper ------------------------------------------------------------------------------------------


def cart_count(page: Page) -> int:
    return int(page.locator("[data-cart-count]").inner_text())


def open_product(page: Page, shop_url: str, slug: str) -> None:
    """From the catalog (the header's "Shop" link, or the home page), click the product's card."""
    if page.url.startswith(shop_url):
        page.get_by_role("navigation", name="Main").get_by_role("link", name="Shop").click()
        expect(page).to_have_url(shop_url + "/")  # not a card of the page being left ("More from ...")
    else:
        page.goto(shop_url + "/")
    page.locator(f'a[data-product-slug="{slug}"]').click()
    expect(page).to_have_url(re.compile(rf"/products/{re.escape(slug)}$"))


def add_to_cart(page: Page, shop_url: str, slug: str, quantity: int = 1) -> None:
    """Open the product from the catalog, set the quantity, add it; the header's count follows."""
    open_product(page, shop_url, slug)
    before = cart_count(page)
    page.get_by_label("Quantity", exact=True).fill(str(quantity))
    page.locator('button[data-action="add-to-cart"]').click()
    expect(page.locator("[data-cart-count]")).to_have_text(str(before + quantity))


def fill_checkout(page: Page, customer: Customer = THANDI) -> None:
    """The checkout form, by its labels (delivery to the billing address, the default)."""
    page.get_by_label("First name", exact=True).fill(customer.first_name)
    page.get_by_label("Last name", exact=True).fill(customer.last_name)
    page.get_by_label("Email address", exact=True).fill(customer.email)
    page.get_by_label("Mobile number", exact=True).fill(customer.phone)
    billing = page.get_by_role("group", name="Billing address")
    billing.get_by_label("Street address", exact=True).fill(customer.street)
    billing.get_by_label("Town or city", exact=True).fill(customer.city)
    billing.get_by_label("Province", exact=True).select_option(customer.province)
    billing.get_by_label("Postal code", exact=True).fill(customer.postal_code)
    expect(page.get_by_label("Deliver to my billing address")).to_be_checked()


def check_out(page: Page, customer: Customer = THANDI) -> str:
    """From any shop page: cart, checkout, the form, submit; lands on the gateway's page. Returns its token.

    The cart's total must be the one the gateway shows.
    """
    page.locator('a[data-nav="cart"]').click()
    total = page.locator("[data-cart-total]").inner_text()
    page.locator('a[data-action="checkout"]').click()
    expect(page).to_have_url(re.compile(r"/checkout$"))
    fill_checkout(page, customer)
    page.locator('button[data-action="pay"]').click()  # 303 See Other to the gateway
    expect(page).to_have_url(PAYMENT_PAGE)
    expect(page.get_by_role("heading", level=1)).to_contain_text("Pay for order")
    expect(page.locator("#checkout-total")).to_have_text(total)
    found = PAYMENT_PAGE.search(page.url)
    assert found is not None
    return found[1]


def pay_on_gateway(page: Page) -> None:
    """Click Pay on the emulator's page; the shopper comes back to the shop's order page."""
    page.get_by_role("button", name="Pay", exact=True).click()
    expect(page).to_have_url(ORDER_PAGE)


def mark_page(page: Page) -> None:
    """Leave a mark in the page's window: it survives only as long as the page is not reloaded."""
    page.evaluate("window.__e2eMark = 'not reloaded'")


def assert_not_reloaded(page: Page) -> None:
    assert page.evaluate("window.__e2eMark") == "not reloaded", "the page was reloaded"


def order_reference(page: Page) -> str:
    return page.locator("[data-order-reference]").inner_text().strip()


def buy_and_pay(page: Page, stack: Stack, products: dict[str, int]) -> tuple[str, str]:
    """The whole v2 purchase up to "paid" on the order page; returns (order reference, gateway token)."""
    for slug, quantity in products.items():
        add_to_cart(page, stack.shop.url, slug, quantity)
    token = check_out(page)
    pay_on_gateway(page)
    expect(page.locator("[data-payment-status]")).to_have_attribute(
        "data-payment-status", "paid", timeout=SETTLE_MS
    )
    return order_reference(page), token


# --- the owner --------------------------------------------------------------------------------------------


def log_in_owner(page: Page, shop_url: str) -> None:
    """Open the admin, get sent to the login page, log in, come back to the orders."""
    page.goto(shop_url + "/admin/")
    expect(page).to_have_url(re.compile(r"/admin/login"))
    page.get_by_label("Password", exact=True).fill(OWNER_PASSWORD)
    page.locator('button[data-action="login"]').click()
    expect(page).to_have_url(re.compile(r"/admin/$"))


def open_admin_order(page: Page, reference: str) -> None:
    """From the orders list, open one order."""
    page.locator(f'tr[data-order-reference="{reference}"]').get_by_role("link", name=reference).click()
    expect(page.locator("[data-order-reference]")).to_have_text(reference)


# --- the emulator's control API and the shop's command line ----------------------------------------------


def emulator_get(stack: Stack, path: str, **params: str) -> Any:
    response = requests.get(f"{stack.emulator.url}/_emulator/{path}", params=params, timeout=10)
    response.raise_for_status()
    return response.json()


def emulator_post(stack: Stack, path: str, body: dict[str, Any] | None = None) -> Any:
    response = requests.post(f"{stack.emulator.url}/_emulator/{path}", json=body or {}, timeout=15)
    response.raise_for_status()
    return response.json()


def emulator_delete(stack: Stack, path: str) -> Any:
    response = requests.delete(f"{stack.emulator.url}/_emulator/{path}", timeout=10)
    response.raise_for_status()
    return response.json()


def delivered_callbacks(stack: Stack, token: str) -> list[dict[str, Any]]:
    """The callback attempts the emulator made for ``token`` that the shop answered with 200."""
    attempts = emulator_get(stack, "callbacks", checkoutToken=token, kind="callback")["callbacks"]
    return [a for a in attempts if a["ok"] and a["httpStatus"] == 200]


def parse_timestamp(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def run_shop_command(stack: Stack, *args: str) -> subprocess.CompletedProcess[str]:
    """``flask --app example_shop ARGS`` in a separate process, with the running shop's environment."""
    return subprocess.run(
        [sys.executable, "-m", "flask", "--app", "example_shop", *args],
        env={**os.environ, **stack.shop_env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
