"""Deterministic fault injection, stored in the database so every worker process sees the same rules.

Rules (``POST /_emulator/faults``):

- ``status``: the next ``count`` calls to ``operation`` answer ``status`` (and ``Retry-After``), unprocessed.
- ``delay``: the next ``count`` calls to ``operation`` wait ``delayMs`` before being processed.
- ``drop_response``: create/refund: the work is committed, then the connection is reset, no answer.
- ``callback_fail``: the next ``count`` callback attempts fail (HTTP 500 recorded, nothing sent).
- ``callback_timeout``: the next ``count`` callback attempts time out (nothing sent).
- ``new_signing_key``: the next ``count`` settings updates issue the account a new signing key: the update
  is verified with the key it had, answers the new one in ``signingKey``, and the gateway signs with it
  from then on (callbacks already on their way keep the old signature). Not a failure: the account
  manager's key change, for a shop to rehearse.

``count`` omitted: the rule stays until ``DELETE /_emulator/faults`` or a reset.
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass
from typing import Annotated, Any, Final, Literal

from flask import g, has_request_context, request
from pydantic import Field, Strict, model_validator
from sqlalchemy import select

from flask_gateway.core.auth import ACCOUNT_HEADER
from flask_gateway.core.sql import begin_writing
from flask_gateway.core.wire import WireModel
from flask_gateway.emulator import clock
from flask_gateway.emulator.models import FaultRule, db
from flask_gateway.emulator.problems import ApiProblem, ResponseDropped

__all__ = [
    "API_OPERATIONS",
    "FaultSpec",
    "ResponseDropped",
    "TakenFault",
    "add",
    "before_operation",
    "describe",
    "drop_connection",
    "take",
    "take_drop",
    "take_new_signing_key",
]

API_OPERATIONS: Final = (
    "create",
    "update",
    "cancel",
    "getstatus",
    "refund",
    "install",
    "settings",
    "v1_configuration",
    "v1_checkout",
    "v1_refund",
)
FaultKind = Literal[
    "status", "delay", "drop_response", "callback_fail", "callback_timeout", "new_signing_key"
]


class FaultSpec(WireModel):
    """The body of ``POST /_emulator/faults``."""

    operation: Literal[
        "create",
        "update",
        "cancel",
        "getstatus",
        "refund",
        "install",
        "settings",
        "v1_configuration",
        "v1_checkout",
        "v1_refund",
        "callback",
    ]
    kind: FaultKind
    status: Annotated[int, Strict(), Field(ge=400, le=599)] | None = None
    retryAfter: Annotated[int, Strict(), Field(ge=0, le=3600)] | None = None
    delayMs: Annotated[int, Strict(), Field(ge=0, le=60_000)] | None = None
    count: Annotated[int, Strict(), Field(ge=1, le=1_000_000)] | None = None

    @model_validator(mode="after")
    def _consistent(self) -> FaultSpec:
        callback_kind = self.kind in ("callback_fail", "callback_timeout")
        if callback_kind != (self.operation == "callback"):
            raise ValueError(
                "callback_fail and callback_timeout go with operation 'callback', and only they do"
            )
        if self.kind == "status" and self.status is None:
            raise ValueError("a 'status' fault needs the status to answer")
        if self.kind == "delay" and self.delayMs is None:
            raise ValueError("a 'delay' fault needs delayMs")
        if self.kind == "drop_response" and self.operation not in ("create", "refund"):
            raise ValueError("drop_response applies to create and refund")
        if self.kind == "new_signing_key" and self.operation != "settings":
            raise ValueError("new_signing_key applies to settings")
        return self


def add(spec: FaultSpec) -> FaultRule:
    rule = FaultRule(
        operation=spec.operation,
        kind=spec.kind,
        status=spec.status,
        retry_after=spec.retryAfter,
        delay_ms=spec.delayMs,
        remaining=spec.count,
        created_at=clock.now(),
    )
    db.session.add(rule)
    db.session.flush()
    return rule


def describe(rule: FaultRule) -> dict[str, Any]:
    return {
        "id": rule.id,
        "operation": rule.operation,
        "kind": rule.kind,
        "status": rule.status,
        "retryAfter": rule.retry_after,
        "delayMs": rule.delay_ms,
        "remaining": rule.remaining,
    }


@dataclass(frozen=True)
class TakenFault:
    """One use of a rule, as it was when taken (a plain value: the rule row may be gone the next moment)."""

    kind: str
    status: int | None
    retry_after: int | None
    delay_ms: int | None


def take(operation: str, *kinds: str) -> TakenFault | None:
    """Consume one use of the oldest matching rule (row-locked, so workers never share a use).

    Returns the rule's values read under the lock, not the row: after the commit another process may
    consume the rule's last use and delete it, and reading the expired row again would then fail.
    """
    begin_writing(db.session())
    rule = db.session.scalars(
        select(FaultRule)
        .where(FaultRule.operation == operation, FaultRule.kind.in_(kinds))
        .order_by(FaultRule.id)
        .limit(1)
        .with_for_update(skip_locked=True)
        .execution_options(populate_existing=True)
    ).first()
    if rule is None:
        return None
    taken = TakenFault(
        kind=rule.kind, status=rule.status, retry_after=rule.retry_after, delay_ms=rule.delay_ms
    )
    if rule.remaining is not None:
        rule.remaining -= 1
        if rule.remaining <= 0:
            db.session.delete(rule)
    db.session.commit()
    return taken


def before_operation(operation: str) -> None:
    """Apply ``status`` and ``delay`` rules for an API operation, before it is processed."""
    if not _any_rules():
        return
    rule = take(operation, "status", "delay")
    if rule is None:
        return
    if rule.kind == "delay":
        time.sleep((rule.delay_ms or 0) / 1000)
        return
    headers = {"Retry-After": str(rule.retry_after)} if rule.retry_after is not None else None
    raise ApiProblem(
        rule.status or 500, f"Injected fault: {operation} answers {rule.status}.", headers=headers
    )


def _any_rules() -> bool:
    # One cheap query per request (together with the clock offset), remembered for the request: the hot
    # path when no fault is configured.
    cached = g.get("_emulator_any_faults")
    if cached is None:
        # With the account a signed request names: authenticating it then needs no query of its own.
        clock.load_request_state(request.headers.get(ACCOUNT_HEADER) if has_request_context() else None)
        cached = g._emulator_any_faults
    return bool(cached)


def take_drop(operation: str) -> bool:
    """True (one use consumed) when a ``drop_response`` rule applies to this operation's answer."""
    return _any_rules() and take(operation, "drop_response") is not None


def take_new_signing_key() -> bool:
    """True (one use consumed) when a ``new_signing_key`` rule applies to this settings update."""
    return _any_rules() and take("settings", "new_signing_key") is not None


def drop_connection() -> None:
    """Reset the client's connection (RST) after the work was committed; the answer is never sent."""
    sock = request.environ.get("werkzeug.socket") or request.environ.get("gunicorn.socket")
    if not isinstance(sock, socket.socket):
        raise ResponseDropped("the response was dropped by an injected fault (connection reset after commit)")
    try:
        # Linger 0: when the server closes the descriptor the peer gets a reset. shutdown() makes the
        # connection end now (the server's own file objects keep the descriptor open a little longer).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # pragma: no cover - already gone
        pass
