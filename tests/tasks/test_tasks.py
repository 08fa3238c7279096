"""flask_gateway.tasks in this process (no broker: ``apply()`` runs a task as a worker would): Flask's
pattern, the reliability settings and the beat schedule, the app context, and one claim per event.

The real thing, with worker processes, Redis and SIGKILL, is tests/tasks/test_workers.py.
"""

from __future__ import annotations

import re
import sys
import types
from pathlib import Path
from typing import Any

import celery._state as celery_state
import pytest
from celery import Celery
from flask import Flask, current_app
from flask_sqlalchemy import SQLAlchemy

from flask_gateway import Gateway, create_checkout, payment_confirmed
from flask_gateway.models import GatewayCheckout
from flask_gateway.operations import tasks as gateway_tasks  # the module that looks deliver_due up
from flask_gateway.payments.heartbeats import job_status
from flask_gateway.payments.outbox import CLAIM_LEASE, DeliveryReport, deliver_due
from flask_gateway.state import get_state
from flask_gateway.tasks import (
    BEAT_SCHEDULE,
    BEAT_SCHEDULE_FILE,
    DELIVER_EVERY,
    DELIVER_OUTBOX,
    RECONCILE,
    RELIABILITY,
    InstanceFolderScheduler,
    celery_init_app,
    register_tasks,
)
from flask_gateway.testing import SHOP_URL, GatewayEmulator
from tests.conftest import Databases
from tests.extension.conftest import make_shop, sample_order


@pytest.fixture(autouse=True)
def _celery_default_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """``celery_init_app`` makes its app Celery's default (Flask's pattern): undone after each test."""
    monkeypatch.setattr(celery_state, "default_app", celery_state.default_app)


@pytest.fixture
def plugin_parts(databases: Databases) -> tuple[Flask, SQLAlchemy, Gateway]:
    """The shop of tests/extension, its events left to the task queue (not delivered by the request)."""
    return make_shop(databases.url("main"), GATEWAY_OUTBOX_DELIVER_AT_ONCE=False)


@pytest.fixture
def gateway_app(plugin_parts: tuple[Flask, SQLAlchemy, Gateway]) -> Flask:
    return plugin_parts[0]


@pytest.fixture
def celery(gateway_app: Flask) -> Any:
    gateway_app.config["CELERY"] = {
        "broker_url": "memory://",
        "beat_schedule": {"shop-newsletter": {"task": "shop.newsletter", "schedule": 86_400.0}},
    }
    return celery_init_app(gateway_app)


def test_celery_init_app_is_flasks_pattern_with_the_reliability_settings_and_the_schedule(
    gateway_app: Flask, celery: Any
) -> None:
    assert gateway_app.extensions["celery"] is celery
    assert celery_state.default_app is celery
    for key, value in RELIABILITY.items():
        assert celery.conf[key] == value, key
    assert celery.conf.task_acks_late and celery.conf.task_reject_on_worker_lost
    assert celery.conf.worker_prefetch_multiplier == 1
    assert celery.conf.broker_transport_options["visibility_timeout"] == 3600
    schedule = celery.conf.beat_schedule
    assert set(schedule) == {*BEAT_SCHEDULE, "shop-newsletter"}  # the shop's own entries are kept
    # A tick every 5 s, dropped when it waited longer: with the outbox's 10 s lease, an event whose worker
    # died is delivered within 15 s of the death (docs/operations.md says so).
    deliver = schedule["flask-gateway-deliver-outbox"]
    assert deliver["schedule"] == DELIVER_EVERY == 5.0
    assert deliver["options"]["expires"] == DELIVER_EVERY
    assert CLAIM_LEASE.total_seconds() + DELIVER_EVERY == 15
    assert schedule["flask-gateway-reconcile"]["schedule"] == 300.0
    for name in BEAT_SCHEDULE:
        task = celery.tasks[schedule[name]["task"]]  # beat names a registered task
        assert task.acks_late and task.reject_on_worker_lost and task.ignore_result

    # A task of the shop's own runs in the app context too (Flask's FlaskTask is the app's task class).
    def app_name() -> str:
        return str(current_app.name)  # the app context the task runs in

    newsletter = celery.task(name="shop.newsletter", shared=False)(app_name)
    assert newsletter.apply().get() == gateway_app.name


def test_the_tasks_run_in_the_apps_context_outside_any(celery: Any) -> None:
    assert celery.tasks[DELIVER_OUTBOX].apply().get() == "Outbox: 0 delivered, 0 failed, 0 dead."
    summary = celery.tasks[RECONCILE].apply(kwargs={"limit": 5}).get()
    assert summary == "The gateway is not installed: nothing to reconcile."


def test_a_celery_app_of_the_shops_own(gateway_app: Flask) -> None:
    """``register_tasks`` on an existing Celery app: with the Flask app, or inside the shop's app context."""
    own = Celery("shop", broker="memory://")
    bound = register_tasks(own, gateway_app)
    assert bound.deliver_outbox.apply().get().startswith("Outbox: 0 delivered")

    bare = register_tasks(Celery("shop-bare", broker="memory://"))
    with pytest.raises(RuntimeError, match="outside a Flask app context"):
        bare.deliver_outbox.apply().get()
    with gateway_app.app_context():  # what Flask's FlaskTask gives each task
        assert bare.deliver_outbox.apply().get().startswith("Outbox: 0 delivered")

    # Registered on their own Celery app only, never on the apps made later (Celery's "shared" tasks).
    later = Celery("later", broker="memory://")
    later.finalize()
    assert DELIVER_OUTBOX not in later.tasks and RECONCILE not in later.tasks


