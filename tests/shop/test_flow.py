"""The shopper's journey end to end, in-process: checkout, the gateway, the way back, the order page."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest
import requests
from requests.adapters import BaseAdapter

from example_shop.models import (
    OrderStatus,
    latest_checkout,
    mark_paid,
    on_checkout_cancelled,
    on_payment_confirmed,
    on_refund_succeeded,
)
from flask_gateway.signals import checkout_cancelled, payment_confirmed
from flask_gateway.state import get_state
from flask_gateway.testing import GatewayEmulator
from tests.shop.conftest import (
    CUSTOMER,
    EMULATOR_URL,
    SHOP_URL,
    ShopHarness,
    Shopper,
    csrf_token,
    make_harness,
)

V2_PAYMENT_PAGE = re.compile(
    re.escape(EMULATOR_URL) + r"/api/v2/app/checkout/v2\.demo-merchant\.[0-9a-f-]{36}"
)
V1_PAYMENT_PAGE = re.compile(re.escape(EMULATOR_URL) + r"/api/v1/app/checkout/[0-9a-f]{32}")


def _status(shopper: Shopper, order_page: str) -> Any:
    answer = shopper.get(order_page + "/status.json")
    assert answer.status_code == 200
    assert answer.headers["Cache-Control"] == "no-store"
    return answer.json


def _cart_count(shopper: Shopper) -> int:
    match = re.search(r"data-cart-count>(\d+)<", shopper.get("/cart").get_data(as_text=True))
    assert match
    return int(match.group(1))


def _order_page(shopper: Shopper, reference: str) -> str:
    """The signed order link, as this session (which placed the order) is sent on to it."""
    answer = shopper.get(f"/orders/{reference}")
    assert answer.status_code == 303, answer.status
    return answer.headers["Location"]


@pytest.mark.backends
def test_v2_pay_confirm_by_callback_then_return_paid_once(
    gateway_emulator: GatewayEmulator, plugin_shop: ShopHarness
) -> None:
    shop, shopper = plugin_shop, plugin_shop.shopper()
    shopper.add("enamel-kettle", 2)

    redirect = shopper.checkout()

    # A full-page redirect (303 See Other) to the gateway's payment page.
    assert redirect.status_code == 303
    assert V2_PAYMENT_PAGE.fullmatch(redirect.headers["Location"])
    reference = shop.latest_reference()
    assert shop.order(reference).status == "processing"
    order_page = _order_page(shopper, reference)
    assert order_page.startswith("/orders/view/")
    assert _status(shopper, order_page)["status"] == "processing"
    page = shopper.get(order_page).get_data(as_text=True)
    assert 'data-payment-status="processing">Processing<' in page
    assert f'data-status-url="{order_page}/status.json"' in page  # the page polls while processing
    assert '<noscript><meta http-equiv="refresh"' in page

    outcome = gateway_emulator.pay(redirect)
    assert _status(shopper, order_page)["status"] == "processing"  # paid, but not proven yet
    gateway_emulator.assert_not_fulfilled(reference)

    # The gateway's signed callback arrives: the order is paid (the page's next poll sees it).
    assert gateway_emulator.deliver() == 1
    status = _status(shopper, order_page)
    assert status["status"] == "paid"
    assert status["final"] is True
    assert 'data-payment-status="paid">Paid<' in status["html"]
    assert status["cart_count"] == 0  # the cart went with the paid order (the page updates its header)
    callbacks = gateway_emulator.callbacks(redirect)
    assert any(attempt.get("httpStatus") == 200 for attempt in callbacks), callbacks

    # The shopper comes back through the return page (which asks getstatus: already known).
    assert outcome.redirect_url is not None
    back = shopper.get(outcome.redirect_url)
    assert back.status_code == 303
    assert back.headers["Location"] == f"/orders/{reference}"
    landing = shopper.follow(back)
    html = landing.get_data(as_text=True)
    assert landing.status_code == 200
    assert 'data-payment-status="paid">Paid<' in html
    assert f"<span data-order-reference>{reference}</span>" in html
    assert "data-status-url" not in html and "refresh" not in html  # final: no more polling
    assert landing.headers["Cache-Control"] == "no-store"
    assert landing.headers["Referrer-Policy"] == "no-referrer"

    order = shop.order(reference)
    assert order.status == "paid"
    assert order.paid_at is not None and order.fulfilled_at is not None
    assert shop.events(reference, "paid") == 1  # fulfilled exactly once
    assert gateway_emulator.assert_fulfilled_once(reference).source == "callback"
    # The cart belonged to the paid order: it is empty now.
    assert _cart_count(shopper) == 0
    with shop.app.app_context():  # a late, repeated signal changes nothing
        assert mark_paid(reference, "callback") is False
    assert shop.events(reference, "paid") == 1


def test_what_the_gateway_receives(shop: ShopHarness, shopper: Shopper) -> None:
    shopper.add("enamel-kettle", 2)
    shopper.add("rooibos-tin", 1)
    redirect = shopper.checkout()
    token = redirect.headers["Location"].rsplit("/", 1)[1]

    on_gateway = shop.emulator.control(f"checkouts/{token}", method="GET").json
    assert on_gateway["checkoutTotalCents"] == 84300  # 2 x R 399.00 + R 45.00, in cents
    assert on_gateway["merchantOrderReference"] == shop.latest_reference()
    with shop.app.app_context():  # the order as the extension sent it
        sent = latest_checkout(shop.latest_reference()).order
    kettle, tin = sent["lines"]
    assert (kettle["sku"], kettle["quantity"], kettle["unit_price_cents"]) == ("STP-KIT-001", 2, 39900)
    assert kettle["image_url"] == f"{SHOP_URL}/static/shop/products/enamel-kettle.svg"
    assert tin["page_url"] == f"{SHOP_URL}/products/rooibos-tin"
    assert sent["customer"]["phone"] == "+27821234567"
    assert sent["billing_address"]["province"] == "Western Cape"


def test_cancel_on_the_gateway_keeps_the_cart(
    gateway_emulator: GatewayEmulator, plugin_shop: ShopHarness
) -> None:
    shop, shopper = plugin_shop, plugin_shop.shopper()
    shopper.add("ilala-basket", 1)
    shopper.add("enamel-kettle", 1)
    redirect = shopper.checkout()
    reference = shop.latest_reference()

    outcome = gateway_emulator.cancel_as_consumer(redirect)
    assert outcome.status == "CANCELLED_BY_CONSUMER" and outcome.redirect_url is not None
    landing = shopper.follow(shopper.get(outcome.redirect_url))

    html = unescape(landing.get_data(as_text=True))
    assert landing.status_code == 200
    assert 'data-payment-status="cancelled">Cancelled<' in html
    assert "Your cart is still here" in html
    assert "Nothing was charged" in html
    assert shop.order(reference).status == "cancelled"
    assert _cart_count(shopper) == 2
    assert 'data-cart-line="ilala-basket"' in shopper.get("/cart").get_data(as_text=True)

    # Checking out again places a new order, which can be paid.
    again = shopper.checkout()
    assert again.status_code == 303
    assert again.headers["Location"] != redirect.headers["Location"]
    second = shop.latest_reference()
    assert second != reference
    paid = gateway_emulator.pay(again)
    assert paid.redirect_url is not None
    shopper.follow(shopper.get(paid.redirect_url))
    assert shop.order(second).status == "paid"
    assert shop.order(reference).status == "cancelled"
    assert _cart_count(shopper) == 0
    gateway_emulator.assert_fulfilled_once(second)  # on the shopper's return, before any callback
    gateway_emulator.assert_not_fulfilled(reference)


def test_a_second_submit_reuses_the_order_and_the_checkout(shop: ShopHarness, shopper: Shopper) -> None:
    shopper.add("mohair-throw", 1)

    first = shopper.checkout()
    second = shopper.checkout()  # a double click, or Back from the payment page

    assert first.status_code == second.status_code == 303
    assert first.headers["Location"] == second.headers["Location"]
    assert shop.events(shop.latest_reference(), "placed") == 1

    # A changed cart is a new order.
    shopper.add("rooibos-tin", 1)
    third = shopper.checkout()
    assert third.headers["Location"] != first.headers["Location"]


def _checkout_page_form(shopper: Shopper) -> dict[str, str]:
    """The checkout page's form as a browser sends it: its CSRF token and its ``attempt``, filled in."""
    page = shopper.get("/checkout").get_data(as_text=True)
    attempt = re.search(r'name="attempt"[^>]*value="([^"]+)"', page)
    assert attempt is not None, "no attempt field on the checkout page"
    return {"csrf_token": csrf_token(page), "attempt": unescape(attempt[1]), **CUSTOMER}


