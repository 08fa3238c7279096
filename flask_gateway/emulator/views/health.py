"""Health probes at the emulator's root (under the mount prefix when embedded), open: no control token.

- ``GET /livez``: 200 ``{"status": "alive"}`` while the process answers; touches no database, so a
  database outage never gets a healthy process restarted.
- ``GET /readyz``: the named checks of :func:`~flask_gateway.emulator.database.readiness` (``database``,
  ``schema``, ``accounts``, each ``{"name", "ok", "detail"}``): 200 ``{"status": "ready", "failing": [],
  "checks": [...]}`` when all pass, else 503 ``{"status": "unavailable", "message": ..., "failing":
  [names], "checks": [...]}`` with ``Retry-After``. A probe prepares the database on first use like any
  request, so a fresh emulator becomes ready without other traffic.

The models below are the answers and their schemas in the OpenAPI document (``emulator/openapi.py``).
"""

from __future__ import annotations

from typing import Final, Literal

from flask import Blueprint, Response
from pydantic import BaseModel

from flask_gateway.core.outages import RETRY_AFTER_SECONDS
from flask_gateway.emulator.api import settings
from flask_gateway.emulator.database import ReadinessCheck, readiness
from flask_gateway.emulator.models import db

__all__ = ["HEALTH_BLUEPRINT", "Liveness", "Readiness", "bp"]

HEALTH_BLUEPRINT: Final = "emulator_health"

bp = Blueprint(HEALTH_BLUEPRINT, __name__)

#: Probes must never be answered from a cache between the prober and the process.
_NO_STORE: Final = {"Cache-Control": "no-store"}


class Liveness(BaseModel):
    """``GET /livez``: the process answers."""

    status: Literal["alive"] = "alive"


class Readiness(BaseModel):
    """``GET /readyz``: every check, and the names of the failing ones."""

    status: Literal["ready", "unavailable"]
    #: Only when not ready: which checks fail, in words.
    message: str | None = None
    failing: list[str]
    checks: list[ReadinessCheck]


def _json(body: BaseModel, status: int, headers: dict[str, str]) -> Response:
    payload = body.model_dump_json(exclude_none=True)
    return Response(payload, status=status, headers=headers, mimetype="application/json")


@bp.get("/livez")
def livez() -> Response:
    return _json(Liveness(), 200, _NO_STORE)


@bp.get("/readyz")
def readyz() -> Response:
    checks = readiness(db.engine, settings())
    failing = [check.name for check in checks if not check.ok]
    if not failing:
        return _json(Readiness(status="ready", failing=[], checks=checks), 200, _NO_STORE)
    answer = Readiness(
        status="unavailable",
        message=f"Not ready: {', '.join(failing)} failing.",
        failing=failing,
        checks=checks,
    )
    return _json(answer, 503, {**_NO_STORE, "Retry-After": str(RETRY_AFTER_SECONDS)})
