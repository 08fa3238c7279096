"""The admin screens: status, install, settings, checkouts (list, detail, refresh, cancel, refund), callbacks.

Registered at ``GATEWAY_URL_PREFIX + "/admin"``. Every request first passes the app's admin guard
(``@gateway.admin_guard``; without one every screen answers 403), every POST needs a valid CSRF token
(whether or not the app uses ``CSRFProtect``), and every answer forbids framing.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Final

from flask import Blueprint, abort, current_app, flash, g, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from flask_wtf.csrf import CSRFError, validate_csrf
from pydantic import ValidationError as ModelValidationError
from sqlalchemy import false, func, or_, select
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.wrappers import Response
from wtforms import ValidationError as FormValidationError

from flask_gateway.checkouts import cancel_checkout as cancel_checkout_at_gateway
from flask_gateway.checks import setup_warnings
from flask_gateway.core.errors import (
    AlreadyInstalledError,
    AuthenticationError,
    GatewayConnectionError,
    GatewayError,
    GatewayServerError,
)
from flask_gateway.core.outages import describe_database_error, is_database_outage
from flask_gateway.core.wire import CHANGEABLE_STATUSES, REFUNDABLE_STATUSES, CheckoutStatus
from flask_gateway.drift import check_settings, last_report
from flask_gateway.errors import CallbackRejected, NotInstalledError, SecretUnreadable
from flask_gateway.forms import (
    ActionForm,
    AmountField,
    InstallForm,
    RefundForm,
    SettingsForm,
    format_amount,
    format_money,
)
from flask_gateway.health import REFUSED, check_callback_health, describe_age
from flask_gateway.heartbeats import JobStatus, job_status
from flask_gateway.inbound import replay_callback
from flask_gateway.installation import InstallSettings, adopt_signing_key, install, update_settings
from flask_gateway.labels import (
    callback_outcome_label,
    refund_state_label,
    source_label,
    status_label,
)
from flask_gateway.models import CallbackLog, CallbackOutcome, GatewayCheckout, Installation, LocalStatus
from flask_gateway.polling import refresh
from flask_gateway.refunds import refund
from flask_gateway.secrets import mask
from flask_gateway.state import GatewayState, get_state
from flask_gateway.urls import callback_url
from flask_gateway.views import answer_outages, deny_framing

__all__ = ["bp"]

bp = Blueprint(
    "gateway_admin",
    __name__,
    template_folder="../../templates",
    static_folder="../../static",
    static_url_path="/static",
)

_log = logging.getLogger("flask_gateway.admin")

# The outbox screen's blueprint is nested in this one: its requests are answered so too.
answer_outages(bp, pages=lambda: True)

PER_PAGE: Final = 25
#: Page numbers past this are this (an offset the database cannot take would be a 500).
MAX_PAGE: Final = 100_000
#: Row ids are 32-bit integers on PostgreSQL: a larger one names no row (404, not a 500).
MAX_ID: Final = 2**31 - 1
#: Every status a checkout can have here, in the order the list's filter offers them.
STATUSES: Final = (
    *(s.value for s in CheckoutStatus),
    *(s.value for s in LocalStatus),
)
#: The outcomes a callback log row can have, for the callback log's filter.
CALLBACK_OUTCOMES: Final = tuple(o.value for o in CallbackOutcome)
#: What an action can raise that the owner should read (anything else is a bug: a 500 and a log line).
_EXPECTED: Final = (GatewayError, ValueError, NotInstalledError, SecretUnreadable)


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


@bp.context_processor
def _helpers() -> dict[str, Any]:
    symbol = get_state().config.currency_symbol

    def money(cents: int | None) -> str:
        return format_money(cents, symbol)

    return {"money": money, "when": _when, "gateway_config": get_state().config}


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S UTC") if value else "-"


# --- status --------------------------------------------------------------------------------------------


@bp.get("/")
def index() -> ResponseReturnValue:
    state = get_state()
    # First: it ends its read transaction (and may warn that callbacks went silent: callbacks_silent).
    health = check_callback_health()
    installation = state.installation()
    counts = dict(
        state.session.execute(
            select(GatewayCheckout.status, func.count()).group_by(GatewayCheckout.status)
        ).all()
    )
    flagged = state.session.scalar(
        select(func.count()).select_from(GatewayCheckout).where(GatewayCheckout.flagged.is_(True))
    )
    return render_template(
        "gateway/admin/index.html",
        installation=installation,
        secrets=_masked_secrets(state, installation),
        counts=[(status, counts[status]) for status in STATUSES if status in counts]
        + [(status, count) for status, count in counts.items() if status not in STATUSES],
        flagged=flagged or 0,
        warnings=setup_warnings(),
        drift=last_report(installation) if installation else None,
        health=health,
        describe_age=describe_age,
        background=_background_work(),
        action_form=ActionForm(),
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
def check_settings_now() -> ResponseReturnValue:
    """Compare the gateway's settings with the shop's now; the status page shows the answer."""
    try:
        report = check_settings()
    except _EXPECTED as error:
        get_state().session.rollback()
        flash(f"The gateway's settings could not be checked: {_problem(error)}", "error")
    else:
        if report.ok:
            flash("The gateway's settings are the shop's.", "success")
        else:
            flash("The gateway's settings differ from the shop's: see below.", "error")
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


# --- install and settings ------------------------------------------------------------------------------


def _settings_from(form: InstallForm) -> InstallSettings:
    return InstallSettings(
        merchant_account_id=form.merchant_account_id.data,
        api_key=form.api_key.data,
        callback_url=form.callback_url.data,
        callback_failures_email=form.callback_failures_email.data or None,
        minimum_cents=_cents(form.minimum_amount),
        maximum_cents=_cents(form.maximum_amount),
    )


def _cents(field: AmountField) -> int:
    """A validated amount field's cents (its validators made sure there is one)."""
    if not isinstance(field.data, int):
        raise TypeError(f"{field.name} was not validated")
    return field.data


