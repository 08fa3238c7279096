"""The extension's blueprints: ``public`` (gateway-facing endpoints) and ``admin`` (screens)."""

from __future__ import annotations

from typing import TypeVar

from werkzeug.wrappers import Response

__all__ = ["deny_framing"]

R = TypeVar("R", bound=Response)


def deny_framing(response: R) -> R:
    """``X-Frame-Options: DENY`` and ``frame-ancestors 'none'`` (added to a policy the response already
    has, replacing any looser ``frame-ancestors``): no page of the extension is ever framed."""
    response.headers["X-Frame-Options"] = "DENY"
    policy = response.headers.get("Content-Security-Policy")
    if not policy:
        response.headers["Content-Security-Policy"] = "frame-ancestors 'none'"
    else:  # keep the app's policy, but these pages are never framed, by anyone
        directives = [d for d in policy.split(";") if not d.strip().lower().startswith("frame-ancestors")]
        response.headers["Content-Security-Policy"] = "; ".join(
            [d.strip() for d in directives if d.strip()] + ["frame-ancestors 'none'"]
        )
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    return response
