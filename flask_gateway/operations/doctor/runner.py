"""Run every check of ``flask gateway doctor`` (:data:`CHECKS`, in order) and collect their findings.

With several merchant accounts, the per-account findings (``public-url``, ``installation``, ``settings``,
``callback``) each name their account; a shop with one account gets the findings it always got.

Every check is a small function that returns :class:`Finding` objects (the check's name, ``ok``, ``warn``,
``problem`` or ``unknown``, what is true or wrong, and how to fix it, naming the config key or the docs
page). :func:`run_checks` runs them all, one after the other, and never stops at one that fails. Every
finding that is not ``ok`` has a fix (a finding that names none gets its check's :attr:`Check.fix`).

A database without the gateway's tables (or some of them, or their columns; or a database that cannot be
read) is one finding, ``database``'s, with its fix: the checks that read the tables (``Check.tables``) are
not run, and that finding names them, instead of each failing on "no such table".

==================  =======================================================================================
``configuration``   the environment and its URLs, ``GATEWAY_PUBLIC_URL`` (set, https), ``SECRET_KEY`` (set,
                    not a development placeholder), ``GATEWAY_ENCRYPTION_KEY``, the API version, the
                    embedded emulator (development only)
``public-url``      the public URL and the installed callback URL against the gateway's firewall
                    (:func:`flask_gateway.operations.checks.setup_warnings`, the same warnings as the admin
                    screens)
``csrf``            an unsigned POST to the callback, without a CSRF token, gets through the app's own
                    ``before_request`` hooks (Flask-WTF's ``CSRFProtect``, a login wall) to the extension
``database``        every ``gateway_*`` table and column exists (migrations run)
``installation``    installed for this environment; each account's stored API key and signing key decrypt;
                    a retired account with its open checkouts; a problem when every account is retired
``settings``        (network) the gateway's settings are the shop's (``drift.check_settings``), each
                    account's
``callback``        (network) the callback answers at its public URL with the extension's own refusal of an
                    unsigned request (401 ``{"message": ...}``), not a proxy's 404, 502 or login page; the
                    probe is marked (``X-Gateway-Doctor-Probe``, an HMAC with a key derived from
                    ``SECRET_KEY``) so the shop records it as ``doctor-probe``, not as a refused callback;
                    with several accounts, each callback URL they were given (``/callback/<account>``)
``reconcile``       no checkout (of any account) due for reconciliation has waited more than an hour:
                    something runs ``flask gateway reconcile``
``outbox``          no outbox event overdue by more than 15 minutes (something runs ``flask gateway
                    deliver``) and none dead; ``unknown`` in a version without the outbox
``background-work`` each job's heartbeat (:mod:`flask_gateway.payments.heartbeats`): how long ago ``deliver``
                    and ``reconcile`` last ran, what they said, and whether that is past
                    ``GATEWAY_DELIVER_STALE_SECONDS`` / ``GATEWAY_RECONCILE_STALE_SECONDS``
``broker``          the Celery broker (``CELERY["broker_url"]``) answers within 5 seconds (password masked)
``readiness``       ``GET /gateway/readyz`` would answer 200 (database, schema, installation:
                    :mod:`flask_gateway.operations.readiness`), else a load balancer keeps the shop out;
                    names the liveness and readiness probe URLs either way
``package``         ``flask-bnpl-gateway`` is the only installed distribution that provides ``flask_gateway``
                    (not also the index's unrelated ``flask-gateway``), at the version that runs
==================  =======================================================================================

Side effects, all harmless: the ``csrf`` check runs the app's ``before_request`` hooks for a test request
(the callback's view is not called). ``settings`` sends the same settings update that changes nothing as
``flask gateway check-settings`` and records its result. ``callback`` leaves one row in the callback log,
``doctor-probe`` (User-Agent ``flask-gateway-doctor``): no refused callback, no ``callback_rejected``. A shop
whose ``SECRET_KEY`` differs from the doctor's (another environment) records it as ``rejected-signature``.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import nullcontext, suppress
from dataclasses import dataclass, replace
from typing import Final

import requests
from sqlalchemy.exc import SQLAlchemyError

from flask_gateway.core.sql import sqlite_read_transactions
from flask_gateway.operations.doctor.configuration import check_configuration, check_csrf, check_public_url
from flask_gateway.operations.doctor.database import check_database, check_installation, check_readiness
from flask_gateway.operations.doctor.gateway import check_callback_reachable, check_gateway_settings
from flask_gateway.operations.doctor.package import check_package
from flask_gateway.operations.doctor.report import DEFAULT_TIMEOUT, DoctorReport, Finding, Options
from flask_gateway.operations.doctor.schedules import (
    check_background_work,
    check_broker,
    check_outbox_schedule,
    check_reconcile_schedule,
)
from flask_gateway.operations.doctor.wording import _first_line
from flask_gateway.operations.readiness import missing_schema
from flask_gateway.state import GatewayState, get_state, misconfiguration


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Options], list[Finding]]
    #: Calls the gateway or the shop's public URL: skipped with ``--no-network``.
    network: bool = False
    #: Only reads the database (SQLite: read transactions, no write lock).
    reads: bool = True
    #: Reads the gateway's tables: not run while the ``database`` check finds them missing (its finding
    #: names the checks it skipped).
    tables: bool = True
    #: The fix of a finding of this check that names none of its own.
    fix: str = ""


def run_checks(
    *, network: bool = True, timeout: float = DEFAULT_TIMEOUT, http: requests.Session | None = None
) -> DoctorReport:
    """Run every check in :data:`CHECKS` (in an app context) and report; ``network=False`` skips those that
    call the gateway or the shop's public URL (``unknown``). One check that fails does not stop the rest."""
    options = Options(timeout=timeout, http=http)
    report = DoctorReport()
    deferred = misconfiguration()
    if deferred is not None:  # init_app could not read the configuration: nothing else can be checked
        report.findings.append(
            Finding(
                "configuration",
                "problem",
                " ".join(deferred.message.split()),
                "change it in the app's configuration (docs/configuration.md describes every key), then "
                "run flask gateway doctor again",
            )
        )
        return report
    state = get_state()
    waiting = _tables_waiting(state)
    _end_transaction(state)
    skipped: list[str] = []
    for check in CHECKS:
        if check.tables and waiting:
            skipped.append(check.name)
            continue
        if check.network and not network:
            report.findings.append(
                Finding(
                    check.name,
                    "unknown",
                    "skipped (--no-network): run without it to check",
                    "run flask gateway doctor without --no-network on a machine that reaches the gateway "
                    "and the shop's public URL (GATEWAY_PUBLIC_URL)",
                )
            )
            continue
        try:
            with sqlite_read_transactions() if check.reads else nullcontext():
                found = check.run(options)
        except Exception as error:  # one check that breaks must not hide the others' findings
            found = [
                Finding(
                    check.name,
                    "unknown",
                    f"the check could not run: {type(error).__name__}: {_first_line(error)}",
                    "read the message; if it names nothing of your setup, report it as a bug",
                )
            ]
        finally:
            _end_transaction(state)
        report.findings.extend(_with_fix(check, finding) for finding in found)
    if waiting:
        report.findings = [_naming_skipped(finding, skipped, waiting) for finding in report.findings]
    return report


