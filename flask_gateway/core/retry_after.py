"""``Retry-After``: how long the gateway asks a client to wait before it tries again."""

from __future__ import annotations

from email.utils import parsedate_to_datetime

from flask_gateway.core.timestamps import utcnow

__all__ = ["parse_retry_after"]


def parse_retry_after(value: str | None) -> float | None:
    """Seconds to wait from a ``Retry-After`` header (delta-seconds or an HTTP date), or None."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        return None
    return max(0.0, (when - utcnow()).total_seconds())
