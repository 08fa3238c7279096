"""What the scheduled settings check does with what it finds (issue 29, point 1): puts the shop's settings
back at once, records each finding, announces it (signal, WARNING); a repair undone again is an attack:
reported (signal, ERROR) and not repaired in a loop until a person acknowledges it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select

from flask_gateway import settings_drift_repaired, settings_under_attack
from flask_gateway.core.client import GatewayClient
from flask_gateway.core.errors import GatewayServerError
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import SettingsIncident
from flask_gateway.operations import drift
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.extension.conftest import SHOP_URL, Harness, build_harness
from tests.extension.operations.test_drift import ATTACKER_URL, sandbox_signed_patch
from tests.extension.operations.test_drift_schedule import Clock, gateway_callback_url

#: The turn is one conditional UPDATE, the timeline compares stored times: both backends.
pytestmark = pytest.mark.backends

PERIOD = 60
OURS = f"{SHOP_URL}/gateway/callback"
THIEF = "thief@evil.example"


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


class Heard:
    """The two signals' calls, for one app."""

    def __init__(self, app: Flask) -> None:
        self.repaired: list[dict[str, Any]] = []
        self.attacked: list[dict[str, Any]] = []
        self.app = app

        def on_repaired(sender: Flask, **kwargs: Any) -> None:
            self.repaired.append(kwargs)

        def on_attack(sender: Flask, **kwargs: Any) -> None:
            self.attacked.append(kwargs)

        self._receivers = (on_repaired, on_attack)
        settings_drift_repaired.connect(on_repaired, sender=app)
        settings_under_attack.connect(on_attack, sender=app)

    def close(self) -> None:
        settings_drift_repaired.disconnect(self._receivers[0], sender=self.app)
        settings_under_attack.disconnect(self._receivers[1], sender=self.app)


@pytest.fixture
def heard(shop: Harness) -> Iterator[Heard]:
    listening = Heard(shop.shop)
    yield listening
    listening.close()


def check(h: Harness) -> drift.DriftReport:
    """One scheduled check (forced: these tests are not about the period)."""
    with h.shop.app_context():
        result = drift.scheduled_check(force=True)
    assert result.ran
    (account,) = result.checks
    assert account.report is not None, account.error
    return account.report


def incidents(h: Harness) -> list[SettingsIncident]:
    with h.shop.app_context():
        session = get_state().session
        rows = list(session.scalars(select(SettingsIncident).order_by(SettingsIncident.id)))
        session.expunge_all()
        return rows


def gateway_account(h: Harness) -> dict[str, Any]:
    accounts: list[dict[str, Any]] = h.emulator.control("accounts", method="GET").json["accounts"]
    return accounts[0]


def test_every_diverted_setting_is_put_back_recorded_and_announced(
    shop: Harness, heard: Heard, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="flask_gateway.drift")
    sandbox_signed_patch(
        shop,
        {
            "checkoutStatusCallbackUrl": ATTACKER_URL,
            "callbackFailuresEmail": THIEF,
            "minimumCheckoutAmountCents": 1,
            "maximumCheckoutAmountCents": 99_000_000,
        },
    )

    report = check(shop)

    assert report.repaired == [
        "callback URL",
        "failure e-mail",
        "minimum amount (cents)",
        "maximum amount (cents)",
    ]
    assert report.under_attack == [] and report.repair_error is None
    account = gateway_account(shop)  # the gateway's settings are the shop's again, the e-mail removed
    assert account["checkoutStatusCallbackUrl"] == OURS
    assert account["callbackFailuresEmail"] is None
    assert (account["minimumCheckoutAmountCents"], account["maximumCheckoutAmountCents"]) == (100, 10_000_000)

    found = {i.setting: i for i in incidents(shop)}
    assert {s: (i.foreign_value, i.our_value) for s, i in found.items()} == {
        "callback URL": (ATTACKER_URL, OURS),
        "failure e-mail": (THIEF, None),
        "minimum amount (cents)": ("1", "100"),
        "maximum amount (cents)": ("99000000", "10000000"),
    }
    for incident in found.values():
        assert incident.outcome == "repaired" and incident.found_at == clock.now
        assert incident.repaired_at == clock.now and incident.acknowledged_at is None

    (call,) = heard.repaired  # one signal for the check, with every incident
    assert call["account"] == "demo-merchant"
    assert sorted(i.setting for i in call["incidents"]) == sorted(found)
    assert heard.attacked == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("were changed at the gateway and put back" in w and ATTACKER_URL in w for w in warnings)

    assert check(shop).ok  # the next check finds the shop's
    assert len(incidents(shop)) == 4 and len(heard.repaired) == 1


