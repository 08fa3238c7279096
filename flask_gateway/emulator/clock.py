"""The test clock: real UTC time plus an offset kept in the database (shared by every process)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final

from flask import g, has_app_context
from sqlalchemy import bindparam, select

from flask_gateway.core.timestamps import utcnow
from flask_gateway.emulator.models import Account, ClockState, FaultRule, db

__all__ = ["advance", "load_request_state", "now", "offset"]


def offset() -> float:
    state = db.session.get(ClockState, 1)
    return state.offset_seconds if state else 0.0


_OFFSET: Final = select(ClockState.offset_seconds).where(ClockState.id == 1).scalar_subquery()
_ANY_FAULTS: Final = select(FaultRule.id).exists()
#: Built once (building a statement costs more than running this one on SQLite).
_REQUEST_STATE: Final = select(_OFFSET, _ANY_FAULTS)
#: The same with the account a signed request names (no row when there is no such account).
_REQUEST_STATE_AND_ACCOUNT: Final = select(Account, _OFFSET, _ANY_FAULTS).where(
    Account.merchant_account_id == bindparam("account_id")
)


def load_request_state(account_id: str | None = None) -> None:
    """Read the clock offset and whether any fault rule exists, in one query, and remember both for the
    app context (``now()`` and the fault check of every API operation need them: one round trip, not two).

    ``account_id`` (the account header of a signed request): that account is read in the same query, so
    that authenticating the request finds it in the session instead of asking the database again.
    """
    row = None
    if account_id and "\x00" not in account_id:  # PostgreSQL refuses U+0000 in a query
        row = db.session.execute(_REQUEST_STATE_AND_ACCOUNT, {"account_id": account_id}).first()
    if row is None:
        stored, faults = db.session.execute(_REQUEST_STATE).one()
    else:
        # Held for the app context: the session's identity map only keeps weak references.
        g._emulator_request_account, stored, faults = row
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
