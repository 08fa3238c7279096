"""HTTP transport shared by the v2 and v1 clients: timeouts, retries with backoff and jitter, parsing.

A request is prepared (and so signed) once; every retry sends the very same bytes, so the idempotency
key fixed before the first attempt is what the gateway sees each time.

Observers (:func:`add_observer`) see every attempt: its operation, duration and HTTP status (or why no
answer came), as the log line says it. ``flask_gateway.operations.metrics`` registers one for Prometheus; the
core itself knows nothing of what an observer does with it.
"""

from __future__ import annotations

import enum
import json
import logging
import platform
import random
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar
from urllib.parse import urlsplit

import requests
from pydantic import ValidationError as PydanticValidationError
from requests.auth import AuthBase

from flask_gateway._version import __version__
from flask_gateway.core.errors import (
    GatewayConnectionError,
    GatewayError,
    GatewayTimeoutError,
    InvalidResponseError,
    error_for_status,
)
from flask_gateway.core.retry_after import parse_retry_after
from flask_gateway.core.wire.common import WireModel

__all__ = [
    "USER_AGENT",
    "ApiResponse",
    "CallAttempt",
    "RetryMode",
    "RetryPolicy",
    "Transport",
    "add_observer",
    "describe_validation_error",
    "remove_observer",
]

log = logging.getLogger("flask_gateway.client")

USER_AGENT: Final = (
    f"flask-gateway/{__version__} python-requests/{requests.__version__} "
    f"{platform.python_implementation()}/{platform.python_version()}"
)

#: ``Transport._environment_settings`` per session (dropped with the session).
_SETTINGS_CACHE: weakref.WeakKeyDictionary[requests.Session, dict[tuple[object, ...], dict[str, Any]]] = (
    weakref.WeakKeyDictionary()
)


@dataclass(frozen=True)
class CallAttempt:
    """One attempt of a call to the gateway, as an observer sees it (a retried call is several)."""

    #: The client's name for the call: ``create``, ``getstatus``, ``refund``, ``v1_checkout``...
    operation: str
    method: str
    #: 1 for the first attempt of a call, 2 for its first retry...
    attempt: int
    #: From sending the request to its answer, or to its failure.
    seconds: float
    #: The answer's HTTP status; None when no answer came.
    http_status: int | None = None
    #: Why no answer came: ``"timeout"`` or ``"connection"``; None when one came.
    failure: str | None = None


#: ``observer(attempt)``: called after every attempt of every ``Transport`` in the process.
CallObserver = Callable[[CallAttempt], None]
_observers: tuple[CallObserver, ...] = ()
_observers_lock = threading.Lock()


def add_observer(observer: CallObserver) -> None:
    """Call ``observer`` after every attempt of every call to the gateway made in this process (in the
    thread that made it: keep it quick). An observer that raises is logged and never fails the call."""
    global _observers  # a tuple replaced under the lock: readers need no lock
    with _observers_lock:
        if observer not in _observers:
            _observers = (*_observers, observer)


def remove_observer(observer: CallObserver) -> None:
    """Stop calling ``observer`` (no error when it was not added)."""
    global _observers
    with _observers_lock:
        _observers = tuple(o for o in _observers if o != observer)


def _notify(attempt: CallAttempt) -> None:
    for observer in _observers:
        try:
            observer(attempt)
        except Exception:
            log.warning("gateway call observer %r failed", observer, exc_info=True)


ModelT = TypeVar("ModelT", bound=WireModel)
T_co = TypeVar("T_co", covariant=True)


class RetryMode(enum.Enum):
    """Which failures an operation may retry."""

    #: Safe to repeat (idempotency key, or an operation with the same effect twice): retry on connection
    #: errors, timeouts, 429 and 5xx.
    IDEMPOTENT = "idempotent"
    #: Not safe to repeat: retry only when the gateway surely did not process the request (the
    #: connection was never made, or 429).
    UNSAFE = "unsafe"


@dataclass(frozen=True)
class RetryPolicy:
    """Retries after the first attempt, and the backoff between them (seconds)."""

    max_retries: int = 2
    backoff_base: float = 0.5
    backoff_max: float = 8.0
    #: Longest ``Retry-After`` honoured; a longer one ends the retries (the caller decides what to do).
    retry_after_max: float = 30.0

    def __post_init__(self) -> None:
        if self.max_retries < 0:
            raise ValueError("max_retries must be 0 or more")