def test_a_submit_sent_before_the_first_answer_reuses_the_order(shop: ShopHarness, shopper: Shopper) -> None:
    """A real double click: the second submit leaves before the first one's answer (and the session cookie
    that remembers the order) is back. The page's ``attempt`` names the order: one order, one checkout."""
    shopper.add("mohair-throw", 1)
    form = _checkout_page_form(shopper)
    cookie = shopper.client.get_cookie("stoep_session", domain="shop.example")
    assert cookie is not None

    first = shopper.post("/checkout", form)
    shopper.client.set_cookie("stoep_session", cookie.value, domain="shop.example")  # the cookie of before
    second = shopper.post("/checkout", form)

    assert first.status_code == second.status_code == 303
    assert first.headers["Location"] == second.headers["Location"]
    reference = shop.latest_reference()
    assert shop.events(reference, "placed") == 1

    # The same page with other details is another order; so is a forged attempt.
    shopper.client.set_cookie("stoep_session", cookie.value, domain="shop.example")
    changed = shopper.post("/checkout", {**form, "email": "other@example.com"})
    assert changed.status_code == 303 and changed.headers["Location"] != first.headers["Location"]
    assert shop.latest_reference() != reference
    shopper.client.set_cookie("stoep_session", cookie.value, domain="shop.example")
    forged = shopper.post("/checkout", {**form, "attempt": "STP-AAAAAAAA"})
    assert forged.status_code == 303 and forged.headers["Location"] != first.headers["Location"]


