"""The human dashboard at ``/_emulator/`` (server-rendered HTML, no JavaScript) and the OpenAPI document.

It shows what the control API returns as JSON: accounts, checkouts with their timelines, the test clock,
fault rules, callback attempts, dead letters (with a redeliver button) and the e-mail outbox.
"""

from __future__ import annotations

import json
from functools import cache
from typing import Any, Final

from flask import Blueprint, Response, abort, flash, redirect, render_template, request, url_for
from sqlalchemy import func, select
from sqlalchemy.orm import selectinload
from werkzeug.wrappers import Response as WerkzeugResponse

from flask_gateway.core.money import format_money
from flask_gateway.core.references import keep_whole
from flask_gateway.core.timestamps import format_timestamp
from flask_gateway.core.wire import REFUNDABLE_STATUSES, WireNames
from flask_gateway.emulator import checkouts, clock, delivery, faults
from flask_gateway.emulator.access import (
    check_access,
    mask_v1_urls,
    remember_operator,
    token_matches,
    visible_url,
)
from flask_gateway.emulator.api import base_url, settings
from flask_gateway.emulator.models import (
    Account,
    Checkout,
    Delivery,
    DeliveryAttempt,
    DeliveryKind,
    DeliveryState,
    Email,
    FaultRule,
    db,
)
from flask_gateway.emulator.openapi import build_document, render
from flask_gateway.emulator.problems import ApiProblem
from flask_gateway.emulator.views.control import describe_account

__all__ = ["bp"]

bp = Blueprint("emulator_dashboard", __name__)

#: Rows shown on list pages (newest first).
PAGE_ROWS: Final = 200
#: Checkouts shown on the overview.
RECENT_CHECKOUTS: Final = 25


@bp.before_request
def _operator_only() -> WerkzeugResponse | None:
    return check_access(dashboard=True)


@bp.app_template_filter("merchant_url")
def _merchant_url(url: str | None, kind: str) -> str | None:
    """A delivery's URL as this viewer may see it: a v1 notice goes to the shop's fail URL (masked)."""
    return url if kind == DeliveryKind.CALLBACK else visible_url(url)


@bp.route("/_emulator/login", methods=["GET", "POST"])
def login() -> WerkzeugResponse | tuple[str, int] | str:
    """Sign in to the dashboard with ``EMULATOR_CONTROL_TOKEN`` (CSRF-protected form)."""
    target = request.args.get("next", "")
    if not target.startswith("/_emulator/") or target.startswith("//"):
        target = url_for(".overview")
    if request.method == "POST":
        if token_matches(request.form.get("token", "")):
            remember_operator()
            return redirect(target, 303)
        return render_template("emulator/dashboard/login.html", wrong=True, target=target), 401
    return render_template("emulator/dashboard/login.html", wrong=False, target=target)


bp.add_app_template_filter(keep_whole, "whole")


@bp.app_template_filter("when")
def _when(value: Any) -> str:
    """A timestamp as the API writes it, or a dash."""
    return format_timestamp(value) if value is not None else "—"


@bp.app_template_filter("cents")
def _cents(value: int | None) -> str:
    """``12345`` -> ``123.45``: amounts are cents on the wire, read as currency units here."""
    return "—" if value is None else format_money(value, "")


def _count(query: Any) -> int:
    return int(db.session.scalar(query) or 0)


@bp.get("/_emulator/")
def overview() -> str:
    accounts = db.session.scalars(select(Account).order_by(Account.merchant_account_id)).all()
    recent = db.session.scalars(select(Checkout).order_by(Checkout.id.desc()).limit(RECENT_CHECKOUTS)).all()
    rules = db.session.scalars(select(FaultRule).order_by(FaultRule.id)).all()
    return render_template(
        "emulator/dashboard/overview.html",
        accounts=[describe_account(a) for a in accounts],
        checkouts=recent,
        checkout_count=_count(select(func.count(Checkout.id))),
        overdue={c.id for c in recent if checkouts.needs_expiry(c)},
        now=clock.now(),
        offset=clock.offset(),
        faults=[faults.describe(rule) for rule in rules],
        dead_letters=_count(select(func.count(Delivery.id)).where(Delivery.state == DeliveryState.DEAD)),
        pending=_count(select(func.count(Delivery.id)).where(Delivery.state == DeliveryState.PENDING)),
        attempts=_count(select(func.count(DeliveryAttempt.id))),
        emails=_count(select(func.count(Email.id))),
    )