def _tables_waiting(state: GatewayState) -> str:
    """What the checks that read the gateway's tables wait for ("" when every table and column exists)."""
    try:
        return "the tables exist" if missing_schema(state.db.engine) else ""
    except SQLAlchemyError:
        return "the database can be read"


def _with_fix(check: Check, finding: Finding) -> Finding:
    if finding.level == "ok" or finding.fix.strip() or not check.fix:
        return finding
    return replace(finding, fix=check.fix)


def _naming_skipped(finding: Finding, skipped: list[str], waiting: str) -> Finding:
    """The ``database`` problem says which checks it kept from running."""
    if finding.check != "database" or finding.level != "problem":
        return finding
    return replace(finding, message=f"{finding.message} Skipped until {waiting}: {', '.join(skipped)}.")


def _end_transaction(state: GatewayState) -> None:
    """No transaction of the doctor's stays open between checks (SQLite: no lock while HTTP is sent)."""
    with suppress(SQLAlchemyError):
        state.session.rollback()


#: Every check, in the order the command prints them.
CHECKS: Final[tuple[Check, ...]] = (
    Check("configuration", check_configuration, tables=False),
    Check("public-url", check_public_url),
    Check("csrf", check_csrf, reads=False, tables=False),
    Check("database", check_database, tables=False),
    Check("installation", check_installation),
    Check("settings", check_gateway_settings, network=True, reads=False),
    Check("callback", check_callback_reachable, network=True, reads=False),
    Check(
        "reconcile",
        check_reconcile_schedule,
        fix="once the gateway is installed (see installation), schedule flask gateway reconcile every 5 "
        "minutes (docs/operations.md#scheduling-reconciliation)",
    ),
    Check(
        "outbox",
        check_outbox_schedule,
        fix="once the gateway's tables exist (see database), schedule flask gateway deliver every minute "
        "(docs/operations.md#the-outbox-events-for-the-shops-code)",
    ),
    Check(
        "background-work",
        check_background_work,
        fix="schedule flask gateway deliver and reconcile, or start the Celery worker and beat "
        "(docs/operations.md#is-the-background-work-running)",
    ),
    Check(
        "broker",
        check_broker,
        reads=False,
        tables=False,
        fix="start the broker or fix CELERY broker_url (docs/operations.md#is-the-background-work-running)",
    ),
    Check("readiness", check_readiness),
    Check("package", check_package, reads=False, tables=False),
)