def _fill_settings(form: SettingsForm, installation: Installation | None) -> None:
    """Prefill from the installation; the callback URL always from this app's own callback route."""
    form.callback_url.data = callback_url()
    if installation is not None:
        form.callback_failures_email.data = installation.callback_failures_email or ""
        form.minimum_amount.data = installation.minimum_cents
        form.maximum_amount.data = installation.maximum_cents


@bp.route("/install", methods=["GET", "POST"])
def install_screen() -> ResponseReturnValue:
    state = get_state()
    installation = state.installation()
    form = InstallForm()
    if request.method == "GET":
        _fill_settings(form, installation)
        if installation is not None:
            form.merchant_account_id.data = installation.merchant_account_id
    warnings = setup_warnings(form.callback_url.data)
    already_installed: str | None = None
    adopting = False
    if form.validate_on_submit():
        adopting = bool(form.signing_key.data)
        if warnings and not form.confirm_local.data:
            form.confirm_local.errors.append(
                "Tick this box to install with this address anyway, or fix the address first."
            )
        else:
            settings = _settings_from(form)
            state.session.commit()  # no transaction (SQLite: no write lock) while the gateway answers
            try:
                if adopting:
                    adopt_signing_key(settings, form.signing_key.data)
                else:
                    install(settings)
            except AlreadyInstalledError as error:
                already_installed = error.message
            except AuthenticationError as error:
                flash(_refused_credentials(error, adopting=adopting), "error")
            except ModelValidationError as error:
                flash(f"The settings were not sent: {_problem(error)}", "error")
            except (GatewayConnectionError, GatewayServerError) as error:
                flash(
                    f"No usable answer from the gateway ({_problem(error)}); nothing was stored. Try "
                    "again. If the gateway did install the account, it now answers “already installed”: "
                    "ask the gateway's account manager for the signing key, or to reset the installation.",
                    "error",
                )
            except GatewayError as error:
                flash(f"The gateway refused the installation: {_problem(error)}", "error")
            else:
                _log.info(
                    "gateway %s for merchant account %s (%s)",
                    "signing key adopted" if adopting else "installed",
                    settings.merchant_account_id,
                    state.config.environment,
                )
                flash(
                    "The gateway is installed. The signing key is stored encrypted; only its last 4 "
                    "characters are ever shown.",
                    "success",
                )
                return redirect(url_for(".index"))
    return render_template(
        "gateway/admin/install.html",
        form=form,
        installation=installation,
        warnings=warnings,
        already_installed=already_installed,
        adopt_open=already_installed is not None or adopting,
    )


def _refused_credentials(error: AuthenticationError, *, adopting: bool) -> str:
    if adopting:
        return (
            "The gateway did not accept this signing key for the merchant account "
            f"({_problem(error)}). Copy the key you received at the first installation again, whole, "
            "and check the merchant account id."
        )
    return (
        "The gateway refused the merchant account id or API key "
        f"({_problem(error)}). Check both against what the account manager issued for this environment "
        f"({get_state().config.environment})."
    )


