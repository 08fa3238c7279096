"""The checkouts: the list (filter, search, pages), one checkout's page (order, callbacks, timeline), and
its actions: refresh from the gateway, cancel, refund (shown for confirmation first)."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from flask import abort, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from sqlalchemy import false, or_, select

from flask_gateway.core.wire import CHANGEABLE_STATUSES, REFUNDABLE_STATUSES
from flask_gateway.labels import describe_detail, refund_state_label, status_label
from flask_gateway.models import CallbackLog, GatewayCheckout
from flask_gateway.payments.checkouts import cancel_checkout as cancel_checkout_at_gateway
from flask_gateway.payments.polling import refresh
from flask_gateway.payments.refunds import refund
from flask_gateway.state import get_state
from flask_gateway.web.admin.access import account_from_query, account_from_row, visible_installations
from flask_gateway.web.admin.accounts import account_scope
from flask_gateway.web.admin.blueprint import bp
from flask_gateway.web.admin.inputs import MAX_ID, PER_PAGE, STATUSES, _cents, _page
from flask_gateway.web.admin.orders import _order_summary, _order_view
from flask_gateway.web.admin.problems import _EXPECTED, _problem
from flask_gateway.web.forms import ActionForm, RefundForm, format_amount, format_money

__all__ = ["RefundToConfirm"]

_log = logging.getLogger("flask_gateway.admin")


@bp.get("/checkouts")
@account_from_query()
def checkouts() -> ResponseReturnValue:
    state = get_state()
    scope = account_scope()
    status = request.args.get("status", "")
    if status not in STATUSES:
        status = ""
    flagged = request.args.get("flagged") == "1"
    search = request.args.get("q", "").strip()[:255]
    page = _page()
    per_page = min(max(request.args.get("per_page", PER_PAGE, type=int) or PER_PAGE, 1), 100)
    query = select(GatewayCheckout).order_by(GatewayCheckout.id.desc())
    if scope.shown is not None:  # its account, or the accounts the person may see
        query = query.where(GatewayCheckout.merchant_account_id.in_(sorted(scope.shown)))
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
    filters.update(account=scope.account)
    return render_template(
        "gateway/admin/checkouts.html",
        **scope.template_values(),
        pagination=pagination,
        statuses=STATUSES,
        status=status,
        flagged=flagged,
        search=search,
        filters={k: v for k, v in filters.items() if v is not None},
    )


def _checkout_or_404(checkout_id: int) -> GatewayCheckout:
    if not 0 < checkout_id <= MAX_ID:
        abort(404, description=f"There is no checkout #{checkout_id}.")
    checkout = get_state().session.get(GatewayCheckout, checkout_id)
    if checkout is None:
        abort(404, description=f"There is no checkout #{checkout_id}.")
    return checkout


@bp.get("/checkouts/<int:checkout_id>")
@account_from_row("checkout_id")
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
    installations = visible_installations()  # the switcher: the accounts the person may see
    several = len(installations) > 1
    html = render_template(
        "gateway/admin/checkout.html",
        # Several accounts: the page says whose checkout it is, and the lists it links to keep the account.
        accounts=installations if several else [],
        account=checkout.merchant_account_id if several else None,
        account_installation=next(
            (row for row in installations if row.merchant_account_id == checkout.merchant_account_id), None
        ),
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


def _back(checkout_id: int) -> ResponseReturnValue:
    return redirect(url_for(".checkout_detail", checkout_id=checkout_id))


@bp.post("/checkouts/<int:checkout_id>/refresh")
@account_from_row("checkout_id")
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
            reason = describe_detail(transition.reason, get_state().config.currency_symbol)
            flash(f"The gateway says “{after}”: {reason or 'no change'}.", "info")
    return _back(checkout_id)


@bp.post("/checkouts/<int:checkout_id>/cancel")
@account_from_row("checkout_id")
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
@account_from_row("checkout_id")
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
            why = describe_detail(record.error, symbol) or "see the timeline"
            flash(f"The refund of {shown} is {state}: {why}.", "error")
    return _back(checkout_id)
