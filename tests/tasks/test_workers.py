"""Outbox delivery and reconciliation as Celery tasks, over real worker processes and a real Redis.

The shop (``tests/tasks/shop_app.py``, on PostgreSQL) learns of each payment through the
``flask_gateway.reconcile`` task (the emulator, a real process, sends no callbacks); the event is delivered
by ``flask_gateway.deliver_outbox``, which beat sends every half second to two prefork workers. The
receiver fails, blocks or fulfils as the order's scenario says, and counts everything in the database:
its calls, and its fulfilments (it is not idempotent itself, so a second delivery after a fulfilment would
show as a second row).

The outbox in the workers goes by the stack's clock, which stands still until the test moves it
(``stack.clock``): a retry falls due, a lease runs out and a renewal is made when the test moves the clock
past it, never because the machine was slow. What must not happen yet is checked by a delivery run that
began after the moment in question (``stack.round_since``): had the event been free, that run would have
taken it. The lease is :data:`LEASE_SECONDS` of that clock (10 s in a shop), renewed every third of it
while a receiver runs. How soon a killed worker's event is delivered in real time is not asserted here.
"""

from __future__ import annotations

import os
import re
import signal
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from tests.processes import is_alive
from tests.tasks.conftest import LEASE_SECONDS, TaskStack

LEASE: timedelta = timedelta(seconds=LEASE_SECONDS)
#: A step of the clock that passes one renewal's due time (a third of the lease after the last one).
RENEWAL_STEP: float = LEASE_SECONDS * 0.34
_RECEIVED = re.compile(r"Task flask_gateway\.deliver_outbox\[([0-9a-f-]+)\] received")


def _settled(stack: TaskStack, reference: str, checkout_id: int) -> tuple[list[Any], list[Any], list[Any]]:
    """The order's calls, fulfilments and outbox events, once the delivery that fulfilled it has marked the
    event delivered and a delivery run begun after that has ended (it would have delivered the event again,
    were it due and free)."""
    stack.wait(
        lambda: [row[2] for row in stack.events(checkout_id)] == ["delivered"],
        what="the event marked delivered by the delivery that fulfilled the order",
    )
    stack.round_now()
    return stack.calls(reference), stack.fulfilments(reference), stack.events(checkout_id)


def _received_twice(logs: str) -> list[str]:
    """The ``deliver_outbox`` tasks the workers received more than once (given back to the queue)."""
    received = _RECEIVED.findall(logs)
    return sorted({task for task in received if received.count(task) > 1})


def _renewed(stack: TaskStack, checkout_id: int) -> datetime:
    """Wait until the delivery holding the checkout's event has renewed its lease from the clock's time;
    the lease's new end."""
    until = stack.clock.now() + LEASE
    stack.wait(
        lambda: stack.events(checkout_id)[0][8] == until,
        what=f"the lease of the checkout's event renewed to {until} (the clock at {stack.clock.now()})",
    )
    return until


def test_a_receiver_that_raises_twice_fulfils_once_on_the_third_attempt(
    stack: TaskStack, report: Callable[[str], None]
) -> None:
    reference = "TASKS-RAISES-TWICE"
    stack.scenario(reference, failures=2)
    checkout_id = stack.paid_order(reference)

    # GATEWAY_OUTBOX_RETRY_SECONDS = 1: due again 1 s after the first failure, then 2 s after the second.
    first = stack.event(
        checkout_id, "the first delivery's failure (reconcile task, then deliver)", attempts=1
    )
    assert first[7] == stack.clock.now() + timedelta(seconds=1)
    assert "call 1" in first[4]
    stack.round_now()
    assert len(stack.calls(reference)) == 1, "delivered again before it was due"
    stack.clock.advance(1)
    second = stack.event(checkout_id, "the second delivery's failure", attempts=2)
    assert second[7] == stack.clock.now() + timedelta(seconds=2)  # twice as long
    stack.clock.advance(1)  # half way
    stack.round_now()
    assert len(stack.calls(reference)) == 2, "delivered again before it was due"
    stack.clock.advance(1)
    stack.wait(lambda: stack.fulfilments(reference), what="the order's fulfilment")
    calls, fulfilments, events = _settled(stack, reference, checkout_id)

    ((event_id, kind, state, attempts, last_error, *_),) = events
    assert (kind, state, attempts, last_error) == ("payment_confirmed", "delivered", 3, None)
    assert [call for call, *_ in calls] == [1, 2, 3], "the receiver ran exactly three times"
    assert {event for _, event, *_ in calls} == {event_id}, "every delivery carried the same event_id"
    ((fulfilled_event, fulfilled_by, _),) = fulfilments  # once
    assert fulfilled_event == event_id
    assert fulfilled_by == calls[2][2]  # by the third call
    logs = stack.logs()
    assert logs.count("a receiver of payment_confirmed failed") == 2, logs[-4000:]
    report(
        f"raises twice: receiver called 3 times (pool processes {sorted({pid for *_, pid, _ in calls})}), "
        "never before the event was due again (1 s, then 2 s of the stack's clock); outbox attempts 3; "
        "fulfilled once"
    )


