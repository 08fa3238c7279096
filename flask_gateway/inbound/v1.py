"""The gateway's calls to a v1 order's success and fail URLs (:func:`process_v1_outcome`): a signed ``ref``
and the order's token are the gateway's word (v1 has no getstatus); the answer is a :class:`V1Reply`.
Where the shopper goes afterwards: :func:`shop_return_url`.

Imports nothing from the rest of ``flask_gateway.inbound``.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, NoReturn

from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.wire import (
    OPERATOR,
    V1FailReason,
    V1MerchantAnswer,
    V1OutcomeStatus,
    WireNames,
)
from flask_gateway.core.wire import CheckoutStatus as S
from flask_gateway.errors import (
    V1OutcomeForbidden,
    V1OutcomeInvalid,
    V1OutcomeRejected,
    V1OutcomeUnknown,
)
from flask_gateway.models import GatewayCheckout
from flask_gateway.payments.transitions import (
    Observation,
    apply,
    send_pending,
)
from flask_gateway.state import get_state
from flask_gateway.urls import external_url, load_signed_reference, return_url

__all__ = ["V1Reply", "process_v1_outcome", "shop_return_url"]

_log = logging.getLogger("flask_gateway.inbound")  # not __name__: the name is an interface (docs/logging.md)


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
