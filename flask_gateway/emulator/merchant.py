"""Calls from the gateway to the merchant: the signed v2 callback (POST) and the v1 outcome URLs (GET).

They go through the ``requests.Session`` the emulator app was given (:func:`set_merchant_http`; a test
wires it to a shop app in-process, ``flask_gateway.testing.connect``), else one of this process's own.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Final
from urllib.parse import urlencode, urlsplit, urlunsplit

import requests
from flask import Flask, current_app
from pydantic import ValidationError

from flask_gateway.core.auth import ACCOUNT_HEADER, SIGNATURE_HEADER
from flask_gateway.core.http import USER_AGENT
from flask_gateway.core.signing import sign
from flask_gateway.core.wire import V1FailReason, V1MerchantAnswer, V1OutcomeStatus

__all__ = [
    "CALLBACK_TIMEOUT",
    "MerchantReply",
    "call_v1_outcome",
    "post_callback",
    "set_merchant_http",
    "with_query",
]

#: Only an HTTP 200 within this many seconds acknowledges a callback (DESIGN).
CALLBACK_TIMEOUT: Final = 10.0

#: ``app.extensions`` key of the session an app was given.
_HTTP_KEY: Final = "gateway_emulator_merchant_http"
#: The process's own session, for an app that was given none (keep-alive to the merchant).
_DEFAULT_HTTP: Final = requests.Session()


def set_merchant_http(app: Flask, session: requests.Session) -> None:
    """Send ``app``'s callbacks and v1 outcome calls through ``session`` (e.g. one whose adapter hands them to
    a shop app in-process)."""
    app.extensions[_HTTP_KEY] = session


def _http() -> requests.Session:
    session: requests.Session = current_app.extensions.get(_HTTP_KEY, _DEFAULT_HTTP)
    return session


@dataclass(frozen=True)
class MerchantReply:
    """What the merchant answered: ``ok`` when it counts as acknowledged."""

    ok: bool
    http_status: int | None
    #: ``OK``, or why the attempt failed (becomes ``lastCallbackAttemptStatusMessage``).
    message: str
    duration_ms: int
    answer: V1MerchantAnswer | None = None


def post_callback(
    url: str, body: bytes, *, merchant_account_id: str, signing_key: str, timeout: float = CALLBACK_TIMEOUT
) -> MerchantReply:
    """POST the status payload, signed; only HTTP 200 acknowledges."""
    headers = {
        "Content-Type": "application/json",
        "User-Agent": USER_AGENT,
        ACCOUNT_HEADER: merchant_account_id,
        SIGNATURE_HEADER: sign(body, signing_key),
    }
    started = time.perf_counter()
    try:
        response = _http().post(url, data=body, headers=headers, timeout=timeout, allow_redirects=False)
    except requests.Timeout:
        return MerchantReply(False, None, f"Timeout after {timeout:g} s", _ms(started))
    except requests.RequestException as exc:
        return MerchantReply(False, None, f"Connection failed ({type(exc).__name__})", _ms(started))
    if response.status_code == 200:
        return MerchantReply(True, 200, "OK", _ms(started))
    return MerchantReply(False, response.status_code, f"HTTP {response.status_code}", _ms(started))


def with_query(url: str, params: dict[str, str]) -> str:
    """``url`` with ``params`` appended to its query string (keeping what the merchant put there)."""
    parts = urlsplit(url)
    query = f"{parts.query}&{urlencode(params)}" if parts.query else urlencode(params)
    return urlunsplit(parts._replace(query=query))


def call_v1_outcome(
    url: str,
    token: str,
    status: V1OutcomeStatus,
    reason: V1FailReason | None = None,
    *,
    timeout: float = CALLBACK_TIMEOUT,
) -> MerchantReply:
    """GET the merchant's success/fail URL; check its JSON answer (token echoed, absolute return_url)."""
    params = {"token": token, "status": status.value}
    if reason is not None:
        params["reason"] = reason.value
    started = time.perf_counter()
    try:
        response = _http().get(
            with_query(url, params),
            headers={"Accept": "application/json", "User-Agent": USER_AGENT},
            timeout=timeout,
            allow_redirects=False,
        )
    except requests.Timeout:
        return MerchantReply(False, None, f"Timeout after {timeout:g} s", _ms(started))
    except requests.RequestException as exc:
        return MerchantReply(False, None, f"Connection failed ({type(exc).__name__})", _ms(started))
    if response.status_code != 200:
        return MerchantReply(False, response.status_code, f"HTTP {response.status_code}", _ms(started))
    try:
        answer = V1MerchantAnswer.from_json(response.content)
    except (ValueError, ValidationError):
        return MerchantReply(
            False, 200, "The answer is not JSON with token and an absolute return_url", _ms(started)
        )
    if answer.token != token:
        return MerchantReply(False, 200, "The answer's token is not the order's token", _ms(started))
    return MerchantReply(True, 200, "OK", _ms(started), answer)


def _ms(started: float) -> int:
    return int((time.perf_counter() - started) * 1000)
