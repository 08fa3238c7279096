#!/usr/bin/env python3
"""Regenerate the README's screenshots in docs/screenshots/ from a real run of the demo.

    .venv/bin/python scripts/take-screenshots.py

Starts the gateway emulator and the example shop as real processes on free loopback ports (exactly as the
e2e tests do, with ``tests.e2e.conftest.start_stack``, in a throwaway folder), drives Debian's chromium
with Playwright through a purchase, and writes three PNGs (1200x900 viewport, not the full page):

- ``product-page.png``: a product page with the gateway's instalment hint;
- ``gateway-payment-page.png``: the gateway's hosted payment page (the emulator's), with two products;
- ``order-paid.png``: the shop's order page once the payment is confirmed.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from playwright.sync_api import Page, expect, sync_playwright  # noqa: E402

from tests.e2e.conftest import CHROMIUM, CHROMIUM_ARGS, start_stack  # noqa: E402
from tests.e2e.journey import (  # noqa: E402
    SETTLE_MS,
    add_to_cart,
    check_out,
    open_product,
    pay_on_gateway,
)

OUT = ROOT / "docs" / "screenshots"


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
                    check_out(page)
                    shoot(page, "gateway-payment-page.png")

                    pay_on_gateway(page)
                    status = page.locator("[data-payment-status]")
                    expect(status).to_have_attribute("data-payment-status", "paid", timeout=SETTLE_MS)
                    shoot(page, "order-paid.png")
                finally:
                    browser.close()
        finally:
            stack.shop.stop()
            stack.emulator.stop()
    return 0


def shoot(page: Page, name: str) -> None:
    path = OUT / name
    page.screenshot(path=str(path), full_page=False)
    print(f"wrote {path.relative_to(ROOT)} ({path.stat().st_size // 1024} KiB)")  # noqa: T201


if __name__ == "__main__":
    sys.exit(main())
