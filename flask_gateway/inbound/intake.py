"""What every callback request goes through before its payload is read: the rate limit, the size limit,
the log row (whole for a verified request, a bounded excerpt for a refused one) and the refusals, each
recorded, counted against the client and signalled (``callback_rejected``) after its commit.

Imports :mod:`flask_gateway.inbound.probe` (a refused unsigned request may be the doctor's probe).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable
from typing import Final, NoReturn

from flask import current_app
from werkzeug.datastructures import Headers

from flask_gateway import signals
from flask_gateway.core.auth import ACCOUNT_HEADER
from flask_gateway.core.outages import is_database_outage
from flask_gateway.core.sql import commit_keeping_loaded, statement_by_statement, storable_text
from flask_gateway.core.timestamps import utcnow
from flask_gateway.errors import (
    CallbackConfirmFailed,
    CallbackRateLimited,
    CallbackRejected,
    CallbackTooLarge,
    CallbackUnauthorized,
)
from flask_gateway.inbound.probe import _is_doctor_probe
from flask_gateway.models import CallbackLog, CallbackOutcome, GatewayCheckout
from flask_gateway.state import get_state

__all__ = ["EXCERPT_CHARS", "MAX_CALLBACK_BYTES", "check_rate_limit", "loggable_headers", "refuse_oversize"]

_log = logging.getLogger("flask_gateway.inbound")  # not __name__: the name is an interface (docs/logging.md)


#: A status payload is about 1 KiB; anything over this is not a callback (413, not read).
MAX_CALLBACK_BYTES: Final = 64 * 1024
#: What a refused callback keeps of its body (characters).
EXCERPT_CHARS: Final = 256


#: Header names that may carry a secret: never stored.
_SECRET_HEADER: Final = re.compile(
    r"signature|authorization|cookie|secret|token|api[-_]?key|password|session", re.I
)
_MAX_HEADERS: Final = 50
_MAX_HEADER_VALUE: Final = 1024
#: The headers a refused callback keeps, each cut to ``_EXCERPT_HEADER_VALUE`` characters.
_EXCERPT_HEADERS: Final = ("Content-Type", "Content-Length", "User-Agent", ACCOUNT_HEADER)
_EXCERPT_HEADER_VALUE: Final = 100
_DETAIL_CHARS: Final = 500


def loggable_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The headers worth keeping, without any that may carry a secret (signature, credentials, cookies)."""
    kept: dict[str, str] = {}
    for name, value in headers:
        if _SECRET_HEADER.search(name):
            continue
        if name not in kept and len(kept) >= _MAX_HEADERS:
            continue
        value = storable_text(value, _MAX_HEADER_VALUE)
        kept[name] = f"{kept[name]}, {value}" if name in kept else value
    return kept


def _claimed_account(headers: Headers) -> str | None:
    claimed = headers.get(ACCOUNT_HEADER)
    return storable_text(claimed, 255) if claimed else None


def _new_log(headers: Headers, body: bytes, client: str | None) -> CallbackLog:
    """The full log row of a verified callback (headers without secrets, the body as text)."""
    return CallbackLog(
        received_at=utcnow(),
        merchant_account_id=_claimed_account(headers),
        headers=loggable_headers(headers),
        body=body[:MAX_CALLBACK_BYTES].decode("utf-8", errors="replace"),
        verified=True,
        outcome=CallbackOutcome.RECEIVED.value,
        http_status=0,
        detail="",
        client_address=client,
    )


def _send_rejected(checkout: GatewayCheckout | None, reason: str, log: CallbackLog) -> None:
    signals.callback_rejected.send(
        current_app._get_current_object(),  # type: ignore[attr-defined]
        checkout=checkout,
        account=None if checkout is None else checkout.merchant_account_id,
        reason=reason,
        log=log,
    )


def _count_against(client: str | None) -> None:
    state = get_state()
    if state.callback_limit is not None and client:
        state.session.commit()  # the counter commits on a connection of its own (SQLite: one writer)
        state.callback_limit.hit(client)


