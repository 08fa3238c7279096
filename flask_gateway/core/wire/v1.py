"""v1 request and response bodies (snake_case; configuration and checkout answers wrapped in ``data``).

Requests are read as leniently as the real gateway reads them (docs/decisions.md, "v1 leniency"): items
as an object keyed "1", "2", ... (the documented form, which we send) or as an array, postal codes and
merchant references as numbers or text, the mobile number as the shop stored it, extra keys kept.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Final, Literal

from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    PlainSerializer,
    PlainValidator,
    Strict,
    WithJsonSchema,
    model_validator,
)

from flask_gateway.core.timestamps import format_timestamp, parse_timestamp, parse_v1_timestamp
from flask_gateway.core.wire.common import (
    TEXT_MAX_LENGTH,
    AbsoluteUrl,
    Cents,
    EmailAddress,
    PositiveCents,
    Text,
    V1Amount,
    V1Timestamp,
    WireModel,
    WireNamedModel,
)
from flask_gateway.core.wire.names import Role, accepted

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
    "V1RefundErrorDetail",
    "V1RefundErrors",
    "V1RefundRefused",
    "V1RefundRequest",
    "V1RefundResult",
    "V1RefundSucceeded",
    "V1RefundType",
    "is_e164",
]

_E164: Final = re.compile(r"\+[1-9]\d{6,14}\Z")


def _check_e164(value: str) -> str:
    if _E164.match(value) is None:
        raise ValueError("must be an E.164 phone number such as +27821234567")
    return value


Required = Annotated[Text, Field(min_length=1)]


#: The largest whole number taken where text is expected (an id; it fits every database's integer).
LARGEST_NUMBER: Final = 10**18


def _text_or_number(what: str) -> Callable[[object], object]:
    """A validator for a value real clients send as text or as a whole number (one error, one path)."""

    def check(value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            if not 0 <= value <= LARGEST_NUMBER:
                raise ValueError(f"{what} as a number must be from 0 to {LARGEST_NUMBER}")
            return value
        if isinstance(value, str):
            if not value.strip():
                raise ValueError(f"{what} must not be empty")
            if len(value) > TEXT_MAX_LENGTH:
                raise ValueError(f"{what} must have at most {TEXT_MAX_LENGTH} characters")
            return value
        raise ValueError(f"{what} must be text or a whole number")

    return check


_TEXT_OR_NUMBER_SCHEMA: Final = WithJsonSchema(
    {
        "oneOf": [
            {"type": "string", "minLength": 1, "maxLength": 255},
            {"type": "integer", "minimum": 0, "maximum": 10**18},
        ]
    }
)
#: A merchant reference: text, or a number as real clients send an order or product id.
Reference = Annotated[str | int, PlainValidator(_text_or_number("a reference")), _TEXT_OR_NUMBER_SCHEMA]
#: E.164 (``+27821234567``) is what the documentation shows; the gateway reads any text ("string
#: required"), so a number as the shop stored it (``082 123 4567``) is accepted too.
MobileNumber = Annotated[str, Strict(), Field(min_length=1, max_length=32)]
#: E.164 only: what :func:`is_e164` checks, for senders that want to send the documented form.
E164Number = Annotated[str, Strict(), AfterValidator(_check_e164)]
#: The documentation's example is a number (``1611``); real clients send text (``"0181"``, ``"8001"``).
PostalCode = Annotated[str | int, PlainValidator(_text_or_number("a postal code")), _TEXT_OR_NUMBER_SCHEMA]


def is_e164(value: str) -> bool:
    """Whether ``value`` is an E.164 phone number such as ``+27821234567``."""
    return _E164.match(value) is not None


def _parse_refund_time(value: object) -> object:
    """The documented ISO 8601 (``2024-05-01T10:00:00.123456Z``) or the v1 ``YYYY-MM-DD HH:MM:SS``."""
    if not isinstance(value, str):
        return value
    try:
        return parse_timestamp(value)
    except ValueError:
        return parse_v1_timestamp(value)


#: ``refunded_at`` of the v1 refund answer: ISO 8601 in UTC with microseconds and ``Z`` (the gateway's
#: documentation); the v1 text form is read too.
V1RefundTimestamp = Annotated[
    datetime,
    BeforeValidator(_parse_refund_time),
    PlainSerializer(lambda v: format_timestamp(v, "us"), return_type=str),
    WithJsonSchema({"type": "string", "format": "date-time", "examples": ["2024-05-01T10:00:00.123456Z"]}),
]


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
    postal_code: PostalCode


class V1Customer(WireModel):
    first_name: Required
    last_name: Required
    email: EmailAddress
    mobile_number: MobileNumber
    address: V1Address


class V1Item(WireModel):
    merchant_reference: Reference
    quantity: Annotated[int, Strict(), Field(ge=1, le=100_000)]
    description: Required
    unit_price: Cents


def _items_as_object(value: object) -> object:
    """An array of items is read as the documented object, keyed "1", "2", ... in its order."""
    if isinstance(value, list):
        return {str(number): item for number, item in enumerate(value, start=1)}
    return value


#: The documented form is an object keyed "1", "2", ...; real clients also send an array, which is read
#: as that object (so an error in its first item is at ``order.items.1``).
V1Items = Annotated[
    dict[str, V1Item],
    BeforeValidator(_items_as_object),
    Field(max_length=500),
]


class V1Order(WireModel):
    amount: PositiveCents
    merchant_reference: Reference
    success_callback_url: AbsoluteUrl
    fail_callback_url: AbsoluteUrl
    expires_at: V1Timestamp | None = None
    items: V1Items = Field(default_factory=dict)

    @property
    def item_list(self) -> list[V1Item]:
        """The items in the order they came."""
        return list(self.items.values())

    @staticmethod
    def number_items(items: Iterable[V1Item]) -> dict[str, V1Item]:
        """Key a list of items the documented way: ``{"1": first, "2": second, ...}``."""
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


def _blank_is_none(value: object) -> object:
    return None if isinstance(value, str) and not value.strip() else value


class V1PaymentPlan(WireModel):
    """Three instalments: ``amount`` each, ``excess`` paid with the first, first due at ``due_at``.

    The documentation prints every member as an empty string (``"due_at": ""``): an empty value is read
    as not given (None), so such an answer parses and is then treated as no usable plan.
    """

    due_at: Annotated[V1Timestamp | None, BeforeValidator(_blank_is_none)] = None
    amount: Annotated[V1Amount | None, BeforeValidator(_blank_is_none)] = None
    excess: Annotated[V1Amount | None, BeforeValidator(_blank_is_none)] = 0


class V1Configuration(WireModel):
    minimum_amount: V1Amount | None = None
    maximum_amount: V1Amount | None = None
    payment_plan: V1PaymentPlan | None = None


class V1ConfigurationResponse(WireModel):
    data: V1Configuration


class V1RefundRequest(WireModel):
    merchant_reference: Reference
    token: Annotated[str, Strict(), Field(min_length=1, max_length=255)]
    type: V1RefundType
    amount: PositiveCents
    reason: Annotated[str, Strict(), Field(max_length=1000)] = ""


class V1RefundSucceeded(WireModel):
    """The answer to a v1 refund that went through: a bare object (not wrapped in ``data``)."""

    status: Literal["REFUNDED"] = "REFUNDED"
    reason: str
    refunded_at: V1RefundTimestamp
    amount_refunded: Annotated[int, Strict(), Field(ge=0)]


class V1RefundErrorDetail(WireModel):
    code: Literal[400] = 400
    message: str


class V1RefundErrors(WireModel):
    errors: V1RefundErrorDetail


class V1RefundRefused(WireModel):
    """The answer to a v1 refund the gateway refused (unknown order, wrong state, more than remains)."""

    status: Literal["FAILED"] = "FAILED"
    reason: V1RefundErrors

    @classmethod
    def because(cls, message: str) -> V1RefundRefused:
        return cls(reason=V1RefundErrors(errors=V1RefundErrorDetail(message=message)))


class V1RefundResult(WireModel):
    """``REFUNDED`` with the amount, or ``FAILED`` with ``reason.errors.message``.

    A bare object, as the gateway's documentation shows it (``refunded_at`` in ISO 8601 with
    microseconds); the form wrapped in ``data`` like the other v1 answers is read as well.
    """

    status: Literal["REFUNDED", "FAILED"] | str
    reason: Any = None
    refunded_at: V1RefundTimestamp | None = None
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


class V1MerchantAnswer(WireNamedModel):
    """What the merchant's success or fail URL answers: the gateway sends the consumer to ``return_url``.

    ``cancel_on_gateway`` (fail only; ``cancel_on_payjustnow`` on the wire, see ``core/wire/names.py``):
    omitted or true cancels the order on the gateway; false keeps it open so the consumer can try again.
    """

    renamed: ClassVar[Mapping[str, Role]] = {"cancel_on_gateway": "cancel_on_gateway"}

    token: Annotated[str, Strict(), Field(min_length=1)]
    return_url: AbsoluteUrl
    cancel_on_gateway: Annotated[bool, Strict()] | None = Field(
        default=None, validation_alias=accepted("cancel_on_gateway")
    )
