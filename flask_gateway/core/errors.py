"""One error hierarchy for everything the gateway (or the way to it) can answer.

``FlaskGatewayError`` is the root of every error this package raises: ``GatewayError`` (here) for what the
gateway answers or fails to answer, ``flask_gateway.errors.GatewayExtensionError`` for what the Flask
extension itself refuses.

Each error carries the HTTP status, the parsed body, the gateway's ``message``, its field errors and the
response headers. None of them ever holds a secret: request bodies (which carry the API key at
installation) and request headers (which carry the signature) are never stored on an error.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from requests.structures import CaseInsensitiveDict

from flask_gateway.core.retry_after import parse_retry_after

__all__ = [
    "AlreadyInstalledError",
    "AuthenticationError",
    "CheckoutExpiredError",
    "ConflictError",
    "FirewallRejectedError",
    "FlaskGatewayError",
    "ForbiddenError",
    "GatewayConnectionError",
    "GatewayError",
    "GatewayServerError",
    "GatewayTimeoutError",
    "IdempotencyError",
    "InvalidRequestError",
    "InvalidResponseError",
    "NotFoundError",
    "PayloadTooLargeError",
    "RateLimitError",
    "V1RefundFailedError",
    "definite_refusal",
    "error_for_status",
]


class FlaskGatewayError(Exception):
    """The root of every error Flask-Gateway raises: catch it to handle them all."""


class GatewayError(FlaskGatewayError):
    """Base of every error the clients raise: what the gateway answered, or that it could not be reached.

    :ivar http_status: the HTTP status, or None when no response came (connection errors).
    :ivar message: the gateway's ``message`` (or a description of what went wrong).
    :ivar body: the parsed JSON body (a dict), or None when the body was not JSON.
    :ivar field_errors: ``[{"field": ..., "message": ...}]`` from a 400 answer.
    :ivar headers: the response headers.
    :ivar operation: the client operation that failed, such as ``"create"``.
    """

    default_message = "the gateway request failed"

    def __init__(
        self,
        message: str | None = None,
        *,
        http_status: int | None = None,
        body: Mapping[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
        operation: str | None = None,
    ) -> None:
        self.message = message or self.default_message
        self.http_status = http_status
        self.body = dict(body) if body is not None else None
        self.headers: CaseInsensitiveDict[str] = CaseInsensitiveDict(headers or {})
        self.operation = operation
        raw_errors = self.body.get("errors") if self.body else None
        self.field_errors: list[dict[str, str]] = [
            {"field": str(e.get("field", "")), "message": str(e.get("message", ""))}
            for e in (raw_errors if isinstance(raw_errors, list) else [])
            if isinstance(e, dict)
        ]
        super().__init__(self.message)

    def __str__(self) -> str:
        parts = [self.message]
        if self.http_status is not None:
            parts.insert(0, f"HTTP {self.http_status}")
        if self.operation:
            parts.insert(0, f"{self.operation}:")
        text = " ".join(parts)
        if self.field_errors:
            text += " (" + "; ".join(f"{e['field']}: {e['message']}" for e in self.field_errors) + ")"
        return text

    def __repr__(self) -> str:
        return f"{type(self).__name__}(http_status={self.http_status!r}, message={self.message!r})"

    @property
    def retryable(self) -> bool:
        """Whether repeating the same request may succeed (a transient fault, not a wrong request)."""
        return False


class GatewayConnectionError(GatewayError):
    """No usable answer: the connection failed or broke. The request may or may not have been processed."""

    default_message = "could not reach the gateway"

    @property
    def retryable(self) -> bool:
        return True


class GatewayTimeoutError(GatewayConnectionError):
    """The gateway did not answer within the configured timeout."""

    default_message = "the gateway did not answer in time"


class InvalidRequestError(GatewayError):
    """400: malformed JSON or missing/invalid fields; ``field_errors`` says which."""


class PayloadTooLargeError(InvalidRequestError):
    """413: the request body is over the gateway's size limit."""


class AuthenticationError(GatewayError):
    """401: wrong account id, API key or signature.

    On the sandbox, ``expected_signature`` is the signature the gateway computed: compare it with what
    you sent to tell a wrong key from a body changed after signing.
    """

    default_message = "the gateway refused the credentials or the signature"

    @property
    def expected_signature(self) -> str | None:
        value = self.body.get("expectedSignature") if self.body else None
        return value if isinstance(value, str) else None


