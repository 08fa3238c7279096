"""Reconciliation: lost callbacks found, expiry, claims that keep concurrent runs apart, failures counted."""

from __future__ import annotations

from datetime import timedelta

import pytest
import requests
import responses
from sqlalchemy import update

from flask_gateway import create_checkout, signals
from flask_gateway.core.timestamps import format_timestamp, utcnow
from flask_gateway.labels import describe_detail
from flask_gateway.models import GatewayCheckout
from flask_gateway.operations.reconciliation import ReconcileReport, reconcile
from flask_gateway.state import get_state
from tests.extension.conftest import EMULATOR_URL, Harness, sample_order
from tests.extension.operations.operations_support import load, new_checkout, recording, spy

# Claims under SKIP LOCKED, ages and leases compared in SQL, a run started inside another run.
pytestmark = pytest.mark.backends


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


def getstatus_tokens(transport) -> list[str]:
    return [s.body["checkoutToken"] for s in transport.sent if s.path == "/v2/getstatus"]


def gateway_status_of(harness: Harness, token: str) -> str:
    return str(harness.emulator.control(f"checkouts/{token}", method="GET").json["checkoutPaymentStatus"])


def run(harness: Harness, **options) -> ReconcileReport:
    options.setdefault("older_than_seconds", 0)
    with harness.shop.app_context():
        return reconcile(**options)


def test_a_payment_whose_callback_was_lost_is_confirmed_once(installed):
    checkout_id, token = new_checkout(installed)
    # Every callback attempt fails: the shop never hears of the payment.
    installed.emulator.control("faults", {"operation": "callback", "kind": "callback_fail"})
    assert installed.emulator.pay(token).status_code == 200
    assert installed.emulator.control("deliver").json["attempts"] == 1
    with installed.shop.app_context():
        assert load(installed, checkout_id).status == "PENDING_ORDER"

    transport = spy(installed)
    with recording(signals.payment_confirmed) as confirmed:
        report = run(installed)
        assert (report.due, report.polled, report.changed, report.confirmed, report.failed) == (1, 1, 1, 1, 0)
        assert report.statuses == {"PAID_PENDING_CALLBACK": 1}
        assert [c["source"] for c in confirmed.calls] == ["reconcile"]
        assert getstatus_tokens(transport) == [token]

        # The callback finally arrives: the payment is not confirmed again.
        installed.emulator.control("faults", method="DELETE")
        installed.emulator.advance(3)
        installed.emulator.control("deliver")
        with installed.shop.app_context():
            checkout = load(installed, checkout_id)
            # The callback carries PAID_PENDING_CALLBACK (DESIGN 3): the payment is known, nothing fires;
            # the shop's 200 makes it PAID at the gateway, so the shop records PAID as well.
            assert checkout.status == "PAID"
            assert checkout.last_polled_at is not None
            get_state().session.execute(
                update(GatewayCheckout).values(last_polled_at=utcnow() - timedelta(minutes=2))
            )
            get_state().session.commit()
        later = run(installed)  # PAID is final: nothing is left to poll
        assert (later.due, later.polled, later.changed, later.confirmed) == (0, 0, 0, 0)
        assert gateway_status_of(installed, token) == "PAID"
        with installed.shop.app_context():
            assert load(installed, checkout_id).status == "PAID"
        assert len(confirmed) == 1


def test_back_to_back_runs_poll_each_checkout_once(installed):
    tokens = [new_checkout(installed, sample_order(f"ORD-{n}"))[1] for n in range(3)]
    transport = spy(installed)
    first = run(installed)
    assert (first.due, first.polled, first.changed) == (3, 3, 0)
    assert first.statuses == {"PENDING_ORDER": 3}
    second = run(installed)
    assert (second.due, second.polled) == (0, 0)
    assert sorted(getstatus_tokens(transport)) == sorted(tokens)


