"""Reconciliation: ask the gateway about every checkout whose outcome the shop may have missed.

``reconcile()`` is a plain function (run it from cron through ``flask gateway reconcile``, or from any
scheduler inside an app context). It polls getstatus for v2 checkouts that are not final
(``PENDING_ORDER``, ``CANCELLED_BY_CONSUMER``, ``PAID_PENDING_CALLBACK``: among them every payment whose
callback never came) and applies each answer through the state machine, so a payment found this way is
confirmed (and ``payment_confirmed`` sent) exactly once, like one that arrived by callback.

Which checkouts are due: nothing happened to them (``updated_at``) and nobody polled them
(``last_polled_at``) for ``older_than_seconds`` (default ``GATEWAY_RECONCILE_AFTER_SECONDS``), so a
shopper still on the payment page is not polled and a busy schedule polls each checkout at most once per
period.

Two runs at once never poll the same checkout: a run *claims* a small batch before polling it, by
setting ``last_polled_at`` in a short transaction under ``SELECT ... FOR UPDATE SKIP LOCKED``
(PostgreSQL: a concurrent run skips rows being claimed and, once the claim commits, sees them as just
polled; SQLite: ``BEGIN IMMEDIATE`` serialises the claims). A claimed row is not due again for at least
:data:`CLAIM_LEASE_SECONDS` (or ``older_than_seconds`` when longer), so neither a concurrent run nor the
same run takes it twice; a run that dies after claiming leaves its rows to the next run after the lease.
No extra column is needed.

Not polled, reported: ``CREATING`` checkouts older than a minute (the create's answer never came, so
there is no token to ask about), v1 orders (the v1 API has no status query; their outcome arrives on the
success/fail URLs), and checkouts of another merchant account than the installed one.

The gateway reports ``EXPIRED`` once ``expiresAt`` passed; should it still answer ``PENDING_ORDER`` for a
checkout past its ``expiresAt`` (more than a minute, for clock skew), the checkout is marked ``EXPIRED``
here (DESIGN §3). A payment reported later still moves it on (and flags it for review).
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import ColumnElement, and_, func, or_, select, update

from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import OPEN_STATUSES, PAID_STATUSES, PAYMENT_STATUSES, CheckoutStatus
from flask_gateway.models import GatewayCheckout, LocalStatus
from flask_gateway.polling import refresh
from flask_gateway.state import get_state, leaves_no_transaction
from flask_gateway.transitions import Observation, apply

__all__ = [
    "CLAIM_LEASE_SECONDS",
    "POLLED_STATUSES",
    "ReconcileError",
    "ReconcileReport",
    "reconcile",
]

log = logging.getLogger("flask_gateway.reconciliation")

S = CheckoutStatus

#: The statuses a reconciliation asks the gateway about.
POLLED_STATUSES: Final = (*sorted(OPEN_STATUSES), S.PAID_PENDING_CALLBACK.value)
#: A claimed (or polled) checkout is not due again for at least this long.
CLAIM_LEASE_SECONDS: Final = 60
#: A ``CREATING`` checkout older than this has lost its create answer: reported.
STUCK_CREATING_AFTER: Final = timedelta(minutes=1)
#: Past ``expiresAt`` by more than this while the gateway still says ``PENDING_ORDER``: expired.
EXPIRY_GRACE: Final = timedelta(minutes=1)
#: Rows claimed per short transaction: small, so a claimed row is polled soon after its claim.
BATCH_SIZE: Final = 10

#: ``progress(done, total)``: called once before the first poll and after every checkout.
Progress = Callable[[int, int], None]


@dataclass(frozen=True)
class ReconcileError:
    """One checkout that could not be reconciled (the run went on)."""

    checkout_id: int
    token: str | None
    message: str


@dataclass
class ReconcileReport:
    """What one run did."""

    started_at: datetime
    finished_at: datetime | None = None
    #: False: the gateway is not installed, nothing was polled.
    installed: bool = True
    #: Checkouts due when the run started (after ``limit``); a concurrent run may take some of them.
    due: int = 0
    polled: int = 0
    #: Polls that moved a checkout to another status.
    changed: int = 0
    #: Payments this run confirmed (``payment_confirmed`` was sent for each).
    confirmed: int = 0
    expired: int = 0
    #: The status each polled checkout has after the poll.
    statuses: Counter[str] = field(default_factory=Counter)
    errors: list[ReconcileError] = field(default_factory=list)
    #: Ids of ``CREATING`` checkouts older than a minute: their create answer never came (not polled).
    stuck_creating: list[int] = field(default_factory=list)
    #: Open v1 orders past their expiry: v1 has no status query, so they are only counted.
    v1_unresolved: int = 0
    #: Open checkouts of a merchant account other than the installed one: not polled.
    other_account: int = 0

    @property
    def failed(self) -> int:
        return len(self.errors)

    def summary(self) -> str:
        """A few lines for a terminal or a log."""
        if not self.installed:
            return "The gateway is not installed: nothing to reconcile."
        lines = [
            f"Polled {self.polled} of {self.due} due checkout(s): {self.changed} changed, "
            f"{self.confirmed} payment(s) confirmed, {self.expired} expired, {self.failed} failed."
        ]
        if self.statuses:
            lines.append(
                "Statuses now: "
                + ", ".join(f"{name} {count}" for name, count in sorted(self.statuses.items()))
            )
        for error in self.errors[:20]:
            lines.append(f"  failed: checkout #{error.checkout_id} ({error.token}): {error.message}")
        if len(self.errors) > 20:
            lines.append(f"  ... and {len(self.errors) - 20} more failures")
        if self.stuck_creating:
            shown = ", ".join(f"#{i}" for i in self.stuck_creating[:20])
            lines.append(
                f"{len(self.stuck_creating)} checkout(s) stuck in CREATING (the create answer never came; "
                f"retry create_checkout for the order or review them): {shown}"
            )
        if self.v1_unresolved:
            lines.append(
                f"{self.v1_unresolved} v1 order(s) past their expiry without an outcome (v1 has no status "
                "query: check them on the gateway)."
            )
        if self.other_account:
            lines.append(
                f"{self.other_account} open checkout(s) belong to another merchant account and were skipped."
            )
        return "\n".join(lines)


def _due(account: str, cutoff: datetime, lease_cutoff: datetime) -> ColumnElement[bool]:
    return and_(
        GatewayCheckout.api_version == "v2",
        GatewayCheckout.token.is_not(None),
        GatewayCheckout.status.in_(POLLED_STATUSES),
        GatewayCheckout.merchant_account_id == account,
        GatewayCheckout.updated_at <= cutoff,
        or_(GatewayCheckout.last_polled_at.is_(None), GatewayCheckout.last_polled_at < lease_cutoff),
    )


@leaves_no_transaction
def reconcile(
    *,
    limit: int | None = None,
    older_than_seconds: float | None = None,
    progress: Progress | None = None,
) -> ReconcileReport:
    """Poll the due checkouts (at most ``limit``), apply the answers, and report; see the module docstring.

    Never raises for one checkout's failure: it is counted in ``errors`` and the run goes on.
    """
    if limit is not None and limit < 0:
        raise ValueError("limit must be 0 or more")
    state = get_state()
    session = state.session
    started = utcnow()
    report = ReconcileReport(started_at=started)
    older_than = timedelta(
        seconds=state.config.reconcile_after_seconds if older_than_seconds is None else older_than_seconds
    )
    cutoff = started - older_than
    lease_cutoff = started - max(older_than, timedelta(seconds=CLAIM_LEASE_SECONDS))
    _count_unpolled(report, started)
    installation = state.installation()
    if installation is None:
        report.installed = False
        session.commit()
        report.finished_at = utcnow()
        return report
    account = installation.merchant_account_id
    report.other_account = (
        session.scalar(
            select(func.count())
            .select_from(GatewayCheckout)
            .where(
                GatewayCheckout.status.in_(POLLED_STATUSES), GatewayCheckout.merchant_account_id != account
            )
        )
        or 0
    )
    due = (
        session.scalar(
            select(func.count()).select_from(GatewayCheckout).where(_due(account, cutoff, lease_cutoff))
        )
        or 0
    )
    report.due = min(due, limit) if limit is not None else due
    session.commit()
    if progress is not None:
        progress(0, report.due)
    done = 0
    seen: set[int] = set()
    while limit is None or done < limit:
        batch = min(BATCH_SIZE, limit - done) if limit is not None else BATCH_SIZE
        claimed = [i for i in _claim(account, cutoff, lease_cutoff, batch) if i not in seen]
        if not claimed:
            break
        for checkout_id in claimed:
            seen.add(checkout_id)
            _reconcile_one(checkout_id, report)
            done += 1
            if progress is not None:
                progress(done, max(report.due, done))
    report.finished_at = utcnow()
    log.info("reconcile: %s", report.summary().replace("\n", " | "))
    return report


def _count_unpolled(report: ReconcileReport, now: datetime) -> None:
    session = get_state().session
    report.stuck_creating = list(
        session.scalars(
            select(GatewayCheckout.id)
            .where(
                GatewayCheckout.status == LocalStatus.CREATING.value,
                GatewayCheckout.token.is_(None),
                GatewayCheckout.created_at < now - STUCK_CREATING_AFTER,
            )
            .order_by(GatewayCheckout.id)
        )
    )
    report.v1_unresolved = (
        session.scalar(
            select(func.count())
            .select_from(GatewayCheckout)
            .where(
                GatewayCheckout.api_version == "v1",
                GatewayCheckout.status.in_((S.PENDING_ORDER.value, S.CANCELLED_BY_CONSUMER.value)),
                GatewayCheckout.expires_at < now - EXPIRY_GRACE,
            )
        )
        or 0
    )


def _claim(account: str, cutoff: datetime, lease_cutoff: datetime, size: int) -> list[int]:
    """Take up to ``size`` due checkouts for this run: mark them polled now, in one short transaction."""
    session = get_state().session
    try:
        ids = list(
            session.scalars(
                select(GatewayCheckout.id)
                .where(_due(account, cutoff, lease_cutoff))
                .order_by(GatewayCheckout.updated_at, GatewayCheckout.id)
                .limit(size)
                .with_for_update(skip_locked=True)
            )
        )
        if ids:
            session.execute(
                update(GatewayCheckout)
                .where(GatewayCheckout.id.in_(ids))
                .values(last_polled_at=utcnow())
                .execution_options(synchronize_session=False)
            )
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return ids


def _reconcile_one(checkout_id: int, report: ReconcileReport) -> None:
    session = get_state().session
    token: str | None = None
    try:
        checkout = session.get_one(GatewayCheckout, checkout_id, populate_existing=True)
        token = checkout.token
        transition = refresh(checkout, source="reconcile")
        report.polled += 1
        checkout = transition.checkout
        if transition.applied:
            report.changed += 1
            if transition.after in PAYMENT_STATUSES and transition.before not in PAID_STATUSES:
                report.confirmed += 1
            if transition.after == S.EXPIRED:
                report.expired += 1
        if (
            checkout.status == S.PENDING_ORDER
            and checkout.expires_at is not None
            and checkout.expires_at < utcnow() - EXPIRY_GRACE
        ):
            expired = apply(
                session,
                checkout_id,
                Observation(
                    status=S.EXPIRED.value,
                    source="reconcile",
                    detail=f"the gateway still says PENDING_ORDER past expiresAt "
                    f"{checkout.expires_at.isoformat()}: treated as expired",
                ),
            )
            if expired.applied:
                report.expired += 1
                if not transition.applied:
                    report.changed += 1
            checkout = expired.checkout
        report.statuses[checkout.status] += 1
        session.commit()  # end the read: no transaction (SQLite: no write lock) held between polls
    except Exception as error:  # one checkout's failure never stops the run
        session.rollback()
        log.warning("reconcile: checkout #%s failed: %s", checkout_id, error, exc_info=True)
        report.errors.append(ReconcileError(checkout_id=checkout_id, token=token, message=str(error)))
