"""The settings check runs by itself (issue 29, point 1): Celery beat, every ``reconcile``, ``flask gateway
check-settings``; at most once per ``GATEWAY_SETTINGS_CHECK_SECONDS`` whichever process runs it; the doctor
says when no schedule runs it.

The timeline: the attacker diverts the callback URL at t0 (a settings update signed through the sandbox's
``expectedSignature``, as anyone can); beat's next tick finds it and puts the shop's back at t1 <= t0 +
the interval; the gateway's settings are the shop's again.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select

from flask_gateway.config import GatewayConfig
from flask_gateway.core.timestamps import utcnow
from flask_gateway.errors import ConfigurationError
from flask_gateway.models import Installation, JobRun, SettingsIncident
from flask_gateway.operations import drift
from flask_gateway.operations.doctor import schedules
from flask_gateway.operations.doctor.schedules import check_background_work
from flask_gateway.operations.reconciliation import reconcile
from flask_gateway.payments.heartbeats import SETTINGS_CHECK, claim_turn, settings_check_status
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.extension.conftest import SHOP_URL, Harness, build_harness
from tests.extension.operations.test_drift import ATTACKER_URL, sandbox_signed_patch

#: The turn is one conditional UPDATE, the timeline compares stored times: both backends.
pytestmark = pytest.mark.backends

PERIOD = 60
OURS = f"{SHOP_URL}/gateway/callback"


@dataclass
class Clock:
    """The check's clock (``flask_gateway.operations.drift.utcnow``), moved by the test."""

    now: datetime

    def __call__(self) -> datetime:
        return self.now

    def at(self, moment: datetime) -> None:
        assert moment >= self.now, "time runs forward"
        self.now = moment


