"""What the gateway sends the shop: signed status callbacks, v1 outcome calls, and shoppers coming back.

No view code here: ``views/public.py`` reads the request and hands the parts over. Every status change
goes through :func:`flask_gateway.transitions.apply` (row lock, forward only, amount and account checks,
signals once, after the commit).

Status callback (:func:`process_callback`). A callback is a *claim*: its signature proves who signed it,
and the sandbox signs anything for anyone (its 401 answers carry ``expectedSignature``), so the money
never moves on a signature alone.

1. **Rate limit.** A client that used up its refusals (``GATEWAY_CALLBACK_RATE_LIMIT`` per client address:
   refused, unconfirmed and mismatched callbacks count, accepted ones and duplicates do not) gets 429
   with ``Retry-After``: nothing is read, verified or stored.
2. **Verification, before anything large is stored.** ``X-Signature`` must verify over the exact raw body
   with the installation's signing key. ``X-Merchant-Account-ID``, when present, must be the installed
   account (``hmac.compare_digest``); when absent, the signature alone decides: no public source shows
   that the gateway sends that header (docs/decisions.md). A refused request keeps a bounded excerpt
   (``CallbackLog``: the first 256 characters of the body, four short headers, the reason, the client
   address), so a flood costs a few hundred bytes a request, and the limit caps those.
3. A verified callback is stored in full (the headers without secrets: no ``X-Signature``,
   ``Authorization``, ``Cookie``, ...; the body as text, ``http_status=0`` until answered), then parsed as
   a ``CheckoutStatusPayload``; its ``checkoutToken`` must name one of our v2 checkouts.
4. **Confirmation** (``GATEWAY_CONFIRM_CALLBACKS``, on by default): a callback that would change the
   checkout (a payment, a consumer cancellation, a refund status) is checked with one getstatus call,
   made with no transaction open. The answer must agree with the claim on the token, the status (the two
   payment statuses count as one: the gateway moves ``PAID_PENDING_CALLBACK`` to ``PAID`` when a callback
   is acknowledged) and the amount; the account is the installation's, whose key signed the request and
   the getstatus call. What is applied is the gateway's answer. A claim the answer contradicts applies
   nothing of its own: the answer is applied as a poll would (so a refund the gateway reports is
   recorded), the row says ``unconfirmed`` and ``callback_rejected`` fires.
5. The status is applied under the row lock (a confirmed ``PAID_PENDING_CALLBACK`` is recorded as
   ``PAID``: the gateway says ``PAID`` once the shop answers 200, and this answer is that 200, see
   :func:`_recorded_status` and docs/decisions.md); the log row's outcome is written in the same transaction,
   and the answer is sent only after that commit.

Answers (``CallbackLog.outcome`` in brackets):

====  =====================================================================================================
200   applied (``accepted``); already known, e.g. a retry or a replay (``duplicate``); a status the shop
      does not act on from a callback (unknown strings; refund statuses when confirmation is off) or a
      stale one, e.g. ``PAID_PENDING_CALLBACK`` after ``PAID`` (``ignored``); amount or account mismatch
      (``mismatch``); a claim getstatus contradicts (``unconfirmed``)
400   correctly signed, but not a status payload: malformed JSON, missing or wrong fields (``invalid-body``)
401   wrong or missing signature, account header present but not the installed account, or no
      installation (``rejected-signature``, an excerpt)
404   signed payload whose ``checkoutToken`` is not one of our v2 checkouts (``unknown-checkout``)
413   body over 64 KiB, also a chunked one, not read past the limit (``too-large``, an excerpt)
429   the client used up its refusals: nothing stored
503   the gateway could not be asked to confirm (``confirm-failed``): it retries, reconciliation settles it
500   an unexpected error; the transaction is rolled back and the row says ``error``: the gateway retries
====  =====================================================================================================

**Mismatch answers 200.** A verified callback whose ``checkoutTotalCents`` differs from the checkout's
total, or whose account is not the checkout's, is authentic: the gateway did send it. Retrying cannot make
the amounts agree, so a 4xx would only buy three identical attempts, a dead letter and failure e-mails,
while the discrepancy needs a person. So the callback is acknowledged, the checkout is flagged (never
paid: ``transitions.apply`` refuses the observation), the row says ``mismatch`` and ``callback_rejected``
fires so the shop can alert someone. Getstatus and reconciliation make the same check, so nothing else
can pay the checkout by the back door either.

``callback_rejected`` is sent (with ``checkout`` or None, ``reason`` and ``log``) after the rejection is
committed: for every 4xx answer (429 excepted: nothing is stored), a mismatch and an unconfirmed claim.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import re
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, NoReturn

from flask import current_app
from pydantic import ValidationError
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session
from werkzeug.datastructures import Headers
from werkzeug.exceptions import NotFound

from flask_gateway import signals
from flask_gateway.core.auth import ACCOUNT_HEADER, SIGNATURE_HEADER
from flask_gateway.core.errors import GatewayError, NotFoundError
from flask_gateway.core.http import describe_validation_error
from flask_gateway.core.outages import is_database_outage
from flask_gateway.core.sql import commit_keeping_loaded, storable_text
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import (
    OPERATOR,
    PAYMENT_STATUSES,
    CheckoutStatus,
    CheckoutStatusPayload,
    V1FailReason,
    V1MerchantAnswer,
    V1OutcomeStatus,
    WireNames,
)
from flask_gateway.errors import (
    CallbackBodyInvalid,
    CallbackCheckoutUnknown,
    CallbackConfirmFailed,
    CallbackRateLimited,
    CallbackRejected,
    CallbackTooLarge,
    CallbackUnauthorized,
    InvalidReturnLink,
    NotInstalledError,
    SecretUnreadable,
    V1OutcomeForbidden,
    V1OutcomeInvalid,
    V1OutcomeRejected,
    V1OutcomeUnknown,
)
from flask_gateway.models import CallbackLog, CallbackOutcome, GatewayCheckout
from flask_gateway.polling import refresh
from flask_gateway.signing import verify
from flask_gateway.state import get_state
from flask_gateway.transitions import (
    Observation,
    Transition,
    apply,
    send_pending,
    would_apply,
)
from flask_gateway.urls import external_url, load_signed_reference, return_url

__all__ = [
    "EXCERPT_CHARS",
    "MAX_CALLBACK_BYTES",
    "PROBE_HEADER",
    "CallbackOutcome",
    "CallbackResult",
    "V1Reply",
    "doctor_probe_mark",
    "loggable_headers",
    "process_callback",
    "process_return",
    "process_v1_outcome",
    "refuse_oversize",
    "shop_return_url",
]

_log = logging.getLogger(__name__)

S = CheckoutStatus

#: A status payload is about 1 KiB; anything over this is not a callback (413, not read).
MAX_CALLBACK_BYTES: Final = 64 * 1024
#: What a refused callback keeps of its body (characters).
EXCERPT_CHARS: Final = 256

#: The statuses a callback may apply: a payment (the spec: accept payment only for these two) and the
#: consumer's cancellation (sent when the account manager enabled it).
_APPLIED_FROM_CALLBACK: Final = frozenset(
    {S.PAID.value, S.PAID_PENDING_CALLBACK.value, S.CANCELLED_BY_CONSUMER.value}
)
#: Applied from a callback only once getstatus confirmed them (the gateway's answer is then applied).
_APPLIED_WHEN_CONFIRMED: Final = frozenset({S.PARTIALLY_REFUNDED.value, S.FULLY_REFUNDED.value})
#: What a return page may still learn something about from the gateway (a payment, its acknowledgement).
_STILL_OPEN: Final = frozenset(
    {S.PENDING_ORDER.value, S.CANCELLED_BY_CONSUMER.value, S.PAID_PENDING_CALLBACK.value}
)

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
#: The outcomes that count against a client's ``GATEWAY_CALLBACK_RATE_LIMIT``.
_COUNTED: Final = frozenset({CallbackOutcome.MISMATCH, CallbackOutcome.UNCONFIRMED})


@dataclass(frozen=True)
class CallbackResult:
    """A callback that was acknowledged (HTTP 200); refusals raise a ``CallbackRejected`` instead."""

    outcome: CallbackOutcome
    log: CallbackLog
    checkout: GatewayCheckout
    transition: Transition


# --- flask gateway doctor's probe --------------------------------------------------------------------

#: Marks ``flask gateway doctor``'s own unsigned probe of the callback: ``t=<unix time>,v1=<hex HMAC>``.
PROBE_HEADER: Final = "X-Gateway-Doctor-Probe"
#: How far from the receiving process's clock a probe's time may be (seconds, either way).
PROBE_WINDOW_SECONDS: Final = 300
_PROBE_KEY_LABEL: Final = b"flask-gateway/doctor-probe/v1"
_PROBE_MARK: Final = re.compile(r"t=(\d{1,12}),v1=([0-9a-f]{64})")


def _probe_key() -> bytes | None:
    """A key of its own for the probe's mark, derived from the app's ``SECRET_KEY`` (None without one)."""
    secret = current_app.config.get("SECRET_KEY")
    if not secret:
        return None
    raw = secret if isinstance(secret, bytes) else str(secret).encode("utf-8")
    return hmac.new(raw, _PROBE_KEY_LABEL, hashlib.sha256).digest()


def _probe_signature(key: bytes, stamp: int, body: bytes) -> str:
    return hmac.new(key, b"%d." % stamp + body, hashlib.sha256).hexdigest()


def doctor_probe_mark(body: bytes, *, now: float | None = None) -> str | None:
    """The :data:`PROBE_HEADER` value for ``flask gateway doctor``'s probe carrying ``body`` (None when the
    app has no ``SECRET_KEY``): the time, and an HMAC of it and the body made with a key derived from
    ``SECRET_KEY``. The shop answers the probe as any unsigned callback (401) and records it as
    ``doctor-probe``: no refused callback, no ``callback_rejected``, not counted against the rate limit.
    Only a holder of ``SECRET_KEY`` can make one, so copying the doctor's User-Agent hides nothing."""
    key = _probe_key()
    if key is None:
        return None
    stamp = int(time.time() if now is None else now)
    return f"t={stamp},v1={_probe_signature(key, stamp, body)}"


