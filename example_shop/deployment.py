"""What a deployment switches on from the environment: ProxyFix behind proxies, and the metrics route.

- ``SHOP_TRUSTED_PROXIES=<n>`` (default 0): the app trusts the last ``n`` proxies' ``X-Forwarded-For``,
  ``-Proto`` and ``-Host`` (werkzeug's ``ProxyFix``), so ``request.is_secure``, ``request.remote_addr`` and
  ``url_for(..., _external=True)`` are the shopper's, not the proxy's. Never more than the proxies really
  in front: a client could otherwise claim any address (and dodge the login's per-address limits).
- ``SHOP_METRICS_TOKEN=<token>``: ``GET /metrics`` serves the gateway's figures
  (``flask_gateway.register_metrics``) in Prometheus' text format, to ``Authorization: Bearer <token>``
  only (401 otherwise). Without the token there is no such route (404).

Nothing here touches the database or the network: the figures are read from the database at each scrape.
"""

from __future__ import annotations

import hmac
from typing import Final

from flask import Flask, request
from werkzeug.middleware.proxy_fix import ProxyFix
from werkzeug.wrappers import Response

from example_shop.config import ShopConfigError

__all__ = ["METRICS_ENDPOINT", "install"]

#: The endpoint name of ``GET /metrics`` (the auto-install and the shop's page hooks leave it alone).
METRICS_ENDPOINT: Final = "shop_metrics"


def install(app: Flask) -> None:
    """ProxyFix and the metrics route, as ``SHOP_TRUSTED_PROXIES`` and ``SHOP_METRICS_TOKEN`` say."""
    hops = int(app.config.get("SHOP_TRUSTED_PROXIES") or 0)
    if hops > 0:
        app.wsgi_app = ProxyFix(app.wsgi_app, x_for=hops, x_proto=hops, x_host=hops)  # type: ignore[method-assign]
    token = app.config.get("SHOP_METRICS_TOKEN")
    if token:
        _metrics_route(app, str(token))


def _metrics_route(app: Flask, token: str) -> None:
    try:
        from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    except ImportError:
        raise ShopConfigError(
            "SHOP_METRICS_TOKEN is set, but the metrics need the prometheus_client package: install the "
            'metrics extra (pip install "flask-bnpl-gateway[metrics]"), or unset SHOP_METRICS_TOKEN.'
        ) from None
    from flask_gateway import register_metrics

    # A registry of this app's own: the gateway's figures and nothing else (several apps in one process,
    # as in the tests, would collide in prometheus_client's global one).
    registry = CollectorRegistry(auto_describe=True)
    register_metrics(app, registry)
    expected = f"Bearer {token}".encode()

    def metrics() -> Response:
        given = request.headers.get("Authorization", "").encode()
        if not hmac.compare_digest(given, expected):
            return Response(
                "Send the metrics token as 'Authorization: Bearer <SHOP_METRICS_TOKEN>'.\n",
                401,
                {"WWW-Authenticate": 'Bearer realm="metrics"', "Cache-Control": "no-store"},
                mimetype="text/plain",
            )
        return Response(
            generate_latest(registry), headers={"Cache-Control": "no-store"}, content_type=CONTENT_TYPE_LATEST
        )

    app.add_url_rule("/metrics", METRICS_ENDPOINT, metrics, methods=["GET"])
