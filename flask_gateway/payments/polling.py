"""Asking the gateway (getstatus) and applying its answer through the state machine.

The answer's observation carries the status the shop had recorded when it asked (``Observation.known``):
an answer below a payment recorded before the question contradicts it, and the rules
(``payments.decision``) flag the checkout; any other backward move may be a stale answer, not flagged.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import GatewayCheckout
from flask_gateway.payments.transitions import (
    Observation,
    Transition,
    Unchanged,
    apply,
    apply_unchanged,
    lock,
    send_pending,
)
from flask_gateway.state import get_state, leaves_no_transaction

if TYPE_CHECKING:
    from flask_gateway.core.wire import CheckoutStatusPayload

__all__ = ["Polled", "record_answer", "record_unchanged_answers", "refresh"]


@leaves_no_transaction
def refresh(checkout: GatewayCheckout, *, source: str = "poll") -> Transition:
    """getstatus for a v2 checkout, applied as an observation of ``source`` (poll, return, reconcile, admin).

    Raises ``flask_gateway.core.errors.GatewayError`` when the gateway cannot be asked; nothing changes then.
    """
    if checkout.api_version != "v2" or not checkout.token:
        raise ValueError("only a v2 checkout that the gateway created can be polled")
    state = get_state()
    checkout_id, token, known = checkout.id, checkout.token, checkout.status
    client = state.client(account=checkout.merchant_account_id)
    # End the transaction before waiting on the network: on SQLite every transaction holds the write lock
    # (BEGIN IMMEDIATE), which would stall callbacks for the whole call. Like every operation of the
    # extension this commits the app's session; the lock below starts a fresh transaction.
    state.session.commit()
    return _apply_answer(client.get_status(token).data, checkout_id, known, source).transition


@dataclass(frozen=True)
class Polled:
    """What ``record_answer`` did: the transition, and the checkout as the answer found it (row-locked)."""

    transition: Transition
    refunded_before: int
    flagged_before: bool


def _apply_answer(payload: CheckoutStatusPayload, checkout_id: int, known: str, source: str) -> Polled:
    polled = record_answer(payload, checkout_id, known, source)
    commit_keeping_loaded(get_state().session)
    send_pending(polled.transition)
    return polled


def record_answer(payload: CheckoutStatusPayload, checkout_id: int, known: str, source: str) -> Polled:
    """Apply a getstatus answer for checkout ``checkout_id`` (``known``: its status as the shop recorded it
    before the question was sent) in the current transaction, without committing: the caller commits
    (its events are in the outbox with the change) and then sends them (``transitions.send_pending``).
    Reconciliation applies the answers its threads gathered this way, several per transaction."""
    session = get_state().session
    locked = lock(session, checkout_id)  # apply() reuses this lock (and row) in the same transaction
    refunded_before, flagged_before = locked.refunded_cents, locked.flagged
    transition = apply(session, checkout_id, _observation(payload, known, source), commit=False)
    transition.checkout.last_polled_at = utcnow()
    return Polled(transition, refunded_before, flagged_before)


def record_unchanged_answers(
    answers: Sequence[tuple[int, str, CheckoutStatusPayload]],
    source: str,
    *,
    unless: Callable[[Unchanged], bool] | None = None,
) -> dict[int, Unchanged]:
    """``record_answer`` of the answers that change nothing, several at once, in the current transaction
    (``transitions.apply_unchanged``: a few statements for all of them, whatever their number).

    ``answers``: (checkout id, its status as the shop recorded it before the question was sent, the
    answer). Taken here: an answer naming that status, which the row still has, and nothing else
    ``apply`` would record (see ``apply_unchanged``); for each, what ``record_answer`` writes: the event
    ("getstatus: STATUS; no change"), the answer's ``expiresAt``, and ``last_polled_at``. No signal, no
    flag (an answer naming the known status contradicts nothing). ``unless``: see ``apply_unchanged``.
    Returns the checkouts recorded; the caller passes the other answers to ``record_answer``.
    """
    twice = Counter(checkout_id for checkout_id, _known, _payload in answers)
    observations = {
        checkout_id: _observation(payload, known, source)
        for checkout_id, known, payload in answers
        if str(payload.checkoutPaymentStatus) == known and twice[checkout_id] == 1
    }
    return apply_unchanged(
        get_state().session, observations, stamp={"last_polled_at": utcnow()}, unless=unless
    )


def _observation(payload: CheckoutStatusPayload, known: str, source: str) -> Observation:
    """The observation of a getstatus answer asked while the shop had recorded ``known``."""
    status = str(payload.checkoutPaymentStatus)
    return Observation(
        status=status,
        source=source,
        total_cents=payload.checkoutTotalCents,
        paid_at=payload.paidAt,
        expires_at=payload.expiresAt,
        reported_at=payload.updatedAt,
        known=known,
        detail=f"getstatus: {status}",
    )
