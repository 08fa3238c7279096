"""Every error the extension raises, in one tree, and the gateway's errors beside them.

::

    FlaskGatewayError                      the root: catch it to handle every error of Flask-Gateway
    |-- GatewayError                       what the gateway answered, or that it could not be reached
    |   |                                  (flask_gateway.core.errors: ConflictError, NotFoundError, ...)
    `-- GatewayExtensionError              what the extension itself refuses or cannot do
        |-- ConfigurationError             a GATEWAY_* key (or the app's setup) is wrong; names the fix
        |-- NotInstalledError              the gateway is not installed for this environment yet
        |-- SecretUnreadable               a stored secret cannot be decrypted (the key changed)
        |-- InvalidOrderError              an order the gateway cannot take (names the field)
        |-- CheckoutUnavailableError       the payment option is not offered for this total
        |-- CheckoutStateError             the checkout's status does not allow the operation
        |-- RefundNotAllowedError          the shop's own checks refuse the refund (amount, status, pending)
        |-- RefundDeclinedError            the gateway declined the refund; ``cause`` is its GatewayError
        |-- CallbackRejected (HTTP 4xx/5xx)  a status callback was refused (one subclass per answer)
        |-- V1OutcomeRejected (HTTP 4xx)   a call to the v1 success/fail URL was refused
        |-- InvalidReturnLink (HTTP 400)   a return link's signed reference is missing or forged
        `-- DatabaseUnavailable (HTTP 503) the database is away for now: try again after ``Retry-After``

The errors a view turns into an HTTP answer are werkzeug ``HTTPException`` subclasses too, with their
``code``, after flask-wtf's ``CSRFError(BadRequest)``: an app changes the answer with
``@app.errorhandler(CallbackRejected)`` (or ``V1OutcomeRejected``, ``InvalidReturnLink``). Without a
handler the callback and v1 errors answer a small JSON object ``{"message": ...}`` (the gateway's own
error shape); the return-page error is an HTML page, because a shopper's browser shows it.

The local errors also keep the built-in base they always had (``ValueError``, ``RuntimeError``), so code
written against those still catches them.
"""

from __future__ import annotations

import json
import sys
import traceback
from typing import IO, TYPE_CHECKING, Any, ClassVar, Final

import click
from flask.helpers import get_debug_flag
from werkzeug.exceptions import (
    BadRequest,
    Forbidden,
    HTTPException,
    NotFound,
    RequestEntityTooLarge,
    ServiceUnavailable,
    TooManyRequests,
    Unauthorized,
)

from flask_gateway.core.errors import FlaskGatewayError, GatewayError
from flask_gateway.core.outages import RETRY_AFTER_SECONDS
from flask_gateway.models import CallbackOutcome

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

    from flask_gateway.models import CallbackLog, GatewayCheckout, RefundRecord

__all__ = [
    "EX_CONFIG",
    "CallbackBodyInvalid",
    "CallbackCheckoutUnknown",
    "CallbackConfirmFailed",
    "CallbackRateLimited",
    "CallbackRejected",
    "CallbackTooLarge",
    "CallbackUnauthorized",
    "CheckoutStateError",
    "CheckoutUnavailableError",
    "ConfigurationError",
    "DatabaseUnavailable",
    "FlaskGatewayError",
    "GatewayError",
    "GatewayExtensionError",
    "InvalidOrderError",
    "InvalidReturnLink",
    "JSONHTTPException",
    "NotInstalledError",
    "RefundDeclinedError",
    "RefundNotAllowedError",
    "SecretUnreadable",
    "UnknownAccountError",
    "V1OutcomeForbidden",
    "V1OutcomeInvalid",
    "V1OutcomeRejected",
    "V1OutcomeUnknown",
]


class GatewayExtensionError(FlaskGatewayError):
    """The base of every error the extension itself raises (the gateway's answers are ``GatewayError``)."""


#: The exit status of a ``flask`` command stopped by a configuration error: ``EX_CONFIG`` (sysexits.h).
#: Running it again changes nothing; a person must fix the configuration (unlike 75, an outage).
EX_CONFIG: Final = 78


