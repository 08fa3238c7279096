"""Reconciliation asks about recently paid checkouts: refunds and cancellations made at the gateway (issue 15).

A refund made directly at the gateway (the emulator has no operator refund action, so the merchant's
signed v2 refund, as another system of the merchant's would make it) shows up in the shop within one run
once the checkout is due: a refund record, the refunded cents, ``refund_succeeded`` once. Paid checkouts
outside ``GATEWAY_RECONCILE_PAID_WINDOW_HOURS``, or changed or polled within the recheck interval, are
not asked about; a window of 0 turns it off; two runs at once split the paid checkouts.
"""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta
from typing import Any

import pytest
import requests
import responses
from sqlalchemy import select, update

from flask_gateway import ConfigurationError, refund, signals
from flask_gateway.config import GatewayConfig
from flask_gateway.core.timestamps import format_timestamp, utcnow
from flask_gateway.models import GatewayCheckout, OutboxEvent, RefundState
from flask_gateway.operations.reconciliation import PAID_RECHECK_SECONDS, ReconcileReport, reconcile
from flask_gateway.payments.polling import refresh
from flask_gateway.payments.transitions import Observation, apply
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.extension.conftest import EMULATOR_URL, Harness, build_harness, sample_order
from tests.extension.operations.operations_support import (
    emulator_checkout,
    load,
    new_checkout,
    recording,
    share_signing_key,
    spy,
)

#: The tests whose outcome can depend on the backend: windows, rechecks and leases compared in SQL, claims
#: under SKIP LOCKED, a run inside another run, refunds recorded under the row lock.
backends = pytest.mark.backends

TOTAL = 79800  # sample_order(): 2 x 39900


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    share_signing_key(harness)
    return harness


def run(h: Harness, **options: Any) -> ReconcileReport:
    options.setdefault("older_than_seconds", 0)
    with h.shop.app_context():
        return reconcile(**options)


def paid_checkout(h: Harness, reference: str = "ORD-1") -> tuple[int, str]:
    """A checkout paid on the gateway and confirmed in the shop by its callback (``PAID``)."""
    checkout_id, token = new_checkout(h, sample_order(reference))
    assert h.emulator.pay(token).status_code == 200
    assert h.emulator.control("deliver").status_code == 200
    with h.shop.app_context():
        checkout = load(h, checkout_id)
        assert (checkout.status, checkout.payment_confirmed_at is not None) == ("PAID", True)
    return checkout_id, token


def refund_at_the_gateway(h: Harness, token: str, amount: int, reference: str) -> None:
    """A refund the shop did not make: the merchant's signed v2 refund, sent by another system."""
    answer = h.emulator.signed(
        "/v2/refund",
        {
            "requestId": f"elsewhere-{reference}",
            "checkoutToken": token,
            "merchantRefundReference": reference,
            "refundAmountCents": amount,
            "refundDescription": "refunded in the gateway's portal",
        },
    )
    assert answer.status_code == 200, answer.get_data(as_text=True)
    assert answer.json["refundStatus"] == "SUCCESS"  # type: ignore[index]


def paid_ago(h: Harness, checkout_id: int, hours: float) -> None:
    """As if the payment had been recorded (and nothing had changed or polled it since) ``hours`` ago."""
    at = utcnow() - timedelta(hours=hours)
    with h.shop.app_context():
        session = get_state().session
        session.execute(
            update(GatewayCheckout)
            .where(GatewayCheckout.id == checkout_id)
            .values(payment_confirmed_at=at, updated_at=at, last_polled_at=None)
        )
        session.commit()


def polled_ago(h: Harness, checkout_id: int, hours: float) -> None:
    """As if the last poll and the last change of the checkout were ``hours`` ago."""
    at = utcnow() - timedelta(hours=hours)
    with h.shop.app_context():
        session = get_state().session
        session.execute(
            update(GatewayCheckout)
            .where(GatewayCheckout.id == checkout_id)
            .values(updated_at=at, last_polled_at=at)
        )
        session.commit()


def getstatus_tokens(transport: Any) -> list[str]:
    return [s.body["checkoutToken"] for s in transport.sent if s.path == "/v2/getstatus"]


# --- refunds made at the gateway ------------------------------------------------------------------------


