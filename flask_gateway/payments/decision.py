"""The state machine's rules: what one observation of a checkout does to it, as a pure function.

:func:`decide` takes the checkout as the shop has it (:class:`Current`), what a source says
(:class:`Observation`) and the time, and answers a :class:`Decision`: the columns that change, the event's
detail, the outbox notices in the order they are queued, the refunds settled. No database, no session,
no clock: ``transitions.apply`` reads the row under its lock, asks, and writes the answer. The rules
(docs/architecture.md, "The state machine"):

- forward only (:data:`RANK`); among the open statuses any move; a status this version does not know is
  recorded, never applied;
- an observation of another account, or of another total for a paid status, is refused and flags the
  checkout;
- only ``PAID`` and ``PAID_PENDING_CALLBACK`` confirm a payment, once; a payment after the shop closed the
  checkout is kept and flagged;
- a refund status the shop's own refunds do not account for is recorded (a pending refund settled, or a
  refund made at the gateway) or flagged; a refund status before the shop knew of the payment is flagged;
- a poll's answer below a payment the shop had recorded when it asked contradicts it: flagged.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Final

from flask_gateway.core.wire import OPEN_STATUSES, PAID_STATUSES, PAYMENT_STATUSES, CheckoutStatus

__all__ = [
    "NO_CHANGE",
    "RANK",
    "SAME_RANK_MOVES",
    "Current",
    "Decision",
    "Notice",
    "Observation",
    "Refund",
    "decide",
    "moves",
    "rank",
]

S = CheckoutStatus
#: The merchant side's own statuses (``models.LocalStatus``), by value: this module reads no model.
_CREATING: Final = "CREATING"
_FAILED: Final = "FAILED"

#: Progress order. A move to a higher rank is forward; within a rank only the listed moves are allowed.
RANK: Final[dict[str, int]] = {
    _CREATING: 0,
    S.PENDING_ORDER: 1,
    S.PENDING_PAYMENT: 1,
    S.CANCELLED_BY_CONSUMER: 1,
    S.CANCELLED_BY_MERCHANT: 2,
    S.EXPIRED: 2,
    _FAILED: 2,
    S.PAID_PENDING_CALLBACK: 3,
    S.PAID: 3,
    S.PARTIALLY_REFUNDED: 4,
    S.FULLY_REFUNDED: 5,
}
#: The moves allowed within one rank.
SAME_RANK_MOVES: Final = {
    # Among the open statuses every move is allowed: the consumer starts paying (PENDING_PAYMENT),
    # cancels, and an update reopens a consumer-cancelled checkout; polls may see any of them in any order.
    *((before.value, after.value) for before in OPEN_STATUSES for after in OPEN_STATUSES if before != after),
    (S.PAID_PENDING_CALLBACK.value, S.PAID.value),
}
_REFUNDED: Final = frozenset({S.PARTIALLY_REFUNDED.value, S.FULLY_REFUNDED.value})
_CLOSED_RANK: Final = RANK[S.CANCELLED_BY_MERCHANT]
_PAID_RANK: Final = RANK[S.PAID]

#: The event detail of an observation of the status the checkout already has.
NO_CHANGE: Final = "no change"


def rank(status: str) -> int | None:
    """The status's place in the progress order; None for a status this version does not know."""
    return RANK.get(status)


def moves(before: str, after: str) -> bool:
    """Whether a checkout in ``before`` moves to ``after`` (forward only)."""
    if before == after:
        return False
    old, new = rank(before), rank(after)
    if new is None:  # a status this version does not know: recorded, never applied
        return False
    if old is None:
        return True
    if new > old:
        return before != _FAILED
    return new == old and (before, after) in SAME_RANK_MOVES


@dataclass(frozen=True)
class Observation:
    """What one source says about a checkout."""

    status: str
    #: callback, return, v1, poll, reconcile, admin, create, update, cancel, refund
    source: str
    #: The checkout total the source reports (checked against ours before a payment is accepted).
    total_cents: int | None = None
    merchant_account_id: str | None = None
    paid_at: datetime | None = None
    #: The token the source reports; set on the record when it has none yet (create).
    token: str | None = None
    expires_at: datetime | None = None
    payment_url: str | None = None
    refunded_cents: int | None = None
    #: When the source says the status last changed (getstatus ``updatedAt``): the time of a refund seen.
    reported_at: datetime | None = None
    #: A poll's: the status the shop had recorded when it asked (an answer below a payment contradicts it).
    known: str | None = None
    detail: str = ""


@dataclass(frozen=True)
class Refund:
    """A refund a refund status settles: one of the shop's pending refunds (``id``), or one made at the
    gateway that the shop has no record of (``id`` None: recorded now, with ``reason``)."""

    amount_cents: int
    id: int | None = None
    reason: str = ""


