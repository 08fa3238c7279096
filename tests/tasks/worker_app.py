"""What ``celery -A tests.tasks.worker_app:celery worker`` (and ``beat``) load: the task tests' shop, built
from the environment the test gives the process, and its Celery app (``flask_gateway.tasks.celery_init_app``,
Flask's pattern).

``TASKS_LEASE_SECONDS`` sets the outbox's lease in these processes (10 s in a shop:
``flask_gateway.payments.outbox.CLAIM_LEASE``, read at each claim and renewal). ``TASKS_CLOCK``, when
given, names the file of the clock the outbox goes by here (``tests.tasks.shop_app.SharedClock``, in place
of its ``utcnow`` and ``monotonic``): the lease is counted on the test's clock, so it runs out when the
test moves that clock past its end; in real time the lease only says how often the heartbeat looks at the
clock (every third of it).
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

from flask_gateway.payments import outbox
from flask_gateway.tasks import celery_init_app
from tests.tasks.shop_app import SharedClock, create_app

outbox.CLAIM_LEASE = timedelta(seconds=float(os.environ["TASKS_LEASE_SECONDS"]))
if "TASKS_CLOCK" in os.environ:  # without it (benchmarks/figure_takeover.py): real time, as in a shop
    clock = SharedClock(Path(os.environ["TASKS_CLOCK"]))
    vars(outbox).update(utcnow=clock.now, monotonic=clock.monotonic)  # the names it reads the time by

flask_app = create_app(
    database_url=os.environ["TASKS_DATABASE_URL"],
    emulator_url=os.environ["TASKS_EMULATOR_URL"],
    redis_url=os.environ["TASKS_REDIS_URL"],
    markers=Path(os.environ["TASKS_MARKERS"]),
    deliver_every=float(os.environ["TASKS_DELIVER_EVERY"]),
)
celery = celery_init_app(flask_app)
