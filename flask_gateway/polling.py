"""Asking the gateway (getstatus) and applying its answer through the state machine."""

from __future__ import annotations

from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import GatewayCheckout
from flask_gateway.state import get_state, leaves_no_transaction
from flask_gateway.transitions import Observation, Transition, apply, send_pending

__all__ = ["refresh"]


@leaves_no_transaction
def refresh(checkout: GatewayCheckout, *, source: str = "poll") -> Transition:
    """getstatus for a v2 checkout, applied as an observation of ``source`` (poll, return, reconcile, admin).

    Raises ``flask_gateway.core.errors.GatewayError`` when the gateway cannot be asked; nothing changes then.
    """
    if checkout.api_version != "v2" or not checkout.token:
        raise ValueError("only a v2 checkout that the gateway created can be polled")
    state = get_state()
    checkout_id, token = checkout.id, checkout.token
    client = state.client()
    # End the transaction before waiting on the network: on SQLite every transaction holds the write lock
    # (BEGIN IMMEDIATE), which would stall callbacks for the whole call. Like every operation of the
    # extension this commits the app's session; the lock below starts a fresh transaction.
    state.session.commit()
    payload = client.get_status(token).data
    observed = Observation(
        status=str(payload.checkoutPaymentStatus),
        source=source,
        total_cents=payload.checkoutTotalCents,
        paid_at=payload.paidAt,
        expires_at=payload.expiresAt,
        reported_at=payload.updatedAt,
        detail=f"getstatus: {payload.checkoutPaymentStatus}",
    )
    transition = apply(state.session, checkout_id, observed, commit=False)
    transition.checkout.last_polled_at = utcnow()
    commit_keeping_loaded(state.session)
    send_pending(transition)
    return transition