class ForbiddenError(GatewayError):
    """403 for a reason other than the ones below."""


class CheckoutExpiredError(ForbiddenError):
    """403 on update: the checkout expired; create a new one."""


class AlreadyInstalledError(ForbiddenError):
    """403 on installation: the account was installed before; use the signing key you were given then."""


class FirewallRejectedError(ForbiddenError):
    """403 from the gateway's web application firewall (e.g. redirect URLs on localhost or an IP address)."""


class NotFoundError(GatewayError):
    """404: no such checkout for this merchant account."""


class ConflictError(GatewayError):
    """409: the checkout's state does not allow the operation, or the same request is still in flight."""


class IdempotencyError(GatewayError):
    """422: this ``requestId`` was used before with a different body."""


class RateLimitError(GatewayError):
    """429: too many requests; ``retry_after`` (seconds) when the gateway said."""

    @property
    def retryable(self) -> bool:
        return True

    @property
    def retry_after(self) -> float | None:
        return parse_retry_after(self.headers.get("Retry-After"))


class GatewayServerError(GatewayError):
    """5xx: the gateway failed. The request may have been processed: retry with the same ``requestId``."""

    @property
    def retryable(self) -> bool:
        return True


class InvalidResponseError(GatewayError):
    """The gateway answered success with a body that does not match the API."""


class V1RefundFailedError(InvalidRequestError):
    """The v1 refund answered ``status: FAILED``; ``message`` is the gateway's reason."""


_BY_STATUS: dict[int, type[GatewayError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    413: PayloadTooLargeError,
    422: IdempotencyError,
    429: RateLimitError,
}


def error_for_status(
    http_status: int,
    body: Mapping[str, Any] | None,
    headers: Mapping[str, str],
    *,
    operation: str | None = None,
) -> GatewayError:
    """The error for a non-2xx answer, chosen by status (and, for 403, by operation and message)."""
    message = _message_of(body) or f"the gateway answered HTTP {http_status}"
    cls: type[GatewayError]
    if operation == "v1_refund" and _v1_refusal(body) is not None:
        cls = V1RefundFailedError
    elif http_status == 403:
        cls = _forbidden_kind(body, operation)
    elif http_status >= 500:
        cls = GatewayServerError
    else:
        cls = _BY_STATUS.get(http_status, GatewayError)
    return cls(message, http_status=http_status, body=body, headers=headers, operation=operation)


def _v1_refusal(body: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """The ``{status: "FAILED", reason: ...}`` object of a v1 refusal, wrapped in ``data`` or bare."""
    if not body:
        return None
    data = body.get("data")
    candidate = data if isinstance(data, Mapping) and "status" in data else body
    return candidate if candidate.get("status") == "FAILED" else None


def _message_of(body: Mapping[str, Any] | None) -> str | None:
    if not body:
        return None
    message = body.get("message")
    if isinstance(message, str) and message:
        return message
    refusal = _v1_refusal(body)
    reason = refusal.get("reason") if refusal else None
    errors = reason.get("errors") if isinstance(reason, Mapping) else None
    message = errors.get("message") if isinstance(errors, Mapping) else reason
    return message if isinstance(message, str) and message else None


def _forbidden_kind(body: Mapping[str, Any] | None, operation: str | None) -> type[ForbiddenError]:
    # A firewall answers before the application: no JSON, or the bare message "Forbidden".
    if body is None or body.get("message") == "Forbidden":
        return FirewallRejectedError
    if operation == "install":
        return AlreadyInstalledError
    if operation == "update":
        return CheckoutExpiredError
    return ForbiddenError


def definite_refusal(error: GatewayError, *, conflict_refuses: bool = False) -> bool:
    """The gateway surely did not act: a 4xx answer other than 422 and 429, and 409 only when
    ``conflict_refuses``.

    A 409 on create can only mean "the same requestId is still in flight" (the first attempt may yet
    succeed); on a refund it is mostly the refusal itself (wrong status, more than what is left).
    """
    status = error.http_status
    if status is None or not 400 <= status < 500:
        return False
    if isinstance(error, ConflictError):
        return conflict_refuses
    return not isinstance(error, IdempotencyError | RateLimitError)
