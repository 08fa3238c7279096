"""The one clock people read: stored times (UTC) shown in ``GATEWAY_TIMEZONE``, with the zone's name.

Every time an owner or a developer reads (the admin screens, the CLI, e-mails, the example shop) goes through
``format_time`` (``flask_gateway.core.local_time``, which the emulator's payment pages use too); what is
stored and sent on the wire stays UTC (``flask_gateway.core.timestamps``).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from flask_gateway.core.local_time import format_time, local_time
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