def _is_doctor_probe(headers: Headers, body: bytes | None) -> bool:
    mark = headers.get(PROBE_HEADER)
    if not mark or body is None:
        return False
    found = _PROBE_MARK.fullmatch(mark.strip())
    key = _probe_key()
    if found is None or key is None:
        return False
    stamp = int(found.group(1))
    if abs(time.time() - stamp) > PROBE_WINDOW_SECONDS:
        return False
    return hmac.compare_digest(found.group(2), _probe_signature(key, stamp, body))


# --- the callback log --------------------------------------------------------------------------------


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
        body=storable_text(body[:MAX_CALLBACK_BYTES].decode("utf-8", errors="replace")),
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
        body=storable_text(excerpt),
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


# --- the callback ------------------------------------------------------------------------------------


def _recorded_status(status: str) -> str:
    """What the shop records for a payment callback it is about to acknowledge with 200.

    The gateway turns ``PAID_PENDING_CALLBACK`` into ``PAID`` when the merchant answers its callback with
    200 (docs/decisions.md), and this answer is that 200: the shop records ``PAID`` at once, so the shop
    and the gateway say the same. Should the answer be lost, the gateway sends the callback again, which
    finds the payment already recorded.
    """
    return S.PAID.value if status == S.PAID_PENDING_CALLBACK else status


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
    """429 (nothing stored) for a client that used up its refused callbacks."""
    limit = get_state().callback_limit
    if limit is None or not client:
        return
    wait = limit.retry_after(client)
    if wait is not None:
        _log.warning("Callback from %s not read: over the limit of refused callbacks", client)
        raise CallbackRateLimited(retry_after=wait)


