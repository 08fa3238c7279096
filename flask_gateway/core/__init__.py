"""The gateway core: signing, wire models, timestamps, errors and HTTP clients.

Nothing here imports Flask: the extension and the emulator both build on it, and it works on its own.
"""

from flask_gateway.core.auth import SignatureAuth
from flask_gateway.core.client import GatewayClient, V1Client, new_request_id
from flask_gateway.core.http import ApiResponse, RetryMode, RetryPolicy, Transport
from flask_gateway.core.signing import sign, verify

__all__ = [
    "ApiResponse",
    "GatewayClient",
    "RetryMode",
    "RetryPolicy",
    "SignatureAuth",
    "Transport",
    "V1Client",
    "new_request_id",
    "sign",
    "verify",
]
