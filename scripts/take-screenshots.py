#!/usr/bin/env python3
"""Regenerate the README's screenshots in docs/screenshots/ from a real run of the demo.

    .venv/bin/python scripts/take-screenshots.py

Starts the gateway emulator and the example shop as real processes on free loopback ports (exactly as the
e2e tests do, with ``tests.e2e.conftest.start_stack``, in a throwaway folder), drives Debian's chromium
with Playwright through a purchase, and writes four PNGs (1200x900 viewport, not the full page, except
the last):

- ``product-page.png``: a product page with the gateway's instalment hint;
- ``gateway-payment-page.png``: the gateway's hosted payment page (the emulator's), with two products
  (R 688.00: the first instalment carries the odd cent);
- ``order-paid.png``: the shop's order page once the payment is confirmed;
- ``owner-checkout.png``: the owner's view of that payment, the extension's checkout screen in the
  shop's admin, down to the callbacks received (status, refund form, timeline, callback log in words).

It also writes ``docs/screenshots/sources.json``: for each screenshot, the templates and stylesheets it
shows (:data:`SHOWS`) with the SHA-256 of each as it was when the picture was taken. A test
(``tests/docs/test_screenshots.py``) fails when one of them has changed since: the picture is older than
what it shows, and this script takes it again.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import Locator, Page, expect, sync_playwright  # noqa: E402

from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS, start_stack  # noqa: E402
from tests.e2e.journey import (  # noqa: E402
    SETTLE_MS,
    add_to_cart,
    check_out,
    delivered_callbacks,
    log_in_owner,
    open_admin_order,
    open_product,
    order_reference,
    pay_on_gateway,
)
from tests.processes import wait_for  # noqa: E402

OUT = ROOT / "docs" / "screenshots"
#: Where the manifest of what each screenshot shows is written (read by tests/docs/test_screenshots.py).
SOURCES = OUT / "sources.json"

_SHOP = (
    "example_shop/templates/shop/base.html",
    "example_shop/static/shop/shop.css",
    "example_shop/static/shop/tokens.css",
)
_HOSTED = (
    "flask_gateway/emulator/templates/emulator/hosted/base.html",
    "flask_gateway/emulator/static/emulator/hosted.css",
)
_ADMIN = (
    "example_shop/templates/gateway/admin/base.html",
    "flask_gateway/web/templates/gateway/admin/layout.html",
    "flask_gateway/web/templates/gateway/admin/_nav.html",
    "flask_gateway/web/templates/gateway/admin/_macros.html",
    "flask_gateway/web/static/gateway/admin.css",
    "example_shop/static/shop/ownerbar.css",
    "example_shop/static/shop/tokens.css",
)
#: Each screenshot and the files (from the repository's root) whose look it shows.
SHOWS: dict[str, tuple[str, ...]] = {
    "product-page.png": ("example_shop/templates/shop/product.html", *_SHOP),
    "gateway-payment-page.png": ("flask_gateway/emulator/templates/emulator/hosted/checkout.html", *_HOSTED),
    "order-paid.png": (
        "example_shop/templates/shop/order.html",
        "example_shop/templates/shop/_order_status.html",
        *_SHOP,
    ),
    "owner-checkout.png": ("flask_gateway/web/templates/gateway/admin/checkout.html", *_ADMIN),
}


def digest(path: str) -> str:
    """The SHA-256 of a file of the repository, as the manifest keeps it."""
    return hashlib.sha256((ROOT / path).read_bytes()).hexdigest()


def write_sources() -> None:
    """``sources.json``: what each screenshot shows, as it was when it was taken."""
    manifest = {name: {path: digest(path) for path in paths} for name, paths in SHOWS.items()}
    SOURCES.write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    print(f"wrote {SOURCES.relative_to(ROOT)}")  # noqa: T201


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="stoep-screenshots-") as folder:
        stack = start_stack(Path(folder))
        try:
            with sync_playwright() as playwright:
                browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                try:
                    page = browser.new_page(viewport={"width": 1200, "height": 900})
                    page.set_default_timeout(15_000)
                    shop = stack.shop.url

                    open_product(page, shop, "enamel-kettle")
                    expect(page.locator("[data-instalment-hint]").first).to_be_visible()
                    shoot(page, "product-page.png")

                    add_to_cart(page, shop, "enamel-kettle")
                    add_to_cart(page, shop, "stoneware-mugs")
                    token = check_out(page)
                    shoot(page, "gateway-payment-page.png")

                    pay_on_gateway(page)
                    status = page.locator("[data-payment-status]")
                    expect(status).to_have_attribute("data-payment-status", "paid", timeout=SETTLE_MS)
                    shoot(page, "order-paid.png")

                    reference = order_reference(page)
                    wait_for(lambda: delivered_callbacks(stack, token), timeout=15, what="the callback")
                    owner = browser.new_page(viewport={"width": 1200, "height": 900})
                    owner.set_default_timeout(15_000)
                    log_in_owner(owner, shop)
                    open_admin_order(owner, reference)
                    owner.locator("a[data-gateway-checkout]").click()
                    expect(owner.locator("[data-callback-outcome]")).to_have_count(1)
                    expect(owner.locator("dl.facts").first).to_contain_text(token)
                    shoot_down_to(owner, "owner-checkout.png", owner.locator("#gateway-callbacks"))
                finally:
                    browser.close()
        finally:
            stack.shop.stop()
            stack.emulator.stop()
    write_sources()
    return 0


def shoot_down_to(page: Page, name: str, heading: Locator) -> None:
    """The page from its top to the end of the section ``heading`` starts."""
    section = heading.locator("xpath=ancestor::section[1]")
    box = section.bounding_box()
    if box is None:
        raise RuntimeError(f"no section to shoot for {name}")
    path = OUT / name
    page.screenshot(
        path=str(path),
        full_page=True,
        clip={"x": 0, "y": 0, "width": 1200, "height": box["y"] + box["height"] + 24},
    )
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")  # noqa: T201


def shoot(page: Page, name: str) -> None:
    path = OUT / name
    page.screenshot(path=str(path), full_page=False)
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")  # noqa: T201


if __name__ == "__main__":
    sys.exit(main())