@dataclass(frozen=True)
class ApiResponse(Generic[T_co]):
    """A parsed answer and what came with it."""

    data: T_co
    status_code: int
    headers: Mapping[str, str]
    #: The idempotency key sent (create, refund), else None.
    request_id: str | None = None
    #: How many attempts it took (1 when the first one succeeded).
    attempts: int = 1

    @property
    def idempotent_replay(self) -> bool:
        """True when the gateway answered from its idempotency store (header ``idempotent-replay: true``)."""
        return str(self.headers.get("idempotent-replay", "")).lower() == "true"


def describe_validation_error(error: PydanticValidationError) -> str:
    """Field locations and messages of a validation error, never the input values (they may be secrets)."""
    items = []
    for detail in error.errors(include_url=False):
        location = ".".join(str(part) for part in detail["loc"]) or "body"
        message = detail["msg"]
        value = detail.get("input")
        if isinstance(value, str) and value:
            # Our own validators quote the offending text ("not a timestamp ...: 'x'"): leave it out.
            message = message.replace(repr(value), "<value>")
        items.append(f"{location}: {message}")
    return "; ".join(items)


class Transport:
    """Sends prepared requests with timeouts and retries; turns answers into models or errors."""

    def __init__(
        self,
        *,
        timeout: float | tuple[float, float] = (5.0, 30.0),
        retry: RetryPolicy | None = None,
        session: requests.Session | None = None,
        sleep: Callable[[float], None] = time.sleep,
        rng: random.Random | None = None,
    ) -> None:
        if timeout is None or (isinstance(timeout, tuple) and None in timeout):
            raise ValueError("a timeout is required: pass seconds, or (connect, read) seconds")
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.session = session or requests.Session()
        self.sleep = sleep
        self._rng = rng or random.Random()  # noqa: S311 - jitter, not cryptography

    def _environment_settings(self, url: str | None) -> dict[str, Any]:
        """``Session.merge_environment_settings`` for ``url`` (proxies, verify, cert, stream), remembered
        per session, origin and session settings. With ``trust_env`` requests reads every proxy
        environment variable on each call (two walks of ``os.environ``, about a third of a local call's
        CPU): here the environment is read once per session and origin, so changing proxy or CA-bundle
        variables takes effect for a new ``requests.Session``, not for one already in use (the
        extension's are per thread, for the process's life)."""
        session = self.session
        cache = _SETTINGS_CACHE.get(session)
        if cache is None:
            cache = _SETTINGS_CACHE[session] = {}
        parts = urlsplit(url or "")
        key = (
            parts.scheme,
            parts.netloc,
            session.trust_env,
            tuple(sorted(session.proxies.items())),
            session.verify,
            session.cert if not isinstance(session.cert, list) else tuple(session.cert),
            session.stream,
        )
        try:
            cached = cache[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable setting: nothing to remember
            return dict(session.merge_environment_settings(url, {}, None, None, None))
        else:
            return {**cached, "proxies": dict(cached["proxies"])}  # copies: requests may not mutate ours
        settings: dict[str, Any] = dict(session.merge_environment_settings(url, {}, None, None, None))
        if len(cache) >= 64:
            cache.clear()
        cache[key] = {**settings, "proxies": dict(settings["proxies"])}
        return settings

    def backoff(self, retry_number: int) -> float:
        """Seconds before retry ``retry_number`` (1-based): exponential, capped, with "equal jitter"."""
        ceiling = min(self.retry.backoff_max, self.retry.backoff_base * 2.0 ** (retry_number - 1))
        return ceiling / 2 + self._rng.uniform(0, ceiling / 2)

    def send(
        self,
        method: str,
        url: str,
        *,
        operation: str,
        body: bytes | None = None,
        auth: AuthBase | None = None,
        mode: RetryMode = RetryMode.IDEMPOTENT,
    ) -> tuple[requests.Response, int]:
        """Send until success or a final error; return the 2xx response and the attempts it took."""
        headers = {"User-Agent": USER_AGENT, "Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        prepared = self.session.prepare_request(
            requests.Request(method, url, data=body, headers=headers, auth=auth)
        )
        settings = self._environment_settings(prepared.url)
        attempt = 0
        while True:
            attempt += 1
            started = time.perf_counter()
            try:
                response = self.session.send(prepared, timeout=self.timeout, **settings)
            except requests.RequestException as exc:
                failure = _connection_error(exc, operation)
                retryable = mode is RetryMode.IDEMPOTENT or _never_reached_gateway(exc)
                self._log_attempt(
                    operation,
                    method,
                    url,
                    attempt,
                    started,
                    f"failed: {failure.message}",
                    failure="timeout" if isinstance(failure, GatewayTimeoutError) else "connection",
                )
                if retryable and attempt <= self.retry.max_retries:
                    self._wait(operation, attempt, failure.message, None)
                    continue
                raise failure from exc
            self._log_attempt(
                operation,
                method,
                url,
                attempt,
                started,
                f"HTTP {response.status_code}",
                http_status=response.status_code,
            )
            if 200 <= response.status_code < 300:
                return response, attempt
            error = error_for_status(
                response.status_code, _json_object(response), response.headers, operation=operation
            )
            if self._should_retry(error, mode, attempt) and self._wait(
                operation, attempt, str(error), _retry_after(response)
            ):
                continue
            raise error

    def call(
        self,
        method: str,
        url: str,
        model: type[ModelT],
        *,
        operation: str,
        body: bytes | None = None,
        auth: AuthBase | None = None,
        mode: RetryMode = RetryMode.IDEMPOTENT,
        request_id: str | None = None,
    ) -> ApiResponse[ModelT]:
        """``send`` then parse the JSON answer into ``model``."""
        response, attempts = self.send(method, url, operation=operation, body=body, auth=auth, mode=mode)
        data = _json_object(response)
        if data is None:
            raise InvalidResponseError(
                "the gateway answered success without a JSON object",
                http_status=response.status_code,
                headers=response.headers,
                operation=operation,
            )
        try:
            parsed = model.model_validate(data)
        except PydanticValidationError as exc:
            raise InvalidResponseError(
                f"the gateway's answer does not match the API: {describe_validation_error(exc)}",
                http_status=response.status_code,
                headers=response.headers,
                operation=operation,
            ) from None
        return ApiResponse(
            data=parsed,
            status_code=response.status_code,
            headers=response.headers,
            request_id=request_id,
            attempts=attempts,
        )

    def _should_retry(self, error: GatewayError, mode: RetryMode, attempt: int) -> bool:
        if attempt > self.retry.max_retries or not error.retryable:
            return False
        if error.http_status == 429:
            return True  # refused before processing: safe for every operation
        return mode is RetryMode.IDEMPOTENT

    def _wait(self, operation: str, attempt: int, reason: str, retry_after: float | None) -> bool:
        """Sleep before the next attempt; False (no sleep, no retry) when ``Retry-After`` is too long."""
        if retry_after is not None:
            if retry_after > self.retry.retry_after_max:
                return False
            delay = retry_after
        else:
            delay = self.backoff(attempt)
        log.warning(
            "gateway %s: retry %d of %d in %.2f s after: %s",
            operation,
            attempt,
            self.retry.max_retries,
            delay,
            reason,
        )
        self.sleep(delay)
        return True

    @staticmethod
    def _log_attempt(
        operation: str,
        method: str,
        url: str,
        attempt: int,
        started: float,
        outcome: str,
        *,
        http_status: int | None = None,
        failure: str | None = None,
    ) -> None:
        elapsed = time.perf_counter() - started
        log.info(
            "gateway %s: %s %s attempt %d %s in %.0f ms",
            operation,
            method,
            url,
            attempt,
            outcome,
            elapsed * 1000,
        )
        if _observers:
            _notify(
                CallAttempt(operation, method, attempt, elapsed, http_status=http_status, failure=failure)
            )


def _retry_after(response: requests.Response) -> float | None:
    return parse_retry_after(response.headers.get("Retry-After"))


def _json_object(response: requests.Response) -> dict[str, Any] | None:
    try:
        data = json.loads(response.content)
    except (ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _connection_error(exc: requests.RequestException, operation: str) -> GatewayConnectionError:
    if isinstance(exc, requests.Timeout):
        return GatewayTimeoutError(
            f"the gateway did not answer in time ({type(exc).__name__})", operation=operation
        )
    return GatewayConnectionError(f"could not reach the gateway ({type(exc).__name__})", operation=operation)


def _never_reached_gateway(exc: requests.RequestException) -> bool:
    """True when the request surely was not processed: the TCP connection was never established."""
    if isinstance(exc, requests.ConnectTimeout):
        return True
    if isinstance(exc, requests.ConnectionError):
        # requests wraps urllib3's MaxRetryError, whose ``reason`` says why the connection failed.
        pending: list[object] = [exc]
        seen = 0
        while pending and seen < 20:
            current = pending.pop()
            seen += 1
            if not isinstance(current, BaseException):
                continue
            if type(current).__name__ in ("NewConnectionError", "NameResolutionError", "ConnectTimeoutError"):
                return True
            pending.extend(
                [getattr(current, "reason", None), current.__cause__, current.__context__, *current.args]
            )
    return False
