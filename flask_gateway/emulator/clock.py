"""The test clock: real UTC time plus an offset kept in the database (shared by every process)."""

from __future__ import annotations

import hashlib
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, cast

from flask import g, has_app_context, has_request_context, request
from sqlalchemy import Table, and_, bindparam, func, select

from flask_gateway.core.sql import sqlite_read_transactions
from flask_gateway.core.timestamps import utcnow
from flask_gateway.emulator.models import Account, ClockState, FaultRule, IdempotencyKey, db

__all__ = [
    "EarlyClaim",
    "advance",
    "early_claim",
    "load_request_state",
    "lock_key",
    "now",
    "offset",
    "request_account",
]


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

#: The routes whose transactions are read-only ones (``views/v2.py``: ``operation(..., reads=True)``).
_READERS: Final = frozenset({"emulator_v2.getstatus"})
#: The routes whose idempotency key PostgreSQL claims in the request state's query, and their operation.
_CLAIMED_EARLY: Final = {"emulator_v2.create": "create", "emulator_v2.refund": "refund"}
_KEYS: Final = cast(Table, IdempotencyKey.__table__)
#: The same with the claim of the request's idempotency key (:func:`early_claim`): no row and no lock when
#: there is no such account; at most one key row (the key is unique).
_REQUEST_STATE_ACCOUNT_AND_CLAIM: Final = (
    select(
        _ACCOUNTS,
        _OFFSET,
        _ANY_FAULTS,
        func.pg_try_advisory_xact_lock(bindparam("lock_key")).label("locked"),
        _KEYS.c.id.label("key_id"),
        _KEYS.c.body_hash.label("key_body_hash"),
        _KEYS.c.completed.label("key_completed"),
        _KEYS.c.status_code.label("key_status_code"),
        _KEYS.c.response_body.label("key_response_body"),
        _KEYS.c.created_at.label("key_created_at"),
    )
    .select_from(
        _ACCOUNTS.outerjoin(
            _KEYS,
            and_(
                _KEYS.c.account_id == _ACCOUNTS.c.merchant_account_id,
                _KEYS.c.operation == bindparam("operation"),
                _KEYS.c.request_id == bindparam("request_id"),
            ),
        )
    )
    .where(_ACCOUNTS.c.merchant_account_id == bindparam("account_id"))
)


def lock_key(account_id: str, operation: str, request_id: str) -> int:
    """The PostgreSQL advisory lock key of an idempotency key: a signed 64-bit hash (``bigint``)."""
    digest = hashlib.blake2b(
        b"\x00".join(part.encode() for part in ("emulator-idempotency", account_id, operation, request_id)),
        digest_size=8,
    ).digest()
    return int.from_bytes(digest, "big", signed=True)


@dataclass(frozen=True)
class EarlyClaim:
    """The claim of an idempotency key taken in the request state's query: the lock's outcome and the
    stored answer's columns (None: no key stored)."""

    request: object
    transaction: object
    key: tuple[str, str, str]
    locked: bool
    id: int | None
    body_hash: str | None
    completed: bool
    status_code: int | None
    response_body: str | None
    created_at: datetime | None


def _early_claim_params(dialect: str, account_id: str) -> dict[str, Any] | None:
    """PostgreSQL, a create or refund whose body names a ``requestId``: the parameters of its key's claim,
    taken in the request state's query (one round trip for both, at the start of the request's one
    transaction). None otherwise: ``idempotency.run_idempotent`` claims the key itself, as ever.

    The key is the account the request names and the body's ``requestId`` as the before-request check
    parsed it (``api._parsed`` keeps ``(raw body, parsed value)`` in ``g``), before the request is
    authenticated or validated: :func:`early_claim` hands the outcome only to the claim of that same key,
    and only while the transaction that took the lock is still open.
    """
    if dialect != "postgresql" or not has_request_context():
        return None
    operation = _CLAIMED_EARLY.get(request.endpoint or "")
    parsed = g.get("_emulator_json")
    if operation is None or parsed is None or parsed[0] is not request.get_data(cache=True):
        return None
    request_id = parsed[1].get("requestId") if isinstance(parsed[1], dict) else None
    if not isinstance(request_id, str) or not request_id or "\x00" in request_id:
        return None
    return {
        "operation": operation,
        "request_id": request_id,
        "lock_key": lock_key(account_id, operation, request_id),
    }


def early_claim(account_id: str, operation: str, request_id: str) -> EarlyClaim | None:
    """The claim of this key that the request state's query took for the current request, if it did and
    its transaction (so its lock) is still open; then forgotten (used once). None: claim it now."""
    early: EarlyClaim | None = g.get("_emulator_early_claim")
    if early is None:
        return None
    g._emulator_early_claim = None
    transaction = db.session().get_transaction()
    if (
        early.request is not request._get_current_object()  # type: ignore[attr-defined]
        or early.key != (account_id, operation, request_id)
        or transaction is None
        or early.transaction is not transaction
    ):
        return None
    return early


def load_request_state(account_id: str | None = None) -> None:
    """Read the clock offset and whether any fault rule exists, in one query, and remember both for the
    app context (``now()`` and the fault check of every API operation need them: one round trip, not two).

    ``account_id`` (the account header of a signed request): that account is read in the same query, so
    that authenticating the request finds it in the session instead of asking the database again; on
    PostgreSQL a create or refund with a ``requestId`` claims its idempotency key in it too
    (``idempotency.early_claim``).
    """
    session = db.session()
    # SQLite, at the start of a request: read in a transaction of its own, DEFERRED (no write lock), ended
    # at once, so that a writing operation takes the database's write lock only when it starts its work,
    # not while it authenticates and validates the request (every other writer would wait meanwhile).
    # PostgreSQL: the request's one transaction (a second would cost round trips and gain nothing). Nor
    # for an operation that only reads (getstatus): its transactions take no write lock anyway.
    apart = (
        not session.in_transaction()
        and db.engine.dialect.name == "sqlite"
        and not (has_request_context() and request.endpoint in _READERS)
    )
    with sqlite_read_transactions() if apart else nullcontext():
        row = None
        if account_id and "\x00" not in account_id:  # PostgreSQL refuses U+0000 in a query
            connection = session.connection()
            # PostgreSQL, a create or refund with a requestId: its key's claim in the same query.
            claim = _early_claim_params(connection.dialect.name, account_id)
            if claim is None:
                row = connection.execute(_REQUEST_STATE_AND_ACCOUNT, {"account_id": account_id}).first()
            else:
                params = {"account_id": account_id, **claim}
                row = connection.execute(_REQUEST_STATE_ACCOUNT_AND_CLAIM, params).first()
                if row is not None:
                    g._emulator_early_claim = EarlyClaim(
                        request=request._get_current_object(),  # type: ignore[attr-defined]
                        transaction=session.get_transaction(),
                        key=(account_id, claim["operation"], claim["request_id"]),
                        locked=bool(row.locked),
                        id=row.key_id,
                        body_hash=row.key_body_hash,
                        completed=bool(row.key_completed),
                        status_code=row.key_status_code,
                        response_body=row.key_response_body,
                        created_at=row.key_created_at,
                    )
        if row is None:
            stored, faults = session.connection().execute(_REQUEST_STATE).one()
    if apart:
        session.rollback()  # it only read
    if row is not None:
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
