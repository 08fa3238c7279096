"""URLs the extension hands out: the callback URL, signed return URLs (v2) and signed outcome URLs (v1).

Return and outcome URLs carry an itsdangerous signature of the checkout's id (keyed with the app's
``SECRET_KEY``), so a forged or edited URL is refused. The v1 outcome URL is only ever given to the
gateway, which alone can therefore complete it. A URL signed with an older key of ``SECRET_KEY_FALLBACKS``
is accepted for as long as that key is listed there (Flask 3.1's rotation, as for its sessions); new ones
are always signed with ``SECRET_KEY``.
"""

from __future__ import annotations

from typing import Any, Final, Literal
from urllib.parse import urlsplit

from flask import current_app, url_for
from itsdangerous import BadSignature, URLSafeSerializer

from flask_gateway.secrets import signing_keys
from flask_gateway.state import get_state

__all__ = [
    "ReturnKind",
    "callback_url",
    "external_url",
    "load_signed_reference",
    "return_url",
    "v1_outcome_url",
]

ReturnKind = Literal["confirm", "cancel", "v1-success", "v1-fail"]
_SALT: Final = "flask-gateway.reference"


def _serializer() -> URLSafeSerializer:
    # itsdangerous signs with the last key and verifies with every one: the older keys, then SECRET_KEY.
    keys: Any = signing_keys(current_app.config) or current_app.config["SECRET_KEY"]
    return URLSafeSerializer(keys, salt=_SALT)


def external_url(endpoint: str, **values: Any) -> str:
    """An absolute URL under ``GATEWAY_PUBLIC_URL`` (or the request's host when it is not set)."""
    public = get_state().config.public_url
    if public:
        # Built on the public address itself, so it works without a request too (create_checkout from a
        # job, reconciliation) and a path in GATEWAY_PUBLIC_URL is the script root, never doubled.
        parts = urlsplit(public)
        app = current_app._get_current_object()  # type: ignore[attr-defined]
        app.inject_url_defaults(endpoint, values)
        adapter = app.url_map.bind(parts.netloc, script_name=parts.path or "/", url_scheme=parts.scheme)
        return str(adapter.build(endpoint, values, force_external=True))
    return url_for(endpoint, _external=True, **values)


def callback_url() -> str:
    return external_url("gateway.callback")


def _sign(checkout_id: int, kind: ReturnKind) -> str:
    return str(_serializer().dumps({"c": checkout_id, "k": kind}))


def load_signed_reference(value: str, kind: ReturnKind) -> int | None:
    """The checkout id in a signed reference of ``kind``, or None when forged, edited or of another kind."""
    try:
        data = _serializer().loads(value)
    except BadSignature:
        return None
    if not isinstance(data, dict) or data.get("k") != kind or not isinstance(data.get("c"), int):
        return None
    return int(data["c"])


def return_url(checkout_id: int, kind: Literal["confirm", "cancel"]) -> str:
    """Where the gateway sends the consumer back (v2 ``confirmRedirectUrl`` / ``cancelRedirectUrl``)."""
    return external_url("gateway.return_page", kind=kind, ref=_sign(checkout_id, kind))


def v1_outcome_url(checkout_id: int, kind: Literal["v1-success", "v1-fail"]) -> str:
    """The v1 ``success_callback_url`` / ``fail_callback_url`` for one order."""
    endpoint = "gateway.v1_success" if kind == "v1-success" else "gateway.v1_fail"
    return external_url(endpoint, ref=_sign(checkout_id, kind))