class ConfigurationError(GatewayExtensionError, RuntimeError, click.ClickException):
    """A ``GATEWAY_*`` key is missing or wrong, or the app is not set up for the extension; the message
    names what and says how to fix it.

    It is a ``click.ClickException`` too: where the ``flask`` command meets it (loading the app for
    ``flask run``, ``init-db``, ``flask gateway ...``) it prints one line, ``Error: <what is wrong>. <how
    to fix it>``, and exits with status :data:`EX_CONFIG` (78), the server not started. With ``flask
    --debug`` or ``FLASK_DEBUG=1`` the traceback is printed above the line. Elsewhere (a WSGI server, a
    test) it is an ordinary exception.
    """

    exit_code = EX_CONFIG

    def __init__(self, message: str) -> None:
        click.ClickException.__init__(self, message)  # sets ``message``; ``args`` through Exception

    def show(self, file: IO[Any] | None = None) -> None:
        """What the ``flask`` command prints: the one line (the traceback above it when debugging)."""
        out = file if file is not None else sys.stderr
        if get_debug_flag():
            traceback.print_exception(self, file=out)
        click.echo(f"Error: {' '.join(self.message.split())}", file=out)


class NotInstalledError(GatewayExtensionError, RuntimeError):
    """The gateway is not installed yet: an administrator must complete the install screen."""


class UnknownAccountError(GatewayExtensionError, LookupError):
    """A merchant account was named (an argument, the shop's account resolver, a CLI option, a callback
    path) that is not installed for this environment. ``account`` is the id asked for; the message lists
    the installed ones."""

    def __init__(self, message: str, *, account: str) -> None:
        super().__init__(message)
        self.account = account


class SecretUnreadable(GatewayExtensionError, RuntimeError):
    """A stored secret cannot be decrypted: the encryption key (or SECRET_KEY) changed."""


class InvalidOrderError(GatewayExtensionError, ValueError):
    """The order cannot be sent to the gateway as it is; the message names the field and the fix.

    Raised before anything is saved."""


class CheckoutUnavailableError(GatewayExtensionError, ValueError):
    """The payment option is not available for this total (outside the merchant's limits, or the gateway
    is not installed)."""


class CheckoutStateError(GatewayExtensionError, ValueError):
    """The checkout's status (or its version, or a missing token) does not allow the operation."""


class RefundNotAllowedError(GatewayExtensionError, ValueError):
    """The shop's own checks refuse the refund before anything is sent: the amount (not whole cents, zero,
    more than is left), the checkout's status, or a refund still pending for the same checkout."""


class RefundDeclinedError(GatewayExtensionError):
    """The gateway declined the refund. ``refund`` (a ``RefundRecord``) is marked ``FAILED`` with its reason;
    ``cause`` is the gateway's ``GatewayError`` (its ``http_status``, ``body``, ``message``).

    ``str()`` names the amount and the gateway's own message; show it to the shop owner.
    """

    def __init__(self, message: str, *, refund: RefundRecord, cause: GatewayError) -> None:
        super().__init__(message)
        self.message = message
        self.refund = refund
        self.cause = cause

    @property
    def http_status(self) -> int | None:
        return self.cause.http_status


class JSONHTTPException(HTTPException):
    """An HTTP error whose body is ``{"message": <description>}`` (``application/json``, never cached)."""

    def get_body(self, environ: WSGIEnvironment | None = None, scope: dict[str, Any] | None = None) -> str:
        return json.dumps({"message": self.description or self.name}, separators=(",", ":"))

    def get_headers(
        self, environ: WSGIEnvironment | None = None, scope: dict[str, Any] | None = None
    ) -> list[tuple[str, str]]:
        # The other headers of the error's class stay (werkzeug's 429 and 503 add ``Retry-After`` from
        # ``retry_after``); only the HTML content type is replaced.
        kept = [
            (name, value) for name, value in super().get_headers(environ, scope) if name != "Content-Type"
        ]
        return [("Content-Type", "application/json"), ("Cache-Control", "no-store"), *kept]


