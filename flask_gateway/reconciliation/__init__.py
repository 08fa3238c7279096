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

Concurrency (``GATEWAY_RECONCILE_CONCURRENCY``, ``concurrency=``): a run keeps that many getstatus calls
in flight. A pool of threads sends them, each over a keep-alive HTTP session of its own (the extension's
session of that thread), touching no database; the run's own thread claims the next checkouts (reading
their token and status in the claim, so nothing is read before a request), hands them out through a
bounded queue, and applies the answers that came in, several per transaction, then sends their events.
The run never holds more than ``AHEAD_PER_THREAD * concurrency + BATCH_SIZE`` claimed checkouts, whatever
the number due; the report and ``progress`` are only ever touched by the run's thread. With
``concurrency=1`` (or an in-memory SQLite database) the run polls one checkout at a time in its own thread,
claiming :data:`BATCH_SIZE` at a time, each answer applied in a transaction of its own.

Not polled, reported: ``CREATING`` checkouts older than a minute (the create's answer never came, so
there is no token to ask about), v1 orders (the v1 API has no status query; their outcome arrives on the
success/fail URLs), and checkouts of another merchant account than the installed one.

The gateway reports ``EXPIRED`` once ``expiresAt`` passed; should it still answer ``PENDING_ORDER`` for a
checkout past its ``expiresAt`` (more than a minute, for clock skew), the checkout is marked ``EXPIRED``
here (DESIGN §3). A payment reported later still moves it on (and flags it for review).