def process_callback(headers: Headers, body: bytes, client: str | None = None) -> CallbackResult:
    """Verify, store and apply one status callback; see the module docstring for the answers.

    ``client`` is the request's address (rate limit, log row). Raises a ``CallbackRejected`` subclass (an
    ``HTTPException``) for every refusal.
    """
    state = get_state()
    _statement_by_statement(state.session)
    installed = state.installation_key()
    if installed is None:
        _refuse_unverified(
            CallbackUnauthorized,
            headers,
            body,
            client,
            f"the gateway is not installed for the {state.config.environment!r} environment: "
            "no key to verify with",
        )
    installed_account, signing_key_encrypted = installed
    claimed = headers.get(ACCOUNT_HEADER)
    # Absent: verified by the signature alone (no public source shows the gateway sends the header).
    if claimed is not None and not hmac.compare_digest(
        claimed.encode("utf-8", "replace"), installed_account.encode("utf-8")
    ):
        _refuse_unverified(
            CallbackUnauthorized, headers, body, client, f"{ACCOUNT_HEADER} is not the installed account"
        )
    if not verify(body, state.box.decrypt_cached(signing_key_encrypted), headers.get(SIGNATURE_HEADER)):
        _refuse_unverified(
            CallbackUnauthorized,
            headers,
            body,
            client,
            f"{SIGNATURE_HEADER} is missing or does not match the body",
        )
    return _verified(_new_log(headers, body, client), body, installed_account, signing_key_encrypted, client)


