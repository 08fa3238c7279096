"""Which URLs name a local host: ``localhost`` (and ``*.localhost``) or an IP literal.

The real gateway's firewall refuses redirect URLs on such hosts, and cannot reach callback URLs on them:
the emulator refuses them as the gateway does, the extension warns the owner before the gateway refuses.
"""

from __future__ import annotations

from ipaddress import ip_address
from typing import Literal
from urllib.parse import urlsplit

__all__ = ["is_local_host", "local_host_kind"]

LocalKind = Literal["localhost", "an IP address"]


def local_host_kind(url: str | None) -> LocalKind | None:
    """``"localhost"`` or ``"an IP address"`` when ``url``'s host is one, else None (also for no URL)."""
    try:
        host = (urlsplit(url or "").hostname or "").rstrip(".").lower()
    except ValueError:  # "https://shop.example[": not a URL at all; validation refuses it elsewhere
        return None
    if not host:
        return None
    if host == "localhost" or host.endswith(".localhost"):
        return "localhost"
    try:
        ip_address(host)
    except ValueError:
        return None
    return "an IP address"


def is_local_host(url: str | None) -> bool:
    """True for URLs on ``localhost``, ``*.localhost`` or an IP literal (what the real firewall refuses)."""
    return local_host_kind(url) is not None
