"""Idempotent create and refund, keyed by (account, operation, requestId) and kept 24 hours.

The claim on a key lives and dies with the transaction that does the work: nothing is committed before the
work, so a request that dies (its worker killed, its connection cut by a database restart) leaves no claim,
and its retry runs at once.

- **PostgreSQL**: ``pg_try_advisory_xact_lock(<64-bit hash of the key>)`` in the work's transaction, in
  the same statement that looks for the stored answer. For create and refund that is the request's first
  statement, the request state's (``clock.load_request_state``, ``clock.early_claim``: the account header and
  the body's ``requestId`` name the key; the outcome is used only for the key the request claims once it
  is authenticated and valid, and only while that transaction is open), otherwise a statement of its own.
  Not acquired: another request with the key is running right now, 409 "still in flight" (the documented
  answer to a truly concurrent duplicate). The lock ends with the transaction: at the commit, at a
  rollback, or at once when the connection dies.
- **SQLite**: the work's transaction began ``BEGIN IMMEDIATE`` (``core.sql.configure_sqlite``) at the
  look-up and holds the database's write lock; a concurrent duplicate waits for it (the busy timeout) and
  then finds the stored answer: a replay.

Found a stored answer: a replay (``idempotent-replay: true``), or 422 when the body differs. None: the work
runs, and its changes and the stored answer (the key row) are committed together; work that defers its
rows (:func:`defer_to_answer`: create) has them written with the key row, on PostgreSQL in one statement.
An ``ApiProblem`` (4xx) is stored and replayed too; any other exception rolls back the work, and no key is
left.

The unique constraint on the key is the backstop: work that commits in its middle (an expiry kept while
the request is refused) ends the lock early, so a duplicate may run beside it; the second of the two to
store its key meets the constraint, rolls its work back and answers what the first stored.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any, Final, cast

from flask import Response, g
from sqlalchemy import Connection, Table, and_, bindparam, delete, func, insert, literal, select, true
from sqlalchemy.exc import IntegrityError

from flask_gateway.core.signing import canonicalize
from flask_gateway.emulator import clock
from flask_gateway.emulator.api import json_response
from flask_gateway.emulator.clock import lock_key
from flask_gateway.emulator.models import IdempotencyKey, db
from flask_gateway.emulator.problems import ApiProblem

__all__ = [
    "REPLAY_HEADER",
    "RETENTION",
    "DeferredWrite",
    "defer_to_answer",
    "lock_key",
    "run_idempotent",
]

RETENTION: Final = timedelta(hours=24)
REPLAY_HEADER: Final = "idempotent-replay"


def _body_hash(raw: bytes) -> str:
    # Same canonical form as the signature: whitespace differences are the same request.
    return hashlib.sha256(canonicalize(raw)).hexdigest()


def run_idempotent(
    account_id: str,
    operation: str,
    request_id: str | None,
    raw_body: bytes,
    work: Callable[[], Response],
) -> Response:
    """Run ``work`` once per key; replay its stored answer afterwards.

    ``work`` makes its changes in ``db.session`` without committing; this function commits them together
    with the stored answer.
    """
    if not request_id:
        response = work()
        db.session.commit()
        return response
    key = {"account_id": account_id, "operation": operation, "request_id": request_id}
    body_hash = _body_hash(raw_body)
    found = _claim(key, body_hash)
    if found is not None:
        return found
    deferred: list[DeferredWrite] = []
    g._emulator_deferred_writes = deferred
    try:
        response = work()
    except ApiProblem as problem:
        deferred.clear()  # the work's rows are not written
        db.session.rollback()  # PostgreSQL: the advisory lock goes with it; stored below all the same
        response = json_response(problem.body(), problem.status, problem.headers)
    except BaseException:
        db.session.rollback()  # the work's changes and the claim end together: a retry runs at once
        raise
    finally:
        g._emulator_deferred_writes = None
    try:
        row = _stored(key, body_hash, response)
        if deferred:
            deferred[0](db.session.connection(), row)
        else:
            db.session.connection().execute(_INSERT, row)
        db.session.commit()
    except IntegrityError:
        # A duplicate stored its answer first (see the module docstring): ours is undone, theirs stands.
        db.session.rollback()
        stored = _stored_answer(key, body_hash)
        if stored is None:  # pragma: no cover - a unique violation means the row exists
            raise
        return stored
    return response


_KEYS: Final = cast(Table, IdempotencyKey.__table__)
#: Built once, on the table (SQLAlchemy Core: no unit of work, no ORM statement compilation per request).
_INSERT: Final = insert(_KEYS)
_MATCH: Final = and_(
    _KEYS.c.account_id == bindparam("account_id"),
    _KEYS.c.operation == bindparam("operation"),
    _KEYS.c.request_id == bindparam("request_id"),
)
_ANSWER_COLUMNS: Final = (
    _KEYS.c.id,
    _KEYS.c.body_hash,
    _KEYS.c.completed,
    _KEYS.c.status_code,
    _KEYS.c.response_body,
    _KEYS.c.created_at,
)
#: One row whatever is stored (``(SELECT 1) LEFT JOIN keys``): the lock's outcome, and the stored answer or
#: NULLs. One round trip for both: the lock and the look-up cost what the old claim's INSERT did.
_ONE: Final = select(literal(1).label("one")).subquery("one")
_LOCK_AND_LOOK_UP: Final = select(
    func.pg_try_advisory_xact_lock(bindparam("lock_key")).label("locked"), *_ANSWER_COLUMNS
).select_from(_ONE.outerjoin(_KEYS, _MATCH))
_LOOK_UP: Final = select(true().label("locked"), *_ANSWER_COLUMNS).select_from(_ONE.outerjoin(_KEYS, _MATCH))
_DELETE: Final = delete(_KEYS).where(_KEYS.c.id == bindparam("key_id"))


#: Writes the work's rows together with the key row it is given (one statement where the backend allows).
DeferredWrite = Callable[[Connection, Mapping[str, Any]], object]


def defer_to_answer(write: DeferredWrite) -> bool:
    """Inside :func:`run_idempotent`'s work: let ``write`` make the work's rows when the answer is stored,
    in the same transaction, given the key row to insert with them (on PostgreSQL one statement does both:
    one round trip instead of one per row). Returns False outside a claimed key (no ``requestId``, or no
    :func:`run_idempotent` at all): the caller writes its rows itself, at once.

    The claim is taken before the work as ever (the lock is held while the work runs); only the writes
    move to its end. The work must read nothing back from the rows it defers.
    """
    pending: list[DeferredWrite] | None = g.get("_emulator_deferred_writes")
    if pending is None or pending:  # not claimed, or a write is already deferred: the caller writes
        return False
    pending.append(write)
    return True


def _stored(key: Mapping[str, str], body_hash: str, response: Response) -> dict[str, Any]:
    return {
        **key,
        "body_hash": body_hash,
        "completed": True,
        "status_code": response.status_code,
        "response_body": response.get_data(as_text=True),
        "created_at": clock.now(),
    }


def _claim(key: Mapping[str, str], body_hash: str) -> Response | None:
    """Take the key for this transaction: None (the work may run), or the answer (replay, 409, 422)."""
    connection = db.session.connection()
    early = clock.early_claim(key["account_id"], key["operation"], key["request_id"])
    if early is not None:
        row: Any = early
    elif connection.dialect.name == "postgresql":
        params = {**key, "lock_key": lock_key(key["account_id"], key["operation"], key["request_id"])}
        row = connection.execute(_LOCK_AND_LOOK_UP, params).one()
    else:
        row = connection.execute(_LOOK_UP, key).one()
    if not row.locked:
        db.session.rollback()
        raise ApiProblem(
            409, f"A request with requestId {key['request_id']!r} is still in flight: retry shortly."
        )
    if row.id is None:
        return None
    # Expired (24 h of the test clock), or left unfinished by an older version of the emulator (which
    # claimed keys in a transaction of their own): forgotten, in this transaction, under the lock.
    if not row.completed or row.created_at + RETENTION <= clock.now():
        connection.execute(_DELETE, {"key_id": row.id})
        return None
    return _answer(key, body_hash, row.body_hash, row.status_code, row.response_body)


def _stored_answer(key: Mapping[str, str], body_hash: str) -> Response | None:
    row = db.session.connection().execute(_LOOK_UP, dict(key)).one()
    if row.id is None:
        db.session.rollback()
        return None
    return _answer(key, body_hash, row.body_hash, row.status_code, row.response_body)


def _answer(
    key: Mapping[str, str], body_hash: str, stored_hash: str, status: int | None, body: str | None
) -> Response:
    """The replay of a stored answer, or 422 for a different body (the transaction ended first)."""
    db.session.rollback()
    if stored_hash != body_hash:
        raise ApiProblem(
            422,
            f"requestId {key['request_id']!r} was already used with a different body: use a new requestId.",
        )
    return Response(
        body or "", status=status or 200, mimetype="application/json", headers={REPLAY_HEADER: "true"}
    )