def _statement_by_statement(session: Session) -> None:
    """Until its next commit or rollback, each statement of ``session`` commits on its own (PostgreSQL:
    autocommit, so no ``BEGIN`` and ``COMMIT`` round trips).

    For a callback's first steps, up to the log row's commit: they read (the installation, the checkout)
    and write one row (the log), one statement each, with nothing to undo together; under PostgreSQL's READ
    COMMITTED each statement saw its own snapshot in the transaction too. The connection's mode is reset
    when it goes back to the pool, so the transaction that applies the callback (row lock, changes, log
    outcome) is a transaction as before. Other databases keep the transaction (SQLite: ``BEGIN IMMEDIATE``
    takes the write lock the log row's INSERT needs, as before).
    """
    if not session.in_transaction() and session.get_bind().dialect.name == "postgresql":
        session.connection(execution_options={"isolation_level": "AUTOCOMMIT"})


def replay_callback(log_id: int) -> CallbackResult:
    """Process a stored callback again, through the path a verified callback takes: parsed, its checkout
    found, confirmed with getstatus, applied (``flask gateway replay-callback``, the admin's callback log).

    Only a callback that was verified when it arrived is stored whole (a refused one keeps an excerpt), and
    its signature is not stored (the log keeps no secret headers): its verification then is what a replay
    stands on, and the confirmation with the gateway is what it proves. The replay is a new log row (the
    original's headers and body, ``replay of callback #N``). Raises ``LookupError`` (no such row),
    ``ValueError`` (never verified: nothing to replay), ``NotInstalledError``, and the refusals of
    :func:`process_callback` after verification (``CallbackRejected``).
    """
    state = get_state()
    original = state.session.get(CallbackLog, log_id)
    if original is None:
        raise LookupError(f"no callback #{log_id}")
    if not original.verified:
        raise ValueError(
            f"callback #{log_id} was refused before it was verified: only an excerpt of it is stored, "
            "nothing to replay"
        )
    installed = state.installation_key()
    if installed is None:
        state.require_installation()  # raises NotInstalledError with the fix
        raise AssertionError("unreachable")  # pragma: no cover
    body = original.body.encode("utf-8")
    log = _new_log(Headers(original.headers), body, None)
    log.detail = f"{_REPLAY} #{log_id}"
    return _verified(log, body, installed[0], installed[1], None)


#: How a replay's log row starts (``replay of callback #N``); what happened follows it.
_REPLAY: Final = "replay of callback"
_REPLAY_NOTE: Final = re.compile(rf"^{_REPLAY} #\d+")


def _noted(log: CallbackLog, detail: str) -> str:
    """``detail`` for the row, after the replay note the row starts with (if it is a replay)."""
    note = _REPLAY_NOTE.match(log.detail or "")
    return f"{note.group(0)}: {detail}" if note else detail


