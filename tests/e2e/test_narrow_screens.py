"""What the owner and a shopper read on a 375 px wide phone (issue 28, points 3 and 4), in a real Chromium.

- The owner's gateway checkout page of a paid, partly refunded order: its facts, statuses in words and
  amounts in Rand, nothing off-screen.
- The shop's own orders list with several orders, one of them with a long e-mail address: each order is a
  card (reference, customer and e-mail whole, items, total, payment, gateway status), nothing hidden
  off-screen in a table that scrolls sideways.
- A cart below the merchant's minimum: the range Pay in 3 is offered for, in words.
- The gateway's payment page: the shop's name, times in the shop's zone, a date per instalment (issue 36).

"Nothing off-screen" is stricter than "the page does not scroll sideways": every visible element's box is
within the viewport, so a table in a scrolling wrapper (the page fits, the columns do not) fails too.
Each page's screenshot is left in artifacts/e2e/ (git-ignored), as the other browser tests leave theirs.
"""

from __future__ import annotations

import re
from typing import Any

from playwright.sync_api import Browser, Page, ViewportSize, expect

from tests.e2e.conftest import ARTIFACTS, Stack
from tests.e2e.journey import (
    ORDER_PAGE,
    SETTLE_MS,
    Customer,
    add_to_cart,
    check_out,
    log_in_owner,
    open_admin_order,
    order_reference,
)

NARROW: ViewportSize = {"width": 375, "height": 812}
STATUS = "[data-payment-status]"
#: 80 characters: wider than a 375 px screen in any font, it must wrap, never be cut.
LONG_EMAIL = "thandiwe.nomvula.mokoena-vandermerwe@accounts.kwazulu-natal-crafts.example.co.za"
LONG = Customer(first_name="Thandiwe", last_name="Mokoena-Van der Merwe", email=LONG_EMAIL)
SIPHO = Customer(first_name="Sipho", last_name="Dlamini", email="sipho@example.com")

#: The page's width against the viewport, and every visible element whose box leaves the viewport
#: (left or right): the first few, named by tag, classes and text, for the failure message.
_OFF_SCREEN = """() => {
  const width = document.documentElement.clientWidth;
  const out = [];
  for (const element of document.querySelectorAll("body *")) {
    const style = getComputedStyle(element);
    if (style.visibility === "hidden" || style.display === "none") continue;
    const box = element.getBoundingClientRect();
    if (box.width === 0 || box.height === 0) continue;
    if (element.closest(".skip-link")) continue;  // off-screen until focused, by design
    let hidden = false;  // visually hidden (screen readers only): inside a 1 px box
    for (let up = element; up && !hidden; up = up.parentElement) {
      const around = up.getBoundingClientRect();
      hidden = around.width <= 1 && around.height <= 1;
    }
    if (hidden) continue;
    if (box.left < -0.5 || box.right > width + 0.5) {
      out.push(`${element.tagName.toLowerCase()}${[...element.classList].map((c) => "." + c).join("")}`
        + ` [${Math.round(box.left)}, ${Math.round(box.right)}] `
        + JSON.stringify((element.innerText || "").slice(0, 40)));
    }
  }
  return {scroll: document.documentElement.scrollWidth, width, out: out.slice(0, 8)};
}"""


def assert_fits(page: Page, what: str) -> None:
    """No sideways scrolling at 375 px, and no visible element outside the screen."""
    page.wait_for_load_state("load")
    found: dict[str, Any] = page.evaluate(_OFF_SCREEN)
    assert found["width"] == 375, found
    assert found["scroll"] <= 375, f"{what}: the page scrolls sideways: {found}"
    assert found["out"] == [], f"{what}: elements off-screen: {found['out']}"
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"narrow-{what}.png"), full_page=True)


def visible_text(page: Page, selector: str = "main") -> str:
    """What a person reads in ``selector``, lines joined: a wrapped word reads whole."""
    return " ".join(page.locator(selector).first.inner_text().split())


def place_order(page: Page, stack: Stack, slug: str, customer: Customer, *, pay: bool) -> str:
    """Buy ``slug`` as ``customer``; pay (and wait for "Paid") or leave the payment page open."""
    add_to_cart(page, stack.shop.url, slug)
    check_out(page, customer)
    if not pay:
        page.goto(stack.shop.url + "/")  # the order stays waiting for its payment
        return ""
    page.get_by_role("button", name="Pay", exact=True).click()
    expect(page).to_have_url(ORDER_PAGE)
    expect(page.locator(STATUS)).to_have_attribute("data-payment-status", "paid", timeout=SETTLE_MS)
    return order_reference(page)


def refund_part(page: Page, reference: str, amount: str) -> None:
    """The owner refunds ``amount`` (Rand) of the order from its page in the shop's admin, confirmed."""
    open_admin_order(page, reference)
    page.get_by_label("Amount to refund (R)").fill(amount)
    page.locator('button[data-action="refund"]').click()
    page.locator('button[data-action="confirm-refund"]').click()
    expect(page.locator(STATUS)).to_have_attribute("data-payment-status", "partially-refunded")


