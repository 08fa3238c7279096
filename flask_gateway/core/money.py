"""Money as people read and type it: integer cents shown as ``R 1 234.00`` (spaces group thousands), and
read back from what a person types (``parse_amount``: ``Decimal``, never a float)."""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Final

__all__ = ["MAX_CENTS", "format_money", "format_plain", "parse_amount"]

#: The largest amount the gateway accepts (docs/decisions.md: amounts 0 to 10^12 cents).
MAX_CENTS: Final = 10**12
_SEPARATORS: Final = dict.fromkeys(map(ord, " \t\u00a0\u2009\u202f_"), None)
_AMOUNT: Final = re.compile(r"([0-9]*)(?:\.([0-9]*))?")


def format_money(cents: int | None, symbol: str = "R") -> str:
    """``123400`` -> ``"R 1 234.00"``; ``symbol=""`` -> ``"1 234.00"``; None -> ``"-"``."""
    if cents is None:
        return "-"
    sign = "-" if cents < 0 else ""
    whole, part = divmod(abs(int(cents)), 100)
    grouped = f"{whole:,}".replace(",", " ")
    return f"{sign}{symbol} {grouped}.{part:02d}" if symbol else f"{sign}{grouped}.{part:02d}"


def format_plain(cents: int) -> str:
    """``123450`` -> ``"1234.50"``: for form inputs (no symbol, no grouping)."""
    sign = "-" if cents < 0 else ""
    whole, part = divmod(abs(int(cents)), 100)
    return f"{sign}{whole}.{part:02d}"


def parse_amount(text: str, *, symbol: str = "") -> int:
    """Whole cents from an amount in the major unit: ``"1234.5"``, ``"1 234.50"``, ``"R 1 234.50"``.

    Raises ``ValueError`` with a message for the owner when the text is not an exact, non-negative amount.
    """
    value = text.strip()
    if symbol and value.startswith(symbol):
        value = value[len(symbol) :]
    value = value.translate(_SEPARATORS)
    if value.startswith("-"):
        raise ValueError("The amount must not be negative.")
    if "," in value:
        raise ValueError("Use '.' before the cents (1234.50); leave out thousands separators or use spaces.")
    match = _AMOUNT.fullmatch(value)
    if match is None or not (match.group(1) or match.group(2)):
        raise ValueError("Enter an amount such as 1234.50 (digits, with '.' before the cents).")
    if len(match.group(2) or "") > 2:
        raise ValueError("Use at most 2 decimals: amounts are in whole cents.")
    cents = int(Decimal(value) * 100)
    if cents > MAX_CENTS:
        raise ValueError(f"The amount must not exceed {format_plain(MAX_CENTS)}.")
    return cents
