"""What the owner should fix in this shop's setup, each warning true in the environment at hand.

Local checks only (configuration and the stored installation; no request to the gateway):

========================  =============================================================================
``firewall``              the shop's public address is on localhost or an IP address, and the configured
                          gateway's firewall refuses such redirect URLs (``GATEWAY_WAF="strict"``: the
                          sandbox, production, and the emulator unless started with
                          ``EMULATOR_WAF=allow-local``): every checkout would be refused
``unreachable-callback``  the callback URL is on localhost or an IP address while the gateway is not on
                          this machine: its callbacks cannot arrive, only polling confirms payments
``callback-mismatch``     the gateway was given a callback URL that is not this shop's callback URL
                          (``GATEWAY_PUBLIC_URL`` + the callback route, or the account's own path
                          ``.../callback/<account>``): its callbacks go elsewhere
``insecure-callback``     production, and the callback URL is plain ``http://``: the payment statuses
                          would cross the internet unencrypted; use an https address
========================  =============================================================================

The admin screens show them (status, install and settings), ``flask gateway install`` prints the same
(:func:`install_warnings`, with the same words as the install screen); a shop can show them on its own
pages with :func:`setup_warnings`. With several merchant accounts each has its callback URL:
``setup_warnings(account=...)`` checks that account's (default: the default account's), and the doctor
checks every account's.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from flask import has_request_context, request

from flask_gateway.core.hosts import local_host_kind
from flask_gateway.state import get_state, leaves_no_transaction
from flask_gateway.urls import callback_url, external_url

__all__ = ["SetupWarning", "install_warnings", "local_kind", "setup_warnings"]

WarningKind = Literal["firewall", "unreachable-callback", "callback-mismatch", "insecure-callback"]


@dataclass(frozen=True)
class SetupWarning:
    """One thing the owner should fix in this shop's setup (:func:`setup_warnings`)."""

    kind: WarningKind
    #: The address the warning is about (the public URL, or the callback URL the gateway has or will get).
    url: str
    #: ``firewall`` and ``unreachable-callback``: "localhost" or "an IP address"; ``callback-mismatch``:
    #: this shop's own callback URL; ``insecure-callback``: this shop's https callback URL ("" if unknown).
    detail: str
    #: ``firewall``: whether the address comes from ``GATEWAY_PUBLIC_URL`` (else from the request).
    configured: bool = True
    #: The merchant account whose callback URL it is about, when the caller named one (None: the default
    #: account's, or not about a callback URL).
    account: str | None = None

    @property
    def summary(self) -> str:
        """One sentence for a notice elsewhere (a shop's dashboard)."""
        if self.kind == "firewall":
            return f"The shop's address {self.url} is on {self.detail}: the gateway refuses such addresses."
        if self.kind == "unreachable-callback":
            return f"The callback URL {self.url} is on {self.detail}: the gateway cannot reach it."
        if self.kind == "insecure-callback":
            return f"The callback URL {self.url} is plain http: in production the callbacks must use https."
        return f"The gateway sends its callbacks to {self.url}, but this shop receives them at {self.detail}."

    @property
    def advice(self) -> str:
        """What to do, for a terminal (the screens say the same with their own links)."""
        if self.kind == "firewall":
            return (
                "Set GATEWAY_PUBLIC_URL to the shop's real address (https://shop.example); while developing, "
                "a tunnel gives you one, or an emulator started with EMULATOR_WAF=allow-local "
                '(GATEWAY_WAF = "allow-local").'
            )
        if self.kind == "unreachable-callback":
            return (
                "Set GATEWAY_PUBLIC_URL to the shop's public address and give the gateway its callback URL."
            )
        if self.kind == "insecure-callback":
            return f"Use an https address{f' ({self.detail})' if self.detail else ''}."
        return f"Use the callback URL {self.detail}."


def local_kind(url: str | None) -> str | None:
    """``"localhost"`` or ``"an IP address"`` when ``url``'s host is one, else None."""
    return local_host_kind(url)


def _gateway_is_local() -> bool:
    """The gateway runs on this machine or network (the emulator): it can reach a local callback URL."""
    config = get_state().config
    return config.environment == "embedded" or local_kind(config.base_url) is not None


@leaves_no_transaction
def setup_warnings(callback: str | None = None, *, account: str | None = None) -> list[SetupWarning]:
    """The warnings for this shop's setup; ``callback``: the callback URL about to be sent (a form), else
    the installed one of ``account`` (default: the default account). ``UnknownAccountError`` for an
    account that is not installed."""
    state = get_state()
    config = state.config
    warnings: list[SetupWarning] = []
    public = config.public_url or (request.host_url.rstrip("/") if has_request_context() else None)
    kind = local_kind(public)
    if public and kind and config.waf == "strict":
        warnings.append(SetupWarning("firewall", public, kind, configured=bool(config.public_url)))
    installation = state.installation() if account is None else state.require_installation(account)
    if callback is None and installation is not None:
        callback = installation.callback_url
    if not callback:
        return warnings
    if config.environment == "production" and urlsplit(callback).scheme.lower() != "https":
        ours_secure = external_url("gateway.callback") if config.public_url else ""
        warnings.append(SetupWarning("insecure-callback", callback, ours_secure, account=account))
    kind = local_kind(callback)
    if kind and not _gateway_is_local():
        warnings.append(SetupWarning("unreachable-callback", callback, kind, account=account))
    if config.public_url or has_request_context():
        ours = callback_url()
        own = (
            external_url("gateway.callback", account=installation.merchant_account_id)
            if installation is not None
            else None
        )
        if callback.rstrip("/") not in {ours.rstrip("/"), (own or ours).rstrip("/")}:
            warnings.append(SetupWarning("callback-mismatch", callback, ours, account=account))
    return warnings


def install_warnings(callback: str, account: str) -> list[SetupWarning]:
    """The warnings for installing ``account`` with ``callback`` (the install screen's and ``flask gateway
    install``'s): :func:`setup_warnings` for that URL, where the account's own callback path
    (``.../callback/<account>``) is this shop's too."""
    own = external_url("gateway.callback", account=account).rstrip("/") if account else None
    return [
        warning
        for warning in setup_warnings(callback)
        if not (warning.kind == "callback-mismatch" and own is not None and warning.url.rstrip("/") == own)
    ]