def _verified(
    log: CallbackLog, body: bytes, installed_account: str, signing_key_encrypted: str, client: str | None
) -> CallbackResult:
    """Steps 3 to 5 of a verified callback (stored, parsed, found, confirmed, applied)."""
    state = get_state()
    try:
        payload = CheckoutStatusPayload.from_json(body)
    except ValidationError as exc:
        _reject(CallbackBodyInvalid, log, describe_validation_error(exc), client=client)
    found = _find(payload.checkoutToken)
    if found is None:
        _reject(
            CallbackCheckoutUnknown,
            log,
            f"no v2 checkout has the token {payload.checkoutToken[:255]!r}",
            client=client,
        )
    session = state.session
    session.add(log)
    # Stored before it is processed. Kept loaded: the callback goes on with this row without reading it
    # again.
    commit_keeping_loaded(session)
    log_id = log.id
    try:
        result = _process(
            log, payload, found, installed_account, state.box.decrypt_cached(signing_key_encrypted), client
        )
    except CallbackRejected:
        raise
    except Exception as exc:
        _record_error(log_id, exc)
        raise
    if result.outcome in _COUNTED:
        _count_against(client)
    return result


#: The callback's lookup, built once: the id and status of the v2 checkout with a token (two columns, no
#: ORM entity: the checkout is read whole once, under its row lock, by ``transitions.apply``).
_FIND: Final = select(GatewayCheckout.id, GatewayCheckout.status).where(
    GatewayCheckout.token == bindparam("token"), GatewayCheckout.api_version == "v2"
)


@dataclass(frozen=True)
class _Found:
    """The checkout a callback names, as it was before the callback (not locked)."""

    id: int
    status: str


def _find(token: str) -> _Found | None:
    if "\x00" in token:  # no token has one, and PostgreSQL refuses it in a query
        return None
    row = get_state().session.execute(_FIND, {"token": token}).first()
    return None if row is None else _Found(id=row[0], status=row[1])


def _disagreement(claim: CheckoutStatusPayload, answer: CheckoutStatusPayload) -> str | None:
    """Why getstatus does not back the callback's claim, or None when it does."""
    claimed, confirmed = str(claim.checkoutPaymentStatus), str(answer.checkoutPaymentStatus)
    if answer.checkoutToken != claim.checkoutToken:
        return "getstatus answered about another checkoutToken"
    # The two statuses of one payment: a claim of either agrees with an answer of either.
    if claimed != confirmed and not {claimed, confirmed} <= PAYMENT_STATUSES:
        said, answered = storable_text(claimed, 40), storable_text(confirmed, 40)
        return f"the callback says {said}, getstatus says {answered}"
    if answer.checkoutTotalCents != claim.checkoutTotalCents:
        return (
            f"the callback says a total of {claim.checkoutTotalCents} cents, getstatus "
            f"{answer.checkoutTotalCents}"
        )
    return None


def _confirm(
    log: CallbackLog,
    found: _Found,
    payload: CheckoutStatusPayload,
    account: str,
    signing_key: str,
    client: str | None,
) -> tuple[CheckoutStatusPayload | None, str | None]:
    """Ask the gateway (getstatus) about the claim: (its answer, why it disagrees or None).

    The answer is None when the gateway says it has no such checkout for this account (404): the claim is
    then unconfirmed and nothing is applied. Any other failure refuses the callback with 503.
    """
    state = get_state()
    # Signed with the key that verified the callback: the installation read once, for both.
    client_api = state.signed_client(account, signing_key)
    # No transaction (SQLite: no write lock) while the gateway answers. The callback's own transaction
    # committed already: nothing is open here as a rule, and nothing is expired either (the log row stays
    # loaded; ``apply`` reads the checkout under its row lock).
    if state.session.in_transaction():
        commit_keeping_loaded(state.session)
    try:
        answer = client_api.get_status(payload.checkoutToken).data
    except NotFoundError:
        return None, "getstatus: the gateway has no such checkout for the installed account"
    except GatewayError as error:
        _reject(
            CallbackConfirmFailed,
            log,
            f"could not confirm with getstatus ({error.message}); answered 503 so the gateway retries",
            client=client,
            checkout=state.session.get(GatewayCheckout, found.id),
        )
    return answer, _disagreement(payload, answer)


