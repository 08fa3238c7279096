"""Idempotent create and refund, keyed by (account, operation, requestId) and kept 24 hours.

The key row is claimed in its own committed transaction (the unique constraint decides the race between
processes), the work and the stored answer are committed together, so a replay always sees either
"in flight" (409) or the complete answer.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from datetime import timedelta
from typing import Final, cast

from flask import Response
from sqlalchemy import Table, bindparam, delete, insert, select, update
from sqlalchemy.exc import IntegrityError

from flask_gateway.core.signing import canonicalize
from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.emulator import clock
from flask_gateway.emulator.api import json_response
from flask_gateway.emulator.models import IdempotencyKey, db
from flask_gateway.emulator.problems import ApiProblem

__all__ = ["RETENTION", "STALE_IN_FLIGHT", "run_idempotent"]

RETENTION: Final = timedelta(hours=24)
#: An in-flight key older than this was left by a crashed worker: it may be taken over.
STALE_IN_FLIGHT: Final = timedelta(seconds=60)
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
    with the stored answer. An ``ApiProblem`` (4xx) is stored and replayed too; any other exception
    releases the key so that a retry runs the work again.
    """
    if not request_id:
        response = work()
        db.session.commit()
        return response
    body_hash = _body_hash(raw_body)
    key = _claim(account_id, operation, request_id, body_hash)
    if isinstance(key, Response):
        return key
    try:
        response = work()
    except ApiProblem as problem:
        db.session.rollback()
        response = json_response(problem.body(), problem.status, problem.headers)
    except BaseException:
        db.session.rollback()
        db.session.execute(delete(IdempotencyKey).where(IdempotencyKey.id == key))
        db.session.commit()
        raise
    # One UPDATE with the work's changes (no re-read of the key); no row only if a reset ran meanwhile.
    db.session.connection().execute(
        _COMPLETE,
        {"key": key, "status_code": response.status_code, "response_body": response.get_data(as_text=True)},
    )
    db.session.commit()
    return response


_KEYS: Final = cast(Table, IdempotencyKey.__table__)
#: Built once, on the table (SQLAlchemy Core: no unit of work, no ORM statement compilation per request).
_INSERT: Final = insert(_KEYS).returning(_KEYS.c.id)
_COMPLETE: Final = (
    update(_KEYS)
    .where(_KEYS.c.id == bindparam("key"))
    .values(completed=True, status_code=bindparam("status_code"), response_body=bindparam("response_body"))
)


def _claim(account_id: str, operation: str, request_id: str, body_hash: str) -> int | Response:
    """The new key's id, or the answer for an existing key (replay, 409 in flight, 422 mismatch)."""
    for _ in range(3):
        now = clock.now()
        row = {
            "account_id": account_id,
            "operation": operation,
            "request_id": request_id,
            "body_hash": body_hash,
            "completed": False,
            "created_at": now,
        }
        try:
            key_id: int = db.session.connection().execute(_INSERT, row).scalar_one()
            # The work goes on with the account the request authenticated, without reading it again.
            commit_keeping_loaded(db.session())
            return key_id
        except IntegrityError:
            db.session.rollback()
        existing = db.session.scalars(
            select(IdempotencyKey).where(
                IdempotencyKey.account_id == account_id,
                IdempotencyKey.operation == operation,
                IdempotencyKey.request_id == request_id,
            )
        ).one_or_none()
        if existing is None:
            continue  # released meanwhile: claim again
        expired = existing.created_at + RETENTION <= now
        abandoned = not existing.completed and existing.created_at + STALE_IN_FLIGHT <= now
        if expired or abandoned:
            db.session.delete(existing)
            db.session.commit()
            continue
        if existing.body_hash != body_hash:
            db.session.rollback()
            raise ApiProblem(
                422, f"requestId {request_id!r} was already used with a different body: use a new requestId."
            )
        if not existing.completed:
            db.session.rollback()
            raise ApiProblem(
                409, f"A request with requestId {request_id!r} is still in flight: retry shortly."
            )
        replay = Response(
            existing.response_body or "",
            status=existing.status_code or 200,
            mimetype="application/json",
            headers={REPLAY_HEADER: "true"},
        )
        db.session.rollback()
        return replay
    raise ApiProblem(409, f"requestId {request_id!r} is contended: retry shortly.")
