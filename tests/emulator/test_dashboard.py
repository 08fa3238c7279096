"""The dashboard: server-rendered pages over the emulator's state, and the CSRF-protected redeliver form."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest

from flask_gateway.emulator import clock, delivery
from flask_gateway.emulator.models import Delivery, DeliveryAttempt, DeliveryState, Email, db
from flask_gateway.emulator.problems import ApiProblem
from tests.emulator.support import API_KEY, create_body, v1_checkout_body

CSRF_FIELD = re.compile(r'name="csrf_token" value="([^"]+)"')


def html(response) -> str:
    assert response.status_code == 200, response.get_data(as_text=True)[:500]
    assert response.mimetype == "text/html"
    return response.get_data(as_text=True)


@pytest.fixture
def paid(installed):
    """A paid v2 checkout, with a dead-lettered callback (three failed attempts) and a failure e-mail."""
    created = installed.create(create_body(request_id="dash-1"))
    token = created["checkoutToken"]
    assert installed.pay(token).status_code == 200
    with installed.client.application.app_context():
        row = db.session.scalars(db.select(Delivery)).one()
        now = clock.now()
        for number in (1, 2, 3):
            row.attempt_log.append(
                DeliveryAttempt(
                    number=number,
                    at=now + timedelta(seconds=number),
                    url=row.url,
                    request_body='{"checkoutPaymentStatus":"PAID_PENDING_CALLBACK"}',
                    http_status=500,
                    message="HTTP 500",
                    ok=False,
                    duration_ms=12,
                )
            )
        row.attempts = 3
        row.state = DeliveryState.DEAD
        row.last_status_message = "HTTP 500"
        db.session.add(
            Email(
                at=now,
                account_id="demo-merchant",
                to="ops@shop.example",
                subject="Callback failed for order-1 <script>",
                body="The callback to the merchant failed: HTTP 500",
            )
        )
        db.session.commit()
        installed.dead_letter_id = row.id
    installed.token = token
    return installed


@pytest.mark.backends
def test_overview_shows_accounts_checkouts_clock_faults_and_counts(paid):
    paid.advance(90)
    fault = paid.control("faults", {"operation": "create", "kind": "status", "status": 503, "count": 2})
    assert fault.status_code == 201
    page = html(paid.client.get("/_emulator/"))
    assert "demo-merchant" in page
    assert API_KEY not in page  # masked
    assert "****" in page
    assert paid.token in page
    assert "PAID_PENDING_CALLBACK" in page
    assert "+90 s ahead of real time" in page
    assert "status" in page and "503" in page
    assert re.search(r"Dead letters</h2>\s*<p class=\"big\">1<", page)
    assert re.search(r"E-mails</h2>\s*<p class=\"big\">1<", page)
    assert "<script" not in page.replace(
        '<script>"', ""
    )  # no JavaScript, and the subject is not on this page


def test_overview_of_a_fresh_emulator(gateway):
    page = html(gateway.client.get("/_emulator/"))
    assert "No checkouts yet" in page
    assert "No faults injected" in page
    assert "real time (no offset)" in page
    # No external resources: the only stylesheet is the emulator's own.
    assert re.findall(r'(?:href|src)="(https?:)?//', page) == []
    assert "/static/emulator/dashboard.css" in page


def test_stylesheet_is_served(gateway):
    response = gateway.client.get("/static/emulator/dashboard.css")
    assert response.status_code == 200
    assert response.mimetype == "text/css"
    response.close()


def test_checkout_page_shows_timeline_refunds_and_callback_attempts(paid):
    refund = paid.signed(
        "/v2/refund",
        {
            "requestId": "r-1",
            "checkoutToken": paid.token,
            "merchantRefundReference": "refund-ref-7",
            "refundAmountCents": 1000,
        },
    )
    assert refund.status_code == 200, refund.get_data(as_text=True)
    page = html(paid.client.get(f"/_emulator/dashboard/checkouts/{paid.token}"))
    for expected in ("created", "paid", "refunded", "refund-ref-7", "10.00", "798.00", "PARTIALLY_REFUNDED"):
        assert expected in page, expected
    assert page.count("HTTP 500") >= 3  # the three attempts
    assert "dead" in page
    assert "https://shop.example/return/ok" in page  # the stored service object
    assert "payjustnowOrderReference" in page  # the status payload


def test_checkout_page_of_a_v1_order(gateway):
    response = gateway.v1("checkout", v1_checkout_body())
    assert response.status_code == 200, response.get_data(as_text=True)
    token = response.json["data"]["token"]
    page = html(gateway.client.get(f"/_emulator/dashboard/checkouts/{token}"))
    assert "v1" in page
    assert "success_callback_url" in page
    assert "No callbacks for this checkout." in page


def test_unknown_checkout_is_an_html_404(gateway):
    response = gateway.client.get("/_emulator/dashboard/checkouts/v2.nobody.nothing")
    assert response.status_code == 404
    assert response.mimetype == "text/html"


def test_checkout_page_escapes_merchant_text(installed):
    body = create_body(merchantOrderReference="<b>bold</b>")
    token = installed.create(body)["checkoutToken"]
    page = html(installed.client.get(f"/_emulator/dashboard/checkouts/{token}"))
    assert "<b>bold</b>" not in page
    assert "&lt;b&gt;bold&lt;/b&gt;" in page


def test_callbacks_page_lists_every_attempt_and_what_is_pending(paid):
    second = paid.create(create_body(request_id="dash-2"))["checkoutToken"]
    paid.pay(second)  # its callback is pending (no delivery run in tests)
    page = html(paid.client.get("/_emulator/dashboard/callbacks"))
    assert page.count("HTTP 500") == 3
    assert second in page
    assert "Nothing waiting." not in page


def test_emails_page_lists_the_outbox_escaped(paid):
    page = html(paid.client.get("/_emulator/dashboard/emails"))
    assert "ops@shop.example" in page
    assert "Callback failed for order-1 &lt;script&gt;" in page
    assert "The callback to the merchant failed: HTTP 500" in page


def test_empty_lists(gateway):
    assert "No dead letters." in html(gateway.client.get("/_emulator/dashboard/dead-letters"))
    assert "No e-mails." in html(gateway.client.get("/_emulator/dashboard/emails"))
    assert "No callback attempts yet." in html(gateway.client.get("/_emulator/dashboard/callbacks"))


# --- the redeliver form ----------------------------------------------------------------------------


def _form(paid) -> tuple[str, str]:
    page = html(paid.client.get("/_emulator/dashboard/dead-letters"))
    action = f"/_emulator/dashboard/dead-letters/{paid.dead_letter_id}/redeliver"
    assert f'action="{action}"' in page
    match = CSRF_FIELD.search(page)
    assert match, "the redeliver form carries a CSRF token"
    return action, match.group(1)


def test_dead_letters_page_has_a_csrf_protected_redeliver_form(paid):
    action, _token = _form(paid)
    page = paid.client.get("/_emulator/dashboard/dead-letters").get_data(as_text=True)
    assert paid.token in page
    assert 'method="post"' in page
    refused = paid.client.post(action)  # no CSRF token
    assert refused.status_code == 400
    assert "CSRF" in refused.get_data(as_text=True)
    forged = paid.client.post(action, data={"csrf_token": "forged"})
    assert forged.status_code == 400


def test_redeliver_calls_the_delivery_module_and_redirects_with_a_message(paid, monkeypatch):
    calls: list[int] = []
    monkeypatch.setattr(delivery, "redeliver", calls.append)
    action, token = _form(paid)
    response = paid.client.post(action, data={"csrf_token": token})
    assert response.status_code == 303
    assert response.headers["Location"].endswith("/_emulator/dashboard/dead-letters")
    assert calls == [paid.dead_letter_id]
    page = html(paid.client.get("/_emulator/dashboard/dead-letters"))
    assert f"Dead letter #{paid.dead_letter_id} is back in the outbox and was sent again." in page


@pytest.mark.parametrize("status", [404, 409])
def test_redeliver_refusal_is_flashed(paid, monkeypatch, status):
    def refuse(delivery_id: int) -> None:
        raise ApiProblem(status, f"refused with {status}")

    monkeypatch.setattr(delivery, "redeliver", refuse)
    action, token = _form(paid)
    response = paid.client.post(action, data={"csrf_token": token}, follow_redirects=True)
    page = html(response)
    assert f"was not redelivered: refused with {status}" in page
    assert "flash-error" in page


@pytest.mark.backends
def test_redeliver_for_real(paid):
    """With the delivery module's own ``redeliver``: the dead letter is queued again."""
    action, token = _form(paid)
    response = paid.client.post(action, data={"csrf_token": token}, follow_redirects=True)
    assert "is back in the outbox" in html(response)
    with paid.client.application.app_context():
        row = db.session.get(Delivery, paid.dead_letter_id)
        assert row is not None
        assert row.state == DeliveryState.PENDING  # one new attempt made (and failed: nothing listens)
        assert len(row.attempt_log) == 4
    # A second press: no longer a dead letter.
    again = paid.client.post(action, data={"csrf_token": token}, follow_redirects=True)
    assert "was not redelivered" in html(again)


def test_openapi_document_is_served(gateway):
    response = gateway.client.get("/_emulator/openapi.json")
    assert response.status_code == 200
    assert response.mimetype == "application/json"
    assert response.json["openapi"].startswith("3.1")
    assert "/v2/create" in response.json["paths"]