@backends
def test_a_refund_made_at_the_gateway_in_two_parts_shows_up_in_one_run(installed: Harness) -> None:
    checkout_id, token = paid_checkout(installed)
    refund_at_the_gateway(installed, token, 30000, "portal-1")
    refund_at_the_gateway(installed, token, TOTAL - 30000, "portal-2")
    assert emulator_checkout(installed, token)["checkoutPaymentStatus"] == "FULLY_REFUNDED"
    paid_ago(installed, checkout_id, 2)  # the next scheduled run after the recheck interval

    transport = spy(installed)
    with (
        recording(signals.refund_succeeded) as refunded,
        recording(signals.payment_confirmed) as confirmed,
        recording(signals.checkout_flagged) as flagged,
    ):
        report = run(installed)
        assert (report.due, report.polled) == (0, 0)  # nothing open
        assert (report.paid_due, report.paid_polled, report.paid_changed, report.paid_failed) == (1, 1, 1, 0)
        assert (report.refunded, report.refunded_cents, report.flagged) == (1, TOTAL, 0)
        assert report.paid_statuses == {"FULLY_REFUNDED": 1}
        assert getstatus_tokens(transport) == [token]
        summary = report.summary()
        assert (
            "Checked 1 of 1 paid checkout(s) due from the last 72 hour(s): 1 changed, 0 failed. "
            "Statuses now: Refunded (FULLY_REFUNDED): 1" in summary
        )
        assert "Refunds learnt from the gateway: 1 checkout(s), R 798.00 recorded" in summary

        assert [call["amount_cents"] for call in refunded.calls] == [TOTAL]  # once, the whole amount
        assert len(confirmed) == 0 and len(flagged) == 0
        with installed.shop.app_context():
            checkout = load(installed, checkout_id)
            assert (checkout.status, checkout.refunded_cents, checkout.flagged) == (
                "FULLY_REFUNDED",
                TOTAL,
                False,
            )
            [record] = checkout.refunds
            assert (record.amount_cents, record.state) == (TOTAL, RefundState.SUCCEEDED)
            assert "refunded at the gateway" in record.reason and "reconcile" in record.reason
            assert checkout.events[-1].source == "reconcile"

        # A second run changes nothing: FULLY_REFUNDED is final, even when every paid checkout is due.
        for options in ({}, {"paid_recheck_seconds": 0}):
            again = run(installed, **options)
            assert (again.paid_due, again.paid_polled, again.refunded) == (0, 0, 0)
        assert getstatus_tokens(transport) == [token]
        assert len(refunded) == 1


@backends
def test_a_refund_at_the_gateway_after_the_shops_own_partial_refund(installed: Harness) -> None:
    checkout_id, token = paid_checkout(installed)
    with installed.shop.app_context():
        assert refund(load(installed, checkout_id), 10000).state == RefundState.SUCCEEDED
    refund_at_the_gateway(installed, token, TOTAL - 10000, "portal-rest")
    polled_ago(installed, checkout_id, 2)

    with recording(signals.refund_succeeded) as refunded:
        report = run(installed)
    assert (report.paid_polled, report.paid_changed, report.refunded_cents) == (1, 1, TOTAL - 10000)
    assert [call["amount_cents"] for call in refunded.calls] == [TOTAL - 10000]
    with installed.shop.app_context():
        checkout = load(installed, checkout_id)
        assert (checkout.status, checkout.refunded_cents, checkout.flagged) == (
            "FULLY_REFUNDED",
            TOTAL,
            False,
        )
        assert [(r.amount_cents, r.state) for r in checkout.refunds] == [
            (10000, "SUCCEEDED"),
            (TOTAL - 10000, "SUCCEEDED"),
        ]