def test_deliver_outbox_claims_one_event_at_a_time_and_stops_at_its_limit(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, celery: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fulfilled: list[tuple[str, int]] = []

    def fulfil(sender: Any, checkout: Any, event_id: int, **extra: Any) -> None:
        fulfilled.append((checkout.order_reference, event_id))

    payment_confirmed.connect(fulfil, sender=gateway_app)
    claims: list[int] = []
    real = deliver_due

    def counting(limit: int = 100) -> DeliveryReport:
        claims.append(limit)
        return real(limit)

    monkeypatch.setattr(gateway_tasks, "deliver_due", counting)
    try:
        for reference in ("ORD-1", "ORD-2", "ORD-3"):
            with gateway_app.test_request_context(base_url=SHOP_URL):
                checkout = create_checkout(sample_order(reference))
            gateway_emulator.pay(checkout.token)
        assert gateway_emulator.deliver() == 3  # the callbacks: three events written, none delivered yet
        assert fulfilled == []

        deliver = celery.tasks[DELIVER_OUTBOX]
        assert deliver.apply(kwargs={"limit": 2}).get() == "Outbox: 2 delivered, 0 failed, 0 dead."
        assert claims == [1, 1]  # one claim per event: each lease starts with its own delivery
        assert deliver.apply().get() == "Outbox: 1 delivered, 0 failed, 0 dead."
        assert claims == [1, 1, 1, 1]  # the last claim found nothing due: the task ended
        assert sorted(reference for reference, _ in fulfilled) == ["ORD-1", "ORD-2", "ORD-3"]
        assert len({event_id for _, event_id in fulfilled}) == 3
        with gateway_app.app_context():  # one heartbeat per task run, not one per claim
            (deliver_job,) = [status for status in job_status() if status.job == "deliver"]
        assert deliver_job.runs == 2 and deliver_job.last_outcome == "ok"
        assert deliver_job.last_summary == "1 delivered, 0 failed, 0 dead"
    finally:
        payment_confirmed.disconnect(fulfil, sender=gateway_app)


def test_the_operations_page_recipe_builds_the_celery_app(
    gateway_app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    """docs/operations.md's ``myshop/celery_app.py``, run as written (``myshop`` is this test's shop)."""
    page = (Path(__file__).resolve().parents[2] / "docs" / "operations.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)
    (recipe,) = [block for block in blocks if block.startswith("# myshop/celery_app.py")]
    gateway_app.config["CELERY"] = {"broker_url": "memory://"}
    myshop = types.ModuleType("myshop")
    myshop.create_app = lambda: gateway_app  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "myshop", myshop)
    namespace: dict[str, Any] = {"__name__": "myshop.celery_app"}
    exec(compile(recipe, "docs/operations.md#myshop/celery_app.py", "exec"), namespace)  # noqa: S102

    celery = namespace["celery"]
    assert namespace["flask_app"].extensions["celery"] is celery
    assert {DELIVER_OUTBOX, RECONCILE} <= set(celery.tasks)
    assert celery.conf.task_acks_late and celery.conf.worker_prefetch_multiplier == 1
    assert set(celery.conf.beat_schedule) == set(BEAT_SCHEDULE)
    assert celery.tasks[DELIVER_OUTBOX].apply().get() == "Outbox: 0 delivered, 0 failed, 0 dead."


def test_run_one_now_polls_the_checkouts_the_plain_task_leaves_for_later(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, celery: Any
) -> None:
    """docs/operations.md's "run one now": ``kwargs={"older_than_seconds": 0}`` asks about every open
    checkout now; the plain task (what beat sends) leaves those changed or polled in the last
    ``GATEWAY_RECONCILE_AFTER_SECONDS`` (300 s) alone."""
    with gateway_app.test_request_context(base_url=SHOP_URL):
        checkout = create_checkout(sample_order("ORD-NOW"))
    gateway_emulator.pay(checkout.token)  # paid at the gateway; its callback not delivered

    reconcile_task = celery.tasks[RECONCILE]
    plain = reconcile_task.apply().get()
    assert plain.startswith("Polled 0 of 0 due checkout(s)"), plain  # created a moment ago: not due
    now = reconcile_task.apply(kwargs={"older_than_seconds": 0}).get()  # as send_task sends it
    assert now.startswith("Polled 1 of 1 due checkout(s)") and "1 payment(s) confirmed" in now, now
    with gateway_app.app_context():
        assert get_state().session.get(GatewayCheckout, checkout.id).status == "PAID_PENDING_CALLBACK"


def test_celery_init_app_puts_beats_file_in_the_instance_folder_unless_the_shop_names_one(
    tmp_path: Path,
) -> None:
    app = Flask("shop", instance_path=str(tmp_path / "instance"))
    app.config["CELERY"] = {"broker_url": "memory://"}
    celery = celery_init_app(app)
    assert celery.conf.beat_schedule_filename == str(tmp_path / "instance" / BEAT_SCHEDULE_FILE)
    assert celery.conf.beat_scheduler is InstanceFolderScheduler
    assert not (tmp_path / "instance").exists()  # nothing at init touches the disk

    own = Flask("shop2", instance_path=str(tmp_path / "instance2"))
    own.config["CELERY"] = {"broker_url": "memory://", "beat_schedule_filename": str(tmp_path / "beat")}
    assert celery_init_app(own).conf.beat_schedule_filename == str(tmp_path / "beat")

    # Beat's scheduler makes the folder when it opens the file (the first time beat starts).
    scheduler = InstanceFolderScheduler(app=celery, schedule_filename=celery.conf.beat_schedule_filename)
    try:
        assert any(path.name.startswith(BEAT_SCHEDULE_FILE) for path in (tmp_path / "instance").iterdir())
    finally:
        scheduler.close()
