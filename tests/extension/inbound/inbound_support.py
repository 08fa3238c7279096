"""Helpers for the callback, v1 and return-page tests: checkouts made directly, signed callbacks, snapshots.

Checkouts are created here without the operations module: a ``GatewayCheckout`` row, the gateway's
checkout made with the shop's own client, and the token set through ``transitions.apply`` (source
``create``), exactly as the extension records it.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any, Literal
from urllib.parse import urlsplit

from flask_gateway import signals
from flask_gateway.core.signing import sign
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import CreateCheckoutRequest, V1CheckoutRequest
from flask_gateway.models import CallbackLog, GatewayCheckout, LocalStatus
from flask_gateway.payments.transitions import Observation, apply
from flask_gateway.state import get_state
from flask_gateway.urls import return_url, v1_outcome_url
from tests.extension.conftest import ACCOUNT, SHOP_URL, Harness

SIGNAL_NAMES = (
    "payment_confirmed",
    "checkout_cancelled",
    "checkout_expired",
    "callback_rejected",
)


def record_signals() -> Iterator[dict[str, list[dict[str, Any]]]]:
    """Fixture body: every extension signal sent during the test, by name (keyword arguments, plus
    ``checkout_id`` and, for ``callback_rejected``, ``log_id`` and ``log_outcome``)."""
    seen: dict[str, list[dict[str, Any]]] = {name: [] for name in SIGNAL_NAMES}
    connected = []
    for name in SIGNAL_NAMES:

        def receiver(sender: Any, _name: str = name, **kwargs: Any) -> None:
            # Read the rows while the request's session is still there (after it they are detached).
            checkout, log = kwargs.get("checkout"), kwargs.get("log")
            kwargs["checkout_id"] = checkout.id if checkout is not None else None
            if log is not None:
                kwargs["log_id"], kwargs["log_outcome"] = log.id, log.outcome
            seen[_name].append(kwargs)

        signal = getattr(signals, name)
        signal.connect(receiver)
        connected.append((signal, receiver))
    yield seen
    for signal, receiver in connected:
        signal.disconnect(receiver)


def _new_row(reference: str, total: int, *, api_version: str, account: str = ACCOUNT) -> int:
    state = get_state()
    now = utcnow()
    row = GatewayCheckout(
        api_version=api_version,
        order_reference=reference,
        request_id=str(uuid.uuid4()),
        merchant_account_id=account,
        status=LocalStatus.CREATING.value,
        total_cents=total,
        order={"reference": reference},
        created_at=now,
        updated_at=now,
    )
    state.session.add(row)
    state.session.commit()
    return row.id


def create_v2_checkout(
    h: Harness, reference: str = "ORD-1", total: int = 79800, *, gateway_total: int | None = None
) -> tuple[int, str]:
    """A v2 checkout on the emulator and in the shop; ``gateway_total`` makes the two disagree."""
    sent = total if gateway_total is None else gateway_total
    with h.shop.test_request_context(base_url=SHOP_URL):
        state = get_state()
        checkout_id = _new_row(reference, total, api_version="v2")
        request = CreateCheckoutRequest.model_validate(
            {
                "service": {
                    "merchantOrderReference": reference,
                    "orderAmountCents": sent,
                    "orderItems": [
                        {
                            "name": "Enamel kettle",
                            "sku": "K-1",
                            "quantity": 1,
                            "priceCents": sent,
                            "imageUrl": f"{SHOP_URL}/static/kettle.png",
                            "pageUrl": f"{SHOP_URL}/products/kettle",
                            "searchTerms": ["kettle"],
                        }
                    ],
                    "confirmRedirectUrl": return_url(checkout_id, "confirm"),
                    "cancelRedirectUrl": return_url(checkout_id, "cancel"),
                },
                "checkoutTotalCents": sent,
            }
        )
        data = state.client().create_checkout(request).data
        apply(
            state.session,
            checkout_id,
            Observation(
                status="PENDING_ORDER",
                source="create",
                token=data.checkoutToken,
                payment_url=data.paymentUrl,
                expires_at=data.expiresAt,
            ),
        )
        return checkout_id, data.checkoutToken


def create_v1_checkout(h: Harness, reference: str = "ORD-V1", total: int = 79800) -> tuple[int, str]:
    """A v1 order on the emulator and in the shop, with the signed success/fail URLs."""
    with h.shop.test_request_context(base_url=SHOP_URL):
        state = get_state()
        checkout_id = _new_row(reference, total, api_version="v1")
        request = V1CheckoutRequest.model_validate(
            {
                "customer": {
                    "first_name": "Thandi",
                    "last_name": "Mokoena",
                    "email": "thandi@example.com",
                    "mobile_number": "+27821234567",
                    "address": {
                        "address_line_1": "1 Long St",
                        "city": "Cape Town",
                        "province": "WC",
                        "postal_code": 8001,
                    },
                },
                "order": {
                    "amount": total,
                    "merchant_reference": reference,
                    "success_callback_url": v1_outcome_url(checkout_id, "v1-success"),
                    "fail_callback_url": v1_outcome_url(checkout_id, "v1-fail"),
                    "items": {
                        "1": {
                            "merchant_reference": "K-1",
                            "quantity": 1,
                            "description": "Enamel kettle",
                            "unit_price": total,
                        }
                    },
                },
            }
        )
        data = state.v1_client().checkout(request).data
        apply(
            state.session,
            checkout_id,
            Observation(
                status="PENDING_ORDER",
                source="create",
                token=data.token,
                payment_url=data.redirect_to,
                expires_at=data.expires_at,
            ),
        )
        return checkout_id, data.token


def path_of(url: str) -> str:
    """``/path?query`` of an absolute URL, for the shop's test client."""
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}" if parts.query else parts.path


