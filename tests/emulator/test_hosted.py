"""The hosted payment pages (v2 ``paymentUrl``, v1 ``redirect_to``): HTML, CSRF, states, v1 merchant URLs."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from urllib.parse import urlsplit

import pytest
import responses
from responses import matchers

from flask_gateway.emulator import EmulatorSettings
from flask_gateway.emulator import clock as emulator_clock
from flask_gateway.emulator.views.hosted import format_rand
from tests.emulator.conftest import EMULATOR_TABLES, make_emulator
from tests.emulator.support import ACCOUNT, API_KEY, Gateway, create_body, service, v1_checkout_body

SUCCESS_URL = "https://shop.example/gateway/v1/success"
FAIL_URL = "https://shop.example/gateway/v1/fail"
RETURN_URL = "https://shop.example/orders/order-1"
PAY_BUTTON = re.compile(r"<button[^>]*>\s*Pay\s*</button>")
CANCEL_BUTTON = re.compile(r"<button[^>]*>\s*Cancel\s*</button>")


# --- helpers -----------------------------------------------------------------------------------------


def path_of(url: str) -> str:
    return urlsplit(url).path


def text(response) -> str:
    """The page's text with tags dropped and whitespace collapsed (what a reader sees)."""
    body = re.sub(r"<[^>]+>", " ", response.get_data(as_text=True))
    return " ".join(html.unescape(body).split())


def csrf_token(response) -> str:
    match = re.search(r'name="csrf_token" value="([^"]+)"', response.get_data(as_text=True))
    assert match, "the page has no CSRF token field"
    return match.group(1)


def open_page(gateway, page: str) -> tuple[str, str]:
    """GET the checkout page; its path and the CSRF token of its forms."""
    response = gateway.client.get(page)
    assert response.status_code == 200, response.get_data(as_text=True)
    return page, csrf_token(response)


def v2_checkout(gateway, **body) -> str:
    """A new v2 checkout; its payment page's path."""
    created = gateway.create(create_body(**body))
    return path_of(created["paymentUrl"])


def token_of(page: str) -> str:
    return page.rsplit("/", 1)[1]


def v1_status(gateway, token: str) -> str:
    response = gateway.control(f"checkouts/{token}", method="GET")
    assert response.status_code == 200
    return str(response.json["checkoutPaymentStatus"])


def v1_checkout(gateway) -> str:
    response = gateway.v1("checkout", v1_checkout_body())
    assert response.status_code == 200, response.get_data(as_text=True)
    return path_of(response.json["data"]["redirect_to"])


def merchant_url(rsps: responses.RequestsMock, url: str, query: dict[str, str], **answer) -> None:
    """The merchant's v1 success/fail URL, expecting exactly ``query`` (plus the shop's own ``s``)."""
    rsps.get(url, match=[matchers.query_param_matcher({"s": "abc", **query})], **answer)


@pytest.fixture
def merchant() -> Iterator[responses.RequestsMock]:
    """The merchant's side of the v1 flow; every registered URL must be called."""
    with responses.RequestsMock() as rsps:
        yield rsps


# --- money --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cents", "shown"),
    [
        (0, "R 0.00"),
        (5, "R 0.05"),
        (99, "R 0.99"),
        (100, "R 1.00"),
        (39900, "R 399.00"),
        (123456, "R 1 234.56"),
        (100000000, "R 1 000 000.00"),
        (123456789, "R 1 234 567.89"),
        (-150, "-R 1.50"),
    ],
)
def test_format_rand(cents, shown):
    assert format_rand(cents) == shown


# --- the v2 page --------------------------------------------------------------------------------------


