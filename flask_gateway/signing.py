"""``sign`` and ``verify`` for request and callback bodies (implemented in the Flask-free core)."""

from flask_gateway.core.signing import canonicalize, sign, verify

__all__ = ["canonicalize", "sign", "verify"]