def test_a_pool_process_killed_inside_the_receiver_gives_its_task_back_and_loses_nothing(
    stack: TaskStack, report: Callable[[str], None]
) -> None:
    reference = "TASKS-POOL-PROCESS-KILLED"
    stack.scenario(reference, failures=0, block_on=1)
    checkout_id = stack.paid_order(reference)

    inside = stack.inside(reference, 1)
    worker = stack.worker_of(inside["ppid"])
    assert stack.events(checkout_id)[0][8] == stack.clock.now() + LEASE  # claimed for a lease
    os.kill(inside["pid"], signal.SIGKILL)  # the pool process running the task, inside the receiver
    stack.wait(lambda: not is_alive(inside["pid"]), what=f"the killed pool process {inside['pid']} to end")
    # The worker itself lives on with a new pool process; the task it was running goes back to the queue
    # (task_reject_on_worker_lost) and is run again: it finds the event still claimed.
    again = stack.wait(
        lambda: _received_twice(stack.logs()),
        what="the killed deliver_outbox task given back to the queue and received again",
    )
    stack.round_now()
    assert len(stack.calls(reference)) == 1, "taken over while the killed delivery's lease held"
    stack.clock.advance(LEASE_SECONDS)
    stack.round_now()
    assert len(stack.calls(reference)) == 1, "taken over at the lease's last instant"
    stack.clock.advance(0.001)  # the lease is out
    stack.wait(lambda: stack.fulfilments(reference), what="the order's fulfilment, once the lease is out")
    calls, fulfilments, events = _settled(stack, reference, checkout_id)

    ((event_id, _kind, state, attempts, last_error, *_),) = events
    # The killed delivery never settled: no attempt recorded for it, no error. The next one fulfilled.
    assert (state, attempts, last_error) == ("delivered", 1, None)
    assert [call for call, *_ in calls] == [1, 2]
    assert {event for _, event, *_ in calls} == {event_id}
    ((_, fulfilled_by, _),) = fulfilments
    assert fulfilled_by != inside["pid"]
    assert worker.alive()
    log = worker.log(stack.marks.get(worker.name, 0))
    assert "WorkerLostError" in log and "signal 9 (SIGKILL)" in log, log[-4000:]
    report(
        "pool process killed inside the receiver: its task given back and received again "
        f"({again[0][:8]}...); the event left alone to the end of its {LEASE_SECONDS:.0f} s lease, then delivered by call 2, "
        "fulfilled once; outbox attempts 1"
    )


