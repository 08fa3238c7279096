"""The checks that the background work runs: ``reconcile`` (no checkout overdue for reconciliation),
``outbox`` (no event overdue or dead), ``background-work`` (each job's heartbeat against its bound, and
the ``settings-schedule`` finding: a settings check recorded within three of its periods) and ``broker``
(the Celery broker answers).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from flask import current_app
from sqlalchemy import func, or_, select
from sqlalchemy.exc import SQLAlchemyError

from flask_gateway import models
from flask_gateway.clock import format_time
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import GatewayCheckout
from flask_gateway.operations.doctor.report import Finding, Options
from flask_gateway.operations.doctor.wording import _admin
from flask_gateway.operations.reconciliation import CLAIM_LEASE_SECONDS, due
from flask_gateway.payments.heartbeats import (
    JobStatus,
    broker_unreachable,
    job_status,
    mask_url,
    settings_check_status,
)
from flask_gateway.state import get_state

#: A checkout due for reconciliation for longer than this means nothing runs ``flask gateway reconcile``.
RECONCILE_MARGIN: Final = timedelta(hours=1)
#: An outbox event still pending this long after it was due means nothing runs ``flask gateway deliver``.
OUTBOX_MARGIN: Final = timedelta(minutes=15)


# --- the schedules ------------------------------------------------------------------------------------

#: What a development shop is told of a schedule nothing has run yet (an ``info`` finding, not a problem).
_FOR_PRODUCTION: Final = "fine while you develop; in production a schedule must run it"


def _in_production() -> bool:
    return get_state().config.environment == "production"


def _never_ran(status: JobStatus) -> bool:
    """Nothing ever started the job on this shop: no schedule was set up (rather than one that stopped)."""
    return status.last_started_at is None and status.last_finished_at is None


def _unscheduled_here(job: str) -> bool:
    """Outside production, nothing has ever run ``job`` (``deliver``, ``reconcile``): what it left waiting
    is information for the day the shop goes live, not a problem. A schedule that ran and stopped, or
    production, is a problem."""
    if _in_production():
        return False
    try:
        statuses = {status.job: status for status in job_status()}
    except SQLAlchemyError:
        return False
    found = statuses.get(job)
    return found is not None and _never_ran(found)


def _when(value: datetime | None) -> str:
    """A stored time as a person reads it: in ``GATEWAY_TIMEZONE``, with the zone's name."""
    return format_time(value, get_state().config.zone, seconds=False, empty="never")


def check_reconcile_schedule(_options: Options) -> list[Finding]:
    """Checkouts due for reconciliation (as ``flask gateway reconcile`` counts them) an hour ago and still
    not polled: nothing runs it."""
    name = "reconcile"
    state = get_state()
    session = state.session
    # Every account, open and retired: reconciliation asks about each one's checkouts.
    accounts = [row.merchant_account_id for row in state.installations()]
    if not accounts:
        return [Finding(name, "unknown", "not installed: nothing to reconcile (see installation)")]
    now = utcnow()
    older_than = timedelta(seconds=state.config.reconcile_after_seconds)
    # reconciliation's own definition of "due" (``reconciliation.due``, reused so that the two never
    # disagree), an hour back: due for more than an hour and still not polled.
    overdue = or_(
        *(
            due(
                account,
                now - older_than - RECONCILE_MARGIN,
                now - max(older_than, timedelta(seconds=CLAIM_LEASE_SECONDS)) - RECONCILE_MARGIN,
            )
            for account in accounts
        )
    )
    count, oldest = session.execute(
        select(func.count(), func.min(GatewayCheckout.updated_at)).where(overdue)
    ).one()
    last_poll = session.scalar(select(func.max(GatewayCheckout.last_polled_at)))
    if count and _unscheduled_here("reconcile"):
        return [
            Finding(
                name,
                "info",
                f"{count} open checkout(s) have waited for reconciliation for over "
                f"{_duration(RECONCILE_MARGIN)} (the oldest unchanged since {_when(oldest)}): nothing has "
                f"run flask gateway reconcile on this shop yet ({_FOR_PRODUCTION})",
                "run flask gateway reconcile to ask the gateway about them now; in production, every 5 "
                "minutes (docs/operations.md#scheduling-reconciliation)",
            )
        ]
    if count:
        return [
            Finding(
                name,
                "problem",
                f"{count} open checkout(s) have been due for reconciliation (unchanged and unpolled for "
                f"GATEWAY_RECONCILE_AFTER_SECONDS={state.config.reconcile_after_seconds}) for over "
                f"{_duration(RECONCILE_MARGIN)}, the oldest unchanged since {_when(oldest)}; the last "
                f"poll of any checkout: {_when(last_poll)}. Nothing runs flask gateway reconcile, so "
                "payments whose callback was lost stay unpaid in the shop.",
                "run flask gateway reconcile now, and schedule it every 5 minutes (cron: */5 * * * * cd "
                "/srv/shop && flask --app shop gateway reconcile --quiet; "
                "docs/operations.md#scheduling-reconciliation)",
            )
        ]
    return [
        Finding(
            name,
            "ok",
            f"no checkout has waited for reconciliation longer than {_duration(RECONCILE_MARGIN)} "
            f"(last poll: {_when(last_poll)})",
        )
    ]


