"""What ``celery -A tests.tasks.worker_app:celery worker`` (and ``beat``) load: the task tests' shop, built
from the environment the test gives the process, and its Celery app (``flask_gateway.tasks.celery_init_app``,
Flask's pattern).

``TASKS_LEASE_SECONDS`` shortens the outbox's lease (10 s in a shop; ``flask_gateway.payments.outbox.CLAIM_LEASE``,
read at each claim and renewal) in these processes only, so the tests wait less for a killed worker's event.
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from flask_gateway.payments import outbox
from flask_gateway.tasks import celery_init_app
from tests.tasks.shop_app import create_app

outbox.CLAIM_LEASE = timedelta(seconds=float(os.environ["TASKS_LEASE_SECONDS"]))

flask_app = create_app(
    database_url=os.environ["TASKS_DATABASE_URL"],
    emulator_url=os.environ["TASKS_EMULATOR_URL"],
    redis_url=os.environ["TASKS_REDIS_URL"],
    markers=Path(os.environ["TASKS_MARKERS"]),
    deliver_every=float(os.environ["TASKS_DELIVER_EVERY"]),
)
celery = celery_init_app(flask_app)
