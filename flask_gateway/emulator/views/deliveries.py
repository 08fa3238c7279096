"""Control API for the outbox (JSON, closed like ``views/control.py``): deliveries, callbacks, e-mails.

- ``POST /_emulator/deliver``: run the due attempts now, synchronously -> ``{"attempts": n}``.
- ``GET /_emulator/callbacks`` (optional ``?checkoutToken=``, ``?kind=callback|v1_abandoned``): every
  attempt, oldest first -> ``{"callbacks": [{id, deliveryId, checkoutToken, kind, number, at, url,
  httpStatus, message, ok, durationMs, requestBody}]}``; ``requestBody`` is the exact text sent (the
  signed bytes; ``""`` for v1 notices, which are GETs).
- ``GET /_emulator/deliveries`` (optional ``?state=pending|delivered|dead``): the outbox rows.
- ``GET /_emulator/dead-letters`` -> ``{"deadLetters": [{id, checkoutToken, merchantAccountId, kind, url,
  state, attempts, nextAttemptAt, createdAt, lastStatusMessage, attemptLog: [attempt...]}]}``.
- ``POST /_emulator/dead-letters/<id>/redeliver``: 404 unknown id, 409 not dead; else the dead letter
  goes back to the outbox with its attempt counter at 0 and is attempted at once -> ``{"ok", "attempt",
  "delivery", "checkoutPaymentStatus"}`` (200 whatever the merchant answered; a failure schedules the
  next attempt as usual).
- ``GET /_emulator/emails`` -> ``{"emails": [{id, at, merchantAccountId, from, to, subject, body,
  smtpResult}]}``.
"""

from __future__ import annotations

from flask import Blueprint, Response, request
from sqlalchemy import ColumnElement, false, select
from sqlalchemy.orm import InstrumentedAttribute, selectinload

from flask_gateway.emulator import delivery
from flask_gateway.emulator.access import check_access
from flask_gateway.emulator.api import json_response
from flask_gateway.emulator.mail import describe_email
from flask_gateway.emulator.models import Checkout, Delivery, DeliveryAttempt, DeliveryState, Email, db
from flask_gateway.emulator.views.health import HEALTH_BLUEPRINT

__all__ = ["bp"]

bp = Blueprint("emulator_deliveries", __name__, url_prefix="/_emulator")


@bp.before_request
def _operator_only() -> None:
    check_access(dashboard=False)


_WITH_ATTEMPTS = (selectinload(Delivery.checkout), selectinload(Delivery.attempt_log))


def _equals(column: InstrumentedAttribute[str], value: str) -> ColumnElement[bool]:
    """A filter on a query parameter; U+0000 matches nothing (PostgreSQL refuses it in a query: a 500)."""
    return false() if "\x00" in value else column == value


@bp.before_app_request
def _remember_base_url() -> None:
    # Callbacks built by the worker thread (outside any request) use the address this app was reached at.
    # Not a health probe's: a load balancer or kubelet reaches the process at an address shoppers may not.
    if request.blueprint != HEALTH_BLUEPRINT:
        delivery.remember_base_url(request.url_root)


@bp.post("/deliver")
def deliver() -> Response:
    """Run every due attempt now (expiries first); answers how many attempts were made."""
    return json_response({"attempts": delivery.run_due()})


@bp.get("/callbacks")
def callbacks() -> Response:
    query = (
        select(DeliveryAttempt)
        .join(DeliveryAttempt.delivery)
        .options(selectinload(DeliveryAttempt.delivery).selectinload(Delivery.checkout))
        .order_by(DeliveryAttempt.id)
    )
    token = request.args.get("checkoutToken")
    if token:
        query = query.join(Delivery.checkout).where(_equals(Checkout.token, token))
    kind = request.args.get("kind")
    if kind:
        query = query.where(_equals(Delivery.kind, kind))
    attempts = db.session.scalars(query).all()
    return json_response({"callbacks": [delivery.describe_attempt(a) for a in attempts]})


@bp.get("/deliveries")
def deliveries() -> Response:
    query = select(Delivery).options(*_WITH_ATTEMPTS).order_by(Delivery.id)
    state = request.args.get("state")
    if state:
        query = query.where(_equals(Delivery.state, state))
    rows = db.session.scalars(query).all()
    return json_response({"deliveries": [delivery.describe_delivery(d) for d in rows]})


@bp.get("/dead-letters")
def dead_letters() -> Response:
    rows = db.session.scalars(
        select(Delivery)
        .options(*_WITH_ATTEMPTS)
        .where(Delivery.state == DeliveryState.DEAD.value)
        .order_by(Delivery.id)
    ).all()
    return json_response({"deadLetters": [delivery.describe_delivery(d) for d in rows]})


@bp.post("/dead-letters/<int:delivery_id>/redeliver")
def redeliver(delivery_id: int) -> Response:
    attempt_id = delivery.redeliver(delivery_id)
    attempt = db.session.get(DeliveryAttempt, attempt_id) if attempt_id is not None else None
    row = db.session.get(Delivery, delivery_id)
    body = {
        "ok": bool(attempt and attempt.ok),
        "attempt": delivery.describe_attempt(attempt) if attempt else None,
        "delivery": delivery.describe_delivery(row) if row else None,
        "checkoutPaymentStatus": row.checkout.status if row else None,
    }
    return json_response(body)


@bp.get("/emails")
def emails() -> Response:
    rows = db.session.scalars(select(Email).order_by(Email.id)).all()
    return json_response({"emails": [describe_email(e) for e in rows]})