@bp.get("/_emulator/dashboard/checkouts/<token>")
def checkout(token: str) -> str:
    found = None
    if "\x00" not in token:  # PostgreSQL refuses U+0000 in a query
        found = db.session.scalars(select(Checkout).where(Checkout.token == token)).one_or_none()
    if found is None:
        abort(404, description=f"No checkout with token {token!r}.")
    deliveries = db.session.scalars(
        select(Delivery)
        .where(Delivery.checkout_id == found.id)
        .options(selectinload(Delivery.attempt_log))
        .order_by(Delivery.id)
    ).all()
    return render_template(
        "emulator/dashboard/checkout.html",
        checkout=found,
        overdue=checkouts.needs_expiry(found),
        # Pretty JSON in the wire's own key order (the ``tojson`` filter would sort the keys).
        status=json.dumps(
            checkouts.status_payload(found, base_url()).to_wire(settings().wire_names), indent=2
        ),
        details=json.dumps(mask_v1_urls(found.details), indent=2, ensure_ascii=False),
        deliveries=deliveries,
        refundable=found.status in REFUNDABLE_STATUSES,
    )


@bp.post("/_emulator/dashboard/checkouts/<token>/refund")
def refund(token: str) -> WerkzeugResponse:
    """The portal's refund button (CSRF-protected form): all that remains, or the amount typed in cents."""
    typed = request.form.get("amount_cents", "").strip()
    back = redirect(url_for(".checkout", token=token), 303)
    if typed and (not typed.isdigit() or not 0 < int(typed) <= 10**12):
        flash(f"Not refunded: {typed!r} is not an amount in cents.", "error")
        return back
    try:
        done = checkouts.refund_by_operator(token, int(typed) if typed else None, "refunded in the portal")
    except ApiProblem as problem:
        db.session.rollback()
        flash(f"Not refunded: {problem.message}", "error")
        return back
    refunded = done.refunded_cents
    db.session.commit()
    flash(f"Refunded; {format_money(refunded)} refunded in all. The merchant is not told.", "success")
    return back


@bp.get("/_emulator/dashboard/callbacks")
def callbacks() -> str:
    attempts = db.session.scalars(
        select(DeliveryAttempt)
        .options(selectinload(DeliveryAttempt.delivery).selectinload(Delivery.checkout))
        .order_by(DeliveryAttempt.id.desc())
        .limit(PAGE_ROWS)
    ).all()
    pending = db.session.scalars(
        select(Delivery)
        .where(Delivery.state == DeliveryState.PENDING)
        .options(selectinload(Delivery.checkout))
        .order_by(Delivery.next_attempt_at, Delivery.id)
        .limit(PAGE_ROWS)
    ).all()
    return render_template("emulator/dashboard/callbacks.html", attempts=attempts, pending=pending)


@bp.get("/_emulator/dashboard/dead-letters")
def dead_letters() -> str:
    rows = db.session.scalars(
        select(Delivery)
        .where(Delivery.state == DeliveryState.DEAD)
        .options(selectinload(Delivery.checkout), selectinload(Delivery.attempt_log))
        .order_by(Delivery.id.desc())
        .limit(PAGE_ROWS)
    ).all()
    return render_template("emulator/dashboard/dead_letters.html", deliveries=rows)


@bp.post("/_emulator/dashboard/dead-letters/<int:delivery_id>/redeliver")
def redeliver(delivery_id: int) -> WerkzeugResponse:
    """The redeliver button (CSRF-protected form): queue the dead letter again, then back to the list."""
    try:
        delivery.redeliver(delivery_id)
    except ApiProblem as problem:
        db.session.rollback()
        flash(f"Dead letter #{delivery_id} was not redelivered: {problem.message}", "error")
    else:
        flash(f"Dead letter #{delivery_id} is back in the outbox and was sent again.", "success")
    return redirect(url_for(".dead_letters"), 303)


@bp.get("/_emulator/dashboard/emails")
def emails() -> str:
    rows = db.session.scalars(select(Email).order_by(Email.id.desc()).limit(PAGE_ROWS)).all()
    return render_template("emulator/dashboard/emails.html", emails=rows)


@cache
def _openapi_json(names: WireNames) -> bytes:
    return render(build_document(names)).encode("ascii")


@bp.get("/_emulator/openapi.json")
def openapi() -> Response:
    """The OpenAPI 3.1 document of the v2 and v1 APIs, in this emulator's wire names (with the default
    ``operator`` names, the same text as docs/openapi.json)."""
    return Response(_openapi_json(settings().wire_names), mimetype="application/json")
