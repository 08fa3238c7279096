"""Two merchant accounts side by side, in a real Chromium against the emulator and the shop as processes.

The shop sells its second brand, Vuurhout (the potjie pot, the brass desk lamp), on a merchant account of
its own (``stack_two_accounts``: ``SHOP_SECOND_ACCOUNT`` on the shop, both accounts in the emulator's
``EMULATOR_ACCOUNTS``; docs/example-shop.md, "Two brands, two merchant accounts"). A shopper pays an
order of each brand on the emulator's page; each checkout is made on its brand's account, and each
callback comes to that account's own path. The owner sees each order's account, refunds part of each,
and each refund lands on its own account (the emulator's records, and the gateway's checkout list in the
shop's admin, by account). Last, a payment on the second account whose callback is lost (injected
failures: a dead letter) is found by ``flask --app example_shop gateway reconcile`` run as a command, and
the shopper's open order page turns paid by itself.
"""

from __future__ import annotations

import re

from playwright.sync_api import Browser, Page, expect

from tests.e2e.conftest import SECOND_ACCOUNT, Stack
from tests.e2e.journey import (
    SETTLE_MS,
    add_to_cart,
    assert_not_reloaded,
    buy_and_pay,
    check_out,
    delivered_callbacks,
    emulator_delete,
    emulator_get,
    emulator_post,
    log_in_owner,
    mark_page,
    open_admin_order,
    open_product,
    pay_on_gateway,
    run_shop_command,
)
from tests.processes import wait_for

STATUS = "[data-payment-status]"
#: The shop's own account (Stoep's: the shop's default settings) and the second brand's (Vuurhout's).
MAIN = "demo-merchant"
SECOND = SECOND_ACCOUNT.split(":", 1)[0]


def refund_part(page: Page, reference: str, account: str, amount: str, said: str) -> None:
    """From the orders list: open the order, check its account, refund ``amount`` after confirming it."""
    open_admin_order(page, reference)
    expect(page.locator(STATUS)).to_have_attribute("data-payment-status", "paid")
    expect(page.locator("[data-account]")).to_have_text(account)
    page.get_by_label("Amount to refund (R)").fill(amount)
    page.locator('button[data-action="refund"]').click()
    expect(page.locator("[data-refund-confirm]").get_by_role("heading")).to_have_text(f"Refund {said}?")
    page.locator('button[data-action="confirm-refund"]').click()
    expect(page.locator(STATUS)).to_have_attribute("data-payment-status", "partially-refunded")
    expect(page.get_by_role("status").filter(has_text=f"Refunded {said}.")).to_be_visible()
    page.get_by_role("link", name="All orders").click()