def _process(
    log: CallbackLog,
    payload: CheckoutStatusPayload,
    checkout_found: _Found,
    account: str,
    signing_key: str,
    client: str | None,
) -> CallbackResult:
    state = get_state()
    session = state.session
    # Goes into the event and the log row as text: U+0000 (never in a real status) must not cost them.
    status = storable_text(str(payload.checkoutPaymentStatus))
    confirming = state.config.confirm_callbacks
    acted_on = status in _APPLIED_FROM_CALLBACK or (confirming and status in _APPLIED_WHEN_CONFIRMED)
    found, before = checkout_found.id, checkout_found.status
    unconfirmed: str | None = None
    truth: CheckoutStatusPayload | None = payload
    if acted_on and confirming and would_apply(before, status):
        truth, unconfirmed = _confirm(log, checkout_found, payload, account, signing_key, client)
    if not acted_on:
        # A status the shop does not act on is recorded as an observation of the status we have: the
        # account is still checked and the timeline shows the callback, but nothing moves.
        observation = Observation(
            status=before,
            source="callback",
            merchant_account_id=account,
            detail=f"callback #{log.id}: {status} (not acted on from a callback)",
        )
    elif truth is None:  # the gateway has no such checkout for us: nothing is applied
        observation = Observation(
            status=before, source="callback", detail=f"callback #{log.id}: {status} NOT CONFIRMED"
        )
    else:
        # Agreed (the same status, or both payment statuses): the claim's status; else the gateway's.
        answered = storable_text(str(truth.checkoutPaymentStatus))
        told = _recorded_status(status) if unconfirmed is None else answered
        if truth is payload:
            note = f"callback #{log.id}: {status}"
        elif unconfirmed is None:
            note = f"callback #{log.id}: {status}, confirmed by getstatus ({truth.checkoutPaymentStatus})"
        else:
            note = f"callback #{log.id}: {status} NOT CONFIRMED ({unconfirmed}); applied what getstatus says"
        observation = Observation(
            status=told,
            source="callback",
            total_cents=truth.checkoutTotalCents,
            merchant_account_id=account,
            paid_at=truth.paidAt,
            reported_at=truth.updatedAt,
            detail=note,
        )
    transition = apply(session, found, observation, commit=False)
    checkout = transition.checkout
    checkout.last_callback_at = utcnow()
    if transition.flagged:
        outcome, detail = CallbackOutcome.MISMATCH, f"flagged, not applied: {transition.reason}"
    elif unconfirmed is not None:
        outcome, detail = CallbackOutcome.UNCONFIRMED, f"not confirmed: {unconfirmed}"
    elif not acted_on:
        outcome, detail = CallbackOutcome.IGNORED, f"status {status} is not acted on from a callback"
    elif transition.applied:
        outcome, detail = CallbackOutcome.ACCEPTED, f"{transition.before} -> {transition.after}"
    elif transition.before == observation.status or transition.before == status:
        outcome, detail = CallbackOutcome.DUPLICATE, f"already {transition.before}"
    else:
        outcome, detail = CallbackOutcome.IGNORED, f"{status} not applied: {transition.reason}"
    log.checkout_id = checkout.id
    log.outcome = outcome.value
    log.http_status = 200
    log.detail = _noted(log, detail)
    log_id, checkout_id = log.id, checkout.id
    commit_keeping_loaded(session)
    send_pending(transition)
    if outcome is CallbackOutcome.MISMATCH:
        _log.warning("Callback %s for checkout %s flagged: %s", log_id, checkout_id, transition.reason)
        _send_rejected(checkout, transition.reason, log)
    elif outcome is CallbackOutcome.UNCONFIRMED:
        _log.warning("Callback %s for checkout %s not confirmed: %s", log_id, checkout_id, unconfirmed)
        _send_rejected(checkout, f"not confirmed by getstatus: {unconfirmed}", log)
    return CallbackResult(outcome=outcome, log=log, checkout=checkout, transition=transition)


