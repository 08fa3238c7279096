"""v2 request and response bodies, with the exact JSON field names of the gateway.

The order-details object and the gateway's order number are named after the operator: see
``core/wire/names.py`` for the two spellings; the attributes here are ``order_details`` and
``gatewayOrderReference``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, ClassVar, Final

from pydantic import AliasChoices, Field, Strict, model_validator

from flask_gateway.core.wire.common import (
    AbsoluteUrl,
    Cents,
    EmailAddress,
    PositiveCents,
    PreciseTimestamp,
    SecretText,
    StatusValue,
    Text,
    Timestamp,
    WireModel,
    WireNamedModel,
)
from flask_gateway.core.wire.names import OPERATOR, Role, WireNames, accepted

__all__ = [
    "MAX_EXPIRY_MINUTES",
    "MIN_EXPIRY_MINUTES",
    "STATUS_PAYLOAD_KEYS",
    "Address",
    "CancelCheckoutRequest",
    "CheckoutResponse",
    "CheckoutStatusPayload",
    "CreateCheckoutRequest",
    "CreateOrderDetails",
    "Customer",
    "ErrorBody",
    "FieldError",
    "GetStatusRequest",
    "InstallRequest",
    "InstallResponse",
    "OrderDetailsEcho",
    "OrderItem",
    "RefundRequest",
    "RefundResponse",
    "SettingsResponse",
    "SettingsUpdateRequest",
    "UpdateCheckoutRequest",
    "UpdateOrderDetails",
    "status_payload_keys",
]

MIN_EXPIRY_MINUTES: Final = 10
MAX_EXPIRY_MINUTES: Final = 7200

Token = Annotated[str, Strict(), Field(min_length=1, max_length=255)]
RequestId = Annotated[str, Strict(), Field(min_length=1, max_length=255)]
Quantity = Annotated[int, Strict(), Field(ge=1, le=100_000)]


class Address(WireModel):
    addressLine1: Text | None = None
    addressLine2: Text | None = None
    city: Text | None = None
    province: Text | None = None
    postalCode: Text | None = None


class Customer(WireModel):
    firstName: Text | None = None
    lastName: Text | None = None
    email: EmailAddress | None = None
    phoneNumber: Text | None = None


class OrderItem(WireModel):
    """One order line. Real clients send only ``name``, ``sku`` (empty when a product has none),
    ``quantity`` and ``priceCents``, and the gateway takes them (docs/decisions.md); we send all."""

    name: Annotated[Text, Field(min_length=1)]
    sku: Text
    quantity: Quantity
    priceCents: Cents
    imageUrl: AbsoluteUrl | None = None
    pageUrl: AbsoluteUrl | None = None
    searchTerms: Annotated[list[Text], Field(max_length=50)] | None = None
    category: Text | None = None


class _OrderDetails(WireModel):
    """The order details every create and update carries. ``orderItems`` may be left out (real clients
    do for an order without lines); an order has at most 500 lines."""

    merchantOrderReference: Annotated[Text, Field(min_length=1)]
    orderAmountCents: Cents
    orderItems: Annotated[list[OrderItem], Field(max_length=500)] | None = None
    confirmRedirectUrl: AbsoluteUrl
    cancelRedirectUrl: AbsoluteUrl
    customer: Customer | None = None
    billingAddress: Address | None = None
    shippingAddress: Address | None = None


class CreateOrderDetails(_OrderDetails):
    """The order details of a create request."""

    orderExpiryMinutes: (
        Annotated[int, Strict(), Field(ge=MIN_EXPIRY_MINUTES, le=MAX_EXPIRY_MINUTES)] | None
    ) = None


class UpdateOrderDetails(_OrderDetails):
    """The order details of an update request: the whole order again, optionally with a new ``expiresAt``."""

    expiresAt: Timestamp | None = None


class OrderDetailsEcho(WireModel):
    """The order details as the gateway echoes them in answers; all optional (the cancel echo is reduced)."""

    merchantOrderReference: str | None = None
    orderAmountCents: int | None = None
    orderItems: list[OrderItem] | None = None
    confirmRedirectUrl: str | None = None
    cancelRedirectUrl: str | None = None
    orderExpiryMinutes: int | None = None
    expiresAt: Timestamp | None = None
    customer: Customer | None = None
    billingAddress: Address | None = None
    shippingAddress: Address | None = None
    checkoutPaymentStatus: StatusValue | None = None


_ORDER_DETAILS: Final[Mapping[str, Role]] = {"order_details": "order_details"}


class CreateCheckoutRequest(WireNamedModel):
    renamed: ClassVar[Mapping[str, Role]] = _ORDER_DETAILS

    requestId: RequestId | None = None
    order_details: CreateOrderDetails = Field(validation_alias=accepted("order_details"))
    checkoutTotalCents: Cents
    clickTraceId: Text | None = None


class UpdateCheckoutRequest(WireNamedModel):
    renamed: ClassVar[Mapping[str, Role]] = _ORDER_DETAILS

    checkoutToken: Token
    order_details: UpdateOrderDetails = Field(validation_alias=accepted("order_details"))
    checkoutTotalCents: Cents
    clickTraceId: Text | None = None
    requestId: RequestId | None = None


class CancelCheckoutRequest(WireModel):
    checkoutToken: Token


class GetStatusRequest(WireModel):
    checkoutToken: Token


class CheckoutResponse(WireNamedModel):
    """Answer to create, update and cancel."""

    renamed: ClassVar[Mapping[str, Role]] = _ORDER_DETAILS

    requestId: str | None = None
    checkoutToken: str
    checkoutTotalCents: Cents
    paymentUrl: str
    checkoutPaymentStatus: StatusValue
    merchantOrderReference: str | None = None
    clickTraceId: str | None = None
    createdAt: Timestamp | None = None
    updatedAt: Timestamp | None = None
    expiresAt: Timestamp | None = None
    cancelledAt: Timestamp | None = None
    order_details: OrderDetailsEcho | None = Field(default=None, validation_alias=accepted("order_details"))
    merchantAccountId: str | None = None


def status_payload_keys(names: WireNames = OPERATOR) -> tuple[str, ...]:
    """The 16 keys of the status payload, in the gateway's order, as ``names`` spells them."""
    return tuple(names.order_reference if key == _ORDER_REFERENCE else key for key in STATUS_PAYLOAD_KEYS)


