"""What the gateway sends the shop: signed status callbacks, v1 outcome calls, and shoppers coming back.

No view code here: ``views/public.py`` reads the request and hands the parts over. Every status change
goes through :func:`flask_gateway.transitions.apply` (row lock, forward only, amount and account checks,
signals once, after the commit).

Status callback (:func:`process_callback`), after dj-stripe: *store first, process second*.

1. A ``CallbackLog`` row is committed before anything is checked: the headers without secrets (no
   ``X-Signature``, ``Authorization``, ``Cookie``, ...), the body as text, ``verified=False``, outcome
   ``received`` and ``http_status=0`` (a row left like that means processing died).
2. Verification, failing closed: ``X-Merchant-Account-ID`` must equal the installation's account
   (``hmac.compare_digest``) and ``X-Signature`` must verify over the exact raw body with the stored
   signing key. Nothing of an unverified body is trusted, not even its token.
3. The body must parse as a ``CheckoutStatusPayload``; its ``checkoutToken`` must name one of our v2
   checkouts.
4. ``PAID`` / ``PAID_PENDING_CALLBACK`` (a payment) and ``CANCELLED_BY_CONSUMER`` are applied; the
   log row's outcome is written in the same transaction, and the answer is sent only after that commit.
   A ``PAID_PENDING_CALLBACK`` callback is recorded as ``PAID``: the gateway says ``PAID`` once the shop
   answers 200, and this answer is that 200 (:func:`_recorded_status`, docs/decisions.md).

Answers (``CallbackLog.outcome`` in brackets):

====  =====================================================================================================
200   applied (``accepted``); already known, e.g. a retry or a replay (``duplicate``); a status the shop
      does not act on from a callback (refund statuses, unknown strings) or a stale one, e.g.
      ``PAID_PENDING_CALLBACK`` after ``PAID`` (``ignored``); amount or account mismatch (``mismatch``)
400   correctly signed, but not a status payload: malformed JSON, missing or wrong fields (``invalid-body``)
401   wrong or missing signature, account header not the installed account, or no installation
      (``rejected-signature``)
404   signed payload whose ``checkoutToken`` is not one of our v2 checkouts (``unknown-checkout``)
413   body over 64 KiB, not read (``too-large``)
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
committed: for every 4xx answer and for a mismatch.
"""

from __future__ import annotations

import hmac
import logging
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal, NoReturn

from flask import current_app
from pydantic import ValidationError
from werkzeug.datastructures import Headers
from werkzeug.exceptions import NotFound

from flask_gateway import signals
from flask_gateway.core.auth import ACCOUNT_HEADER, SIGNATURE_HEADER
from flask_gateway.core.errors import GatewayError
from flask_gateway.core.http import describe_validation_error
from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import (
    OPERATOR,
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
    CallbackRejected,
    CallbackTooLarge,
    CallbackUnauthorized,
    InvalidReturnLink,
    V1OutcomeForbidden,
    V1OutcomeInvalid,
    V1OutcomeRejected,
    V1OutcomeUnknown,
)
from flask_gateway.extension import NotInstalledError, get_state
from flask_gateway.models import CallbackLog, CallbackOutcome, GatewayCheckout
from flask_gateway.polling import refresh
from flask_gateway.secrets import SecretUnreadable
from flask_gateway.signing import verify
from flask_gateway.transitions import Observation, Transition, apply, lock_by_token, send_pending
from flask_gateway.urls import external_url, load_signed_reference, return_url

