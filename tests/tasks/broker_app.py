"""What ``celery -A tests.tasks.broker_app:celery worker`` (and ``beat``) load in tests/tasks/test_broker.py:
a bare Flask app with ``flask_gateway.tasks.celery_init_app`` (no database: the gateway's tasks are
registered, never run here) and one task of the shop's own, ``broker_test.touch``, that writes a file in
the app's instance folder, so the test sees from outside which tasks a worker ran.

Built from the environment the test gives the process: ``BROKER_TEST_URL`` (the broker),
``BROKER_TEST_INSTANCE`` (the instance folder), and ``BROKER_TEST_MAX_RETRIES`` when the test overrides
``broker_connection_max_retries`` (Celery's own setting, over the gateway's ``RELIABILITY``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from flask import Flask, current_app

from flask_gateway.tasks import celery_init_app

flask_app = Flask("broker_test", instance_path=os.environ["BROKER_TEST_INSTANCE"])
settings: dict[str, Any] = {"broker_url": os.environ["BROKER_TEST_URL"]}
if "BROKER_TEST_MAX_RETRIES" in os.environ:
    settings["broker_connection_max_retries"] = int(os.environ["BROKER_TEST_MAX_RETRIES"])
flask_app.config["CELERY"] = settings
celery = celery_init_app(flask_app)


@celery.task(name="broker_test.touch", shared=False)  # type: ignore[untyped-decorator]  # celery is untyped
def touch(name: str) -> str:
    """Write ``<instance folder>/ran-<name>`` (inside the app context, as every task of the app runs)."""
    Path(current_app.instance_path, f"ran-{name}").write_text(str(os.getpid()))
    return name
