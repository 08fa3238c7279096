"""The test clock: real UTC time plus an offset kept in the database (shared by every process)."""

from __future__ import annotations

from datetime import datetime, timedelta

from flask import g, has_app_context

from flask_gateway.core.timestamps import utcnow
from flask_gateway.emulator.models import ClockState, db

__all__ = ["advance", "now", "offset"]


def offset() -> float:
    state = db.session.get(ClockState, 1)
    return state.offset_seconds if state else 0.0


def now() -> datetime:
    """The emulator's current time. Within one app context the offset is read once."""
    if has_app_context():
        cached = g.get("_emulator_clock_offset")
        if cached is None:
            cached = g._emulator_clock_offset = offset()
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
