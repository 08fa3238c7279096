"""Is the payment option offered for a total? The chosen merchant account's installed minimum and maximum."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from flask_gateway.errors import CheckoutUnavailableError, NotInstalledError, UnknownAccountError
from flask_gateway.models import Installation
from flask_gateway.payments.accounts import choose_account
from flask_gateway.state import leaves_no_transaction

__all__ = ["PaymentLimits", "is_available", "offers", "payment_limits"]


def _open_account(account: str | None, draft: Any) -> Installation | None:
    """The account a new checkout would use (``accounts.choose_account``), or None when there is none
    open: not installed, an unknown or retired account (the option is then not offered)."""
    try:
        return choose_account(draft, account)
    except (CheckoutUnavailableError, NotInstalledError, UnknownAccountError):
        return None


@leaves_no_transaction
def is_available(total_cents: int, *, account: str | None = None, draft: Any = None) -> bool:
    """True when ``total_cents`` is within the minimum and maximum of the account a new checkout would
    use (``account``, else the shop's resolver given ``draft``, else the default account); False when that
    account is not installed or retired."""
    if not _whole_cents(total_cents):
        return False
    installation = _open_account(account, draft)
    return installation is not None and offers(installation, total_cents)


def offers(installation: Installation, total_cents: int) -> bool:
    """True when ``total_cents`` (whole cents) is within ``installation``'s minimum and maximum."""
    return (
        _whole_cents(total_cents) and installation.minimum_cents <= total_cents <= installation.maximum_cents
    )


def _whole_cents(total_cents: object) -> bool:
    return isinstance(total_cents, int) and not isinstance(total_cents, bool)


@dataclass(frozen=True)
class PaymentLimits:
    """The merchant's installed limits: the payment option is offered for totals within them."""

    minimum_cents: int
    maximum_cents: int


@leaves_no_transaction
def payment_limits(*, account: str | None = None, draft: Any = None) -> PaymentLimits | None:
    """The minimum and maximum of the account a new checkout would use (chosen as :func:`is_available`
    chooses), or None when there is no open account."""
    installation = _open_account(account, draft)
    if installation is None:
        return None
    return PaymentLimits(minimum_cents=installation.minimum_cents, maximum_cents=installation.maximum_cents)
