"""The banner of every admin page while a settings incident is open, and its "Acknowledge" button.

The scheduled settings check (``flask_gateway.operations.drift``) records each setting it found changed at
the gateway (``gateway_settings_incidents``): the foreign value, when it was found, and whether the shop put
its own back or stopped because someone fights the repair (an attack). Until a person acknowledges them,
``gateway/admin/_drift_banner.html`` (included by ``layout.html``) shows them on every admin page. The
query runs only when a page that includes the banner is rendered (``gateway_drift_banner()``, a template
helper), once per request; a database that cannot answer it (the table missing: the migrations not run)
shows no banner rather than breaking the page. Acknowledging is a POST with the CSRF token, like every
admin form; it names the incidents shown, so one found after the page was drawn stays open.

One account per request (``access``): a page about one account shows that account's incidents, a page of
every account those of the accounts the person may see; acknowledging (``?account=ID``, else every account
the person may see) acknowledges only those.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import urlsplit

from flask import flash, g, redirect, request, url_for
from flask.typing import ResponseReturnValue
from sqlalchemy.exc import SQLAlchemyError

from flask_gateway.clock import format_time
from flask_gateway.core.outages import describe_database_error, is_database_outage
from flask_gateway.models import SettingsIncident
from flask_gateway.operations.drift import ATTACK, REPAIR_FAILED, acknowledge_incidents, open_incidents
from flask_gateway.state import get_state
from flask_gateway.web.admin.access import account_from_query, request_accounts
from flask_gateway.web.admin.blueprint import bp
from flask_gateway.web.forms import ActionForm

__all__ = ["Banner", "acknowledge_settings_incidents"]

_log = logging.getLogger("flask_gateway.admin")

#: The longest name kept for "acknowledged by".
NAME_LENGTH: Final = 100
#: ``g`` key of the banner, computed once per request.
_BANNER = "_gateway_drift_banner"


@dataclass
class Banner:
    """What the banner shows: the open incidents, oldest first."""

    incidents: list[SettingsIncident] = field(default_factory=list)

    @property
    def attack(self) -> bool:
        """Someone fights the repair: a setting is left diverted until a person acknowledges."""
        return any(incident.outcome == ATTACK for incident in self.incidents)

    @property
    def failed(self) -> bool:
        return any(incident.outcome == REPAIR_FAILED for incident in self.incidents)

    @property
    def state(self) -> str:
        """``attack``, ``repair-failed`` or ``repaired``: the banner's ``data-drift-banner``."""
        return "attack" if self.attack else REPAIR_FAILED if self.failed else "repaired"

    def __bool__(self) -> bool:
        return bool(self.incidents)


def _banner() -> Banner:
    """The open incidents, read once per request; none when they cannot be read (never breaks a page)."""
    known = g.get(_BANNER)
    if isinstance(known, Banner):
        return known
    try:
        accounts = request_accounts()  # the page's account, or those the person may see (None: every one)
        banner = Banner(open_incidents(accounts=accounts) if accounts is None or accounts else [])
    except SQLAlchemyError as error:
        get_state().session.rollback()
        log = _log.debug if is_database_outage(error) else _log.warning
        log("the settings incidents could not be read for the banner: %s", describe_database_error(error))
        banner = Banner()
    setattr(g, _BANNER, banner)
    return banner


@bp.context_processor
def _drift_banner_helpers() -> dict[str, Any]:
    def when_here(value: Any) -> str:
        return format_time(value, get_state().config.zone)

    return {
        "gateway_drift_banner": _banner,
        "gateway_drift_form": ActionForm,
        "gateway_drift_when": when_here,
    }


@bp.post("/settings-incidents/acknowledge")
@account_from_query()
def acknowledge_settings_incidents() -> ResponseReturnValue:
    """A person has read the banner: the incidents it showed (``incident`` fields) of the request's accounts
    are acknowledged, by the name given (else the address the request came from), and the page is shown
    again."""
    ids = [int(value) for value in request.form.getlist("incident") if value.isdigit() and len(value) < 10]
    name = " ".join(request.form.get("by", "").split())[:NAME_LENGTH]
    by = name or f"an admin at {request.remote_addr or 'an unknown address'}"
    if not ids:
        flash("Nothing to acknowledge: the banner named no incident.", "error")
    else:
        count = acknowledge_incidents(by, ids, accounts=request_accounts())
        if count:
            flash(
                f"Acknowledged {count} settings incident(s). A setting left alone as under attack is put "
                "back by the next check.",
                "success",
            )
        else:
            flash("Those incidents were acknowledged already.", "info")
    return redirect(_back())


def _back() -> str:
    """The admin page the banner was on (``next``: a path under the admin screens), else the status page."""
    target = request.form.get("next", "")
    home = url_for("gateway_admin.index")
    parts = urlsplit(target)
    if parts.scheme or parts.netloc or "\\" in target or not target.startswith(home.rstrip("/") + "/"):
        return home
    return target