@backends
def test_a_partial_refund_at_the_gateway_is_flagged_and_the_rest_recorded_later(installed: Harness) -> None:
    checkout_id, token = paid_checkout(installed)
    refund_at_the_gateway(installed, token, 30000, "portal-1")
    paid_ago(installed, checkout_id, 2)

    with (
        recording(signals.refund_succeeded) as refunded,
        recording(signals.checkout_flagged) as flagged,
    ):
        first = run(installed)
        # The status answer carries no amount: the shop cannot record what it does not know.
        assert (first.paid_polled, first.paid_changed, first.refunded, first.flagged) == (1, 1, 0, 1)
        assert "1 checkout(s) flagged for a person" in first.summary()
        assert len(refunded) == 0
        assert len(flagged) == 1 and "partial refund" in flagged.calls[0]["reason"]
        with installed.shop.app_context():
            checkout = load(installed, checkout_id)
            assert (checkout.status, checkout.refunded_cents, checkout.flagged) == (
                "PARTIALLY_REFUNDED",
                0,
                True,
            )

        refund_at_the_gateway(installed, token, TOTAL - 30000, "portal-2")
        assert run(installed).paid_polled == 0  # polled within the recheck interval: not yet
        polled_ago(installed, checkout_id, 2)
        second = run(installed)
        assert (second.paid_polled, second.refunded, second.refunded_cents) == (1, 1, TOTAL)
        assert [call["amount_cents"] for call in refunded.calls] == [TOTAL]
        assert len(flagged) == 1  # flagged once
    with installed.shop.app_context():
        checkout = load(installed, checkout_id)
        assert (checkout.status, checkout.refunded_cents) == ("FULLY_REFUNDED", TOTAL)


# --- which paid checkouts, how often ------------------------------------------------------------------


@backends
def test_only_paid_checkouts_inside_the_window_and_past_the_recheck_are_polled(installed: Harness) -> None:
    recent_id, recent = paid_checkout(installed, "ORD-RECENT")
    old_id, old = paid_checkout(installed, "ORD-OLD")
    fresh_id, fresh = paid_checkout(installed, "ORD-FRESH")
    paid_ago(installed, recent_id, 2)
    paid_ago(installed, old_id, 73)  # outside the default 72 hours
    for token, reference in ((recent, "r"), (old, "o"), (fresh, "f")):
        refund_at_the_gateway(installed, token, TOTAL, reference)

    transport = spy(installed)
    report = run(installed)
    assert getstatus_tokens(transport) == [recent]
    assert (report.paid_due, report.paid_polled) == (1, 1)
    with installed.shop.app_context():
        assert load(installed, old_id).status == "PAID"  # outside the window: never asked about
        assert load(installed, fresh_id).status == "PAID"  # paid minutes ago: not due yet

    # A longer window for one run reaches the older one; a recheck of 0 the one paid just now.
    report = run(installed, paid_window_hours=100, paid_recheck_seconds=0)
    assert sorted(getstatus_tokens(transport)) == sorted([recent, old, fresh])
    assert report.paid_polled == 2
    with installed.shop.app_context():
        assert {load(installed, i).status for i in (old_id, fresh_id)} == {"FULLY_REFUNDED"}


@backends
def test_a_paid_checkout_is_asked_about_at_most_once_per_recheck(installed: Harness) -> None:
    checkout_id, token = paid_checkout(installed)
    paid_ago(installed, checkout_id, 2)
    transport = spy(installed)
    first = run(installed)
    assert (first.paid_polled, first.paid_changed, first.paid_statuses) == (1, 0, {"PAID": 1})
    # Right after, not even a recheck of 0 polls it again: the claim's lease (60 s) holds.
    for options in ({}, {"paid_recheck_seconds": 0}):
        assert run(installed, **options).paid_polled == 0
    # One recheck interval later it is due again.
    polled_ago(installed, checkout_id, PAID_RECHECK_SECONDS / 3600 + 0.1)
    assert run(installed).paid_polled == 1
    assert getstatus_tokens(transport) == [token, token]


@backends
def test_a_checkout_the_open_pass_finds_paid_is_not_asked_again_in_the_same_run(
    installed: Harness,
) -> None:
    checkout_id, token = new_checkout(installed)
    installed.emulator.control("faults", {"operation": "callback", "kind": "callback_fail"})
    assert installed.emulator.pay(token).status_code == 200
    transport = spy(installed)
    with recording(signals.payment_confirmed) as confirmed:
        report = run(installed, paid_recheck_seconds=0)
    assert (report.polled, report.confirmed, report.paid_polled) == (1, 1, 0)
    assert getstatus_tokens(transport) == [token]
    assert len(confirmed) == 1
    with installed.shop.app_context():
        assert load(installed, checkout_id).status == "PAID_PENDING_CALLBACK"