Paid checkouts, to learn of refunds and cancellations made at the gateway (its portal, another system
of the merchant's): after the open checkouts, a run asks about the ``PAID`` and ``PARTIALLY_REFUNDED``
checkouts whose payment the shop recorded within the last ``GATEWAY_RECONCILE_PAID_WINDOW_HOURS`` (0:
none), each at most once per :data:`PAID_RECHECK_SECONDS` (nothing changed or polled it for that long),
claimed as above. ``PAID_PENDING_CALLBACK`` checkouts are already among the open pass's. What a poll
learns is recorded by ``transitions.apply`` and ``polling.record_answer``: a full refund as a ``RefundRecord``
of the missing amount with ``refund_succeeded`` once; a partial one the shop cannot account for (the
status answer carries no amount) flagged; a paid checkout the gateway calls cancelled, expired or open
flagged (it does not go back). ``limit`` counts both passes, the open checkouts first.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Final

from flask import Flask, current_app
from sqlalchemy import ColumnElement, and_, func, or_, select, update

from flask_gateway.config import MAX_PAID_WINDOW_HOURS
from flask_gateway.core.client import GatewayClient
from flask_gateway.core.outages import describe_database_error, is_database_outage
from flask_gateway.core.sql import commit_keeping_loaded, sqlite_in_memory
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import (
    OPEN_STATUSES,
    PAID_STATUSES,
    PAYMENT_STATUSES,
    CheckoutStatus,
    CheckoutStatusPayload,
)
from flask_gateway.health import check_callback_health
from flask_gateway.heartbeats import record_run
from flask_gateway.models import GatewayCheckout, LocalStatus
from flask_gateway.polling import record_answer
from flask_gateway.state import get_state, leaves_no_transaction
from flask_gateway.transitions import Observation, Transition, apply, send_pending

__all__ = [
    "CLAIM_LEASE_SECONDS",
    "PAID_POLLED_STATUSES",
    "PAID_RECHECK_SECONDS",
    "POLLED_STATUSES",
    "ReconcileError",
    "ReconcileReport",
    "reconcile",
]

log = logging.getLogger("flask_gateway.reconciliation")

S = CheckoutStatus

#: The statuses a reconciliation asks the gateway about.
POLLED_STATUSES: Final = (*sorted(OPEN_STATUSES), S.PAID_PENDING_CALLBACK.value)
#: The paid statuses a reconciliation asks about within the paid window (``PAID_PENDING_CALLBACK`` is
#: among ``POLLED_STATUSES`` already); ``FULLY_REFUNDED`` is final.
PAID_POLLED_STATUSES: Final = (S.PAID.value, S.PARTIALLY_REFUNDED.value)
#: A paid checkout is asked about again only once nothing changed or polled it for this long.
PAID_RECHECK_SECONDS: Final = 3600
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
    #: The paid window of this run, in hours (0: paid checkouts were not asked about).
    paid_window_hours: float = 0
    #: Paid checkouts in the window due when the run started (after what ``limit`` left for them).
    paid_due: int = 0
    #: Paid checkouts asked about (the "checked" of the summary).
    paid_polled: int = 0
    #: Paid checkouts whose status or refunded amount changed (a refund recorded).
    paid_changed: int = 0
    #: Paid checkouts that could not be asked about (also in ``errors``).
    paid_failed: int = 0
    #: The status each paid checkout asked about has after the poll.
    paid_statuses: Counter[str] = field(default_factory=Counter)
    #: Checkouts (of either pass) whose refunded amount grew: refunds learnt from the gateway, recorded.
    refunded: int = 0
    #: What those refunds add up to, in cents.
    refunded_cents: int = 0
    #: Checkouts (of either pass) this run flagged for a person.
    flagged: int = 0

    @property
    def failed(self) -> int:
        return len(self.errors)

    def summary(self) -> str:
        """A few lines for a terminal or a log."""
        if not self.installed:
            return "The gateway is not installed: nothing to reconcile."
        lines = [
            f"Polled {self.polled} of {self.due} due checkout(s): {self.changed} changed, "
            f"{self.confirmed} payment(s) confirmed, {self.expired} expired, "
            f"{self.failed - self.paid_failed} failed."
        ]
        if self.statuses:
            lines.append("Statuses now: " + _counted(self.statuses))
        if self.paid_window_hours > 0:
            line = (
                f"Checked {self.paid_polled} of {self.paid_due} paid checkout(s) due from the last "
                f"{self.paid_window_hours:g} hour(s): {self.paid_changed} changed, {self.paid_failed} failed."
            )
            if self.paid_statuses:
                line += " Statuses now: " + _counted(self.paid_statuses)
            lines.append(line)
        else:
            lines.append("Paid checkouts not checked (paid window 0).")
        if self.refunded:
            lines.append(
                f"Refunds learnt from the gateway: {self.refunded} checkout(s), {self.refunded_cents} cents "
                "recorded (refund_succeeded sent)."
            )
        if self.flagged:
            lines.append(
                f"{self.flagged} checkout(s) flagged for a person: the gateway's answer does not add up with "
                "the shop's record (the admin's checkouts list, flagged only)."
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


def _counted(statuses: Counter[str]) -> str:
    return ", ".join(f"{name} {count}" for name, count in sorted(statuses.items()))


def _due(account: str, cutoff: datetime, lease_cutoff: datetime) -> ColumnElement[bool]:
    """The open checkouts to ask about: unchanged and unpolled since ``cutoff`` (and not claimed)."""
    return and_(
        GatewayCheckout.api_version == "v2",
        GatewayCheckout.token.is_not(None),
        GatewayCheckout.status.in_(POLLED_STATUSES),
        GatewayCheckout.merchant_account_id == account,
        GatewayCheckout.updated_at <= cutoff,
        or_(GatewayCheckout.last_polled_at.is_(None), GatewayCheckout.last_polled_at < lease_cutoff),
    )


def _paid_due(
    account: str, window_start: datetime, recheck_cutoff: datetime, lease_cutoff: datetime
) -> ColumnElement[bool]:
    """The paid checkouts to ask about: payment recorded since ``window_start``, unchanged and unpolled
    since ``recheck_cutoff`` (and not claimed)."""
    return and_(
        GatewayCheckout.api_version == "v2",
        GatewayCheckout.token.is_not(None),
        GatewayCheckout.status.in_(PAID_POLLED_STATUSES),
        GatewayCheckout.merchant_account_id == account,
        or_(
            GatewayCheckout.payment_confirmed_at >= window_start,
            # Refunded before the shop knew of the payment (flagged, never confirmed): the gateway's paidAt.
            and_(GatewayCheckout.payment_confirmed_at.is_(None), GatewayCheckout.paid_at >= window_start),
        ),
        # Implied by the payment's time (recording it set updated_at), and what bounds the scan of the
        # (status, updated_at) index to the window: a shop's older paid orders are never read.
        GatewayCheckout.updated_at >= window_start,
        GatewayCheckout.updated_at <= recheck_cutoff,
        or_(GatewayCheckout.last_polled_at.is_(None), GatewayCheckout.last_polled_at < lease_cutoff),
    )


def _count(where: ColumnElement[bool]) -> int:
    return get_state().session.scalar(select(func.count()).select_from(GatewayCheckout).where(where)) or 0


@leaves_no_transaction
def reconcile(
    *,
    limit: int | None = None,
    older_than_seconds: float | None = None,
    progress: Progress | None = None,
    paid_window_hours: float | None = None,
    paid_recheck_seconds: float | None = None,
    concurrency: int | None = None,
) -> ReconcileReport:
    """Poll the due checkouts (at most ``limit``), apply the answers, and report; see the module docstring.

    ``paid_window_hours`` (default ``GATEWAY_RECONCILE_PAID_WINDOW_HOURS``; 0: none) and
    ``paid_recheck_seconds`` (default :data:`PAID_RECHECK_SECONDS`) choose the paid checkouts asked about.
    ``concurrency`` (default ``GATEWAY_RECONCILE_CONCURRENCY``) is how many getstatus calls are in flight
    at once: polling threads that touch no database, each with its own keep-alive HTTP session, fed by
    this thread's claims through a bounded queue, their answers applied by this thread; 1 polls one
    checkout at a time in this thread. ``progress`` is always called in this thread, and the report is
    only ever written here. Never raises for one checkout's failure: it is counted in ``errors`` and the
    run goes on.
    """
    if limit is not None and limit < 0:
        raise ValueError("limit must be 0 or more")
    if paid_window_hours is not None and not 0 <= paid_window_hours <= MAX_PAID_WINDOW_HOURS:
        raise ValueError(f"paid_window_hours must be from 0 to {MAX_PAID_WINDOW_HOURS}")
    if paid_recheck_seconds is not None and paid_recheck_seconds < 0:
        raise ValueError("paid_recheck_seconds must be 0 or more")
    if concurrency is not None and concurrency < 1:
        raise ValueError("concurrency must be 1 or more")
    with record_run("reconcile") as run:  # the heartbeat (flask_gateway.heartbeats)
        report = _reconcile_once(
            limit, older_than_seconds, progress, paid_window_hours, paid_recheck_seconds, concurrency
        )
        # Not installed: nothing was reconciled, so the job does not do its work (a wrong database?).
        run.done(report.summary(), failed=bool(report.errors) or not report.installed)
    return report


def _reconcile_once(
    limit: int | None,
    older_than_seconds: float | None,
    progress: Progress | None,
    paid_window_hours: float | None,
    paid_recheck_seconds: float | None,
    concurrency: int | None,
) -> ReconcileReport:
    state = get_state()
    concurrency = state.config.reconcile_concurrency if concurrency is None else concurrency
    session = state.session
    started = utcnow()
    report = ReconcileReport(started_at=started)
    older_than = timedelta(
        seconds=state.config.reconcile_after_seconds if older_than_seconds is None else older_than_seconds
    )
    cutoff = started - older_than
    lease_cutoff = started - max(older_than, timedelta(seconds=CLAIM_LEASE_SECONDS))
    report.paid_window_hours = (
        state.config.reconcile_paid_window_hours if paid_window_hours is None else paid_window_hours
    )
    recheck = timedelta(
        seconds=PAID_RECHECK_SECONDS if paid_recheck_seconds is None else paid_recheck_seconds
    )
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
    passes: list[tuple[ColumnElement[bool], bool]] = [(_due(account, cutoff, lease_cutoff), False)]
    due = _count(passes[0][0])
    report.due = min(due, limit) if limit is not None else due
    if report.paid_window_hours > 0:
        paid_where = _paid_due(
            account,
            window_start=started - timedelta(hours=report.paid_window_hours),
            recheck_cutoff=started - recheck,
            lease_cutoff=started - max(recheck, timedelta(seconds=CLAIM_LEASE_SECONDS)),
        )
        passes.append((paid_where, True))
        paid_due = _count(paid_where)
        report.paid_due = min(paid_due, limit - report.due) if limit is not None else paid_due
    session.commit()
    total = report.due + report.paid_due
    if progress is not None:
        progress(0, total)
    signer = (account, state.box.decrypt_cached(installation.signing_key_encrypted))
    workers = min(concurrency, total)
    if workers <= 1 or sqlite_in_memory(state.engine):  # one connection: one thread
        _run_in_turn(passes, report, limit, total, progress, signer)
    else:
        _run_concurrently(passes, report, limit, total, progress, signer, workers)
    try:
        # Callbacks gone silent while payments go on (callbacks_silent, once per silent spell): each run
        # looks, so a shop whose callbacks stopped hears of it within one schedule.
        check_callback_health()
    except Exception as error:
        with suppress(Exception):  # a dead connection's rollback fails too
            session.rollback()
        if is_database_outage(error):
            log.warning(
                "reconcile: the callback health check could not read the database (%s); the run itself "
                "is done",
                describe_database_error(error),
            )
        else:
            log.exception("reconcile: the callback health check failed (the run itself is done)")
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


@dataclass(frozen=True)
class _Claimed:
    """A checkout claimed for polling: what the poll needs, read in the claim (no read before the poll)."""

    id: int
    token: str
    #: The status the shop had recorded when it was claimed, so before the question was sent.
    status: str
    paid: bool


def _claim(where: ColumnElement[bool], size: int, *, paid: bool) -> list[_Claimed]:
    """Take up to ``size`` due checkouts for this run: mark them polled now, in one short transaction."""
    session = get_state().session
    try:
        rows = _claim_rows(where, size, paid=paid)
        session.commit()
    except BaseException:
        session.rollback()
        raise
    return rows


def _claim_rows(where: ColumnElement[bool], size: int, *, paid: bool) -> list[_Claimed]:
    """``_claim`` in the current transaction (the caller commits)."""
    session = get_state().session
    rows = [
        _Claimed(id=row.id, token=row.token or "", status=row.status, paid=paid)
        for row in session.execute(
            select(GatewayCheckout.id, GatewayCheckout.token, GatewayCheckout.status)
            .where(where)
            .order_by(GatewayCheckout.updated_at, GatewayCheckout.id)
            .limit(size)
            .with_for_update(skip_locked=True)
        )
    ]
    ids = [row.id for row in rows]
    if ids:
        session.execute(
            update(GatewayCheckout)
            .where(GatewayCheckout.id.in_(ids))
            .values(last_polled_at=utcnow())
            .execution_options(synchronize_session=False)
        )
    return rows


@dataclass(frozen=True)
class _Outcome:
    """What polling one checkout did: recorded into the report by the run's own thread."""

    paid: bool
    error: ReconcileError | None = None
    status: str = ""
    changed: bool = False
    confirmed: bool = False
    expired: int = 0
    refunded_cents: int = 0
    flagged: bool = False


def _record(report: ReconcileReport, outcome: _Outcome) -> None:
    if outcome.error is not None:
        report.errors.append(outcome.error)
        if outcome.paid:
            report.paid_failed += 1
        return
    if outcome.paid:
        report.paid_polled += 1
        report.paid_changed += outcome.changed
    else:
        report.polled += 1
        report.changed += outcome.changed
        report.confirmed += outcome.confirmed
        report.expired += outcome.expired
    if outcome.refunded_cents > 0:
        report.refunded += 1
        report.refunded_cents += outcome.refunded_cents
    report.flagged += outcome.flagged
    (report.paid_statuses if outcome.paid else report.statuses)[outcome.status] += 1


def _reconcile_one(claimed: _Claimed, client: GatewayClient) -> _Outcome:
    """Poll one claimed checkout and apply the answer in a transaction of its own (concurrency 1)."""
    answer: CheckoutStatusPayload | BaseException
    try:
        answer = client.get_status(claimed.token).data
    except Exception as error:  # one checkout's failure never stops the run
        answer = error
    [outcome] = _write([(claimed, answer)], None)[0]
    return outcome


def _failed(claimed: _Claimed, error: BaseException) -> _Outcome:
    log.warning("reconcile: checkout #%s failed: %s", claimed.id, error, exc_info=True)
    return _Outcome(
        paid=claimed.paid,
        error=ReconcileError(checkout_id=claimed.id, token=claimed.token, message=str(error)),
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
        status=checkout.status,
        changed=changed,
        confirmed=confirmed,
        expired=expired,
        refunded_cents=max(0, checkout.refunded_cents - polled.refunded_before),
        flagged=checkout.flagged and not polled.flagged_before,
    )
    return outcome, transitions


# --- the polling loops ------------------------------------------------------------------------------

#: The passes of a run: which checkouts are due, and whether they are the paid ones.
Passes = list[tuple[ColumnElement[bool], bool]]
#: The installed account and its signing key: each polling thread makes its own client with them.
_Signer = tuple[str, str]


def _run_in_turn(
    passes: Passes,
    report: ReconcileReport,
    limit: int | None,
    total: int,
    progress: Progress | None,
    signer: _Signer,
) -> None:
    """One checkout at a time, in this thread: claim a batch, poll it, claim the next."""
    client = get_state().signed_client(*signer)
    done = 0
    seen: set[int] = set()  # at most one poll per checkout per run, whichever pass would take it again
    for where, paid in passes:
        while limit is None or done < limit:
            batch = min(BATCH_SIZE, limit - done) if limit is not None else BATCH_SIZE
            claimed = [c for c in _claim(where, batch, paid=paid) if c.id not in seen]
            if not claimed:
                break
            for checkout in claimed:
                seen.add(checkout.id)
                _record(report, _reconcile_one(checkout, client))
                done += 1
                if progress is not None:
                    progress(done, max(total, done))


#: Answers applied in one transaction at most (those that came in while the last one was written).
WRITE_BATCH: Final = 100
#: Claimed checkouts a run holds at most (waiting, in flight, answered and not yet applied), per thread;
#: plus :data:`BATCH_SIZE`.
AHEAD_PER_THREAD: Final = 4

#: What a polling thread hands back: the claimed checkout, and the gateway's answer or why none came.
_Answer = tuple[_Claimed, CheckoutStatusPayload | BaseException]


def _run_concurrently(
    passes: Passes,
    report: ReconcileReport,
    limit: int | None,
    total: int,
    progress: Progress | None,
    signer: _Signer,
    workers: int,
) -> None:
    """``workers`` threads send the getstatus requests; this thread claims, hands out, and applies the
    answers.

    The threads only wait on the gateway: they touch no database. This thread loops: it takes the answers
    that came in (waiting for one when it has nothing else to do), applies them in one transaction, in
    which it also claims the next checkouts when there is room for a batch of them, commits, then hands
    the claimed checkouts out and sends the answers' events. So the database is written by one thread of
    the run, in short transactions (one commit for many checkouts: on SQLite, where writers serialise and
    a commit may cost an fsync, that is what lets the run keep up with the gateway), while the threads'
    HTTP waits overlap. The run holds at most ``AHEAD_PER_THREAD * workers + BATCH_SIZE`` claimed
    checkouts at once, whatever the number due (memory bounded by the pool), every thread has its next
    checkout at hand, and a claimed checkout is polled seconds after its claim, well within
    :data:`CLAIM_LEASE_SECONDS`; a concurrent run claims the others. The report and ``progress`` are only
    touched by this thread.
    """
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    capacity = AHEAD_PER_THREAD * workers + BATCH_SIZE
    tasks: queue.Queue[_Claimed | None] = queue.Queue(maxsize=capacity)
    answers: queue.SimpleQueue[_Answer] = queue.SimpleQueue()
    threads = [
        threading.Thread(
            target=_work, args=(app, signer, tasks, answers), name=f"gateway-reconcile-{n}", daemon=True
        )
        for n in range(workers)
    ]
    for thread in threads:
        thread.start()
    remaining = list(passes)
    claimed = done = 0
    # No set of the ids polled (it would grow with the run): a claimed checkout is not due again in this
    # run, in either pass, as the claim set its last_polled_at after the run started, and both passes only
    # take checkouts unpolled since before it started (the lease).

    def claim() -> list[_Claimed]:
        """The next checkouts to hand out, in the current transaction (as many as there is room for)."""
        while remaining:
            size = capacity - (claimed - done)
            if limit is not None:
                size = min(size, limit - claimed)
            where, paid = remaining[0]
            fresh = _claim_rows(where, size, paid=paid)
            if fresh:
                return fresh
            remaining.pop(0)  # this pass is done
        return []

    try:
        while True:
            can_claim = (
                bool(remaining)
                and (limit is None or claimed < limit)
                and capacity - (claimed - done) >= BATCH_SIZE
            )
            if not can_claim and claimed == done:
                break
            batch: list[_Answer] = []
            if not can_claim:
                batch.append(_next_answer(answers, threads))
            while len(batch) < WRITE_BATCH:
                try:
                    batch.append(answers.get_nowait())
                except queue.Empty:
                    break
            outcomes, fresh = _write(batch, claim if can_claim else None)
            for checkout in fresh:
                tasks.put_nowait(checkout)
            claimed += len(fresh)
            if can_claim and not fresh:
                remaining.clear()  # nothing left to claim (or the limit is reached)
            for outcome in outcomes:
                _record(report, outcome)
                done += 1
                if progress is not None:
                    progress(done, max(total, done))
    finally:
        # Normally the queue is empty here. After an error (a claim, the progress callback) the checkouts
        # not handed out yet stay claimed (due again after the lease); those in flight finish.
        while True:
            try:
                tasks.get_nowait()
            except queue.Empty:
                break
        for _ in threads:
            tasks.put(None)
        for thread in threads:
            thread.join()


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
            for claimed, answer in answered:
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


def _work(
    app: Flask, signer: _Signer, tasks: queue.Queue[_Claimed | None], answers: queue.SimpleQueue[_Answer]
) -> None:
    """A polling thread: ask about the checkouts handed out until told to end. Its client uses the
    extension's HTTP session of this thread, so a connection of its own, kept alive from one request to
    the next; it touches no database."""
    with app.app_context():
        client: GatewayClient | None = None
        while (checkout := tasks.get()) is not None:
            answer: CheckoutStatusPayload | BaseException
            try:
                client = client or get_state().signed_client(*signer)
                answer = client.get_status(checkout.token).data
            except BaseException as error:  # an answer for every checkout: the run waits for each one
                answer = error
            answers.put((checkout, answer))


def _next_answer(answers: queue.SimpleQueue[_Answer], threads: list[threading.Thread]) -> _Answer:
    while True:
        try:
            return answers.get(timeout=1.0)
        except queue.Empty:
            if not any(thread.is_alive() for thread in threads):
                raise RuntimeError(
                    "reconcile: every polling thread stopped before the run was done"
                ) from None
