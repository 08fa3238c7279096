"""Orders as the gateway's requests: the shop's ``OrderDraft`` mapped to the v2 and v1 wire models.

The request models validate what is mapped here, so an error names the full path as the wire spells it
(``payjustnow.customer.email``); :class:`~flask_gateway.errors.InvalidOrderError` carries it to the shop.
"""

from __future__ import annotations

import dataclasses
import json
from datetime import timedelta
from typing import Any

from flask import has_request_context, request

from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import (
    CheckoutStatus,
    CreateCheckoutRequest,
    V1CheckoutRequest,
)
from flask_gateway.errors import (
    ConfigurationError,
    InvalidOrderError,
)
from flask_gateway.models import REFERENCE_LENGTH
from flask_gateway.payments.orders import Address, OrderDraft
from flask_gateway.state import get_state
from flask_gateway.urls import return_url, v1_outcome_url

__all__ = [
    "check_reference",
    "order_snapshot",
    "v1_checkout_request",
    "v2_create_request",
    "v2_order_details",
]

S = CheckoutStatus


def order_snapshot(order: OrderDraft) -> dict[str, Any]:
    """The order as stored on the checkout (JSON-ready; tuples become lists)."""
    data: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(order)))
    return data


def _public_base() -> str:
    """The shop's external base URL, for item URLs the shop left empty."""
    public = get_state().config.public_url
    if public:
        return public + "/"
    if has_request_context():
        return request.url_root
    raise ConfigurationError(
        "GATEWAY_PUBLIC_URL is not set and an order line has no image_url or page_url: set "
        "GATEWAY_PUBLIC_URL to the shop's external address (e.g. https://shop.example) or give every "
        "line absolute URLs."
    )


def _address(address: Address | None) -> dict[str, Any] | None:
    if address is None:
        return None
    return {
        "addressLine1": address.line1,
        "addressLine2": address.line2 or None,
        "city": address.city,
        "province": address.province,
        "postalCode": address.postal_code,
    }


def v2_order_details(order: OrderDraft, checkout_id: int) -> dict[str, Any]:
    """The order details create and update share, as plain data: the request model validates them (so an
    error names the full path as the wire spells it, e.g. ``payjustnow.customer.email``)."""
    fallback = ""
    if any(not line.image_url or not line.page_url for line in order.lines):
        fallback = _public_base()
    customer = order.customer
    details: dict[str, Any] = {
        "merchantOrderReference": order.reference,
        "orderAmountCents": order.lines_total_cents,
        "orderItems": [
            {
                "name": line.name,
                "sku": line.sku,
                "quantity": line.quantity,
                "priceCents": line.unit_price_cents,
                "imageUrl": line.image_url or fallback,
                "pageUrl": line.page_url or fallback,
                "searchTerms": list(line.search_terms),
                "category": line.category,
            }
            for line in order.lines
        ],
        "confirmRedirectUrl": return_url(checkout_id, "confirm"),
        "cancelRedirectUrl": return_url(checkout_id, "cancel"),
        "billingAddress": _address(order.billing_address),
        "shippingAddress": _address(order.shipping_address),
    }
    if customer is not None:
        details["customer"] = {
            "firstName": customer.first_name,
            "lastName": customer.last_name,
            "email": customer.email,
            "phoneNumber": customer.phone or None,
        }
    return details


def v2_create_request(order: OrderDraft, checkout_id: int, request_id: str) -> CreateCheckoutRequest:
    config = get_state().config
    details = v2_order_details(order, checkout_id)
    details["orderExpiryMinutes"] = config.order_expiry_minutes
    return CreateCheckoutRequest.from_wire(
        {
            "requestId": request_id,
            config.wire_names.order_details: details,
            "checkoutTotalCents": order.amount_cents,
            "clickTraceId": order.click_trace_id,
        }
    )


def v1_checkout_request(order: OrderDraft, checkout_id: int) -> V1CheckoutRequest:
    customer = order.customer
    if customer is None or not customer.phone:
        raise InvalidOrderError(
            f"order {order.reference!r}: the v1 API needs the customer with a mobile number (E.164, e.g. "
            "+27821234567, as the gateway's documentation shows it); set OrderDraft.customer.phone."
        )
    address = order.billing_address or order.shipping_address
    if address is None:
        raise InvalidOrderError(f"order {order.reference!r}: the v1 API needs the customer's address.")
    minutes = get_state().config.order_expiry_minutes
    items = [
        {
            "merchant_reference": line.sku,
            "quantity": line.quantity,
            "description": line.name,
            "unit_price": line.unit_price_cents,
        }
        for line in order.lines
    ]
    return V1CheckoutRequest.from_wire(
        {
            "customer": {
                "first_name": customer.first_name,
                "last_name": customer.last_name,
                "email": customer.email,
                "mobile_number": customer.phone,
                "address": {
                    "address_line_1": address.line1,
                    "address_line_2": address.line2 or None,
                    "city": address.city,
                    "province": address.province,
                    # As text: "0181" keeps its leading zero (the gateway reads text or a number).
                    "postal_code": address.postal_code.strip(),
                },
            },
            "order": {
                "amount": order.amount_cents,
                "merchant_reference": order.reference,
                "success_callback_url": v1_outcome_url(checkout_id, "v1-success"),
                "fail_callback_url": v1_outcome_url(checkout_id, "v1-fail"),
                "expires_at": utcnow().replace(microsecond=0) + timedelta(minutes=minutes),
                "items": {str(number): item for number, item in enumerate(items, start=1)},
            },
        }
    )


def check_reference(order: OrderDraft, field: str) -> None:
    """Refuse a reference the gateway would refuse, before the row is written: PostgreSQL refuses one over
    the column's length, or with U+0000, outright (SQLite would store it and the request fail later).
    ``field`` names the reference as the API version's wire spells it; raises ``InvalidOrderError``."""
    problem = None
    if len(order.reference) > REFERENCE_LENGTH:
        problem = f"String should have at most {REFERENCE_LENGTH} characters"
    elif "\x00" in order.reference:
        problem = "must not contain U+0000"
    if problem is not None:
        raise InvalidOrderError(
            f"order {order.reference!r} cannot be sent to the gateway: {field}: {problem}"
        )
