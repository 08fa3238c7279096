"""The shop for a WSGI server: ``gunicorn -c example_shop/gunicorn.conf.py example_shop.wsgi:app``.

``app`` is :func:`example_shop.create_app` with the configuration from the environment (``SHOP_*`` and
``GATEWAY_*``, docs/example-shop.md): building it touches neither the database nor the network, so a
worker that starts while the database restarts boots and serves once it answers.
"""

from __future__ import annotations

from example_shop import create_app

__all__ = ["app"]

app = create_app()