_ORDER_REFERENCE: Final = "gatewayOrderReference"

#: The status payload's keys by attribute (``gatewayOrderReference`` is spelled by the wire-name set).
STATUS_PAYLOAD_KEYS: Final = (
    "requestId",
    "checkoutToken",
    "checkoutTotalCents",
    "paymentUrl",
    "checkoutPaymentStatus",
    "paidAt",
    "paymentReference",
    "merchantOrderReference",
    _ORDER_REFERENCE,
    "clickTraceId",
    "createdAt",
    "updatedAt",
    "expiresAt",
    "cancelledAt",
    "lastCallbackAttemptedAt",
    "lastCallbackAttemptStatusMessage",
)


class CheckoutStatusPayload(WireNamedModel):
    """The getstatus answer and the callback body: always exactly these 16 keys, ``null`` when unset."""

    keep_nulls: ClassVar[bool] = True
    renamed: ClassVar[Mapping[str, Role]] = {_ORDER_REFERENCE: "order_reference"}

    requestId: str | None = None
    checkoutToken: str
    checkoutTotalCents: Cents
    paymentUrl: str | None = None
    checkoutPaymentStatus: StatusValue
    paidAt: PreciseTimestamp | None = None
    paymentReference: int | None = None
    merchantOrderReference: str | None = None
    gatewayOrderReference: int | None = Field(default=None, validation_alias=accepted("order_reference"))
    clickTraceId: str | None = None
    createdAt: Timestamp | None = None
    updatedAt: Timestamp | None = None
    # Six digits, as the gateway writes them here (".000000Z"); milliseconds elsewhere.
    expiresAt: PreciseTimestamp | None = None
    cancelledAt: PreciseTimestamp | None = None
    lastCallbackAttemptedAt: Timestamp | None = None
    lastCallbackAttemptStatusMessage: str | None = None


class RefundRequest(WireModel):
    # Optional like create's: the client generates one before the first attempt when it is missing.
    requestId: RequestId | None = None
    checkoutToken: Token
    merchantRefundReference: Annotated[Text, Field(min_length=1)]
    refundAmountCents: PositiveCents
    refundDescription: Annotated[str, Strict(), Field(max_length=1000)] = ""


class RefundResponse(WireModel):
    """The refund answer, ``refundStatusAt`` written with microseconds. ``requestId`` echoes the request's
    (the spec's common fields; a real integration requires it) and is read when absent too: the gateway's
    documented examples print none (docs/decisions.md)."""

    requestId: str | None = None
    refundedAmountCents: Cents
    refundStatus: str
    refundStatusAt: PreciseTimestamp | None = None
    refundStatusDescription: str | None = None


class _Limits(WireModel):
    @model_validator(mode="after")
    def _minimum_not_above_maximum(self) -> _Limits:
        low = getattr(self, "minimumCheckoutAmountCents", None)
        high = getattr(self, "maximumCheckoutAmountCents", None)
        if low is not None and high is not None and low > high:
            raise ValueError("minimumCheckoutAmountCents must not be greater than maximumCheckoutAmountCents")
        return self


class InstallRequest(_Limits):
    merchantAccountId: Annotated[Text, Field(min_length=1)]
    merchantAccountApiKey: SecretText
    checkoutStatusCallbackUrl: AbsoluteUrl
    # One page of the gateway's docs spells it checkoutCallbackFailuresEmail: accept both, send the first.
    callbackFailuresEmail: EmailAddress | None = Field(
        default=None, validation_alias=AliasChoices("callbackFailuresEmail", "checkoutCallbackFailuresEmail")
    )
    minimumCheckoutAmountCents: Cents
    maximumCheckoutAmountCents: Cents


class InstallResponse(WireModel):
    secretSigningKey: SecretText


class SettingsUpdateRequest(_Limits):
    """PATCH body: any non-empty subset of the four settings (docs/decisions.md)."""

    checkoutStatusCallbackUrl: AbsoluteUrl | None = None
    callbackFailuresEmail: EmailAddress | None = Field(
        default=None, validation_alias=AliasChoices("callbackFailuresEmail", "checkoutCallbackFailuresEmail")
    )
    minimumCheckoutAmountCents: Cents | None = None
    maximumCheckoutAmountCents: Cents | None = None

    @model_validator(mode="after")
    def _not_empty(self) -> SettingsUpdateRequest:
        if not self.model_fields_set & set(type(self).model_fields):
            raise ValueError("send at least one of the four settings")
        return self


class SettingsResponse(WireModel):
    checkoutStatusCallbackUrl: str | None = None
    callbackFailuresEmail: str | None = None
    minimumCheckoutAmountCents: int | None = None
    maximumCheckoutAmountCents: int | None = None
    signingKey: SecretText


class FieldError(WireModel):
    field: str
    message: str


class ErrorBody(WireModel):
    """Every error answer: a ``message``, field errors on 400, ``expectedSignature`` on a sandbox 401."""

    message: str
    errors: list[FieldError] | None = None
    expectedSignature: str | None = None
