"""Health probes at the emulator's root (under the mount prefix when embedded), open: no control token.

- ``GET /livez``: 200 ``{"status": "alive"}`` while the process answers; touches no database, so a
  database outage never gets a healthy process restarted.
- ``GET /readyz``: the named checks of :func:`~flask_gateway.emulator.database.readiness` (``database``,
  ``schema``, ``accounts``): 200 ``{"status": "ready", "checks": [...]}`` when all pass, else 503
  ``{"status": "unavailable", "message": ..., "failing": [names], "checks": [...]}`` with ``Retry-After``.
  Each check is ``{"name", "ok", "detail"}``. A probe prepares the database on first use like any
  request, so a fresh emulator becomes ready without other traffic.
"""

from __future__ import annotations

from typing import Any, Final

from flask import Blueprint, Response

from flask_gateway.core.outages import RETRY_AFTER_SECONDS
from flask_gateway.core.wire import dumps
from flask_gateway.emulator.api import settings
from flask_gateway.emulator.database import readiness
from flask_gateway.emulator.models import db

__all__ = ["HEALTH_BLUEPRINT", "bp"]

HEALTH_BLUEPRINT: Final = "emulator_health"

bp = Blueprint(HEALTH_BLUEPRINT, __name__)

#: Probes must never be cached by a proxy between the prober and the process.
_NO_STORE: Final = {"Cache-Control": "no-store"}


def _json(body: dict[str, Any], status: int, headers: dict[str, str]) -> Response:
    return Response(dumps(body), status=status, headers=headers, mimetype="application/json")


@bp.get("/livez")
def livez() -> Response:
    return _json({"status": "alive"}, 200, _NO_STORE)


@bp.get("/readyz")
def readyz() -> Response:
    checks = readiness(db.engine, settings())
    listed = [{"name": check.name, "ok": check.ok, "detail": check.detail} for check in checks]
    failing = [check.name for check in checks if not check.ok]
    if not failing:
        return _json({"status": "ready", "checks": listed}, 200, _NO_STORE)
    body = {
        "status": "unavailable",
        "message": f"Not ready: {', '.join(failing)} failing.",
        "failing": failing,
        "checks": listed,
    }
    return _json(body, 503, {**_NO_STORE, "Retry-After": str(RETRY_AFTER_SECONDS)})
