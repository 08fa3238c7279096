"""A signed status callback from the gateway, from its verification to its answer; and its replay.

No view code here: ``views/public.py`` reads the request and hands the parts over. Every status change
goes through :func:`flask_gateway.payments.transitions.apply` (row lock, forward only, amount and account
checks, signals once, after the commit).

Status callback (:func:`process_callback`). A callback is a *claim*: its signature proves who signed it,
and the sandbox signs anything for anyone (its 401 answers carry ``expectedSignature``), so the money
never moves on a signature alone.

1. **Rate limit.** A client that used up its refusals (``GATEWAY_CALLBACK_RATE_LIMIT`` per client address:
   refused, unconfirmed and mismatched callbacks count, accepted ones and duplicates do not) gets 429
   with ``Retry-After``: nothing is read, verified or stored.
2. **Verification, before anything large is stored.** ``X-Signature`` must verify over the exact raw body
   with the signing key of the account whose checkout the body names (its ``checkoutToken``, looked up
   with the account's key in one statement); for a token that names none of our checkouts, with the key
   of the account of the callback path (``/callback/<account>``), else of the default account. So a
   callback signed with one account's key for another account's checkout is refused, and so is one on
   an account's own path for another account's checkout. ``X-Merchant-Account-ID``, when present, must be
   that account (``hmac.compare_digest``); when absent, the signature alone decides: no public source
   shows that the gateway sends that header (docs/decisions.md). A signature the account's key does not
   verify may be the previous key's, for ``GATEWAY_PREVIOUS_SIGNING_KEY_HOURS`` after a settings update
   replaced it (a callback signed before the change, or a retry of one): it is accepted so, the log row
   says which key verified it (``verified_with``), and it is confirmed like any other; after that window
   it is refused. A refused request keeps a bounded excerpt
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
   ``applying._recorded_status`` and docs/decisions.md); the log row's outcome is written in the same
   transaction, and the answer is sent only after that commit.

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

Imports, one way: ``callbacks`` -> ``applying`` -> ``claims`` -> ``intake`` -> ``probe``.
"""

from __future__ import annotations

import hmac
import json
from dataclasses import dataclass
from datetime import timedelta
from typing import Final

from pydantic import ValidationError
from sqlalchemy import bindparam, select
from werkzeug.datastructures import Headers

from flask_gateway.core.auth import ACCOUNT_HEADER, SIGNATURE_HEADER
from flask_gateway.core.http import describe_validation_error
from flask_gateway.core.local_time import format_time
from flask_gateway.core.sql import commit_keeping_loaded, statement_by_statement
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import CheckoutStatusPayload
from flask_gateway.errors import (
    CallbackBodyInvalid,
    CallbackCheckoutUnknown,
    CallbackRejected,
    CallbackUnauthorized,
    SecretUnreadable,
)
from flask_gateway.inbound.applying import CallbackResult, _process
from flask_gateway.inbound.claims import _find, _Found
from flask_gateway.inbound.intake import (
    _REPLAY,
    _count_against,
    _new_log,
    _record_error,
    _refuse_unverified,
    _reject,
)
from flask_gateway.models import CallbackLog, CallbackOutcome, GatewayCheckout, Installation, VerifyingKey
from flask_gateway.signing import verify
from flask_gateway.state import get_state

__all__ = ["CallbackResult", "process_callback", "replay_callback"]


#: The outcomes that count against a client's ``GATEWAY_CALLBACK_RATE_LIMIT``.
_COUNTED: Final = frozenset({CallbackOutcome.MISMATCH, CallbackOutcome.UNCONFIRMED})


def process_callback(
    headers: Headers, body: bytes, client: str | None = None, *, account: str | None = None
) -> CallbackResult:
    """Verify, store and apply one status callback; see the module docstring for the answers.

    ``client`` is the request's address (rate limit, log row); ``account``, the account of the callback
    path (``/callback/<account>``), None on the shared path. Raises a ``CallbackRejected`` subclass (an
    ``HTTPException``) for every refusal.
    """
    state = get_state()
    statement_by_statement(state.session)
    installed = _verifying_key(body, account)
    if installed is None:
        _refuse_unverified(
            CallbackUnauthorized,
            headers,
            body,
            client,
            (
                f"the gateway is not installed for the {state.config.environment!r} environment: "
                "no key to verify with"
                if account is None
                else f"no merchant account {account[:255]!r} is installed for this callback path"
            ),
        )
    installed_account, signing_key_encrypted = installed.account, installed.signing_key_encrypted
    if account is not None and not hmac.compare_digest(
        account.encode("utf-8", "replace"), installed_account.encode("utf-8")
    ):
        _refuse_unverified(
            CallbackUnauthorized,
            headers,
            body,
            client,
            f"the checkout belongs to another merchant account than this callback path's ({account[:255]!r})",
        )
    claimed = headers.get(ACCOUNT_HEADER)
    # Absent: verified by the signature alone (no public source shows the gateway sends the header).
    if claimed is not None and not hmac.compare_digest(
        claimed.encode("utf-8", "replace"), installed_account.encode("utf-8")
    ):
        _refuse_unverified(
            CallbackUnauthorized,
            headers,
            body,
            client,
            f"{ACCOUNT_HEADER} is not the merchant account of the checkout",
        )
    signature = headers.get(SIGNATURE_HEADER)
    verified_with = VerifyingKey.CURRENT
    if not verify(body, state.box.decrypt_cached(signing_key_encrypted), signature):
        previous = _previous_key(installed_account)
        if previous.key is None or signature is None or not verify(body, previous.key, signature):
            _refuse_unverified(
                CallbackUnauthorized,
                headers,
                body,
                client,
                f"{SIGNATURE_HEADER} is missing or does not match the body "
                f"(verified with merchant account {installed_account!r}'s key{previous.refused})",
            )
        verified_with = VerifyingKey.PREVIOUS
    log = _new_log(headers, body, client)
    log.verified_with = verified_with
    return _verified(log, body, installed, client)


