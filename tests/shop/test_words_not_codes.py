"""Issue 28, points 1 and 2: every page an owner or a shopper reads shows words and money, in one clock.

The example shop (its pages and the gateway's admin screens inside it) is walked with a paid order, one
refunded in part, one refunded in full, one cancelled by the shopper, one cancelled by the shop and one
expired. On each page the *visible text* is read: the text of the elements, without attributes (the ``title``
tooltips keep the codes on purpose), without ``<script>``/``<style>``, and without the bodies of
``<details>`` (their ``<summary>`` is read): those hold the raw data an owner opens on purpose (a callback's
body, everything stored with a checkout), as a tooltip does.

Not found there: a status code of the gateway or of the extension (``PAID_PENDING_CALLBACK``, ``FAILED``,
...), a refund state (``SUCCEEDED``), a callback outcome or shop status written as a code
(``confirm-failed``, ``partially-refunded``; the one-word ones such as ``paid`` or ``accepted`` are English
words and cannot be told apart from prose), an event source in brackets (``(return)``), an API version as a
code (``v2 checkout``, ``(v2)``), a ``->`` between codes, ``getstatus``, and cents (the word, or an amount
in cents as a bare number such as ``10050``). Every time shown is in the configured zone with its name (the
example shop sets ``Africa/Johannesburg``: SAST), never in UTC.
"""

from __future__ import annotations

import re
from html.parser import HTMLParser
from urllib.parse import urlsplit

import pytest
from werkzeug.test import TestResponse

from example_shop.extensions import db
from example_shop.models import OrderStatus, latest_checkout
from flask_gateway import GatewayCheckout
from flask_gateway.clock import format_time, zone
from flask_gateway.core.wire.common import CheckoutStatus
from flask_gateway.labels import api_label, describe_detail
from flask_gateway.models import CallbackOutcome, LocalStatus, RefundState
from flask_gateway.testing import GatewayEmulator
from tests.conftest import Databases
from tests.shop.conftest import ShopHarness, Shopper, make_harness

_SAST = zone("Africa/Johannesburg")
_SKIPPED = frozenset({"script", "style", "template"})
_VOID = frozenset(
    {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source", "track", "wbr"}
)


class _VisibleText(HTMLParser):
    """The text a person reads: no attributes, no script or style, no ``<details>`` body but its summary."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._stack: list[str] = []

    def _hidden(self) -> bool:
        if any(tag in _SKIPPED for tag in self._stack):
            return True
        # Inside a <details>, only its <summary> is shown until the owner opens it.
        for index, tag in enumerate(self._stack):
            if tag == "details" and "summary" not in self._stack[index + 1 :]:
                return True
        return False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag not in _VOID:
            self._stack.append(tag)
        if tag in ("br", "td", "th", "dd", "dt", "li", "p", "option"):
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in self._stack:
            while self._stack and self._stack.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if not self._hidden():
            self.parts.append(data)


def visible_text(html: str) -> str:
    parser = _VisibleText()
    parser.feed(html)
    parser.close()
    return " ".join("".join(parser.parts).split(" "))


def _words(html: str) -> str:
    return " ".join(visible_text(html).split())


_CODES = sorted(
    {s.value for s in CheckoutStatus}
    | {s.value for s in LocalStatus}
    | {s.value for s in RefundState}
    | {o.value for o in CallbackOutcome if "-" in o.value}
    | {s.value for s in OrderStatus if "-" in s.value},
    key=len,
    reverse=True,
)
_CODE = re.compile(r"(?<![\w-])(" + "|".join(map(re.escape, _CODES)) + r")(?![\w-])")
_SOURCE = re.compile(r"\((create|update|cancel|refund|callback|return|v1|v2|poll|reconcile|admin)\)")
_API = re.compile(r"(?<![\w.])v[12] checkout|\(v[12]\)")
_ZONE_TIME = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}(?::\d{2})? SAST")
_OTHER_TIME = re.compile(r"\d{1,2}:\d{2}(?::\d{2})? (?!SAST)[A-Z]{2,5}\b")


def _problems(text: str, cents: set[int]) -> list[str]:
    found = [f"code {m.group(1)!r}" for m in _CODE.finditer(text)]
    found += [f"source {m.group(0)!r}" for m in _SOURCE.finditer(text)]
    found += [f"API version {m.group(0)!r}" for m in _API.finditer(text)]
    found += ["'->'"] * ("->" in text)
    found += ["'getstatus'"] * ("getstatus" in text.lower())
    found += [f"'cents' in {m.group(0)!r}" for m in re.finditer(r".{0,30}\bcents\b", text, re.IGNORECASE)]
    for amount in cents:
        found += [f"bare cents {amount}"] * bool(re.search(rf"(?<![\w.,]){amount}(?!\w)", text))
    found += [f"time not in SAST: {m.group(0)!r}" for m in _OTHER_TIME.finditer(text)]
    return found


def _order(shop: ShopHarness, shopper: Shopper, slug: str, quantity: int = 1) -> tuple[str, str]:
    """A new order sent to the payment page: its reference and the payment page's address."""
    shopper.add(slug, quantity)
    redirect = shopper.checkout()
    assert redirect.status_code == 303, redirect.status
    return shop.latest_reference(), redirect.headers["Location"]


def _paid(
    emulator: GatewayEmulator, shop: ShopHarness, shopper: Shopper, slug: str, quantity: int = 1
) -> str:
    """Paid on the payment page, back on the shop's page (the return's check), then the callback."""
    reference, payment_page = _order(shop, shopper, slug, quantity)
    shopper.follow(shopper.get(shop.pay_on_gateway(payment_page)["redirectUrl"]))
    assert emulator.deliver() >= 1
    assert shop.order(reference).status == OrderStatus.PAID
    return reference


def _confirmation(html: str) -> dict[str, str]:
    form = html.split("data-refund-confirm", 1)[1].split("</form>", 1)[0]
    return dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)"', form))


