"""The test clock: real UTC time plus an offset kept in the database (shared by every process)."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Final, cast

from flask import g, has_app_context, has_request_context, request
from sqlalchemy import Table, bindparam, select

from flask_gateway.core.timestamps import utcnow
from flask_gateway.emulator.models import Account, ClockState, FaultRule, db

__all__ = ["advance", "load_request_state", "now", "offset", "request_account"]


def offset() -> float:
    state = db.session.get(ClockState, 1)
    return state.offset_seconds if state else 0.0


_OFFSET: Final = select(ClockState.offset_seconds).where(ClockState.id == 1).scalar_subquery().label("offset")
_ANY_FAULTS: Final = select(FaultRule.id).exists().label("any_faults")
#: Built once (building a statement costs more than running this one on SQLite).
_REQUEST_STATE: Final = select(_OFFSET, _ANY_FAULTS)
_ACCOUNTS: Final = cast(Table, Account.__table__)
#: The same with the account a signed request names (no row when there is no such account), its columns
#: read with SQLAlchemy Core (loading an ORM entity cost more than the query).
_REQUEST_STATE_AND_ACCOUNT: Final = select(_ACCOUNTS, _OFFSET, _ANY_FAULTS).where(
    _ACCOUNTS.c.merchant_account_id == bindparam("account_id")
)


def load_request_state(account_id: str | None = None) -> None:
    """Read the clock offset and whether any fault rule exists, in one query, and remember both for the
    app context (``now()`` and the fault check of every API operation need them: one round trip, not two).

    ``account_id`` (the account header of a signed request): that account is read in the same query, so
    that authenticating the request finds it in the session instead of asking the database again.
    """
    row = None
    if account_id and "\x00" not in account_id:  # PostgreSQL refuses U+0000 in a query
        row = db.session.connection().execute(_REQUEST_STATE_AND_ACCOUNT, {"account_id": account_id}).first()
    if row is None:
        stored, faults = db.session.execute(_REQUEST_STATE).one()
    else:
        values = row._mapping
        stored, faults = values[_OFFSET], values[_ANY_FAULTS]
        if has_request_context():
            # For this request only (``request_account``), an object outside the session: read, never
            # changed (a route that changes the account locks and reads it again).
            account = Account(**{column.key: values[column] for column in _ACCOUNTS.columns})
            g._emulator_request_account = (request._get_current_object(), account)  # type: ignore[attr-defined]
    g._emulator_clock_offset = float(stored) if stored is not None else 0.0
    g._emulator_any_faults = bool(faults)


def request_account(account_id: str) -> Account | None:
    """The account ``account_id`` as :func:`load_request_state` read it for the current request, if it
    did (None otherwise: the caller reads it itself)."""
    loaded = g.get("_emulator_request_account")
    if loaded is None or loaded[0] is not request._get_current_object():  # type: ignore[attr-defined]
        return None
    account: Account = loaded[1]
    return account if account.merchant_account_id == account_id else None


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