def test_a_worker_killed_mid_delivery_leaves_the_event_to_another_that_fulfils_it_once(
    stack: TaskStack, report: Callable[[str], None]
) -> None:
    """The receiver raises on its first two calls and blocks on the third; the whole worker running that
    third call (its main process and its pool process) is SIGKILLed, as a machine that vanished, after it
    renewed the lease once. The other worker leaves the event alone past the end of the first claim (the
    renewal holds it), and delivers it once the renewed lease is out: fulfilled exactly once, on the third
    recorded attempt."""
    reference = "TASKS-WORKER-KILLED"
    stack.scenario(reference, failures=2, block_on=3)
    checkout_id = stack.paid_order(reference)

    stack.event(checkout_id, "the first delivery's failure", attempts=1)
    stack.clock.advance(1)  # due again
    stack.event(checkout_id, "the second delivery's failure", attempts=2)
    stack.clock.advance(2)  # due again
    inside = stack.inside(reference, 3)
    victim = stack.worker_of(inside["ppid"])
    (survivor,) = [worker for worker in stack.live_workers() if worker is not victim]
    claimed = stack.events(checkout_id)[0][8]
    assert claimed == stack.clock.now() + LEASE
    stack.clock.advance(RENEWAL_STEP)  # a third of the lease into the call: the victim renews it
    renewed = _renewed(stack, checkout_id)
    victim.kill()  # its renewals die with it
    stack.wait(lambda: not is_alive(inside["pid"]), what=f"the victim's pool process {inside['pid']} to end")
    stack.clock.advance((claimed - stack.clock.now()).total_seconds() + 0.001)  # the first claim is out
    stack.round_now()
    assert len(stack.calls(reference)) == 3, "taken over while the renewed lease held"
    stack.clock.advance(RENEWAL_STEP)  # past the renewed lease too
    stack.wait(lambda: stack.fulfilments(reference), what="the order's fulfilment by the other worker")
    calls, fulfilments, events = _settled(stack, reference, checkout_id)

    assert not victim.alive()
    ((event_id, _kind, state, attempts, last_error, *_),) = events
    assert (state, attempts, last_error) == ("delivered", 3, None), "two failures, then the delivery"
    assert [call for call, *_ in calls] == [1, 2, 3, 4], "the killed third call never finished"
    assert {event for _, event, *_ in calls} == {event_id}
    ((_, fulfilled_by, _),) = fulfilments  # exactly once
    assert fulfilled_by == calls[3][2] != inside["pid"]
    assert survivor.alive()
    report(
        f"worker killed mid-delivery (SIGKILL to its main and pool process, inside call 3, after it renewed "
        f"the lease to {renewed}): left alone past the first claim's end, delivered by the survivor once the "
        f"renewed lease was out; receiver calls {len(calls)}; outbox attempts 3, fulfilled once"
    )


def test_a_receiver_slower_than_the_lease_keeps_its_event(
    stack: TaskStack, report: Callable[[str], None]
) -> None:
    """The receiver's first call blocks while the clock moves on a third of the lease at a time, to more
    than two leases past the claim: after each step the blocked worker's process renews the lease, and a
    delivery run of the other worker leaves the event alone; once released, the call fulfils the order,
    delivered once."""
    reference = "TASKS-SLOW-RECEIVER"
    stack.scenario(reference, failures=0, block_on=1)
    checkout_id = stack.paid_order(reference)

    inside = stack.inside(reference, 1)
    holder = stack.worker_of(inside["ppid"])
    (other,) = [worker for worker in stack.live_workers() if worker is not holder]
    since = other.log_size()
    claimed = stack.events(checkout_id)[0][8]
    assert claimed == stack.clock.now() + LEASE
    steps = 7  # 2.38 leases: the first claim runs out at the third step
    for step in range(1, steps + 1):
        stack.clock.advance(RENEWAL_STEP)
        _renewed(stack, checkout_id)
        pid, summary = stack.round_now()
        assert pid != inside["pid"] and summary == "0 delivered, 0 failed, 0 dead", (step, pid, summary)
        assert len(stack.calls(reference)) == 1, f"delivered again at step {step}, while its receiver ran"
    assert stack.clock.now() > claimed + LEASE
    ticks = len(_RECEIVED.findall(other.log(since)))
    assert ticks >= steps, f"the other worker ran {ticks} deliver_outbox tasks:\n{stack.logs()[-4000:]}"
    (stack.markers / f"release-{reference}").touch()
    stack.wait(lambda: stack.fulfilments(reference), what="the order's fulfilment by the released call")
    calls, fulfilments, events = _settled(stack, reference, checkout_id)

    ((event_id, _kind, state, attempts, last_error, *_),) = events
    assert (state, attempts, last_error) == ("delivered", 1, None)
    assert [(call, event) for call, event, *_ in calls] == [(1, event_id)]
    ((_, fulfilled_by, _),) = fulfilments
    assert fulfilled_by == inside["pid"]
    report(
        f"receiver blocked while the clock moved {steps} renewal steps ({steps * RENEWAL_STEP:.1f} s, "
        f"{LEASE_SECONDS:.0f} s lease), renewed at each; the other worker ran {ticks} deliver_outbox tasks "
        "meanwhile: called once, fulfilled once"
    )
