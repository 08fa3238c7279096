"""The WSGI apps the benchmark serves with gunicorn (``apps:bare_app()`` etc.); configured by environment.

- ``bare_app``: the yardstick of the emulator figures, one JSON endpoint, no database, no validation.
- ``shop_app``: a shop with the extension on ``BENCH_DATABASE_URL`` (its ``/gateway/callback``), its
  gateway at ``BENCH_GATEWAY_URL`` (the emulator figure 3 serves), callbacks confirmed (the default).
- ``confirm_app``: the yardstick of the callback figure, the fewest steps the callback's contract allows
  on the same stack (Flask, Flask-SQLAlchemy, the same pool, the same emulator): verify the signature,
  one signed getstatus call over a keep-alive ``requests`` session per thread, check the answer backs the
  claim, one indexed ``UPDATE`` by token, commit.
- ``update_app``: the first round's yardstick, kept for reference: read the JSON body, one indexed
  ``UPDATE`` by token, commit (no signature, no confirmation).
"""

from __future__ import annotations

import json
import os
import threading
from datetime import UTC, datetime

import requests
from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue
from flask_sqlalchemy import SQLAlchemy
from flask_wtf import CSRFProtect
from sqlalchemy import text

from flask_gateway import Gateway
from flask_gateway.core.signing import sign, verify

#: The shop's settings (the installation row is written by the benchmark, encrypted with this key).
SHOP_CONFIG = {
    "SECRET_KEY": "benchmark-shop-secret",
    "GATEWAY_ENVIRONMENT": "emulator",
    "GATEWAY_BASE_URL": "http://127.0.0.1:9",
    "GATEWAY_INSTALL_URL": "http://127.0.0.1:9/install",
    "GATEWAY_V1_BASE_URL": "http://127.0.0.1:9",
    "GATEWAY_PUBLIC_URL": "http://127.0.0.1:8000",
    "GATEWAY_ORDER_ENDPOINT": "order_page",
    "GATEWAY_MAX_RETRIES": 0,
    # Figure 3 measures the callback as a shop runs it: confirmed with getstatus (the default, said here
    # so the figure cannot change with it); no rate limit on one client's load.
    "GATEWAY_CONFIRM_CALLBACKS": True,
    "GATEWAY_CALLBACK_RATE_LIMIT": None,
}


def bare_app() -> Flask:
    app = Flask("bare")

    @app.post("/bare")
    def bare() -> ResponseReturnValue:
        return jsonify(ok=True, answer=42)

    return app


def shop_app(database_url: str | None = None) -> tuple[Flask, SQLAlchemy]:
    """A shop as the example shop sets it up (CSRF protection on, the extension on the app's db)."""
    app = Flask("bench_shop")
    app.config.update(SHOP_CONFIG, SQLALCHEMY_DATABASE_URI=database_url or os.environ["BENCH_DATABASE_URL"])
    gateway_url = os.environ.get("BENCH_GATEWAY_URL")
    if gateway_url:
        app.config.update(GATEWAY_BASE_URL=gateway_url, GATEWAY_INSTALL_URL=f"{gateway_url}/install")
    db = SQLAlchemy()
    db.init_app(app)
    CSRFProtect(app)
    Gateway(app, db=db)

    @app.get("/orders/<reference>")
    def order_page(reference: str) -> str:
        return f"order {reference}"

    return app, db


def shop_wsgi() -> Flask:
    return shop_app()[0]


def update_app() -> Flask:
    """POST /bare-callback: the token from the JSON body, one UPDATE on the unique token index, commit."""
    app = Flask("bench_update")
    app.config.update(SQLALCHEMY_DATABASE_URI=os.environ["BENCH_DATABASE_URL"])
    db = SQLAlchemy()
    db.init_app(app)
    statement = text("UPDATE gateway_checkouts SET status = :status, updated_at = :now WHERE token = :token")

    @app.post("/bare-callback")
    def bare_callback() -> ResponseReturnValue:
        body = json.loads(request.get_data())
        db.session.execute(
            statement,
            {
                "status": body["checkoutPaymentStatus"],
                "now": datetime.now(UTC),
                "token": body["checkoutToken"],
            },
        )
        db.session.commit()
        return jsonify(ok=True)

    return app


#: The two statuses of one payment (``PAID_PENDING_CALLBACK`` becomes ``PAID`` once a callback is answered).
_PAYMENT = frozenset({"PAID", "PAID_PENDING_CALLBACK"})


def confirm_app() -> Flask:
    """POST /confirm-callback: what the callback's contract needs and nothing more.

    Verify ``X-Signature`` over the body, ask the gateway (``BENCH_GATEWAY_URL``) with one signed getstatus
    call on a keep-alive session of this thread, check its answer backs the claim (token, status, total),
    one ``UPDATE`` on the unique token index with the confirmed status, commit. No callback log, no row
    lock, no event, no outbox, no ORM entity, no validation of the answer beyond the three fields.
    """
    app = Flask("bench_confirm")
    app.config.update(SQLALCHEMY_DATABASE_URI=os.environ["BENCH_DATABASE_URL"])
    db = SQLAlchemy()
    db.init_app(app)
    account = os.environ["BENCH_ACCOUNT"]
    key = os.environ["BENCH_SIGNING_KEY"]
    getstatus_url = f"{os.environ['BENCH_GATEWAY_URL'].rstrip('/')}/v2/getstatus"
    local = threading.local()
    statement = text("UPDATE gateway_checkouts SET status = :status, updated_at = :now WHERE token = :token")

    @app.post("/confirm-callback")
    def confirm_callback() -> ResponseReturnValue:
        body = request.get_data()
        if not verify(body, key, request.headers.get("X-Signature")):
            return jsonify(error="signature"), 401
        claim = json.loads(body)
        token = claim["checkoutToken"]
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = requests.Session()
        asked = json.dumps({"checkoutToken": token}, separators=(",", ":")).encode()
        headers = {
            "Content-Type": "application/json",
            "X-Merchant-Account-ID": account,
            "X-Signature": sign(asked, key),
        }
        reply = session.post(getstatus_url, data=asked, headers=headers, timeout=10)
        if reply.status_code != 200:
            return jsonify(error="getstatus"), 503
        answer = reply.json()
        claimed, confirmed = claim["checkoutPaymentStatus"], answer["checkoutPaymentStatus"]
        if (
            answer["checkoutToken"] != token
            or (claimed != confirmed and not {claimed, confirmed} <= _PAYMENT)
            or answer["checkoutTotalCents"] != claim["checkoutTotalCents"]
        ):
            return jsonify(ok=True, confirmed=False)
        db.session.execute(statement, {"status": confirmed, "now": datetime.now(UTC), "token": token})
        db.session.commit()
        return jsonify(ok=True)

    return app