__all__ = [
    "MAX_CALLBACK_BYTES",
    "CallbackOutcome",
    "CallbackResult",
    "V1Reply",
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

#: The statuses a callback may apply: a payment (the spec: accept payment only for these two) and the
#: consumer's cancellation (sent when the account manager enabled it).
_APPLIED_FROM_CALLBACK: Final = frozenset(
    {S.PAID.value, S.PAID_PENDING_CALLBACK.value, S.CANCELLED_BY_CONSUMER.value}
)

#: Header names that may carry a secret: never stored.
_SECRET_HEADER: Final = re.compile(
    r"signature|authorization|cookie|secret|token|api[-_]?key|password|session", re.I
)
_MAX_HEADERS: Final = 50
_MAX_HEADER_VALUE: Final = 1024


@dataclass(frozen=True)
class CallbackResult:
    """A callback that was acknowledged (HTTP 200); refusals raise a ``CallbackRejected`` instead."""

    outcome: CallbackOutcome
    log: CallbackLog
    checkout: GatewayCheckout
    transition: Transition


# --- the callback log --------------------------------------------------------------------------------


def _printable(text: str) -> str:
    # PostgreSQL refuses NUL in text columns: one stray byte must not cost the log row.
    return text.replace("\x00", "\ufffd")


def loggable_headers(headers: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The headers worth keeping, without any that may carry a secret (signature, credentials, cookies)."""
    kept: dict[str, str] = {}
    for name, value in headers:
        if _SECRET_HEADER.search(name):
            continue
        if name not in kept and len(kept) >= _MAX_HEADERS:
            continue
        value = _printable(value)[:_MAX_HEADER_VALUE]
        kept[name] = f"{kept[name]}, {value}" if name in kept else value
    return kept


def _store(headers: Headers, body: bytes | None, detail: str = "") -> CallbackLog:
    """Commit the log row of an incoming callback, before anything about it is checked."""
    session = get_state().session
    claimed = headers.get(ACCOUNT_HEADER)
    log = CallbackLog(
        received_at=utcnow(),
        merchant_account_id=_printable(claimed)[:255] if claimed else None,
        headers=loggable_headers(headers),
        body=_printable(body[:MAX_CALLBACK_BYTES].decode("utf-8", errors="replace")) if body else "",
        verified=False,
        outcome=CallbackOutcome.RECEIVED.value,
        http_status=0,
        detail=detail,
    )
    session.add(log)
    # Kept loaded: the callback goes on with this row (its id, then its outcome) without reading it again.
    commit_keeping_loaded(session)
    return log


def _send_rejected(checkout: GatewayCheckout | None, reason: str, log: CallbackLog) -> None:
    signals.callback_rejected.send(
        current_app._get_current_object(),  # type: ignore[attr-defined]
        checkout=checkout,
        reason=reason,
        log=log,
    )


def _reject(
    error: type[CallbackRejected],
    log: CallbackLog,
    reason: str,
    *,
    verified: bool = False,
    checkout: GatewayCheckout | None = None,
) -> NoReturn:
    """Record the refusal on the log row (nothing else is kept), commit, signal, raise ``error``."""
    session = get_state().session
    session.rollback()
    log.verified = verified
    log.outcome = error.outcome
    log.http_status = error.code or 400
    log.detail = reason
    log.checkout_id = checkout.id if checkout is not None else None
    log_id = log.id
    session.commit()
    _log.warning("Callback %s refused (HTTP %s, %s): %s", log_id, error.code, error.outcome, reason)
    _send_rejected(checkout, reason, log)
    raise error(log=log, checkout=checkout)


def _record_error(log_id: int, exc: BaseException) -> None:
    session = get_state().session
    try:
        session.rollback()
        log = session.get(CallbackLog, log_id)
        if log is not None:
            log.outcome = CallbackOutcome.ERROR.value
            log.http_status = 500
            log.detail = f"{type(exc).__name__} while processing: see the server log"
            session.commit()
    except Exception:  # the database itself may be what failed: keep the original error
        session.rollback()
        _log.exception("Could not record the failure of callback %s", log_id)


# --- the callback ------------------------------------------------------------------------------------


def _recorded_status(status: str) -> str:
    """What the shop records for a payment callback it is about to acknowledge with 200.

    The gateway turns ``PAID_PENDING_CALLBACK`` into ``PAID`` when the merchant answers its callback with
    200 (docs/decisions.md), and this answer is that 200: the shop records ``PAID`` at once, so the shop
    and the gateway say the same. Should the answer be lost, the gateway sends the callback again, which
    finds the payment already recorded.
    """
    return S.PAID.value if status == S.PAID_PENDING_CALLBACK else status


def refuse_oversize(headers: Headers, content_length: int | None) -> NoReturn:
    """Log a callback whose body is over ``MAX_CALLBACK_BYTES`` (not read) and raise 413."""
    size = f"{content_length} bytes" if content_length is not None else "a body"
    log = _store(headers, None)
    _reject(CallbackTooLarge, log, f"{size} over the limit of {MAX_CALLBACK_BYTES} bytes; not read")


def process_callback(headers: Headers, body: bytes) -> CallbackResult:
    """Store, verify and apply one status callback; see the module docstring for the answers.

    Raises a ``CallbackRejected`` subclass (an ``HTTPException``) for every refusal.
    """
    log = _store(headers, body)
    log_id = log.id
    try:
        return _process(log, headers, body)
    except CallbackRejected:
        raise
    except Exception as exc:
        _record_error(log_id, exc)
        raise


def _process(log: CallbackLog, headers: Headers, body: bytes) -> CallbackResult:
    state = get_state()
    session = state.session
    installed = state.installation_key()
    if installed is None:
        _reject(
            CallbackUnauthorized,
            log,
            f"the gateway is not installed for the {state.config.environment!r} environment: "
            "no key to verify with",
        )
    installed_account, signing_key_encrypted = installed
    claimed = headers.get(ACCOUNT_HEADER, "")
    account_ok = hmac.compare_digest(claimed.encode("utf-8"), installed_account.encode("utf-8"))
    signature_ok = verify(
        body, state.box.decrypt_cached(signing_key_encrypted), headers.get(SIGNATURE_HEADER)
    )
    if not account_ok:
        _reject(CallbackUnauthorized, log, f"{ACCOUNT_HEADER} is missing or not the installed account")
    if not signature_ok:
        _reject(CallbackUnauthorized, log, f"{SIGNATURE_HEADER} is missing or does not match the body")

    try:
        payload = CheckoutStatusPayload.from_json(body)
    except ValidationError as exc:
        _reject(CallbackBodyInvalid, log, describe_validation_error(exc), verified=True)
    checkout = None
    if "\x00" not in payload.checkoutToken:  # no token has one, and PostgreSQL refuses it in a query
        # Found and row-locked in one statement: apply() below reuses the lock of this transaction.
        checkout = lock_by_token(session, payload.checkoutToken)
    if checkout is None:
        _reject(
            CallbackCheckoutUnknown,
            log,
            f"no v2 checkout has the token {payload.checkoutToken[:255]!r}",
            verified=True,
        )

    # Goes into the event and the log row as text: U+0000 (never in a real status) must not cost them.
    status = _printable(str(payload.checkoutPaymentStatus))
    acted_on = status in _APPLIED_FROM_CALLBACK
    recorded = _recorded_status(status)
    found = checkout.id
    observation = Observation(
        # A status the shop does not act on is recorded as an observation of the status we have: the
        # account is still checked and the timeline shows the callback, but nothing moves.
        status=recorded if acted_on else checkout.status,
        source="callback",
        total_cents=payload.checkoutTotalCents if acted_on else None,
        merchant_account_id=claimed,
        paid_at=payload.paidAt,
        detail=f"callback #{log.id}: {status}" + ("" if acted_on else " (not acted on from a callback)"),
    )
    transition = apply(session, found, observation, commit=False)
    checkout = transition.checkout
    checkout.last_callback_at = utcnow()
    if transition.flagged:
        outcome, detail = CallbackOutcome.MISMATCH, f"flagged, not applied: {transition.reason}"
    elif not acted_on:
        outcome, detail = CallbackOutcome.IGNORED, f"status {status} is not acted on from a callback"
    elif transition.applied:
        outcome, detail = CallbackOutcome.ACCEPTED, f"{transition.before} -> {transition.after}"
    elif transition.before == recorded:
        outcome, detail = CallbackOutcome.DUPLICATE, f"already {recorded}"
    else:
        outcome, detail = CallbackOutcome.IGNORED, f"{status} not applied: {transition.reason}"
    log.verified = True
    log.checkout_id = checkout.id
    log.outcome = outcome.value
    log.http_status = 200
    log.detail = detail
    log_id, checkout_id = log.id, checkout.id
    session.commit()
    send_pending(transition)
    if outcome is CallbackOutcome.MISMATCH:
        _log.warning("Callback %s for checkout %s flagged: %s", log_id, checkout_id, transition.reason)
        _send_rejected(checkout, transition.reason, log)
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
    session.commit()
    send_pending(transition)
    return reply


# --- return pages ------------------------------------------------------------------------------------


def process_return(kind: Literal["confirm", "cancel"], ref: str) -> GatewayCheckout:
    """The checkout of a shopper coming back from the gateway, its status confirmed with getstatus.

    The return URL is a hint, never proof: its signed ``ref`` only says which checkout to ask about. A v2
    checkout is refreshed (source ``return``); when the gateway cannot be asked, the checkout is returned
    as it is (the order page then shows it as processing; a callback or reconciliation settles it). v1
    has no getstatus: its outcome arrived through the v1 URLs before the shopper did.
    Raises ``InvalidReturnLink`` (400) for a forged or edited ``ref`` and ``NotFound`` for a deleted order.
    """
    checkout_id = load_signed_reference(ref, kind) if ref else None
    if checkout_id is None:
        raise InvalidReturnLink()
    session = get_state().session
    checkout = session.get(GatewayCheckout, checkout_id)
    if checkout is None:
        raise NotFound("This order no longer exists.")
    if checkout.api_version == "v2" and checkout.token:
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
