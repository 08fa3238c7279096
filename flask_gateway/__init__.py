"""Flask-Gateway: a merchant-side integration of a hosted buy-now-pay-later checkout gateway.

The front door: everything a shop uses is importable from here (``from flask_gateway import Gateway,
OrderDraft, start_checkout, payment_confirmed``). The layers behind it (docs/architecture.md):

- ``flask_gateway.core``: signing, wire models, timestamps, errors and the HTTP clients; no Flask.
- the extension (``Gateway``): its state, services (checkouts, refunds, polling, reconciliation, the
  callback endpoint...), views and CLI.
- ``flask_gateway.emulator``: the gateway emulator, built on the core.

The names and the module of each are listed once, in ``__init__.pyi`` (what type checkers read). Each is
loaded on first use, so that importing this package for a client or a signature never imports Flask or
SQLAlchemy.
"""

from __future__ import annotations

import lazy_loader

__getattr__, __dir__, __all__ = lazy_loader.attach_stub(__name__, __file__)