def test_page_shows_items_total_plan_and_expiry(installed):
    item2 = {
        **service()["orderItems"][0],
        "name": "Toaster",
        "sku": "T-9",
        "quantity": 1,
        "priceCents": 123456,
    }
    page = v2_checkout(
        installed,
        total=203257,
        orderItems=[service()["orderItems"][0], item2],
        merchantOrderReference="ORD-4711",
    )
    response = installed.client.get(page)
    assert response.status_code == 200
    assert response.mimetype == "text/html"
    shown = text(response)
    assert "ORD-4711" in shown
    assert "Kettle" in shown and "K-1" in shown
    assert "Toaster" in shown and "T-9" in shown
    # quantity, unit price and line total of each line
    assert "Kettle Ref. K-1 2 R 399.00 R 798.00" in shown
    assert "Toaster Ref. T-9 1 R 1 234.56 R 1 234.56" in shown
    assert "Total R 2 032.57" in shown
    # 203257 // 3 = 67752 each, remainder 1 paid with the first instalment
    assert re.search(r"Instalment 1 due now \(\d{4}-\d\d-\d\d \d\d:\d\d UTC\) R 677.53", shown)
    assert re.search(r"Instalment 2 due \d{4}-\d\d-\d\d R 677.52", shown)
    assert re.search(r"Instalment 3 due \d{4}-\d\d-\d\d R 677.52", shown)
    assert "59 minutes left" in shown or "60 minutes left" in shown
    assert PAY_BUTTON.search(response.get_data(as_text=True))
    assert CANCEL_BUTTON.search(response.get_data(as_text=True))


def test_page_is_headed_with_the_shop_and_shows_every_time_in_one_zone_and_format(databases, monkeypatch):
    """Issue 36, point 9: the account's name (``EMULATOR_ACCOUNTS``' ``id:apikey:Name``) heads the page, the
    account id is small print; the due time, each instalment's date and the expiry are in
    ``EMULATOR_TIMEZONE``, in the format the shop writes (``2026-12-01 21:12 SAST``)."""
    settings = EmulatorSettings.from_env(
        {
            "EMULATOR_ACCOUNTS": f"{ACCOUNT}:{API_KEY}:Stoep Homeware",
            "EMULATOR_TIMEZONE": "Africa/Johannesburg",
        }
    )
    app = make_emulator(
        databases.url("named", schema=EMULATOR_TABLES),
        accounts=settings.accounts,
        account_names=settings.account_names,
        timezone=settings.timezone,
    )
    # 31 January, 20:30 UTC: 22:30 in Johannesburg; a month later is the end of February, then 31 March.
    at = datetime(2027, 1, 31, 20, 30, tzinfo=UTC)
    monkeypatch.setattr(emulator_clock, "utcnow", lambda: at)
    gateway = Gateway(app.test_client())
    gateway.install()
    page = v2_checkout(gateway, total=90000, orderExpiryMinutes=60)
    response = gateway.client.get(page)
    assert response.status_code == 200
    shown = text(response)
    body = response.get_data(as_text=True)
    assert re.search(r"<p class=\"merchant\" data-merchant-name>Stoep Homeware</p>", body), body[:600]
    assert f"Merchant account {ACCOUNT}" in shown
    assert ACCOUNT.upper() not in shown
    assert "Instalment 1 due now (2027-01-31 22:30 SAST) R 300.00" in shown
    assert "Instalment 2 due 2027-02-28 R 300.00" in shown
    assert "Instalment 3 due 2027-03-31 R 300.00" in shown
    assert "Pay before 2027-01-31 23:30 SAST" in shown
    assert "UTC" not in shown
    with app.app_context():
        from flask_gateway.emulator.models import db

        db.engine.dispose()


def test_an_account_without_a_name_is_headed_with_its_id(installed):
    body = installed.client.get(v2_checkout(installed)).get_data(as_text=True)
    assert f'<p class="merchant" data-merchant-name>{ACCOUNT}</p>' in body


def test_page_works_without_javascript_and_external_resources(installed):
    response = installed.client.get(v2_checkout(installed))
    page = response.get_data(as_text=True)
    assert "<script" not in page.lower()
    forms = re.findall(r'<form method="post" action="([^"]+)">', page)
    assert [form.rsplit("/", 1)[1] for form in forms] == ["pay", "cancel"]
    assert page.count('name="csrf_token"') == 2
    # every referenced resource is on this host (no CDN), and the stylesheet exists
    for url in re.findall(r'(?:src|href)="([^"]+)"', page):
        assert not url.startswith(("http:", "https:", "//")), url
    link = re.search(r'<link rel="stylesheet" href="([^"]+)"', page)
    assert link
    stylesheet = link.group(1)
    with installed.client.get(stylesheet) as css:
        assert css.status_code == 200
        assert ":focus-visible" in css.get_data(as_text=True)