def _refund(owner: Shopper, reference: str, data: dict[str, str]) -> None:
    page = f"/admin/orders/{reference}"
    review = owner.submit(page, f"{page}/refund", data)
    assert review.status_code == 200, review.status
    done = owner.post(f"{page}/refund", _confirmation(review.get_data(as_text=True)))
    assert done.status_code == 303, done.status


def _read(client: Shopper, path: str) -> str:
    answer: TestResponse = client.get(path)
    assert answer.status_code == 200, (path, answer.status)
    return answer.get_data(as_text=True)


@pytest.mark.backends
def test_every_page_of_every_kind_of_order_reads_as_words_money_and_local_time(
    gateway_emulator: GatewayEmulator, plugin_shop: ShopHarness
) -> None:
    shop, shopper, owner = plugin_shop, plugin_shop.shopper(), plugin_shop.shopper()
    owner.log_in()

    expired, payment_page = _order(shop, shopper, "enamel-kettle")
    gateway_emulator.expire(payment_page)  # the clock moves on: the other orders come after
    result = shop.app.test_cli_runner().invoke(args=["gateway", "reconcile", "--older-than", "0"])
    assert result.exit_code == 0, result.output

    paid = _paid(gateway_emulator, shop, shopper, "enamel-kettle")
    partly = _paid(gateway_emulator, shop, shopper, "ilala-basket", 2)
    fully = _paid(gateway_emulator, shop, shopper, "enamel-kettle", 2)
    _refund(owner, partly, {"amount": "10.50", "reason": "Scratched"})
    _refund(owner, fully, {"amount": "", "everything": "y"})

    by_shopper, payment_page = _order(shop, shopper, "ilala-basket")
    token = urlsplit(payment_page).path.rsplit("/", 1)[1]
    answer = shop.emulator.consumer_cancel(token)
    assert answer.status_code == 200
    shopper.follow(shopper.get(answer.json["redirectUrl"]))
    by_shop, _ = _order(shop, shopper, "enamel-kettle")
    cancelled = owner.submit(f"/admin/orders/{by_shop}", f"/admin/orders/{by_shop}/cancel")
    assert cancelled.status_code == 303

    references = [paid, partly, fully, by_shopper, by_shop, expired]
    expected = {
        paid: OrderStatus.PAID,
        partly: OrderStatus.PARTIALLY_REFUNDED,
        fully: OrderStatus.REFUNDED,
        by_shopper: OrderStatus.CANCELLED,
        by_shop: OrderStatus.CANCELLED,
        expired: OrderStatus.EXPIRED,
    }
    assert {reference: shop.order(reference).state for reference in references} == expected

    pages = _walk(shop, owner, shopper, references, refunded={1050})

    # One clock: the same moment reads the same on the shop's order page and the gateway's checkout page.
    with shop.app.app_context():
        checkout = latest_checkout(paid)
        assert checkout is not None and checkout.paid_at is not None
        gateway_paid = format_time(checkout.paid_at, _SAST)
        shop_placed = format_time(shop.order(paid).created_at, _SAST)
        shop_paid = format_time(shop.order(paid).paid_at, _SAST)
        checkout_id = checkout.id
    assert gateway_paid.endswith(" SAST") and shop_paid.endswith(" SAST")
    assert f"Paid at {gateway_paid}" in _words(pages[f"/gateway/admin/checkouts/{checkout_id}"])
    assert f"Placed {shop_placed}" in _words(pages[f"/admin/orders/{paid}"])
    assert f"paid {shop_paid}" in _words(pages[f"/admin/orders/{paid}"])


