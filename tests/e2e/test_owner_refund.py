"""The owner refunds part of a paid order in the shop's admin, in a real Chromium (real processes).

A shopper (their own browser context) buys and pays first; the owner (the ``page`` fixture, whose last
page is saved to artifacts/e2e/) logs in, opens the order and refunds part of it in Rand. The refund is
a two-step form: the amount first (the field starts empty), then a confirmation naming the amount; only
the confirmation calls the gateway.
"""

from __future__ import annotations

from playwright.sync_api import Browser, Page, expect

from tests.e2e.conftest import Stack
from tests.e2e.journey import buy_and_pay, emulator_get, log_in_owner, open_admin_order

STATUS = "[data-payment-status]"


def test_owner_refunds_part_of_an_order_after_confirming_the_amount(
    stack: Stack, page: Page, browser: Browser
) -> None:
    shopper = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        shopper_page = shopper.new_page()
        reference, token = buy_and_pay(shopper_page, stack, {"mohair-throw": 1, "rooibos-tin": 1})

        log_in_owner(page, stack.shop.url)
        row = page.locator(f'tr[data-order-reference="{reference}"]')
        expect(row.locator(STATUS)).to_have_attribute("data-payment-status", "paid")
        open_admin_order(page, reference)
        expect(page.locator(STATUS)).to_have_attribute("data-payment-status", "paid")

        # R 1 199.00 + R 45.00 = R 1 244.00 paid. The form starts empty: no one-click full refund.
        amount = page.get_by_label("Amount to refund (R)")
        expect(amount).to_have_value("")
        expect(page.locator('button[data-action="refund-everything"]')).to_have_text(
            "Refund everything that is left (R 1 244.00)"
        )
        amount.fill("150.50")
        page.get_by_label("Reason (optional)").fill("Tin arrived dented")
        page.locator('button[data-action="refund"]').click()

        # The confirmation names the amount; nothing has reached the gateway yet.
        confirm = page.locator("[data-refund-confirm]")
        expect(confirm.get_by_role("heading")).to_have_text("Refund R 150.50?")
        expect(confirm).to_contain_text("Reason: “Tin arrived dented”")
        assert emulator_get(stack, f"checkouts/{token}")["refundedCents"] == 0
        expect(page.locator(STATUS)).to_have_attribute("data-payment-status", "paid")
        page.locator('button[data-action="confirm-refund"]').click()

        expect(page.locator(STATUS)).to_have_attribute("data-payment-status", "partially-refunded")
        expect(page.locator(STATUS)).to_have_text("Partly refunded")
        expect(page.get_by_role("status").filter(has_text="Refunded R 150.50.")).to_be_visible()
        expect(page.locator("[data-refunded-cents]")).to_have_attribute("data-refunded-cents", "15050")
        expect(page.get_by_role("region", name="History")).to_contain_text(
            "refunded R 150.50: Tin arrived dented"
        )
        expect(page.locator("[data-gateway-status]")).to_have_text("Partly refunded")
        expect(amount).to_have_value("")  # the next refund starts empty again

        checkout = emulator_get(stack, f"checkouts/{token}")
        assert checkout["checkoutPaymentStatus"] == "PARTIALLY_REFUNDED"
        assert checkout["refundedCents"] == 15050

        # "Refund everything" also asks first, with the amount that is left; the owner backs out.
        page.locator('button[data-action="refund-everything"]').click()
        expect(confirm.get_by_role("heading")).to_have_text("Refund R 1 093.50?")
        page.locator('[data-action="cancel-refund"]').click()
        expect(page.locator("[data-refund-confirm]")).to_have_count(0)
        assert emulator_get(stack, f"checkouts/{token}")["refundedCents"] == 15050

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


def test_the_gateways_refund_form_asks_for_confirmation_too(
    stack: Stack, page: Page, browser: Browser
) -> None:
    """The extension's own checkout screen (in the shop's admin) refunds in the same two steps."""
    shopper = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        reference, token = buy_and_pay(shopper.new_page(), stack, {"enamel-kettle": 1})
    finally:
        shopper.close()
    log_in_owner(page, stack.shop.url)
    open_admin_order(page, reference)
    page.locator("a[data-gateway-checkout]").click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(f"order {reference}")

    amount = page.get_by_label("Amount to refund")
    expect(amount).to_have_value("")
    amount.fill("99")
    page.locator('button[data-action="refund"]').click()
    expect(page.locator("[data-refund-confirm]").get_by_role("heading")).to_have_text("Refund R 99.00?")
    assert emulator_get(stack, f"checkouts/{token}")["refundedCents"] == 0
    page.locator('button[data-action="confirm-refund"]').click()
    expect(page.get_by_role("status").filter(has_text="Refunded R 99.00.")).to_be_visible()
    assert emulator_get(stack, f"checkouts/{token}")["refundedCents"] == 9900
    facts = page.locator("dl.facts").first
    expect(facts).to_contain_text("Partly refunded")
    expect(facts.locator("[data-status-code]")).to_have_attribute("data-status-code", "PARTIALLY_REFUNDED")
