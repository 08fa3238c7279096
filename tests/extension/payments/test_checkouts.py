"""Checkout creation, availability, payment plan, update, cancel and refunds against the in-process emulator."""

from __future__ import annotations

import random
import re
import threading
from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta
from urllib.parse import urlsplit

import pytest
from sqlalchemy import event

from flask_gateway import (
    CheckoutStateError,
    CheckoutUnavailableError,
    PaymentPlan,
    RefundDeclinedError,
    RefundNotAllowedError,
    cancel_checkout,
    clear_payment_plan_cache,
    create_checkout,
    format_instalment_hint,
    is_available,
    payment_plan,
    refund,
    retry_refund,
    signals,
    start_checkout,
    update_checkout,
)
from flask_gateway.core.client import GatewayClient
from flask_gateway.core.errors import (
    CheckoutExpiredError,
    ConflictError,
    FirewallRejectedError,
    GatewayConnectionError,
    GatewayError,
    GatewayServerError,
    InvalidRequestError,
)
from flask_gateway.core.timestamps import utcnow
from flask_gateway.errors import InvalidOrderError, NotInstalledError
from flask_gateway.models import GatewayCheckout, LocalStatus, RefundRecord, RefundState
from flask_gateway.payments.mapping import order_snapshot
from flask_gateway.payments.orders import Customer, OrderDraft, OrderLine
from flask_gateway.payments.polling import refresh
from flask_gateway.state import get_state
from flask_gateway.urls import load_signed_reference
from tests.conftest import Databases, fetch_all
from tests.extension.conftest import SHOP_URL, Harness, build_harness, sample_order
from tests.extension.operations.operations_support import (
    emulator_checkout,
    load,
    new_checkout,
    recording,
    share_signing_key,
    spy,
)


@pytest.fixture(autouse=True)
def _fresh_plan_cache() -> Iterator[None]:
    clear_payment_plan_cache()
    yield
    clear_payment_plan_cache()


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