@bp.route("/settings", methods=["GET", "POST"])
def settings_screen() -> ResponseReturnValue:
    state = get_state()
    installation = state.installation()
    if installation is None:
        flash("Install the gateway first: the settings belong to an installation.", "error")
        return redirect(url_for(".install_screen"))
    form = SettingsForm()
    if request.method == "GET":
        _fill_settings(form, installation)
        form.callback_url.data = installation.callback_url
    if form.validate_on_submit():
        try:
            update_settings(
                callback_url=form.callback_url.data,
                callback_failures_email=form.callback_failures_email.data or None,
                minimum_cents=_cents(form.minimum_amount),
                maximum_cents=_cents(form.maximum_amount),
            )
        except AuthenticationError as error:
            state.session.rollback()
            flash(
                f"The gateway refused the stored signing key ({_problem(error)}). If the account was "
                "installed again elsewhere, enter its current signing key on the install screen.",
                "error",
            )
        except (GatewayError, ModelValidationError, SecretUnreadable) as error:
            state.session.rollback()
            flash(f"The settings were not changed: {_problem(error)}", "error")
        else:
            _log.info("gateway settings updated for merchant account %s", installation.merchant_account_id)
            flash(
                "Settings saved on the gateway. The signing key it returned is stored encrypted.", "success"
            )
            return redirect(url_for(".index"))
    return render_template(
        "gateway/admin/settings.html",
        form=form,
        installation=installation,
        warnings=setup_warnings(form.callback_url.data),
    )


# --- checkouts -----------------------------------------------------------------------------------------


@bp.get("/checkouts")
def checkouts() -> ResponseReturnValue:
    state = get_state()
    status = request.args.get("status", "")
    if status not in STATUSES:
        status = ""
    flagged = request.args.get("flagged") == "1"
    search = request.args.get("q", "").strip()[:255]
    page = _page()
    per_page = min(max(request.args.get("per_page", PER_PAGE, type=int) or PER_PAGE, 1), 100)
    query = select(GatewayCheckout).order_by(GatewayCheckout.id.desc())
    if status:
        query = query.where(GatewayCheckout.status == status)
    if flagged:
        query = query.where(GatewayCheckout.flagged.is_(True))
    if "\x00" in search:  # no reference or token has one, and PostgreSQL refuses it in a query
        query = query.where(false())
    elif search:
        query = query.where(
            or_(
                GatewayCheckout.order_reference.icontains(search, autoescape=True),
                GatewayCheckout.token.icontains(search, autoescape=True),
            )
        )
    pagination = state.db.paginate(query, page=page, per_page=per_page, error_out=False)
    filters: dict[str, Any] = {"status": status or None, "flagged": "1" if flagged else None}
    filters.update(q=search or None, per_page=per_page if per_page != PER_PAGE else None)
    return render_template(
        "gateway/admin/checkouts.html",
        pagination=pagination,
        statuses=STATUSES,
        status=status,
        flagged=flagged,
        search=search,
        filters={k: v for k, v in filters.items() if v is not None},
    )


# --- the callback log ----------------------------------------------------------------------------------


@bp.get("/callbacks")
def callbacks() -> ResponseReturnValue:
    """Every callback that reached the shop, newest first, including the refused ones (no checkout)."""
    state = get_state()
    outcome = request.args.get("outcome", "")
    if outcome not in CALLBACK_OUTCOMES:
        outcome = ""
    refused = request.args.get("refused") == "1"
    page = _page()
    query = select(CallbackLog).order_by(CallbackLog.id.desc())
    if outcome:
        query = query.where(CallbackLog.outcome == outcome)
    if refused:
        query = query.where(REFUSED)
    pagination = state.db.paginate(query, page=page, per_page=PER_PAGE, error_out=False)
    wanted = {"outcome": outcome or None, "refused": "1" if refused else None}
    filters = {key: value for key, value in wanted.items() if value}
    return render_template(
        "gateway/admin/callbacks.html",
        pagination=pagination,
        outcomes=CALLBACK_OUTCOMES,
        outcome=outcome,
        refused=refused,
        filters=filters,
        action_form=ActionForm(),
    )


