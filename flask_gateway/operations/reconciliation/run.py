"""A reconciliation run: ``reconcile()``, its passes, its counts of what is not polled, and its heartbeat.

``reconcile()`` is a plain function (run it from cron through ``flask gateway reconcile``, or from any
scheduler inside an app context). It polls getstatus for v2 checkouts that are not final
(``PENDING_ORDER``, ``CANCELLED_BY_CONSUMER``, ``PAID_PENDING_CALLBACK``: among them every payment whose
callback never came) and applies each answer through the state machine, so a payment found this way is
confirmed (and ``payment_confirmed`` sent) exactly once, like one that arrived by callback.

Every merchant account installed for the environment, open or retired (a retired account's checkouts are
settled like any), in one run with one pool (``account=``: that one only). Each checkout is asked about
with its own account's key; an account whose key the gateway refuses fails alone (see ``pool``), and the
report says per account what happened (:class:`~.report.AccountReport`).

Not polled, reported: ``CREATING`` checkouts older than a minute (the create's answer never came, so
there is no token to ask about), v1 orders (the v1 API has no status query; their outcome arrives on the
success/fail URLs), and checkouts of a merchant account not installed here.

Paid checkouts, to learn of refunds and cancellations made at the gateway (its portal, another system
of the merchant's): after the open checkouts, a run asks about the ``PAID`` and ``PARTIALLY_REFUNDED``
checkouts whose payment the shop recorded within the last ``GATEWAY_RECONCILE_PAID_WINDOW_HOURS`` (0:
none), each at most once per :data:`PAID_RECHECK_SECONDS` (nothing changed or polled it for that long),
claimed as above. ``PAID_PENDING_CALLBACK`` checkouts are already among the open pass's. What a poll
learns is recorded by ``transitions.apply`` and ``polling.record_answer``: a full refund as a ``RefundRecord``
of the missing amount with ``refund_succeeded`` once; a partial one the shop cannot account for (the
status answer carries no amount) flagged; a paid checkout the gateway calls cancelled, expired or open
flagged (it does not go back). ``limit`` counts both passes, the open checkouts first.

The gateway's settings: a run over every account also offers the settings check its turn
(:func:`flask_gateway.operations.drift.scheduled_check`: compared with the shop's and put back, at most once
per ``GATEWAY_SETTINGS_CHECK_SECONDS`` whichever process runs it), before the checkouts; a check that
fails is logged and never fails the run.

Imports ``pool``, ``answers``, ``claiming`` and ``report`` of the package.
"""

from __future__ import annotations

import logging
from contextlib import suppress
from datetime import datetime, timedelta
from typing import Final

from sqlalchemy import ColumnElement, func, select

from flask_gateway.config import MAX_PAID_WINDOW_HOURS
from flask_gateway.core.outages import describe_database_error, is_database_outage
from flask_gateway.core.sql import sqlite_in_memory
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import CheckoutStatus as S
from flask_gateway.errors import SecretUnreadable
from flask_gateway.models import GatewayCheckout, Installation, LocalStatus
from flask_gateway.operations.drift import scheduled_check
from flask_gateway.operations.health import check_callback_health
from flask_gateway.operations.reconciliation.answers import EXPIRY_GRACE
from flask_gateway.operations.reconciliation.claiming import (
    CLAIM_LEASE_SECONDS,
    PAID_RECHECK_SECONDS,
    POLLED_STATUSES,
    _count_by_account,
    _of,
    _paid_due,
    due,
)
from flask_gateway.operations.reconciliation.pool import Keys, Progress, _run_concurrently, _run_in_turn
from flask_gateway.operations.reconciliation.report import AccountReport, ReconcileReport
from flask_gateway.payments.heartbeats import record_run
from flask_gateway.state import get_state, leaves_no_transaction

log = logging.getLogger("flask_gateway.reconciliation")

#: A ``CREATING`` checkout older than this has lost its create answer: reported.
STUCK_CREATING_AFTER: Final = timedelta(minutes=1)


