"""A stateful property test of the merchant-side state machine against the in-process gateway emulator.

Hypothesis drives one order through any interleaving of what can happen to it: the consumer pays or
cancels, time passes beyond the expiry (the emulator's clock), the gateway delivers its callbacks, an old
callback is replayed or arrives out of order (the gateway's own signed bytes, re-sent later), the shop
polls (``refresh``) or a shopper comes back on the return page (getstatus), the owner cancels or refunds
(part or all) from the admin actions. After every step:

- at most one fulfilment: ``payment_confirmed`` fired at most once for the order;
- the local status never moves backwards (``decision.RANK``; within a rank only the allowed moves);
- refunded total (local, and the succeeded refund records) never above the paid total, nor above what
  the gateway refunded;
- the local status equals the gateway's or lags behind it, never contradicts it: never a higher rank
  than the gateway's, paid only when the gateway has the payment, cancelled by the merchant or expired
  only when the gateway says so.

SQLite only (the PostgreSQL locking paths have their own tests); 50 examples of up to 25 steps.
"""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from flask_gateway import (
    CheckoutStateError,
    RefundDeclinedError,
    RefundNotAllowedError,
    cancel_checkout,
    refund,
    signals,
)
from flask_gateway.core.errors import GatewayError
from flask_gateway.core.signing import sign
from flask_gateway.core.wire import PAID_STATUSES
from flask_gateway.models import CallbackLog, GatewayCheckout, RefundState
from flask_gateway.payments.decision import RANK, SAME_RANK_MOVES
from flask_gateway.payments.polling import refresh
from flask_gateway.state import get_state
from tests.conftest import Databases, dispose_engines
from tests.extension.conftest import ACCOUNT, Harness, build_harness
from tests.extension.inbound.inbound_support import create_v2_checkout, return_path

TOTAL = 79800
CHECKOUT_LIFETIME = 3600  # the emulator's default expiry: now + 60 minutes


REFUNDABLE = frozenset({"PAID", "PAID_PENDING_CALLBACK", "PARTIALLY_REFUNDED"})
#: Every local status any example reached (the run must have explored the interesting ones).
REACHED: set[str] = set()


def _forward_or_same(before: str, after: str) -> bool:
    if before == after:
        return True
    old, new = RANK.get(before), RANK.get(after)
    assert old is not None and new is not None, (before, after)
    return new > old or (before, after) in SAME_RANK_MOVES


