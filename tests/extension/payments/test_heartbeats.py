"""Heartbeats of the background work (flask_gateway/payments/heartbeats.py, issue 25): every deliver and reconcile
run records itself in ``gateway_job_runs``, whatever runs it; ``job_status`` says how long ago each job ran
and whether that is overdue; the doctor, the readiness answer and the status page report it; the doctor
says when the Celery broker does not answer."""

from __future__ import annotations

import logging
import os
import re
import signal
import socket
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select, text, update

from flask_gateway import create_checkout, deliver_due, payment_confirmed, reconcile
from flask_gateway.config import GatewayConfig
from flask_gateway.core.timestamps import utcnow
from flask_gateway.errors import ConfigurationError
from flask_gateway.models import GatewayBase, Installation, JobRun, OutboxEvent
from flask_gateway.operations.doctor import Options as DoctorOptions
from flask_gateway.operations.doctor import check_broker
from flask_gateway.operations.reconciliation import run as reconciliation_module
from flask_gateway.payments import heartbeats as heartbeats_module
from flask_gateway.payments.heartbeats import (
    JOBS,
    JobStatus,
    broker_unreachable,
    job_status,
    mask_url,
    record_run,
)
from flask_gateway.state import get_state
from flask_gateway.testing import SHOP_URL, GatewayEmulator
from tests.extension.conftest import sample_order
from tests.processes import free_port
from tests.redis_server import RedisServer, start_redis

pytestmark = pytest.mark.backends  # upserts, transactions of their own, the schema

DELIVER_SUMMARY = "0 delivered, 0 failed, 0 dead"


def rows(app: Flask) -> dict[str, JobRun]:
    with app.app_context():
        session = get_state().session
        found = {row.job: row for row in session.scalars(select(JobRun))}
        session.expunge_all()
        session.rollback()
        return found


def statuses(app: Flask, **kwargs: Any) -> dict[str, JobStatus]:
    with app.app_context():
        return {status.job: status for status in job_status(**kwargs)}


def backdate(app: Flask, job: str, by: timedelta) -> None:
    """Move every time of ``job``'s row ``by`` into the past (as if it last ran that long ago)."""
    with app.app_context():
        session = get_state().session
        row = session.get(JobRun, job)
        assert row is not None
        for column in ("last_started_at", "last_finished_at", "last_succeeded_at"):
            value = getattr(row, column)
            if value is not None:
                setattr(row, column, value - by)
        session.commit()


def installed_at(app: Flask) -> datetime:
    with app.app_context():
        value = get_state().session.scalar(select(Installation.installed_at))
        get_state().session.rollback()
    assert value is not None
    return value


def invoke(app: Flask, *args: str) -> Any:
    return app.test_cli_runner().invoke(args=["gateway", *args])


class Clock:
    """The heartbeats' clock (the time runs are recorded at and statuses computed for), standing still
    until the test moves it: an age or an "N min ago" is what the test made it, however slow the machine."""

    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    still = Clock()
    monkeypatch.setattr(heartbeats_module, "utcnow", still)
    return still


@pytest.fixture
def connected(gateway_app: Flask) -> Iterator[list[Any]]:
    made: list[Any] = []
    yield made
    for receiver in made:
        payment_confirmed.disconnect(receiver)


# --- recording -----------------------------------------------------------------------------------------


def test_a_function_call_records_each_run_in_one_row_per_job(
    gateway_emulator: GatewayEmulator, gateway_app: Flask
) -> None:
    assert rows(gateway_app) == {}
    with gateway_app.app_context():
        before = utcnow()
        deliver_due()
        deliver_due()
        reconcile()
        after = utcnow()

    found = rows(gateway_app)
    assert sorted(found) == ["deliver", "reconcile"]
    deliver = found["deliver"]
    assert (deliver.runs, deliver.failures, deliver.last_outcome) == (2, 0, "ok")
    assert deliver.last_summary == DELIVER_SUMMARY
    assert deliver.host == socket.gethostname() and deliver.pid == os.getpid()
    assert deliver.last_started_at is not None and deliver.last_finished_at is not None
    assert before <= deliver.last_started_at <= deliver.last_finished_at <= after
    assert deliver.last_succeeded_at == deliver.last_finished_at
    rec = found["reconcile"]
    assert (rec.runs, rec.failures, rec.last_outcome) == (1, 0, "ok")
    assert rec.last_summary is not None and rec.last_summary.startswith("Polled 0 of 0 due checkout(s)")
    assert "\n" not in rec.last_summary

    status = statuses(gateway_app)
    assert list(status) == list(JOBS)
    assert not status["deliver"].overdue and not status["reconcile"].overdue
    checked = status["deliver"].checked_at
    assert checked is not None and checked >= deliver.last_finished_at  # now, unless told otherwise
    assert status["deliver"].age == checked - deliver.last_finished_at
    later = statuses(gateway_app, now=deliver.last_finished_at + timedelta(seconds=42))["deliver"]
    assert later.age == timedelta(seconds=42) and later.checked_at == deliver.last_finished_at + later.age
    assert later.describe().startswith("deliver: last run finished 42 s ago")
    assert status["deliver"].describe().startswith("deliver: last run finished ")
    assert f"on {socket.gethostname()} (pid {os.getpid()}), ok ({DELIVER_SUMMARY})" in (
        status["deliver"].describe()
    )


