"""The one clock people read: stored times (UTC) shown in ``GATEWAY_TIMEZONE``, with the zone's name.

Every time an owner or a developer reads (the admin screens, the CLI, e-mails, the example shop) goes through
``format_time``; what is stored and sent on the wire stays UTC (``flask_gateway.core.timestamps``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from functools import lru_cache
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from flask_gateway.errors import ConfigurationError

__all__ = ["DEFAULT_ZONE", "format_time", "local_time", "zone"]

#: ``GATEWAY_TIMEZONE``'s default.
DEFAULT_ZONE: Final = "UTC"


@lru_cache(maxsize=32)
def zone(name: str) -> ZoneInfo:
    """The IANA zone ``name`` (``Africa/Johannesburg``, ``Europe/Amsterdam``, ``UTC``), or the
    ``ConfigurationError`` that says what to write instead."""
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ConfigurationError(
            f"GATEWAY_TIMEZONE={name!r}: an IANA time zone name such as 'Africa/Johannesburg' or 'UTC'."
        )
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ConfigurationError(
            f"GATEWAY_TIMEZONE={name!r} is not an IANA time zone name: write one such as "
            "'Africa/Johannesburg', 'Europe/Amsterdam' or 'UTC' (the names of the tz database)."
        ) from exc


def local_time(value: datetime, tz: ZoneInfo) -> datetime:
    """``value`` in ``tz``; a naive ``value`` is UTC (the database's columns hold UTC without a zone)."""
    if value.tzinfo is None:
        value = value.replace(tzinfo=UTC)
    return value.astimezone(tz)


def format_time(value: datetime | None, tz: ZoneInfo, *, seconds: bool = True, empty: str = "-") -> str:
    """``2026-11-27 13:51:09 SAST``: the date, the time in ``tz`` and the zone's abbreviation (its offset,
    ``+0330``, where the tz database has no abbreviation); ``empty`` for no time."""
    if value is None:
        return empty
    local = local_time(value, tz)
    abbreviation = local.tzname() or ""
    if not abbreviation or abbreviation[0] in "+-":
        abbreviation = local.strftime("UTC%z")
    return f"{local.strftime('%Y-%m-%d %H:%M:%S' if seconds else '%Y-%m-%d %H:%M')} {abbreviation}"
