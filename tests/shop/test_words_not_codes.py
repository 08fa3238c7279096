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
from example_shop.models import OrderStatus
from flask_gateway import GatewayCheckout
from flask_gateway.core.wire.common import CheckoutStatus
from flask_gateway.models import CallbackOutcome, LocalStatus, RefundState
from flask_gateway.testing import GatewayEmulator
from tests.shop.conftest import ShopHarness, Shopper

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

    with shop.app.app_context():
        checkouts = {c.order_reference: c.id for c in db.session.scalars(db.select(GatewayCheckout))}
        cents = {o.total_cents for o in (shop.order(r) for r in references)} | {1050}
        cents |= {c.total_cents for c in db.session.scalars(db.select(GatewayCheckout))}
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
        found = _problems(text, cents)
        if found:
            problems[name] = sorted(set(found))
    assert not problems, "\n".join(f"{name}: {found}" for name, found in problems.items())

    # One clock: the shop's and the gateway's pages show their times in SAST, the same way.
    for name in (
        "/gateway/admin/checkouts",
        "/gateway/admin/callbacks",
        *(f"/admin/orders/{reference}" for reference in references),
        *(f"/gateway/admin/checkouts/{checkouts[reference]}" for reference in references),
        *(f"shopper's page of {reference}" for reference in references),
    ):
        assert _ZONE_TIME.search(visible_text(pages[name])), name


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
