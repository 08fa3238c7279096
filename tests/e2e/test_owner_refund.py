"""The owner refunds part of a paid order in the shop's admin, in a real Chromium (real processes).

A shopper (their own browser context) buys and pays first; the owner (the ``page`` fixture, whose last
page is saved to artifacts/e2e/) logs in, opens the order and refunds part of it in Rand.
"""

from __future__ import annotations

from playwright.sync_api import Browser, Page, expect

from tests.e2e.conftest import Stack
from tests.e2e.journey import buy_and_pay, emulator_get, log_in_owner, open_admin_order

STATUS = "[data-payment-status]"


def test_owner_refunds_part_of_an_order(stack: Stack, page: Page, browser: Browser) -> None:
    shopper = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        shopper_page = shopper.new_page()
        reference, token = buy_and_pay(shopper_page, stack, {"mohair-throw": 1, "rooibos-tin": 1})

        log_in_owner(page, stack.shop.url)
        row = page.locator(f'tr[data-order-reference="{reference}"]')
        expect(row.locator(STATUS)).to_have_attribute("data-payment-status", "paid")
        open_admin_order(page, reference)
        expect(page.locator(STATUS)).to_have_attribute("data-payment-status", "paid")

        # R 1 199.00 + R 45.00 = R 1 244.00 paid; the owner refunds R 150.50 of it.
        amount = page.get_by_label("Amount to refund (R)")
        expect(amount).to_have_value("1244.00")  # the form offers what is left
        amount.fill("150.50")
        page.get_by_label("Reason (optional)").fill("Tin arrived dented")
        page.locator('button[data-action="refund"]').click()

        expect(page.locator(STATUS)).to_have_attribute("data-payment-status", "partially-refunded")
        expect(page.locator(STATUS)).to_have_text("partially-refunded")
        expect(page.get_by_role("status").filter(has_text="Refunded R 150.50.")).to_be_visible()
        expect(page.locator("[data-refunded-cents]")).to_have_attribute("data-refunded-cents", "15050")
        expect(page.get_by_role("region", name="History")).to_contain_text(
            "refunded R 150.50: Tin arrived dented"
        )
        expect(amount).to_have_value("1093.50")  # another refund may take the rest

        checkout = emulator_get(stack, f"checkouts/{token}")
        assert checkout["checkoutPaymentStatus"] == "PARTIALLY_REFUNDED"
        assert checkout["refundedCents"] == 15050

        # The shopper's order page (their private link) says so too.
        shopper_page.reload()
        expect(shopper_page.locator(STATUS)).to_have_attribute("data-payment-status", "partially-refunded")
        expect(shopper_page.get_by_role("heading", name="Part of this order was refunded")).to_be_visible()

        # Back on the orders list, the row shows the new status.
        page.get_by_role("link", name="All orders").click()
        expect(row.locator(STATUS)).to_have_attribute("data-payment-status", "partially-refunded")
        open_admin_order(page, reference)  # the artifact: the order with its refund
    finally:
        shopper.close()
