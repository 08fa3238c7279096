"""Timestamps as the gateway writes them.

v2: ISO 8601 in UTC with a trailing ``Z``; fractional seconds absent, milliseconds or microseconds.
v1: ``YYYY-MM-DD HH:MM:SS`` text, in UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from typing import Final, Literal

__all__ = [
    "Precision",
    "format_timestamp",
    "format_v1_timestamp",
    "parse_timestamp",
    "parse_v1_timestamp",
    "utcnow",
]

Precision = Literal["s", "ms", "us"]

_ISO: Final = re.compile(
    r"(?P<date>\d{4}-\d{2}-\d{2})[Tt](?P<time>\d{2}:\d{2}:\d{2})"
    r"(?:\.(?P<fraction>\d{1,9}))?"
    r"(?P<zone>[Zz]|[+-]\d{2}:?\d{2})\Z"
)
_V1: Final = re.compile(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\Z")
_V1_FORMAT: Final = "%Y-%m-%d %H:%M:%S"


def utcnow() -> datetime:
    """The current time, timezone-aware in UTC."""
    return datetime.now(UTC)


def parse_timestamp(value: str) -> datetime:
    """Parse a v2 timestamp into an aware UTC datetime.

    Accepts a ``Z`` or a numeric offset, with 0-9 fractional digits (nanoseconds are truncated to
    microseconds). A value without a zone is refused: the gateway always sends one, and guessing the
    zone of a payment time is how money goes missing.
    """
    if not isinstance(value, str):
        raise TypeError(f"expected an ISO 8601 timestamp string, got {type(value).__name__}")
    match = _ISO.match(value.strip())
    if match is None:
        raise ValueError(f"not an ISO 8601 UTC timestamp like 2024-05-01T10:00:00.123Z: {value!r}")
    fraction = (match["fraction"] or "").ljust(6, "0")[:6]
    zone = match["zone"]
    if zone in ("Z", "z"):
        tz: timezone = UTC
    else:
        sign = -1 if zone[0] == "-" else 1
        digits = zone[1:].replace(":", "")
        tz = timezone(sign * timedelta(hours=int(digits[:2]), minutes=int(digits[2:])))
    naive = datetime.fromisoformat(f"{match['date']}T{match['time']}.{fraction}")
    try:
        return naive.replace(tzinfo=tz).astimezone(UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        raise ValueError(f"timestamp out of range in UTC: {value!r}") from None


def format_timestamp(value: datetime, precision: Precision = "ms") -> str:
    """Format an aware datetime as the gateway does: UTC, trailing ``Z``, at ``precision``."""
    if value.tzinfo is None:
        raise ValueError("refusing to format a naive datetime: attach tzinfo=UTC first")
    utc = value.astimezone(UTC)
    base = _date_time(utc, "T")
    if precision == "s":
        return f"{base}Z"
    if precision == "ms":
        return f"{base}.{utc.microsecond // 1000:03d}Z"
    return f"{base}.{utc.microsecond:06d}Z"


def parse_v1_timestamp(value: str) -> datetime:
    """Parse a v1 ``YYYY-MM-DD HH:MM:SS`` timestamp (UTC) into an aware datetime."""
    if not isinstance(value, str) or _V1.match(value) is None:
        raise ValueError(f"not a v1 timestamp like 2024-05-01 10:00:00: {value!r}")
    return datetime.strptime(value, _V1_FORMAT).replace(tzinfo=UTC)


def format_v1_timestamp(value: datetime) -> str:
    """Format an aware datetime as a v1 timestamp (UTC, whole seconds)."""
    if value.tzinfo is None:
        raise ValueError("refusing to format a naive datetime: attach tzinfo=UTC first")
    return _date_time(value.astimezone(UTC), " ")


def _date_time(utc: datetime, separator: str) -> str:
    # strftime("%Y") does not pad years below 1000 on every platform.
    return (
        f"{utc.year:04d}-{utc.month:02d}-{utc.day:02d}{separator}"
        f"{utc.hour:02d}:{utc.minute:02d}:{utc.second:02d}"
    )
