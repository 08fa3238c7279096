"""v2 request and response bodies, with the exact JSON field names of the spec."""

from __future__ import annotations

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
)

__all__ = [
    "MAX_EXPIRY_MINUTES",
    "MIN_EXPIRY_MINUTES",
    "STATUS_PAYLOAD_KEYS",
    "Address",
    "CancelCheckoutRequest",
    "CheckoutResponse",
    "CheckoutStatusPayload",
    "CreateCheckoutRequest",
    "CreateService",
    "Customer",
    "ErrorBody",
    "FieldError",
    "GetStatusRequest",
    "InstallRequest",
    "InstallResponse",
    "OrderItem",
    "RefundRequest",
    "RefundResponse",
    "ServiceEcho",
    "SettingsResponse",
    "SettingsUpdateRequest",
    "UpdateCheckoutRequest",
    "UpdateService",
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
    name: Annotated[Text, Field(min_length=1)]
    sku: Annotated[Text, Field(min_length=1)]
    quantity: Quantity
    priceCents: Cents
    imageUrl: AbsoluteUrl
    pageUrl: AbsoluteUrl
    searchTerms: Annotated[list[Text], Field(max_length=50)]
    category: Text | None = None


class _ServiceBase(WireModel):
    """The order details every create and update carries (the spec's smallest request)."""

    merchantOrderReference: Annotated[Text, Field(min_length=1)]
    orderAmountCents: Cents
    orderItems: Annotated[list[OrderItem], Field(min_length=1, max_length=500)]
    confirmRedirectUrl: AbsoluteUrl
    cancelRedirectUrl: AbsoluteUrl
    customer: Customer | None = None
    billingAddress: Address | None = None
    shippingAddress: Address | None = None


class CreateService(_ServiceBase):
    """``service`` of a create request."""

    orderExpiryMinutes: (
        Annotated[int, Strict(), Field(ge=MIN_EXPIRY_MINUTES, le=MAX_EXPIRY_MINUTES)] | None
    ) = None


class UpdateService(_ServiceBase):
    """``service`` of an update request: the whole order again, optionally with a new ``expiresAt``."""

    expiresAt: Timestamp | None = None


class ServiceEcho(WireModel):
    """``service`` as the gateway echoes it in responses. Everything optional: the cancel echo is reduced."""

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


class CreateCheckoutRequest(WireModel):
    requestId: RequestId | None = None
    service: CreateService
    checkoutTotalCents: Cents
    clickTraceId: Text | None = None


class UpdateCheckoutRequest(WireModel):
    checkoutToken: Token
    service: UpdateService
    checkoutTotalCents: Cents
    clickTraceId: Text | None = None
    requestId: RequestId | None = None


class CancelCheckoutRequest(WireModel):
    checkoutToken: Token


class GetStatusRequest(WireModel):
    checkoutToken: Token


class CheckoutResponse(WireModel):
    """Answer to create, update and cancel."""

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
    service: ServiceEcho | None = None
    merchantAccountId: str | None = None


STATUS_PAYLOAD_KEYS: Final = (
    "requestId",
    "checkoutToken",
    "checkoutTotalCents",
    "paymentUrl",
    "checkoutPaymentStatus",
    "paidAt",
    "paymentReference",
    "merchantOrderReference",
    "serviceOrderReference",
    "clickTraceId",
    "createdAt",
    "updatedAt",
    "expiresAt",
    "cancelledAt",
    "lastCallbackAttemptedAt",
    "lastCallbackAttemptStatusMessage",
)


class CheckoutStatusPayload(WireModel):
    """The getstatus answer and the callback body: always exactly these 16 keys, ``null`` when unset."""

    keep_nulls: ClassVar[bool] = True

    requestId: str | None = None
    checkoutToken: str
    checkoutTotalCents: Cents
    paymentUrl: str | None = None
    checkoutPaymentStatus: StatusValue
    paidAt: PreciseTimestamp | None = None
    paymentReference: int | None = None
    merchantOrderReference: str | None = None
    serviceOrderReference: int | None = None
    clickTraceId: str | None = None
    createdAt: Timestamp | None = None
    updatedAt: Timestamp | None = None
    expiresAt: Timestamp | None = None
    cancelledAt: Timestamp | None = None
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
    requestId: str | None = None
    refundedAmountCents: Cents
    refundStatus: str
    refundStatusAt: Timestamp | None = None
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