def test_each_brand_is_paid_and_refunded_on_its_own_account(
    stack_two_accounts: Stack, page: Page, browser: Browser
) -> None:
    stack = stack_two_accounts
    shopper = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        shop = shopper.new_page()
        open_product(shop, stack.shop.url, "potjie-pot")
        expect(shop.locator("[data-brand]")).to_contain_text("by Vuurhout")
        stoep_reference, stoep_token = buy_and_pay(shop, stack, {"enamel-kettle": 1})  # R 399.00
        expect(shop.locator("[data-cart-count]")).to_have_text("0")
        vuurhout_reference, vuurhout_token = buy_and_pay(shop, stack, {"potjie-pot": 1})  # R 2 499.00
        expect(
            shop.get_by_role("heading", name="Thank you, Thandi! Your payment is confirmed")
        ).to_be_visible()
    finally:
        shopper.close()

    # Each checkout was made on its brand's account, and its callback came to that account's own path.
    for token, account, total, path in (
        (stoep_token, MAIN, 39900, "/gateway/callback"),
        (vuurhout_token, SECOND, 249900, f"/gateway/callback/{SECOND}"),
    ):
        checkout = emulator_get(stack, f"checkouts/{token}")
        assert (checkout["merchantAccountId"], checkout["checkoutTotalCents"]) == (account, total)
        # The order page may have turned paid on the return page's getstatus (PAID_PENDING_CALLBACK) before
        # the callback came: the shop's 200 to the callback makes it PAID.
        delivered = wait_for(
            lambda t=token: delivered_callbacks(stack, t),
            what="the callback",
            logs=[stack.emulator, stack.shop],
        )
        assert delivered[0]["url"] == stack.shop.url + path
        wait_for(
            lambda t=token: emulator_get(stack, f"checkouts/{t}")["checkoutPaymentStatus"] == "PAID",
            what="PAID at the gateway",
            logs=[stack.emulator, stack.shop],
        )

    # The owner sees each order's merchant account in the list, and refunds part of each order.
    log_in_owner(page, stack.shop.url)
    for reference, account in ((stoep_reference, MAIN), (vuurhout_reference, SECOND)):
        row = page.locator(f'tr[data-order-reference="{reference}"]')
        expect(row.locator(STATUS)).to_have_attribute("data-payment-status", "paid")
        expect(row.locator("[data-account]")).to_have_text(account)
    refund_part(page, stoep_reference, MAIN, "50", "R 50.00")
    refund_part(page, vuurhout_reference, SECOND, "250.50", "R 250.50")
    for reference in (stoep_reference, vuurhout_reference):
        row = page.locator(f'tr[data-order-reference="{reference}"]')
        expect(row.locator(STATUS)).to_have_attribute("data-payment-status", "partially-refunded")

    # Each refund landed on its own account at the gateway.
    for token, account, refunded_cents in ((stoep_token, MAIN, 5000), (vuurhout_token, SECOND, 25050)):
        checkout = emulator_get(stack, f"checkouts/{token}")
        assert checkout["merchantAccountId"] == account
        assert checkout["checkoutPaymentStatus"] == "PARTIALLY_REFUNDED"
        assert checkout["refundedCents"] == refunded_cents
        assert [r["amountCents"] for r in checkout["refunds"]] == [refunded_cents]

    # The gateway's screens: both accounts on the status page, the shop's own the default.
    owner_bar = page.get_by_role("navigation", name="Admin", exact=True)
    owner_bar.get_by_role("link", name="Payment gateway", exact=True).click()
    accounts = page.get_by_role("region", name="Merchant accounts", exact=True)
    expect(accounts.locator("article[data-account]")).to_have_count(2)
    expect(accounts.locator(f'article[data-account="{MAIN}"]')).to_contain_text("default for new checkouts")
    expect(accounts.locator(f'article[data-account="{SECOND}"]')).not_to_contain_text(
        "default for new checkouts"
    )

    # The checkouts of every account, with an Account column; then each account's own, by the switcher.
    gateway_nav = page.get_by_role("navigation", name="Payment gateway admin", exact=True)
    gateway_nav.get_by_role("link", name="Checkouts", exact=True).click()
    expect(page.get_by_role("heading", level=1)).to_have_text("Checkouts")
    table = page.locator("table.checkouts")
    expect(table.get_by_role("columnheader", name="Account", exact=True)).to_be_visible()
    for reference, account, refunded in (
        (stoep_reference, MAIN, "R 50.00"),
        (vuurhout_reference, SECOND, "R 250.50"),
    ):
        row = table.locator("tbody tr").filter(has_text=reference)
        expect(row.locator("[data-checkout-account]")).to_have_text(account)
        expect(row).to_contain_text("Partly refunded")
        expect(row.locator('td[data-label="Refunded"]')).to_have_text(refunded)

    switcher = page.get_by_role("navigation", name="Merchant account", exact=True)
    for account, reference, other, refunded in (
        (SECOND, vuurhout_reference, stoep_reference, "R 250.50"),
        (MAIN, stoep_reference, vuurhout_reference, "R 50.00"),
    ):
        switcher.get_by_role("link", name=account, exact=True).click()
        expect(page.get_by_role("heading", level=1)).to_have_text(f"Checkouts of {account}")
        expect(switcher.get_by_role("link", name=account, exact=True)).to_have_attribute(
            "aria-current", "page"
        )
        rows = table.locator("tbody tr")
        expect(rows).to_have_count(1)
        expect(rows.first).to_contain_text(reference)
        expect(rows.first).not_to_contain_text(other)
        expect(rows.first).to_contain_text("Partly refunded")
        expect(rows.first.locator('td[data-label="Refunded"]')).to_have_text(refunded)
        no_column = table.get_by_role("columnheader", name="Account", exact=True)
        expect(no_column).to_have_count(0)  # one account shown: no Account column
        # The checkout's own page says its account; its link goes back to that account's list.
        rows.first.get_by_role("link", name=reference, exact=True).click()
        expect(page.get_by_role("heading", level=1)).to_have_text(
            re.compile(rf"order {re.escape(reference)}$")
        )
        expect(page.locator("p[data-checkout-account]")).to_contain_text(f"Merchant account {account}")
        page.get_by_role("link", name=f"Checkouts of {account}", exact=True).click()
        expect(page.get_by_role("heading", level=1)).to_have_text(f"Checkouts of {account}")


