"""Times as a person reads them: a stored (UTC) time in a zone, in one format, with the zone's name.

The extension's screens, commands and e-mails (``flask_gateway.clock``, in ``GATEWAY_TIMEZONE``) and the
emulator's payment pages (in ``EMULATOR_TIMEZONE``) write times the same way: ``2026-12-01 21:12 SAST``,
and dates alone as ``2026-12-01``. What is stored and sent on the wire stays UTC
(``flask_gateway.core.timestamps``).
"""

from __future__ import annotations

import calendar
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

__all__ = ["add_months", "format_date", "format_time", "local_time"]


def local_time(value: datetime, tz: ZoneInfo) -> datetime:
    """``value`` in ``tz``; a naive ``value`` is UTC (the database's columns hold UTC without a zone)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(tz)


def format_time(value: datetime | None, tz: ZoneInfo, *, seconds: bool = True, empty: str = "-") -> str:
    """``2026-11-27 13:51:09 SAST``: the date, the time in ``tz`` and the zone's abbreviation (its offset,
    ``UTC+0330``, where the tz database has no abbreviation); ``empty`` for no time."""
    if value is None:
        return empty
    local = local_time(value, tz)
    abbreviation = local.tzname() or ""
    if not abbreviation or abbreviation[0] in "+-":
        abbreviation = local.strftime("UTC%z")
    return f"{local.strftime('%Y-%m-%d %H:%M:%S' if seconds else '%Y-%m-%d %H:%M')} {abbreviation}"


def format_date(value: datetime, tz: ZoneInfo) -> str:
    """``2026-12-01``: the day ``value`` falls on in ``tz``."""
    return local_time(value, tz).strftime("%Y-%m-%d")


def add_months(value: datetime, months: int) -> datetime:
    """The same day and time ``months`` later; the month's last day when it is shorter (31 January + 1
    month is 28 or 29 February)."""
    index = value.month - 1 + months
    year, month = value.year + index // 12, index % 12 + 1
    return value.replace(year=year, month=month, day=min(value.day, calendar.monthrange(year, month)[1]))
