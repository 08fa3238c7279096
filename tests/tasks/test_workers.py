"""Outbox delivery and reconciliation as Celery tasks, over real worker processes and a real Redis.

The shop (``tests/tasks/shop_app.py``, on PostgreSQL) learns of each payment through the
``flask_gateway.reconcile`` task (the emulator, a real process, sends no callbacks); the event is delivered
by ``flask_gateway.deliver_outbox``, which beat sends every half second to two prefork workers. The
receiver fails, blocks or fulfils as the order's scenario says, and counts everything in the database:
its calls, and its fulfilments (it is not idempotent itself, so a second delivery after a fulfilment would
show as a second row).

The outbox's lease is cut to :data:`LEASE_SECONDS` in the workers (10 s in a shop) and renewed every third
of it while a receiver runs: a receiver slower than the lease keeps its event, and the event of a killed
worker is delivered within the lease and a tick of its death (15 s in a shop; here 4 s and 0.5 s, plus
the time a worker takes to pick the tick up: :data:`TAKEOVER_SLACK`).

``pytest tests/tasks -s`` prints the figures of each run (``[tasks] ...``).
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from tests.tasks.conftest import DELIVER_EVERY, LEASE_SECONDS, TaskStack

#: How long nothing more may happen once the order is fulfilled (several beat ticks).
QUIET_SECONDS = 2.5
#: Beyond the lease and a beat tick: a worker takes the tick from Redis, starts the task, claims the event.
TAKEOVER_SLACK = 2.5


def _gaps(times: list[datetime]) -> list[float]:
    return [round((later - earlier).total_seconds(), 2) for earlier, later in itertools.pairwise(times)]


def _settled(stack: TaskStack, reference: str, checkout_id: int) -> tuple[list[Any], list[Any], list[Any]]:
    """The order's calls, fulfilments and outbox events, after a quiet spell of several beat ticks."""
    time.sleep(QUIET_SECONDS)
    return stack.calls(reference), stack.fulfilments(reference), stack.events(checkout_id)


def test_a_receiver_that_raises_twice_fulfils_once_on_the_third_attempt(
    stack: TaskStack, report: Callable[[str], None]
) -> None:
    reference = "TASKS-RAISES-TWICE"
    stack.scenario(reference, failures=2)
    started = time.monotonic()
    checkout_id = stack.paid_order(reference)

    stack.wait(lambda: stack.events(checkout_id), timeout=30, what="the reconcile task to record the payment")
    found = time.monotonic() - started
    stack.wait(lambda: stack.fulfilments(reference), timeout=60, what="the order's fulfilment")
    fulfilled = time.monotonic() - started
    calls, fulfilments, events = _settled(stack, reference, checkout_id)

    ((event_id, kind, state, attempts, last_error, *_),) = events
    assert (kind, state, attempts, last_error) == ("payment_confirmed", "delivered", 3, None)
    assert [call for call, *_ in calls] == [1, 2, 3], "the receiver ran exactly three times"
    assert {event for _, event, *_ in calls} == {event_id}, "every delivery carried the same event_id"
    ((fulfilled_event, fulfilled_by, _),) = fulfilments  # once
    assert fulfilled_event == event_id
    assert fulfilled_by == calls[2][2]  # by the third call
    gaps = _gaps([at for *_, at in calls])
    # GATEWAY_OUTBOX_RETRY_SECONDS = 1: due again after 1 s, then 2 s (beat ticks every 0.5 s).
    assert gaps[0] >= 0.9 and gaps[1] >= 1.9, gaps
    logs = stack.logs()
    assert logs.count("a receiver of payment_confirmed failed") == 2, logs[-4000:]
    report(
        f"raises twice: payment found by the reconcile task after {found:.1f} s; receiver called 3 times "
        f"(pool processes {sorted({pid for *_, pid, _ in calls})}), {gaps[0]} s and {gaps[1]} s apart; "
        f"outbox attempts 3; fulfilled once, {fulfilled:.1f} s after the payment"
    )


def test_a_pool_process_killed_inside_the_receiver_gives_its_task_back_and_loses_nothing(
    stack: TaskStack, report: Callable[[str], None]
) -> None:
    reference = "TASKS-POOL-PROCESS-KILLED"
    stack.scenario(reference, failures=0, block_on=1)
    checkout_id = stack.paid_order(reference)

    inside = stack.inside(reference, 1, timeout=30)
    worker = stack.worker_of(inside["ppid"])
    os.kill(inside["pid"], signal.SIGKILL)  # the pool process running the task, inside the receiver
    killed = time.monotonic()
    stack.wait(
        lambda: stack.fulfilments(reference), timeout=LEASE_SECONDS + 30, what="the order's fulfilment"
    )
    taken_over = time.monotonic() - killed
    calls, fulfilments, events = _settled(stack, reference, checkout_id)

    ((event_id, _kind, state, attempts, last_error, *_),) = events
    # The killed delivery never settled: no attempt recorded for it, no error. The next one fulfilled.
    assert (state, attempts, last_error) == ("delivered", 1, None)
    assert [call for call, *_ in calls] == [1, 2]
    assert {event for _, event, *_ in calls} == {event_id}
    ((_, fulfilled_by, _),) = fulfilments
    assert fulfilled_by != inside["pid"]
    (gap,) = _gaps([at for *_, at in calls])
    assert gap >= LEASE_SECONDS - 0.5, f"the event was delivered again {gap} s later, within its lease"
    assert taken_over <= LEASE_SECONDS + DELIVER_EVERY + TAKEOVER_SLACK, (
        f"taken over {taken_over:.1f} s after"
    )
    # The worker itself lives on with a new pool process; the task it was running went back to the queue
    # (task_reject_on_worker_lost) and was run again, to completion.
    assert worker.alive()
    log = worker.log(stack.marks.get(worker.name, 0))
    assert "WorkerLostError" in log and "signal 9 (SIGKILL)" in log, log[-4000:]
    received = re.findall(r"Task flask_gateway\.deliver_outbox\[([0-9a-f-]+)\] received", stack.logs())
    again = sorted({task for task in received if received.count(task) > 1})
    assert again, "the killed task was given back to the queue and received again"
    report(
        f"pool process killed inside the receiver: its task given back and received again ({again[0][:8]}...); "
        f"the event waited out its {LEASE_SECONDS:.0f} s lease and was delivered {gap} s after the killed "
        f"call, fulfilled once ({taken_over:.1f} s after the kill); outbox attempts 1"
    )