@leaves_no_transaction
def reconcile(
    *,
    limit: int | None = None,
    older_than_seconds: float | None = None,
    progress: Progress | None = None,
    paid_window_hours: float | None = None,
    paid_recheck_seconds: float | None = None,
    concurrency: int | None = None,
    account: str | None = None,
) -> ReconcileReport:
    """Poll the due checkouts (at most ``limit``), apply the answers, and report; see the docstrings of
    the modules of ``flask_gateway.operations.reconciliation`` (``run``, ``claiming``, ``pool``, ``answers``).

    ``account``: only that merchant account's checkouts (``UnknownAccountError`` when it is not installed);
    None: every account installed, open or retired.

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
    if account is not None:  # a mistyped account is the caller's error, not a failed run of the job
        get_state().require_installation(account)
    if account is None:
        # Before the checkouts: the check's commits must not expire what the run hands its receivers.
        _check_settings()
    with record_run("reconcile") as run:  # the heartbeat (flask_gateway.payments.heartbeats)
        report = _reconcile_once(
            limit, older_than_seconds, progress, paid_window_hours, paid_recheck_seconds, concurrency, account
        )
        # Not installed: nothing was reconciled, so the job does not do its work (a wrong database?).
        run.done(report.summary(), failed=bool(report.errors) or not report.installed)
    return report


def _check_settings() -> None:
    """The settings check's turn (at most once per ``GATEWAY_SETTINGS_CHECK_SECONDS``); never fails the
    run: what it found is logged (and recorded, announced, shown by the check itself)."""
    try:
        result = scheduled_check()
    except Exception as error:
        with suppress(Exception):  # a dead connection's rollback fails too
            get_state().session.rollback()
        first = (str(error).splitlines() or [""])[0]
        log.warning(
            "reconcile: the gateway's settings could not be checked (%s: %s); the run itself is done",
            type(error).__name__,
            describe_database_error(error) if is_database_outage(error) else first,
        )
        return
    if result.ran:
        log.info("reconcile: %s", result.summary())


def _reconcile_once(
    limit: int | None,
    older_than_seconds: float | None,
    progress: Progress | None,
    paid_window_hours: float | None,
    paid_recheck_seconds: float | None,
    concurrency: int | None,
    account: str | None,
) -> ReconcileReport:
    state = get_state()
    concurrency = state.config.reconcile_concurrency if concurrency is None else concurrency
    session = state.session
    started = utcnow()
    report = ReconcileReport(started_at=started, currency_symbol=state.config.currency_symbol)
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
    every = state.installations()
    installations = [row for row in every if account is None or row.merchant_account_id == account]
    accounts = [installation.merchant_account_id for installation in installations]
    _count_unpolled(report, started, accounts if account is not None else None)
    if not installations:
        if account is not None:  # removed since reconcile() looked
            raise state.unknown_account(account)
        report.installed = False
        session.commit()
        report.finished_at = utcnow()
        return report
    report.accounts = _account_reports(installations, every)
    report.other_account = (
        session.scalar(
            select(func.count())
            .select_from(GatewayCheckout)
            .where(
                GatewayCheckout.status.in_(POLLED_STATUSES),
                ~_of([row.merchant_account_id for row in every]),
            )
        )
        or 0
    )
    passes: list[tuple[ColumnElement[bool], bool]] = [(due(accounts, cutoff, lease_cutoff), False)]
    open_due = _counted(report, passes[0][0], paid=False)
    report.due = min(open_due, limit) if limit is not None else open_due
    if report.paid_window_hours > 0:
        paid_where = _paid_due(
            accounts,
            window_start=started - timedelta(hours=report.paid_window_hours),
            recheck_cutoff=started - recheck,
            lease_cutoff=started - max(recheck, timedelta(seconds=CLAIM_LEASE_SECONDS)),
        )
        passes.append((paid_where, True))
        paid_due = _counted(report, paid_where, paid=True)
        report.paid_due = min(paid_due, limit - report.due) if limit is not None else paid_due
    session.commit()
    total = report.due + report.paid_due
    if progress is not None:
        progress(0, total)
    keys = _keys(installations)
    workers = min(concurrency, total)
    if workers <= 1 or sqlite_in_memory(state.engine):  # one connection: one thread
        _run_in_turn(passes, report, limit, total, progress, keys)
    else:
        _run_concurrently(passes, report, limit, total, progress, keys, workers)
    for name, problem in keys.problems().items():
        report.accounts[name].problem = problem
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


def _account_reports(
    installations: list[Installation], every: list[Installation]
) -> dict[str, AccountReport]:
    """An empty report for each account of the run; ``every``: all installed, oldest first (the default
    account is the newest one still open)."""
    open_ = [row.merchant_account_id for row in every if not row.retired]
    default = open_[-1] if open_ else None
    return {
        row.merchant_account_id: AccountReport(
            row.merchant_account_id, retired=row.retired, default=row.merchant_account_id == default
        )
        for row in installations
    }


def _counted(report: ReconcileReport, where: ColumnElement[bool], *, paid: bool) -> int:
    """The checkouts ``where`` takes (one query), recorded per account; their total."""
    counts = _count_by_account(where)
    for name, count in counts.items():
        if name in report.accounts:
            if paid:
                report.accounts[name].paid_due = count
            else:
                report.accounts[name].due = count
    return sum(counts.values())


def _keys(installations: list[Installation]) -> Keys:
    """Each account's signing key, decrypted here (in memory only); an account whose key cannot be read
    is not asked about (its checkouts fail, the others' are polled)."""
    box = get_state().box
    keys: dict[str, str] = {}
    problems: dict[str, str] = {}
    for row in installations:
        try:
            keys[row.merchant_account_id] = box.decrypt_cached(row.signing_key_encrypted)
        except SecretUnreadable as error:
            problems[row.merchant_account_id] = (
                f"the signing key of account {row.merchant_account_id} cannot be read ({error})"
            )
            log.error("reconcile: the signing key of merchant account %s: %s", row.merchant_account_id, error)
    return Keys(keys, problems)


def _count_unpolled(report: ReconcileReport, now: datetime, accounts: list[str] | None) -> None:
    """The checkouts not polled, counted: stuck in ``CREATING``, v1 (of ``accounts``, or of any)."""
    session = get_state().session
    mine = () if accounts is None else (_of(accounts),)
    report.stuck_creating = list(
        session.scalars(
            select(GatewayCheckout.id)
            .where(
                GatewayCheckout.status == LocalStatus.CREATING.value,
                GatewayCheckout.token.is_(None),
                GatewayCheckout.created_at < now - STUCK_CREATING_AFTER,
                *mine,
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
                *mine,
            )
        )
        or 0
    )
