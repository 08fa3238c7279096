"""What a shopper and an owner read, in a real Chromium against the shop and the emulator as processes.

- The instalment hint is the plan the gateway charges: the same three amounts (the first carrying the
  cents that do not divide evenly) on the catalog card, the product page, the cart, the checkout and the
  gateway's own payment page.
- The owner reads statuses and callback outcomes in words, the gateway's codes kept beside them; once the
  shop has acknowledged the payment callback, the shop and the gateway both say "Paid".
- A second order starts with the shopper's details.
- No page scrolls sideways on a 375 px wide phone: every page of the shop, its admin, the gateway's
  admin screens, the gateway's payment pages and the emulator's dashboard, reached by following links
  (and by the forms that lead to a page of their own).
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urldefrag, urlsplit

from playwright.sync_api import Browser, Page, ViewportSize, expect

from tests.e2e.conftest import OWNER_PASSWORD, Stack
from tests.e2e.journey import (
    PAYMENT_PAGE,
    SETTLE_MS,
    add_to_cart,
    buy_and_pay,
    check_out,
    delivered_callbacks,
    emulator_get,
    log_in_owner,
    open_admin_order,
    open_product,
    pay_on_gateway,
)
from tests.processes import wait_for

STATUS = "[data-payment-status]"
HINT = "[data-instalment-hint]"


def instalments(page: Page, selector: str = HINT) -> list[int]:
    return [
        int(cents) for cents in (page.locator(selector).first.get_attribute("data-instalments") or "").split()
    ]


def test_the_hint_is_the_plan_the_gateway_charges_on_every_page(stack: Stack, page: Page) -> None:
    shop = stack.shop.url
    # R 289.00 does not divide by 3: the first instalment carries the odd cent, as the gateway charges it.
    page.goto(shop + "/")
    card = page.locator('a[data-product-slug="stoneware-mugs"]')
    expect(card.locator(HINT)).to_have_text("or R 96.34 now, then 2 x R 96.33")
    expect(card.locator(HINT)).to_have_attribute("data-instalments", "9634 9633 9633")
    open_product(page, shop, "stoneware-mugs")
    expect(page.locator(HINT).first).to_contain_text("or R 96.34 now, then 2 x R 96.33")
    assert instalments(page) == [9634, 9633, 9633]

    add_to_cart(page, shop, "stoneware-mugs")
    add_to_cart(page, shop, "enamel-kettle")  # R 289.00 + R 399.00 = R 688.00
    page.locator('a[data-nav="cart"]').click()
    expect(page.locator(HINT)).to_have_text("or R 229.34 now, then 2 x R 229.33 interest-free")
    cart_plan = instalments(page)
    assert cart_plan == [22934, 22933, 22933] and sum(cart_plan) == 68800
    page.locator('a[data-action="checkout"]').click()
    assert instalments(page) == cart_plan

    check_out(page)
    charged = [
        int(c)
        for c in page.locator("[data-instalment-cents]").evaluate_all(
            "items => items.map(item => item.dataset.instalmentCents)"
        )
    ]
    assert charged == cart_plan  # what the shop promised is what the gateway's page charges
    expect(page.locator("#plan")).to_contain_text("R 229.34")


def test_the_owner_reads_words_and_the_shop_and_gateway_agree(
    stack: Stack, page: Page, browser: Browser
) -> None:
    shopper = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        shopper_page = shopper.new_page()
        reference, token = buy_and_pay(shopper_page, stack, {"enamel-kettle": 1})
        wait_for(
            lambda: delivered_callbacks(stack, token),
            what="the delivered callback",
            logs=[stack.emulator, stack.shop],
        )
        assert emulator_get(stack, f"checkouts/{token}")["checkoutPaymentStatus"] == "PAID"

        # A second order: the checkout form starts with the details of the first.
        add_to_cart(shopper_page, stack.shop.url, "ilala-basket")
        shopper_page.goto(stack.shop.url + "/checkout")
        expect(shopper_page.get_by_label("First name", exact=True)).to_have_value("Thandi")
        expect(shopper_page.get_by_label("Email address", exact=True)).to_have_value("thandi@example.com")
        billing = shopper_page.get_by_role("group", name="Billing address")
        expect(billing.get_by_label("Street address", exact=True)).to_have_value("12 Long Street")
        expect(billing.get_by_label("Province", exact=True)).to_have_value("Western Cape")
    finally:
        shopper.close()

    log_in_owner(page, stack.shop.url)
    row = page.locator(f'tr[data-order-reference="{reference}"]')
    expect(row.locator(STATUS)).to_have_text("Paid")
    # The shop recorded PAID when it acknowledged the callback: it says what the gateway says.
    expect(row.locator("[data-gateway-status]")).to_have_text("Paid")
    expect(row.locator("[data-gateway-status]")).to_have_attribute("data-gateway-status", "PAID")
    expect(page.locator("[data-setup-warnings]")).to_have_count(0)  # nothing to warn about here

    open_admin_order(page, reference)
    page.locator("a[data-gateway-checkout]").click()
    facts = page.locator("dl.facts").first
    expect(facts.locator(".gateway-status").first).to_have_text("Paid")
    expect(facts.locator("[data-status-code]")).to_have_attribute("data-status-code", "PAID")
    callbacks = page.get_by_role("region", name="Callbacks received")
    expect(callbacks.locator("[data-callback-outcome]")).to_have_count(1)
    expect(callbacks.locator(".gateway-status")).to_have_text("Recorded")
    # Before or after the return page's own status check, whichever came first: either way, now PAID.
    expect(callbacks).to_contain_text(re.compile(r"(Awaiting payment|Paid - confirming) → Paid"))
    timeline = page.get_by_role("region", name="Timeline")
    expect(timeline).to_contain_text("Gateway callback")
    # One line or two: the return page's check and the callback each record what they saw, in either order.
    expect(timeline.locator('[data-status="PAID"]').first).to_have_text("Paid")
    # Words on every badge: no gateway code is what a person reads first.
    for badge in page.locator(".gateway-status").all_inner_texts():
        assert not re.fullmatch(r"[A-Z_]+", badge), badge
    expect(page.locator("[data-setup-warnings]")).to_have_count(0)
    page.get_by_role("navigation", name="Payment gateway admin").get_by_role("link", name="Status").click()
    expect(page.locator("[data-setup-warnings]")).to_have_count(0)  # the emulator allows local addresses


# --- 375 px -----------------------------------------------------------------------------------------------

NARROW: ViewportSize = {"width": 375, "height": 812}
_OVERFLOW = """() => {
  const width = document.documentElement.clientWidth;
  const scroll = document.documentElement.scrollWidth;
  if (scroll <= width) return null;
  const wide = [...document.querySelectorAll("body *")]
    .filter((element) => element.getBoundingClientRect().right > width + 1)
    .slice(-5)
    .map((element) => `${element.tagName.toLowerCase()}.${[...element.classList].join(".")}`
      + ` right=${Math.round(element.getBoundingClientRect().right)}`);
  return { scroll, width, wide };
}"""


#: Every order reference (``STP-7K3M9QX2``) a reader sees whose letters are laid out on more than one line
#: (the browser broke it, at its hyphen or anywhere): the reference, with the element holding it.
_BROKEN_REFERENCES = """() => {
  const broken = [];
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  for (let node = walker.nextNode(); node; node = walker.nextNode()) {
    const holder = node.parentElement;
    if (!holder || !holder.checkVisibility() || holder.closest("script, style, [aria-hidden=true]")) continue;
    for (const match of node.data.matchAll(/STP-[0-9A-Z]{8}/g)) {
      const range = document.createRange();
      range.setStart(node, match.index);
      range.setEnd(node, match.index + match[0].length);
      const lines = new Set([...range.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top)));
      if (lines.size > 1) {
        broken.push(`${match[0]} in ${holder.tagName.toLowerCase()}${[...holder.classList].map((c) => "." + c).join("")}`);
      }
    }
  }
  return broken.slice(0, 8);
}"""


class Walk:
    """Pages visited at 375 px, those that scrolled sideways and those that broke an order reference."""

    def __init__(self) -> None:
        self.seen: set[str] = set()
        self.too_wide: dict[str, Any] = {}
        self.broken_references: dict[str, list[str]] = {}
        #: How many pages showed at least one order reference (the check above saw something to check).
        self.with_references = 0

    def check(self, page: Page, what: str | None = None) -> None:
        page.wait_for_load_state("load")
        found = page.evaluate(_OVERFLOW)
        if found:
            self.too_wide[what or page.url] = found
        # What a reader sees once every "show more" is open (a callback's body, everything stored).
        page.evaluate("() => document.querySelectorAll('details').forEach((d) => { d.open = true; })")
        broken = page.evaluate(_BROKEN_REFERENCES)
        if broken:
            self.broken_references[what or page.url] = broken
        if re.search(r"STP-[0-9A-Z]{8}", page.locator("body").inner_text()):
            self.with_references += 1

    def visit(self, page: Page, url: str) -> bool:
        key = urldefrag(url)[0]
        if key in self.seen:
            return False
        self.seen.add(key)
        response = page.goto(key)
        if response is None or "text/html" not in (response.headers.get("content-type") or ""):
            return False
        self.check(page, key)
        return True

    def crawl(self, page: Page, start: str, *, limit: int) -> None:
        """Every page reachable by links from ``start`` on its origin (GET only: links change nothing)."""
        origin = "{0.scheme}://{0.netloc}".format(urlsplit(start))
        queue = [start]
        visited = 0
        while queue and visited < limit:
            url = queue.pop(0)
            if not self.visit(page, url):
                continue
            visited += 1
            for href in page.locator("a[href]").evaluate_all("links => links.map(link => link.href)"):
                href = urldefrag(href)[0]
                if href.startswith(origin) and "/static/" not in href and href not in self.seen:
                    queue.append(href)


def test_no_page_scrolls_sideways_at_375_px(stack: Stack, browser: Browser) -> None:
    shop, emulator = stack.shop.url, stack.emulator.url
    walk = Walk()
    context = browser.new_context(viewport=NARROW, is_mobile=True, has_touch=True)
    context.set_default_timeout(15_000)
    try:
        page = context.new_page()
        # A shopper's journeys, checked as they go: a paid order, a cancelled one, an open one.
        add_to_cart(page, shop, "woven-rug")
        walk.check(page, "product page")
        page.locator('a[data-nav="cart"]').click()
        walk.check(page, "cart")
        page.locator('a[data-action="checkout"]').click()
        page.locator('button[data-action="pay"]').click()  # the empty form: every error at once
        expect(page.locator("[data-error-summary]")).to_be_visible()
        walk.check(page, "checkout with errors")
        paid_payment_page = check_out_at(page)
        walk.check(page, "gateway payment page")
        pay_on_gateway(page)
        walk.check(page, "order page, processing or paid")
        expect(page.locator(STATUS)).to_have_attribute("data-payment-status", "paid", timeout=SETTLE_MS)
        walk.check(page, "order page, paid")
        page.goto(paid_payment_page)
        walk.check(page, "gateway page of a paid checkout")

        add_to_cart(page, shop, "brass-desk-lamp")
        check_out_at(page)
        page.get_by_role("button", name="Cancel", exact=True).click()
        expect(page.locator(STATUS)).to_have_attribute("data-payment-status", "cancelled", timeout=SETTLE_MS)
        walk.check(page, "order page, cancelled, cart kept")
        open_payment_page = check_out_at(page)  # left open
        page.goto(emulator + "/api/v2/app/checkout/v2.nobody.unknown")
        walk.check(page, "gateway page, unknown checkout")
        page.goto(shop + "/orders/STP-00000000")
        walk.check(page, "order link needed")
        page.goto(shop + "/products/no-such-thing")
        walk.check(page, "not found")
        page.goto(shop + "/admin/login")
        walk.check(page, "owner login")

        # The owner: every page the shop, its admin and the gateway's screens link to.
        page.get_by_label("Password", exact=True).fill(OWNER_PASSWORD)
        page.locator('button[data-action="login"]').click()
        expect(page).to_have_url(re.compile(r"/admin/$"))
        walk.crawl(page, shop + "/admin/", limit=70)
        walk.crawl(page, shop + "/", limit=30)
        # Pages behind a form: the refund confirmations (the shop's and the gateway's).
        page.goto(shop + "/admin/?status=paid")
        paid_reference = page.locator("tr[data-order-reference]").first.get_attribute("data-order-reference")
        assert paid_reference
        open_admin_order(page, paid_reference)
        page.locator('button[data-action="refund-everything"]').click()
        expect(page.locator("[data-refund-confirm]")).to_be_visible()
        walk.check(page, "shop admin: refund confirmation")
        page.goto(shop + f"/admin/orders/{paid_reference}")
        page.locator("a[data-gateway-checkout]").click()
        page.locator('button[data-action="refund-everything"]').click()
        expect(page.locator("[data-refund-confirm]")).to_be_visible()
        walk.check(page, "gateway admin: refund confirmation")

        # The gateway's side: its payment page still open, and the emulator's dashboard.
        walk.visit(page, open_payment_page)
        walk.crawl(page, emulator + "/_emulator/", limit=25)
    finally:
        context.close()

    visited = len(walk.seen)
    assert visited >= 40, sorted(walk.seen)
    for needed in (
        "/gateway/admin/checkouts/",
        "/gateway/admin/callbacks",
        "/admin/orders/",
        "/orders/view/",
    ):
        assert any(needed in url for url in walk.seen), needed
    assert walk.too_wide == {}, walk.too_wide
    # Issue 36: an order reference is read whole, on one line (never broken at its hyphen).
    assert walk.with_references >= 10, walk.with_references
    assert walk.broken_references == {}, walk.broken_references


def check_out_at(page: Page) -> str:
    """``check_out`` on a narrow phone; returns the gateway's payment page URL."""
    check_out(page)
    assert PAYMENT_PAGE.search(page.url)
    return page.url
