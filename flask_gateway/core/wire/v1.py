"""v1 request and response bodies (snake_case, everything wrapped in ``data``, items keyed "1", "2", ...)."""

from __future__ import annotations

import re
from collections.abc import Iterable
from enum import StrEnum
from typing import Annotated, Any, Final, Literal

from pydantic import AfterValidator, Field, Strict, model_validator

from flask_gateway.core.wire.common import (
    AbsoluteUrl,
    Cents,
    EmailAddress,
    PositiveCents,
    Text,
    V1Amount,
    V1Timestamp,
    WireModel,
)

__all__ = [
    "V1Address",
    "V1CheckoutData",
    "V1CheckoutRequest",
    "V1CheckoutResponse",
    "V1Configuration",
    "V1ConfigurationCustomer",
    "V1ConfigurationRequest",
    "V1ConfigurationResponse",
    "V1Customer",
    "V1FailReason",
    "V1Item",
    "V1MerchantAnswer",
    "V1Order",
    "V1OutcomeStatus",
    "V1PaymentPlan",
    "V1RefundRequest",
    "V1RefundResult",
    "V1RefundType",
]

_E164: Final = re.compile(r"\+[1-9]\d{6,14}\Z")


def _check_e164(value: str) -> str:
    if _E164.match(value) is None:
        raise ValueError("must be an E.164 phone number such as +27821234567")
    return value


Required = Annotated[Text, Field(min_length=1)]
MobileNumber = Annotated[str, Strict(), AfterValidator(_check_e164)]


class V1OutcomeStatus(StrEnum):
    """``status`` in the query string the gateway sends to the merchant's success or fail URL."""

    SUCCESS = "SUCCESS"
    FAIL = "FAIL"


class V1FailReason(StrEnum):
    """``reason`` on the fail URL: the consumer cancelled, or the order expired."""

    CANCELLED = "CANCELLED"
    ABANDONED = "ABANDONED"


class V1RefundType(StrEnum):
    FULL = "full"
    PARTIAL = "partial"


class V1Address(WireModel):
    address_line_1: Required
    address_line_2: Text | None = None
    city: Required
    province: Required
    postal_code: Annotated[int, Strict(), Field(ge=0)]


class V1Customer(WireModel):
    first_name: Required
    last_name: Required
    email: EmailAddress
    mobile_number: MobileNumber
    address: V1Address


class V1Item(WireModel):
    merchant_reference: Required
    quantity: Annotated[int, Strict(), Field(ge=1, le=100_000)]
    description: Required
    unit_price: Cents


class V1Order(WireModel):
    amount: PositiveCents
    merchant_reference: Required
    success_callback_url: AbsoluteUrl
    fail_callback_url: AbsoluteUrl
    expires_at: V1Timestamp | None = None
    items: Annotated[dict[str, V1Item], Field(max_length=500)] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _items_keyed_by_index(self) -> V1Order:
        expected = [str(n) for n in range(1, len(self.items) + 1)]
        if sorted(self.items, key=lambda k: (len(k), k)) != expected:
            raise ValueError('items must be an object keyed "1", "2", ... in order, without gaps')
        return self

    @staticmethod
    def number_items(items: Iterable[V1Item]) -> dict[str, V1Item]:
        """Key a list of items the v1 way: ``{"1": first, "2": second, ...}``."""
        return {str(n): item for n, item in enumerate(items, start=1)}


class V1CheckoutRequest(WireModel):
    customer: V1Customer
    order: V1Order


class V1CheckoutData(WireModel):
    token: str
    expires_at: V1Timestamp
    redirect_to: str


class V1CheckoutResponse(WireModel):
    data: V1CheckoutData


class V1ConfigurationCustomer(WireModel):
    email: EmailAddress | None = None


class V1ConfigurationRequest(WireModel):
    amount: Cents | None = None
    customer: V1ConfigurationCustomer | None = None


class V1PaymentPlan(WireModel):
    """Three instalments: ``amount`` each, ``excess`` paid with the first, first due at ``due_at``."""

    due_at: V1Timestamp
    amount: V1Amount
    excess: V1Amount = 0


class V1Configuration(WireModel):
    minimum_amount: V1Amount | None = None
    maximum_amount: V1Amount | None = None
    payment_plan: V1PaymentPlan | None = None


class V1ConfigurationResponse(WireModel):
    data: V1Configuration


class V1RefundRequest(WireModel):
    merchant_reference: Required
    token: Annotated[str, Strict(), Field(min_length=1, max_length=255)]
    type: V1RefundType
    amount: PositiveCents
    reason: Annotated[str, Strict(), Field(max_length=1000)] = ""


class V1RefundResult(WireModel):
    """``REFUNDED`` with the amount, or ``FAILED`` with ``reason.errors.message``.

    The gateway wraps v1 answers in ``data``; a bare object is accepted as well.
    """

    status: Literal["REFUNDED", "FAILED"] | str
    reason: Any = None
    refunded_at: V1Timestamp | None = None
    amount_refunded: V1Amount | None = None

    @model_validator(mode="before")
    @classmethod
    def _unwrap(cls, value: Any) -> Any:
        if isinstance(value, dict) and "status" not in value and isinstance(value.get("data"), dict):
            return value["data"]
        return value

    @property
    def failure_message(self) -> str | None:
        """The refusal's message (``reason.errors.message``), or None for a refund that succeeded."""
        if self.status == "REFUNDED":
            return None
        reason = self.reason
        if isinstance(reason, dict):
            errors = reason.get("errors")
            if isinstance(errors, dict) and isinstance(errors.get("message"), str):
                return str(errors["message"])
        return reason if isinstance(reason, str) and reason else "refund refused"


class V1MerchantAnswer(WireModel):
    """What the merchant's success or fail URL answers: the gateway sends the consumer to ``return_url``.

    ``cancel_on_service`` (fail only): omitted or true cancels the order on the gateway; false keeps it
    open so the consumer can try again.
    """

    token: Annotated[str, Strict(), Field(min_length=1)]
    return_url: AbsoluteUrl
    cancel_on_service: Annotated[bool, Strict()] | None = None
