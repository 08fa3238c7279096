"""The outbox (flask_gateway/payments/outbox.py): events for the shop's code, written with the change, delivered at
least once, each delivery with the same ``event_id``; dead after the last attempt, with a hook."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from flask_gateway import (
    Gateway,
    create_checkout,
    deliver_due,
    fulfilment_failed,
    payment_after_close,
    payment_confirmed,
    redeliver,
    refund,
    refund_succeeded,
)
from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import GatewayCheckout, OutboxEvent, OutboxState, RefundRecord
from flask_gateway.payments import outbox as outbox_module
from flask_gateway.payments.transitions import Observation, apply, send_pending
from flask_gateway.state import get_state
from flask_gateway.testing import SHOP_URL, GatewayEmulator
from tests.conftest import Databases
from tests.extension.conftest import make_shop, sample_order
from tests.extension.operations.cli_support import cli_runner
from tests.processes import WAIT_DEADLINE, wait_for

#: Small numbers so a test walks every state: retries after 10 s, then 20 s; dead after the third attempt.
OUTBOX = {"GATEWAY_OUTBOX_RETRY_SECONDS": 10, "GATEWAY_OUTBOX_MAX_ATTEMPTS": 3}


@pytest.fixture
def plugin_parts(databases: Databases, request: pytest.FixtureRequest) -> tuple[Flask, SQLAlchemy, Gateway]:
    """The shop of tests/extension (``make_shop``) with the outbox settings above (and ``param``'s)."""
    return make_shop(databases.url("main"), **{**OUTBOX, **getattr(request, "param", {})})


class Clock:
    """The outbox's clocks, standing still until the test moves them: the time it writes in the rows
    (leases, due times: ``utcnow``) and the one its heartbeat renews leases by (``monotonic``). However
    slow the machine, a lease runs out, or a renewal falls due, only when the test says."""

    def __init__(self) -> None:
        self.start = utcnow()
        self.ticks = time.monotonic()
        self.offset = timedelta()

    def __call__(self) -> datetime:
        return self.start + self.offset

    def monotonic(self) -> float:
        return self.ticks + self.offset.total_seconds()

    def advance(self, seconds: float) -> None:
        self.offset += timedelta(seconds=seconds)
        heartbeat = outbox_module._HEARTBEAT
        with heartbeat._wake:  # the heartbeat sleeps until its next renewal is due: it looks again now
            heartbeat._wake.notify_all()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    moved = Clock()
    monkeypatch.setattr(outbox_module, "utcnow", moved)
    monkeypatch.setattr(outbox_module, "monotonic", moved.monotonic)
    return moved


class Fulfilment:
    """A ``payment_confirmed`` receiver that raises its first ``failures`` calls, then fulfils."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.calls: list[int] = []  # the event_id of every call
        self.fulfilled: list[int] = []

    def __call__(
        self, sender: Any, checkout: GatewayCheckout, source: str, event_id: int, **extra: Any
    ) -> None:
        self.calls.append(event_id)
        if len(self.calls) <= self.failures:
            raise ConnectionError(f"the stock service is down (call {len(self.calls)})")
        if event_id not in self.fulfilled:  # the receiver's own idempotency: once per event_id
            self.fulfilled.append(event_id)


@pytest.fixture
def connected(gateway_app: Flask) -> Iterator[list[tuple[Any, Any]]]:
    """Receivers the test connects for this shop, disconnected at the end."""
    made: list[tuple[Any, Any]] = []
    yield made
    for blinker_signal, receiver in made:
        blinker_signal.disconnect(receiver)


def connect(connected: list[tuple[Any, Any]], app: Flask, signal: Any, receiver: Any) -> Any:
    signal.connect(receiver, sender=app, weak=False)
    connected.append((signal, receiver))
    return receiver


def new_checkout(app: Flask, reference: str = "ORD-1") -> GatewayCheckout:
    with app.test_request_context(base_url=SHOP_URL):
        return create_checkout(sample_order(reference))


def events(app: Flask) -> list[OutboxEvent]:
    with app.app_context():
        session = get_state().session
        found = list(session.scalars(select(OutboxEvent).order_by(OutboxEvent.id)))
        session.expunge_all()
        return found


def test_a_receiver_that_raises_twice_fulfils_once_on_the_third_delivery(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, connected: list[tuple[Any, Any]], clock: Clock
) -> None:
    fulfilment = connect(connected, gateway_app, payment_confirmed, Fulfilment(failures=2))
    checkout = new_checkout(gateway_app)
    gateway_emulator.pay(checkout.token)

    # The callback: the status is recorded and answered 200 although the receiver raised.
    assert gateway_emulator.deliver() == 1
    assert gateway_emulator.checkout(checkout.token)["status"]["lastCallbackAttemptStatusMessage"] == "OK"
    assert gateway_emulator.status(checkout.token) == "PAID"  # the callback was acknowledged
    [event] = events(gateway_app)
    assert (event.kind, event.state, event.attempts) == ("payment_confirmed", OutboxState.PENDING, 1)
    assert event.payload == {"source": "callback", "merchant_account_id": "demo-merchant"}
    assert "ConnectionError: the stock service is down (call 1)" in (event.last_error or "")
    assert fulfilment.fulfilled == []

    with gateway_app.app_context():
        assert deliver_due().delivered == 0  # not due yet
        clock.advance(11)
        report = deliver_due()
    assert (report.delivered, report.failed, report.dead) == (0, 1, 0)
    [event] = events(gateway_app)
    assert event.attempts == 2
    assert event.next_attempt_at == clock() + timedelta(seconds=20)  # twice as long

    with gateway_app.app_context():
        clock.advance(21)
        report = deliver_due()
        assert deliver_due().delivered == 0  # nothing left
    assert (report.delivered, report.failed) == (1, 0)
    assert fulfilment.fulfilled == [event.id]
    assert fulfilment.calls == [event.id] * 3  # every delivery of the event carries the same event_id
    [event] = events(gateway_app)
    assert (event.state, event.attempts, event.last_error) == (OutboxState.DELIVERED, 3, None)
    # The gateway's own retries change nothing: the callback is a duplicate, no new event.
    gateway_emulator.replay_callback(checkout.token)
    assert len(events(gateway_app)) == 1


@pytest.mark.backends
def test_a_receivers_error_with_u0000_is_kept_as_every_backend_stores_it(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, connected: list[tuple[Any, Any]]
) -> None:
    """The error of a receiver is the shop's text: U+0000 in it (which PostgreSQL refuses in text) is
    kept as U+FFFD in its row (the receiver's failure is recorded, the event delivered again later)."""

    def garbled(sender: Any, checkout: GatewayCheckout, **extra: Any) -> None:
        raise ValueError("the stock service answered \x00\x00")

    connect(connected, gateway_app, payment_confirmed, garbled)
    checkout = new_checkout(gateway_app)
    gateway_emulator.pay(checkout.token)

    assert gateway_emulator.deliver() == 1
    assert gateway_emulator.status(checkout.token) == "PAID"  # the callback was acknowledged
    [event] = events(gateway_app)
    assert (event.state, event.attempts) == (OutboxState.PENDING, 1)
    assert event.last_error == "ValueError: the stock service answered \ufffd\ufffd"


def test_deliver_every_delivers_what_falls_due_and_a_sigterm_lets_the_round_finish(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, connected: list[tuple[Any, Any]], clock: Clock
) -> None:
    """``flask gateway deliver --every``: a shop without a task queue keeps one process delivering. An
    event that falls due while it runs is delivered by a later round; SIGTERM during a round lets that
    round's receiver finish and its event be marked delivered, then the command stops (exit 0) and gives
    the process its own signal handlers back."""
    fulfilment = Fulfilment(failures=1)

    def fulfil_then_stop(sender: Any, **kwargs: Any) -> None:
        fulfilment(sender, **kwargs)
        if fulfilment.fulfilled:
            os.kill(os.getpid(), signal.SIGTERM)  # the service manager stops the service mid-round
            time.sleep(0.2)  # the receiver goes on after the signal: its work is not cut short

    connect(connected, gateway_app, payment_confirmed, fulfil_then_stop)
    checkout = new_checkout(gateway_app)
    gateway_emulator.pay(checkout.token)
    gateway_emulator.deliver()  # the at-once delivery raises: the event waits 10 s
    [event] = events(gateway_app)
    assert (event.state, event.attempts) == (OutboxState.PENDING, 1)
    threading.Timer(0.6, clock.advance, args=(11,)).start()  # it falls due while the loop runs
    before = signal.getsignal(signal.SIGTERM)

    result = gateway_app.test_cli_runner().invoke(args=["gateway", "deliver", "--every", "0.5"])

    assert result.exit_code == 0, result.output
    assert "Outbox: 1 delivered, 0 failed, 0 dead." in result.output
    assert result.output.rstrip().endswith("Stopped.")
    assert fulfilment.fulfilled == [event.id]
    [event] = events(gateway_app)
    assert (event.state, event.attempts) == (OutboxState.DELIVERED, 2)
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_receiver_cut_off_by_a_database_outage_logs_one_line_other_failures_their_traceback(
    gateway_emulator: GatewayEmulator,
    gateway_app: Flask,
    connected: list[tuple[Any, Any]],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """During a database restart every receiver that touches the database fails: one line each, with the
    driver's reason, not a traceback per event; a receiver's own bug keeps its traceback."""
    failures = [
        OperationalError("UPDATE orders ...", {}, Exception("server closed the connection unexpectedly")),
        KeyError("sku-42"),
    ]

    def receiver(sender: Any, **kwargs: Any) -> None:
        raise failures.pop(0)

    connect(connected, gateway_app, payment_confirmed, receiver)
    caplog.set_level(logging.WARNING, logger="flask_gateway.outbox")
    for reference in ("ORD-1", "ORD-2"):
        checkout = new_checkout(gateway_app, reference)
        gateway_emulator.pay(checkout.token)
        gateway_emulator.deliver()

    outage, bug = [r for r in caplog.records if "a receiver of payment_confirmed failed" in r.getMessage()]
    assert "the database is unreachable (Exception: server closed the connection unexpectedly)" in (
        outage.getMessage()
    )
    assert outage.exc_info is None and outage.levelno == logging.WARNING
    assert bug.exc_info is not None and bug.exc_info[0] is KeyError
    assert [event.attempts for event in events(gateway_app)] == [1, 1]  # both due again later


def test_dead_after_the_last_attempt_tells_the_shop_and_a_person_delivers_it_again(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, connected: list[tuple[Any, Any]], clock: Clock
) -> None:
    fulfilment = connect(connected, gateway_app, payment_confirmed, Fulfilment(failures=3))
    dead: list[dict[str, Any]] = []
    connect(connected, gateway_app, fulfilment_failed, lambda sender, **kwargs: dead.append(kwargs))
    checkout = new_checkout(gateway_app)
    gateway_emulator.pay(checkout.token)
    gateway_emulator.deliver()
    with gateway_app.app_context():
        clock.advance(11)
        deliver_due()
        clock.advance(21)
        report = deliver_due()
        clock.advance(3600)
        assert deliver_due().delivered == 0  # dead: never retried by itself
    assert (report.failed, report.dead) == (1, 1)
    [event] = events(gateway_app)
    assert (event.state, event.attempts) == (OutboxState.DEAD, 3)
    assert [(d["checkout"].id, d["event_id"]) for d in dead] == [(checkout.id, event.id)]
    assert "call 3" in dead[0]["error"]

    runner = cli_runner(gateway_app)  # stdout apart from the line saying what the command uses
    listed = runner.invoke(args=["gateway", "outbox"])
    assert f"#{event.id}  payment_confirmed" in listed.output and "dead" in listed.output
    assert "call 3" in listed.output
    # The receiver is fixed (its 4th call works): a person delivers the event again.
    again = runner.invoke(args=["gateway", "redeliver", str(event.id)])
    assert again.exit_code == 0, again.output
    assert fulfilment.fulfilled == [event.id]
    assert events(gateway_app)[0].state == OutboxState.DELIVERED
    assert runner.invoke(args=["gateway", "outbox"]).stdout.startswith("No outbox events")
    assert len(dead) == 1


@pytest.mark.parametrize("plugin_parts", [{"GATEWAY_OUTBOX_DELIVER_AT_ONCE": False}], indirect=True)
def test_without_delivery_at_once_the_deliver_command_delivers(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, connected: list[tuple[Any, Any]]
) -> None:
    fulfilment = connect(connected, gateway_app, payment_confirmed, Fulfilment(failures=0))
    checkout = new_checkout(gateway_app)
    gateway_emulator.pay(checkout.token)
    gateway_emulator.deliver()
    assert fulfilment.calls == []
    [event] = events(gateway_app)
    assert (event.state, event.claimed_until) == (OutboxState.PENDING, None)

    runner = gateway_app.test_cli_runner()
    first = runner.invoke(args=["gateway", "deliver"])
    assert first.exit_code == 0, first.output
    assert "Outbox: 1 delivered, 0 failed, 0 dead." in first.output
    assert "Waiting: 0." in first.output
    assert fulfilment.fulfilled == [event.id]
    second = runner.invoke(args=["gateway", "deliver"])
    assert "Outbox: 0 delivered" in second.output
    assert fulfilment.calls == [event.id]


def test_a_failed_delivery_makes_the_deliver_command_exit_1(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, connected: list[tuple[Any, Any]], clock: Clock
) -> None:
    connect(connected, gateway_app, payment_confirmed, Fulfilment(failures=2))
    checkout = new_checkout(gateway_app)
    gateway_emulator.pay(checkout.token)
    gateway_emulator.deliver()
    clock.advance(11)
    result = gateway_app.test_cli_runner().invoke(args=["gateway", "deliver"])
    assert result.exit_code == 1
    assert "Outbox: 0 delivered, 1 failed, 0 dead." in result.output
    assert "the stock service is down (call 2)" in result.output
    assert "Waiting: 1, the oldest written" in result.output


def test_a_refund_is_written_with_its_event_and_delivered_with_its_record(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, connected: list[tuple[Any, Any]]
) -> None:
    got: list[tuple[Any, int, int]] = []

    def on_refund(
        sender: Any, checkout: Any, refund: Any, amount_cents: int, event_id: int, **extra: Any
    ) -> None:
        got.append((refund, amount_cents, event_id))

    connect(connected, gateway_app, refund_succeeded, on_refund)
    checkout = new_checkout(gateway_app)
    gateway_emulator.pay(checkout.token)
    gateway_emulator.deliver()
    with gateway_app.test_request_context(base_url=SHOP_URL):
        record = refund(checkout, 15050, reason="one cracked mug")
    [confirmed, refunded] = events(gateway_app)
    assert (refunded.kind, refunded.state) == ("refund_succeeded", OutboxState.DELIVERED)
    assert refunded.payload == {
        "refund_id": record.id,
        "amount_cents": 15050,
        "merchant_account_id": "demo-merchant",
    }
    [(received, amount, event_id)] = got
    assert (isinstance(received, RefundRecord), received.id, amount, event_id) == (
        True,
        record.id,
        15050,
        refunded.id,
    )
    assert confirmed.kind == "payment_confirmed"


def test_a_payment_after_the_shop_cancelled_sends_payment_after_close(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, connected: list[tuple[Any, Any]]
) -> None:
    late: list[dict[str, Any]] = []
    connect(connected, gateway_app, payment_after_close, lambda sender, **kwargs: late.append(kwargs))
    checkout = new_checkout(gateway_app)
    with gateway_app.app_context():
        session = get_state().session
        apply(session, checkout.id, Observation(status="CANCELLED_BY_MERCHANT", source="admin"))
        apply(
            session, checkout.id, Observation(status="PAID", source="poll", total_cents=checkout.total_cents)
        )
    assert [(k["checkout"].id, k["before"], k["source"]) for k in late] == [
        (checkout.id, "CANCELLED_BY_MERCHANT", "poll")
    ]
    kinds = [event.kind for event in events(gateway_app)]
    assert kinds == ["checkout_cancelled", "payment_confirmed", "payment_after_close", "checkout_flagged"]


@pytest.mark.backends
@pytest.mark.parametrize("plugin_parts", [{"GATEWAY_OUTBOX_DELIVER_AT_ONCE": False}], indirect=True)
def test_concurrent_deliveries_deliver_each_event_once(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, connected: list[tuple[Any, Any]]
) -> None:
    fulfilment = connect(connected, gateway_app, payment_confirmed, Fulfilment(failures=0))
    for number in range(6):
        checkout = new_checkout(gateway_app, f"ORD-{number}")
        gateway_emulator.pay(checkout.token)
    assert gateway_emulator.deliver() == 6
    barrier = threading.Barrier(3)
    reports: list[Any] = []

    def run() -> None:
        with gateway_app.app_context():
            barrier.wait()
            reports.append(deliver_due(limit=2))
            reports.append(deliver_due())

    threads = [threading.Thread(target=run) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert sorted(fulfilment.calls) == sorted(event.id for event in events(gateway_app))
    assert len(set(fulfilment.calls)) == 6
    assert sum(report.delivered for report in reports) == 6
    assert {event.state for event in events(gateway_app)} == {OutboxState.DELIVERED}


def test_redeliver_refuses_an_unknown_event(gateway_app: Flask, gateway_emulator: GatewayEmulator) -> None:
    with gateway_app.app_context(), pytest.raises(LookupError, match="no outbox event 999"):
        redeliver(999)
    result = gateway_app.test_cli_runner().invoke(args=["gateway", "redeliver", "999"])
    assert result.exit_code == 1
    assert "no outbox event 999" in result.output


_TOKEN = re.compile(r'name="csrf_token" type="hidden" value="([^"]+)"')


def test_the_admin_outbox_screen_shows_what_waits_and_delivers_it_again(
    gateway_emulator: GatewayEmulator,
    gateway_app: Flask,
    plugin_parts: tuple[Flask, SQLAlchemy, Gateway],
    connected: list[tuple[Any, Any]],
    clock: Clock,
) -> None:
    client = gateway_app.test_client()
    assert client.get("/gateway/admin/outbox/").status_code == 403  # the admin guard holds here too
    plugin_parts[2].admin_guard(lambda: True)
    fulfilment = connect(connected, gateway_app, payment_confirmed, Fulfilment(failures=1))
    checkout = new_checkout(gateway_app)
    gateway_emulator.pay(checkout.token)
    gateway_emulator.deliver()
    [event] = events(gateway_app)

    page = client.get("/gateway/admin/outbox/")
    html = page.get_data(as_text=True)
    assert page.status_code == 200
    assert page.headers["X-Frame-Options"] == "DENY"
    assert 'data-outbox="unfulfilled">1<' in html
    assert 'data-outbox="retrying">1<' in html
    assert f'data-outbox-event="{event.id}" data-outbox-state="pending"' in html
    assert "Payment confirmed (fulfil the order)" in html
    assert "the stock service is down (call 1)" in html
    assert "ORD-1" in html
    assert 'href="/gateway/admin/outbox/"' in client.get("/gateway/admin/").get_data(as_text=True)

    action = f"/gateway/admin/outbox/{event.id}/deliver"
    assert client.post(action).status_code == 400  # no CSRF token
    assert fulfilment.calls == [event.id]
    token = _TOKEN.search(html)
    assert token is not None
    done = client.post(action, data={"csrf_token": token.group(1)}, follow_redirects=True)
    assert f"Event #{event.id} delivered." in done.get_data(as_text=True)
    assert fulfilment.fulfilled == [event.id]
    after = client.get("/gateway/admin/outbox/").get_data(as_text=True)
    assert 'data-outbox="unfulfilled">0<' in after
    assert "Nothing waits" in after
    delivered = client.get("/gateway/admin/outbox/?show=delivered").get_data(as_text=True)
    assert f'data-outbox-event="{event.id}" data-outbox-state="delivered"' in delivered
    for missing in (99999999999, 4242):  # past a 32-bit id (no database error), and an unknown one
        answer = client.post(f"/gateway/admin/outbox/{missing}/deliver", data={"csrf_token": token.group(1)})
        assert answer.status_code == 302
        assert (
            f"no outbox event {missing}"
            in client.get("/gateway/admin/outbox/").get_data(as_text=True).lower()
        )


# --- the lease: short, renewed while a delivery runs, free soon after a delivery died -------------------


class Blocking:
    """A ``payment_confirmed`` receiver whose first call waits, inside, until the test releases it (a slow
    receiver); a second call (the event delivered twice: the failure the tests look for) returns at once."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.release = threading.Event()
        self.calls: list[int] = []

    def __call__(self, sender: Any, checkout: GatewayCheckout, event_id: int, **extra: Any) -> None:
        self.calls.append(event_id)
        if len(self.calls) > 1:
            return
        self.inside.set()
        if not self.release.wait(WAIT_DEADLINE):
            raise TimeoutError("the test never released the receiver")


def claimed_until(app: Flask, event_id: int) -> datetime | None:
    with app.app_context():
        session = get_state().session
        value = session.scalar(select(OutboxEvent.claimed_until).where(OutboxEvent.id == event_id))
        session.rollback()
        return value


def paid(app: Flask, checkout: GatewayCheckout) -> None:
    """The payment learnt by a poll, its events delivered at once unless the shop turned that off."""
    with app.app_context():
        session = get_state().session
        apply(
            session, checkout.id, Observation(status="PAID", source="poll", total_cents=checkout.total_cents)
        )


@pytest.mark.backends
@pytest.mark.parametrize(
    "plugin_parts",
    [{"GATEWAY_OUTBOX_DELIVER_AT_ONCE": True}, {"GATEWAY_OUTBOX_DELIVER_AT_ONCE": False}],
    indirect=True,
    ids=["at-once", "deliver-due"],
)
def test_a_receiver_slower_than_the_lease_keeps_its_event(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, connected: list[tuple[Any, Any]], clock: Clock
) -> None:
    """The delivery renews its lease every third of it while the receiver runs. The clock is moved on a
    little more than a third of the lease at a time, to well past the first claim's end: after each step
    the heartbeat renews the lease from the new time, and ``deliver_due`` run by another worker never takes
    the event; the receiver runs once."""
    lease = outbox_module.CLAIM_LEASE
    step = lease * 0.34  # each step passes one renewal's due time (a third of the lease after the last)
    receiver = connect(connected, gateway_app, payment_confirmed, Blocking())
    checkout = new_checkout(gateway_app)
    at_once = gateway_app.config["GATEWAY_OUTBOX_DELIVER_AT_ONCE"]
    if not at_once:
        paid(gateway_app, checkout)  # written, waiting for deliver_due
    failures: list[BaseException] = []

    def first_delivery() -> None:
        try:
            if at_once:
                paid(gateway_app, checkout)  # the request that writes the event delivers it
            else:
                with gateway_app.app_context():
                    assert deliver_due().delivered == 1
        except BaseException as error:
            failures.append(error)

    worker = threading.Thread(target=first_delivery)
    worker.start()
    try:
        assert receiver.inside.wait(WAIT_DEADLINE), "the first delivery never reached the receiver"
        [event] = events(gateway_app)
        assert claimed_until(gateway_app, event.id) == clock() + lease  # claimed now, for a lease
        for number in range(1, 9):  # to 2.7 leases past the first claim, which ran out at the third step
            clock.advance(step.total_seconds())
            renewed = clock() + lease
            wait_for(
                lambda until=renewed: claimed_until(gateway_app, event.id) == until,
                what=f"renewal {number} of the lease, to {renewed} (the clock at {clock()})",
            )
            with gateway_app.app_context():
                assert deliver_due().delivered == 0, f"the event was taken at step {number}"
    finally:
        receiver.release.set()
        worker.join(WAIT_DEADLINE)
    assert not failures, failures
    assert receiver.calls == [event.id]
    [event] = events(gateway_app)
    assert (event.state, event.attempts, event.claimed_until) == (OutboxState.DELIVERED, 1, None)


@pytest.mark.backends
def test_an_event_whose_delivery_died_is_taken_over_once_the_lease_is_out(
    gateway_emulator: GatewayEmulator,
    gateway_app: Flask,
    connected: list[tuple[Any, Any]],
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The callback's worker is killed right after its commit: the event, claimed for the request's own
    delivery, is never delivered by it nor renewed. ``deliver_due`` leaves it alone to the end of the lease
    (10 s), then delivers it, once (with a beat tick every 5 s: within 15 s of the death)."""
    lease = outbox_module.CLAIM_LEASE
    assert timedelta(seconds=10) == lease
    fulfilment = connect(connected, gateway_app, payment_confirmed, Fulfilment(failures=0))
    monkeypatch.setattr(outbox_module, "deliver_now", lambda queued: None)  # the process died here
    checkout = new_checkout(gateway_app)
    gateway_emulator.pay(checkout.token)
    assert gateway_emulator.deliver() == 1
    [event] = events(gateway_app)
    assert event.state == OutboxState.PENDING and event.claimed_until == clock() + lease
    with gateway_app.app_context():
        assert deliver_due().delivered == 0  # still claimed: the request may be delivering it
        clock.advance(lease.total_seconds())
        assert deliver_due().delivered == 0  # to the lease's last instant
        clock.advance(0.001)
        assert deliver_due().delivered == 1  # the lease is out
        assert deliver_due().delivered == 0
    assert fulfilment.calls == [event.id]
    assert fulfilment.fulfilled == [event.id]
    [event] = events(gateway_app)
    assert (event.state, event.attempts, event.claimed_until) == (OutboxState.DELIVERED, 1, None)


def test_a_fast_receiver_costs_no_renewal(
    gateway_emulator: GatewayEmulator,
    gateway_app: Flask,
    connected: list[tuple[Any, Any]],
    clock: Clock,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Deliveries that end within a third of the lease make no database round trip for it; a slow one
    renews once per third of the lease it runs, the first time a third of the lease after it began. The
    clock moves only when the test (or the slow receiver, while it runs) moves it."""
    renewals: list[tuple[int, ...]] = []
    real = outbox_module._HEARTBEAT._renew

    def spy(due: list[Any]) -> None:
        renewals.append(tuple(event_id for hold in due for event_id in hold.ids))
        real(due)

    monkeypatch.setattr(outbox_module._HEARTBEAT, "_renew", spy)
    lease = outbox_module.CLAIM_LEASE.total_seconds()
    fulfilment = connect(connected, gateway_app, payment_confirmed, Fulfilment(failures=0))
    for number in range(5):
        checkout = new_checkout(gateway_app, f"ORD-{number}")
        gateway_emulator.pay(checkout.token)
        assert gateway_emulator.deliver() == 1
    assert len(fulfilment.fulfilled) == 5
    clock.advance(lease)  # a whole lease after the last delivery: a hold left behind would be renewed now
    problems: list[BaseException] = []

    def slow_receiver(sender: Any, checkout: GatewayCheckout, event_id: int, **extra: Any) -> None:
        try:
            clock.advance(0.3 * lease)  # not yet a third of the lease into the delivery: nothing due
            for number in (1, 2):  # past a third, then past two thirds: one renewal each
                clock.advance(0.34 * lease)
                wait_for(
                    lambda count=number: len(renewals) >= count, what=f"renewal {number} of the slow delivery"
                )
        except BaseException as error:
            problems.append(error)
            raise

    connect(connected, gateway_app, payment_confirmed, slow_receiver)
    checkout = new_checkout(gateway_app, "ORD-SLOW")
    gateway_emulator.pay(checkout.token)
    gateway_emulator.deliver()
    assert not problems, problems
    event_id = events(gateway_app)[-1].id
    assert renewals == [(event_id,), (event_id,)]
    assert events(gateway_app)[-1].state == OutboxState.DELIVERED


@pytest.mark.backends
def test_events_of_a_batch_delivered_late_are_taken_again_or_left_to_who_took_them(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, connected: list[tuple[Any, Any]], clock: Clock
) -> None:
    """Reconciliation commits a batch of changes, then delivers their events one change after another. An
    event it comes to after its lease ran out is taken again if nobody took it, and left alone if another
    delivery did: never delivered twice."""
    fulfilment = connect(connected, gateway_app, payment_confirmed, Fulfilment(failures=0))
    first, second = new_checkout(gateway_app, "ORD-1"), new_checkout(gateway_app, "ORD-2")
    with gateway_app.app_context():
        session = get_state().session
        batch = [
            apply(
                session,
                checkout.id,
                Observation(status="PAID", source="poll", total_cents=checkout.total_cents),
                commit=False,
            )
            for checkout in (first, second)
        ]
        commit_keeping_loaded(session)  # as reconciliation commits a batch
        clock.advance(11)  # the slow receivers of earlier changes ran meanwhile: both leases are out
        with gateway_app.app_context():  # another worker's deliver_due, meanwhile
            assert deliver_due(limit=1).delivered == 1
        taken = fulfilment.fulfilled[0]
        for transition in batch:
            send_pending(transition)
    [one, two] = events(gateway_app)
    assert sorted(fulfilment.calls) == [one.id, two.id], "each event delivered once"
    assert fulfilment.calls == [taken, ({one.id, two.id} - {taken}).pop()]
    assert {event.state for event in (one, two)} == {OutboxState.DELIVERED}
    assert (one.attempts, two.attempts) == (1, 1)