class CheckoutLife(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = Path(tempfile.mkdtemp(prefix="state-machine-"))
        self.monkeypatch = pytest.MonkeyPatch()
        self.h: Harness = build_harness(Databases("sqlite", self.directory, None), self.monkeypatch)
        self.h.install()
        self.confirmed: list[int] = []
        signals.payment_confirmed.connect(self._confirmed)
        self.checkout_id, self.token = create_v2_checkout(self.h, "ORD-SM", TOTAL)
        self.statuses = [self.local()["status"]]

    def _confirmed(self, sender: Any, checkout: GatewayCheckout, **kwargs: Any) -> None:
        self.confirmed.append(checkout.id)

    def teardown(self) -> None:
        signals.payment_confirmed.disconnect(self._confirmed)
        with self.h.shop.app_context():
            self.h.db.engine.dispose()
        self.monkeypatch.undo()
        dispose_engines()

    # --- reading both sides --------------------------------------------------------------------------

    def local(self) -> dict[str, Any]:
        with self.h.shop.app_context():
            row = get_state().session.get(GatewayCheckout, self.checkout_id)
            assert row is not None
            return {
                "status": row.status,
                "paid_cents": row.paid_cents,
                "refunded_cents": row.refunded_cents,
                "refunds": sum(r.amount_cents for r in row.refunds if r.state == RefundState.SUCCEEDED),
                "flagged": row.flagged,
            }

    def gateway(self) -> dict[str, Any]:
        response = self.h.emulator.control(f"checkouts/{self.token}", method="GET")
        assert response.status_code == 200
        body = response.json
        assert isinstance(body, dict)
        return {"status": body["status"]["checkoutPaymentStatus"], "refunded_cents": body["refundedCents"]}

    # --- the consumer, the clock and the gateway ------------------------------------------------------

    @rule()
    def consumer_pays(self) -> None:
        self.h.emulator.pay(self.token)  # refused (4xx) when the checkout is not payable

    @rule()
    def consumer_pays_and_the_callback_arrives(self) -> None:
        """The common path as one step (so more examples get past the payment to the refunds)."""
        if self.h.emulator.pay(self.token).status_code == 200:
            assert self.h.emulator.control("deliver").status_code == 200

    @rule()
    def consumer_cancels(self) -> None:
        self.h.emulator.consumer_cancel(self.token)

    @rule(seconds=st.sampled_from([60, CHECKOUT_LIFETIME + 1]))
    def time_passes(self, seconds: int) -> None:
        self.h.emulator.advance(seconds)

    @rule()
    def gateway_delivers_callbacks(self) -> None:
        assert self.h.emulator.control("deliver").status_code == 200

    @precondition(lambda self: self._delivered())
    @rule(data=st.data())
    def old_callback_replayed(self, data: st.DataObject) -> None:
        """One of the gateway's earlier callbacks, byte for byte, arrives again (late, out of order)."""
        body = data.draw(st.sampled_from(self._delivered()), label="callback")
        with self.h.shop.app_context():
            state = get_state()
            key = state.box.decrypt(state.require_installation().signing_key_encrypted)
        headers = {"X-Merchant-Account-ID": ACCOUNT, "X-Signature": sign(body, key)}
        response = self.h.client.post("/gateway/callback", data=body, headers=headers)
        assert response.status_code == 200, response.get_data(as_text=True)

    def _delivered(self) -> list[bytes]:
        with self.h.shop.app_context():
            rows = get_state().session.query(CallbackLog).filter(CallbackLog.verified.is_(True)).all()
            return [row.body.encode() for row in rows]

    # --- the shop ---------------------------------------------------------------------------------------

    @rule()
    def shop_polls(self) -> None:
        with self.h.shop.app_context():
            checkout = get_state().session.get_one(GatewayCheckout, self.checkout_id)
            with contextlib.suppress(GatewayError):  # the gateway could not be asked: nothing changes
                refresh(checkout)

    @rule(kind=st.sampled_from(["confirm", "cancel"]))
    def shopper_returns(self, kind: str) -> None:
        response = self.h.client.get(return_path(self.h, self.checkout_id, kind))  # type: ignore[arg-type]
        assert response.status_code in (200, 303)

    @rule()
    def owner_cancels(self) -> None:
        with self.h.shop.test_request_context():
            checkout = get_state().session.get_one(GatewayCheckout, self.checkout_id)
            try:
                cancel_checkout(checkout, "admin")
            except (CheckoutStateError, GatewayError):
                get_state().session.rollback()

    @precondition(lambda self: self.statuses[-1] in REFUNDABLE)
    @rule(
        amount=st.one_of(
            st.sampled_from([100, TOTAL // 2, TOTAL - 1, TOTAL]),
            st.integers(1, TOTAL),
            st.integers(TOTAL + 1, 2 * TOTAL),
        )
    )
    def owner_refunds(self, amount: int) -> None:
        with self.h.shop.test_request_context():
            checkout = get_state().session.get_one(GatewayCheckout, self.checkout_id)
            try:
                refund(checkout, amount, "state machine")
            except (RefundNotAllowedError, RefundDeclinedError, GatewayError):
                get_state().session.rollback()

    @precondition(lambda self: self.statuses[-1] in REFUNDABLE)
    @rule()
    def owner_refunds_the_rest(self) -> None:
        local = self.local()
        self.owner_refunds(local["paid_cents"] - local["refunded_cents"])

    # --- invariants ---------------------------------------------------------------------------------------

    @invariant()
    def at_most_one_fulfilment(self) -> None:
        assert len(self.confirmed) <= 1, self.confirmed

    @invariant()
    def never_backwards(self) -> None:
        now = self.local()["status"]
        before = self.statuses[-1]
        assert _forward_or_same(before, now), f"{before} -> {now}"
        self.statuses.append(now)
        REACHED.add(now)

    @invariant()
    def refunds_within_the_payment(self) -> None:
        local = self.local()
        assert local["refunded_cents"] == local["refunds"]
        assert 0 <= local["refunded_cents"] <= local["paid_cents"] <= TOTAL
        assert local["refunded_cents"] <= self.gateway()["refunded_cents"]

    @invariant()
    def local_lags_but_never_contradicts_the_gateway(self) -> None:
        local, gateway = self.local(), self.gateway()
        ours, theirs = local["status"], gateway["status"]
        assert not local["flagged"], "a genuine flow must never be flagged"
        assert RANK[ours] <= RANK[theirs] or ours == "CREATING", (ours, theirs)
        if ours in PAID_STATUSES or ours in ("PARTIALLY_REFUNDED", "FULLY_REFUNDED"):
            assert theirs in PAID_STATUSES or theirs in ("PARTIALLY_REFUNDED", "FULLY_REFUNDED"), (
                ours,
                theirs,
            )
            assert len(self.confirmed) == 1
        if ours in ("CANCELLED_BY_MERCHANT", "EXPIRED", "FULLY_REFUNDED"):
            assert theirs == ours, (ours, theirs)
        if ours not in PAID_STATUSES and ours not in ("PARTIALLY_REFUNDED", "FULLY_REFUNDED"):
            assert not self.confirmed


def test_the_checkout_state_machine_holds_its_invariants() -> None:
    REACHED.clear()
    run_state_machine_as_test(
        CheckoutLife,
        settings=settings(
            max_examples=50,
            stateful_step_count=25,
            deadline=None,
            database=None,
            derandomize=True,  # the same examples every run: the coverage check below is stable
            suppress_health_check=list(HealthCheck),
        ),
    )
    # The examples went everywhere: paid, refunded in part and in full, both cancellations, expired.
    wanted = {
        "PENDING_ORDER",
        "PAID_PENDING_CALLBACK",
        "PARTIALLY_REFUNDED",
        "FULLY_REFUNDED",
        "CANCELLED_BY_MERCHANT",
        "CANCELLED_BY_CONSUMER",
        "EXPIRED",
    }
    assert wanted <= REACHED, REACHED
