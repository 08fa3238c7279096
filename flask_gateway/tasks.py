"""Celery tasks for outbox delivery and reconciliation: the documented path of
:mod:`flask_gateway.operations.tasks`, which holds them (``celery_init_app``, ``register_tasks``, ...)."""

from flask_gateway.operations.tasks import *  # noqa: F403
from flask_gateway.operations.tasks import __all__ as __all__
