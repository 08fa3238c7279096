"""Flask-Gateway: a merchant-side integration of a hosted buy-now-pay-later checkout gateway.

``flask_gateway.core`` (signing, wire models, clients) has no Flask dependency; the Flask extension and
the gateway emulator (``flask_gateway.emulator``) are built on it.
"""

from flask_gateway._version import __version__
from flask_gateway.core import GatewayClient, V1Client
from flask_gateway.core.errors import GatewayError
from flask_gateway.core.wire import CheckoutStatus

__all__ = ["CheckoutStatus", "GatewayClient", "GatewayError", "V1Client", "__version__"]
