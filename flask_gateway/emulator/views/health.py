"""Health probes at the emulator's root (under the mount prefix when embedded), open: no control token.

- ``GET /livez``: 200 ``{"status": "ok"}`` while the process answers; touches no database, so a
  database outage never gets a healthy process restarted.
- ``GET /readyz``: the named checks of :func:`~flask_gateway.emulator.database.readiness` (``database``,
  ``schema``, ``accounts``), as the extension's ``/gateway/readyz`` answers them: 200 ``{"status":
  "ready", "checks": {name: {"ok": true, "detail": ...}}}`` when all pass, else 503 with ``Retry-After``
  and ``"status": "unavailable"``, ``"failing": [names]``, ``"message": "Not ready: database
  (unreachable)."``; a check not run because an earlier one failed has ``"ok": null``. A probe prepares
  the database on first use like any request, so a fresh emulator becomes ready without other traffic.

The models below are the answers and their schemas in the OpenAPI document (``emulator/openapi.py``).
"""

from __future__ import annotations

from typing import Final, Literal

from flask import Blueprint, Response
from pydantic import BaseModel

from flask_gateway.core.outages import RETRY_AFTER_SECONDS
from flask_gateway.core.wire import dumps
from flask_gateway.emulator.api import settings
from flask_gateway.emulator.database import readiness
from flask_gateway.emulator.models import db

__all__ = ["HEALTH_BLUEPRINT", "CheckAnswer", "Liveness", "Readiness", "bp"]

HEALTH_BLUEPRINT: Final = "emulator_health"

bp = Blueprint(HEALTH_BLUEPRINT, __name__)

#: Probes must never be answered from a cache between the prober and the process.
_NO_STORE: Final = {"Cache-Control": "no-store"}


class Liveness(BaseModel):
    """``GET /livez``: the process answers."""

    status: Literal["ok"] = "ok"


class CheckAnswer(BaseModel):
    """One check of ``GET /readyz``."""

    #: null: not run, because an earlier check failed.
    ok: bool | None
    detail: str


class Readiness(BaseModel):
    """``GET /readyz``: every check by name; when not ready, the failing ones and a message."""

    status: Literal["ready", "unavailable"]
    checks: dict[str, CheckAnswer]
    failing: list[str] | None = None
    message: str | None = None


def _json(body: BaseModel, status: int, headers: dict[str, str]) -> Response:
    # Top-level nulls left out (``failing`` and ``message`` of a ready answer); a check's ``ok`` kept.
    answer = {key: value for key, value in body.model_dump(mode="json").items() if value is not None}
    return Response(dumps(answer), status=status, headers=headers, mimetype="application/json")


@bp.get("/livez")
def livez() -> Response:
    return _json(Liveness(), 200, _NO_STORE)


@bp.get("/readyz")
def readyz() -> Response:
    checks = readiness(db.engine, settings())
    by_name = {check.name: CheckAnswer(ok=check.ok, detail=check.detail) for check in checks}
    failing = [check for check in checks if check.ok is False]
    if not failing:
        return _json(Readiness(status="ready", checks=by_name), 200, _NO_STORE)
    answer = Readiness(
        status="unavailable",
        checks=by_name,
        failing=[check.name for check in failing],
        message="Not ready: " + "; ".join(f"{check.name} ({check.detail})" for check in failing) + ".",
    )
    return _json(answer, 503, {**_NO_STORE, "Retry-After": str(RETRY_AFTER_SECONDS)})
