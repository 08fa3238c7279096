"""Shoppers coming back from the gateway (:func:`process_return`): the signed return link names the
checkout; getstatus, at most once per ``RETURN_POLL_INTERVAL`` and only while it may still change, says
its status.

Imports nothing from the rest of ``flask_gateway.inbound``.
"""

from __future__ import annotations

import logging
from typing import Final, Literal

from werkzeug.exceptions import NotFound

from flask_gateway.core.errors import GatewayError
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import CheckoutStatus as S
from flask_gateway.errors import (
    InvalidReturnLink,
    NotInstalledError,
    SecretUnreadable,
    UnknownAccountError,
)
from flask_gateway.models import GatewayCheckout
from flask_gateway.payments.polling import refresh
from flask_gateway.state import get_state
from flask_gateway.urls import load_signed_reference

__all__ = ["RETURN_POLL_INTERVAL", "process_return"]

_log = logging.getLogger("flask_gateway.inbound")  # not __name__: the name is an interface (docs/logging.md)


#: What a return page may still learn something about from the gateway (a payment, its acknowledgement).
_STILL_OPEN: Final = frozenset(
    {S.PENDING_ORDER.value, S.CANCELLED_BY_CONSUMER.value, S.PAID_PENDING_CALLBACK.value}
)


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
        # UnknownAccountError: the checkout's merchant account is no longer installed here.
        except (GatewayError, NotInstalledError, SecretUnreadable, UnknownAccountError) as exc:
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
