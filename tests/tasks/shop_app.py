"""The shop the task tests run: the extension on PostgreSQL, wired to a real emulator process, with a
``payment_confirmed`` receiver that fails, blocks or fulfils as the test's scenario for the order says.

The test process builds it (``create_app``) to create the tables, install the shop and create checkouts;
each Celery worker and beat process builds the same app from the environment (``tests/tasks/worker_app.py``).
Everything the receiver does is in the database (or in marker files), so every process sees it:

- ``tasks_scenarios``: per order, how many calls fail first (``failures``) and which call blocks
  (``block_on``: it writes ``inside-<reference>-<call>.json`` with its pid and its parent's, then waits for
  ``release-<reference>`` in the markers folder, at most 60 s), so a test can kill the worker inside it;
- ``tasks_calls``: one row per call of the receiver (committed before it fails or blocks);
- ``tasks_fulfilments``: one row per fulfilment. No unique key, no idempotency in the receiver: an event
  delivered twice after it fulfilled would show as two rows.

The outbox's time in every process is a :class:`SharedClock` (a file the test writes), standing still
until the test moves it: leases run out, retries fall due and renewals are made when the test says.
"""

from __future__ import annotations

import json
import os
import time
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any, Final

from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import Column, DateTime, Integer, MetaData, String, Table, func, insert, select
from sqlalchemy import create_engine as sa_create_engine
from sqlalchemy.pool import NullPool

from flask_gateway import Gateway, payment_confirmed
from flask_gateway.tasks import DELIVER_OUTBOX, RECONCILE

#: Where the shop says it is (the emulator never calls it: its callback worker is off).
PUBLIC_URL: Final = "https://shop.example"
#: Seconds a blocked call waits for its release file before it gives up (raises): a last resort, for a
#: test that died before it released or killed the call.
BLOCK_LIMIT: Final = 600.0