def test_default_age_leaves_fresh_checkouts_alone(installed):
    new_checkout(installed)
    transport = spy(installed)
    report = run(installed, older_than_seconds=None)  # GATEWAY_RECONCILE_AFTER_SECONDS = 300
    assert (report.due, report.polled) == (0, 0)
    assert getstatus_tokens(transport) == []
    with installed.shop.app_context():
        # Backdated by ten minutes, it is due.
        get_state().session.execute(
            update(GatewayCheckout).values(updated_at=utcnow() - timedelta(minutes=10))
        )
        get_state().session.commit()
        assert reconcile().polled == 1


def test_a_run_started_while_another_is_polling_takes_other_checkouts(installed):
    """Run B starts inside run A (from A's progress callback, in its own app context and session); one
    thread each, so A has claimed exactly one batch when B starts."""
    tokens = {new_checkout(installed, sample_order(f"ORD-{n}"))[1] for n in range(14)}
    transport = spy(installed)
    inner: list[ReconcileReport] = []

    def progress(done: int, total: int) -> None:
        if done == 1 and not inner:
            with installed.shop.app_context():
                inner.append(reconcile(older_than_seconds=0, concurrency=1))

    outer = run(installed, progress=progress, concurrency=1)
    (nested,) = inner
    assert outer.due == 14
    assert outer.polled + nested.polled == 14
    # A claimed its first batch (10) before B started; B took the other 4; nobody polled twice.
    assert (outer.polled, nested.polled) == (10, 4)
    polled = getstatus_tokens(transport)
    assert sorted(polled) == sorted(tokens)
    assert run(installed).polled == 0


def test_limit(installed):
    for n in range(3):
        new_checkout(installed, sample_order(f"ORD-{n}"))
    steps: list[tuple[int, int]] = []
    report = run(installed, limit=2, progress=lambda done, total: steps.append((done, total)))
    assert (report.due, report.polled) == (2, 2)
    assert steps == [(0, 2), (1, 2), (2, 2)]
    assert run(installed).polled == 1


def test_expired_on_the_gateway(installed):
    checkout_id, _ = new_checkout(installed)
    installed.emulator.advance(2 * 3600)
    with recording(signals.checkout_expired) as expired:
        report = run(installed)
    assert (report.polled, report.expired, report.changed) == (1, 1, 1)
    assert len(expired) == 1
    with installed.shop.app_context():
        assert load(installed, checkout_id).status == "EXPIRED"


def test_consumer_cancel_and_still_open_checkouts(installed):
    _, cancelled = new_checkout(installed, sample_order("ORD-1"))
    new_checkout(installed, sample_order("ORD-2"))
    installed.emulator.consumer_cancel(cancelled)
    report = run(installed)
    assert report.statuses == {"CANCELLED_BY_CONSUMER": 1, "PENDING_ORDER": 1}
    assert report.changed == 1


def _status_payload(token: str, status: str, *, expires_at) -> dict[str, object]:
    now = format_timestamp(utcnow())
    return {
        "requestId": "r",
        "checkoutToken": token,
        "checkoutTotalCents": 79800,
        "paymentUrl": f"{EMULATOR_URL}/api/v2/app/checkout/{token}",
        "checkoutPaymentStatus": status,
        "paidAt": None,
        "paymentReference": None,
        "merchantOrderReference": "ORD-1",
        "serviceOrderReference": None,
        "clickTraceId": None,
        "createdAt": now,
        "updatedAt": now,
        "expiresAt": format_timestamp(expires_at),
        "cancelledAt": None,
        "lastCallbackAttemptedAt": None,
        "lastCallbackAttemptStatusMessage": None,
    }


def _through_responses(harness: Harness) -> None:
    """Send the shop's gateway calls through plain ``requests`` (intercepted by ``responses``)."""
    get_state(harness.shop).client_options["session"] = requests.Session()


