"""Types shared by every wire model: money, timestamps, statuses, URLs, secrets and JSON encoding."""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Mapping
from datetime import datetime
from decimal import Decimal, InvalidOperation
from enum import StrEnum
from typing import Annotated, Any, ClassVar, Final, Self
from urllib.parse import urlsplit

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PlainSerializer,
    SecretStr,
    Strict,
    WithJsonSchema,
)

from flask_gateway.core.timestamps import (
    format_timestamp,
    format_v1_timestamp,
    parse_timestamp,
    parse_v1_timestamp,
)
from flask_gateway.core.wire.names import OPERATOR, Role, WireNames

__all__ = [
    "CHANGEABLE_STATUSES",
    "EMAIL_PATTERN",
    "OPEN_STATUSES",
    "PAID_STATUSES",
    "PAYMENT_STATUSES",
    "REFUNDABLE_STATUSES",
    "TEXT_MAX_LENGTH",
    "AbsoluteUrl",
    "Cents",
    "CheckoutStatus",
    "EmailAddress",
    "PositiveCents",
    "PreciseTimestamp",
    "SecretText",
    "StatusValue",
    "Text",
    "Timestamp",
    "V1Amount",
    "V1Timestamp",
    "WireModel",
    "WireNamedModel",
    "dumps",
]