def test_a_worker_killed_mid_delivery_leaves_the_event_to_another_that_fulfils_it_once(
    stack: TaskStack, report: Callable[[str], None]
) -> None:
    """The receiver raises on its first two calls and blocks on the third; the whole worker running that
    third call (its main process and its pool process) is SIGKILLed, as a machine that vanished, after it
    renewed the lease once. The other worker delivers the event once the lease is out, within the lease
    and a tick of the kill: fulfilled exactly once, on the third recorded attempt."""
    reference = "TASKS-WORKER-KILLED"
    stack.scenario(reference, failures=2, block_on=3)
    started = time.monotonic()
    checkout_id = stack.paid_order(reference)

    inside = stack.inside(reference, 3, timeout=45)
    victim = stack.worker_of(inside["ppid"])
    (survivor,) = [worker for worker in stack.live_workers() if worker is not victim]
    time.sleep(LEASE_SECONDS * 0.6)  # its lease renewed once (after a third of it): the renewals die with it
    victim.kill()
    killed = time.monotonic()
    stack.wait(
        lambda: stack.fulfilments(reference), timeout=LEASE_SECONDS + 30, what="the order's fulfilment"
    )
    taken_over = time.monotonic() - killed
    total = time.monotonic() - started
    calls, fulfilments, events = _settled(stack, reference, checkout_id)

    assert not victim.alive()
    ((event_id, _kind, state, attempts, last_error, *_),) = events
    assert (state, attempts, last_error) == ("delivered", 3, None), "two failures, then the delivery"
    assert [call for call, *_ in calls] == [1, 2, 3, 4], "the killed third call never finished"
    assert {event for _, event, *_ in calls} == {event_id}
    ((_, fulfilled_by, _),) = fulfilments  # exactly once
    assert fulfilled_by == calls[3][2] != inside["pid"]
    gaps = _gaps([at for *_, at in calls])
    # Renewed once, a third of the lease into the call, then no more: free a lease after that renewal.
    renewed_lease = LEASE_SECONDS * 4 / 3
    assert gaps[2] >= renewed_lease - 0.5, f"taken over {gaps[2]} s after the killed call, within the lease"
    assert taken_over <= LEASE_SECONDS + DELIVER_EVERY + TAKEOVER_SLACK, (
        f"taken over {taken_over:.1f} s after"
    )
    assert survivor.alive()
    report(
        f"worker killed mid-delivery (SIGKILL to its main and pool process, inside call 3): receiver calls "
        f"{len(calls)}, {gaps} s apart; the survivor delivered it after the {LEASE_SECONDS:.0f} s lease "
        f"(renewed once before the kill; {taken_over:.1f} s after the kill, beat every {DELIVER_EVERY} s); "
        f"outbox attempts 3, fulfilled once; {total:.1f} s from payment to fulfilment"
    )


def test_a_receiver_slower_than_the_lease_keeps_its_event(
    stack: TaskStack, report: Callable[[str], None]
) -> None:
    """The receiver's first call blocks for three leases while beat sends a tick every half second to the
    other worker: the blocked worker's process renews the lease, so no tick takes the event; once released,
    the call fulfils the order, delivered once."""
    reference = "TASKS-SLOW-RECEIVER"
    stack.scenario(reference, failures=0, block_on=1)
    checkout_id = stack.paid_order(reference)

    inside = stack.inside(reference, 1, timeout=30)
    holder = stack.worker_of(inside["ppid"])
    (other,) = [worker for worker in stack.live_workers() if worker is not holder]
    since = other.log_size()
    time.sleep(3 * LEASE_SECONDS)
    ticks = len(re.findall(r"Task flask_gateway\.deliver_outbox\[[0-9a-f-]+\] received", other.log(since)))
    calls_meanwhile = stack.calls(reference)
    (stack.markers / f"release-{reference}").touch()
    stack.wait(lambda: stack.fulfilments(reference), timeout=30, what="the order's fulfilment")
    calls, fulfilments, events = _settled(stack, reference, checkout_id)

    assert len(calls_meanwhile) == 1, "the event was delivered again while its receiver still ran"
    assert ticks >= 5, f"the other worker ran only {ticks} ticks meanwhile:\n{stack.logs()[-4000:]}"
    ((event_id, _kind, state, attempts, last_error, *_),) = events
    assert (state, attempts, last_error) == ("delivered", 1, None)
    assert [(call, event) for call, event, *_ in calls] == [(1, event_id)]
    ((_, fulfilled_by, _),) = fulfilments
    assert fulfilled_by == inside["pid"]
    report(
        f"receiver blocked for {3 * LEASE_SECONDS:.0f} s (three {LEASE_SECONDS:.0f} s leases, renewed every "
        f"{LEASE_SECONDS / 3:.1f} s) while the other worker ran {ticks} deliver_outbox ticks: called once, "
        f"fulfilled once"
    )