def return_path(h: Harness, checkout_id: int, kind: Literal["confirm", "cancel"]) -> str:
    """The path (with its signed ``ref``) of the return page the gateway sends the shopper to."""
    with h.shop.test_request_context():
        return path_of(return_url(checkout_id, kind))


def signing_key(h: Harness) -> str:
    with h.shop.app_context():
        state = get_state()
        return state.box.decrypt(state.require_installation().signing_key_encrypted)


def gateway_status(h: Harness, token: str) -> dict[str, Any]:
    """The emulator's status payload for ``token`` (asked with the shop's signed client)."""
    with h.shop.app_context():
        return get_state().client().get_status(token).data.to_wire()


def emulator_checkout(h: Harness, token: str) -> dict[str, Any]:
    response = h.emulator.control(f"checkouts/{token}", method="GET")
    assert response.status_code == 200, response.get_data(as_text=True)
    body = response.json
    assert isinstance(body, dict)
    return body


def post_callback(
    h: Harness,
    body: dict[str, Any] | bytes,
    *,
    key: str | None = None,
    account: str | None = ACCOUNT,
    signature: str | None = None,
    headers: dict[str, str] | None = None,
    omit: tuple[str, ...] = (),
) -> Any:
    """POST a callback to the shop, signed with the installed key unless told otherwise.

    ``omit``: header names not to send at all.
    """
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", "User-Agent": "gateway-test/1.0"}
    if account is not None:
        sent["X-Merchant-Account-ID"] = account
    sent["X-Signature"] = signature if signature is not None else sign(raw, key or signing_key(h))
    sent.update(headers or {})
    for name in omit:
        sent.pop(name, None)
    return h.client.post("/gateway/callback", data=raw, headers=sent)


def snapshot(h: Harness, checkout_id: int) -> dict[str, Any]:
    """The checkout's state, as plain data (events as (source, from, to, applied, detail))."""
    with h.shop.app_context():
        row = get_state().session.get(GatewayCheckout, checkout_id)
        assert row is not None
        return {
            "status": row.status,
            "flagged": row.flagged,
            "flag_reason": row.flag_reason,
            "paid_cents": row.paid_cents,
            "payment_confirmed_at": row.payment_confirmed_at,
            "fail_reason": row.fail_reason,
            "last_callback_at": row.last_callback_at,
            "events": [(e.source, e.from_status, e.to_status, e.applied, e.detail) for e in row.events],
        }


def callback_logs(h: Harness) -> list[dict[str, Any]]:
    with h.shop.app_context():
        rows = get_state().session.query(CallbackLog).order_by(CallbackLog.id).all()
        return [
            {
                "id": r.id,
                "checkout_id": r.checkout_id,
                "merchant_account_id": r.merchant_account_id,
                "headers": dict(r.headers),
                "body": r.body,
                "verified": r.verified,
                "outcome": r.outcome,
                "http_status": r.http_status,
                "detail": r.detail,
            }
            for r in rows
        ]


SECRET_HEADERS = ("x-signature", "authorization", "cookie", "proxy-authorization")


def assert_no_secrets(logs: list[dict[str, Any]], *, signatures: tuple[str, ...] = ()) -> None:
    """No log row keeps a secret header, and no signature value appears anywhere in a row."""
    for log in logs:
        names = {name.lower() for name in log["headers"]}
        assert not names & set(SECRET_HEADERS), log["headers"]
        text = json.dumps(log, default=str)
        for signature in signatures:
            assert signature not in text
