"""Figure 4's yardsticks: the least work the gateway's create and getstatus contracts need, on the emulator's
own stack, served by gunicorn as ``emulator_yardsticks:yardstick_app()``.

Same server and settings as the emulator (the figure serves both the same way), same database
(``EMULATOR_DATABASE_URL``), same engine options and SQLite set-up (WAL, ``synchronous=NORMAL``, a write
transaction begins ``BEGIN IMMEDIATE``, a read-only one DEFERRED), same table: the rows are written to and
read from the emulator's own ``emulator_checkouts``, so both apps see the same table and its size.

- ``POST /yardstick/create``: the signature checked (HMAC-SHA256 over the raw body, as the emulator's
  ``verify``), the JSON parsed and every field of a create checked by hand (types, required fields,
  positive integer cents, at most 500 lines, the redirect URLs absolute), one ``INSERT`` of a checkout row
  of the emulator's width (the order details stored as JSON), one commit, and an answer of the create's
  shape (13 keys, the order details echoed).
- ``POST /yardstick/getstatus``: the signature checked, the JSON parsed, one ``SELECT`` of the row by its
  unique token (and the account), a 16-key JSON answer.

Neither reads the account per request: the signing key is read once per account and process and then kept
(what a gateway that caches its merchants' keys does). Neither has idempotency keys, a test clock, fault
rules or a timeline: the emulator's extras, which the figure prices.
"""

from __future__ import annotations

import hmac
import json
import os
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from flask import Flask, Response, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import bindparam, insert, select

from flask_gateway.core.auth import ACCOUNT_HEADER, SIGNATURE_HEADER
from flask_gateway.core.signing import sign
from flask_gateway.core.sql import configure_sqlite, sqlite_read_transactions
from flask_gateway.core.timestamps import format_timestamp
from flask_gateway.core.wire import dumps
from flask_gateway.emulator.app import ENGINE_OPTIONS
from flask_gateway.emulator.models import Account, Checkout

ORDER_DETAILS = "payjustnow"
_CHECKOUTS = Checkout.__table__
_INSERT = insert(_CHECKOUTS)
_STATUS = select(
    _CHECKOUTS.c.id,
    _CHECKOUTS.c.token,
    _CHECKOUTS.c.request_id,
    _CHECKOUTS.c.status,
    _CHECKOUTS.c.total_cents,
    _CHECKOUTS.c.merchant_order_reference,
    _CHECKOUTS.c.click_trace_id,
    _CHECKOUTS.c.created_at,
    _CHECKOUTS.c.updated_at,
    _CHECKOUTS.c.expires_at,
    _CHECKOUTS.c.cancelled_at,
    _CHECKOUTS.c.paid_at,
    _CHECKOUTS.c.payment_reference,
    _CHECKOUTS.c.last_callback_attempted_at,
    _CHECKOUTS.c.last_callback_status_message,
)
#: One indexed read: the unique token, and the account the request authenticated.
_STATUS_BY_TOKEN = _STATUS.where(
    _CHECKOUTS.c.token == bindparam("token"), _CHECKOUTS.c.account_id == bindparam("account")
)


class Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _text(value: object, field: str, *, required: bool = True) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or (required and not value):
        raise Refused(400, f"{field}: text expected")