@dataclass(frozen=True)
class Current:
    """The checkout as the shop has it, as far as the rules read it.

    ``pending_refunds`` None: not read (only a refund status needs them; :attr:`Decision.needs_refunds`
    asks for them)."""

    status: str
    merchant_account_id: str
    total_cents: int
    token: str | None = None
    payment_url: str | None = None
    expires_at: datetime | None = None
    refunded_cents: int = 0
    paid_at: datetime | None = None
    payment_confirmed: bool = False
    flagged: bool = False
    pending_refunds: tuple[Refund, ...] | None = None


@dataclass(frozen=True)
class Notice:
    """An event for the outbox: its kind (``outbox.KINDS``) and arguments; ``refund_succeeded``'s refund
    is ``refund`` (the executor passes its record)."""

    kind: str
    arguments: Mapping[str, Any] = field(default_factory=dict)
    refund: Refund | None = None


@dataclass(frozen=True)
class Decision:
    """What an observation does to a checkout.

    ``changes``: the checkout's columns and their new values. ``detail``: the event's (after the
    observation's own). ``reason``: why, for the caller (empty when refunds were settled: their records'
    ids say it). ``refused``: the observation was refused (a mismatch, a contradicted payment) and the
    checkout flagged. ``refunds``: settled at ``refunds_at``. ``needs_refunds``: decided without
    ``Current.pending_refunds``, which this observation needs: ask again with them.
    """

    before: str
    after: str
    applied: bool
    changes: Mapping[str, Any] = field(default_factory=dict)
    detail: str = ""
    reason: str = ""
    refused: bool = False
    notices: tuple[Notice, ...] = ()
    refunds: tuple[Refund, ...] = ()
    refunds_at: datetime | None = None
    needs_refunds: bool = False

    @property
    def unchanged(self) -> bool:
        """Nothing but the event (and the answer's expiry) to write: no status, flag, notice or refund."""
        return (
            not self.applied
            and not self.refused
            and not self.notices
            and not self.refunds
            and not self.needs_refunds
            and self.before == self.after
            and self.before in RANK
            and set(self.changes) <= {"expires_at"}
        )


def decide(current: Current, observation: Observation, now: datetime) -> Decision:
    """What ``observation`` does to ``current`` at ``now``; see the module docstring for the rules."""
    return _Deciding(current, observation, now).decision()


