"""The shopper's journeys in a real Chromium, against the emulator and the example shop as real processes.

Everything is done as a person does it: product cards, "Add to cart", the cart, the checkout form by its
labels, the full-page redirect to the emulator's hosted page (``/api/v2/app/checkout/<token>``), its Pay
and Cancel buttons, and back. The emulator's background worker delivers callbacks to the shop over real
HTTP (``EMULATOR_CALLBACK_RETRY_DELAYS=0.5,0.5`` in the fixture). The control API is only used to look
(``GET /_emulator/callbacks``, ``/_emulator/checkouts/<token>``), to move the emulator's clock, and, in
the late-callback test, to inject faults that hold the callback back, then to release it.

How the shop learns of an expired checkout: the gateway sends no callback when a v2 checkout expires
unpaid, so the test runs the extension's reconciliation as the shop's cron job would,
``flask --app example_shop gateway reconcile --older-than 0`` in a subprocess with the shop's
environment (``--older-than 0``: the checkout is only seconds old by the shop's clock; only the
emulator's clock was moved). The owner then sees the order expired in the admin before the shopper comes
back, and its history names the source (``reconcile``).

Each test's last page is saved to artifacts/e2e/<test>.png by the ``page`` fixture.
"""

from __future__ import annotations

from datetime import timedelta

from playwright.sync_api import Browser, Page, expect

from tests.e2e.conftest import Stack
from tests.e2e.journey import (
    SETTLE_MS,
    add_to_cart,
    assert_not_reloaded,
    cart_count,
    check_out,
    delivered_callbacks,
    emulator_delete,
    emulator_get,
    emulator_post,
    log_in_owner,
    mark_page,
    open_admin_order,
    order_reference,
    parse_timestamp,
    pay_on_gateway,
    run_shop_command,
)
from tests.processes import wait_for

STATUS = "[data-payment-status]"


def test_buys_two_products_pays_and_sees_paid(stack: Stack, page: Page) -> None:
    add_to_cart(page, stack.shop.url, "enamel-kettle", 2)
    expect(page.locator("[data-instalment-hint]").first).to_contain_text("or 3 x R 133.00")  # R 399.00
    add_to_cart(page, stack.shop.url, "stoneware-mugs")

    token = check_out(page)
    items = page.get_by_role("table").locator("tbody").get_by_role("row")
    expect(items).to_have_count(2)
    expect(items.nth(0)).to_contain_text("Enamel stovetop kettle")
    expect(items.nth(0).get_by_role("cell").first).to_have_text("2")  # quantity
    expect(items.nth(1)).to_contain_text("Stoneware mugs, set of four")
    pay_on_gateway(page)
    mark_page(page)

    status = page.locator(STATUS)
    expect(status).to_have_attribute("data-payment-status", "paid", timeout=SETTLE_MS)
    expect(status).to_have_text("Paid")  # in words; the attribute keeps the value
    expect(page.get_by_role("heading", name="Thank you, Thandi! Your payment is confirmed")).to_be_visible()
    expect(page.locator("[data-cart-count]")).to_have_text("0")  # paid: the cart is emptied
    assert_not_reloaded(page)

    # The emulator's worker delivered the signed callback to the shop over HTTP, and the shop took it.
    delivered = wait_for(
        lambda: delivered_callbacks(stack, token),
        what="a delivered callback",
        logs=[stack.emulator, stack.shop],
    )
    assert delivered[0]["url"] == f"{stack.shop.url}/gateway/callback"
    assert '"checkoutPaymentStatus":"PAID' in delivered[0]["requestBody"].replace(" ", "")
    assert emulator_get(stack, f"checkouts/{token}")["checkoutPaymentStatus"] == "PAID"


def test_order_page_turns_paid_by_itself_when_the_callback_comes_late(stack: Stack, page: Page) -> None:
    """Only the callback can prove this payment: the return page's getstatus fails (injected 503s) and the
    callback is held back (three injected failures, a dead letter) until the shopper waits on the order
    page; then it is redelivered over HTTP and the page, polling, turns "paid" without a reload."""
    emulator_post(stack, "faults", {"operation": "getstatus", "kind": "status", "status": 503, "count": 3})
    emulator_post(stack, "faults", {"operation": "callback", "kind": "callback_fail", "count": 3})
    add_to_cart(page, stack.shop.url, "ilala-basket")
    token = check_out(page)
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
    emulator_delete(stack, "faults")  # the getstatus faults the return page did not use, if any
    # The page polls about once a second; the next answer still says "processing": nothing proved it yet.
    with page.expect_response(lambda response: response.url.endswith("/status.json")) as polled:
        pass
    assert polled.value.json()["status"] == "processing"
    expect(status).to_have_attribute("data-payment-status", "processing")

    redelivered = emulator_post(stack, f"dead-letters/{dead[0]['id']}/redeliver")
    assert redelivered["ok"], redelivered  # the shop answered 200 to this very request
    expect(status).to_have_attribute("data-payment-status", "paid", timeout=SETTLE_MS)
    expect(page.locator("[data-cart-count]")).to_have_text("0")
    assert_not_reloaded(page)
    assert emulator_get(stack, f"checkouts/{token}")["checkoutPaymentStatus"] == "PAID"


