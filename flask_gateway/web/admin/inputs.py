"""What the admin screens read from a request, kept within bounds: page numbers, row ids, validated amounts.

Also the checkout statuses in the order the screens list them (the status page's counts, the list's
filter). Imports nothing of the package.
"""

from __future__ import annotations

from typing import Final

from flask import request

from flask_gateway.core.wire import CheckoutStatus
from flask_gateway.models import LocalStatus
from flask_gateway.web.forms import AmountField

__all__ = ["MAX_ID", "MAX_PAGE", "PER_PAGE", "STATUSES"]

PER_PAGE: Final = 25
#: Page numbers past this are this (an offset the database cannot take would be a 500).
MAX_PAGE: Final = 100_000
#: Row ids are 32-bit integers on PostgreSQL: a larger one names no row (404, not a 500).
MAX_ID: Final = 2**31 - 1
#: Every status a checkout can have here, in the order the list's filter offers them.
STATUSES: Final = (
    *(s.value for s in CheckoutStatus),
    *(s.value for s in LocalStatus),
)


def _page() -> int:
    return min(max(request.args.get("page", 1, type=int) or 1, 1), MAX_PAGE)


def _cents(field: AmountField) -> int:
    """A validated amount field's cents (its validators made sure there is one)."""
    if not isinstance(field.data, int):
        raise TypeError(f"{field.name} was not validated")
    return field.data