_PREVIOUS_KEY: Final = select(
    Installation.previous_signing_key_encrypted, Installation.signing_key_replaced_at
).where(
    Installation.environment == bindparam("environment"),
    Installation.merchant_account_id == bindparam("account"),
)


@dataclass(frozen=True)
class _Previous:
    """The account's previous signing key while it still verifies (else None), and what a refusal adds."""

    key: str | None
    refused: str = ""


def _previous_key(account: str) -> _Previous:
    """The signing key ``account``'s current one replaced, while ``GATEWAY_PREVIOUS_SIGNING_KEY_HOURS``
    after the change has not passed (read only when the current key did not verify: never on the path of
    an ordinary callback)."""
    state = get_state()
    row = state.session.execute(
        _PREVIOUS_KEY, {"environment": state.config.environment, "account": account}
    ).first()
    if row is None or row[0] is None or row[1] is None:
        return _Previous(None)
    hours = state.config.previous_signing_key_hours
    until = row[1] + timedelta(hours=hours)
    if utcnow() >= until:
        return _Previous(
            None,
            f"; its previous key, replaced {format_time(row[1], state.config.zone)}, "
            f"verified callbacks for {hours} h after that (GATEWAY_PREVIOUS_SIGNING_KEY_HOURS)",
        )
    try:
        return _Previous(state.box.decrypt_cached(row[0]))
    except SecretUnreadable:
        return _Previous(None, "; its previous key cannot be decrypted")


#: The account and key that verify a callback about a checkout: the checkout's own account, in one
#: statement (the token's checkout joined to its account's installation), with the checkout's id and
#: status, which the callback needs once verified (``claims._find``'s two columns: not read again).
_CHECKOUT_KEY: Final = (
    select(
        Installation.merchant_account_id,
        Installation.signing_key_encrypted,
        GatewayCheckout.id,
        GatewayCheckout.status,
    )
    .join(GatewayCheckout, GatewayCheckout.merchant_account_id == Installation.merchant_account_id)
    .where(
        GatewayCheckout.token == bindparam("token"),
        GatewayCheckout.api_version == "v2",
        Installation.environment == bindparam("environment"),
    )
)


def _claimed_token(body: bytes) -> str | None:
    """The ``checkoutToken`` the body names, if it is JSON with one (read before the signature is checked,
    only to choose the key: nothing else of an unverified body is used)."""
    try:
        data = json.loads(body)
    except (ValueError, RecursionError):  # not JSON, or nested too deep: verified (and refused) as it is
        return None
    token = data.get("checkoutToken") if isinstance(data, dict) else None
    if not isinstance(token, str) or not token or len(token) > 255 or "\x00" in token:
        return None
    return token


@dataclass(frozen=True)
class _Key:
    """The account and encrypted signing key a callback is verified with; and, when they were found by the
    body's ``checkoutToken`` (its checkout's account), that checkout, read in the same statement."""

    account: str
    signing_key_encrypted: str
    token: str | None = None
    found: _Found | None = None

    def checkout(self, token: str) -> _Found | None:
        """The v2 checkout with ``token`` (after verification: the payload's token), not read again when
        the key's statement found it."""
        if self.found is not None and token == self.token:
            return self.found
        return _find(token)


def _verifying_key(body: bytes, account: str | None) -> _Key | None:
    """The key to verify ``body`` with: its checkout's account's; for a token that names none of our
    checkouts, the path's ``account``'s or else the default account's. None: no such key."""
    state = get_state()
    token = _claimed_token(body)
    if token is not None:
        row = state.session.execute(
            _CHECKOUT_KEY, {"token": token, "environment": state.config.environment}
        ).first()
        if row is not None:
            return _Key(row[0], row[1], token, _Found(id=row[2], status=row[3]))
    installed = state.installation_key(account)
    return None if installed is None else _Key(*installed)


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
    body = original.body.encode("utf-8")
    installed = _verifying_key(body, None)  # the checkout's account, as when it arrived
    if installed is None:
        state.require_installation()  # raises NotInstalledError with the fix
        raise AssertionError("unreachable")  # pragma: no cover
    log = _new_log(Headers(original.headers), body, None)
    log.detail = f"{_REPLAY} #{log_id}"
    return _verified(log, body, installed, None)


def _verified(log: CallbackLog, body: bytes, installed: _Key, client: str | None) -> CallbackResult:
    """Steps 3 to 5 of a verified callback (stored, parsed, found, confirmed, applied)."""
    state = get_state()
    try:
        payload = CheckoutStatusPayload.from_json(body)
    except ValidationError as exc:
        _reject(CallbackBodyInvalid, log, describe_validation_error(exc), client=client)
    found = installed.checkout(payload.checkoutToken)
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
            log,
            payload,
            found,
            installed.account,
            state.box.decrypt_cached(installed.signing_key_encrypted),
            client,
        )
    except CallbackRejected:
        raise
    except Exception as exc:
        _record_error(log_id, exc)
        raise
    if result.outcome in _COUNTED:
        _count_against(client)
    return result