def test_post_without_csrf_token_is_refused_and_changes_nothing(installed):
    page, _ = open_page(installed, v2_checkout(installed))
    token = token_of(page)
    for action in ("pay", "cancel"):
        response = installed.client.post(f"{page}/{action}")
        assert response.status_code == 400
        assert response.mimetype == "text/html"
        assert "could not be checked" in text(response)
        assert "Nothing was paid or cancelled" in text(response)
        assert installed.status(token)["checkoutPaymentStatus"] == "PENDING_ORDER"
    forged = installed.client.post(f"{page}/pay", data={"csrf_token": "forged"})
    assert forged.status_code == 400
    assert installed.status(token)["checkoutPaymentStatus"] == "PENDING_ORDER"


def test_csrf_token_of_another_session_is_refused(installed, emulator_app):
    page, token = open_page(installed, v2_checkout(installed))
    stranger = emulator_app.test_client()  # no session cookie: the token is not theirs
    response = stranger.post(f"{page}/pay", data={"csrf_token": token})
    assert response.status_code == 400
    assert installed.status(token_of(page))["checkoutPaymentStatus"] == "PENDING_ORDER"


def test_pay_redirects_to_confirm_url(installed):
    page, csrf = open_page(installed, v2_checkout(installed))
    response = installed.client.post(f"{page}/pay", data={"csrf_token": csrf})
    assert response.status_code == 303
    assert response.headers["Location"] == "https://shop.example/return/ok"
    assert installed.status(token_of(page))["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"


def test_cancel_redirects_to_cancel_url(installed):
    page, csrf = open_page(installed, v2_checkout(installed))
    response = installed.client.post(f"{page}/cancel", data={"csrf_token": csrf})
    assert response.status_code == 303
    assert response.headers["Location"] == "https://shop.example/return/cancel"
    assert installed.status(token_of(page))["checkoutPaymentStatus"] == "CANCELLED_BY_CONSUMER"


def test_cancelled_checkout_is_reopened_by_an_update(installed):
    page, csrf = open_page(installed, v2_checkout(installed))
    token = token_of(page)
    assert installed.client.post(f"{page}/cancel", data={"csrf_token": csrf}).status_code == 303

    cancelled = installed.client.get(page)
    assert cancelled.status_code == 200
    assert "You cancelled this checkout" in text(cancelled)
    assert not PAY_BUTTON.search(cancelled.get_data(as_text=True))
    refused = installed.client.post(f"{page}/pay", data={"csrf_token": csrf})
    assert refused.status_code == 409
    assert "You cancelled this checkout" in text(refused)
    assert installed.status(token)["checkoutPaymentStatus"] == "CANCELLED_BY_CONSUMER"

    update = {
        "checkoutToken": token,
        "payjustnow": service(merchantOrderReference="order-1b"),
        "checkoutTotalCents": 80000,
    }
    updated = installed.signed("/v2/update", update)
    assert updated.status_code == 200, updated.get_data(as_text=True)
    assert updated.json["checkoutPaymentStatus"] == "PENDING_ORDER"

    reopened = installed.client.get(page)
    assert reopened.status_code == 200
    assert PAY_BUTTON.search(reopened.get_data(as_text=True))
    assert "order-1b" in text(reopened)
    assert "Total R 800.00" in text(reopened)
    paid = installed.client.post(f"{page}/pay", data={"csrf_token": csrf_token(reopened)})
    assert paid.status_code == 303
    assert installed.status(token)["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"


@pytest.mark.backends
def test_expired_checkout_page(installed):
    page, csrf = open_page(installed, v2_checkout(installed))
    token = token_of(page)
    installed.advance(3601)

    response = installed.client.get(page)
    assert response.status_code == 410
    assert response.mimetype == "text/html"
    assert "This checkout has expired" in text(response)
    assert not PAY_BUTTON.search(response.get_data(as_text=True))

    for action in ("pay", "cancel"):
        refused = installed.client.post(f"{page}/{action}", data={"csrf_token": csrf})
        assert refused.status_code == 410
        assert "This checkout has expired" in text(refused)
    assert installed.status(token)["checkoutPaymentStatus"] == "EXPIRED"


@pytest.mark.backends
def test_page_expires_by_itself_when_the_clock_passes(installed, emulator_app):
    """Without the control API's sweep: the page notices ``expiresAt`` has passed and expires it."""
    page, csrf = open_page(installed, v2_checkout(installed, orderExpiryMinutes=10))
    from flask_gateway.emulator import clock
    from flask_gateway.emulator.models import db

    with emulator_app.app_context():
        clock.advance(601)
        db.session.commit()
    refused = installed.client.post(f"{page}/pay", data={"csrf_token": csrf})
    assert refused.status_code == 410
    assert "This checkout has expired" in text(refused)
    assert installed.status(token_of(page))["checkoutPaymentStatus"] == "EXPIRED"


def test_already_paid_page(installed):
    page, csrf = open_page(installed, v2_checkout(installed))
    assert installed.client.post(f"{page}/pay", data={"csrf_token": csrf}).status_code == 303

    shown = installed.client.get(page)
    assert shown.status_code == 200
    assert "This checkout is already paid" in text(shown)
    assert not PAY_BUTTON.search(shown.get_data(as_text=True))
    assert 'href="https://shop.example/return/ok"' in shown.get_data(as_text=True)

    for action in ("pay", "cancel"):  # a double click, the back button
        again = installed.client.post(f"{page}/{action}", data={"csrf_token": csrf})
        assert again.status_code == 409
        assert again.mimetype == "text/html"
        assert "This checkout is already paid" in text(again)
    assert installed.status(token_of(page))["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"


def test_checkout_cancelled_by_the_merchant(installed):
    page, csrf = open_page(installed, v2_checkout(installed))
    assert installed.signed("/v2/cancel", {"checkoutToken": token_of(page)}).status_code == 200
    shown = installed.client.get(page)
    assert shown.status_code == 200
    assert "The shop cancelled this checkout" in text(shown)
    refused = installed.client.post(f"{page}/pay", data={"csrf_token": csrf})
    assert refused.status_code == 409
    assert "The shop cancelled this checkout" in text(refused)
    assert installed.status(token_of(page))["checkoutPaymentStatus"] == "CANCELLED_BY_MERCHANT"


def test_unknown_token_is_a_404_page(installed):
    _, csrf = open_page(installed, v2_checkout(installed))
    for path in ("/api/v2/app/checkout/v2.demo-merchant.nope", "/api/v1/app/checkout/" + "0" * 32):
        response = installed.client.get(path)
        assert response.status_code == 404
        assert response.mimetype == "text/html"
        assert "Checkout not found" in text(response)
        posted = installed.client.post(f"{path}/pay", data={"csrf_token": csrf})
        assert posted.status_code == 404
        assert "Checkout not found" in text(posted)


def test_token_under_the_other_versions_path_is_not_found(installed):
    page, csrf = open_page(installed, v2_checkout(installed))
    wrong = page.replace("/api/v2/", "/api/v1/")
    assert installed.client.get(wrong).status_code == 404
    assert installed.client.post(f"{wrong}/pay", data={"csrf_token": csrf}).status_code == 404
    assert installed.status(token_of(page))["checkoutPaymentStatus"] == "PENDING_ORDER"


def test_every_page_forbids_framing_and_caching(installed):
    client = installed.client
    answers = {}
    page, csrf = open_page(installed, v2_checkout(installed))
    answers["checkout"] = client.get(page)
    answers["csrf refused"] = client.post(f"{page}/pay")
    answers["redirect after pay"] = client.post(f"{page}/pay", data={"csrf_token": csrf})
    answers["paid"] = client.get(page)
    answers["pay refused"] = client.post(f"{page}/pay", data={"csrf_token": csrf})
    answers["not found"] = client.get("/api/v2/app/checkout/nope")
    cancelled, csrf2 = open_page(installed, v2_checkout(installed, request_id="req-2"))
    client.post(f"{cancelled}/cancel", data={"csrf_token": csrf2})
    answers["cancelled"] = client.get(cancelled)
    expiring = v2_checkout(installed, request_id="req-3")
    installed.advance(3601)
    answers["expired"] = client.get(expiring)
    answers["method not allowed"] = client.put(page)
    assert {name: r.status_code for name, r in answers.items()} == {
        "checkout": 200,
        "csrf refused": 400,
        "redirect after pay": 303,
        "paid": 200,
        "pay refused": 409,
        "not found": 404,
        "cancelled": 200,
        "expired": 410,
        "method not allowed": 405,
    }
    with client.get("/static/emulator/hosted.css") as stylesheet:
        answers["stylesheet"] = stylesheet
    for name, response in answers.items():
        assert response.headers.get("X-Frame-Options") == "DENY", name
        assert response.headers.get("Content-Security-Policy") == "frame-ancestors 'none'", name
    for name in ("checkout", "csrf refused", "paid", "pay refused", "not found", "cancelled", "expired"):
        assert answers[name].headers.get("Cache-Control") == "no-store", name
        assert answers[name].mimetype == "text/html", name


# --- v1 ------------------------------------------------------------------------------------------------


def test_v1_page_shows_items_total_and_plan(installed):
    page = v1_checkout(installed)
    assert page.startswith("/api/v1/app/checkout/")
    response = installed.client.get(page)
    assert response.status_code == 200
    shown = text(response)
    assert "order-1" in shown
    assert "Paying as Thandi Mokoena" in shown
    assert "Kettle Ref. K-1 2 R 399.00 R 798.00" in shown
    assert "Total R 798.00" in shown
    assert "Instalment 1 due now" in shown and re.search(r"Instalment 3 due \d{4}-\d\d-\d\d R 266.00", shown)
    assert PAY_BUTTON.search(response.get_data(as_text=True))


def test_v1_pay_asks_the_success_url_and_follows_its_return_url(installed, merchant):
    page, csrf = open_page(installed, v1_checkout(installed))
    token = token_of(page)
    merchant_url(
        merchant,
        SUCCESS_URL,
        {"token": token, "status": "SUCCESS"},
        json={"token": token, "return_url": RETURN_URL},
    )
    response = installed.client.post(f"{page}/pay", data={"csrf_token": csrf})
    assert response.status_code == 303
    assert response.headers["Location"] == RETURN_URL
    assert v1_status(installed, token) == "PAID"
    assert "This checkout is already paid" in text(installed.client.get(page))


def test_v1_cancel_asks_the_fail_url_and_cancels_for_good(installed, merchant):
    page, csrf = open_page(installed, v1_checkout(installed))
    token = token_of(page)
    merchant_url(
        merchant,
        FAIL_URL,
        {"token": token, "status": "FAIL", "reason": "CANCELLED"},
        json={"token": token, "return_url": RETURN_URL},
    )
    response = installed.client.post(f"{page}/cancel", data={"csrf_token": csrf})
    assert response.status_code == 303
    assert response.headers["Location"] == RETURN_URL
    assert v1_status(installed, token) == "CANCELLED_BY_CONSUMER"
    shown = installed.client.get(page)
    assert shown.status_code == 200
    assert "You cancelled this checkout" in text(shown)
    assert not PAY_BUTTON.search(shown.get_data(as_text=True))
    assert installed.client.post(f"{page}/pay", data={"csrf_token": csrf}).status_code == 409
    assert v1_status(installed, token) == "CANCELLED_BY_CONSUMER"


def test_v1_cancel_on_gateway_true_cancels(installed, merchant):
    page, csrf = open_page(installed, v1_checkout(installed))
    token = token_of(page)
    answer = {"token": token, "return_url": RETURN_URL, "cancel_on_service": True}
    merchant_url(merchant, FAIL_URL, {"token": token, "status": "FAIL", "reason": "CANCELLED"}, json=answer)
    assert installed.client.post(f"{page}/cancel", data={"csrf_token": csrf}).status_code == 303
    assert v1_status(installed, token) == "CANCELLED_BY_CONSUMER"


def test_v1_cancel_on_gateway_false_lets_the_consumer_retry(installed, merchant):
    page, csrf = open_page(installed, v1_checkout(installed))
    token = token_of(page)
    answer = {"token": token, "return_url": RETURN_URL, "cancel_on_payjustnow": False}
    merchant_url(merchant, FAIL_URL, {"token": token, "status": "FAIL", "reason": "CANCELLED"}, json=answer)
    response = installed.client.post(f"{page}/cancel", data={"csrf_token": csrf})
    assert response.status_code == 303
    assert response.headers["Location"] == RETURN_URL
    assert v1_status(installed, token) == "PENDING_ORDER"

    again = installed.client.get(page)
    assert again.status_code == 200
    assert PAY_BUTTON.search(again.get_data(as_text=True))
    merchant_url(
        merchant,
        SUCCESS_URL,
        {"token": token, "status": "SUCCESS"},
        json={"token": token, "return_url": RETURN_URL},
    )
    paid = installed.client.post(f"{page}/pay", data={"csrf_token": csrf_token(again)})
    assert paid.status_code == 303
    assert v1_status(installed, token) == "PAID"


UNUSABLE_ANSWERS = {
    "wrong token": {"json": {"token": "f" * 32, "return_url": RETURN_URL}},
    "not json": {"body": "<html>thanks</html>", "content_type": "text/html"},
    "server error": {"status": 500, "json": {"message": "boom"}},
}


@pytest.mark.parametrize("answer", UNUSABLE_ANSWERS.values(), ids=UNUSABLE_ANSWERS.keys())
def test_v1_pay_without_a_usable_merchant_answer(installed, merchant, answer):
    page, csrf = open_page(installed, v1_checkout(installed))
    token = token_of(page)
    merchant_url(merchant, SUCCESS_URL, {"token": token, "status": "SUCCESS"}, **answer)
    response = installed.client.post(f"{page}/pay", data={"csrf_token": csrf})
    assert response.status_code == 200
    assert response.mimetype == "text/html"
    assert "Location" not in response.headers
    shown = text(response)
    assert "Your payment was recorded, but the shop did not answer" in shown
    assert "do not pay again" in shown
    assert "order-1" in shown
    expected_message = {500: "HTTP 500"}.get(answer.get("status", 200))
    if expected_message:
        assert expected_message in shown
    elif "body" in answer:
        assert "not JSON" in shown
    else:
        assert "token is not the order's token" in shown
    assert response.headers["X-Frame-Options"] == "DENY"
    assert v1_status(installed, token) == "PAID"


@pytest.mark.parametrize("answer", UNUSABLE_ANSWERS.values(), ids=UNUSABLE_ANSWERS.keys())
def test_v1_cancel_without_a_usable_merchant_answer(installed, merchant, answer):
    page, csrf = open_page(installed, v1_checkout(installed))
    token = token_of(page)
    if "json" in answer and answer.get("status", 200) == 200:  # an untrusted answer cannot keep it open
        answer = {"json": {**answer["json"], "cancel_on_service": False}}
    merchant_url(merchant, FAIL_URL, {"token": token, "status": "FAIL", "reason": "CANCELLED"}, **answer)
    response = installed.client.post(f"{page}/cancel", data={"csrf_token": csrf})
    assert response.status_code == 200
    assert "Your cancellation was recorded, but the shop did not answer" in text(response)
    assert "No payment was taken" in text(response)
    assert v1_status(installed, token) == "CANCELLED_BY_CONSUMER"


@pytest.mark.backends
def test_v1_expired_page(installed):
    page, csrf = open_page(installed, v1_checkout(installed))
    token = token_of(page)
    # Expiry tells the merchant's fail URL (ABANDONED) when deliveries run; not what this test is about.
    with responses.RequestsMock(assert_all_requests_are_fired=False) as rsps:
        rsps.get(FAIL_URL, json={"token": token, "return_url": RETURN_URL})
        installed.advance(3601)
        response = installed.client.get(page)
        assert response.status_code == 410
        assert "This checkout has expired" in text(response)
        refused = installed.client.post(f"{page}/pay", data={"csrf_token": csrf})
        assert refused.status_code == 410
        assert [call.request.url for call in rsps.calls if "SUCCESS" in (call.request.url or "")] == []
    assert v1_status(installed, token) == "EXPIRED"
