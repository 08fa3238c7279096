"""The admin screens: one blueprint, ``gateway_admin``, registered at ``GATEWAY_URL_PREFIX + "/admin"``.

``blueprint`` makes it and guards every request (admin guard, CSRF, headers); ``access`` is the account each
view acts on (every view declares it) and the accounts the person may see; ``inputs`` and ``problems``
are what the screens share; ``accounts`` is the account switcher's choice and each account's retire and reopen
(several merchant accounts); one module per screen area (``status``, ``settings``, ``checkouts`` with
``orders``, ``callbacks``) adds its views; ``outbox`` is the nested ``outbox`` blueprint. Imports run one
way: access <- blueprint, inputs, problems, orders <- accounts <- the screens <- this ``__init__`` (outbox
imports only access and accounts). ``viewed_account`` tells the app's admin guard which merchant account a
request acts on.
"""

from __future__ import annotations

# Importing the screen modules registers their views on ``bp``.
from flask_gateway.web.admin import accounts, callbacks, checkouts, settings, status  # noqa: F401
from flask_gateway.web.admin import drift_banner as drift_banner  # the settings incidents' banner
from flask_gateway.web.admin.access import keep_declarations
from flask_gateway.web.admin.blueprint import bp, viewed_account

__all__ = ["bp", "viewed_account"]

# After every view is on ``bp``: each app reads their account declarations when it registers the blueprint.
keep_declarations(bp)