def test_pending_past_its_expiry_is_treated_as_expired(installed):
    checkout_id, token = new_checkout(installed)
    _through_responses(installed)
    with responses.RequestsMock() as mocked, recording(signals.checkout_expired) as expired:
        mocked.post(
            f"{EMULATOR_URL}/v2/getstatus",
            json=_status_payload(token, "PENDING_ORDER", expires_at=utcnow() - timedelta(minutes=5)),
        )
        report = run(installed)
    assert (report.polled, report.expired, report.changed) == (1, 1, 1)
    assert len(expired) == 1
    with installed.shop.app_context():
        checkout = load(installed, checkout_id)
        assert checkout.status == "EXPIRED"
        assert "treated as expired" in checkout.events[-1].detail


def test_one_failure_is_counted_and_the_run_goes_on(installed):
    first_id, first = new_checkout(installed, sample_order("ORD-1"))
    _, second = new_checkout(installed, sample_order("ORD-2"))
    _through_responses(installed)
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mocked:

        def answer(request):
            import json

            token = json.loads(request.body)["checkoutToken"]
            if token == first:
                raise requests.ConnectTimeout("no answer")
            body = _status_payload(token, "PENDING_ORDER", expires_at=utcnow() + timedelta(hours=1))
            return 200, {}, json.dumps(body)

        mocked.add_callback(responses.POST, f"{EMULATOR_URL}/v2/getstatus", callback=answer)
        report = run(installed)
    assert (report.due, report.polled, report.failed) == (2, 1, 1)
    (error,) = report.errors
    assert error.checkout_id == first_id and error.token == first
    assert "did not answer in time" in error.message
    assert "1 failed" in report.summary()
    assert second


def test_stuck_creating_is_reported_not_polled(installed):
    installed.emulator.control("faults", {"operation": "create", "kind": "status", "status": 503, "count": 1})
    with installed.shop.app_context():
        with pytest.raises(Exception, match="503"):
            create_checkout(sample_order())
        (stuck,) = get_state().session.query(GatewayCheckout).all()
        stuck_id = stuck.id
        assert reconcile(older_than_seconds=0).stuck_creating == []  # too fresh to call stuck
        get_state().session.execute(
            update(GatewayCheckout).values(created_at=utcnow() - timedelta(minutes=2))
        )
        get_state().session.commit()
    transport = spy(installed)
    report = run(installed)
    assert report.stuck_creating == [stuck_id]
    assert report.polled == 0 and getstatus_tokens(transport) == []
    assert f"#{stuck_id}" in report.summary()


def test_not_installed(harness):
    report = run(harness)
    assert report.installed is False
    assert "not installed" in report.summary()


def test_other_accounts_are_skipped(installed):
    checkout_id, _ = new_checkout(installed)
    with installed.shop.app_context():
        get_state().session.execute(update(GatewayCheckout).values(merchant_account_id="old-account"))
        get_state().session.commit()
    report = run(installed)
    assert (report.polled, report.other_account) == (0, 1)
    assert checkout_id


def test_the_summary_names_each_status_in_words_with_its_code() -> None:
    """The statuses as the admin and the CLI word them, with the code an operator greps for; a status this
    version does not know as its code alone; and the heartbeat's detail (shown through describe_detail)
    says each once."""
    report = ReconcileReport(started_at=utcnow(), paid_window_hours=72)
    report.statuses.update({"PENDING_ORDER": 2, "PAID_PENDING_CALLBACK": 1, "NEW_STATUS": 1})
    report.paid_statuses.update({"FULLY_REFUNDED": 1})
    lines = report.summary().splitlines()
    assert lines[1] == (
        "Statuses now: NEW_STATUS: 1, Paid - confirming (PAID_PENDING_CALLBACK): 1, "
        "Awaiting payment (PENDING_ORDER): 2"
    )
    assert lines[2].endswith(" Statuses now: Refunded (FULLY_REFUNDED): 1")
    assert describe_detail(lines[1]) == (
        "Statuses now: NEW_STATUS: 1, Paid - confirming: 1, Awaiting payment: 2"
    )
