"""The admin's outbox screen: events for the shop's code that wait or died, and "deliver again".

A blueprint nested in the admin screens' (``flask_gateway.extension`` nests it): the admin guard, the CSRF
check and the framing headers of ``views.admin.blueprint`` run for it too. ``/gateway/admin/outbox``:

- "Paid, not yet fulfilled": ``payment_confirmed`` events not delivered (waiting for a retry, or dead);
- every event waiting or dead (or delivered, on request) with its attempts and last error;
- "Deliver again" per event (``outbox.redeliver``) and "Deliver what is due now" (``outbox.deliver_due``).

One account per request (``access``): ``?account=ID`` shows and delivers that account's events only (its
checkouts'); without it, those of the accounts the person may see (every account's for the owner).
"""

from __future__ import annotations

from typing import Final

from flask import Blueprint, flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from sqlalchemy import func, select

from flask_gateway.models import GatewayCheckout, OutboxEvent, OutboxState
from flask_gateway.payments.outbox import backlog, deliver_due, of_accounts, redeliver
from flask_gateway.state import get_state
from flask_gateway.web.admin.access import (
    account_from_query,
    account_from_row,
    keep_declarations,
    nav_account,
    request_accounts,
)
from flask_gateway.web.admin.accounts import account_scope
from flask_gateway.web.forms import ActionForm

__all__ = ["EVENT_LABELS", "bp"]

bp = Blueprint("outbox", __name__)

PER_PAGE: Final = 25
MAX_PAGE: Final = 100_000
MAX_ID: Final = 2**31 - 1
#: The events in people's words.
EVENT_LABELS: Final = {
    "payment_confirmed": "Payment confirmed (fulfil the order)",
    "checkout_cancelled": "Checkout cancelled",
    "checkout_expired": "Checkout expired",
    "refund_succeeded": "Refund made",
    "checkout_flagged": "Flagged for a person",
    "payment_after_close": "Paid after the order was closed",
}
#: The list's filter: what each choice shows.
_SHOWN: Final = {
    "open": (OutboxState.PENDING.value, OutboxState.DEAD.value),
    "dead": (OutboxState.DEAD.value,),
    "delivered": (OutboxState.DELIVERED.value,),
}


@bp.get("/")
@account_from_query()
def index() -> ResponseReturnValue:
    state = get_state()
    session = state.session
    scope = account_scope()  # ?account= checked (404 for one not installed), the switcher's accounts
    accounts = request_accounts()
    mine = of_accounts(accounts)
    shown = request.args.get("show", "open")
    if shown not in _SHOWN:
        shown = "open"
    page = min(max(request.args.get("page", 1, type=int) or 1, 1), MAX_PAGE)
    counts = dict(
        session.execute(
            select(OutboxEvent.state, func.count())
            .where(OutboxEvent.state != OutboxState.DELIVERED, *mine)
            .group_by(OutboxEvent.state)
        ).all()
    )
    unfulfilled = session.scalar(
        select(func.count())
        .select_from(OutboxEvent)
        .where(OutboxEvent.kind == "payment_confirmed", OutboxEvent.state != OutboxState.DELIVERED, *mine)
    )
    retrying = session.scalar(
        select(func.count())
        .select_from(OutboxEvent)
        .where(OutboxEvent.state == OutboxState.PENDING, OutboxEvent.attempts > 0, *mine)
    )
    if accounts is None:
        waiting, oldest = backlog()
    else:
        waiting, oldest = session.execute(
            select(func.count(), func.min(OutboxEvent.created_at)).where(
                OutboxEvent.state == OutboxState.PENDING, *mine
            )
        ).one()
    query = (
        select(OutboxEvent, GatewayCheckout.order_reference)
        .join(GatewayCheckout, GatewayCheckout.id == OutboxEvent.checkout_id)
        .where(OutboxEvent.state.in_(_SHOWN[shown]), *mine)
        .order_by(OutboxEvent.id.desc())
    )
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    rows = session.execute(query.limit(PER_PAGE).offset((page - 1) * PER_PAGE)).all()
    return render_template(
        "gateway/admin/outbox.html",
        **scope.template_values(),
        rows=rows,
        total=total,
        page=page,
        pages=max(1, -(-total // PER_PAGE)),
        shown=shown,
        unfulfilled=unfulfilled or 0,
        retrying=retrying or 0,
        dead=counts.get(OutboxState.DEAD.value, 0),
        waiting=waiting or 0,
        oldest=oldest,
        labels=EVENT_LABELS,
        action_form=ActionForm(),
    )


def _back() -> ResponseReturnValue:
    """The outbox screen again, of the account the request was about (several accounts)."""
    return redirect(url_for(".index", account=nav_account()))


@bp.post("/deliver-due")
@account_from_query()
def deliver_due_now() -> ResponseReturnValue:
    accounts = request_accounts()
    report = deliver_due(accounts=accounts)
    flash(
        f"Delivered what was due: {report}.",
        "error" if report.failed else "success",
    )
    return _back()


@bp.post("/<int:event_id>/deliver")
@account_from_row("event_id")
def deliver_again(event_id: int) -> ResponseReturnValue:
    if event_id > MAX_ID:
        flash(f"There is no outbox event {event_id}.", "error")
        return _back()
    try:
        report = redeliver(event_id)
    except LookupError as error:
        flash(f"{str(error).capitalize()}.", "error")
        return _back()
    if report.failed:
        flash(f"Event #{event_id} was delivered again, and a receiver failed: {report.errors[0][1]}", "error")
    else:
        flash(f"Event #{event_id} delivered.", "success")
    return _back()


keep_declarations(bp)
