"""The admin screens: one blueprint, ``gateway_admin``, registered at ``GATEWAY_URL_PREFIX + "/admin"``.

``blueprint`` makes it and guards every request (admin guard, CSRF, headers); ``inputs`` and ``problems``
are what the screens share; one module per screen area (``status``, ``settings``, ``checkouts`` with
``orders``, ``callbacks``) adds its views; ``outbox`` is the nested ``outbox`` blueprint. Imports run one
way: blueprint, inputs, problems, orders <- the screens <- this ``__init__`` (outbox imports none of them).
"""

from __future__ import annotations

# Importing the screen modules registers their views on ``bp``.
from flask_gateway.web.admin import callbacks, checkouts, settings, status  # noqa: F401
from flask_gateway.web.admin.blueprint import bp

__all__ = ["bp"]