def test_a_lost_callback_on_the_second_account_is_found_by_reconcile(
    stack_two_accounts: Stack, page: Page, browser: Browser
) -> None:
    """The return page's getstatus fails (injected 503s) and the callback never arrives (three injected
    failures: a dead letter), so the Vuurhout order stays "processing" until the shop's cron job runs
    ``gateway reconcile``: it asks each account about its own checkouts and finds this one paid."""
    stack = stack_two_accounts
    emulator_post(stack, "faults", {"operation": "getstatus", "kind": "status", "status": 503, "count": 3})
    emulator_post(stack, "faults", {"operation": "callback", "kind": "callback_fail", "count": 3})
    add_to_cart(page, stack.shop.url, "brass-desk-lamp")  # R 1 850.00, Vuurhout's
    token = check_out(page)
    assert emulator_get(stack, f"checkouts/{token}")["merchantAccountId"] == SECOND
    pay_on_gateway(page)
    mark_page(page)
    status = page.locator(STATUS)
    expect(status).to_have_attribute("data-payment-status", "processing")
    expect(page.get_by_role("heading", name="We're confirming your payment")).to_be_visible()

    dead = wait_for(
        lambda: emulator_get(stack, "dead-letters")["deadLetters"],
        what="the dead letter",
        logs=[stack.emulator, stack.shop],
    )
    assert [(d["checkoutToken"], d["merchantAccountId"]) for d in dead] == [(token, SECOND)]
    assert dead[0]["url"] == f"{stack.shop.url}/gateway/callback/{SECOND}"
    assert delivered_callbacks(stack, token) == []
    emulator_delete(stack, "faults")  # the getstatus faults the return page did not use, if any
    assert emulator_get(stack, f"checkouts/{token}")["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"
    # The page polls about once a second; nothing proved the payment yet.
    with page.expect_response(lambda response: response.url.endswith("/status.json")) as polled:
        pass
    assert polled.value.json()["status"] == "processing"
    expect(status).to_have_attribute("data-payment-status", "processing")

    # The shop's cron job: one run asks every account about its own checkouts.
    reconciled = run_shop_command(stack, "gateway", "reconcile", "--older-than", "0", "--quiet")
    assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr
    summary = reconciled.stdout
    assert "Per account:" in summary, summary
    assert f"{MAIN} (default): polled 0 of 0 due" in summary, summary
    assert (
        f"{SECOND}: polled 1 of 1 due, 1 changed, 1 payment(s) confirmed, 0 expired, 0 failed" in summary
    ), summary

    # The shopper's page, still open, turns paid by itself.
    expect(status).to_have_attribute("data-payment-status", "paid", timeout=SETTLE_MS)
    expect(page.get_by_role("heading", name="Thank you, Thandi! Your payment is confirmed")).to_be_visible()
    expect(page.locator("[data-cart-count]")).to_have_text("0")
    assert_not_reloaded(page)
    reference = emulator_get(stack, f"checkouts/{token}")["merchantOrderReference"]

    # The owner sees it paid on the second account, and the history names reconciliation as the source.
    owner = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        admin = owner.new_page()
        log_in_owner(admin, stack.shop.url)
        row = admin.locator(f'tr[data-order-reference="{reference}"]')
        expect(row.locator(STATUS)).to_have_attribute("data-payment-status", "paid")
        expect(row.locator("[data-account]")).to_have_text(SECOND)
        open_admin_order(admin, reference)
        expect(admin.locator("[data-account]")).to_have_text(SECOND)
        expect(admin.get_by_role("region", name="History")).to_contain_text(
            "payment confirmed (reconciliation)"
        )
    finally:
        owner.close()
