"""docs/operations.md's Celery recipe runs: its task reconciles a payment whose callbacks all failed."""

from __future__ import annotations

import dataclasses
import re
import sys
import types
from pathlib import Path

import pytest

from flask_gateway.state import get_state
from tests.extension.conftest import Harness
from tests.extension.operations_support import load, new_checkout

DOCS = Path(__file__).resolve().parents[2] / "docs"


def _celery_recipe() -> str:
    page = (DOCS / "operations.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", page, flags=re.DOTALL)
    return next(block for block in blocks if block.startswith("# tasks.py"))


def test_the_celery_recipe_reconciles_on_its_schedule(harness: Harness, monkeypatch: pytest.MonkeyPatch):
    celery_state = pytest.importorskip("celery._state")
    # A Celery task is "shared" by default: registered on every app finalized later in this process. The
    # next run of this test (the other database) defines the task again; keep each run's registrations
    # to itself, as separate worker processes would.
    monkeypatch.setattr(celery_state, "_on_app_finalizers", set(celery_state._on_app_finalizers))
    harness.install()
    checkout_id, token = new_checkout(harness)
    harness.emulator.control("faults", {"operation": "callback", "kind": "callback_fail", "count": 3})
    harness.emulator.pay(token)
    for _ in range(3):
        harness.emulator.control("deliver")  # every attempt fails: the shop never hears of the payment
    state = get_state(harness.shop)  # due at once (GATEWAY_RECONCILE_AFTER_SECONDS = 0)
    state.config = dataclasses.replace(state.config, reconcile_after_seconds=0)

    myshop = types.ModuleType("myshop")
    myshop.create_app = lambda: harness.shop  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "myshop", myshop)
    namespace: dict[str, object] = {"__name__": "tasks"}
    exec(compile(_celery_recipe(), "docs/operations.md#tasks.py", "exec"), namespace)  # noqa: S102

    celery = namespace["celery"]
    schedule = celery.conf.beat_schedule["gateway-reconcile"]  # type: ignore[attr-defined]
    assert schedule["schedule"] == 300.0
    assert schedule["task"] in celery.tasks  # type: ignore[attr-defined]  # beat names a registered task

    # apply(): the task runs in this process, as a worker would run it, without a broker.
    summary = namespace["reconcile_gateway"].apply().get()  # type: ignore[attr-defined]
    assert "1 payment(s) confirmed" in summary
    with harness.shop.app_context():
        assert load(harness, checkout_id).status == "PAID_PENDING_CALLBACK"