# --- v1 outcome URLs ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class V1Reply:
    """The JSON the v1 success and fail URLs answer (the gateway's merchant answer)."""

    token: str
    return_url: str
    #: Fail URL only: True lets the gateway cancel the order; False keeps it open for another try.
    cancel_on_gateway: bool | None = None

    def to_json(self, names: WireNames = OPERATOR) -> dict[str, Any]:
        """The answer's JSON, the cancel flag spelled as ``names`` says (``cancel_on_payjustnow``)."""
        answer = V1MerchantAnswer(
            token=self.token, return_url=self.return_url, cancel_on_gateway=self.cancel_on_gateway
        )
        return answer.to_wire(names)


def shop_return_url(checkout: GatewayCheckout, kind: Literal["confirm", "cancel"]) -> str:
    """Where the shopper goes after the gateway: the shop's order page, else the built-in return page."""
    endpoint = get_state().config.order_endpoint
    if endpoint:
        return external_url(endpoint, reference=checkout.order_reference)
    return return_url(checkout.id, kind)


def _refuse_v1(error: type[V1OutcomeRejected], kind: str, message: str) -> NoReturn:
    _log.warning("v1 %s URL refused (HTTP %s): %s", kind, error.code, message)
    raise error(message)


def process_v1_outcome(kind: Literal["v1-success", "v1-fail"], args: Mapping[str, str]) -> V1Reply:
    """Check and apply the gateway's call to a v1 success or fail URL.

    The URL's ``ref`` is signed for this order and this endpoint (``urls.v1_outcome_url``) and only the
    gateway was given it, so a valid ``ref`` with the order's ``token`` is the gateway's word: v1 has no
    getstatus to ask. Success pays (source ``v1``). Fail with ``reason=CANCELLED`` cancels the order
    (``CANCELLED_BY_CONSUMER``, ``fail_reason`` CANCELLED) and answers ``cancel_on_payjustnow: true``, unless
    ``GATEWAY_V1_CANCEL_ON_FAIL`` is False: then the order stays ``PENDING_ORDER`` (an event records the
    cancellation) and the answer is ``false``, so the consumer may try again. ``reason=ABANDONED`` (the
    order expired) expires it (``EXPIRED``, ``fail_reason`` ABANDONED). A replay answers the same, changing
    nothing. Refusals raise ``V1OutcomeRejected`` (400 bad parameters, 403 forged/edited/other-endpoint
    reference or token not the order's, 404 no such v1 order) and change nothing.
    """
    ref, token = args.get("ref", ""), args.get("token", "")
    status, reason = args.get("status", ""), args.get("reason", "")
    if not ref:
        _refuse_v1(V1OutcomeInvalid, kind, "The ref parameter is missing: use the URL the shop gave.")
    if not token:
        _refuse_v1(V1OutcomeInvalid, kind, "The token parameter is missing.")
    expected = V1OutcomeStatus.SUCCESS if kind == "v1-success" else V1OutcomeStatus.FAIL
    if status != expected.value:
        _refuse_v1(V1OutcomeInvalid, kind, f"status must be {expected.value} on this URL.")
    if kind == "v1-fail" and reason not in (V1FailReason.CANCELLED.value, V1FailReason.ABANDONED.value):
        _refuse_v1(V1OutcomeInvalid, kind, "reason must be CANCELLED or ABANDONED.")
    checkout_id = load_signed_reference(ref, kind)
    if checkout_id is None:
        _refuse_v1(V1OutcomeForbidden, kind, "The ref parameter is not valid for this URL.")
    state = get_state()
    session = state.session
    checkout = session.get(GatewayCheckout, checkout_id)
    if checkout is None or checkout.api_version != "v1":
        _refuse_v1(V1OutcomeUnknown, kind, "No v1 order for this reference.")
    if not checkout.token or not hmac.compare_digest(token.encode("utf-8"), checkout.token.encode("utf-8")):
        _refuse_v1(V1OutcomeForbidden, kind, "The token is not this order's token.")
    order_token = checkout.token

    if kind == "v1-success":
        reply = V1Reply(token=order_token, return_url=shop_return_url(checkout, "confirm"))
        apply(session, checkout_id, Observation(status=S.PAID, source="v1", detail="v1 success URL (signed)"))
        return reply

    fail_reason: str | None
    if reason == V1FailReason.ABANDONED.value:
        observation = Observation(status=S.EXPIRED, source="v1", detail="v1 fail URL: ABANDONED (expired)")
        fail_reason, cancel_on_gateway = V1FailReason.ABANDONED.value, True
    elif state.config.v1_cancel_on_fail:
        observation = Observation(
            status=S.CANCELLED_BY_CONSUMER, source="v1", detail="v1 fail URL: CANCELLED by the consumer"
        )
        fail_reason, cancel_on_gateway = V1FailReason.CANCELLED.value, True
    else:
        observation = Observation(
            status=S.PENDING_ORDER,
            source="v1",
            detail="v1 fail URL: CANCELLED by the consumer; kept open for another try "
            "(GATEWAY_V1_CANCEL_ON_FAIL is False)",
        )
        fail_reason, cancel_on_gateway = None, False
    reply = V1Reply(
        token=order_token,
        return_url=shop_return_url(checkout, "cancel"),
        cancel_on_gateway=cancel_on_gateway,
    )
    transition = apply(session, checkout_id, observation, commit=False)
    if fail_reason and transition.after == observation.status and transition.checkout.fail_reason is None:
        transition.checkout.fail_reason = fail_reason
    commit_keeping_loaded(session)
    send_pending(transition)
    return reply


