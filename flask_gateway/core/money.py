"""Money as people read it: integer cents shown as ``R 1 234.00`` (spaces group thousands)."""

from __future__ import annotations

__all__ = ["format_money", "format_plain"]


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