def test_the_owner_and_a_shopper_read_everything_at_375_px(stack: Stack, browser: Browser) -> None:
    shop = stack.shop.url
    # Orders placed on a desktop: a paid one with a long e-mail address (then partly refunded), a paid one,
    # and one left waiting for its payment.
    desktop = browser.new_context(viewport={"width": 1200, "height": 900})
    desktop.set_default_timeout(15_000)
    try:
        buyer = desktop.new_page()
        refunded = place_order(buyer, stack, "mohair-throw", LONG, pay=True)  # R 1 199.00
        paid = place_order(buyer, stack, "enamel-kettle", SIPHO, pay=True)  # R 399.00
        place_order(buyer, stack, "ilala-basket", SIPHO, pay=False)  # R 649.00, open
        log_in_owner(buyer, shop)
        refund_part(buyer, refunded, "150.50")
    finally:
        desktop.close()

    phone = browser.new_context(viewport=NARROW, is_mobile=True, has_touch=True)
    phone.set_default_timeout(15_000)
    try:
        page = phone.new_page()
        log_in_owner(page, shop)

        # (b) The shop's own orders list: each order a card, every part of it on the screen.
        row = page.locator(f'tr[data-order-reference="{refunded}"]')
        expect(row.locator(STATUS)).to_have_text("Partly refunded")
        expect(row.locator("[data-gateway-status]")).to_have_text("Partly refunded")
        assert_fits(page, "shop-orders")
        assert LONG_EMAIL in visible_text(page, f'tr[data-order-reference="{refunded}"]')  # wrapped, whole
        # Each cell names its column (the card shows it above the value: data-label) and is on the screen.
        cells = {
            cell.get_attribute("data-label"): " ".join(cell.inner_text().split())
            for cell in row.locator("td").all()
        }
        assert cells.keys() == {"Placed", "Customer", "Items", "Total", "Payment", "Gateway"}, cells
        assert cells["Items"] == "1" and cells["Total"].startswith("R 1 199.00"), cells
        assert cells["Total"].endswith("refunded R 150.50") and cells["Payment"] == "Partly refunded", cells
        assert "Partly refunded" in cells["Gateway"] and LONG_EMAIL in cells["Customer"], cells
        assert "PARTIALLY_REFUNDED" not in visible_text(page)
        expect(page.locator(f'tr[data-order-reference="{paid}"]').locator(STATUS)).to_have_text("Paid")
        listed = visible_text(page)
        assert "Awaiting payment" in listed or "Processing" in listed, listed
        for cell in row.locator(
            "td, th"
        ).all():  # every cell across the screen, none behind a sideways scroll
            box = cell.bounding_box()
            assert box is not None and box["x"] >= 0 and box["x"] + box["width"] <= 375, box

        # (a) The owner's gateway checkout page of the paid, partly refunded order.
        open_admin_order(page, refunded)
        page.locator("a[data-gateway-checkout]").click()
        expect(page).to_have_url(re.compile(r"/gateway/admin/checkouts/\d+$"))
        facts = page.locator("dl.facts").first
        expect(facts.locator(".gateway-status").first).to_have_text("Partly refunded")
        assert_fits(page, "gateway-checkout")
        checkout = visible_text(page)
        for words in ("R 1 199.00", "R 150.50", "Partly refunded", refunded):
            assert words in checkout, (words, checkout)
        assert LONG_EMAIL in checkout or LONG_EMAIL not in page.content()  # whole wherever it is shown

        # (c) A cart below the merchant's minimum says the range in words.
        shopper = phone.new_page()
        add_to_cart(shopper, shop, "rooibos-tin")  # R 45.00, below R 50.00
        shopper.locator('a[data-nav="cart"]').click()
        notice = shopper.locator("[data-payment-unavailable]")
        expect(notice).to_be_visible()
        expect(notice).to_contain_text("Pay in 3 is available from R 50.00 to R 50 000.00.")
        expect(notice).to_contain_text("add R 5.00 or more")
        expect(shopper.locator("[data-cart-total]")).to_have_text("R 45.00")
        expect(shopper.locator('a[data-action="checkout"]')).to_have_count(0)
        assert_fits(shopper, "cart-below-minimum")

        # (d) The gateway's payment page on the phone (issue 36): headed with the shop's name, the account
        # id small print, every time in the shop's zone and format, a date for each instalment, the order
        # reference on one line.
        add_to_cart(shopper, shop, "enamel-kettle")
        check_out(shopper, SIPHO)
        expect(shopper.locator("[data-merchant-name]")).to_have_text("Stoep")
        dues = [" ".join(text.split()) for text in shopper.locator("[data-instalment-due]").all_inner_texts()]
        assert len(dues) == 3, dues
        assert re.fullmatch(r"due now \(\d{4}-\d\d-\d\d \d\d:\d\d SAST\)", dues[0]), dues
        assert all(re.fullmatch(r"due \d{4}-\d\d-\d\d", due) for due in dues[1:]), dues
        paying = visible_text(shopper)
        assert "Merchant account demo-merchant" in paying and "UTC" not in paying, paying
        assert re.search(r"Pay before \d{4}-\d\d-\d\d \d\d:\d\d SAST", paying), paying
        reference = shopper.locator("h1 .ref")
        box = reference.bounding_box()
        line = float(reference.evaluate("(element) => parseFloat(getComputedStyle(element).lineHeight)"))
        assert box is not None and box["height"] < 1.5 * line, (box, line)  # one line
        assert_fits(shopper, "gateway-payment-page")
    finally:
        phone.close()
