"""Applying the gateway's answers: each through the state machine, several per transaction.

The gateway reports ``EXPIRED`` once ``expiresAt`` passed; should it still answer ``PENDING_ORDER`` for a
checkout past its ``expiresAt`` (more than a minute, for clock skew), the checkout is marked ``EXPIRED``
here (DESIGN §3). A payment reported later still moves it on (and flags it for review). What a poll of a
paid checkout learns is recorded by ``transitions.apply`` and ``polling.record_answer``.

Most answers of a run change nothing (the shopper has not paid yet): those of a batch are recorded
together first (``polling.record_unchanged_answers``: the rows locked in one ``SELECT``, one ``UPDATE``, one
``INSERT`` of their events, what the state machine writes for each), the others one by one through the
state machine (their events, signals and outbox rows as always).

Imports ``claiming`` and ``report`` of the package.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import suppress
from datetime import timedelta
from typing import Final

from flask_gateway.core.outages import is_database_outage
from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import PAID_STATUSES, PAYMENT_STATUSES, CheckoutStatusPayload
from flask_gateway.core.wire import CheckoutStatus as S
from flask_gateway.operations.reconciliation.claiming import _Claimed
from flask_gateway.operations.reconciliation.report import ReconcileError, _NotAsked, _Outcome
from flask_gateway.payments.polling import record_answer, record_unchanged_answers
from flask_gateway.payments.transitions import Observation, Transition, Unchanged, apply, send_pending
from flask_gateway.state import get_state

log = logging.getLogger("flask_gateway.reconciliation")

#: Past ``expiresAt`` by more than this while the gateway still says ``PENDING_ORDER``: expired.
EXPIRY_GRACE: Final = timedelta(minutes=1)

#: What a polling thread hands back: the claimed checkout, and the gateway's answer or why none came.
_Answer = tuple[_Claimed, CheckoutStatusPayload | BaseException]


def _failed(claimed: _Claimed, error: BaseException) -> _Outcome:
    if isinstance(error, _NotAsked):  # the account's problem is logged once, by the run
        log.debug("reconcile: checkout #%s not asked: %s", claimed.id, error)
    else:
        log.warning("reconcile: checkout #%s failed: %s", claimed.id, error, exc_info=True)
    return _Outcome(
        paid=claimed.paid,
        account=claimed.account,
        error=ReconcileError(
            checkout_id=claimed.id, token=claimed.token, message=str(error), account=claimed.account
        ),
    )


def _apply_answer(claimed: _Claimed, payload: CheckoutStatusPayload) -> tuple[_Outcome, list[Transition]]:
    """Apply the gateway's answer about ``claimed`` in the current transaction (not committed); what it
    did, and the transitions whose events are sent once the caller committed."""
    session = get_state().session
    polled = record_answer(payload, claimed.id, claimed.status, "reconcile")
    transition = polled.transition
    transitions = [transition]
    checkout = transition.checkout
    changed, confirmed, expired = transition.applied, False, 0
    if not claimed.paid:
        if transition.applied:
            confirmed = transition.after in PAYMENT_STATUSES and transition.before not in PAID_STATUSES
            expired += transition.after == S.EXPIRED
        if (
            checkout.status == S.PENDING_ORDER
            and checkout.expires_at is not None
            and checkout.expires_at < utcnow() - EXPIRY_GRACE
        ):
            expiry = apply(
                session,
                claimed.id,
                Observation(
                    status=S.EXPIRED.value,
                    source="reconcile",
                    detail=f"the gateway still says PENDING_ORDER past expiresAt "
                    f"{checkout.expires_at.isoformat()}: treated as expired",
                ),
                commit=False,
            )
            transitions.append(expiry)
            if expiry.applied:
                expired += 1
                changed = True
            checkout = expiry.checkout
    outcome = _Outcome(
        paid=claimed.paid,
        account=claimed.account,
        status=checkout.status,
        changed=changed,
        confirmed=confirmed,
        expired=expired,
        refunded_cents=max(0, checkout.refunded_cents - polled.refunded_before),
        flagged=checkout.flagged and not polled.flagged_before,
    )
    return outcome, transitions


def _expires_now(row: Unchanged) -> bool:
    """An unchanged ``PENDING_ORDER`` past its ``expiresAt`` (and the grace): ``_apply_answer`` expires it."""
    return (
        row.status == S.PENDING_ORDER
        and row.expires_at is not None
        and row.expires_at < utcnow() - EXPIRY_GRACE
    )


def _write(
    batch: list[_Answer], claim: Callable[[], list[_Claimed]] | None
) -> tuple[list[_Outcome], list[_Claimed]]:
    """Apply the answers of ``batch`` and make the ``claim`` in one transaction, then send the answers'
    events; what the answers did, and the checkouts claimed.

    Should one answer fail to apply (or the commit fail), the transaction is rolled back, each answer is
    applied again in a transaction of its own, so that only the failing checkout fails (nothing is asked
    again: the answers are in hand), and the claim is made in a transaction of its own: a claim that fails
    on its own ends the run, as it always did.
    """
    session = get_state().session
    failed = [_failed(claimed, answer) for claimed, answer in batch if isinstance(answer, BaseException)]
    answered = [(claimed, answer) for claimed, answer in batch if not isinstance(answer, BaseException)]
    outcomes: list[_Outcome] = []
    transitions: list[Transition] = []
    fresh: list[_Claimed] = []
    try:
        # One flush for the batch, at the commit (the checkouts' updates and new events sent together),
        # not one before each checkout's row lock: the answers are about different checkouts, and nothing
        # one of them does reads what another changed.
        with session.no_autoflush:
            # The answers that change nothing (most of a run's: the shopper has not paid yet) first, all
            # in a few statements; the others one by one through the state machine.
            unchanged = (
                record_unchanged_answers(
                    [(claimed.id, claimed.status, answer) for claimed, answer in answered],
                    "reconcile",
                    unless=_expires_now,
                )
                if answered
                else {}
            )
            for claimed, answer in answered:
                found = unchanged.get(claimed.id)
                if found is not None:
                    outcomes.append(_Outcome(paid=claimed.paid, account=claimed.account, status=found.status))
                    continue
                outcome, applied = _apply_answer(claimed, answer)
                outcomes.append(outcome)
                transitions.extend(applied)
        if claim is not None:
            fresh = claim()
        commit_keeping_loaded(session)
    except Exception as error:
        if is_database_outage(error):
            # The database is away: applying each answer alone would fail the same way, one traceback a
            # checkout. The run stops (the CLI says so in one line); the claimed checkouts are due again
            # after the lease, and the next run asks about them again.
            with suppress(Exception):  # the rollback of a dead connection fails too
                session.rollback()
            raise
        session.rollback()
        if not answered:
            raise
        if len(answered) == 1 and claim is None:
            return [*failed, _failed(answered[0][0], error)], []
        alone = [outcome for item in answered for outcome in _write([item], None)[0]]
        return failed + alone, _write([], claim)[1] if claim is not None else []
    for transition in transitions:
        send_pending(transition)
    return failed + outcomes, fresh