def test_the_order_page_needs_the_signed_link(shop: ShopHarness, shopper: Shopper) -> None:
    shopper.add("enamel-kettle", 1)
    shopper.checkout()
    reference = shop.latest_reference()
    order_page = _order_page(shopper, reference)

    stranger = shop.shopper()
    # The plain reference only works for the session that placed the order (and nothing leaks).
    refused = stranger.get(f"/orders/{reference}")
    assert refused.status_code == 403
    assert "Use your private order link" in refused.get_data(as_text=True)
    assert reference not in refused.get_data(as_text=True)
    assert stranger.get("/orders/STP-NOSUCH00").status_code == 403
    # The signed link is the key: it works anywhere, an edited one nowhere.
    assert stranger.get(order_page).status_code == 200
    token = order_page.rsplit("/", 1)[1]
    forged = "/orders/view/" + token[:-2] + ("AA" if not token.endswith("AA") else "BB")
    assert stranger.get(forged).status_code == 404
    assert stranger.get(forged + "/status.json").status_code == 404
    assert stranger.get("/orders/view/STP-NOSUCH00").status_code == 404


@pytest.mark.backends
def test_a_failed_receiver_is_caught_up_from_the_gateway_record(shop: ShopHarness, shopper: Shopper) -> None:
    shopper.add("enamel-kettle", 1)
    redirect = shopper.checkout()
    reference = shop.latest_reference()
    order_page = _order_page(shopper, reference)

    payment_confirmed.disconnect(on_payment_confirmed)  # as if the receiver had failed
    try:
        shop.pay_on_gateway(redirect.headers["Location"])
        shop.emulator.control("deliver")
        assert shop.order(reference).status == "processing"
    finally:
        payment_confirmed.connect(on_payment_confirmed)

    assert _status(shopper, order_page)["status"] == "paid"
    assert shop.events(reference, "paid") == 1