@bp.post("/callbacks/<int:log_id>/replay")
def replay_callback_now(log_id: int) -> ResponseReturnValue:
    """Process a stored (verified) callback again, through the callback's own path (confirmed, applied)."""
    back = redirect(url_for(".callbacks"))
    if log_id > MAX_ID:
        flash(f"There is no callback #{log_id}.", "error")
        return back
    try:
        result = replay_callback(log_id)
    except (LookupError, ValueError, NotInstalledError) as error:
        flash(f"Not replayed: {error}.", "error")
        return back
    except CallbackRejected as error:
        replay = f" as #{error.log.id}" if error.log else ""
        flash(f"Callback #{log_id} replayed{replay}, and refused: {error.description}", "error")
        return back
    flash(
        f"Callback #{log_id} replayed as #{result.log.id}: {callback_outcome_label(result.outcome).text}.",
        "success",
    )
    return back


def _page() -> int:
    return min(max(request.args.get("page", 1, type=int) or 1, 1), MAX_PAGE)


def _checkout_or_404(checkout_id: int) -> GatewayCheckout:
    if not 0 < checkout_id <= MAX_ID:
        abort(404, description=f"There is no checkout #{checkout_id}.")
    checkout = get_state().session.get(GatewayCheckout, checkout_id)
    if checkout is None:
        abort(404, description=f"There is no checkout #{checkout_id}.")
    return checkout


@bp.get("/checkouts/<int:checkout_id>")
def checkout_detail(checkout_id: int) -> ResponseReturnValue:
    return _render_detail(_checkout_or_404(checkout_id))


@dataclass(frozen=True)
class RefundToConfirm:
    """A refund the owner asked for, shown for confirmation before anything is sent."""

    amount_cents: int
    reason: str
    refunded_before: int
    #: Why it is shown again (the refunded total changed since it was shown), else "".
    problem: str = ""


def _render_detail(
    checkout: GatewayCheckout,
    refund_form: RefundForm | None = None,
    status: int = 200,
    confirm: RefundToConfirm | None = None,
) -> ResponseReturnValue:
    callbacks = (
        get_state()
        .session.scalars(
            select(CallbackLog).where(CallbackLog.checkout_id == checkout.id).order_by(CallbackLog.id)
        )
        .all()
    )
    remaining = _remaining(checkout)
    html = render_template(
        "gateway/admin/checkout.html",
        checkout=checkout,
        callbacks=callbacks,
        action_form=ActionForm(),
        refund_form=refund_form or RefundForm(formdata=None),
        confirm=confirm,
        remaining=remaining,
        can_refund=checkout.status in REFUNDABLE_STATUSES and remaining > 0,
        can_cancel=checkout.status in CHANGEABLE_STATUSES,
        can_refresh=checkout.api_version == "v2" and bool(checkout.token),
        order=_order_summary(checkout.order),
        order_view=_order_view(checkout.order),
        format_amount=format_amount,
    )
    return html, status


def _remaining(checkout: GatewayCheckout) -> int:
    return max(checkout.paid_cents - checkout.refunded_cents, 0)


@dataclass(frozen=True)
class OrderLineView:
    name: str
    sku: str
    quantity: int
    unit_price_cents: int

    @property
    def total_cents(self) -> int:
        return self.quantity * self.unit_price_cents


@dataclass(frozen=True)
class OrderView:
    """The stored order (``operations.order_snapshot``) as the owner reads it; parts it cannot read are
    left out (the JSON below it on the page shows everything)."""

    lines: list[OrderLineView]
    customer: str
    contact: str
    billing: str
    shipping: str


