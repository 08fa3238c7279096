"""The shop's Celery app, for the worker and beat (docs/example-shop.md, "Deploying it")::

    celery -A example_shop.celery_app:celery worker
    celery -A example_shop.celery_app:celery beat

It is :func:`flask_gateway.tasks.celery_init_app` on the shop as the web workers build it (the same
environment): the gateway's ``deliver_outbox`` and ``reconcile`` tasks and their beat schedule, each task in
the shop's app context, the broker from ``SHOP_CELERY_BROKER_URL``.
"""

from __future__ import annotations

from typing import Any

from example_shop import create_app
from example_shop.config import ShopConfigError
from flask_gateway.tasks import celery_init_app

__all__ = ["app", "celery"]

app = create_app()
if not (app.config.get("CELERY") or {}).get("broker_url"):
    raise ShopConfigError(
        "The Celery worker and beat need SHOP_CELERY_BROKER_URL, the broker's URL (e.g. "
        "redis://localhost:6379/0), in the shop's environment (/etc/shop/environment)."
    )
celery: Any = celery_init_app(app)