def test_a_cancellation_caught_up_from_the_gateway_record_is_told_in_words(
    shop: ShopHarness, shopper: Shopper
) -> None:
    shopper.add("enamel-kettle", 1)
    shopper.checkout()
    reference = shop.latest_reference()
    owner = shop.shopper()
    owner.log_in()
    page = f"/admin/orders/{reference}"

    checkout_cancelled.disconnect(on_checkout_cancelled)  # as if the receiver had failed
    try:
        owner.submit(page, f"{page}/cancel")
        assert shop.order(reference).status == "processing"
    finally:
        checkout_cancelled.connect(on_checkout_cancelled)

    history = unescape(owner.get(page).get_data(as_text=True)).split('id="history-title"')[1]
    assert shop.order(reference).status == "cancelled"
    assert "the gateway says cancelled by the shop (CANCELLED_BY_MERCHANT)" in history


def test_an_expired_checkout_expires_the_order_and_keeps_the_cart(
    gateway_emulator: GatewayEmulator, plugin_shop: ShopHarness
) -> None:
    shop, shopper = plugin_shop, plugin_shop.shopper()
    shopper.add("enamel-kettle", 1)
    redirect = shopper.checkout()
    reference = shop.latest_reference()

    gateway_emulator.expire(redirect)  # past the 60-minute payment window
    # The gateway sends no callback for an expiry: the shop's reconciliation (cron) asks for it.
    result = shop.app.test_cli_runner().invoke(args=["gateway", "reconcile", "--older-than", "0"])
    assert result.exit_code == 0, result.output

    assert shop.order(reference).status == OrderStatus.EXPIRED
    page = unescape(shopper.get(_order_page(shopper, reference)).get_data(as_text=True))
    assert 'data-payment-status="expired">Expired<' in page
    assert "Your cart is still here" in page
    assert [(s.signal, s.source) for s in gateway_emulator.signals] == [("checkout_expired", "reconcile")]
    gateway_emulator.assert_not_fulfilled(reference)


class _Unreachable(BaseAdapter):
    def send(self, request, *args, **kwargs):  # type: ignore[no-untyped-def]
        raise requests.ConnectionError("connection refused", request=request)

    def close(self) -> None:
        pass


def test_a_gateway_outage_at_checkout_keeps_everything_for_a_retry(
    shop: ShopHarness, shopper: Shopper
) -> None:
    shopper.add("enamel-kettle", 1)
    options = get_state(shop.app).client_options
    working = options["session"]
    down = requests.Session()
    down.mount(EMULATOR_URL, _Unreachable())
    options["session"] = down

    answer = shopper.checkout()

    assert answer.status_code == 502
    assert "couldn't reach the payment provider" in unescape(answer.get_data(as_text=True))
    reference = shop.latest_reference()
    assert shop.order(reference).status == "processing"  # the outcome is unknown: kept for the retry
    assert _cart_count(shopper) == 1

    options["session"] = working
    retry = shopper.checkout()
    assert retry.status_code == 303
    assert shop.latest_reference() == reference  # the same order, the same requestId


@pytest.fixture
def v1_shop(databases, monkeypatch: pytest.MonkeyPatch) -> ShopHarness:
    return make_harness(databases, monkeypatch, GATEWAY_API_VERSION="v1")