# --- return pages ------------------------------------------------------------------------------------


#: A return link opened again within this many seconds of the last poll shows what that poll learnt.
RETURN_POLL_INTERVAL: Final = 5.0


def _worth_asking(checkout: GatewayCheckout) -> bool:
    """Whether a return page should ask the gateway: only while the checkout may still change (open, or
    paid and waiting for the callback's acknowledgement), and not again within ``RETURN_POLL_INTERVAL`` of
    the last poll (a reloaded link costs no call)."""
    if checkout.status not in _STILL_OPEN:
        return False
    last = checkout.last_polled_at
    return last is None or (utcnow() - last).total_seconds() >= RETURN_POLL_INTERVAL


def process_return(kind: Literal["confirm", "cancel"], ref: str) -> GatewayCheckout:
    """The checkout of a shopper coming back from the gateway, its status confirmed with getstatus.

    The return URL is a hint, never proof: its signed ``ref`` only says which checkout to ask about. A v2
    checkout is refreshed (source ``return``); when the gateway cannot be asked, the checkout is returned
    as it is (the order page then shows it as processing; a callback or reconciliation settles it). The
    gateway is asked only while the checkout may still change, at most once per ``RETURN_POLL_INTERVAL``
    per checkout (:func:`_worth_asking`). v1 has no getstatus: its outcome arrived through the v1 URLs before
    the shopper did.
    Raises ``InvalidReturnLink`` (400) for a forged or edited ``ref`` and ``NotFound`` for a deleted order.
    """
    checkout_id = load_signed_reference(ref, kind) if ref else None
    if checkout_id is None:
        raise InvalidReturnLink()
    session = get_state().session
    checkout = session.get(GatewayCheckout, checkout_id)
    if checkout is None:
        raise NotFound("This order no longer exists.")
    if checkout.api_version == "v2" and checkout.token and _worth_asking(checkout):
        try:
            return refresh(checkout, source="return").checkout
        except (GatewayError, NotInstalledError, SecretUnreadable) as exc:
            session.rollback()
            _log.warning(
                "Return page of checkout %s: getstatus failed (%s); showing the order as it is",
                checkout_id,
                type(exc).__name__,
            )
            found = session.get(GatewayCheckout, checkout_id)
            if found is not None:
                checkout = found
    return checkout
