"""The admin screens' blueprint and what runs for every request to it (and to the outbox screen nested in it).

The app's admin guard (``@gateway.admin_guard``; without one every screen answers 403), a valid CSRF token on
every POST (whether or not the app uses ``CSRFProtect``), headers that forbid framing and caching, the
database-outage page, and the template helpers (labels, ``money``, ``when`` in ``GATEWAY_TIMEZONE``).
:func:`viewed_account` tells a guard which merchant account a request looks at. Imports nothing of the
package's screens.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from flask import Blueprint, abort, current_app, g, has_request_context, request
from flask.typing import ResponseReturnValue
from flask_wtf.csrf import CSRFError, validate_csrf
from sqlalchemy import select
from werkzeug.wrappers import Response
from wtforms import ValidationError as FormValidationError

from flask_gateway.clock import format_time
from flask_gateway.core.references import keep_whole
from flask_gateway.labels import (
    api_label,
    callback_outcome_label,
    describe_detail,
    refund_state_label,
    source_label,
    status_label,
)
from flask_gateway.models import CallbackLog, GatewayCheckout, OutboxEvent
from flask_gateway.state import get_state
from flask_gateway.web.forms import format_money
from flask_gateway.web.pages import answer_outages, deny_framing

__all__ = ["bp", "viewed_account"]

bp = Blueprint(
    "gateway_admin",
    __name__,
    template_folder="../templates",
    static_folder="../static",
    static_url_path="/static",
)

_log = logging.getLogger("flask_gateway.admin")

# The outbox screen's blueprint is nested in this one: its requests are answered so too.
answer_outages(bp, pages=lambda: True)


# --- which merchant account a request looks at -------------------------------------------------------

#: Row ids are 32-bit integers on PostgreSQL: a larger one names no row (and must not reach a query).
_MAX_ID = 2**31 - 1
#: ``g`` key of the answer, computed once per request (the guard and the view both ask).
_VIEWED = "_gateway_viewed_account"
_UNSET = object()


def viewed_account() -> str | None:
    """The merchant account id the current admin request looks at, for the app's admin guard.

    The account of the checkout, callback or outbox event the URL names (whatever the query string says);
    else the account of an account's own URL (retire, reopen); else the ``account`` query parameter (the
    account switcher of the lists and of the settings screen); else, on the settings screen, the account it
    edits (the default account). None for the views of every account (the status page, the lists without
    ``?account=``, the install screen), for a row that does not exist or belongs to no checkout, and outside
    an admin request. A guard that lets a brand manager see only their brand::

        @gateway.admin_guard
        def brand_manager_or_owner():
            if current_user.is_owner:
                return True
            if request.endpoint == "gateway_admin.static":  # the screens' stylesheet
                return True
            return viewed_account() == current_user.brand_account  # None (every account): refused

    The value of ``?account=`` is returned as given (it may name no installed account: that page is a 404).
    """
    if not has_request_context() or not (request.blueprint or "").startswith("gateway_admin"):
        return None
    known = g.get(_VIEWED, _UNSET)
    if known is _UNSET:
        known = _find_viewed_account()
        setattr(g, _VIEWED, known)
    return known if isinstance(known, str) else None


def _find_viewed_account() -> str | None:
    args = request.view_args or {}
    rows = {"checkout_id": GatewayCheckout.id, "log_id": CallbackLog.id, "event_id": OutboxEvent.id}
    named = next((name for name in rows if name in args), None)
    if named is not None:
        key = args[named]
        if not isinstance(key, int) or not 0 < key <= _MAX_ID:
            return None
        query = select(GatewayCheckout.merchant_account_id)
        if named == "log_id":
            query = query.join(CallbackLog, CallbackLog.checkout_id == GatewayCheckout.id)
        elif named == "event_id":
            query = query.join(OutboxEvent, OutboxEvent.checkout_id == GatewayCheckout.id)
        found: str | None = get_state().session.scalar(query.where(rows[named] == key))
        return found
    if isinstance(args.get("account"), str):
        return str(args["account"])
    asked = request.args.get("account", "")
    if asked:
        return asked
    if request.endpoint == "gateway_admin.settings_screen":
        return _settings_account()
    return None


def _settings_account() -> str | None:
    """The account the settings screen edits without ``?account=``: the default account (the newest one
    still open), or with every account retired the newest one; None before any installation."""
    state = get_state()
    installation = state.installation()
    if installation is None:
        installations = state.installations()
        installation = installations[-1] if installations else None
    return None if installation is None else installation.merchant_account_id


# --- every request: the guard, CSRF, framing headers -------------------------------------------------


@bp.before_request
def _admit() -> ResponseReturnValue | None:
    guard = get_state().admin_guard.check
    if guard is None:
        _log.warning(
            "gateway admin refused: no admin guard registered (decorate a function with "
            "@gateway.admin_guard, see docs/extension.md)"
        )
        abort(
            403,
            description="The gateway's admin screens are closed: this app has not registered an admin "
            "guard (see the Flask-Gateway docs, docs/extension.md).",
        )
    verdict = guard()
    if isinstance(verdict, Response):
        return verdict  # e.g. a redirect to the app's login page
    if verdict is not True:
        if verdict:  # truthy but not True: fail closed, and tell the developer why
            _log.warning(
                "gateway admin refused: the admin guard returned a %s; return True to allow",
                type(verdict).__name__,
            )
        abort(403, description="You are not allowed to use the gateway's admin screens.")
    _check_csrf()
    return None


def _check_csrf() -> None:
    """Every admin POST carries a valid token, also when the app does not use ``CSRFProtect``."""
    if request.method != "POST" or not current_app.config.get("WTF_CSRF_ENABLED", True):
        return
    if g.get("csrf_valid"):  # CSRFProtect checked this request already
        return
    field = current_app.config.get("WTF_CSRF_FIELD_NAME", "csrf_token")
    token = (
        request.form.get(field) or request.headers.get("X-CSRFToken") or request.headers.get("X-CSRF-Token")
    )
    try:
        validate_csrf(token)
    except FormValidationError as error:
        raise CSRFError(error.args[0]) from None
    g.csrf_valid = True


@bp.after_request
def _framing(response: Response) -> Response:
    deny_framing(response)
    response.headers.setdefault("Referrer-Policy", "same-origin")
    if request.endpoint != "gateway_admin.static":
        response.headers["Cache-Control"] = "no-store"  # customer data and settings: never cached
    return response


#: The labels (flask_gateway.labels) as template globals of the whole app: the admin screens' macros use
#: them, and so may the shop's own templates.
bp.add_app_template_global(status_label, "gateway_status_label")
bp.add_app_template_global(callback_outcome_label, "gateway_outcome_label")
bp.add_app_template_global(source_label, "gateway_source_label")
bp.add_app_template_global(refund_state_label, "gateway_refund_state_label")
bp.add_app_template_global(api_label, "gateway_api_label")


@bp.app_template_global("gateway_detail")
def _detail(text: str | None) -> str:
    """A stored detail line in words and money (``labels.describe_detail``), in the configured currency."""
    return describe_detail(text, get_state().config.currency_symbol)


bp.add_app_template_filter(keep_whole, "whole")


@bp.app_template_global("gateway_time")
def _when(value: datetime | None, seconds: bool = True) -> str:
    """A stored (UTC) time in ``GATEWAY_TIMEZONE`` with the zone's name: ``2026-11-27 13:51:09 SAST``."""
    return format_time(value, get_state().config.zone, seconds=seconds)


@bp.context_processor
def _helpers() -> dict[str, Any]:
    symbol = get_state().config.currency_symbol

    def money(cents: int | None) -> str:
        return format_money(cents, symbol)

    return {"money": money, "when": _when, "gateway_config": get_state().config}
