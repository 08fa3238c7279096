"""What a shop hands the extension at checkout time: its order, in plain dataclasses (money in cents)."""

from __future__ import annotations

from dataclasses import dataclass, field

from flask_gateway.errors import InvalidOrderError

__all__ = ["Address", "Customer", "OrderDraft", "OrderLine"]


@dataclass(frozen=True)
class OrderLine:
    """One line of the order: ``quantity`` times ``unit_price_cents`` (integer cents)."""

    name: str
    sku: str
    quantity: int
    unit_price_cents: int
    #: Absolute URLs; the extension falls back to the shop's public URL when they are empty.
    image_url: str = ""
    page_url: str = ""
    search_terms: tuple[str, ...] = ()
    category: str | None = None

    @property
    def total_cents(self) -> int:
        return self.quantity * self.unit_price_cents


@dataclass(frozen=True)
class Customer:
    """The shopper's details, sent to the gateway with the checkout."""

    first_name: str
    last_name: str
    email: str
    #: E.164 (``+27821234567``): the v1 flow requires it.
    phone: str = ""


@dataclass(frozen=True)
class Address:
    """A billing or shipping address."""

    line1: str
    city: str
    province: str
    postal_code: str
    line2: str = ""


@dataclass(frozen=True)
class OrderDraft:
    """The shop's order. ``total_cents`` defaults to the sum of the lines (add shipping yourself)."""

    reference: str
    lines: tuple[OrderLine, ...]
    customer: Customer | None = None
    billing_address: Address | None = None
    shipping_address: Address | None = None
    total_cents: int | None = None
    #: Opaque value echoed by the gateway (e.g. an analytics click id).
    click_trace_id: str | None = None
    extra: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.reference:
            raise InvalidOrderError("an order needs a reference")
        if not self.lines:
            raise InvalidOrderError("an order needs at least one line")
        for line in self.lines:
            if isinstance(line.quantity, bool) or not isinstance(line.quantity, int) or line.quantity < 1:
                raise InvalidOrderError(f"line {line.sku!r}: quantity must be a whole number >= 1")
            if isinstance(line.unit_price_cents, bool) or not isinstance(line.unit_price_cents, int):
                raise InvalidOrderError(f"line {line.sku!r}: unit_price_cents must be whole cents (an int)")
            if line.unit_price_cents < 0:
                raise InvalidOrderError(f"line {line.sku!r}: unit_price_cents must not be negative")
        if self.total_cents is not None and (
            isinstance(self.total_cents, bool)
            or not isinstance(self.total_cents, int)
            or self.total_cents < 1
        ):
            raise InvalidOrderError("total_cents must be whole cents (an int) above 0")

    @property
    def lines_total_cents(self) -> int:
        return sum(line.total_cents for line in self.lines)

    @property
    def amount_cents(self) -> int:
        """What the shopper pays: ``total_cents`` or, when not given, the lines' sum."""
        return self.total_cents if self.total_cents is not None else self.lines_total_cents
