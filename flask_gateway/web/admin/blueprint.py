"""The admin screens' blueprint and what runs for every request to it (and to the outbox screen nested in it).

The app's admin guard (``@gateway.admin_guard``; without one every screen answers 403), a valid CSRF token on
every POST (whether or not the app uses ``CSRFProtect``), headers that forbid framing and caching, the
database-outage page, and the template helpers (labels, ``money``, ``when`` in ``GATEWAY_TIMEZONE``).
One merchant account per request (``access``): each view declares the account it acts on, the guard is
told it (:func:`viewed_account`), and a request for an account the person may not see is a 404. Imports
nothing of the package's screens.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from flask import Blueprint, abort, current_app, g, redirect, request, url_for
from flask.typing import ResponseReturnValue
from flask_wtf.csrf import CSRFError, validate_csrf
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
from flask_gateway.state import get_state
from flask_gateway.web.admin.access import (
    AccountSource,
    acts_on_one_account,
    ask_guard,
    declaration,
    default_installation,
    nav_account,
    viewed_account,
    visible_accounts,
)
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
    source = declaration(request.endpoint)
    if source is None:  # fail closed: a view that does not say which account it acts on
        _log.error(
            "gateway admin refused: the admin view %s does not declare the merchant account it acts on "
            "(flask_gateway.web.admin.access)",
            request.endpoint,
        )
        abort(403, description="This admin screen does not say which merchant account it acts on.")
    verdict = ask_guard(guard, viewed_account())
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
    return _keep_to_visible(source)


def _keep_to_visible(source: AccountSource) -> ResponseReturnValue | None:
    """A request for one account the person may not see is answered as one for an account or row that
    does not exist (404), never naming it. The settings screen without ``?account=`` (the default account)
    goes to the newest account the person may see instead."""
    visible = visible_accounts()
    if visible is None or not acts_on_one_account(source):
        return None
    account = viewed_account()
    if account is not None and account in visible:
        return None
    if source.kind == "row":
        what = {"checkout_id": "checkout", "log_id": "callback", "event_id": "outbox event"}[source.name]
        abort(404, description=f"There is no {what} #{(request.view_args or {}).get(source.name)}.")
    if source.kind == "query" and source.default_account and not request.args.get("account"):
        mine = default_installation()
        if mine is not None and request.method == "GET":
            values: dict[str, Any] = {**(request.view_args or {}), **request.args.to_dict()}
            values["account"] = mine.merchant_account_id
            return redirect(url_for(str(request.endpoint), **values))
    yours = ", ".join(sorted(visible)) or "none"
    return abort(
        404,
        description="That merchant account is not installed here, or is not one you may see "
        f"(yours: {yours}).",
    )


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

    return {
        "money": money,
        "when": _when,
        "gateway_config": get_state().config,
        "gateway_nav_account": nav_account,
    }