class CallbackRejected(GatewayExtensionError, JSONHTTPException):
    """A status callback was refused. It was logged first (``log``, a ``CallbackLog`` row); nothing changed.

    ``outcome`` is the value stored in ``CallbackLog.outcome``.
    """

    outcome: ClassVar[str] = "rejected"

    def __init__(
        self,
        description: str | None = None,
        *,
        log: CallbackLog | None = None,
        checkout: GatewayCheckout | None = None,
    ) -> None:
        super().__init__(description)
        self.log = log
        self.checkout = checkout


class CallbackUnauthorized(CallbackRejected, Unauthorized):
    """401: a wrong or missing signature, or an ``X-Merchant-Account-ID`` not the installed account."""

    outcome = CallbackOutcome.REJECTED_SIGNATURE.value
    description = "The callback's signature or merchant account is not valid."


class CallbackTooLarge(CallbackRejected, RequestEntityTooLarge):
    """413: the body is larger than a status callback can be (64 KiB)."""

    outcome = CallbackOutcome.TOO_LARGE.value
    description = "The callback body is too large."


class CallbackBodyInvalid(CallbackRejected, BadRequest):
    """400: a correctly signed body that is not a checkout status payload (malformed JSON, bad fields)."""

    outcome = CallbackOutcome.INVALID_BODY.value
    description = "The callback body is not a checkout status payload."


class CallbackCheckoutUnknown(CallbackRejected, NotFound):
    """404: no v2 checkout of this shop has the payload's ``checkoutToken``."""

    outcome = CallbackOutcome.UNKNOWN_CHECKOUT.value
    description = "No checkout with this checkoutToken."


class CallbackConfirmFailed(CallbackRejected, ServiceUnavailable):
    """503: a correctly signed claim that getstatus could not confirm (the gateway did not answer): the
    gateway retries the callback, and reconciliation asks again."""

    outcome = CallbackOutcome.CONFIRM_FAILED.value
    description = "The callback could not be confirmed with the gateway yet; try again later."


class CallbackRateLimited(CallbackRejected, TooManyRequests):
    """429: this client used up its refused callbacks for now; nothing was read or stored."""

    outcome = "rate-limited"
    description = "Too many refused callbacks from this address; try again later."

    def __init__(self, description: str | None = None, *, retry_after: int = 60) -> None:
        super().__init__(description)
        self.retry_after = retry_after


class V1OutcomeRejected(GatewayExtensionError, JSONHTTPException):
    """A call to the v1 success or fail URL was refused; nothing changed."""


class V1OutcomeInvalid(V1OutcomeRejected, BadRequest):
    """400: a parameter is missing or has a value the endpoint does not take."""


class V1OutcomeForbidden(V1OutcomeRejected, Forbidden):
    """403: the signed reference is forged, edited or for the other endpoint, or the token is not the order's.

    (A reference is only given to the gateway, so an invalid one is an attempt, not a typo.)
    """


class V1OutcomeUnknown(V1OutcomeRejected, NotFound):
    """404: the (validly signed) reference names no v1 order of this shop."""


class InvalidReturnLink(GatewayExtensionError, BadRequest):
    """400 on a return page: the link's signed reference is missing, edited or forged."""

    description = (
        "This payment link is not valid. Open your order from the shop's order history, or contact the "
        "shop if you were charged."
    )


class DatabaseUnavailable(GatewayExtensionError, JSONHTTPException, ServiceUnavailable):
    """503 with ``Retry-After``: the database cannot answer right now (restarting, failing over, its pool
    exhausted). The request did not finish: send it again after ``retry_after`` seconds.

    Built by ``flask_gateway.operations.outages.database_unavailable(error)``, which also records the outage
    (one log line per outage). The body is ``{"message": ...}``, as every JSON error of the extension: a
    gateway retrying a callback reads it; a shop renders its own page for people instead.
    """

    description = "The service is briefly unavailable: its database is not answering. Try again shortly."

    def __init__(self, description: str | None = None, *, retry_after: int = RETRY_AFTER_SECONDS) -> None:
        super().__init__(description)
        self.retry_after = retry_after