@pytest.fixture
def shop(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    built = build_harness(databases, monkeypatch, GATEWAY_SETTINGS_CHECK_SECONDS=PERIOD)
    built.install()
    yield built
    with built.shop.app_context():
        built.db.engine.dispose()


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    made = Clock(utcnow() + timedelta(seconds=1))
    monkeypatch.setattr(drift, "utcnow", made)
    return made


def gateway_callback_url(h: Harness) -> str:
    accounts = h.emulator.control("accounts", method="GET").json["accounts"]
    return str(accounts[0]["checkoutStatusCallbackUrl"])


def incidents(h: Harness) -> list[SettingsIncident]:
    with h.shop.app_context():
        session = get_state().session
        rows = list(session.scalars(select(SettingsIncident).order_by(SettingsIncident.id)))
        session.expunge_all()
        return rows


def job_row(h: Harness) -> JobRun | None:
    with h.shop.app_context():
        session = get_state().session
        row = session.get(JobRun, SETTINGS_CHECK)
        session.expunge_all()
        return row


def installed_at(h: Harness) -> datetime:
    with h.shop.app_context():
        value = get_state().session.scalar(select(Installation.installed_at))
        get_state().session.rollback()
    assert value is not None
    return value


# --- the timeline ----------------------------------------------------------------------------------------


def test_beat_finds_a_diverted_callback_url_and_puts_it_back_within_the_interval(
    shop: Harness, clock: Clock
) -> None:
    pytest.importorskip("celery")
    from celery import Celery

    from flask_gateway.tasks import CHECK_SETTINGS, celery_init_app, register_tasks

    # Beat sends the task every GATEWAY_SETTINGS_CHECK_SECONDS of the app.
    shop.shop.config["CELERY"] = {"broker_url": "memory://"}
    entry = celery_init_app(shop.shop).conf.beat_schedule["flask-gateway-check-settings"]
    assert (entry["task"], entry["schedule"]) == (CHECK_SETTINGS, float(PERIOD))
    task = register_tasks(Celery("beat-ticks", broker="memory://"), shop.shop).check_settings

    start = clock.now
    ticks = [start + timedelta(seconds=PERIOD * n) for n in range(1, 5)]
    clock.at(ticks[0])
    assert task.apply().get() == "Settings checked: demo-merchant: the shop's."
    assert incidents(shop) == []

    t0 = ticks[0] + timedelta(seconds=7)  # the attacker diverts the callbacks
    clock.at(t0)
    sandbox_signed_patch(shop, {"checkoutStatusCallbackUrl": ATTACKER_URL})
    assert gateway_callback_url(shop) == ATTACKER_URL

    # A reconcile run in between does not check again: the period is not over.
    clock.at(t0 + timedelta(seconds=20))
    with shop.shop.app_context():
        reconcile()
    assert gateway_callback_url(shop) == ATTACKER_URL and incidents(shop) == []

    clock.at(ticks[1])  # beat's next tick
    summary = task.apply().get()
    assert summary == "Settings checked: demo-merchant: differed (callback URL; put back callback URL).", (
        summary
    )

    (incident,) = incidents(shop)
    assert (incident.setting, incident.foreign_value, incident.our_value) == (
        "callback URL",
        ATTACKER_URL,
        OURS,
    )
    assert incident.outcome == "repaired" and incident.acknowledged_at is None
    t1 = incident.repaired_at
    assert t1 is not None and incident.found_at == ticks[1]
    assert t0 < t1 <= t0 + timedelta(seconds=PERIOD)  # found and put back within the interval
    assert gateway_callback_url(shop) == OURS  # the gateway's settings are the shop's again

    clock.at(ticks[2])  # the next tick finds them the shop's
    assert task.apply().get() == "Settings checked: demo-merchant: the shop's."
    assert len(incidents(shop)) == 1
    row = job_row(shop)
    assert row is not None and row.runs == 3 and row.failures == 0 and row.last_outcome == "ok"


def test_reconcile_runs_the_check_at_most_once_per_period(shop: Harness, clock: Clock) -> None:
    sandbox_signed_patch(shop, {"checkoutStatusCallbackUrl": ATTACKER_URL})
    with shop.shop.app_context():
        reconcile()  # right after installation: its comparison counts, and found the shop's
    assert job_row(shop) is None and gateway_callback_url(shop) == ATTACKER_URL

    start = installed_at(shop) + timedelta(seconds=PERIOD)
    clock.at(start)
    with shop.shop.app_context():
        reconcile()
    row = job_row(shop)
    assert row is not None and row.runs == 1
    assert gateway_callback_url(shop) == OURS  # found and put back by the run

    sandbox_signed_patch(shop, {"callbackFailuresEmail": "thief@evil.example"})
    for seconds in (1, 20, 45):  # several runs (several processes) within the period: none checks
        clock.at(start + timedelta(seconds=seconds))
        with shop.shop.app_context():
            reconcile()
    row = job_row(shop)
    assert row is not None and row.runs == 1
    assert [i.setting for i in incidents(shop)] == ["callback URL"]

    clock.at(start + timedelta(seconds=PERIOD))  # the next period: checked again, the e-mail put back
    with shop.shop.app_context():
        reconcile()
    row = job_row(shop)
    assert row is not None and row.runs == 2
    assert [i.setting for i in incidents(shop)] == ["callback URL", "failure e-mail"]


def test_the_command_checks_whenever_it_is_run(shop: Harness, clock: Clock) -> None:
    runner = shop.shop.test_cli_runner()
    for _ in range(2):  # by hand (or cron), twice within the period: two checks, both recorded
        result = runner.invoke(args=["gateway", "check-settings"])
        assert result.exit_code == 0, result.output
    row = job_row(shop)
    assert row is not None and row.runs == 2

    sandbox_signed_patch(shop, {"checkoutStatusCallbackUrl": ATTACKER_URL})
    result = runner.invoke(args=["gateway", "check-settings"])
    assert result.exit_code == 1  # something differed: cron mails the output
    assert f"callback URL: the shop has '{OURS}', the gateway '{ATTACKER_URL}'" in result.output
    assert "Put the shop's back: callback URL." in result.output
    assert gateway_callback_url(shop) == OURS
    again = runner.invoke(args=["gateway", "check-settings"])
    assert again.exit_code == 0 and "are the shop's" in again.output


def test_one_turn_per_period_among_processes_racing(shop: Harness) -> None:
    """Eight threads (each its app context and connection, as processes would be) ask for the turn at
    the same moment: exactly one gets it; the next period, one again."""
    now = utcnow()
    every = timedelta(seconds=PERIOD)
    barrier = threading.Barrier(8)
    taken: list[bool] = []
    lock = threading.Lock()

    def ask(at: datetime) -> None:
        with shop.shop.app_context():
            barrier.wait()
            mine = claim_turn(SETTINGS_CHECK, every, now=at)
            with lock:
                taken.append(mine)

    for moment in (now, now + timedelta(seconds=5), now + every):
        taken.clear()
        threads = [threading.Thread(target=ask, args=(moment,)) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        expected = 0 if moment == now + timedelta(seconds=5) else 1
        assert taken.count(True) == expected, (moment, taken)
    with shop.shop.app_context():
        assert claim_turn(SETTINGS_CHECK, every, now=now + timedelta(seconds=6), force=True)  # by hand


# --- the doctor --------------------------------------------------------------------------------------------


def settings_finding(h: Harness) -> Any:
    with h.shop.app_context():
        (finding,) = [f for f in check_background_work(None) if f.check == "settings-schedule"]  # type: ignore[arg-type]
    return finding


def age_installation(h: Harness, by: timedelta) -> None:
    """As if the gateway was installed (and its settings last compared) ``by`` longer ago."""
    with h.shop.app_context():
        session = get_state().session
        for row in session.scalars(select(Installation)):
            row.installed_at -= by
            if row.settings_checked_at is not None:
                row.settings_checked_at -= by
        session.commit()


def test_the_doctor_says_when_no_schedule_runs_the_check(shop: Harness) -> None:
    finding = settings_finding(shop)
    assert finding.level == "unknown" and "too soon to tell" in finding.message  # installed a moment ago

    age_installation(shop, timedelta(seconds=3 * PERIOD + 5))  # three periods without a check
    finding = settings_finding(shop)  # development: nothing was ever scheduled, production will need it
    assert finding.level == "info", finding
    assert "check-settings: never finished a run since the gateway was installed" in finding.message
    assert (
        "nothing has run it yet" in finding.message
        and "in production a schedule must run it" in finding.message
    )
    with (
        shop.shop.app_context(),
        pytest.MonkeyPatch.context() as patch,
    ):  # the same, the app saying production
        patch.setattr(schedules, "_in_production", lambda: True)
        (finding,) = [f for f in check_background_work(None) if f.check == "settings-schedule"]  # type: ignore[arg-type]
    assert finding.level == "problem", finding
    assert "check-settings: never finished a run since the gateway was installed" in finding.message
    assert "no schedule runs it" in finding.message
    assert "3 x GATEWAY_SETTINGS_CHECK_SECONDS" in finding.message
    assert "flask_gateway.check_settings" in finding.fix and "reconcile" in finding.fix

    with shop.shop.app_context():
        assert drift.scheduled_check().ran  # a schedule runs it: three periods since the last comparison
        status = settings_check_status()
    assert not status.overdue and status.last_outcome == "ok"
    finding = settings_finding(shop)
    assert finding.level == "ok" and finding.message.startswith("check-settings: last run finished")

    with shop.shop.app_context():  # it stopped: the last check is three periods old
        later = utcnow() + timedelta(seconds=3 * PERIOD + 5)
        assert settings_check_status(now=later).overdue


def test_the_doctor_command_prints_the_finding(shop: Harness) -> None:
    age_installation(shop, timedelta(hours=1))
    result = shop.shop.test_cli_runner().invoke(args=["gateway", "doctor", "--no-network"])
    output = " ".join(result.output.split())
    assert "[info] settings-schedule: check-settings: never finished a run" in output, result.output


# --- the setting --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [59, 86_401, "300", True, 300.0, None])
def test_the_period_is_a_whole_number_of_seconds_from_60_to_86400(value: object) -> None:
    with pytest.raises(ConfigurationError, match=r"GATEWAY_SETTINGS_CHECK_SECONDS=.*from 60 to 86400"):
        GatewayConfig.from_mapping({"GATEWAY_SETTINGS_CHECK_SECONDS": value})
    assert GatewayConfig.from_mapping({}).settings_check_seconds == 300  # a shop that sets nothing
    assert GatewayConfig.from_mapping({"GATEWAY_SETTINGS_CHECK_SECONDS": 60}).settings_check_seconds == 60


def test_a_check_that_fails_never_fails_the_reconcile_run(
    shop: Harness, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    fault = {"operation": "v1_configuration", "kind": "status", "status": 500}
    assert shop.emulator.control("faults", fault).status_code == 201  # the gateway cannot be asked
    clock.at(installed_at(shop) + timedelta(seconds=PERIOD))
    with shop.shop.app_context():
        report = reconcile()
    assert report.errors == [] and report.installed  # the run itself did its work
    row = job_row(shop)
    assert row is not None and row.last_outcome == "failed" and row.failures == 1
    assert row.last_summary is not None and "could not be checked" in row.last_summary
    assert any(
        r.name == "flask_gateway.drift" and "could not be checked" in r.getMessage() for r in caplog.records
    )
    with shop.shop.app_context():
        finding = [f for f in check_background_work(None) if f.check == "settings-schedule"]  # type: ignore[arg-type]
    assert finding[0].level == "warn" and "check-settings" in finding[0].fix