metadata = MetaData()
scenarios: Final = Table(
    "tasks_scenarios",
    metadata,
    Column("reference", String(255), primary_key=True),
    Column("failures", Integer, nullable=False),
    Column("block_on", Integer),
)
calls: Final = Table(
    "tasks_calls",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("reference", String(255), nullable=False, index=True),
    Column("call", Integer, nullable=False),
    Column("event_id", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", DateTime(timezone=True), server_default=func.clock_timestamp(), nullable=False),
)
fulfilments: Final = Table(
    "tasks_fulfilments",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("reference", String(255), nullable=False, index=True),
    Column("event_id", Integer, nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", DateTime(timezone=True), server_default=func.clock_timestamp(), nullable=False),
)


class SharedClock:
    """A clock every process of the task tests reads, moved only by the test: the time in the file
    ``path`` (ISO 8601, UTC).

    The worker processes put it in place of the outbox's ``utcnow`` and ``monotonic``
    (``tests/tasks/worker_app.py``), so the leases and due times written in the rows, and the heartbeat
    that renews the leases, go by it: however slow the machine, a lease runs out only when the test moves
    the clock past its end, and a renewal falls due only when the test moves it a third of a lease on.
    The heartbeat looks at the clock when its wait ends (at most a third of a real lease later).
    """

    def __init__(self, path: Path) -> None:
        self.path = path

    def set(self, moment: datetime) -> None:
        written = self.path.with_name(f"{self.path.name}.new")
        written.write_text(moment.isoformat())
        os.replace(written, self.path)  # a reader sees the old time or the new one, never half a line

    def now(self) -> datetime:
        return datetime.fromisoformat(self.path.read_text())

    def monotonic(self) -> float:
        return self.now().timestamp()

    def advance(self, seconds: float) -> datetime:
        """Move the clock ``seconds`` on; the new time."""
        moved = self.now() + timedelta(seconds=seconds)
        self.set(moved)
        return moved


class Fulfilment:
    """The shop's ``payment_confirmed`` receiver, as the order's scenario says (see the module docstring)."""

    def __init__(self, database_url: str, markers: Path) -> None:
        # Connections of its own, none kept: committed at once, and nothing shared across a fork.
        self.engine = sa_create_engine(database_url, poolclass=NullPool)
        self.markers = markers

    def __call__(self, sender: Any, checkout: Any, event_id: int, **extra: Any) -> None:
        reference = checkout.order_reference
        with self.engine.begin() as connection:
            number = select(func.count() + 1).select_from(calls).where(calls.c.reference == reference)
            call = connection.execute(
                insert(calls)
                .values(
                    reference=reference, event_id=event_id, pid=os.getpid(), call=number.scalar_subquery()
                )
                .returning(calls.c.call)
            ).scalar_one()
            scenario = connection.execute(
                select(scenarios.c.failures, scenarios.c.block_on).where(scenarios.c.reference == reference)
            ).one_or_none()
        failures, block_on = scenario if scenario is not None else (0, None)
        if call == block_on:
            self._block(reference, call)
        if call <= failures:
            raise ConnectionError(f"the warehouse is down (call {call} for order {reference})")
        with self.engine.begin() as connection:
            connection.execute(
                insert(fulfilments).values(reference=reference, event_id=event_id, pid=os.getpid())
            )

    def _block(self, reference: str, call: int) -> None:
        inside = self.markers / f"inside-{reference}-{call}.json"
        inside.write_text(json.dumps({"pid": os.getpid(), "ppid": os.getppid()}))
        release = self.markers / f"release-{reference}"
        deadline = time.monotonic() + BLOCK_LIMIT
        while not release.exists():
            if time.monotonic() > deadline:
                raise TimeoutError(f"call {call} for order {reference} was never released nor killed")
            time.sleep(0.05)


def create_app(
    *,
    database_url: str,
    emulator_url: str,
    redis_url: str,
    markers: Path,
    deliver_every: float,
) -> Flask:
    """The shop: the extension on ``database_url``, the gateway at ``emulator_url``, Celery on ``redis_url``.

    Every outbox event is left to the ``deliver_outbox`` task (``GATEWAY_OUTBOX_DELIVER_AT_ONCE`` off);
    a failed delivery is due again after 1 s, then 2 s, 4 s... (of the outbox's clock). Beat sends
    ``deliver_outbox`` every ``deliver_every`` seconds; ``reconcile`` is sent by the test (after the
    payment: a run that polled the checkout before would leave it alone for a minute).
    """
    app = Flask("tasks_shop")
    app.config.update(
        SECRET_KEY="shop-secret-for-the-task-tests",
        SQLALCHEMY_DATABASE_URI=database_url,
        SQLALCHEMY_ENGINE_OPTIONS={"pool_pre_ping": True},
        GATEWAY_ENVIRONMENT="emulator",
        GATEWAY_BASE_URL=emulator_url,
        GATEWAY_INSTALL_URL=f"{emulator_url}/install",
        GATEWAY_V1_BASE_URL=emulator_url,
        GATEWAY_PUBLIC_URL=PUBLIC_URL,
        GATEWAY_ORDER_ENDPOINT="order_page",
        GATEWAY_MAX_RETRIES=0,
        GATEWAY_TIMEOUT=5.0,
        GATEWAY_OUTBOX_DELIVER_AT_ONCE=False,
        GATEWAY_OUTBOX_RETRY_SECONDS=1,
        GATEWAY_RECONCILE_AFTER_SECONDS=0,
        CELERY={
            "broker_url": redis_url,
            "beat_schedule": {
                "flask-gateway-deliver-outbox": {
                    "task": DELIVER_OUTBOX,
                    "schedule": deliver_every,
                    "options": {"expires": 10 * deliver_every},
                },
                # Sent by the test instead (see above); the documented entry's interval is 300 s.
                "flask-gateway-reconcile": {"task": RECONCILE, "schedule": 86_400.0},
            },
        },
    )
    db = SQLAlchemy()
    db.init_app(app)
    Gateway(app, db=db)

    @app.get("/orders/<reference>")
    def order_page(reference: str) -> str:
        return f"order {reference}"

    receiver = Fulfilment(database_url, markers)
    app.extensions["tasks_fulfilment"] = receiver  # blinker holds receivers weakly: keep it alive
    payment_confirmed.connect(receiver, sender=app)
    return app


def create_tables(app: Flask) -> None:
    """The extension's tables and the receiver's (the test process, before any worker starts)."""
    with app.app_context():
        db: SQLAlchemy = app.extensions["sqlalchemy"]
        db.create_all()
        metadata.create_all(db.engine)
