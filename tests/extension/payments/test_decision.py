"""The state machine's rules (``payments.decision.decide``), table by table, without a database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from flask_gateway.payments.decision import (
    NO_CHANGE,
    RANK,
    Current,
    Decision,
    Observation,
    Refund,
    decide,
    moves,
)

NOW = datetime(2026, 12, 2, 12, 0, tzinfo=UTC)
EARLIER = NOW - timedelta(hours=1)
ACCOUNT = "merchant-1"


def current(status: str = "PENDING_ORDER", **fields) -> Current:
    fields.setdefault("merchant_account_id", ACCOUNT)
    fields.setdefault("total_cents", 1000)
    return Current(status=status, **fields)


def seen(status: str, source: str = "poll", **fields) -> Observation:
    return Observation(status=status, source=source, **fields)


def kinds(decision: Decision) -> list[str]:
    return [notice.kind for notice in decision.notices]


# (before, after, moves): forward only; any move among the open statuses; unknown statuses never.
MOVES = [
    ("CREATING", "PENDING_ORDER", True),
    ("PENDING_ORDER", "PENDING_PAYMENT", True),
    ("PENDING_PAYMENT", "PENDING_ORDER", True),
    ("CANCELLED_BY_CONSUMER", "PENDING_ORDER", True),
    ("PENDING_ORDER", "PAID_PENDING_CALLBACK", True),
    ("PAID_PENDING_CALLBACK", "PAID", True),
    ("PAID", "PAID_PENDING_CALLBACK", False),
    ("PAID", "PENDING_ORDER", False),
    ("PAID", "PARTIALLY_REFUNDED", True),
    ("PARTIALLY_REFUNDED", "FULLY_REFUNDED", True),
    ("FULLY_REFUNDED", "PARTIALLY_REFUNDED", False),
    ("CANCELLED_BY_MERCHANT", "PAID", True),
    ("EXPIRED", "CANCELLED_BY_MERCHANT", False),
    ("FAILED", "PAID", False),
    ("PENDING_ORDER", "ON_HOLD", False),
    ("PAID", "PAID", False),
]


@pytest.mark.parametrize(("before", "after", "expected"), MOVES)
def test_which_moves_are_allowed(before, after, expected):
    assert moves(before, after) is expected
    decision = decide(current(before), seen(after, total_cents=1000), NOW)
    assert decision.applied is expected
    assert decision.after == (after if expected else before)
    if not expected:
        assert "status" not in decision.changes
        assert decision.detail == (NO_CHANGE if before == after else f"{before} does not move back")


# (status entered, notices queued, columns written besides status and updated_at)
EFFECTS = [
    ("PAID", ["payment_confirmed"], {"payment_confirmed_at", "paid_at", "paid_cents"}),
    ("PAID_PENDING_CALLBACK", ["payment_confirmed"], {"payment_confirmed_at", "paid_at", "paid_cents"}),
    ("CANCELLED_BY_CONSUMER", ["checkout_cancelled"], set()),
    ("CANCELLED_BY_MERCHANT", ["checkout_cancelled"], set()),
    ("EXPIRED", ["checkout_expired"], set()),
    ("PENDING_PAYMENT", [], set()),
]


@pytest.mark.parametrize(("status", "notices", "columns"), EFFECTS)
def test_what_entering_a_status_does(status, notices, columns):
    decision = decide(current("PENDING_ORDER"), seen(status, total_cents=1000), NOW)
    assert decision.applied
    assert kinds(decision) == notices
    assert set(decision.changes) - {"status", "updated_at"} == columns
    assert decision.changes["status"] == status and decision.changes["updated_at"] == NOW


def test_a_payment_is_confirmed_once_and_at_the_time_the_source_reports():
    first = decide(current(), seen("PAID_PENDING_CALLBACK", "return", paid_at=EARLIER), NOW)
    assert first.changes["paid_at"] == EARLIER and first.changes["payment_confirmed_at"] == NOW
    assert first.changes["paid_cents"] == 1000
    assert first.notices[0].arguments == {"source": "return"}
    again = decide(current("PAID_PENDING_CALLBACK", payment_confirmed=True), seen("PAID", "callback"), NOW)
    assert again.applied and kinds(again) == []
    assert "payment_confirmed_at" not in again.changes


# (observation fields, the refusal's words): another account, or another total for a paid status.
MISMATCHES = [
    ({"merchant_account_id": "someone-else"}, "merchant account 'someone-else' does not match"),
    ({"total_cents": 1}, "total 1 cents does not match the checkout's 1000"),
]


@pytest.mark.parametrize(("fields", "words"), MISMATCHES)
def test_an_observation_of_another_checkout_is_refused_and_flagged(fields, words):
    decision = decide(current(), seen("PAID", token="t", payment_url="https://gw/p", **fields), NOW)
    assert decision.refused and not decision.applied
    assert words in decision.reason and decision.detail == f"REFUSED: {decision.reason}"
    assert decision.changes == {"flagged": True, "flag_reason": decision.reason}  # nothing of its own
    assert kinds(decision) == ["checkout_flagged"]
    already = decide(current(flagged=True), seen("PAID", **fields), NOW)
    assert kinds(already) == []  # flagged once: no second notice
    assert already.changes["flag_reason"] == already.reason


def test_a_total_is_only_checked_for_a_paid_status():
    assert decide(current(), seen("EXPIRED", total_cents=1), NOW).applied


def test_a_payment_after_the_shop_closed_the_checkout_is_kept_and_flagged():
    decision = decide(current("CANCELLED_BY_MERCHANT"), seen("PAID", total_cents=1000), NOW)
    assert decision.applied and not decision.refused
    assert kinds(decision) == ["payment_confirmed", "payment_after_close", "checkout_flagged"]
    assert decision.notices[1].arguments == {"before": "CANCELLED_BY_MERCHANT", "source": "poll"}
    assert "paid after the shop saw it CANCELLED_BY_MERCHANT" in decision.changes["flag_reason"]


# (status the shop had recorded when it asked, the answer, contradicted)
POLLS = [
    ("PAID", "PENDING_ORDER", True),
    ("PARTIALLY_REFUNDED", "EXPIRED", True),
    ("PAID", "PAID_PENDING_CALLBACK", False),
    ("PENDING_ORDER", "EXPIRED", False),
    ("PAID", "ON_HOLD", False),
]


@pytest.mark.parametrize(("known", "answer", "contradicted"), POLLS)
def test_a_polls_answer_below_a_payment_recorded_before_asking_is_flagged(known, answer, contradicted):
    decision = decide(current(known, payment_confirmed=True), seen(answer, known=known), NOW)
    assert decision.refused is contradicted
    assert ("checkout_flagged" in kinds(decision)) is contradicted
    if contradicted:
        assert decision.reason.startswith(f"the gateway answers {answer} for a checkout the shop had")
        assert decision.detail == f"{decision.reason}; {known} does not move back"


def test_the_same_backward_answer_without_the_question_is_not_flagged():
    """A late callback or an answer to a question sent before the payment may be stale."""
    decision = decide(current("PAID", payment_confirmed=True), seen("PENDING_ORDER", "callback"), NOW)
    assert not decision.refused and not decision.applied and kinds(decision) == []


def test_the_token_payment_url_and_expiry_are_taken_and_the_token_never_replaced():
    later = NOW + timedelta(days=1)
    decision = decide(
        current("CREATING"),
        seen("PENDING_ORDER", "create", token="t1", payment_url="u", expires_at=later),
        NOW,
    )
    assert decision.changes["token"] == "t1" and decision.changes["payment_url"] == "u"
    assert decision.changes["expires_at"] == later
    kept = decide(current(token="t1"), seen("PENDING_ORDER", token="t2"), NOW)
    assert "token" not in kept.changes


# A refund status the shop's own refunds do not account for (source not "refund").
def test_a_refund_status_asks_for_the_pending_refunds_first():
    decision = decide(current("PAID", payment_confirmed=True), seen("FULLY_REFUNDED"), NOW)
    assert decision.needs_refunds and not decision.unchanged


# (pending refunds, refunded so far, status, refunds settled, refunded after, flagged)
REFUNDS = [
    (
        (),
        0,
        "FULLY_REFUNDED",
        [Refund(1000, reason="refunded at the gateway, not through the shop (seen by poll)")],
        1000,
        False,
    ),
    ((Refund(400, 7), Refund(600, 8)), 0, "FULLY_REFUNDED", [Refund(400, 7), Refund(600, 8)], 1000, False),
    (
        (Refund(400, 7),),
        300,
        "FULLY_REFUNDED",
        [Refund(700, reason="refunded at the gateway, not through the shop (seen by poll)")],
        1000,
        False,
    ),
    ((), 1000, "FULLY_REFUNDED", [], None, False),
    ((Refund(250, 9),), 0, "PARTIALLY_REFUNDED", [Refund(250, 9)], 250, False),
    ((), 0, "PARTIALLY_REFUNDED", [], None, True),
    ((Refund(100, 1), Refund(200, 2)), 0, "PARTIALLY_REFUNDED", [], None, True),
    ((), 300, "PARTIALLY_REFUNDED", [], None, False),  # the amount was recorded: nothing to settle
]


@pytest.mark.parametrize(("pending", "refunded", "status", "settled", "after", "flagged"), REFUNDS)
def test_a_refund_status_seen_at_the_gateway(pending, refunded, status, settled, after, flagged):
    was = current("PAID", payment_confirmed=True, refunded_cents=refunded, pending_refunds=pending)
    decision = decide(was, seen(status, reported_at=EARLIER), NOW)
    assert decision.applied and list(decision.refunds) == settled
    assert decision.changes.get("refunded_cents") == after
    assert [n.refund for n in decision.notices if n.kind == "refund_succeeded"] == settled
    assert decision.refunds_at == (EARLIER if settled else None)
    assert ("checkout_flagged" in kinds(decision)) is flagged


def test_the_shops_own_refund_records_nothing_more():
    decision = decide(current("PAID", payment_confirmed=True), seen("PARTIALLY_REFUNDED", "refund"), NOW)
    assert decision.applied and not decision.needs_refunds and kinds(decision) == []


def test_a_refund_status_before_the_payment_was_known_is_never_confirmed_and_flagged():
    decision = decide(current(pending_refunds=()), seen("FULLY_REFUNDED", paid_at=EARLIER), NOW)
    assert decision.applied
    assert "payment_confirmed_at" not in decision.changes and "payment_confirmed" not in kinds(decision)
    assert decision.changes["paid_at"] == EARLIER and decision.changes["paid_cents"] == 1000
    assert kinds(decision) == ["checkout_flagged", "refund_succeeded"]
    assert "before the shop knew of the payment" in decision.changes["flag_reason"]


def test_a_second_partial_refund_is_a_change_of_the_amount_alone():
    was = current("PARTIALLY_REFUNDED", payment_confirmed=True, refunded_cents=100)
    decision = decide(was, seen("PARTIALLY_REFUNDED", "refund", refunded_cents=300), NOW)
    assert decision.applied and decision.after == "PARTIALLY_REFUNDED"
    assert decision.changes == {"refunded_cents": 300, "updated_at": NOW}
    assert decision.reason == "refunded 300 cents in all"
    smaller = decide(was, seen("PARTIALLY_REFUNDED", "refund", refunded_cents=50), NOW)
    assert not smaller.applied and "refunded_cents" not in smaller.changes


# The batch's case: what changes nothing but the event (and the answer's expiry).
UNCHANGED = [
    (current(), seen("PENDING_ORDER"), True),
    (current(), seen("PENDING_ORDER", expires_at=NOW), True),
    (current(), seen("PENDING_ORDER", known="PENDING_ORDER"), True),
    (current(token="t"), seen("PENDING_ORDER", token="t"), True),
    (current(), seen("PENDING_ORDER", token="t"), False),
    (current(payment_url="u"), seen("PENDING_ORDER", payment_url="v"), False),
    (current("PAID", payment_confirmed=True), seen("PAID", total_cents=1), False),
    (current(), seen("PENDING_ORDER", merchant_account_id="other"), False),
    (
        current("PARTIALLY_REFUNDED", refunded_cents=100),
        seen("PARTIALLY_REFUNDED", refunded_cents=200),
        False,
    ),
    (current(), seen("PENDING_PAYMENT"), False),
    (current("PAID"), seen("PENDING_ORDER"), True),  # recorded as apply would: "PAID does not move back"
    (current("PAID", payment_confirmed=True), seen("PENDING_ORDER", known="PAID"), False),  # contradicted
]


@pytest.mark.parametrize(("was", "observation", "expected"), UNCHANGED)
def test_what_changes_nothing(was, observation, expected):
    decision = decide(was, observation, NOW)
    assert decision.unchanged is expected
    if expected:
        assert not decision.notices and not decision.changes.keys() - {"expires_at"}
        assert decision.detail == (
            NO_CHANGE if was.status == observation.status else "PAID does not move back"
        )


def test_every_known_status_has_a_rank_and_the_open_ones_share_one():
    assert {RANK["PENDING_ORDER"], RANK["PENDING_PAYMENT"], RANK["CANCELLED_BY_CONSUMER"]} == {1}
    assert RANK["CREATING"] < RANK["PENDING_ORDER"] < RANK["EXPIRED"] < RANK["PAID"]
    assert RANK["PAID"] < RANK["PARTIALLY_REFUNDED"] < RANK["FULLY_REFUNDED"]