def test_cancel_on_the_gateway_keeps_the_cart(stack: Stack, page: Page) -> None:
    add_to_cart(page, stack.shop.url, "mohair-throw")
    add_to_cart(page, stack.shop.url, "rooibos-tin", 2)
    token = check_out(page)

    page.get_by_role("button", name="Cancel", exact=True).click()
    expect(page.locator(STATUS)).to_have_attribute("data-payment-status", "cancelled", timeout=SETTLE_MS)
    expect(page.get_by_role("heading", name="The payment was cancelled")).to_be_visible()
    expect(page.locator("[data-cart-kept]")).to_contain_text("Your cart is still here")
    expect(page.locator("[data-cart-kept]")).to_contain_text("3 items")
    assert cart_count(page) == 3
    assert emulator_get(stack, f"checkouts/{token}")["checkoutPaymentStatus"] == "CANCELLED_BY_CONSUMER"

    page.get_by_role("link", name="View your cart").click()
    expect(page.locator("[data-cart-line]")).to_have_count(2)
    expect(page.locator('[data-cart-line="rooibos-tin"]').get_by_label("Quantity")).to_have_value("2")


def test_expired_checkout(stack: Stack, page: Page, browser: Browser) -> None:
    add_to_cart(page, stack.shop.url, "brass-desk-lamp")
    token = check_out(page)
    reference = emulator_get(stack, f"checkouts/{token}")["merchantOrderReference"]

    # The shopper leaves the payment page open; the emulator's clock moves past the checkout's expiresAt.
    expires_at = parse_timestamp(emulator_get(stack, f"checkouts/{token}")["expiresAt"])
    now = parse_timestamp(emulator_get(stack, "clock")["now"])
    seconds = (expires_at - now + timedelta(minutes=1)).total_seconds()
    advanced = emulator_post(stack, "clock/advance", {"seconds": seconds})
    assert advanced["expired"] == 1
    assert emulator_get(stack, f"checkouts/{token}")["checkoutPaymentStatus"] == "EXPIRED"

    # No callback for an expiry: the shop's cron job (reconciliation) finds it.
    reconciled = run_shop_command(stack, "gateway", "reconcile", "--older-than", "0", "--quiet")
    assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr
    assert "1 expired" in reconciled.stdout, reconciled.stdout

    # The owner sees it before the shopper comes back, and the history says reconciliation found it.
    owner = browser.new_context(viewport={"width": 1200, "height": 900})
    try:
        admin = owner.new_page()
        log_in_owner(admin, stack.shop.url)
        row = admin.locator(f'tr[data-order-reference="{reference}"]')
        expect(row.locator(STATUS)).to_have_attribute("data-payment-status", "expired")
        open_admin_order(admin, reference)
        expect(admin.get_by_role("region", name="History")).to_contain_text("expired unpaid (reconciliation)")
    finally:
        owner.close()

    # The shopper comes back to the payment page, sees it expired, and returns to the shop.
    page.reload()
    expect(page.get_by_role("heading", level=1)).to_have_text("This checkout has expired")
    page.get_by_role("link", name="Return to the shop").click()
    expect(page.locator(STATUS)).to_have_attribute("data-payment-status", "expired")
    assert order_reference(page) == reference
    expect(page.get_by_role("heading", name="The payment window has closed")).to_be_visible()
    expect(page.locator("[data-cart-kept]")).to_contain_text("Your cart is still here")
    assert cart_count(page) == 1


def test_v1_flow_end_to_end(stack_v1: Stack, page: Page) -> None:
    stack = stack_v1
    add_to_cart(page, stack.shop.url, "potjie-pot")
    add_to_cart(page, stack.shop.url, "enamel-kettle")
    token = check_out(page)
    assert "/api/v1/app/checkout/" in page.url

    # Pay: the emulator calls the shop's signed v1 success URL over HTTP, then sends the shopper back.
    pay_on_gateway(page)
    status = page.locator(STATUS)
    expect(status).to_have_attribute("data-payment-status", "paid", timeout=SETTLE_MS)
    expect(page.get_by_role("heading", name="Thank you, Thandi! Your payment is confirmed")).to_be_visible()
    expect(page.locator("[data-cart-count]")).to_have_text("0")

    checkout = emulator_get(stack, f"checkouts/{token}")
    assert checkout["apiVersion"] == 1
    assert checkout["checkoutPaymentStatus"] == "PAID"
    notified = [e["detail"] for e in checkout["events"] if e["kind"] == "merchant-notified"]
    assert notified == ["success URL: OK"], checkout["events"]
    assert order_reference(page) == checkout["merchantOrderReference"]
