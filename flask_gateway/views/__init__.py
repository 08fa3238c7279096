"""The extension's blueprints: ``public`` (gateway-facing endpoints) and ``admin`` (screens)."""

from __future__ import annotations

from typing import Final, TypeVar

from werkzeug.wrappers import Response

from flask_gateway.core.framing import never_framed

__all__ = ["POLICY", "deny_framing"]

R = TypeVar("R", bound=Response)

#: The extension's own pages run no script at all, load everything from the app's origin, post forms
#: only there, and are never framed.
POLICY: Final = (
    "default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


def deny_framing(response: R) -> R:
    """A script-restricting ``Content-Security-Policy`` (:data:`POLICY`), ``X-Frame-Options: DENY``.

    A policy the response already has (the app's) is kept, with ``frame-ancestors 'none'`` replacing any
    looser one and ``script-src 'self'`` added when it restricts scripts nowhere: no page of the extension
    is ever framed, nor runs a script from another origin or an inline one."""
    never_framed(response.headers, policy=POLICY)
    return response
