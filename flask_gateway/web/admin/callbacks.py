"""The callback log: every callback that reached the shop (refused ones too), and "replay" of a stored one."""

from __future__ import annotations

from typing import Final

from flask import flash, redirect, render_template, request, url_for
from flask.typing import ResponseReturnValue
from sqlalchemy import select

from flask_gateway.errors import CallbackRejected, NotInstalledError
from flask_gateway.inbound import replay_callback
from flask_gateway.labels import callback_outcome_label
from flask_gateway.models import CallbackLog, CallbackOutcome, GatewayCheckout
from flask_gateway.operations.health import REFUSED
from flask_gateway.state import get_state
from flask_gateway.web.admin.access import account_from_query, account_from_row
from flask_gateway.web.admin.accounts import account_scope
from flask_gateway.web.admin.blueprint import bp
from flask_gateway.web.admin.inputs import MAX_ID, PER_PAGE, _page
from flask_gateway.web.forms import ActionForm

#: The outcomes a callback log row can have, for the callback log's filter.
CALLBACK_OUTCOMES: Final = tuple(o.value for o in CallbackOutcome)


@bp.get("/callbacks")
@account_from_query()
def callbacks() -> ResponseReturnValue:
    """Every callback that reached the shop, newest first, including the refused ones (no checkout)."""
    state = get_state()
    scope = account_scope()
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
    if scope.shown is not None:  # a callback's account is its checkout's (a refused one may name none)
        query = query.where(
            CallbackLog.checkout_id.in_(
                select(GatewayCheckout.id).where(GatewayCheckout.merchant_account_id.in_(sorted(scope.shown)))
            )
        )
    pagination = state.db.paginate(query, page=page, per_page=PER_PAGE, error_out=False)
    wanted = {"outcome": outcome or None, "refused": "1" if refused else None, "account": scope.account}
    filters = {key: value for key, value in wanted.items() if value}
    listed = _checkouts_of(pagination.items)
    return render_template(
        "gateway/admin/callbacks.html",
        **scope.template_values(),
        account_of={id_: account for id_, (account, _) in listed.items()} if scope.several else {},
        reference_of={id_: reference for id_, (_, reference) in listed.items()},
        pagination=pagination,
        outcomes=CALLBACK_OUTCOMES,
        outcome=outcome,
        refused=refused,
        filters=filters,
        action_form=ActionForm(),
    )


def _checkouts_of(logs: list[CallbackLog]) -> dict[int, tuple[str, str]]:
    """The account and order reference of each listed callback's checkout, by checkout id (one query for
    the page)."""
    ids = {log.checkout_id for log in logs if log.checkout_id is not None}
    if not ids:
        return {}
    rows = get_state().session.execute(
        select(
            GatewayCheckout.id, GatewayCheckout.merchant_account_id, GatewayCheckout.order_reference
        ).where(GatewayCheckout.id.in_(ids))
    )
    return {row.id: (row.merchant_account_id, row.order_reference) for row in rows}


@bp.post("/callbacks/<int:log_id>/replay")
@account_from_row("log_id")
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