@pytest.mark.backends
def test_v1_pay_and_return_paid_once(v1_shop: ShopHarness) -> None:
    shopper = v1_shop.shopper()
    shopper.add("brass-desk-lamp", 1)

    redirect = shopper.checkout()

    assert redirect.status_code == 303
    assert V1_PAYMENT_PAGE.fullmatch(redirect.headers["Location"])
    reference = v1_shop.latest_reference()
    assert v1_shop.order(reference).api_version == "v1"

    # Paying calls the shop's signed v1 success URL (in-process): that is the proof.
    outcome = v1_shop.pay_on_gateway(redirect.headers["Location"])
    assert outcome["merchantMessage"] == "OK"
    assert v1_shop.order(reference).status == "paid"

    landing = shopper.follow(shopper.get(outcome["redirectUrl"]))
    assert 'data-payment-status="paid">Paid<' in landing.get_data(as_text=True)
    assert v1_shop.events(reference, "paid") == 1
    assert _cart_count(shopper) == 0


@pytest.mark.backends
def test_v1_cancel_keeps_the_cart(v1_shop: ShopHarness) -> None:
    shopper = v1_shop.shopper()
    shopper.add("brass-desk-lamp", 1)
    redirect = shopper.checkout()

    outcome = v1_shop.cancel_on_gateway(redirect.headers["Location"])
    landing = shopper.follow(shopper.get(outcome["redirectUrl"]))

    html = unescape(landing.get_data(as_text=True))
    assert 'data-payment-status="cancelled">Cancelled<' in html
    assert "Your cart is still here" in html
    assert _cart_count(shopper) == 1


def test_an_order_refunded_at_the_gateway_before_its_payment_was_known_is_never_fulfilled(
    shop: ShopHarness, shopper: Shopper
) -> None:
    from flask_gateway.core.wire import RefundRequest

    shopper.add("enamel-kettle", 1)
    redirect = shopper.checkout()
    reference = shop.latest_reference()
    shop.pay_on_gateway(redirect.headers["Location"])  # paid; the callback never arrives
    with shop.app.app_context():
        checkout = latest_checkout(reference)
        assert checkout is not None and checkout.token is not None
        client = get_state().client()
        client.refund(
            RefundRequest(
                checkoutToken=checkout.token,
                merchantRefundReference="at-the-gateway",
                refundAmountCents=checkout.total_cents,
                refundDescription="refunded on the gateway's dashboard",
            )
        )

    result = shop.app.test_cli_runner().invoke(args=["gateway", "reconcile", "--older-than", "0"])
    assert result.exit_code == 0, result.output

    order = shop.order(reference)
    assert order.status == OrderStatus.REFUNDED
    assert order.paid_at is None and order.fulfilled_at is None  # never sent to packing
    assert shop.events(reference, "paid") == 0
    with shop.app.app_context():
        checkout = latest_checkout(reference)
        assert checkout is not None and checkout.flagged and checkout.payment_confirmed_at is None


@pytest.mark.backends
def test_a_refund_whose_event_came_before_the_payments_is_kept(shop: ShopHarness, shopper: Shopper) -> None:
    """At-least-once delivery can reorder: the payment's event failed and is retried after the refund's was
    delivered (and dropped: the order was not paid yet). The payment's receiver catches the refund up."""
    shopper.add("enamel-kettle", 1)
    shopper.checkout()
    reference = shop.latest_reference()
    with shop.app.app_context():
        checkout = latest_checkout(reference)
        assert checkout is not None
        checkout.refunded_cents = 15000  # what the gateway record says once the refund was recorded
        on_refund_succeeded(shop.app, checkout, refund=None, amount_cents=15000)
        assert shop.order(reference).refunded_cents == 0  # not paid yet: nothing to refund
        on_payment_confirmed(shop.app, checkout, source="deliver", event_id=1)
        on_payment_confirmed(shop.app, checkout, source="deliver", event_id=1)  # delivered again
    order = shop.order(reference)
    assert (order.status, order.refunded_cents) == ("partially-refunded", 15000)
    assert shop.events(reference, "paid") == 1
    assert shop.events(reference, "refund") == 1