def _refuse_unverified(
    error: type[CallbackRejected], headers: Headers, body: bytes | None, client: str | None, reason: str
) -> NoReturn:
    """Keep a bounded excerpt of a request that proved nothing (401, 413), count it, signal, raise.

    ``flask gateway doctor``'s probe (:func:`doctor_probe_mark`) gets the same answer, and its row says
    ``doctor-probe``: it is not counted against the client nor signalled, and logged at INFO."""
    session = get_state().session
    session.rollback()
    probe = error is CallbackUnauthorized and _is_doctor_probe(headers, body)
    if probe:
        reason = f"flask gateway doctor's probe, answered as an unsigned callback: {reason}"
    excerpt = body[: EXCERPT_CHARS * 4].decode("utf-8", errors="replace")[:EXCERPT_CHARS] if body else ""
    log = CallbackLog(
        received_at=utcnow(),
        merchant_account_id=_claimed_account(headers),
        headers={
            name: storable_text(value, _EXCERPT_HEADER_VALUE)
            for name in _EXCERPT_HEADERS
            if (value := headers.get(name)) is not None
        },
        body=excerpt,
        verified=False,
        outcome=CallbackOutcome.DOCTOR_PROBE.value if probe else error.outcome,
        http_status=error.code or 400,
        detail=reason[:_DETAIL_CHARS],
        client_address=client,
    )
    session.add(log)
    commit_keeping_loaded(session)
    if probe:
        _log.info("Callback %s: %s (HTTP %s)", log.id, reason, error.code)
        raise error(log=log)
    _log.warning("Callback %s refused (HTTP %s, %s): %s", log.id, error.code, error.outcome, reason)
    _count_against(client)
    _send_rejected(None, reason, log)
    raise error(log=log)


def _reject(
    error: type[CallbackRejected],
    log: CallbackLog,
    reason: str,
    *,
    client: str | None,
    checkout: GatewayCheckout | None = None,
) -> NoReturn:
    """Record the refusal of a verified callback on its row (nothing else is kept), commit, signal, raise."""
    session = get_state().session
    session.rollback()
    session.add(log)  # stored already, or stored now with its outcome
    log.outcome = error.outcome
    log.http_status = error.code or 400
    log.detail = _noted(log, reason)
    log.checkout_id = checkout.id if checkout is not None else None
    log_id = log.id
    session.commit()
    _log.warning("Callback %s refused (HTTP %s, %s): %s", log_id, error.code, error.outcome, reason)
    if error.code != CallbackConfirmFailed.code:  # the gateway's own trouble, not the client's
        _count_against(client)
    _send_rejected(checkout, reason, log)
    raise error(log=log, checkout=checkout)


def _record_error(log_id: int, exc: BaseException) -> None:
    if is_database_outage(exc):
        # Nothing can be written: the row stays "received, never answered" (the health figures count it
        # as refused or unanswered), the answer is a 503 (views.answer_outages) and the gateway retries.
        return
    session = get_state().session
    try:
        session.rollback()
        log = session.get(CallbackLog, log_id)
        if log is not None:
            log.outcome = CallbackOutcome.ERROR.value
            log.http_status = 500
            log.detail = _noted(log, f"{type(exc).__name__} while processing: see the server log")
            session.commit()
    except Exception:  # the database itself may be what failed: keep the original error
        _log.exception("Could not record the failure of callback %s", log_id)
        try:
            session.rollback()
        except Exception:  # a dead connection: the teardown clears the session
            _log.debug("the rollback after callback %s failed too", log_id)


def refuse_oversize(headers: Headers, content_length: int | None, client: str | None = None) -> NoReturn:
    """Log an excerpt-less row for a callback whose body is over ``MAX_CALLBACK_BYTES`` and raise 413."""
    size = f"{content_length} bytes" if content_length is not None else "a body"
    _refuse_unverified(
        CallbackTooLarge,
        headers,
        None,
        client,
        f"{size} over the limit of {MAX_CALLBACK_BYTES} bytes; not read past it",
    )


def check_rate_limit(client: str | None) -> None:
    """429 (nothing stored) for a client that used up its refused callbacks.

    The callback's first steps begin here (``core.sql.statement_by_statement``: one statement each, up to
    the log row's commit): with the limit's counters in
    the database (the default storage), its read is one statement on the request's own connection
    (PostgreSQL), not a transaction on another connection of the pool."""
    state = get_state()
    limit = state.callback_limit
    if limit is None or not client:
        return
    statement_by_statement(state.session)
    wait = limit.retry_after(client)
    if wait is not None:
        _log.warning("Callback from %s not read: over the limit of refused callbacks", client)
        raise CallbackRateLimited(retry_after=wait)


#: How a replay's log row starts (``replay of callback #N``); what happened follows it.
_REPLAY: Final = "replay of callback"
_REPLAY_NOTE: Final = re.compile(rf"^{_REPLAY} #\d+")


def _noted(log: CallbackLog, detail: str) -> str:
    """``detail`` for the row, after the replay note the row starts with (if it is a replay)."""
    note = _REPLAY_NOTE.match(log.detail or "")
    return f"{note.group(0)}: {detail}" if note else detail
