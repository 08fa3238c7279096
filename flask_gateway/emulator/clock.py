"""The test clock: real UTC time plus an offset kept in the database (shared by every process)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from flask import g, has_app_context
from sqlalchemy import select

from flask_gateway.core.timestamps import utcnow
from flask_gateway.emulator.models import ClockState, FaultRule, db

__all__ = ["advance", "load_request_state", "now", "offset"]


def offset() -> float:
    state = db.session.get(ClockState, 1)
    return state.offset_seconds if state else 0.0


#: Built once (building a statement costs more than running this one on SQLite).
_REQUEST_STATE: Final = select(
    select(ClockState.offset_seconds).where(ClockState.id == 1).scalar_subquery(),
    select(FaultRule.id).exists(),
)


def load_request_state() -> None:
    """Read the clock offset and whether any fault rule exists, in one query, and remember both for the
    app context (``now()`` and the fault check of every API operation need them: one round trip, not two).
    """
    stored, faults = db.session.execute(_REQUEST_STATE).one()
    g._emulator_clock_offset = float(stored) if stored is not None else 0.0
    g._emulator_any_faults = bool(faults)


def now() -> datetime:
    """The emulator's current time. Within one app context the offset is read once."""
    if has_app_context():
        cached = g.get("_emulator_clock_offset")
        if cached is None:
            load_request_state()
            cached = g._emulator_clock_offset
        return utcnow() + timedelta(seconds=cached)
    return utcnow()  # pragma: no cover - every caller runs in an app context


def advance(seconds: float) -> datetime:
    """Move the clock forward (never back); commit is the caller's."""
    if seconds < 0:
        raise ValueError("the clock only moves forward")
    state = db.session.get(ClockState, 1, with_for_update=True, populate_existing=True)
    if state is None:
        state = ClockState(id=1, offset_seconds=0.0)
        db.session.add(state)
    state.offset_seconds += seconds
    g._emulator_clock_offset = state.offset_seconds
    return now()
