"""The WSGI apps the benchmark serves with gunicorn (``apps:bare_app()`` etc.); configured by environment.

- ``bare_app``: the yardstick of the emulator figures, one JSON endpoint, no database, no validation.
- ``shop_app``: a shop with the extension on ``BENCH_DATABASE_URL`` (its ``/gateway/callback``).
- ``update_app``: the yardstick of the callback figure, on the same database and stack (Flask,
  Flask-SQLAlchemy, the same pool): read the JSON body, one indexed ``UPDATE`` by token, commit.
"""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime

from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue
from flask_sqlalchemy import SQLAlchemy
from flask_wtf import CSRFProtect
from sqlalchemy import text

from flask_gateway import Gateway

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
    # Figure 3 measures the extension's own work per callback (signature, row lock, state machine) with no
    # gateway behind it: no getstatus confirmation (one round trip to the gateway, measured by figure 4),
    # and no rate limit on one client's load.
    "GATEWAY_CONFIRM_CALLBACKS": False,
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
