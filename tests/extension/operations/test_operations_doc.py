"""docs/operations.md's Celery parts: one recipe, and its "run a reconciliation now" does what it says.

- Every ``<!-- tested: PATH ... -->`` marker of the page names a test file that exists and reads the page.
- One Celery recipe: the shipped tasks (``celery_init_app`` / ``register_tasks``). No block of the page
  defines a task of its own or a beat schedule that reconciles: beside the shipped schedule it would
  reconcile a second time.
- The "run a reconciliation now" block, run as written against the shipped task, confirms a payment whose
  callbacks all failed although the checkout is not due (created a moment ago, the 300 s default applies),
  which the same task sent without ``kwargs`` (beat's run) leaves alone.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from flask_gateway.state import get_state
from tests.extension.conftest import Harness
from tests.extension.operations.operations_support import load, new_checkout

ROOT = Path(__file__).resolve().parents[3]
PAGE = ROOT / "docs" / "operations.md"
_MARKED = re.compile(r"<!-- tested: (\S+)[^>]*-->\n```(\w+)\n(.*?)```", flags=re.DOTALL)


def _blocks(language: str = "python") -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)


def _run_now_block() -> str:
    (block,) = [
        block
        for path, _, block in _MARKED.findall(PAGE.read_text())
        if "send_task" in block and path.endswith("test_operations_doc.py")
    ]
    return block


def test_every_tested_marker_names_a_test_that_reads_the_page() -> None:
    marked = _MARKED.findall(PAGE.read_text())
    assert marked
    for path, _, block in marked:
        test = ROOT / path
        assert test.is_file(), f"{path} (marker before {block.splitlines()[0]!r}) does not exist"
        assert "operations.md" in test.read_text(), f"{path} never reads docs/operations.md"


def test_one_celery_recipe_the_shipped_tasks() -> None:
    python = _blocks()
    recipes = [block for block in python if "celery_init_app" in block or "Celery(" in block]
    assert len(recipes) == 1 and "celery_init_app" in recipes[0]
    for block in python:
        if "reconcile" in block:  # the shipped task and BEAT_SCHEDULE are the only reconciling ones
            assert not re.search(r"@(celery\.task|shared_task)|beat_schedule", block), block


def test_run_a_reconciliation_now_confirms_a_payment_the_plain_task_leaves_for_later(
    harness: Harness,
) -> None:
    pytest.importorskip("celery")
    from celery import Celery

    from flask_gateway.tasks import RECONCILE, register_tasks

    harness.install()
    checkout_id, token = new_checkout(harness)
    harness.emulator.control("faults", {"operation": "callback", "kind": "callback_fail", "count": 3})
    harness.emulator.pay(token)
    for _ in range(3):
        harness.emulator.control("deliver")  # every attempt fails: the shop never hears of the payment
    assert get_state(harness.shop).config.reconcile_after_seconds == 300  # the default: not due yet

    shop_celery = Celery("myshop", broker="memory://")
    tasks = register_tasks(shop_celery, harness.shop)
    assert tasks.reconcile.apply().get().startswith("Polled 0 of 0 due")  # beat's run: not due

    sent: list[str] = []

    class Worker:
        """``celery`` of the block: what a worker does with the message it sends (``apply``)."""

        def send_task(self, name: str, args: Any = None, kwargs: Any = None, **options: Any) -> None:
            assert name == RECONCILE and name in shop_celery.tasks
            sent.append(shop_celery.tasks[name].apply(args=args, kwargs=kwargs).get())

    exec(compile(_run_now_block(), "docs/operations.md#run-now", "exec"), {"celery": Worker()})  # noqa: S102
    (summary,) = sent
    assert "1 payment(s) confirmed" in summary, summary
    with harness.shop.app_context():
        assert load(harness, checkout_id).status == "PAID_PENDING_CALLBACK"


def test_the_callback_log_table_lists_every_outcome_with_its_answer() -> None:
    from flask_gateway import errors
    from flask_gateway.models import CallbackOutcome

    page = PAGE.read_text()
    section = page[page.index("## Reading the callback log") :]
    section = section[: section.index("\n## ", 1)]
    rows = dict(re.findall(r"^\| `([a-z-]+)` \| ([^|]+?) \|", section, flags=re.MULTILINE))
    assert set(rows) == {outcome.value for outcome in CallbackOutcome}
    # A refusal's answer is its error's HTTP status; the doctor's probe is answered as an unsigned callback.
    refusals = [
        error
        for error in vars(errors).values()
        if isinstance(error, type) and issubclass(error, errors.CallbackRejected) and error.outcome in rows
    ]
    assert len(refusals) >= 5
    for error in refusals:
        assert rows[error.outcome] == str(error.code), error.outcome
    assert rows["doctor-probe"] == str(errors.CallbackUnauthorized.code)
    assert rows["accepted"] == rows["duplicate"] == rows["mismatch"] == rows["unconfirmed"] == "200"