class _Deciding:
    """One decision being made: the changes and notices gathered in the order the rules write them."""

    def __init__(self, current: Current, observation: Observation, now: datetime) -> None:
        self.current, self.observation, self.now = current, observation, now
        self.changes: dict[str, Any] = {}
        self.notices: list[Notice] = []
        self.flagged = current.flagged
        self.refunds: tuple[Refund, ...] = ()

    def decision(self) -> Decision:
        current, observation = self.current, self.observation
        before = current.status
        problem = _mismatch(current, observation)
        if problem is not None:
            self.flag(problem)
            refused = self.decided(before, before, False, problem, detail=f"REFUSED: {problem}", refused=True)
            return self.contradicted(refused)
        if observation.token and not current.token:
            self.changes["token"] = observation.token
        if observation.payment_url and observation.payment_url != current.payment_url:
            self.changes["payment_url"] = observation.payment_url
        if observation.expires_at is not None and observation.expires_at != current.expires_at:
            self.changes["expires_at"] = observation.expires_at
        refunded = current.refunded_cents
        if observation.refunded_cents is not None and observation.refunded_cents > refunded:
            refunded = self.changes["refunded_cents"] = observation.refunded_cents
        if moves(before, observation.status):
            self.changes["status"], self.changes["updated_at"] = observation.status, self.now
            if self.effects(before, refunded):
                return Decision(before, observation.status, True, needs_refunds=True)
            return self.decided(before, observation.status, True, "")
        if refunded > current.refunded_cents:
            # A second partial refund: the status stays, the refunded amount is the change.
            self.changes["updated_at"] = self.now
            return self.decided(before, before, True, f"refunded {refunded} cents in all")
        reason = NO_CHANGE if before == observation.status else f"{before} does not move back"
        return self.contradicted(self.decided(before, before, False, reason))

    def decided(
        self,
        before: str,
        after: str,
        applied: bool,
        reason: str,
        *,
        detail: str | None = None,
        refused: bool = False,
    ) -> Decision:
        return Decision(
            before,
            after,
            applied,
            changes=dict(self.changes),
            detail=reason if detail is None else detail,
            reason=reason,
            refused=refused,
            notices=tuple(self.notices),
            refunds=self.refunds,
            refunds_at=(self.observation.reported_at or self.now) if self.refunds else None,
        )

    def contradicted(self, decision: Decision) -> Decision:
        """``decision`` (not applied), flagged when the observation is a poll's answer below a payment the
        shop had recorded when it asked."""
        known, answered = self.observation.known, self.observation.status
        contradiction = None if known is None else _contradiction(known, answered)
        if contradiction is None:
            return decision
        self.flag(contradiction)
        return Decision(
            decision.before,
            decision.after,
            False,
            changes=dict(self.changes),
            detail="; ".join(part for part in (contradiction, decision.detail) if part),
            reason=contradiction,
            refused=True,
            notices=tuple(self.notices),
        )

    def flag(self, reason: str) -> None:
        """Flag the checkout for a person; ``checkout_flagged`` when it was not flagged yet."""
        if not self.flagged:
            self.notices.append(
                Notice("checkout_flagged", {"reason": reason, "source": self.observation.source})
            )
        self.flagged = True
        self.changes["flagged"], self.changes["flag_reason"] = True, reason

    def effects(self, before: str, refunded: int) -> bool:
        """What entering the observation's status does; True when it needs the pending refunds."""
        current, observation, source = self.current, self.observation, self.observation.source
        after = observation.status
        if after in PAYMENT_STATUSES and not current.payment_confirmed:
            self.changes["payment_confirmed_at"] = self.now
            self.changes["paid_at"] = observation.paid_at or self.now
            self.changes["paid_cents"] = current.total_cents
            self.notices.append(Notice("payment_confirmed", {"source": source}))
            if rank(before) == _CLOSED_RANK:
                self.notices.append(Notice("payment_after_close", {"before": before, "source": source}))
                self.flag(f"paid after the shop saw it {before}: review the order")
        elif after in _REFUNDED and source != "refund":
            if current.pending_refunds is None:
                return True
            if not current.payment_confirmed:
                # Money was taken and (some or all of it) given back before the shop heard of the payment:
                # whoever refunded it, the order must not be fulfilled without a person looking at it.
                self.changes["paid_at"] = observation.paid_at or current.paid_at
                self.changes["paid_cents"] = current.total_cents
                self.flag(
                    f"the gateway reports {after} before the shop knew of the payment: never confirmed for "
                    "fulfilment; review the order and the gateway's records"
                )
            self.gateway_refund(current.pending_refunds, refunded)
        elif after in (S.CANCELLED_BY_CONSUMER, S.CANCELLED_BY_MERCHANT):
            self.notices.append(Notice("checkout_cancelled", {"status": after, "source": source}))
        elif after == S.EXPIRED:
            self.notices.append(Notice("checkout_expired", {"source": source}))
        return False

    def gateway_refund(self, pending: tuple[Refund, ...], refunded: int) -> None:
        """A refund status the shop's own refunds do not account for: settle, record or flag."""
        observation = self.observation
        settled: tuple[Refund, ...] = ()
        if observation.status == S.FULLY_REFUNDED:
            missing = self.current.total_cents - refunded
            if missing <= 0:
                return
            if pending and sum(r.amount_cents for r in pending) == missing:
                settled = pending  # the answers to the shop's own refunds were lost; the gateway made them
            else:
                reason = f"refunded at the gateway, not through the shop (seen by {observation.source})"
                settled = (Refund(missing, reason=reason),)
        elif refunded == 0:  # PARTIALLY_REFUNDED: the answer does not carry the amount
            if len(pending) != 1:
                self.flag(
                    "the gateway reports a partial refund the shop did not record (the status answer does "
                    "not carry its amount): check the refund on the gateway"
                )
                return
            settled = pending
        if not settled:
            return
        self.changes["refunded_cents"] = refunded + sum(r.amount_cents for r in settled)
        self.refunds = settled
        self.notices.extend(
            Notice("refund_succeeded", {"amount_cents": r.amount_cents}, refund=r) for r in settled
        )


def _mismatch(current: Current, observation: Observation) -> str | None:
    """Why ``observation`` does not belong to the checkout (its account, its total), or None."""
    account, total_cents = current.merchant_account_id, current.total_cents
    if observation.merchant_account_id is not None and observation.merchant_account_id != account:
        return (
            f"merchant account {observation.merchant_account_id!r} does not match the checkout's {account!r}"
        )
    if (
        observation.status in PAID_STATUSES
        and observation.total_cents is not None
        and observation.total_cents != total_cents
    ):
        return f"total {observation.total_cents} cents does not match the checkout's {total_cents}"
    return None


def _contradiction(known: str, answered: str) -> str | None:
    """Why an answer contradicts a payment the shop had recorded (``known``) before asking, or None."""
    before, after = rank(known), rank(answered)
    if before is None or after is None or before < _PAID_RANK or after >= _PAID_RANK:
        return None
    return (
        f"the gateway answers {answered} for a checkout the shop had recorded as {known} before asking: "
        "a paid checkout does not go back; review the order and the gateway's records"
    )