def test_the_commands_record_their_runs(gateway_emulator: GatewayEmulator, gateway_app: Flask) -> None:
    deliver = invoke(gateway_app, "deliver")
    reconciled = invoke(gateway_app, "reconcile", "--quiet")

    assert deliver.exit_code == 0, deliver.output
    assert reconciled.exit_code == 0, reconciled.output
    found = rows(gateway_app)
    assert (found["deliver"].runs, found["deliver"].last_outcome) == (1, "ok")
    assert (found["reconcile"].runs, found["reconcile"].last_outcome) == (1, "ok")


def test_each_round_of_deliver_every_records_a_run(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flask_gateway.operations.cli import outbox as outbox_commands

    rounds: list[int] = []

    def counted(limit: int) -> Any:
        rounds.append(limit)
        if len(rounds) == 3:  # SIGTERM during the third round: it finishes, and no fourth starts
            os.kill(os.getpid(), signal.SIGTERM)
        return deliver_due(limit)

    monkeypatch.setattr(outbox_commands, "deliver_due", counted)
    result = invoke(gateway_app, "deliver", "--every", "0.5")

    assert result.exit_code == 0, result.output
    assert len(rounds) == 3
    assert rows(gateway_app)["deliver"].runs == 3  # one heartbeat per round, however slow the machine


def test_a_reconcile_run_is_visible_as_started_while_it_runs(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[JobStatus] = []
    real = reconciliation_module._reconcile_once

    def looking(*args: Any) -> Any:
        seen.append(statuses(gateway_app)["reconcile"])  # another connection looks meanwhile
        return real(*args)

    monkeypatch.setattr(reconciliation_module, "_reconcile_once", looking)
    with gateway_app.app_context():
        reconcile()

    [during] = seen
    assert during.running and during.last_finished_at is None and during.runs == 0
    assert "one started" in during.describe()
    after = statuses(gateway_app)["reconcile"]
    assert not after.running and after.runs == 1 and after.last_outcome == "ok"


def test_a_failed_run_is_recorded_as_failed_and_the_last_success_kept(
    gateway_emulator: GatewayEmulator,
    gateway_app: Flask,
    connected: list[Any],
    monkeypatch: pytest.MonkeyPatch,
    clock: Clock,
) -> None:
    with gateway_app.app_context():
        deliver_due()
    succeeded = rows(gateway_app)["deliver"].last_succeeded_at
    assert succeeded == clock()
    clock.advance(timedelta(minutes=4))

    def fulfil(sender: Any, **kwargs: Any) -> None:
        raise ConnectionError("the stock service is down")

    payment_confirmed.connect(fulfil, sender=gateway_app, weak=False)
    connected.append(fulfil)
    with gateway_app.test_request_context(base_url=SHOP_URL):
        checkout = create_checkout(sample_order())
    gateway_emulator.pay(checkout.token)
    gateway_emulator.deliver()  # the at-once delivery fails: the event is due again later...
    with gateway_app.app_context():  # ...now
        session = get_state().session
        session.execute(update(OutboxEvent).values(next_attempt_at=utcnow() - timedelta(seconds=1)))
        session.commit()

    result = invoke(gateway_app, "deliver")

    assert result.exit_code == 1, result.output
    deliver = rows(gateway_app)["deliver"]
    assert (deliver.runs, deliver.failures, deliver.last_outcome) == (2, 1, "failed")
    assert deliver.last_summary == "0 delivered, 1 failed, 0 dead"
    assert deliver.last_succeeded_at == succeeded
    status = statuses(gateway_app)["deliver"]
    assert not status.overdue  # a success within the bound (5 min): a warning, not yet overdue
    assert "failed (0 delivered, 1 failed, 0 dead); last success 4 min ago" in status.describe()

    # A run that raises: failed, with what it raised; the error reaches the caller unchanged.
    def broken(*args: Any) -> Any:
        raise RuntimeError("the gateway's client blew up\nsecond line")

    monkeypatch.setattr(reconciliation_module, "_reconcile_once", broken)
    with gateway_app.app_context(), pytest.raises(RuntimeError, match="blew up"):
        reconcile()
    rec = rows(gateway_app)["reconcile"]
    assert (rec.runs, rec.failures, rec.last_outcome) == (1, 1, "failed")
    assert rec.last_summary == "raised RuntimeError: the gateway's client blew up"
    assert rec.last_succeeded_at is None


def test_a_reconcile_with_the_gateway_not_installed_is_a_failed_run(gateway_app: Flask) -> None:
    with gateway_app.app_context():
        reconcile()
    rec = rows(gateway_app)["reconcile"]
    assert rec.last_outcome == "failed"
    assert rec.last_summary == "The gateway is not installed: nothing to reconcile."


def test_a_run_inside_a_run_of_the_same_job_records_once(
    gateway_emulator: GatewayEmulator, gateway_app: Flask
) -> None:
    with gateway_app.app_context(), record_run("deliver") as run:
        deliver_due(1)
        deliver_due(1)
        run.done("2 rounds")
    deliver = rows(gateway_app)["deliver"]
    assert (deliver.runs, deliver.last_summary) == (1, "2 rounds")
    with (
        gateway_app.app_context(),
        pytest.raises(ValueError, match="unknown job 'backup'"),
        record_run("backup"),
    ):
        pass


def test_a_summary_with_u0000_is_kept_in_one_line_as_every_backend_stores_it(
    gateway_emulator: GatewayEmulator, gateway_app: Flask
) -> None:
    """A run's summary is text of the job's (an error's message): U+0000, which PostgreSQL refuses in text,
    is kept as U+FFFD, on the one line of at most 500 characters."""
    with gateway_app.app_context(), record_run("deliver") as run:
        run.done("a\x00b\n" + "x" * 600)
    summary = rows(gateway_app)["deliver"].last_summary
    assert summary == ("a\ufffdb | " + "x" * 600)[:497] + "..."


def test_a_heartbeat_that_cannot_be_written_never_fails_the_job_and_warns_once(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, caplog: pytest.LogCaptureFixture
) -> None:
    with gateway_app.app_context():
        session = get_state().session
        session.execute(text("DROP TABLE gateway_job_runs"))
        session.commit()
        caplog.set_level(logging.WARNING, logger="flask_gateway.heartbeats")
        assert str(deliver_due()) == DELIVER_SUMMARY
        assert str(deliver_due()) == DELIVER_SUMMARY
        reconcile()
    warnings = [r.getMessage() for r in caplog.records if r.name == "flask_gateway.heartbeats"]
    assert len(warnings) == 2, warnings  # one per job, not one per run
    assert warnings[0].startswith("the heartbeat of deliver could not be recorded (")
    assert "run the migrations" in warnings[0]

    with gateway_app.app_context():  # the migrations ran: recorded again, and said once
        get_state().engine.dispose()
        GatewayBase.metadata.tables["gateway_job_runs"].create(get_state().engine)
        deliver_due()
    assert rows(gateway_app)["deliver"].runs == 1
    assert caplog.records[-1].getMessage() == "the heartbeat of deliver is recorded again"


# --- overdue ---------------------------------------------------------------------------------------------


def test_overdue_past_the_bound_and_cleared_by_a_new_run(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, clock: Clock
) -> None:
    installed = installed_at(gateway_app)
    early = statuses(gateway_app, now=installed + timedelta(seconds=299))
    assert not early["deliver"].overdue and early["deliver"].age is None  # too soon to tell
    never = statuses(gateway_app, now=installed + timedelta(seconds=301))
    assert never["deliver"].overdue  # never ran, installed longer than 300 s ago
    assert not never["reconcile"].overdue  # its bound is 1800 s
    assert never["deliver"].describe().startswith("deliver: never finished a run since the gateway was")
    assert (
        never["deliver"].describe().endswith(": overdue, the bound is 5 min (GATEWAY_DELIVER_STALE_SECONDS)")
    )

    with gateway_app.app_context():
        deliver_due()
    finished = rows(gateway_app)["deliver"].last_finished_at
    assert finished is not None
    fresh = statuses(gateway_app, now=finished + timedelta(seconds=300))
    assert not fresh["deliver"].overdue
    assert fresh["deliver"].age == timedelta(seconds=300)
    stale = statuses(gateway_app, now=finished + timedelta(seconds=301))
    assert stale["deliver"].overdue and stale["deliver"].bound == timedelta(seconds=300)

    backdate(gateway_app, "deliver", timedelta(seconds=301))  # it last ran 301 s ago
    assert statuses(gateway_app)["deliver"].overdue
    with gateway_app.app_context():  # the next run clears it
        deliver_due()
    assert not statuses(gateway_app)["deliver"].overdue
    clock.advance(timedelta(seconds=300))
    assert not statuses(gateway_app)["deliver"].overdue  # to the bound's last second
    clock.advance(timedelta(seconds=1))
    assert statuses(gateway_app)["deliver"].overdue


def test_runs_that_keep_failing_are_overdue_once_the_last_success_is_too_old(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    with gateway_app.app_context():
        reconcile()
    backdate(gateway_app, "reconcile", timedelta(hours=1))

    def broken(*args: Any) -> Any:
        raise ConnectionError("gateway unreachable")

    monkeypatch.setattr(reconciliation_module, "_reconcile_once", broken)
    with gateway_app.app_context(), pytest.raises(ConnectionError):
        reconcile()

    status = statuses(gateway_app)["reconcile"]
    assert status.age == timedelta(0)  # it runs (it just finished)...
    assert status.overdue  # ...but its last success is an hour old (bound: 30 minutes)
    assert (
        "failed (raised ConnectionError: gateway unreachable); last success 60 min ago" in status.describe()
    )


def test_the_bounds_are_configurable(gateway_emulator: GatewayEmulator, gateway_app: Flask) -> None:
    gateway_app.config.update(GATEWAY_DELIVER_STALE_SECONDS=60, GATEWAY_RECONCILE_STALE_SECONDS=7200)
    state = get_state(gateway_app)
    state.config = GatewayConfig.from_mapping(gateway_app.config)
    with gateway_app.app_context():
        deliver_due()
        reconcile()
    finished = rows(gateway_app)["deliver"].last_finished_at
    assert finished is not None
    later = statuses(gateway_app, now=finished + timedelta(seconds=61))
    assert later["deliver"].overdue and not later["reconcile"].overdue

    for bad in (5, "300", True):  # a clear error at start, never a surprise later
        with pytest.raises(ConfigurationError, match=r"GATEWAY_DELIVER_STALE_SECONDS=.*from 10 to 604800"):
            GatewayConfig.from_mapping({**gateway_app.config, "GATEWAY_DELIVER_STALE_SECONDS": bad})


# --- who reports it --------------------------------------------------------------------------------------


def test_doctor_says_when_a_job_stopped_and_how_to_fix_it(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, clock: Clock
) -> None:
    with gateway_app.app_context():
        deliver_due()
        reconcile()
    result = invoke(gateway_app, "doctor", "--no-network")
    assert "background-work: deliver: last run finished" in " ".join(result.output.split())

    backdate(gateway_app, "deliver", timedelta(minutes=10))
    result = invoke(gateway_app, "doctor", "--no-network")
    output = " ".join(result.output.split())
    assert result.exit_code == 1, result.output
    assert "[PROBLEM] background-work: deliver: last run finished 10 min ago on " in output
    assert "overdue, the bound is 5 min (GATEWAY_DELIVER_STALE_SECONDS): nothing runs it" in output
    assert "fix: schedule flask gateway deliver every minute" in output
    assert (
        "start the worker and beat (the task flask_gateway.deliver_outbox) and check their broker" in output
    )
    assert "docs/operations.md#is-the-background-work-running" in output
    assert "[PROBLEM] background-work: reconcile" not in output  # it ran a moment ago

    with gateway_app.app_context():  # it runs again: the problem is gone
        deliver_due()
    again = invoke(gateway_app, "doctor", "--no-network")
    assert "[PROBLEM] background-work" not in " ".join(again.output.split())


def check_broker_with(app: Flask, url: str) -> list[Any]:
    app.config["CELERY"] = {"broker_url": url}
    with app.app_context():
        return check_broker(DoctorOptions(timeout=2))


@pytest.fixture
def redis() -> Iterator[RedisServer]:
    server = start_redis()
    try:
        yield server
    finally:
        server.stop()


def test_doctor_says_when_the_broker_does_not_answer_without_its_password(
    gateway_app: Flask, redis: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    with gateway_app.app_context():
        assert [f.level for f in check_broker(DoctorOptions())] == ["ok"]  # no broker: nothing to check

    closed = f"redis://:s3cret-pass@127.0.0.1:{free_port()}/0"
    [finding] = check_broker_with(gateway_app, closed)
    assert finding.check == "broker" and finding.level == "problem"
    assert f"the Celery broker at redis://:***@127.0.0.1:{closed.rsplit(':', 1)[1]} does not answer" in (
        finding.message
    )
    assert "s3cret-pass" not in finding.message + finding.fix
    assert "start the broker" in finding.fix and "docs/operations.md#is-the-background-work-running" in (
        finding.fix
    )

    [finding] = check_broker_with(gateway_app, redis.url)
    assert (finding.level, finding.message) == ("ok", f"the Celery broker at {redis.url} answers")

    # Without kombu (Celery not installed here): a plain TCP connection tells.
    with monkeypatch.context() as without:
        without.setitem(sys.modules, "kombu", None)
        assert broker_unreachable(redis.url, timeout=2) is None
        assert broker_unreachable(closed, timeout=2) == "ConnectionRefusedError: Connection refused"

    redis.stop()  # the broker goes down
    [finding] = check_broker_with(gateway_app, redis.url)
    assert finding.level == "problem"


def test_mask_url_hides_only_the_password() -> None:
    assert mask_url("redis://:pw@host:6379/0") == "redis://:***@host:6379/0"
    assert mask_url("amqp://user:pw@host/vhost") == "amqp://user:***@host/vhost"
    assert mask_url("redis://host:6379/0") == "redis://host:6379/0"


def test_readiness_says_how_the_background_work_goes_and_never_fails_for_it(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, clock: Clock
) -> None:
    with gateway_app.app_context():
        deliver_due()
        reconcile()
    backdate(gateway_app, "reconcile", timedelta(hours=2))

    answer = gateway_app.test_client().get("/gateway/readyz")

    assert answer.status_code == 200
    background = answer.get_json()["background"]
    assert set(background) == {"deliver", "reconcile"}
    # Just the age and the verdict: no host, no summary (nothing to hide).
    assert background["deliver"] == {"age_seconds": 0.0, "overdue": False}
    assert background["reconcile"] == {"age_seconds": 7200.0, "overdue": True}


def test_the_status_page_shows_each_job_red_when_overdue(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, clock: Clock
) -> None:
    get_state(gateway_app).admin_guard.check = lambda: True
    with gateway_app.app_context():
        deliver_due()
        reconcile()
    page = gateway_app.test_client().get("/gateway/admin/").get_data(as_text=True)
    assert 'data-background-work="ok"' in page
    assert '<tr data-job="deliver" data-overdue="no">' in page
    assert DELIVER_SUMMARY in page and socket.gethostname() in page

    backdate(gateway_app, "deliver", timedelta(minutes=20))
    page = gateway_app.test_client().get("/gateway/admin/").get_data(as_text=True)
    assert 'data-background-work="overdue"' in page
    assert '<tr data-job="deliver" data-overdue="yes" class="error-text">' in page
    assert "20 minutes ago" in page and "<strong>overdue</strong> (more than 5 minutes)" in page
    assert "Schedule <code>flask gateway deliver</code> every minute" in page
    assert '<tr data-job="reconcile" data-overdue="no">' in page


def test_the_admins_deliver_what_is_due_now_records_a_run(
    gateway_emulator: GatewayEmulator, gateway_app: Flask
) -> None:
    get_state(gateway_app).admin_guard.check = lambda: True
    client = gateway_app.test_client()
    page = client.get("/gateway/admin/outbox/").get_data(as_text=True)
    token = re.search(r'name="csrf_token" type="hidden" value="([^"]+)"', page)
    assert token is not None

    answer = client.post("/gateway/admin/outbox/deliver-due", data={"csrf_token": token.group(1)})

    assert answer.status_code == 302
    deliver = rows(gateway_app)["deliver"]
    assert (deliver.runs, deliver.last_outcome, deliver.last_summary) == (1, "ok", DELIVER_SUMMARY)
