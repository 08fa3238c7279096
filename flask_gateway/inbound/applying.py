"""A verified, found (and, when it would change the checkout, confirmed) callback applied: the observation
made of it, ``transitions.apply`` under the row lock, the log row's outcome in the same transaction, and
the signals after the commit (:func:`_process`).

Imports :mod:`flask_gateway.inbound.claims` and :mod:`flask_gateway.inbound.intake`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Final

from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import CheckoutStatus as S
from flask_gateway.core.wire import CheckoutStatusPayload
from flask_gateway.inbound.claims import _confirm, _Found
from flask_gateway.inbound.intake import _noted, _send_rejected
from flask_gateway.models import CallbackLog, CallbackOutcome, GatewayCheckout
from flask_gateway.payments.transitions import (
    Observation,
    Transition,
    apply,
    send_pending,
    would_apply,
)
from flask_gateway.state import get_state

__all__ = ["CallbackResult"]

_log = logging.getLogger("flask_gateway.inbound")  # not __name__: the name is an interface (docs/logging.md)


#: The statuses a callback may apply: a payment (the spec: accept payment only for these two) and the
#: consumer's cancellation (sent when the account manager enabled it).
_APPLIED_FROM_CALLBACK: Final = frozenset(
    {S.PAID.value, S.PAID_PENDING_CALLBACK.value, S.CANCELLED_BY_CONSUMER.value}
)
#: Applied from a callback only once getstatus confirmed them (the gateway's answer is then applied).
_APPLIED_WHEN_CONFIRMED: Final = frozenset({S.PARTIALLY_REFUNDED.value, S.FULLY_REFUNDED.value})


@dataclass(frozen=True)
class CallbackResult:
    """A callback that was acknowledged (HTTP 200); refusals raise a ``CallbackRejected`` instead."""

    outcome: CallbackOutcome
    log: CallbackLog
    checkout: GatewayCheckout
    transition: Transition


def _recorded_status(status: str) -> str:
    """What the shop records for a payment callback it is about to acknowledge with 200.

    The gateway turns ``PAID_PENDING_CALLBACK`` into ``PAID`` when the merchant answers its callback with
    200 (docs/decisions.md), and this answer is that 200: the shop records ``PAID`` at once, so the shop
    and the gateway say the same. Should the answer be lost, the gateway sends the callback again, which
    finds the payment already recorded.
    """
    return S.PAID.value if status == S.PAID_PENDING_CALLBACK else status


def _process(
    log: CallbackLog,
    payload: CheckoutStatusPayload,
    checkout_found: _Found,
    account: str,
    signing_key: str,
    client: str | None,
) -> CallbackResult:
    state = get_state()
    session = state.session
    status = str(payload.checkoutPaymentStatus)
    confirming = state.config.confirm_callbacks
    acted_on = status in _APPLIED_FROM_CALLBACK or (confirming and status in _APPLIED_WHEN_CONFIRMED)
    found, before = checkout_found.id, checkout_found.status
    unconfirmed: str | None = None
    truth: CheckoutStatusPayload | None = payload
    if acted_on and confirming and would_apply(before, status):
        truth, unconfirmed = _confirm(log, checkout_found, payload, account, signing_key, client)
    if not acted_on:
        # A status the shop does not act on is recorded as an observation of the status we have: the
        # account is still checked and the timeline shows the callback, but nothing moves.
        observation = Observation(
            status=before,
            source="callback",
            merchant_account_id=account,
            detail=f"callback #{log.id}: {status} (not acted on from a callback)",
        )
    elif truth is None:  # the gateway has no such checkout for us: nothing is applied
        observation = Observation(
            status=before, source="callback", detail=f"callback #{log.id}: {status} NOT CONFIRMED"
        )
    else:
        # Agreed (the same status, or both payment statuses): the claim's status; else the gateway's.
        answered = str(truth.checkoutPaymentStatus)
        told = _recorded_status(status) if unconfirmed is None else answered
        # What happened, in the timeline's words: what the callback reported, and what was recorded when
        # that differs (the awaited callback's PAID_PENDING_CALLBACK is recorded PAID: our 200 makes it so).
        recorded = "" if told == status else f", recorded as {told}"
        if truth is payload:
            note = f"callback #{log.id} reported {status}{recorded}"
        elif unconfirmed is None:
            confirmed = f"confirmed by getstatus ({truth.checkoutPaymentStatus})"
            note = f"callback #{log.id} reported {status}, {confirmed}{recorded}"
        else:
            note = f"callback #{log.id}: {status} NOT CONFIRMED ({unconfirmed}); applied what getstatus says"
        observation = Observation(
            status=told,
            source="callback",
            total_cents=truth.checkoutTotalCents,
            merchant_account_id=account,
            paid_at=truth.paidAt,
            reported_at=truth.updatedAt,
            detail=note,
        )
    transition = apply(session, found, observation, commit=False)
    checkout = transition.checkout
    checkout.last_callback_at = utcnow()
    if transition.flagged:
        outcome, detail = CallbackOutcome.MISMATCH, f"flagged, not applied: {transition.reason}"
    elif unconfirmed is not None:
        outcome, detail = CallbackOutcome.UNCONFIRMED, f"not confirmed: {unconfirmed}"
    elif not acted_on:
        outcome, detail = CallbackOutcome.IGNORED, f"status {status} is not acted on from a callback"
    elif transition.applied:
        outcome, detail = CallbackOutcome.ACCEPTED, f"{transition.before} -> {transition.after}"
    elif transition.before == observation.status or transition.before == status:
        outcome, detail = CallbackOutcome.DUPLICATE, f"already {transition.before}"
    else:
        outcome, detail = CallbackOutcome.IGNORED, f"{status} not applied: {transition.reason}"
    log.checkout_id = checkout.id
    log.outcome = outcome.value
    log.http_status = 200
    log.detail = _noted(log, detail)
    log_id, checkout_id = log.id, checkout.id
    commit_keeping_loaded(session)
    send_pending(transition)
    if outcome is CallbackOutcome.MISMATCH:
        _log.warning("Callback %s for checkout %s flagged: %s", log_id, checkout_id, transition.reason)
        _send_rejected(checkout, transition.reason, log)
    elif outcome is CallbackOutcome.UNCONFIRMED:
        _log.warning("Callback %s for checkout %s not confirmed: %s", log_id, checkout_id, unconfirmed)
        _send_rejected(checkout, f"not confirmed by getstatus: {unconfirmed}", log)
    return CallbackResult(outcome=outcome, log=log, checkout=checkout, transition=transition)
