"""The status page (``/``): installation, masked secrets, counts, setup warnings, drift, callback health,
background work; and "check the settings now". With several merchant accounts (or a retired one), each
account: open or retired, its settings, what is left on it, and its retire or reopen button.

A page of every account (``?account=`` changes nothing): for a person who may see only some accounts
(``access.visible_accounts``), those accounts only, as if the shop had no other."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from flask import flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from flask_gateway.core.outages import describe_database_error, is_database_outage
from flask_gateway.errors import SecretUnreadable, UnknownAccountError
from flask_gateway.models import GatewayCheckout, Installation
from flask_gateway.operations.checks import SetupWarning, setup_warnings
from flask_gateway.operations.drift import DriftReport, check_settings, last_report
from flask_gateway.operations.health import check_callback_health, describe_age
from flask_gateway.payments.accounts import open_checkouts
from flask_gateway.payments.heartbeats import JobStatus, job_status
from flask_gateway.secrets import mask
from flask_gateway.state import GatewayState, get_state
from flask_gateway.web.admin.access import (
    account_from_query,
    default_installation,
    every_account,
    visible_accounts,
    visible_installations,
)
from flask_gateway.web.admin.accounts import accepted_warnings
from flask_gateway.web.admin.blueprint import bp
from flask_gateway.web.admin.inputs import STATUSES
from flask_gateway.web.admin.problems import _EXPECTED, _problem
from flask_gateway.web.forms import ActionForm

_log = logging.getLogger("flask_gateway.admin")


@bp.get("/")
@every_account
def index() -> ResponseReturnValue:
    state = get_state()
    visible = visible_accounts()  # None: every account
    if visible is None:
        # First: it ends its read transaction (and may warn that callbacks went silent: callbacks_silent).
        healths = [check_callback_health()]
        installations = state.installations()
        installation = state.installation()
    else:  # only the accounts this person may see, each one's figures apart
        installations = visible_installations()
        healths = [check_callback_health(account=row.merchant_account_id) for row in installations]
        installation = default_installation(installations)
        installation = None if installation is None or installation.retired else installation
    several = len(installations) > 1 or any(row.retired for row in installations)
    mine = () if visible is None else (GatewayCheckout.merchant_account_id.in_(sorted(visible)),)
    counts = dict(
        state.session.execute(
            select(GatewayCheckout.status, func.count()).where(*mine).group_by(GatewayCheckout.status)
        ).all()
    )
    flagged = state.session.scalar(
        select(func.count()).select_from(GatewayCheckout).where(GatewayCheckout.flagged.is_(True), *mine)
    )
    return render_template(
        "gateway/admin/index.html",
        installation=installation,
        installations=installations,
        # One open account: the page as it always was. Several, or a retired one: each account apart.
        account_views=[_account_view(state, row, installation) for row in installations] if several else [],
        counts=[(status, counts[status]) for status in STATUSES if status in counts]
        + [(status, count) for status, count in counts.items() if status not in STATUSES],
        flagged=flagged or 0,
        secrets=_masked_secrets(state, installation),
        warnings=_warnings(installation, every=visible is None),
        drift=last_report(installation) if installation else None,
        health=healths[0] if healths else None,
        healths=healths,
        # A person who may not see every account: the page's forms and links name the account shown.
        shown_account=installation.merchant_account_id if visible is not None and installation else None,
        describe_age=describe_age,
        background=_background_work(),
        action_form=ActionForm(),
    )


def _warnings(installation: Installation | None, *, every: bool) -> list[SetupWarning]:
    account = installation.merchant_account_id if installation is not None else None
    if every:
        return accepted_warnings(setup_warnings(), account)
    if account is None:
        return setup_warnings(callback="")  # none of this person's accounts is open: the shop's own only
    return accepted_warnings(setup_warnings(account=account), account)


@dataclass(frozen=True)
class AccountView:
    """One merchant account as the status page shows it (several accounts)."""

    installation: Installation
    #: The stored secrets, masked (or ``{"error": ...}``).
    secrets: dict[str, str]
    #: Checkouts not settled yet (paid, cancelled or expired): what is left on a retired account.
    open_checkouts: int
    drift: DriftReport | None
    #: The account a new checkout that names none uses (the newest one still open).
    default: bool


def _account_view(
    state: GatewayState, installation: Installation, default: Installation | None
) -> AccountView:
    return AccountView(
        installation=installation,
        secrets=_masked_secrets(state, installation),
        open_checkouts=open_checkouts(installation.merchant_account_id),
        drift=last_report(installation),
        default=default is not None and default.id == installation.id,
    )


def _background_work() -> list[JobStatus] | None:
    """The heartbeats of deliver and reconcile; None when they cannot be read (the table missing: the
    page says so). A database outage propagates (the outage page)."""
    try:
        return job_status()
    except SQLAlchemyError as error:
        if is_database_outage(error):
            raise
        _log.warning("the heartbeats could not be read: %s", describe_database_error(error))
        return None


@bp.post("/check-settings")
@account_from_query(default_account=True)
def check_settings_now() -> ResponseReturnValue:
    """Compare the gateway's settings with the shop's now (``?account=ID``: that account's, else the default
    account's); the status page shows the answer."""
    account = request.args.get("account") or None
    named = f" of {account}" if account else ""
    try:
        report = check_settings(account) if account else check_settings()
    except UnknownAccountError as error:
        get_state().session.rollback()
        flash(str(error), "error")
    except _EXPECTED as error:
        get_state().session.rollback()
        flash(f"The gateway's settings{named} could not be checked: {_problem(error)}", "error")
    else:
        if report.ok:
            flash(f"The gateway's settings{named} are the shop's.", "success")
        else:
            flash(f"The gateway's settings{named} differ from the shop's: see below.", "error")
    return redirect(url_for(".index"))


def _masked_secrets(state: GatewayState, installation: Installation | None) -> dict[str, str]:
    """The stored secrets, masked (last 4 characters); decrypted only in memory, only to mask them."""
    if installation is None:
        return {}
    try:
        return {
            "api_key": mask(state.box.decrypt(installation.api_key_encrypted)),
            "signing_key": mask(state.box.decrypt(installation.signing_key_encrypted)),
        }
    except SecretUnreadable as error:
        return {"error": str(error)}