def _cents(value: object, field: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise Refused(400, f"{field}: integer cents expected")


def _url(value: object, field: str, *, required: bool = True) -> None:
    if value is None and not required:
        return
    if not isinstance(value, str) or not value.startswith(("https://", "http://")):
        raise Refused(400, f"{field}: an absolute URL expected")


def check_create(body: object) -> dict[str, Any]:
    """The fields of a create request, checked by hand: its order details, or ``Refused`` (400)."""
    if not isinstance(body, dict):
        raise Refused(400, "a JSON object expected")
    _text(body.get("requestId"), "requestId", required=False)
    _text(body.get("clickTraceId"), "clickTraceId", required=False)
    _cents(body.get("checkoutTotalCents"), "checkoutTotalCents")
    details = body.get(ORDER_DETAILS)
    if not isinstance(details, dict):
        raise Refused(400, f"{ORDER_DETAILS}: an object expected")
    _text(details.get("merchantOrderReference"), "merchantOrderReference")
    _cents(details.get("orderAmountCents"), "orderAmountCents")
    _url(details.get("confirmRedirectUrl"), "confirmRedirectUrl")
    _url(details.get("cancelRedirectUrl"), "cancelRedirectUrl")
    expiry = details.get("orderExpiryMinutes")
    if expiry is not None and (not isinstance(expiry, int) or isinstance(expiry, bool) or expiry < 1):
        raise Refused(400, "orderExpiryMinutes: a positive integer expected")
    items = details.get("orderItems")
    if items is not None:
        if not isinstance(items, list) or len(items) > 500:
            raise Refused(400, "orderItems: a list of at most 500 lines expected")
        for item in items:
            if not isinstance(item, dict):
                raise Refused(400, "orderItems: objects expected")
            _text(item.get("name"), "name")
            _text(item.get("sku"), "sku", required=False)
            quantity = item.get("quantity")
            if not isinstance(quantity, int) or isinstance(quantity, bool) or quantity < 1:
                raise Refused(400, "quantity: a positive integer expected")
            _cents(item.get("priceCents"), "priceCents")
            _url(item.get("imageUrl"), "imageUrl", required=False)
            _url(item.get("pageUrl"), "pageUrl", required=False)
            terms = item.get("searchTerms")
            if terms is not None and (
                not isinstance(terms, list) or len(terms) > 50 or not all(isinstance(t, str) for t in terms)
            ):
                raise Refused(400, "searchTerms: a list of text expected")
    return details


def yardstick_app(database_url: str | None = None) -> Flask:
    app = Flask("emulator_yardsticks")
    app.config.update(
        SQLALCHEMY_DATABASE_URI=database_url or os.environ["EMULATOR_DATABASE_URL"],
        SQLALCHEMY_ENGINE_OPTIONS=dict(ENGINE_OPTIONS),
    )
    public_url = os.environ.get("EMULATOR_PUBLIC_URL", "http://127.0.0.1").rstrip("/")
    db = SQLAlchemy()
    db.init_app(app)
    with app.app_context():
        configure_sqlite(db.engine)
    keys: dict[str, str] = {}  # account -> signing key, read once per process

    def authenticate() -> tuple[str, bytes]:
        account = request.headers.get(ACCOUNT_HEADER, "")
        key = keys.get(account)
        if key is None:
            with sqlite_read_transactions():
                key = db.session.execute(
                    select(Account.signing_key).where(Account.merchant_account_id == account)
                ).scalar()
                db.session.rollback()
            if not key:
                raise Refused(401, "unknown account")
            keys[account] = key
        raw = request.get_data(cache=False)
        if not hmac.compare_digest(sign(raw, key), request.headers.get(SIGNATURE_HEADER, "")):
            raise Refused(401, "invalid signature")
        return account, raw

    def answer(body: dict[str, Any], status: int = 200) -> Response:
        return Response(dumps(body), status=status, mimetype="application/json")

    @app.errorhandler(Refused)
    def _refused(error: Refused) -> Response:
        return answer({"message": str(error)}, error.status)

    @app.post("/yardstick/create")
    def create() -> Response:
        account, raw = authenticate()
        try:
            body = json.loads(raw)
        except ValueError:
            raise Refused(400, "invalid JSON") from None
        details = check_create(body)
        now = datetime.now(UTC)
        expiry = details.get("orderExpiryMinutes")
        expires = now + timedelta(minutes=expiry or 60)
        token = f"v2.{account}.{uuid.uuid4()}"
        row = {
            "token": token,
            "account_id": account,
            "api_version": 2,
            "status": "PENDING_ORDER",
            "request_id": body.get("requestId"),
            "total_cents": body["checkoutTotalCents"],
            "merchant_order_reference": details["merchantOrderReference"],
            "click_trace_id": body.get("clickTraceId"),
            "details": details,
            "created_at": now,
            "updated_at": now,
            "expires_at": expires,
            "refunded_cents": 0,
        }
        db.session.execute(_INSERT, row)
        db.session.commit()
        stamp, until = format_timestamp(now), format_timestamp(expires)
        return answer(
            {
                "requestId": row["request_id"],
                "checkoutToken": token,
                "checkoutTotalCents": row["total_cents"],
                "paymentUrl": f"{public_url}/api/v2/app/checkout/{token}",
                "checkoutPaymentStatus": "PENDING_ORDER",
                "merchantOrderReference": row["merchant_order_reference"],
                "createdAt": stamp,
                "updatedAt": stamp,
                "expiresAt": until,
                ORDER_DETAILS: {**details, "expiresAt": until, "checkoutPaymentStatus": "PENDING_ORDER"},
                "merchantAccountId": account,
            }
        )

    @app.post("/yardstick/getstatus")
    def getstatus() -> Response:
        account, raw = authenticate()
        try:
            body = json.loads(raw)
        except ValueError:
            raise Refused(400, "invalid JSON") from None
        token = body.get("checkoutToken") if isinstance(body, dict) else None
        if not isinstance(token, str) or not token:
            raise Refused(400, "checkoutToken: text expected")
        with sqlite_read_transactions():
            row = db.session.execute(_STATUS_BY_TOKEN, {"token": token, "account": account}).first()
            db.session.rollback()
        if row is None:
            raise Refused(404, "no such checkout")

        def stamp(value: datetime | None) -> str | None:
            return None if value is None else format_timestamp(value)

        return answer(
            {
                "requestId": row.request_id,
                "checkoutToken": row.token,
                "checkoutTotalCents": row.total_cents,
                "paymentUrl": f"{public_url}/api/v2/app/checkout/{row.token}",
                "checkoutPaymentStatus": row.status,
                "paidAt": stamp(row.paid_at),
                "paymentReference": row.payment_reference,
                "merchantOrderReference": row.merchant_order_reference,
                "payjustnowOrderReference": row.id,
                "clickTraceId": row.click_trace_id,
                "createdAt": stamp(row.created_at),
                "updatedAt": stamp(row.updated_at),
                "expiresAt": stamp(row.expires_at),
                "cancelledAt": stamp(row.cancelled_at),
                "lastCallbackAttemptedAt": stamp(row.last_callback_attempted_at),
                "lastCallbackAttemptStatusMessage": row.last_callback_status_message,
            }
        )

    return app
