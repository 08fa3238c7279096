"""Flask-Gateway: a merchant-side integration of a hosted buy-now-pay-later checkout gateway.

``flask_gateway.core`` (signing, wire models, clients) has no Flask dependency; the Flask extension
(``Gateway``) and the gateway emulator (``flask_gateway.emulator``) are built on it. The extension's names
are loaded on first use, so importing the core never imports Flask.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flask_gateway._version import __version__
from flask_gateway.core import GatewayClient, V1Client
from flask_gateway.core.errors import GatewayError
from flask_gateway.core.wire import CHANGEABLE_STATUSES, OPEN_STATUSES, PAID_STATUSES, CheckoutStatus

if TYPE_CHECKING:
    from flask_gateway.extension import Gateway, NotInstalledError
    from flask_gateway.models import GatewayCheckout
    from flask_gateway.orders import Address, Customer, OrderDraft, OrderLine

__all__ = [
    "CHANGEABLE_STATUSES",
    "OPEN_STATUSES",
    "PAID_STATUSES",
    "Address",
    "CheckoutStatus",
    "Customer",
    "Gateway",
    "GatewayCheckout",
    "GatewayClient",
    "GatewayError",
    "NotInstalledError",
    "OrderDraft",
    "OrderLine",
    "V1Client",
    "__version__",
]

_LAZY = {
    "Gateway": "flask_gateway.extension",
    "NotInstalledError": "flask_gateway.extension",
    "GatewayCheckout": "flask_gateway.models",
    "Address": "flask_gateway.orders",
    "Customer": "flask_gateway.orders",
    "OrderDraft": "flask_gateway.orders",
    "OrderLine": "flask_gateway.orders",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'flask_gateway' has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(module), name)