@backends
def test_limit_counts_both_passes_open_checkouts_first(installed: Harness) -> None:
    new_checkout(installed, sample_order("ORD-OPEN"))
    for n in range(2):
        checkout_id, _ = paid_checkout(installed, f"ORD-PAID-{n}")
        paid_ago(installed, checkout_id, 2)
    steps: list[tuple[int, int]] = []
    report = run(installed, limit=2, progress=lambda done, total: steps.append((done, total)))
    assert (report.due, report.polled, report.paid_due, report.paid_polled) == (1, 1, 1, 1)
    assert steps == [(0, 2), (1, 2), (2, 2)]
    assert run(installed).paid_polled == 1  # the other one, next run


@backends
def test_a_window_of_zero_turns_it_off(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> None:
    h = build_harness(databases, monkeypatch, GATEWAY_RECONCILE_PAID_WINDOW_HOURS=0)
    try:
        h.install()
        share_signing_key(h)
        checkout_id, token = paid_checkout(h)
        refund_at_the_gateway(h, token, TOTAL, "portal")
        paid_ago(h, checkout_id, 2)
        transport = spy(h)
        report = run(h, paid_recheck_seconds=0)
        assert (report.paid_window_hours, report.paid_due, report.paid_polled) == (0, 0, 0)
        assert "Paid checkouts not checked (paid window 0)." in report.summary()
        assert getstatus_tokens(transport) == []
        with h.shop.app_context():
            assert load(h, checkout_id).status == "PAID"
        # A window given for one run still works.
        assert run(h, paid_window_hours=3).paid_polled == 1
    finally:
        with h.shop.app_context():
            h.db.engine.dispose()


def test_a_window_of_zero_for_one_run(installed: Harness) -> None:
    checkout_id, _ = paid_checkout(installed)
    paid_ago(installed, checkout_id, 2)
    assert run(installed, paid_window_hours=0).paid_polled == 0
    for wrong in ({"paid_window_hours": -1}, {"paid_window_hours": 8761}, {"paid_recheck_seconds": -1}):
        with pytest.raises(ValueError, match="must be"):
            run(installed, **wrong)
    assert run(installed).paid_polled == 1


# --- two runs at once ----------------------------------------------------------------------------------


@backends
def test_a_run_started_while_another_is_polling_paid_checkouts_takes_other_ones(installed: Harness) -> None:
    """Run B starts inside run A (from A's progress callback, in its own app context and session); one
    thread each, so A has claimed exactly one batch when B starts."""
    tokens = set()
    for n in range(14):
        checkout_id, token = paid_checkout(installed, f"ORD-{n}")
        paid_ago(installed, checkout_id, 2)
        tokens.add(token)
    transport = spy(installed)
    inner: list[ReconcileReport] = []

    def progress(done: int, total: int) -> None:
        if done == 1 and not inner:
            with installed.shop.app_context():
                inner.append(reconcile(older_than_seconds=0, concurrency=1))

    outer = run(installed, progress=progress, concurrency=1)
    (nested,) = inner
    assert outer.paid_due == 14
    # A claimed its first batch (10) before B started; B took the other 4; nobody polled twice.
    assert (outer.paid_polled, nested.paid_polled) == (10, 4)
    assert sorted(getstatus_tokens(transport)) == sorted(tokens)
    assert run(installed).paid_polled == 0


# --- what the gateway says that the shop cannot follow -----------------------------------------------


def _status_payload(token: str, status: str, paid_at: datetime) -> dict[str, object]:
    now = format_timestamp(utcnow())
    return {
        "requestId": "r",
        "checkoutToken": token,
        "checkoutTotalCents": TOTAL,
        "paymentUrl": f"{EMULATOR_URL}/api/v2/app/checkout/{token}",
        "checkoutPaymentStatus": status,
        "paidAt": format_timestamp(paid_at),
        "paymentReference": None,
        "merchantOrderReference": "ORD-1",
        "serviceOrderReference": None,
        "clickTraceId": None,
        "createdAt": now,
        "updatedAt": now,
        "expiresAt": format_timestamp(utcnow() + timedelta(hours=1)),
        "cancelledAt": now,
        "lastCallbackAttemptedAt": None,
        "lastCallbackAttemptStatusMessage": None,
    }


@pytest.mark.parametrize("status", ["CANCELLED_BY_MERCHANT", "EXPIRED", "PENDING_ORDER"])
def test_a_paid_checkout_the_gateway_calls_unpaid_is_flagged_never_moved_back(
    installed: Harness, status: str
) -> None:
    checkout_id, token = paid_checkout(installed)
    paid_ago(installed, checkout_id, 2)
    get_state(installed.shop).client_options["session"] = requests.Session()  # through `responses`
    with (
        responses.RequestsMock() as mocked,
        recording(signals.checkout_flagged) as flagged,
        recording(signals.checkout_cancelled) as cancelled,
        recording(signals.checkout_expired) as expired,
    ):
        mocked.post(
            f"{EMULATOR_URL}/v2/getstatus",
            json=_status_payload(token, status, utcnow() - timedelta(hours=2)),
        )
        report = run(installed)
        assert (report.paid_polled, report.paid_changed, report.flagged) == (1, 0, 1)
        assert report.paid_statuses == {"PAID": 1}
        assert "1 checkout(s) flagged for a person" in report.summary()
        assert len(flagged) == 1 and len(cancelled) == 0 and len(expired) == 0
        (call,) = flagged.calls
        assert call["source"] == "reconcile"
        assert f"the gateway answers {status} for a checkout the shop had recorded as PAID" in call["reason"]

        polled_ago(installed, checkout_id, 2)
        assert run(installed).flagged == 0  # asked again, still contradicted: flagged once
        assert len(flagged) == 1
    with installed.shop.app_context():
        checkout = load(installed, checkout_id)
        assert (checkout.status, checkout.flagged) == ("PAID", True)
        assert "does not go back" in (checkout.flag_reason or "")
        event = checkout.events[-1]
        assert (event.source, event.from_status, event.to_status, event.applied) == (
            "reconcile",
            "PAID",
            status,
            False,
        )
        assert "recorded as PAID before asking" in event.detail


def test_any_status_check_asked_after_the_payment_flags_a_checkout_the_gateway_calls_unpaid(
    installed: Harness,
) -> None:
    checkout_id, token = paid_checkout(installed)
    get_state(installed.shop).client_options["session"] = requests.Session()  # through `responses`
    with (
        responses.RequestsMock() as mocked,
        recording(signals.checkout_flagged) as flagged,
        recording(signals.checkout_cancelled) as cancelled,
        installed.shop.app_context(),
    ):
        mocked.post(
            f"{EMULATOR_URL}/v2/getstatus",
            json=_status_payload(token, "CANCELLED_BY_MERCHANT", utcnow() - timedelta(minutes=5)),
        )
        transition = refresh(load(installed, checkout_id), source="admin")
        assert (transition.before, transition.after, transition.applied) == ("PAID", "PAID", False)
        assert transition.flagged and "does not go back" in transition.reason
        assert [call["source"] for call in flagged.calls] == ["admin"] and len(cancelled) == 0
        assert load(installed, checkout_id).flagged
        # Written to the outbox with the flag, in the same transaction (delivered at least once).
        kinds = get_state().session.scalars(
            select(OutboxEvent.kind).where(OutboxEvent.checkout_id == checkout_id)
        )
        assert list(kinds).count("checkout_flagged") == 1


def test_an_answer_overtaken_by_the_payment_is_not_flagged(installed: Harness) -> None:
    """Asked before the payment was recorded: the answer may be stale, never a contradiction."""
    checkout_id, token = new_checkout(installed)
    get_state(installed.shop).client_options["session"] = requests.Session()

    def answer(request: Any) -> tuple[int, dict[str, str], str]:
        # While the shop waits for this answer, the payment's callback is recorded by another worker.
        with installed.shop.app_context():
            apply(
                get_state().session,
                checkout_id,
                Observation(status="PAID_PENDING_CALLBACK", source="callback", total_cents=TOTAL),
            )
        return 200, {}, json.dumps(_status_payload(token, "PENDING_ORDER", utcnow()))

    with (
        responses.RequestsMock() as mocked,
        recording(signals.checkout_flagged) as flagged,
        installed.shop.app_context(),
    ):
        mocked.add_callback(responses.POST, f"{EMULATOR_URL}/v2/getstatus", callback=answer)
        transition = refresh(load(installed, checkout_id), source="admin")
        assert (transition.after, transition.applied, transition.flagged) == (
            "PAID_PENDING_CALLBACK",
            False,
            False,
        )
        assert len(flagged) == 0
        assert not load(installed, checkout_id).flagged


def test_a_failed_poll_of_a_paid_checkout_is_counted_and_the_run_goes_on(installed: Harness) -> None:
    failing_id, failing = paid_checkout(installed, "ORD-1")
    other_id, _ = paid_checkout(installed, "ORD-2")
    paid_ago(installed, failing_id, 3)  # older: claimed first
    paid_ago(installed, other_id, 2)
    get_state(installed.shop).client_options["session"] = requests.Session()
    with responses.RequestsMock() as mocked:

        def answer(request: Any) -> tuple[int, dict[str, str], str]:
            token = json.loads(request.body)["checkoutToken"]
            if token == failing:
                raise requests.ConnectTimeout("no answer")
            return 200, {}, json.dumps(_status_payload(token, "PAID", utcnow() - timedelta(hours=2)))

        mocked.add_callback(responses.POST, f"{EMULATOR_URL}/v2/getstatus", callback=answer)
        report = run(installed)
    assert (report.paid_due, report.paid_polled, report.paid_failed, report.failed) == (2, 1, 1, 1)
    (error,) = report.errors
    assert (error.checkout_id, error.token) == (failing_id, failing)
    summary = report.summary()
    assert "0 failed." in summary.splitlines()[0]  # the open pass
    assert "Checked 1 of 2 paid checkout(s) due from the last 72 hour(s): 0 changed, 1 failed." in summary


# --- the command and the setting -------------------------------------------------------------------------


def test_the_command_says_what_the_paid_checkouts_told(installed: Harness) -> None:
    checkout_id, token = paid_checkout(installed)
    refund_at_the_gateway(installed, token, TOTAL, "portal")
    runner = installed.shop.test_cli_runner()

    off = runner.invoke(args=["gateway", "reconcile", "--quiet", "--paid-window", "0", "--paid-recheck", "0"])
    assert off.exit_code == 0, off.output
    assert "Paid checkouts not checked (paid window 0)." in off.output
    waiting = runner.invoke(args=["gateway", "reconcile", "--quiet"])
    assert "Checked 0 of 0 paid checkout(s) due from the last 72 hour(s)" in waiting.output

    # Right after a refund in the gateway's portal: one run with --paid-recheck 0 records it.
    result = runner.invoke(args=["gateway", "reconcile", "--paid-recheck", "0"])
    assert result.exit_code == 0, result.output
    assert "Polling checkouts" in result.output  # the progress bar counts the paid checkouts too
    assert (
        "Checked 1 of 1 paid checkout(s) due from the last 72 hour(s): 1 changed, 0 failed. "
        "Statuses now: Refunded (FULLY_REFUNDED): 1" in result.output
    )
    assert "Refunds learnt from the gateway: 1 checkout(s), R 798.00 recorded" in result.output
    with installed.shop.app_context():
        assert load(installed, checkout_id).refunded_cents == TOTAL
    for wrong in (["--paid-window", "-1"], ["--paid-window", "8761"], ["--paid-recheck", "-1"]):
        assert runner.invoke(args=["gateway", "reconcile", *wrong]).exit_code == 2  # click refuses it


@pytest.mark.parametrize("value", [0, 0.5, 72, 8760])
def test_the_window_setting_accepts_hours_from_0_to_a_year(value: float) -> None:
    config = GatewayConfig.from_mapping({"GATEWAY_RECONCILE_PAID_WINDOW_HOURS": value})
    assert config.reconcile_paid_window_hours == value


def test_the_window_setting_defaults_to_72_hours() -> None:
    settings: dict[str, Any] = {}
    assert GatewayConfig.from_mapping(settings).reconcile_paid_window_hours == 72
    assert settings["GATEWAY_RECONCILE_PAID_WINDOW_HOURS"] == 72


@pytest.mark.parametrize("value", [-1, 8761, "72", True, None, math.nan, math.inf])
def test_a_wrong_window_setting_stops_init_app(value: object) -> None:
    with pytest.raises(ConfigurationError, match=r"GATEWAY_RECONCILE_PAID_WINDOW_HOURS=.*0 turns it off"):
        GatewayConfig.from_mapping({"GATEWAY_RECONCILE_PAID_WINDOW_HOURS": value})