@pytest.fixture
def harness_v1(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    harness = build_harness(databases, monkeypatch, GATEWAY_API_VERSION="v1")
    harness.install()
    yield harness
    with harness.shop.app_context():
        harness.db.engine.dispose()


def fault(harness: Harness, **rule: object) -> None:
    response = harness.emulator.control("faults", rule)
    assert response.status_code == 201, response.get_data(as_text=True)


def _query(url_or_path: str, name: str) -> str:
    from urllib.parse import parse_qs, urlsplit

    return parse_qs(urlsplit(url_or_path).query)[name][0]


def paid(harness: Harness, order: OrderDraft | None = None) -> int:
    """A v2 checkout the consumer paid and the shop knows about (PAID_PENDING_CALLBACK via getstatus)."""
    checkout_id, token = new_checkout(harness, order)
    assert harness.emulator.pay(token).status_code == 200
    with harness.shop.app_context():
        assert refresh(load(harness, checkout_id)).after == "PAID_PENDING_CALLBACK"
    return checkout_id


# --- create -------------------------------------------------------------------------------------------


def test_create_checkout_saves_then_creates_and_signals_once(installed):
    transport = spy(installed)
    with installed.shop.app_context(), recording(signals.checkout_created) as created:
        before = utcnow()
        checkout = create_checkout(sample_order())
        after = utcnow()
        assert checkout.status == "PENDING_ORDER"
        assert checkout.token and checkout.token.startswith("v2.demo-merchant.")
        assert checkout.payment_url == f"http://emulator.test/api/v2/app/checkout/{checkout.token}"
        # The gateway's default expiry, an hour from when it created it (between before and after).
        assert checkout.expires_at is not None
        assert before + timedelta(minutes=60) <= checkout.expires_at <= after + timedelta(minutes=60)
        assert checkout.total_cents == 79800 and checkout.merchant_account_id == "demo-merchant"
        assert checkout.order == order_snapshot(sample_order())
        assert [e.source for e in checkout.events] == ["create"]
        assert len(created) == 1 and created.calls[0]["checkout"] is checkout
        checkout_id, request_id = checkout.id, checkout.request_id

    (sent,) = [s for s in transport.sent if s.path == "/v2/create"]
    assert sent.body["requestId"] == request_id
    assert sent.body["checkoutTotalCents"] == 79800
    service = sent.body["payjustnow"]
    assert service["merchantOrderReference"] == "ORD-1"
    assert service["orderAmountCents"] == 79800
    assert service["orderExpiryMinutes"] == 60
    assert service["orderItems"] == [
        {
            "name": "Enamel kettle",
            "sku": "K-1",
            "quantity": 2,
            "priceCents": 39900,
            "imageUrl": f"{SHOP_URL}/static/kettle.png",
            "pageUrl": f"{SHOP_URL}/products/kettle",
            "searchTerms": [],
        }
    ]
    assert service["customer"] == {
        "firstName": "Thandi",
        "lastName": "Mokoena",
        "email": "thandi@example.com",
        "phoneNumber": "+27821234567",
    }
    assert service["billingAddress"]["postalCode"] == "8001"
    # The redirect URLs are the extension's return endpoints with a signed reference of this checkout.
    confirm, cancel = service["confirmRedirectUrl"], service["cancelRedirectUrl"]
    assert confirm.startswith(f"{SHOP_URL}/gateway/return/confirm?ref=")
    assert cancel.startswith(f"{SHOP_URL}/gateway/return/cancel?ref=")
    with installed.shop.test_request_context():
        assert load_signed_reference(_query(confirm, "ref"), "confirm") == checkout_id
        assert load_signed_reference(_query(cancel, "ref"), "cancel") == checkout_id
        assert load_signed_reference(_query(confirm, "ref"), "cancel") is None


def test_shop_totals_and_fallback_urls(installed):
    order = OrderDraft(
        reference="ORD-2",
        lines=(
            OrderLine(name="Mug", sku="M-1", quantity=3, unit_price_cents=5000, search_terms=("mug",)),
            OrderLine(name="Tea", sku="T-1", quantity=1, unit_price_cents=2500, category="food"),
        ),
        total_cents=18500,  # 17 500 of goods + 1 000 shipping
        click_trace_id="click-7",
    )
    transport = spy(installed)
    with installed.shop.app_context():
        checkout = create_checkout(order)
        assert checkout.total_cents == 18500
    body = transport.sent[-1].body
    assert body["checkoutTotalCents"] == 18500
    assert body["clickTraceId"] == "click-7"
    assert body["payjustnow"]["orderAmountCents"] == 17500
    first, second = body["payjustnow"]["orderItems"]
    assert first["imageUrl"] == first["pageUrl"] == f"{SHOP_URL}/"
    assert first["searchTerms"] == ["mug"]
    assert second["category"] == "food"
    assert "customer" not in body["payjustnow"]


@pytest.mark.backends
def test_request_id_is_committed_before_the_request_and_reused_after_a_5xx(installed, database_url):
    transport = spy(installed)
    seen_in_database: list[tuple[str, str]] = []

    def check_database(sent):
        if sent.path == "/v2/create":
            # Another connection sees the committed row with this requestId while the request is on its way.
            [row] = fetch_all(
                database_url,
                "SELECT status, request_id FROM gateway_checkouts WHERE request_id = :request_id",
                request_id=sent.body["requestId"],
            )
            seen_in_database.append(row)

    transport.before_send.append(check_database)
    fault(installed, operation="create", kind="status", status=503, count=1)
    with installed.shop.app_context(), recording(signals.checkout_created) as created:
        with pytest.raises(GatewayServerError):
            create_checkout(sample_order())
        (stuck,) = get_state().session.query(GatewayCheckout).all()
        assert stuck.status == LocalStatus.CREATING and stuck.token is None and stuck.request_id
        first_request_id = stuck.request_id
        assert len(created) == 0

        checkout = create_checkout(sample_order())
        assert checkout.id == stuck.id
        assert checkout.request_id == first_request_id
        assert checkout.status == "PENDING_ORDER"
        assert len(created) == 1
        assert get_state().session.query(GatewayCheckout).count() == 1
    requests_sent = [s.body["requestId"] for s in transport.sent if s.path == "/v2/create"]
    assert requests_sent == [first_request_id, first_request_id]
    assert seen_in_database == [("CREATING", first_request_id), ("CREATING", first_request_id)]


@pytest.mark.backends
def test_a_lost_answer_is_recovered_by_replay_without_a_second_checkout(installed):
    spy(installed)
    fault(installed, operation="create", kind="drop_response", count=1)
    with installed.shop.app_context(), recording(signals.checkout_created) as created:
        with pytest.raises(GatewayConnectionError):
            create_checkout(sample_order())
        (stuck,) = get_state().session.query(GatewayCheckout).all()
        assert stuck.status == LocalStatus.CREATING and stuck.token is None
        # The gateway did create it: one checkout there, carrying our requestId.
        listed = installed.emulator.control("checkouts", method="GET").json["checkouts"]
        assert len(listed) == 1
        token = listed[0]["checkoutToken"]
        assert emulator_checkout(installed, token)["status"]["requestId"] == stuck.request_id

        checkout = create_checkout(sample_order())
        assert checkout.id == stuck.id and checkout.token == token
        assert checkout.status == "PENDING_ORDER"
        assert "idempotent replay" in checkout.events[-1].detail
        assert len(created) == 1
    assert len(installed.emulator.control("checkouts", method="GET").json["checkouts"]) == 1


def test_a_definite_refusal_marks_the_checkout_failed(harness):
    harness.install(minimum=100, maximum=50_000)
    with harness.shop.app_context():
        with pytest.raises(InvalidRequestError) as refused:
            create_checkout(sample_order())  # 79 800 cents: above the maximum
        assert refused.value.field_errors[0]["field"] == "checkoutTotalCents"
        (failed,) = get_state().session.query(GatewayCheckout).all()
        assert failed.status == LocalStatus.FAILED
        assert "HTTP 400" in failed.events[-1].detail
        # A FAILED checkout is never reused: the next attempt is a new record with a new requestId.
        with pytest.raises(InvalidRequestError):
            create_checkout(sample_order())
        assert get_state().session.query(GatewayCheckout).count() == 2


def test_an_open_checkout_is_handed_out_again_for_the_same_order(installed):
    with installed.shop.app_context(), recording(signals.checkout_created) as created:
        first = create_checkout(sample_order())
        again = create_checkout(sample_order())
        assert again.id == first.id
        changed = create_checkout(sample_order(quantity=3))
        assert changed.id != first.id
        assert len(created) == 2


def test_invalid_orders_are_refused_before_anything_is_saved(installed):
    bad_email = replace(
        sample_order(), customer=Customer(first_name="A", last_name="B", email="not-an-email")
    )
    with installed.shop.app_context():
        with pytest.raises(ValueError, match=r"payjustnow\.customer\.email"):
            create_checkout(bad_email)
        assert get_state().session.query(GatewayCheckout).count() == 0


@pytest.mark.backends
@pytest.mark.parametrize(
    ("reference", "problem"),
    [("R" * 256, "at most 255 characters"), ("ORD\x001", "must not contain U\\+0000")],
)
def test_a_reference_the_gateway_cannot_take_is_refused_before_anything_is_saved(
    installed, reference, problem
):
    """PostgreSQL would refuse to store it (over the column's length, or U+0000): a ValueError instead."""
    transport = spy(installed)
    with installed.shop.app_context():
        with pytest.raises(InvalidOrderError, match=rf"payjustnow\.merchantOrderReference: .*{problem}"):
            create_checkout(replace(sample_order(), reference=reference))
        assert get_state().session.query(GatewayCheckout).count() == 0
    assert transport.paths() == []


@pytest.mark.backends
def test_concurrent_creates_for_one_order_make_one_checkout(installed):
    """A double click: PostgreSQL lets both see "no checkout yet" unless the create is serialised."""
    start = threading.Barrier(3)
    outcomes: list[object] = []

    def create() -> None:
        with installed.shop.app_context():
            start.wait()
            try:
                outcomes.append(create_checkout(sample_order()).id)
            except GatewayError as error:  # the first one's request still in flight: 409, retry later
                outcomes.append(error)

    threads = [threading.Thread(target=create) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    with installed.shop.app_context():
        (checkout,) = get_state().session.query(GatewayCheckout).all()
    assert checkout.id in outcomes
    assert all(o == checkout.id or isinstance(o, ConflictError) for o in outcomes), outcomes
    assert len(installed.emulator.control("checkouts", method="GET").json["checkouts"]) == 1


def test_a_create_in_flight_elsewhere_is_asked_again_until_its_answer_comes(installed, monkeypatch):
    """A concurrent call for the same order (a double click) sent this requestId a moment ago: while it is
    in flight the gateway answers 409. The call asks again and gets the stored answer, not an error page."""
    real_create = GatewayClient.create_checkout
    sent: list[str | None] = []

    def in_flight_twice(self, request):  # type: ignore[no-untyped-def]
        sent.append(request.requestId)
        if len(sent) <= 2:
            raise ConflictError("A request with this requestId is still in flight.", http_status=409)
        return real_create(self, request)

    monkeypatch.setattr(GatewayClient, "create_checkout", in_flight_twice)
    with installed.shop.app_context():
        checkout = create_checkout(sample_order())
        assert checkout.status == "PENDING_ORDER" and checkout.payment_url
    assert len(sent) == 3 and len(set(sent)) == 1


def test_a_create_in_flight_for_too_long_stays_creating(installed, monkeypatch):
    def always_in_flight(self, request):  # type: ignore[no-untyped-def]
        raise ConflictError("A request with this requestId is still in flight.", http_status=409)

    monkeypatch.setattr(GatewayClient, "create_checkout", always_in_flight)
    with installed.shop.app_context():
        with pytest.raises(ConflictError):
            create_checkout(sample_order())
        (checkout,) = get_state().session.query(GatewayCheckout).all()
        assert checkout.status == LocalStatus.CREATING  # a later call resends the same requestId


def test_create_needs_an_installation(harness):
    with harness.shop.app_context(), pytest.raises(NotInstalledError, match="install screen"):
        create_checkout(sample_order())


# --- start_checkout and availability ------------------------------------------------------------------


def test_start_checkout_redirects_with_303(harness):
    harness.shop.config["WTF_CSRF_ENABLED"] = False  # the shop's own form would carry the token

    @harness.shop.post("/pay")
    def pay_view():
        return start_checkout(sample_order())

    harness.install()
    response = harness.client.post("/pay")
    assert response.status_code == 303
    with harness.shop.app_context():
        (checkout,) = get_state().session.query(GatewayCheckout).all()
        assert response.headers["Location"] == checkout.payment_url


def test_start_checkout_refuses_when_not_available(harness):
    with harness.shop.app_context(), pytest.raises(CheckoutUnavailableError, match="not installed"):
        start_checkout(sample_order())
    harness.install(minimum=100, maximum=50_000)
    with harness.shop.app_context():
        with pytest.raises(CheckoutUnavailableError, match="is_available") as refused:
            start_checkout(sample_order())
        assert get_state().session.query(GatewayCheckout).count() == 0
    # The message says the total and the range in money, not cents (a shop logs or shows it).
    message = str(refused.value)
    assert "offered from R 1.00 to R 500.00" in message, message
    assert "cents" not in message


def test_start_checkout_reads_the_account_once(installed):
    """The account is chosen once: its installation is read once, in the create's own transaction."""
    statements: list[str] = []

    def seen(connection, cursor, statement, *rest):  # type: ignore[no-untyped-def]
        statements.append(statement)

    with installed.shop.test_request_context(base_url=SHOP_URL):
        engine = get_state().engine
        event.listen(engine, "before_cursor_execute", seen)
        try:
            assert start_checkout(sample_order()).status_code == 303
        finally:
            event.remove(engine, "before_cursor_execute", seen)
    reads = [
        s for s in statements if s.lstrip().upper().startswith("SELECT") and "gateway_installations" in s
    ]
    assert len(reads) == 1, statements
    # SQLite counts its BEGIN IMMEDIATE: one before the request (the create's), one for the answer.
    begins = [s for s in statements if s.lstrip().upper().startswith("BEGIN")]
    assert len(begins) <= 2, statements


def test_is_available_boundaries(harness):
    with harness.shop.app_context():
        assert is_available(1000) is False  # not installed
    harness.install(minimum=100, maximum=50_000)
    with harness.shop.app_context():
        assert [is_available(n) for n in (0, 99, 100, 101, 49_999, 50_000, 50_001)] == [
            False,
            False,
            True,
            True,
            True,
            True,
            False,
        ]
        assert is_available(True) is False  # type: ignore[arg-type]
        assert is_available(100.0) is False  # type: ignore[arg-type]


# --- payment plan -------------------------------------------------------------------------------------


def test_payment_plan_and_hint(installed):
    transport = spy(installed)
    with installed.shop.app_context():
        plan = payment_plan(40_000)
        assert plan is not None
        assert (plan.instalments, plan.instalment_cents, plan.excess_cents) == (3, 13_333, 1)
        assert plan.first_instalment_cents == 13_334
        assert plan.amounts == (13_334, 13_333, 13_333)
        # The first instalment carries the cents that do not divide evenly, as the gateway charges it.
        assert format_instalment_hint(40_000) == "or R 133.34 now, then 2 x R 133.33"
        assert format_instalment_hint(3_703_701) == "or 3 x R 12 345.67"
        # One call learned the account's rule; the second total was computed from it (issue 29).
        calls = [s.body for s in transport.sent if s.path == "/api/v1/merchant/configuration"]
        assert calls == [{"amount": 40_000}]
        assert format_instalment_hint(50) == ""  # below the minimum: no call, no hint
        assert len(transport.sent) == 1


def test_payment_plan_is_none_when_the_gateway_fails(installed):
    fault(installed, operation="v1_configuration", kind="status", status=500, count=1)
    with installed.shop.app_context():
        assert payment_plan(40_000) is None
        assert format_instalment_hint(40_000) == ""  # the failure is cached briefly too
        clear_payment_plan_cache()
        assert format_instalment_hint(40_000) == "or R 133.34 now, then 2 x R 133.33"


def hint_amounts(hint: str) -> list[int]:
    """The instalments a hint promises, in cents: "or 3 x R 1.00" -> [100, 100, 100];
    "or R 1.01 now, then 2 x R 1.00" -> [101, 100, 100]."""
    cents = [
        int(text.replace(" ", "").replace(".", "")) for text in re.findall(r"R ([0-9 ]+\.[0-9]{2})", hint)
    ]
    equal = re.fullmatch(r"or (\d+) x R [0-9 ]+\.[0-9]{2}", hint)
    if equal:
        return cents * int(equal[1])
    later = re.fullmatch(r"or R [0-9 ]+\.[0-9]{2} now, then (\d+) x R [0-9 ]+\.[0-9]{2}", hint)
    assert later, f"not a hint: {hint!r}"
    return [cents[0], *[cents[1]] * int(later[1])]


def test_the_hint_is_the_plan_the_gateway_charges_for_ten_thousand_amounts():
    """The gateway's rule (docs/decisions.md: amount // 3 each, the remainder with the first), for every
    remainder and size: the hint names exactly those instalments, and they add up to the total."""
    rng = random.Random(17)
    amounts = [*range(1, 3000), 97_700, *(rng.randrange(1, 10**10) for _ in range(7000))]
    for total in amounts:
        plan = PaymentPlan(total, 3, total // 3, total % 3, utcnow())
        promised = hint_amounts(plan.describe("R"))
        assert promised == list(plan.amounts), total
        assert sum(promised) == total
        assert promised[0] - promised[1] == total % 3
    assert PaymentPlan(97_700, 3, 32_566, 2, utcnow()).describe() == "or R 325.68 now, then 2 x R 325.66"


#: Every remainder, small and large totals (the harness installs limits of R 1.00 to R 100 000.00).
HINT_AMOUNTS = (100, 101, 102, 28_900, 39_900, 97_700, 100_001, 124_400, 3_703_702, 9_999_999, 10_000_000)


def test_the_hint_matches_the_gateway_plan_and_its_payment_page(installed):
    """What the shop promises on its pages is what the gateway's payment page charges, amount by amount."""
    checkouts: dict[int, str] = {}
    with installed.shop.test_request_context():
        for total in HINT_AMOUNTS:
            order = sample_order(f"HINT-{total}", quantity=1, price=total)
            checkouts[total] = create_checkout(order).payment_url or ""
        hints = {total: format_instalment_hint(total) for total in HINT_AMOUNTS}
    for total, payment_url in checkouts.items():
        page = installed.emulator.client.get(urlsplit(payment_url).path).get_data(as_text=True)
        charged = [int(c) for c in re.findall(r'data-instalment-cents="(\d+)"', page)]
        assert len(charged) == 3 and sum(charged) == total
        assert hint_amounts(hints[total]) == charged, (total, hints[total])
    assert hints[97_700] == "or R 325.68 now, then 2 x R 325.66"
    assert hints[39_900] == "or 3 x R 133.00"


# --- v1 ---------------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_v1_checkout_end_to_end(harness_v1):
    transport = spy(harness_v1)
    with harness_v1.shop.app_context(), recording(signals.checkout_created) as created:
        checkout = create_checkout(sample_order())
        assert checkout.api_version == "v1"
        assert checkout.status == "PENDING_ORDER"
        assert checkout.token is not None and len(checkout.token) == 32
        assert checkout.payment_url == f"http://emulator.test/api/v1/app/checkout/{checkout.token}"
        assert checkout.expires_at is not None
        assert len(created) == 1
        checkout_id, token = checkout.id, checkout.token
    (sent,) = [s for s in transport.sent if s.path == "/api/v1/merchant/checkout"]
    order = sent.body["order"]
    assert order["amount"] == 79800 and order["merchant_reference"] == "ORD-1"
    assert order["items"] == {
        "1": {"merchant_reference": "K-1", "quantity": 2, "description": "Enamel kettle", "unit_price": 39900}
    }
    assert order["success_callback_url"].startswith(f"{SHOP_URL}/gateway/v1/success?ref=")
    assert order["fail_callback_url"].startswith(f"{SHOP_URL}/gateway/v1/fail?ref=")
    assert sent.body["customer"]["mobile_number"] == "+27821234567"
    # As text, as the shop stored it (a number would lose the leading zero of "0181").
    assert sent.body["customer"]["address"]["postal_code"] == "8001"
    with harness_v1.shop.test_request_context():
        assert (
            load_signed_reference(_query(order["success_callback_url"], "ref"), "v1-success") == checkout_id
        )

    # The consumer pays; the gateway calls the shop's signed v1 success URL.
    assert harness_v1.emulator.pay(token).status_code == 200
    with harness_v1.shop.app_context():
        assert load(harness_v1, checkout_id).status == "PAID"
        with recording(signals.refund_succeeded) as refunded:
            partial = refund(load(harness_v1, checkout_id), 30_000, reason="one kettle back")
            assert partial.state == RefundState.SUCCEEDED
            rest = refund(load(harness_v1, checkout_id), 49_800)
            assert rest.state == RefundState.SUCCEEDED
        assert len(refunded) == 2
        assert load(harness_v1, checkout_id).status == "FULLY_REFUNDED"
    refunds = [s.body for s in transport.sent if s.path == "/api/v1/merchant/refund"]
    assert [(r["type"], r["amount"]) for r in refunds] == [("partial", 30_000), ("full", 49_800)]
    assert emulator_checkout(harness_v1, token)["refundedCents"] == 79_800


def test_v1_needs_a_mobile_number(harness_v1):
    order = replace(sample_order(), customer=Customer(first_name="A", last_name="B", email="a@example.com"))
    with harness_v1.shop.app_context():
        with pytest.raises(ValueError, match=r"E\.164"):
            create_checkout(order)
        assert get_state().session.query(GatewayCheckout).count() == 0


def test_v1_has_no_update_or_cancel(harness_v1):
    checkout_id, _ = new_checkout(harness_v1)
    with harness_v1.shop.app_context():
        with pytest.raises(CheckoutStateError, match="v1"):
            cancel_checkout(load(harness_v1, checkout_id))
        with pytest.raises(CheckoutStateError, match="v1"):
            update_checkout(load(harness_v1, checkout_id), sample_order(quantity=1))


# --- update -------------------------------------------------------------------------------------------


def test_update_replaces_the_order_and_reopens_a_consumer_cancel(installed):
    checkout_id, token = new_checkout(installed)
    assert installed.emulator.consumer_cancel(token).status_code == 200
    with installed.shop.app_context():
        refresh(load(installed, checkout_id))
        assert load(installed, checkout_id).status == "CANCELLED_BY_CONSUMER"
        updated = update_checkout(load(installed, checkout_id), sample_order(quantity=1))
        assert updated.status == "PENDING_ORDER"
        assert updated.total_cents == 39_900
        assert updated.order["lines"][0]["quantity"] == 1
        assert updated.events[-1].source == "update"
    gateway_side = emulator_checkout(installed, token)
    assert gateway_side["checkoutTotalCents"] == 39_900
    assert gateway_side["checkoutPaymentStatus"] == "PENDING_ORDER"


def test_update_with_a_new_expiry(installed):
    checkout_id, _ = new_checkout(installed)
    later = utcnow().replace(microsecond=0) + timedelta(hours=5)
    with installed.shop.app_context():
        updated = update_checkout(load(installed, checkout_id), sample_order(), expires_at=later)
        assert updated.expires_at == later


def test_update_of_an_expired_checkout_marks_it_expired(installed):
    checkout_id, _ = new_checkout(installed)
    installed.emulator.advance(2 * 3600)
    with installed.shop.app_context(), recording(signals.checkout_expired) as expired:
        with pytest.raises(CheckoutExpiredError):
            update_checkout(load(installed, checkout_id), sample_order(quantity=1))
        assert load(installed, checkout_id).status == "EXPIRED"
        assert len(expired) == 1


def test_update_refuses_another_order_or_a_closed_checkout(installed):
    checkout_id = paid(installed)
    with installed.shop.app_context():
        with pytest.raises(ValueError, match="ORD-1"):
            update_checkout(load(installed, checkout_id), sample_order("ORD-9"))
        with pytest.raises(CheckoutStateError, match="PAID_PENDING_CALLBACK"):
            update_checkout(load(installed, checkout_id), sample_order(quantity=1))


def test_update_409_refreshes_the_status(installed):
    checkout_id, token = new_checkout(installed)
    installed.emulator.pay(token)  # the shop has not heard yet
    with installed.shop.app_context(), recording(signals.payment_confirmed) as confirmed:
        with pytest.raises(ConflictError):
            update_checkout(load(installed, checkout_id), sample_order(quantity=1))
        assert load(installed, checkout_id).status == "PAID_PENDING_CALLBACK"
        assert [c["source"] for c in confirmed.calls] == ["update"]


# --- cancel -------------------------------------------------------------------------------------------


def test_cancel_checkout(installed):
    checkout_id, token = new_checkout(installed)
    with installed.shop.app_context(), recording(signals.checkout_cancelled) as cancelled:
        checkout = cancel_checkout(load(installed, checkout_id), source="admin")
        assert checkout.status == "CANCELLED_BY_MERCHANT"
        assert checkout.events[-1].source == "admin"
        assert cancel_checkout(checkout).status == "CANCELLED_BY_MERCHANT"  # already: no request
        assert [(c["status"], c["source"]) for c in cancelled.calls] == [("CANCELLED_BY_MERCHANT", "admin")]
    assert emulator_checkout(installed, token)["checkoutPaymentStatus"] == "CANCELLED_BY_MERCHANT"


def test_cancel_after_a_lost_answer_learns_the_truth(installed):
    checkout_id, token = new_checkout(installed)
    share_signing_key(installed)
    # An earlier cancel reached the gateway but its answer never came back.
    assert installed.emulator.signed("/v2/cancel", {"checkoutToken": token}).status_code == 200
    with installed.shop.app_context():
        checkout = cancel_checkout(load(installed, checkout_id))
        assert checkout.status == "CANCELLED_BY_MERCHANT"


def test_cancel_of_a_checkout_paid_meanwhile_raises_and_records_the_payment(installed):
    checkout_id, token = new_checkout(installed)
    installed.emulator.pay(token)
    with installed.shop.app_context(), recording(signals.payment_confirmed) as confirmed:
        with pytest.raises(ConflictError, match="409"):
            cancel_checkout(load(installed, checkout_id))
        assert load(installed, checkout_id).status == "PAID_PENDING_CALLBACK"
        assert len(confirmed) == 1
        with pytest.raises(CheckoutStateError, match="refund it instead"):
            cancel_checkout(load(installed, checkout_id))


def test_a_payment_under_way_is_open_not_paid_and_not_for_the_shop_to_change(installed):
    """The real gateway's PENDING_PAYMENT: learned by a poll, never confirmed, neither cancelled nor
    updated by the shop; the payment that follows is confirmed once."""
    checkout_id, token = new_checkout(installed)
    assert installed.emulator.control(f"checkouts/{token}/begin-payment").json["checkoutPaymentStatus"] == (
        "PENDING_PAYMENT"
    )
    with installed.shop.app_context(), recording(signals.payment_confirmed) as confirmed:
        transition = refresh(load(installed, checkout_id), source="poll")
        assert (transition.before, transition.after) == ("PENDING_ORDER", "PENDING_PAYMENT")
        assert load(installed, checkout_id).payment_confirmed_at is None
        with pytest.raises(CheckoutStateError, match="the shopper is paying on the gateway"):
            cancel_checkout(load(installed, checkout_id))
        with pytest.raises(CheckoutStateError, match="only an open checkout"):
            update_checkout(load(installed, checkout_id), sample_order())
        assert len(confirmed) == 0
        installed.emulator.pay(token)
        assert refresh(load(installed, checkout_id), source="poll").after == "PAID_PENDING_CALLBACK"
        assert len(confirmed) == 1
    assert emulator_checkout(installed, token)["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"


def test_cancel_of_a_checkout_never_created(installed):
    fault(installed, operation="create", kind="status", status=503, count=1)
    with installed.shop.app_context():
        with pytest.raises(GatewayServerError):
            create_checkout(sample_order())
        (stuck,) = get_state().session.query(GatewayCheckout).all()
        with pytest.raises(CheckoutStateError, match="CREATING"):
            cancel_checkout(stuck)


# --- refunds ------------------------------------------------------------------------------------------


def test_partial_then_full_refund(installed):
    checkout_id = paid(installed)
    transport = spy(installed)
    with installed.shop.app_context(), recording(signals.refund_succeeded) as refunded:
        first = refund(load(installed, checkout_id), 20_000, reason="damaged lid")
        assert first.state == RefundState.SUCCEEDED and first.completed_at is not None
        checkout = load(installed, checkout_id)
        assert (checkout.status, checkout.refunded_cents) == ("PARTIALLY_REFUNDED", 20_000)
        second = refund(checkout, 59_800)
        checkout = load(installed, checkout_id)
        assert (checkout.status, checkout.refunded_cents) == ("FULLY_REFUNDED", 79_800)
        assert [(c["amount_cents"], c["refund"].id) for c in refunded.calls] == [
            (20_000, first.id),
            (59_800, second.id),
        ]
        assert [e.source for e in checkout.events][-2:] == ["refund", "refund"]
    bodies = [s.body for s in transport.sent if s.path == "/v2/refund"]
    assert [b["requestId"] for b in bodies] == [first.request_id, second.request_id]
    assert bodies[0]["refundAmountCents"] == 20_000 and bodies[0]["refundDescription"] == "damaged lid"
    assert bodies[0]["merchantRefundReference"] == f"ORD-1/refund-{first.id}"


@pytest.mark.parametrize(
    ("amount", "message"),
    [
        (0, "above 0"),
        (-5, "above 0"),
        (1.5, "whole cents"),
        (True, "whole cents"),
        (79_801, "79800 cents left"),
    ],
)
def test_refund_amount_checks(installed, amount, message):
    checkout_id = paid(installed)
    with installed.shop.app_context():
        with pytest.raises(RefundNotAllowedError, match=message):
            refund(load(installed, checkout_id), amount)
        assert get_state().session.query(RefundRecord).count() == 0


@pytest.mark.backends
@pytest.mark.parametrize(
    ("reason", "message"), [("x" * 1001, "at most 1000 characters"), ("oops\x00", "U\\+0000")]
)
def test_a_refund_reason_the_gateway_cannot_take_is_refused_before_anything_is_saved(
    installed, reason, message
):
    """The request could never be sent with it, and PostgreSQL would not even store U+0000."""
    checkout_id = paid(installed)
    with installed.shop.app_context():
        with pytest.raises(RefundNotAllowedError, match=message):
            refund(load(installed, checkout_id), 100, reason)
        assert get_state().session.query(RefundRecord).count() == 0


def test_refund_checks_what_is_left_and_the_status(installed):
    checkout_id, _ = new_checkout(installed)
    with installed.shop.app_context(), pytest.raises(RefundNotAllowedError, match="PENDING_ORDER"):
        refund(load(installed, checkout_id), 100)
    paid_id = paid(installed, sample_order("ORD-2"))
    with installed.shop.app_context():
        refund(load(installed, paid_id), 79_000)
        with pytest.raises(RefundNotAllowedError, match="800 cents left"):
            refund(load(installed, paid_id), 801)
        refund(load(installed, paid_id), 800)
        with pytest.raises(RefundNotAllowedError, match="FULLY_REFUNDED"):
            refund(load(installed, paid_id), 1)


def test_refund_refused_by_the_gateway(installed):
    checkout_id = paid(installed)
    fault(installed, operation="refund", kind="status", status=409, count=1)
    with installed.shop.app_context(), recording(signals.refund_succeeded) as refunded:
        with pytest.raises(
            RefundDeclinedError, match=r"refused the refund of R 50\.00: Injected fault"
        ) as caught:
            refund(load(installed, checkout_id), 5_000)
        record = caught.value.refund
        assert record.state == RefundState.FAILED
        assert record.error == "Injected fault: refund answers 409."
        assert caught.value.http_status == 409
        checkout = load(installed, checkout_id)
        assert (checkout.status, checkout.refunded_cents) == ("PAID_PENDING_CALLBACK", 0)
        assert len(refunded) == 0
        # A failed refund does not hold the amount: the full amount can still be refunded.
        assert refund(checkout, 79_800).state == RefundState.SUCCEEDED


def test_refund_over_what_the_gateway_has_left_is_refused_there(installed):
    checkout_id, token = new_checkout(installed)
    share_signing_key(installed)
    installed.emulator.pay(token)
    with installed.shop.app_context():
        refresh(load(installed, checkout_id))
    # Someone refunded on the gateway directly: the shop does not know.
    body = {
        "requestId": "outside-1",
        "checkoutToken": token,
        "merchantRefundReference": "manual",
        "refundAmountCents": 70_000,
    }
    assert installed.emulator.signed("/v2/refund", body).status_code == 200
    with installed.shop.app_context(), pytest.raises(RefundDeclinedError, match="exceeds the 9800 cents"):
        refund(load(installed, checkout_id), 10_000)


def test_refund_retry_reuses_the_request_id(installed):
    checkout_id = paid(installed)
    transport = spy(installed)
    fault(installed, operation="refund", kind="status", status=503, count=1)
    with installed.shop.app_context(), recording(signals.refund_succeeded) as refunded:
        with pytest.raises(GatewayServerError):
            refund(load(installed, checkout_id), 10_000)
        (record,) = get_state().session.query(RefundRecord).all()
        assert record.state == RefundState.PENDING and "no answer" in (record.error or "")
        request_id = record.request_id
        # A pending refund holds its amount against what is left.
        with pytest.raises(RefundNotAllowedError, match="pending"):
            refund(load(installed, checkout_id), 79_800)
        done = retry_refund(record)
        assert done.id == record.id and done.state == RefundState.SUCCEEDED
        assert retry_refund(done) is done  # settled: nothing sent
        assert len(refunded) == 1
        assert load(installed, checkout_id).refunded_cents == 10_000
    request_ids = [s.body["requestId"] for s in transport.sent if s.path == "/v2/refund"]
    assert request_ids == [request_id, request_id]


@pytest.mark.backends
def test_refund_again_after_a_lost_answer_refunds_once(installed):
    checkout_id = paid(installed)
    spy(installed)
    fault(installed, operation="refund", kind="drop_response", count=1)
    with installed.shop.app_context(), recording(signals.refund_succeeded) as refunded:
        token = load(installed, checkout_id).token or ""
        with pytest.raises(GatewayConnectionError):
            refund(load(installed, checkout_id), 10_000)
        # The same call again (e.g. the owner clicks again) retries the pending record.
        record = refund(load(installed, checkout_id), 10_000)
        assert record.state == RefundState.SUCCEEDED
        assert get_state().session.query(RefundRecord).count() == 1
        assert load(installed, checkout_id).refunded_cents == 10_000
        assert len(refunded) == 1
    assert emulator_checkout(installed, token)["refundedCents"] == 10_000


def test_v1_refund_with_unknown_outcome_needs_force(harness_v1):
    checkout_id, token = new_checkout(harness_v1)
    harness_v1.emulator.pay(token)
    fault(harness_v1, operation="v1_refund", kind="status", status=502, count=1)
    with harness_v1.shop.app_context():
        with pytest.raises(GatewayServerError):
            refund(load(harness_v1, checkout_id), 10_000)
        (record,) = get_state().session.query(RefundRecord).all()
        with pytest.raises(RefundNotAllowedError, match="force=True"):
            retry_refund(record)
        assert retry_refund(record, force=True).state == RefundState.SUCCEEDED


def test_v1_refund_refused(harness_v1):
    checkout_id, token = new_checkout(harness_v1)
    harness_v1.emulator.pay(token)
    # Part was refunded on the gateway directly: the shop's "full" refund no longer matches what is left.
    outside = {"merchant_reference": "ORD-1", "token": token, "type": "partial", "amount": 1_000}
    assert harness_v1.emulator.v1("refund", outside).status_code == 200
    with harness_v1.shop.app_context():
        with pytest.raises(
            RefundDeclinedError, match="Amount is greater than available amount refundable"
        ) as caught:
            refund(load(harness_v1, checkout_id), 79_800)
        assert caught.value.refund.state == RefundState.FAILED
        assert load(harness_v1, checkout_id).status == "PAID"


def test_a_firewall_refusal_of_create_names_gateway_public_url_first(databases, monkeypatch):
    """The gateway's firewall refuses a localhost return URL: the error's one line starts with the key to
    set (pytest's summary and a log line show only the start)."""
    harness = build_harness(databases, monkeypatch, GATEWAY_PUBLIC_URL="http://localhost:5000")
    harness.install()
    with harness.shop.app_context():
        with pytest.raises(FirewallRejectedError) as refused:
            create_checkout(sample_order())
        assert get_state().session.query(GatewayCheckout).one().status == LocalStatus.FAILED
    first_line = str(refused.value).splitlines()[0]
    assert first_line.startswith("create: HTTP 403 GATEWAY_PUBLIC_URL: the gateway's firewall"), first_line