def test_a_repair_undone_again_is_an_attack_and_not_repaired_in_a_loop(
    shop: Harness, heard: Heard, clock: Clock, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.ERROR, logger="flask_gateway.drift")
    sandbox_signed_patch(shop, {"checkoutStatusCallbackUrl": ATTACKER_URL})
    assert check(shop).repaired == ["callback URL"]
    assert gateway_callback_url(shop) == OURS

    clock.at(clock.now + timedelta(seconds=PERIOD))
    sandbox_signed_patch(shop, {"checkoutStatusCallbackUrl": ATTACKER_URL + "/again"})  # fighting back
    report = check(shop)

    assert report.under_attack == ["callback URL"] and report.repaired == []
    assert "NOT put back, changed again after a repair" in report.summary()
    assert gateway_callback_url(shop) == ATTACKER_URL + "/again"  # left alone: no tug of war
    first, attack = incidents(shop)
    assert (first.outcome, attack.outcome) == ("repaired", "attack")
    assert attack.foreign_value == ATTACKER_URL + "/again" and attack.repaired_at is None
    (call,) = heard.attacked
    assert call["account"] == "demo-merchant" and [i.id for i in call["incidents"]] == [attack.id]
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "changed again after the shop put them back" in errors[0]

    for _ in range(3):  # later checks: still diverted, still not repaired, said once
        clock.at(clock.now + timedelta(seconds=PERIOD))
        assert check(shop).under_attack == ["callback URL"]
    assert gateway_callback_url(shop) == ATTACKER_URL + "/again"
    assert [i.outcome for i in incidents(shop)] == ["repaired", "attack"]
    assert incidents(shop)[1].last_seen_at == clock.now
    assert len(heard.attacked) == 1 and len(heard.repaired) == 1
    assert len([r for r in caplog.records if r.levelno == logging.ERROR]) == 1

    with shop.shop.app_context():  # a person acknowledges (the banner's button)
        assert drift.acknowledge_incidents("Thandi", [first.id, attack.id]) == 2
    clock.at(clock.now + timedelta(seconds=PERIOD))
    assert check(shop).repaired == ["callback URL"]  # the next check puts the shop's back
    assert gateway_callback_url(shop) == OURS
    assert [i.outcome for i in incidents(shop)] == ["repaired", "attack", "repaired"]
    assert incidents(shop)[0].acknowledged_by == "Thandi"


def test_a_setting_changed_again_long_after_an_acknowledged_repair_is_repaired(
    shop: Harness, heard: Heard, clock: Clock
) -> None:
    sandbox_signed_patch(shop, {"callbackFailuresEmail": THIEF})
    assert check(shop).repaired == ["failure e-mail"]
    with shop.shop.app_context():
        assert drift.acknowledge_incidents("owner") == 1

    clock.at(clock.now + timedelta(seconds=drift.ATTACK_PERIODS * PERIOD - 5))  # within the window: an attack
    sandbox_signed_patch(shop, {"callbackFailuresEmail": THIEF})
    assert check(shop).under_attack == ["failure e-mail"]
    with shop.shop.app_context():
        assert drift.acknowledge_incidents("owner") == 1
    assert check(shop).repaired == ["failure e-mail"]  # acknowledged: put back

    with shop.shop.app_context():
        assert drift.acknowledge_incidents("owner") == 1
    clock.at(clock.now + timedelta(seconds=drift.ATTACK_PERIODS * PERIOD + 1))  # past the window
    sandbox_signed_patch(shop, {"callbackFailuresEmail": THIEF})
    assert check(shop).repaired == ["failure e-mail"]  # a new incident, repaired, not an attack
    assert [i.outcome for i in incidents(shop)] == ["repaired", "attack", "repaired", "repaired"]
    assert gateway_account(shop)["callbackFailuresEmail"] is None


def test_a_refused_repair_is_recorded_and_tried_again_by_the_next_check(
    shop: Harness, heard: Heard, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = GatewayClient.update_settings

    def refuse_repairs(self: GatewayClient, request: Any) -> Any:
        if isinstance(request, drift._SettingsPatch):
            raise GatewayServerError("the gateway is busy", http_status=503)
        return real(self, request)

    monkeypatch.setattr(GatewayClient, "update_settings", refuse_repairs)
    sandbox_signed_patch(shop, {"checkoutStatusCallbackUrl": ATTACKER_URL})
    report = check(shop)
    assert report.repaired == [] and report.repair_error is not None
    assert "GatewayServerError" in report.repair_error and "The next check tries again." in report.summary()
    (incident,) = incidents(shop)
    assert incident.outcome == "repair-failed" and incident.repaired_at is None
    assert incident.detail is not None and "busy" in incident.detail
    assert gateway_callback_url(shop) == ATTACKER_URL
    (call,) = heard.repaired  # announced: the owner hears of the diversion even if the repair failed
    assert call["incidents"][0].outcome == "repair-failed"

    monkeypatch.setattr(GatewayClient, "update_settings", real)
    clock.at(clock.now + timedelta(seconds=PERIOD))
    assert check(shop).repaired == ["callback URL"]  # the same incident, repaired: not an attack
    (incident,) = incidents(shop)
    assert incident.outcome == "repaired" and incident.repaired_at == clock.now
    assert gateway_callback_url(shop) == OURS
    assert heard.attacked == []


def test_compare_only_changes_nothing_and_records_no_incident(shop: Harness, heard: Heard) -> None:
    sandbox_signed_patch(shop, {"checkoutStatusCallbackUrl": ATTACKER_URL})
    with shop.shop.app_context():
        report = drift.check_settings()  # the doctor's and the status page's comparison
    assert not report.ok and report.repaired == []
    assert gateway_callback_url(shop) == ATTACKER_URL
    assert incidents(shop) == [] and heard.repaired == []
    with shop.shop.app_context():  # the schedule then sees a comparison that found something: due at once
        result = drift.scheduled_check()
    assert result.ran and gateway_callback_url(shop) == OURS
