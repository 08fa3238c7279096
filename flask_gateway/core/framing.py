"""The headers that keep a page from being framed, sniffed or leaking its URL: one rule for the extension's
pages and the emulator's (the hosted payment page above all).

Works on any mutable header mapping with ``get`` and ``setdefault`` (werkzeug's ``Headers`` among them):
nothing here imports a web framework.
"""

from __future__ import annotations

from typing import Final, Protocol

__all__ = ["FRAME_ANCESTORS_NONE", "HeaderMap", "never_framed"]

FRAME_ANCESTORS_NONE: Final = "frame-ancestors 'none'"


class HeaderMap(Protocol):
    def get(self, key: str, /) -> str | None: ...
    def __setitem__(self, key: str, value: str, /) -> None: ...
    def setdefault(self, key: str, default: str, /) -> str: ...


def never_framed(
    headers: HeaderMap, *, policy: str = FRAME_ANCESTORS_NONE, no_referrer: bool = False
) -> None:
    """``X-Frame-Options: DENY``, ``X-Content-Type-Options: nosniff`` and a ``Content-Security-Policy`` that
    forbids framing.

    Without a policy in ``headers``, ``policy`` is set. A policy already there (the app's) is kept, with
    ``frame-ancestors 'none'`` replacing any looser one and ``script-src 'self'`` added when it restricts
    scripts nowhere. ``no_referrer`` adds ``Referrer-Policy: no-referrer`` (pages whose URLs carry tokens)."""
    headers["X-Frame-Options"] = "DENY"
    existing = headers.get("Content-Security-Policy")
    if not existing:
        headers["Content-Security-Policy"] = policy
    else:
        directives = [
            d.strip()
            for d in existing.split(";")
            if d.strip() and not d.strip().lower().startswith("frame-ancestors")
        ]
        names = {d.split()[0].lower() for d in directives}
        if not names & {"script-src", "default-src"}:
            directives.append("script-src 'self'")
        headers["Content-Security-Policy"] = "; ".join([*directives, FRAME_ANCESTORS_NONE])
    headers.setdefault("X-Content-Type-Options", "nosniff")
    if no_referrer:
        headers.setdefault("Referrer-Policy", "no-referrer")