@pytest.mark.backends
def test_the_pages_of_classic_v1_orders_read_as_words_too(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    shop = make_harness(databases, monkeypatch, GATEWAY_API_VERSION="v1")
    shopper, owner = shop.shopper(), shop.shopper()
    owner.log_in()
    paid, payment_page = _order(shop, shopper, "brass-desk-lamp")
    shopper.follow(shopper.get(shop.pay_on_gateway(payment_page)["redirectUrl"]))
    _refund(owner, paid, {"amount": "10.50"})
    cancelled, payment_page = _order(shop, shopper, "brass-desk-lamp")
    shopper.follow(shopper.get(shop.cancel_on_gateway(payment_page)["redirectUrl"]))
    waiting, _ = _order(shop, shopper, "enamel-kettle")
    states = [shop.order(reference).state for reference in (paid, cancelled, waiting)]
    assert states == [OrderStatus.PARTIALLY_REFUNDED, OrderStatus.CANCELLED, OrderStatus.PROCESSING]

    pages = _walk(shop, owner, shopper, [paid, cancelled, waiting], refunded={1050})
    assert "Classic checkout" in _words(pages[f"/admin/orders/{paid}"])


def _walk(
    shop: ShopHarness, owner: Shopper, shopper: Shopper, references: list[str], refunded: set[int]
) -> dict[str, str]:
    """Every owner page and each order's shopper page, checked: their HTML by name."""
    with shop.app.app_context():
        found = db.session.scalars(db.select(GatewayCheckout).order_by(GatewayCheckout.id)).all()
        checkouts = {c.order_reference: c.id for c in found}
        cents = {shop.order(r).total_cents for r in references} | refunded | {c.total_cents for c in found}
    # Amounts shorter than four digits could be anything on a page (a year, a count): the test's are longer.
    assert all(amount >= 1000 for amount in cents)

    pages: dict[str, str] = {}
    for path in (
        "/admin/",
        "/gateway/admin/",
        "/gateway/admin/checkouts",
        "/gateway/admin/callbacks",
        "/gateway/admin/outbox/",
        *(f"/admin/orders/{reference}" for reference in references),
        *(f"/gateway/admin/checkouts/{checkouts[reference]}" for reference in references),
    ):
        pages[path] = _read(owner, path)
    for reference in references:
        link = re.search(r'<a href="([^"]+)">shopper\'s private link', pages[f"/admin/orders/{reference}"])
        assert link, reference
        pages[f"shopper's page of {reference}"] = _read(shopper, link.group(1))

    problems = {}
    for name, html in pages.items():
        text = visible_text(html)
        found_here = _problems(text, cents)
        if found_here:
            problems[name] = sorted(set(found_here))
    assert not problems, "\n".join(f"{name}: {found}" for name, found in problems.items())

    # One clock: the shop's and the gateway's pages show their times in SAST, the same way.
    for name in (
        "/gateway/admin/checkouts",
        *(f"/admin/orders/{reference}" for reference in references),
        *(f"/gateway/admin/checkouts/{checkouts[reference]}" for reference in references),
        *(f"shopper's page of {reference}" for reference in references),
    ):
        assert _ZONE_TIME.search(visible_text(pages[name])), name
    return pages


@pytest.mark.parametrize(
    ("stored", "shown"),
    [
        ("getstatus: PAID_PENDING_CALLBACK", "status check: Paid - confirming"),
        ("refund #1: 10050 cents", "refund #1: R 100.50"),
        ("updated: total 10050 cents", "updated: total R 100.50"),
        ("PAID_PENDING_CALLBACK -> PAID", "Paid - confirming → Paid"),
        ("already PAID", "already Paid"),
        ("refunded 123400 cents in all", "refunded R 1 234.00 in all"),
        (
            "REFUSED: total 10050 cents does not match the checkout's 10000",
            "Refused: total R 100.50 does not match the checkout's R 100.00",
        ),
        (
            "payment confirmed (return); sent to packing",
            "payment confirmed (shopper came back); sent to packing",
        ),
        ("cancelled by the shopper (callback)", "cancelled by the shopper (gateway callback)"),
        ("3 item(s), v2 checkout", "3 item(s), standard checkout"),
        ("sent to the payment page (v1)", "sent to the payment page (classic checkout)"),
        (
            "the gateway says cancelled by the shop (CANCELLED_BY_MERCHANT)",
            "the gateway says cancelled by the shop",
        ),
        (
            "v1 fail URL: ABANDONED (expired)",
            "classic checkout's failure address: left without paying (expired)",
        ),
        (
            "refunded at the gateway, not through the shop (seen by poll)",
            "refunded at the gateway, not through the shop (seen by status check)",
        ),
        (
            "status PENDING_ORDER is not acted on from a callback",
            "status Awaiting payment is not acted on from a callback",
        ),
        ("Statuses now: EXPIRED 1", "Statuses now: Expired 1"),
        ("a NEW_STATUS this version does not know", "a NEW_STATUS this version does not know"),
        ("", ""),
        (None, ""),
    ],
)
def test_a_stored_detail_reads_as_words_and_money(stored: str | None, shown: str) -> None:
    assert describe_detail(stored) == shown


def test_a_detail_shows_the_configured_currency_and_the_api_in_words() -> None:
    assert describe_detail("refund #2: 5000 cents", "$") == "refund #2: $ 50.00"
    assert (api_label("v2"), api_label("v1"), api_label("v9")) == (
        "Standard checkout",
        "Classic checkout",
        "v9",
    )


def test_the_visible_text_leaves_out_attributes_scripts_and_details_bodies() -> None:
    html = (
        '<p title="PAID">Paid <span data-status="PAID">now</span></p><script>var s = "PAID";</script>'
        "<details><summary>Body PARTLY</summary><pre>{'status': 'PAID'}</pre></details><td>R 100.50</td>"
    )
    text = visible_text(html)
    assert "Paid now" in text and "Body PARTLY" in text and "R 100.50" in text
    assert "PAID" not in text.replace("PARTLY", "")
    assert _problems(
        "getstatus: PAID_PENDING_CALLBACK -> PAID (return) v2 checkout 10050 cents", {10050}
    ) == [
        "code 'PAID_PENDING_CALLBACK'",
        "code 'PAID'",
        "source '(return)'",
        "API version 'v2 checkout'",
        "'->'",
        "'getstatus'",
        "'cents' in 'ID (return) v2 checkout 10050 cents'",
        "bare cents 10050",
    ]
    assert _problems("2026-11-27 11:51:09 UTC", set()) == ["time not in SAST: '11:51:09 UTC'"]