def dumps(data: Any) -> bytes:
    """Compact, ASCII-only JSON: the exact bytes we send and sign."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode("ascii")


class CheckoutStatus(StrEnum):
    """Values of ``checkoutPaymentStatus``: the spec's six, and three the real gateway uses that the spec
    does not list (``PENDING_PAYMENT``, ``FULLY_REFUNDED``, ``EXPIRED``; docs/decisions.md). A value not
    listed here is kept as text (``StatusValue``) and never counts as paid."""

    PENDING_ORDER = "PENDING_ORDER"
    #: The consumer is paying on the gateway (the application is under way): open, not paid.
    PENDING_PAYMENT = "PENDING_PAYMENT"
    CANCELLED_BY_CONSUMER = "CANCELLED_BY_CONSUMER"
    CANCELLED_BY_MERCHANT = "CANCELLED_BY_MERCHANT"
    PAID = "PAID"
    PAID_PENDING_CALLBACK = "PAID_PENDING_CALLBACK"
    PARTIALLY_REFUNDED = "PARTIALLY_REFUNDED"
    FULLY_REFUNDED = "FULLY_REFUNDED"
    EXPIRED = "EXPIRED"

    @property
    def is_paid(self) -> bool:
        """Money was taken (refunds included): the only statuses that prove a payment."""
        return self in PAID_STATUSES

    @property
    def is_open(self) -> bool:
        """The consumer may still pay (after an update, for a consumer cancellation)."""
        return self in OPEN_STATUSES

    @property
    def is_changeable(self) -> bool:
        """The merchant may update or cancel it (the gateway's documentation: PENDING_ORDER or
        CANCELLED_BY_CONSUMER only; a payment under way is not changed under the consumer)."""
        return self in CHANGEABLE_STATUSES


# Sets of statuses; a plain status string is found in them too (a StrEnum member equals its value).
#: The consumer may still pay.
OPEN_STATUSES: Final = frozenset(
    {CheckoutStatus.PENDING_ORDER, CheckoutStatus.PENDING_PAYMENT, CheckoutStatus.CANCELLED_BY_CONSUMER}
)
#: The merchant may update or cancel (the documented rule).
CHANGEABLE_STATUSES: Final = frozenset({CheckoutStatus.PENDING_ORDER, CheckoutStatus.CANCELLED_BY_CONSUMER})
#: The statuses that confirm a payment: the refund statuses also say money was taken, but then given back,
#: so a refund status seen before the payment was known never confirms it.
PAYMENT_STATUSES: Final = frozenset({CheckoutStatus.PAID, CheckoutStatus.PAID_PENDING_CALLBACK})
#: Money was taken (refunds included).
PAID_STATUSES: Final = frozenset(
    {
        CheckoutStatus.PAID,
        CheckoutStatus.PAID_PENDING_CALLBACK,
        CheckoutStatus.PARTIALLY_REFUNDED,
        CheckoutStatus.FULLY_REFUNDED,
    }
)
#: Money was taken and some of it is not yet given back: a refund may be asked for.
REFUNDABLE_STATUSES: Final = frozenset(
    {CheckoutStatus.PAID, CheckoutStatus.PAID_PENDING_CALLBACK, CheckoutStatus.PARTIALLY_REFUNDED}
)

#: A status as parsed from the wire: a known ``CheckoutStatus`` or, for a value this version does not
#: know yet, the plain string (kept, never a crash).
StatusValue = Annotated[CheckoutStatus | str, Field(union_mode="left_to_right")]

#: Money: a whole number of cents, never a float or a numeric string.
Cents = Annotated[int, Strict(), Field(ge=0, le=10**12)]
PositiveCents = Annotated[int, Strict(), Field(gt=0, le=10**12)]

#: Free text of bounded length (the spec shows no limits; docs/decisions.md gives ours).
TEXT_MAX_LENGTH: Final = 255
Text = Annotated[str, Strict(), Field(max_length=TEXT_MAX_LENGTH)]


#: ``\s`` of a str pattern is exactly ``str.isspace`` (every code point checked), without a Python call per
#: character.
_WHITESPACE: Final = re.compile(r"\s")


def _check_absolute_url(value: str) -> str:
    # urlsplit raises ValueError for a bad IPv6 literal, .port for a port that is not a number: both
    # are validation errors here, not a 500 later when the URL is used (a redirect's Location header).
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.port == 0:
        raise ValueError("must be an absolute http(s) URL such as https://shop.example/path")
    try:  # a host with an empty or over-long label ("https://."), which no redirect can carry (a 500)
        parts.hostname.encode("idna")
    except UnicodeError:
        raise ValueError("must have a valid host name") from None
    if _WHITESPACE.search(value) is not None:
        raise ValueError("must not contain whitespace")
    # Browsers read "\\" as "/" and drop control characters: "https://localhost\\@shop.example" is
    # shop.example to urlsplit (and so to the firewall) but localhost to the consumer's browser.
    if "\\" in value or any(unicodedata.category(ch) == "Cc" for ch in value):
        raise ValueError("must not contain a backslash or control characters")
    return value


AbsoluteUrl = Annotated[
    str,
    Strict(),
    Field(max_length=2048),
    AfterValidator(_check_absolute_url),
    WithJsonSchema({"type": "string", "format": "uri", "maxLength": 2048}),
]

#: What passes for an e-mail address: something, an @, a domain with a dot; no spaces.
EMAIL_PATTERN: Final = re.compile(r"[^@\s]+@[^@\s]+\.[^@\s]+\Z")


def _check_email(value: str) -> str:
    if EMAIL_PATTERN.match(value) is None:
        raise ValueError("must be an e-mail address such as owner@shop.example")
    return value


EmailAddress = Annotated[
    str,
    Strict(),
    Field(max_length=254),
    AfterValidator(_check_email),
    WithJsonSchema({"type": "string", "format": "email", "maxLength": 254}),
]


def _parse_timestamp(value: object) -> object:
    return parse_timestamp(value) if isinstance(value, str) else value


def _ts_schema(example: str) -> WithJsonSchema:
    return WithJsonSchema({"type": "string", "format": "date-time", "examples": [example]})


#: A v2 timestamp, written with millisecond precision (``2024-05-01T10:00:00.123Z``).
Timestamp = Annotated[
    datetime,
    BeforeValidator(_parse_timestamp),
    PlainSerializer(lambda v: format_timestamp(v, "ms"), return_type=str),
    _ts_schema("2024-05-01T10:00:00.123Z"),
]
#: A v2 timestamp written with microsecond precision, as the gateway writes ``paidAt``.
PreciseTimestamp = Annotated[
    datetime,
    BeforeValidator(_parse_timestamp),
    PlainSerializer(lambda v: format_timestamp(v, "us"), return_type=str),
    _ts_schema("2024-05-01T10:00:00.123456Z"),
]


def _parse_v1_timestamp(value: object) -> object:
    return parse_v1_timestamp(value) if isinstance(value, str) else value


#: A v1 timestamp, ``YYYY-MM-DD HH:MM:SS`` in UTC.
V1Timestamp = Annotated[
    datetime,
    BeforeValidator(_parse_v1_timestamp),
    PlainSerializer(format_v1_timestamp, return_type=str),
    WithJsonSchema({"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}$"}),
]


def _parse_v1_amount(value: object) -> object:
    """v1 amounts arrive as integers or numeric text ("1000", "1000.00"); only whole cents are money."""
    if isinstance(value, bool):
        raise ValueError("an amount must be a number of cents, not a boolean")
    if isinstance(value, str):
        try:
            number = Decimal(value.strip())
        except InvalidOperation:
            raise ValueError(f"not a numeric amount: {value!r}") from None
        if not number.is_finite() or number != number.to_integral_value():
            raise ValueError(f"not a whole number of cents: {value!r}")
        return int(number)
    if isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"not a whole number of cents: {value!r}")
        return int(value)
    return value


#: A v1 amount in cents as the gateway sends it: an integer or numeric text, parsed to ``int``.
V1Amount = Annotated[
    int,
    BeforeValidator(_parse_v1_amount),
    Field(ge=0),
    WithJsonSchema({"oneOf": [{"type": "integer"}, {"type": "string", "pattern": r"^\d+(\.0+)?$"}]}),
]

#: A secret (API key, signing key): masked in ``repr`` and ``str``, revealed only in the JSON we send.
SecretText = Annotated[
    SecretStr,
    PlainSerializer(lambda s: s.get_secret_value(), return_type=str, when_used="json"),
    WithJsonSchema({"type": "string", "writeOnly": True}),
]


class WireModel(BaseModel):
    """Base of every request and response body.

    Field names are the exact JSON names. Unknown fields are kept (``model_extra``) and written back,
    so a newer gateway never breaks parsing. ``None`` fields are left out when writing, except in
    models that set ``keep_nulls`` (the status payload always carries its 16 keys).

    Bodies that arrive over the wire are read with :meth:`from_wire` / :meth:`from_json`, which accept
    the JSON names only (never a Python attribute name that differs from them).
    """

    model_config = ConfigDict(extra="allow", populate_by_name=True, validate_assignment=False)

    #: Write ``null`` for ``None`` fields instead of leaving them out.
    keep_nulls: ClassVar[bool] = False

    def to_wire(self, names: WireNames = OPERATOR) -> dict[str, Any]:
        """The JSON-ready dict, with exact field names; ``names`` spells the operator-named fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=not self.keep_nulls)

    def to_json(self, names: WireNames = OPERATOR) -> bytes:
        """Compact ASCII JSON bytes, ready to sign and send."""
        return dumps(self.to_wire(names))

    @classmethod
    def from_wire(cls, data: Any) -> Self:
        """Validate parsed JSON; raises ``pydantic.ValidationError`` with field locations on bad input."""
        return cls.model_validate(data, by_alias=True, by_name=False)

    @classmethod
    def from_json(cls, data: bytes | str) -> Self:
        """Parse JSON text; raises ``pydantic.ValidationError`` with field locations on bad input."""
        return cls.model_validate_json(data, by_alias=True, by_name=False)


class WireNamedModel(WireModel):
    """A body with fields named after the operator (``core/wire/names.py``), all at its top level.

    ``renamed`` maps each such attribute to its role. The fields read every spelling (their
    ``validation_alias`` is ``names.accepted(role)``) and are written in the set ``to_wire`` is given.
    """

    renamed: ClassVar[Mapping[str, Role]] = {}

    def to_wire(self, names: WireNames = OPERATOR) -> dict[str, Any]:
        data = super().to_wire(names)
        renamed = self.renamed
        return {(names.name(renamed[key]) if key in renamed else key): value for key, value in data.items()}