def _order_view(order: Mapping[str, Any] | None) -> OrderView | None:
    if not isinstance(order, Mapping):
        return None
    lines = []
    for line in order.get("lines") or ():
        try:
            lines.append(
                OrderLineView(
                    name=str(line["name"]),
                    sku=str(line.get("sku") or ""),
                    quantity=int(line["quantity"]),
                    unit_price_cents=int(line["unit_price_cents"]),
                )
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            continue
    found = order.get("customer")
    customer: Mapping[str, Any] = found if isinstance(found, Mapping) else {}
    name = " ".join(str(customer.get(k) or "") for k in ("first_name", "last_name")).strip()
    contact = " · ".join(str(customer[k]) for k in ("email", "phone") if customer.get(k))
    billing = _address_text(order.get("billing_address"))
    shipping = _address_text(order.get("shipping_address"))
    if shipping and shipping == billing:
        shipping = "The billing address"
    return OrderView(lines=lines, customer=name, contact=contact, billing=billing, shipping=shipping)


def _address_text(address: Any) -> str:
    if not isinstance(address, Mapping):
        return ""
    parts = (address.get(k) for k in ("line1", "line2", "city", "province", "postal_code"))
    return ", ".join(str(part) for part in parts if part)


def _order_summary(order: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """The stored order as label/value pairs, one level deep (whatever shape operations saved)."""
    if not isinstance(order, Mapping):
        return []
    return [(str(key), _text(value)) for key, value in order.items()]


def _text(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, indent=1, ensure_ascii=False, default=str)


def _back(checkout_id: int) -> ResponseReturnValue:
    return redirect(url_for(".checkout_detail", checkout_id=checkout_id))


@bp.post("/checkouts/<int:checkout_id>/refresh")
def refresh_checkout(checkout_id: int) -> ResponseReturnValue:
    checkout = _checkout_or_404(checkout_id)
    try:
        transition = refresh(checkout, source="admin")
    except _EXPECTED as error:
        get_state().session.rollback()
        flash(f"Could not ask the gateway for the status: {_problem(error)}", "error")
    else:
        after, before = status_label(transition.after), status_label(transition.before)
        if transition.applied:
            flash(f"The gateway says “{after}” (was “{before}”).", "success")
        else:
            flash(f"The gateway says “{after}”: {transition.reason or 'no change'}.", "info")
    return _back(checkout_id)


@bp.post("/checkouts/<int:checkout_id>/cancel")
def cancel_checkout(checkout_id: int) -> ResponseReturnValue:
    checkout = _checkout_or_404(checkout_id)
    try:
        cancel_checkout_at_gateway(checkout, source="admin")
    except _EXPECTED as error:
        get_state().session.rollback()
        flash(f"The checkout was not cancelled: {_problem(error)}", "error")
    else:
        _log.info("admin cancelled gateway checkout %s", checkout_id)
        flash(f"Checkout cancelled; its status is now “{status_label(checkout.status)}”.", "success")
    return _back(checkout_id)


@bp.post("/checkouts/<int:checkout_id>/refund")
def refund_checkout(checkout_id: int) -> ResponseReturnValue:
    """Two steps: the amount is shown for confirmation; only the confirmed submit calls the gateway."""
    checkout = _checkout_or_404(checkout_id)
    form = RefundForm()
    if not form.validate_on_submit():
        return _render_detail(checkout, refund_form=form, status=400)
    symbol = get_state().config.currency_symbol
    remaining = _remaining(checkout)
    reason = form.reason.data or ""
    if not form.confirmed.data:
        amount = remaining if form.everything.data else _cents(form.amount)
        if amount <= 0 or amount > remaining:
            form.amount.errors = [
                f"At most {format_money(remaining, symbol)} can be refunded."
                if remaining
                else "Nothing is left to refund."
            ]
            return _render_detail(checkout, refund_form=form, status=400)
        return _render_detail(
            checkout, confirm=RefundToConfirm(amount, reason, refunded_before=checkout.refunded_cents)
        )
    amount = _cents(form.amount)
    if form.refunded_before.data != checkout.refunded_cents:
        problem = (
            f"The refunded total changed since you reviewed this refund (now "
            f"{format_money(checkout.refunded_cents, symbol)}): check the amount again before confirming."
        )
        return _render_detail(
            checkout,
            status=409,
            confirm=RefundToConfirm(amount, reason, refunded_before=checkout.refunded_cents, problem=problem),
        )
    try:
        record = refund(checkout, amount, reason=reason)
    except _EXPECTED as error:
        get_state().session.rollback()
        flash(f"The refund was not made: {_problem(error)}", "error")
    else:
        shown = format_money(record.amount_cents, symbol)
        _log.info(
            "admin refund of %s cents on gateway checkout %s: %s",
            record.amount_cents,
            checkout_id,
            record.state,
        )
        if record.state == "SUCCEEDED":
            flash(f"Refunded {shown}.", "success")
        else:
            state = refund_state_label(record.state).text.lower()
            flash(f"The refund of {shown} is {state}: {record.error or 'see the timeline'}.", "error")
    return _back(checkout_id)


def _problem(error: Exception) -> str:
    """What to tell the owner: the gateway's message and field errors; never request data or secrets."""
    if isinstance(error, ModelValidationError):
        # Never str(error): pydantic's text repeats the input values, which may include a secret.
        return "; ".join(
            f"{'.'.join(str(part) for part in e['loc'])}: {e['msg']}"
            for e in error.errors(include_input=False, include_url=False)
        )
    if isinstance(error, GatewayError):
        text = error.message
        if error.http_status is not None:
            text += f" (HTTP {error.http_status})"
        if error.field_errors:
            text += ": " + "; ".join(f"{e['field']}: {e['message']}" for e in error.field_errors)
        return text
    return str(error)