def _duration(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    if minutes % 60:
        return f"{minutes} minutes"
    return "an hour" if minutes == 60 else f"{minutes // 60} hours"


def check_outbox_schedule(_options: Options) -> list[Finding]:
    """Pending outbox events long past their attempt time (nothing runs ``flask gateway deliver``), and
    dead ones; ``unknown`` in a version without the outbox."""
    name = "outbox"
    state = get_state()
    event = getattr(models, "OutboxEvent", None)
    if event is None:
        return [Finding(name, "unknown", "this version of Flask-Gateway has no outbox: nothing to check")]
    session = state.session
    now = utcnow()
    try:
        pending, oldest = session.execute(
            select(func.count(), func.min(event.next_attempt_at)).where(
                event.state == "pending", event.next_attempt_at < now - OUTBOX_MARGIN
            )
        ).one()
        dead = session.scalar(select(func.count()).select_from(event).where(event.state == "dead")) or 0
    except SQLAlchemyError as error:
        return [Finding(name, "unknown", f"the outbox cannot be read ({type(error).__name__}; see database)")]
    outbox_screen = _admin(state, "outbox")
    findings = []
    if pending and _unscheduled_here("deliver"):
        findings.append(
            Finding(
                name,
                "info",
                f"{pending} outbox event(s) have waited over {_duration(OUTBOX_MARGIN)} past their attempt "
                f"(the oldest due since {_when(oldest)}): nothing has run flask gateway deliver on this shop "
                f"yet ({_FOR_PRODUCTION})",
                "run flask gateway deliver to deliver them now; in production, every minute or as a service "
                "(docs/operations.md)",
            )
        )
    elif pending:
        findings.append(
            Finding(
                name,
                "problem",
                f"{pending} outbox event(s) are overdue by more than {_duration(OUTBOX_MARGIN)} (the oldest "
                f"due since {_when(oldest)}): nothing runs flask gateway deliver, so the shop's receivers "
                "(payment_confirmed: fulfilment) wait.",
                "run flask gateway deliver now, and schedule it every minute (docs/operations.md)",
            )
        )
    if dead:
        findings.append(
            Finding(
                name,
                "problem",
                f"{dead} outbox event(s) are dead: every delivery to the shop's receivers failed, so their "
                "work (a fulfilment, say) was never done.",
                f"read their last error on {outbox_screen}, fix the receiver, then deliver them again there",
            )
        )
    return findings or [
        Finding(name, "ok", f"no outbox event overdue by more than {_duration(OUTBOX_MARGIN)}, none dead")
    ]


# --- the background work's heartbeats ------------------------------------------------------------------

_DOCS_BACKGROUND: Final = "docs/operations.md#is-the-background-work-running"
#: How to get each job running again.
_JOB_FIX: Final = {
    "deliver": "schedule flask gateway deliver every minute (cron, with the same environment as the web "
    "workers) or run flask gateway deliver --every 5 as a service; with Celery, start the worker and beat "
    "(the task flask_gateway.deliver_outbox) and check their broker",
    "reconcile": "schedule flask gateway reconcile every 5 minutes (cron, with the same environment as the "
    "web workers); with Celery, start the worker and beat (the task flask_gateway.reconcile) and check "
    "their broker",
}
#: The longest wait for the broker (whatever ``--timeout`` says).
BROKER_TIMEOUT: Final = 5.0


def check_background_work(_options: Options) -> list[Finding]:
    """Each job's heartbeat (:mod:`flask_gateway.payments.heartbeats`): how long ago it ran, what it said,
    whether that is past its bound."""
    name = "background-work"
    try:
        statuses = job_status()
    except SQLAlchemyError as error:
        return [
            Finding(
                name,
                "unknown",
                f"the heartbeats cannot be read ({type(error).__name__}): see the database finding",
                f"run the migrations or flask gateway init-db ({_DOCS_BACKGROUND})",
            )
        ]
    return [_background_finding(name, status) for status in statuses] + _settings_schedule()


#: How to get the settings check running again.
_SETTINGS_FIX: Final = (
    "schedule flask gateway reconcile every 5 minutes (each run checks the settings, at most once per "
    "GATEWAY_SETTINGS_CHECK_SECONDS) or flask gateway check-settings from cron; with Celery, start beat "
    "(the task flask_gateway.check_settings) and the worker (docs/operations.md#settings-drift)"
)


def _settings_schedule() -> list[Finding]:
    """The settings check (``flask_gateway.operations.drift``): did a schedule run it within three of its
    periods? Its own finding, ``settings-schedule``."""
    name = "settings-schedule"
    try:
        status = settings_check_status()
    except SQLAlchemyError as error:
        return [
            Finding(
                name,
                "unknown",
                f"the settings check's record cannot be read ({type(error).__name__}): see the database "
                "finding",
                f"run the migrations or flask gateway init-db ({_DOCS_BACKGROUND})",
            )
        ]
    if status.installed_at is None:
        return [Finding(name, "ok", "not installed: no gateway settings to check")]
    read_it = (
        "run flask gateway check-settings to see why, and fix its cause (docs/operations.md#settings-drift)"
    )
    if status.overdue and _never_ran(status) and not _in_production():
        return [
            Finding(
                name,
                "info",
                f"{status.describe()}: nothing has run it yet ({_FOR_PRODUCTION})",
                _SETTINGS_FIX,
            )
        ]
    if status.overdue:
        if status.age is not None and status.age <= status.bound:  # it runs, but fails
            return [
                Finding(
                    name, "problem", f"{status.describe()}: it runs but has not succeeded lately", read_it
                )
            ]
        return [
            Finding(
                name,
                "problem",
                f"{status.describe()}: no schedule runs it, so a callback URL diverted at the gateway stays "
                "diverted until someone looks",
                _SETTINGS_FIX,
            )
        ]
    if status.last_finished_at is None:
        return [Finding(name, "unknown", f"{status.describe()} (too soon to tell)", _SETTINGS_FIX)]
    if status.last_outcome != "ok":
        return [Finding(name, "warn", status.describe(), read_it)]
    return [Finding(name, "ok", status.describe())]


def _background_finding(name: str, status: JobStatus) -> Finding:
    schedule = f"{_JOB_FIX[status.job]} ({_DOCS_BACKGROUND})"
    read_it = f"read the summary and the log of the run, and fix its cause ({_DOCS_BACKGROUND})"
    runs_but_fails = status.age is not None and status.age <= status.bound and status.last_outcome != "ok"
    if status.overdue and _never_ran(status) and not _in_production():
        return Finding(
            name, "info", f"{status.job}: nothing has run it on this shop yet ({_FOR_PRODUCTION})", schedule
        )
    if status.overdue:
        return Finding(
            name,
            "problem",
            f"{status.describe()}: "
            + (
                "it runs but has not succeeded lately"
                if runs_but_fails
                else "nothing runs it (or its runs cannot record themselves)"
            ),
            read_it if runs_but_fails else schedule,
        )
    if status.last_finished_at is None:  # not overdue yet: too soon to tell whether anything runs it
        why = "the gateway is not installed" if status.installed_at is None else "too soon to tell"
        return Finding(name, "unknown", f"{status.describe()} ({why})", schedule)
    if status.last_outcome != "ok":
        return Finding(name, "warn", status.describe(), read_it)
    return Finding(name, "ok", status.describe())


def check_broker(options: Options) -> list[Finding]:
    """The Celery broker (``app.config["CELERY"]["broker_url"]``) answers; nothing to check without one."""
    name = "broker"
    url = (current_app.config.get("CELERY") or {}).get("broker_url")
    if not url:
        return [Finding(name, "ok", "no Celery broker configured (CELERY broker_url): nothing to check")]
    shown = mask_url(str(url))
    why = broker_unreachable(str(url), timeout=min(options.timeout, BROKER_TIMEOUT))
    if why is None:
        return [Finding(name, "ok", f"the Celery broker at {shown} answers")]
    return [
        Finding(
            name,
            "problem",
            f"the Celery broker at {shown} does not answer ({why}): beat sends no task and the worker "
            "runs none, so nothing delivers the outbox or reconciles",
            f"start the broker (e.g. systemctl start redis-server) or fix CELERY broker_url; the worker and "
            f"beat reconnect by themselves once it answers ({_DOCS_BACKGROUND})",
        )
    ]
