"""What the helpers of :class:`GatewayEmulator` take and give back: which checkout (:func:`token_of`,
:class:`CheckoutRef`), the failure they raise (:class:`GatewayEmulatorError`) and the records they return.

Imports nothing of the extension, the emulator or this package.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit


class GatewayEmulatorError(AssertionError):
    """The emulator refused what a helper asked (a test failure: the message says what and why)."""


class GatewayKitWarning(UserWarning):
    """The shop's test configuration cannot work with the gateway as configured (the message starts with
    the key to set): under ``filterwarnings = error`` it fails the test's setup with that line."""


# pytest's one-line summary shows ``module.Class: message``, cut at the terminal's width: the public path
# (flask_gateway.testing exports both) leaves more of the message, which starts with what to fix.
GatewayEmulatorError.__module__ = GatewayKitWarning.__module__ = "flask_gateway.testing"


def token_of(checkout: object) -> str:
    """The checkout token in ``checkout``: a ``GatewayCheckout`` (or anything with ``.token``), a token, a
    payment page URL (``.../app/checkout/<token>``), or the shop's response redirecting to one."""
    token = getattr(checkout, "token", None)
    if isinstance(token, str) and token:
        return token
    headers = getattr(checkout, "headers", None)
    if headers is not None and not isinstance(checkout, str):
        location = headers.get("Location")
        status = getattr(checkout, "status_code", None)
        if not location:
            body = getattr(checkout, "get_data", lambda **_: "")(as_text=True)
            raise GatewayEmulatorError(
                f"The shop answered HTTP {status} without a Location: not a redirect to the gateway's "
                f"payment page. Its answer began: {body[:300]!r}"
            )
        return token_of(str(location))
    if isinstance(checkout, str) and checkout:
        if "/" in checkout:
            path = urlsplit(checkout).path.rstrip("/")
            if "/app/checkout/" not in path:
                raise GatewayEmulatorError(
                    f"{checkout!r} is not a payment page URL of the gateway (.../app/checkout/<token>)"
                )
            return path.rsplit("/", 1)[1]
        return checkout
    raise GatewayEmulatorError(
        f"Cannot tell which checkout {checkout!r} is: give a GatewayCheckout, a checkout token, a payment "
        "URL or the shop's redirect to it"
    )


@dataclass(frozen=True)
class CheckoutRef:
    """Which checkout a helper of :class:`GatewayEmulator` was given, found at the gateway
    (:meth:`GatewayEmulator.resolve`): every helper takes an order reference, a token, a checkout, its
    payment page URL or the shop's redirect to it, alike."""

    #: What the test gave, as text (for messages).
    given: str
    #: The checkout's token (an order reference: its most recent checkout's).
    token: str
    #: The order reference the shop sent with it.
    order_reference: str
    #: The test gave the order's reference (not a token or a checkout): the fulfilment helpers
    #: (``confirmations``, ``assert_fulfilled_once``, ``assert_not_fulfilled``) count every checkout of
    #: that order, since an order is fulfilled once whichever of its checkouts was paid.
    by_reference: bool = False
    #: The tokens of the order's checkouts at the gateway, newest first.
    order_tokens: tuple[str, ...] = ()

    def matches(self, record: SignalRecord) -> bool:
        """Whether a signal ``record`` is about this checkout (or, given by reference, this order)."""
        if self.by_reference:
            return record.order_reference == self.order_reference
        return record.token == self.token


@dataclass(frozen=True)
class ConsumerOutcome:
    """What the consumer's action on the payment page did (the control API's answer)."""

    #: The checkout's status at the gateway afterwards (e.g. ``PAID_PENDING_CALLBACK``).
    status: str
    #: Where the consumer is sent back to the shop (v2: the confirm or cancel URL; v1: the ``return_url``
    #: of the shop's answer, None when it gave no usable one).
    redirect_url: str | None
    #: v1: what the shop's success/fail URL answered (``OK`` or why it failed).
    merchant_message: str | None = None


@dataclass(frozen=True)
class CallbackReply:
    """What the shop answered to a callback sent by :meth:`GatewayEmulator.replay_callback` or
    :meth:`GatewayEmulator.redeliver`."""

    #: Only HTTP 200 acknowledges a callback.
    ok: bool
    http_status: int | None
    #: ``OK``, ``HTTP 500``, ``Timeout after 10 s``...
    message: str


@dataclass(frozen=True)
class SignalRecord:
    """One signal the extension sent for the shop while the emulator was running."""

    #: ``payment_confirmed``, ``checkout_cancelled``, ``checkout_expired``, ``callback_rejected`` or
    #: ``checkout_flagged``.
    signal: str
    token: str | None
    order_reference: str | None
    #: ``callback``, ``return``, ``poll``, ``reconcile``, ``v1``, ``admin`` (when the signal has one).
    source: str | None = None
    #: Why (``callback_rejected``, ``checkout_flagged``).
    reason: str | None = None
