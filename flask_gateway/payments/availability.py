"""Is the payment option offered for a total? The merchant's installed minimum and maximum."""

from __future__ import annotations

from dataclasses import dataclass

from flask_gateway.state import get_state, leaves_no_transaction

__all__ = ["PaymentLimits", "is_available", "payment_limits"]


@leaves_no_transaction
def is_available(total_cents: int) -> bool:
    """True when the gateway is installed and ``total_cents`` is within the stored minimum and maximum."""
    if isinstance(total_cents, bool) or not isinstance(total_cents, int):
        return False
    installation = get_state().installation()
    if installation is None:
        return False
    return installation.minimum_cents <= total_cents <= installation.maximum_cents


@dataclass(frozen=True)
class PaymentLimits:
    """The merchant's installed limits: the payment option is offered for totals within them."""

    minimum_cents: int
    maximum_cents: int


@leaves_no_transaction
def payment_limits() -> PaymentLimits | None:
    """The installed minimum and maximum, or None when the gateway is not installed yet."""
    installation = get_state().installation()
    if installation is None:
        return None
    return PaymentLimits(minimum_cents=installation.minimum_cents, maximum_cents=installation.maximum_cents)
