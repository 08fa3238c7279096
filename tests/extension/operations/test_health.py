"""Callback health: confirmations by path, refused callbacks, paid checkouts awaiting their callback, and
``callbacks_silent`` once per silent spell (flask_gateway.operations.health); the status page's panel."""

from __future__ import annotations

import dataclasses
import logging
import re
from datetime import timedelta

import pytest
from sqlalchemy import select

from flask_gateway import callbacks_silent, check_callback_health, reconcile
from flask_gateway.config import GatewayConfig
from flask_gateway.core.timestamps import utcnow
from flask_gateway.errors import ConfigurationError
from flask_gateway.models import CallbackLog, GatewayCheckout
from flask_gateway.operations.health import CallbackHealth, callback_health, describe_age
from flask_gateway.payments.polling import refresh
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.extension.conftest import ACCOUNT, Harness, make_shop, sample_order
from tests.extension.inbound.inbound_support import return_path
from tests.extension.operations.operations_support import load, new_checkout, recording

ADMIN = "/gateway/admin"


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


def paid(harness: Harness, reference: str) -> tuple[int, str]:
    """A checkout the shopper paid at the gateway; the shop has heard nothing yet."""
    checkout_id, token = new_checkout(harness, sample_order(reference))
    assert harness.emulator.pay(token).status_code == 200
    return checkout_id, token


def come_back(harness: Harness, checkout_id: int) -> None:
    """The shopper comes back from the gateway: the return page asks getstatus."""
    assert harness.client.get(return_path(harness, checkout_id, "confirm")).status_code == 303


def deliver(harness: Harness) -> None:
    assert harness.emulator.control("deliver").status_code == 200


def fail_callbacks(harness: Harness, count: int = 100) -> None:
    harness.emulator.control("faults", {"operation": "callback", "kind": "callback_fail", "count": count})


def health(harness: Harness, **options) -> CallbackHealth:
    with harness.shop.app_context():
        return callback_health(**options)


def check(harness: Harness, **options) -> CallbackHealth:
    with harness.shop.app_context():
        return check_callback_health(**options)


def forge_callback(harness: Harness, token: str) -> None:
    forged = harness.client.post(
        "/gateway/callback",
        data=b'{"checkoutToken":"%s"}' % token.encode(),
        headers={
            "Content-Type": "application/json",
            "X-Signature": "bm9wZQ==",
            "X-Merchant-Account-ID": ACCOUNT,
        },
    )
    assert forged.status_code == 401


def silence_after(harness: Harness, *, payments: int, minutes: int = 30) -> None:
    state = get_state(harness.shop)
    state.config = dataclasses.replace(
        state.config, callback_silence_payments=payments, callback_silence_minutes=minutes
    )


def time_passes(harness: Harness, minutes: int) -> None:
    """Everything the shop recorded so far happened ``minutes`` earlier (callbacks, payments, events)."""
    earlier = timedelta(minutes=minutes)
    with harness.shop.app_context():
        session = get_state().session
        for log in session.scalars(select(CallbackLog)):
            log.received_at -= earlier
        for checkout in session.scalars(select(GatewayCheckout)):
            for name in ("created_at", "updated_at", "paid_at", "payment_confirmed_at", "last_callback_at"):
                if getattr(checkout, name) is not None:
                    setattr(checkout, name, getattr(checkout, name) - earlier)
            for event in checkout.events:
                event.at -= earlier
        session.commit()


# --- the figures ---------------------------------------------------------------------------------------


@pytest.mark.backends
def test_each_payment_is_counted_once_by_the_path_that_confirmed_it(installed: Harness):
    by_callback, by_callback_token = paid(installed, "ORD-CB")
    deliver(installed)  # the callback confirms it
    by_return, _ = paid(installed, "ORD-RET")
    come_back(installed, by_return)  # the shopper's return confirms it first...
    deliver(installed)  # ...and its callback, PAID_PENDING_CALLBACK -> PAID, confirms nothing again
    fail_callbacks(installed)
    by_reconcile, _ = paid(installed, "ORD-REC")
    deliver(installed)  # fails: the shop never hears of it
    with installed.shop.app_context():
        report = reconcile(older_than_seconds=0)
        assert report.confirmed == 1
        statuses = {i: load(installed, i).status for i in (by_callback, by_return, by_reconcile)}
        waiting_paid_at = load(installed, by_reconcile).paid_at
    assert statuses == {by_callback: "PAID", by_return: "PAID", by_reconcile: "PAID_PENDING_CALLBACK"}

    figures = health(installed)

    assert figures.confirmations == {"callback": 1, "return": 1, "reconcile": 1}
    assert figures.confirmed == 3
    assert [(s.path, s.count, round(s.share, 3)) for s in figures.shares] == [
        ("callback", 1, 0.333),
        ("return", 1, 0.333),
        ("reconcile", 1, 0.333),
    ]
    # The return page's checkout got its callback (PAID); the reconciled one is still waiting for its own.
    assert figures.awaiting_callback == 1
    assert figures.oldest_awaiting_paid_at == waiting_paid_at
    assert figures.callbacks == {"accepted": 2}
    assert figures.refused == 0
    assert figures.last_callback_outcome == "accepted"
    assert figures.last_callback_at is not None
    assert not figures.silent

    forge_callback(installed, by_callback_token)
    after = health(installed)
    assert after.refused == 1
    assert after.callbacks == {"accepted": 2, "rejected-signature": 1}
    assert after.last_callback_at == figures.last_callback_at  # a refused callback proves nothing
    assert (
        "3 payment(s) confirmed (callback 1, return 1, reconcile 1), 1 callback(s) refused" in after.summary()
    )
    assert "1 paid checkout(s) awaiting the gateway's callback, the oldest paid" in after.summary()

    # Two days on, the day's figures are empty; the checkout still waiting is two days old.
    later = health(installed, now=utcnow() + timedelta(days=2))
    assert (later.confirmations, later.callbacks, later.refused) == ({}, {}, 0)
    assert later.awaiting_callback == 1
    assert later.oldest_awaiting_age is not None and later.oldest_awaiting_age >= timedelta(days=2)


def test_checkouts_never_paid_count_nowhere(installed: Harness):
    new_checkout(installed, sample_order("ORD-OPEN"))
    _, cancelled_token = new_checkout(installed, sample_order("ORD-CANCEL"))
    installed.emulator.consumer_cancel(cancelled_token)
    deliver(installed)
    figures = health(installed)
    assert figures.confirmations == {}
    assert figures.awaiting_callback == 0
    assert figures.oldest_awaiting_age is None


def test_ages_are_told_in_the_largest_whole_unit():
    assert describe_age(timedelta(seconds=1)) == "1 second"
    assert describe_age(timedelta(seconds=59)) == "59 seconds"
    assert describe_age(timedelta(minutes=1, seconds=59)) == "1 minute"
    assert describe_age(timedelta(hours=5, minutes=59)) == "5 hours"
    assert describe_age(timedelta(days=3, hours=23)) == "3 days"
    assert describe_age(timedelta(seconds=-5)) == "0 seconds"


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("GATEWAY_CALLBACK_SILENCE_MINUTES", 0),
        ("GATEWAY_CALLBACK_SILENCE_MINUTES", "30"),
        ("GATEWAY_CALLBACK_SILENCE_MINUTES", True),
        ("GATEWAY_CALLBACK_SILENCE_PAYMENTS", 0),
        ("GATEWAY_CALLBACK_SILENCE_PAYMENTS", 1.5),
    ],
)
def test_the_silence_thresholds_are_checked(key, value):
    with pytest.raises(ConfigurationError, match=key):
        GatewayConfig.from_mapping({key: value})
    config = GatewayConfig.from_mapping({})
    assert (config.callback_silence_minutes, config.callback_silence_payments) == (30, 3)


# --- silence ---------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_silence_while_payments_continue_is_announced_once_per_spell(
    installed: Harness, caplog: pytest.LogCaptureFixture
):
    silence_after(installed, payments=2)
    fail_callbacks(installed)  # every callback fails: only the shoppers' returns tell the shop
    first, _ = paid(installed, "ORD-1")
    come_back(installed, first)
    assert not check(installed).silent  # one payment without a callback: a quiet spell, not a silence

    second, _ = paid(installed, "ORD-2")
    come_back(installed, second)
    caplog.set_level(logging.INFO, logger="flask_gateway.health")
    with recording(callbacks_silent) as sent:
        figures = check(installed)
        again = check(installed)  # the same spell: no second signal, no second warning
    assert figures.silence is not None and again.silent
    assert (figures.silence.payments, figures.silence.last_callback_at) == (2, None)
    assert len(sent) == 1
    call = sent.calls[0]
    assert call["sender"] is installed.shop
    assert (call["payments"], call["last_callback_at"]) == (2, None)
    assert call["health"].confirmations == {"return": 2}
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert (
        "Gateway callbacks are silent: no verified callback has ever reached the shop" in warnings[0].message
    )
    assert "2 payment(s) were confirmed another way in the last 30 minutes" in warnings[0].message
    assert any("still silent" in r.message for r in caplog.records if r.levelno == logging.INFO)
    assert figures.summary().startswith("Gateway callbacks are silent")

    # The callbacks come back: the spell is over.
    installed.emulator.control("faults", method="DELETE")
    installed.emulator.advance(3600)  # the gateway retries what it could not deliver
    deliver(installed)
    with recording(callbacks_silent) as resumed:
        assert not check(installed).silent
    assert len(resumed) == 0

    # An hour later they went silent again, with payments still coming in: a new spell, a new warning.
    time_passes(installed, 60)
    fail_callbacks(installed)
    for reference in ("ORD-3", "ORD-4"):
        checkout_id, _ = paid(installed, reference)
        come_back(installed, checkout_id)
    with recording(callbacks_silent) as next_spell:
        figures = check(installed)
        check(installed)
    assert len(next_spell) == 1
    assert figures.silence is not None and figures.silence.last_callback_at is not None
    assert figures.silence.payments == 2  # ORD-3 and ORD-4: ORD-1 and ORD-2 were an hour ago
    assert next_spell.calls[0]["last_callback_at"] == figures.silence.last_callback_at


@pytest.mark.backends
def test_a_payment_confirmed_by_its_callback_breaks_no_silence_rule(installed: Harness):
    """Payments whose callbacks arrive are never a silence, however many."""
    silence_after(installed, payments=1)
    for reference in ("ORD-1", "ORD-2"):
        paid(installed, reference)
        deliver(installed)
    with recording(callbacks_silent) as sent:
        figures = check(installed)
    assert figures.confirmations == {"callback": 2}
    assert not figures.silent and len(sent) == 0
    # Half an hour without a callback, and no payment either: quiet, not silent.
    assert not check(installed, now=utcnow() + timedelta(minutes=31)).silent


@pytest.mark.backends
def test_another_worker_does_not_warn_about_the_same_spell(installed: Harness, databases: Databases):
    silence_after(installed, payments=1)
    fail_callbacks(installed)
    checkout_id, _ = paid(installed, "ORD-1")
    come_back(installed, checkout_id)
    other, _db, _gateway = make_shop(databases.url("main"))  # a second worker on the same database
    other.extensions["gateway"].config = dataclasses.replace(
        other.extensions["gateway"].config, callback_silence_payments=1
    )
    try:
        with recording(callbacks_silent) as sent:
            assert check(installed).silent
            with other.app_context():
                assert check_callback_health().silent
        assert [call["sender"] for call in sent.calls] == [installed.shop]
    finally:
        with other.app_context():
            get_state().dispose()
            _db.engine.dispose()


def test_a_failing_memory_warns_again_rather_than_never(installed: Harness, monkeypatch: pytest.MonkeyPatch):
    from flask_gateway.operations import health as module

    def broken(uri):
        raise ConnectionError("the storage is down")

    monkeypatch.setattr(module, "make_storage", broken)
    monkeypatch.setattr(module, "_STORAGES", type(module._STORAGES)())
    silence_after(installed, payments=1)
    fail_callbacks(installed)
    checkout_id, _ = paid(installed, "ORD-1")
    come_back(installed, checkout_id)
    with recording(callbacks_silent) as sent:
        check(installed)
        check(installed)
    assert len(sent) == 2


def test_a_failing_storage_is_one_warning_per_spell_without_a_traceback(
    installed: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    """The spell memory's storage failing at every check (Redis down) logs one WARNING, not a traceback per
    check, and one line when it works again: the same watch as the rate limits built on that storage."""
    from limits.storage import MemoryStorage

    from flask_gateway.operations import health as module

    class Flaky(MemoryStorage):
        down = True

        def incr(self, key: str, expiry: int, amount: int = 1) -> int:  # type: ignore[override]
            if self.down:
                raise ConnectionError("Error 111 connecting to redis:6379. Connection refused.")
            return super().incr(key, expiry, amount)

    storage = Flaky()
    monkeypatch.setattr(module, "make_storage", lambda uri: storage)
    monkeypatch.setattr(module, "_STORAGES", type(module._STORAGES)())
    silence_after(installed, payments=1)
    fail_callbacks(installed)
    checkout_id, _ = paid(installed, "ORD-1")
    come_back(installed, checkout_id)
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.INFO, logger="flask_gateway.ratelimit")  # its traceback comes only at DEBUG
    with recording(callbacks_silent) as sent:
        for _ in range(3):
            check(installed)
        storage.down = False
        check(installed)
    assert len(sent) == 4  # warned again rather than never while the memory failed
    loud = [r for r in caplog.records if r.levelno >= logging.WARNING and "storage" in r.getMessage()]
    assert len(loud) == 2, [r.getMessage() for r in loud]
    assert "fails" in loud[0].getMessage() and "works again" in loud[1].getMessage()
    assert not [r for r in caplog.records if r.exc_info]


# --- the status page ---------------------------------------------------------------------------------


def visible(html: str) -> str:
    return " ".join(re.sub(r"<[^>]+>", " ", html).split())


def test_the_status_page_shows_the_callback_health(installed: Harness):
    installed.gateway.admin_guard(lambda: True)
    first, token = paid(installed, "ORD-1")
    come_back(installed, first)
    deliver(installed)
    second, _ = paid(installed, "ORD-2")
    deliver(installed)
    forge_callback(installed, token)
    fail_callbacks(installed)
    third, _ = paid(installed, "ORD-3")
    come_back(installed, third)  # its callback fails: it waits for it

    html = installed.client.get(f"{ADMIN}/").get_data(as_text=True)
    shown = visible(html)

    assert 'data-callback-health="ok"' in html
    assert "Callback health" in shown
    assert re.search(
        r"Last callback from the gateway \d+ seconds? ago \(\d{4}-\d\d-\d\d [\d:]+ UTC, Recorded\)", shown
    )
    assert 'data-refused-callbacks="1"' in html
    assert f'href="{ADMIN}/callbacks?refused=1"' in html
    assert "1 refused or unanswered" in shown
    assert 'data-awaiting-callback="1"' in html
    assert f'href="{ADMIN}/checkouts?status=PAID_PENDING_CALLBACK"' in html
    assert re.search(r"1 checkout ; the oldest was paid \d+ seconds? ago", shown)
    rows = re.findall(
        r'<tr data-path="(\w+)"><td>([^<]+)</td><td class="num">(\d+)</td><td class="num">(\d+)%</td>', html
    )
    assert rows == [("callback", "Gateway callback", "1", "33"), ("return", "Shopper came back", "2", "67")]
    assert "data-callbacks-silent" not in html
    with installed.shop.app_context():
        assert (
            get_state().session.scalar(select(GatewayCheckout.status).where(GatewayCheckout.id == second))
            == "PAID"
        )


def test_the_status_page_warns_when_callbacks_went_silent_and_signals_once(installed: Harness):
    installed.gateway.admin_guard(lambda: True)
    silence_after(installed, payments=2, minutes=45)
    paid(installed, "ORD-0")
    deliver(installed)
    time_passes(installed, 50)
    fail_callbacks(installed)
    for reference in ("ORD-1", "ORD-2"):
        checkout_id, _ = paid(installed, reference)
        come_back(installed, checkout_id)

    with recording(callbacks_silent) as sent:
        pages = [installed.client.get(f"{ADMIN}/").get_data(as_text=True) for _ in range(2)]
    assert len(sent) == 1
    html = pages[1]
    assert 'data-callback-health="silent"' in html
    assert 'class="panel panel-error"' in html
    shown = visible(html)
    assert (
        "The gateway's callbacks are not reaching the shop: none has arrived for 50 minutes, while 2 payments "
        "were confirmed another way in the last 45 minutes."
    ) in shown
    assert "check the callback URL above" in shown


def test_the_panel_needs_an_installation(harness: Harness):
    harness.gateway.admin_guard(lambda: True)
    html = harness.client.get(f"{ADMIN}/").get_data(as_text=True)
    assert "Not installed" in html and "Callback health" not in html


def test_each_reconcile_run_looks_for_silent_callbacks(installed: Harness):
    """``reconcile`` runs the check: a shop whose callbacks stopped hears of it within one schedule, and a
    failing check never fails the run."""
    silence_after(installed, payments=2)
    fail_callbacks(installed)
    for reference in ("ORD-1", "ORD-2"):
        checkout_id, _ = paid(installed, reference)
        come_back(installed, checkout_id)
    with recording(callbacks_silent) as sent, installed.shop.app_context():
        reconcile()
        reconcile()  # the same spell: once
    assert len(sent) == 1


def test_a_failing_health_check_leaves_the_reconcile_run_done(
    installed: Harness, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
):
    from flask_gateway.operations.reconciliation import run

    def broken() -> None:
        raise RuntimeError("the health check broke")

    monkeypatch.setattr(run, "check_callback_health", broken)
    with installed.shop.app_context():
        report = reconcile()
    assert report.finished_at is not None and not report.errors
    assert "the callback health check failed" in caplog.text


# --- a callback lost for good ----------------------------------------------------------------------------


def everything_earlier(harness: Harness, earlier: timedelta) -> None:
    """All the shop recorded happened ``earlier`` (the polls too: the checkouts are due again)."""
    time_passes(harness, int(earlier.total_seconds() // 60))
    with harness.shop.app_context():
        session = get_state().session
        for checkout in session.scalars(select(GatewayCheckout)):
            if checkout.last_polled_at is not None:
                checkout.last_polled_at -= earlier
        session.commit()


@pytest.mark.backends
def test_a_callback_lost_for_good_stops_awaiting_once_the_gateway_confirms_after_its_attempts(
    installed: Harness,
):
    installed.gateway.admin_guard(lambda: True)
    fail_callbacks(installed)
    lost, _ = paid(installed, "ORD-LOST")
    for _ in range(3):
        deliver(installed)  # every attempt fails: the gateway gives up (its dead letters)
    with installed.shop.app_context():
        assert reconcile(older_than_seconds=0).confirmed == 1  # confirmed by reconciliation
        assert load(installed, lost).status == "PAID_PENDING_CALLBACK"
    assert (health(installed).awaiting_callback, health(installed).callback_never_came) == (1, 0)

    # Asked again within the hour: the gateway's attempts may not be over; still awaiting its callback.
    everything_earlier(installed, timedelta(minutes=10))
    with installed.shop.app_context():
        assert reconcile(older_than_seconds=0).polled == 1
    assert (health(installed).awaiting_callback, health(installed).callback_never_came) == (1, 0)

    # Two hours on, before anything asks the gateway again: overdue (the alert's figure is the age).
    everything_earlier(installed, timedelta(hours=2))
    overdue = health(installed)
    assert overdue.awaiting_callback == 1
    assert overdue.oldest_awaiting_age is not None and overdue.oldest_awaiting_age > timedelta(hours=2)

    # Reconciliation asks: the gateway still says PAID_PENDING_CALLBACK, more than an hour after the
    # payment. Its callback will never come; the payment is confirmed with it. Not awaiting any more.
    with installed.shop.app_context():
        report = reconcile(older_than_seconds=0)
        assert (report.polled, report.statuses) == (1, {"PAID_PENDING_CALLBACK": 1})
        assert load(installed, lost).status == "PAID_PENDING_CALLBACK"  # what the gateway says
    cleared = health(installed)
    assert (cleared.awaiting_callback, cleared.oldest_awaiting_age) == (0, None)
    assert cleared.callback_never_came == 1
    assert "0 paid checkout(s) awaiting the gateway's callback; 1 paid in the last 1 day got no callback" in (
        cleared.summary()
    )
    html = installed.client.get(f"{ADMIN}/").get_data(as_text=True)
    assert 'data-awaiting-callback="0"' in html and 'data-callback-never-came="1"' in html
    # A day later it has left the window's figure, and still awaits nothing.
    later = health(installed, now=utcnow() + timedelta(days=1))
    assert (later.awaiting_callback, later.callback_never_came) == (0, 0)


@pytest.mark.backends
def test_a_status_check_after_the_attempts_clears_it_too_and_a_waiting_one_stays(installed: Harness):
    fail_callbacks(installed)
    lost, _ = paid(installed, "ORD-LOST")
    deliver(installed)
    come_back(installed, lost)  # the shopper's return confirms it (source "return")
    everything_earlier(installed, timedelta(hours=3))
    fresh, _ = paid(installed, "ORD-FRESH")
    come_back(installed, fresh)  # paid now: its callback may still come
    assert health(installed).awaiting_callback == 2

    with installed.shop.app_context():  # the admin's "Refresh status from the gateway"
        assert refresh(load(installed, lost), source="admin").checkout.status == "PAID_PENDING_CALLBACK"

    figures = health(installed)
    assert (figures.awaiting_callback, figures.callback_never_came) == (1, 1)
    with installed.shop.app_context():
        assert figures.oldest_awaiting_paid_at == load(installed, fresh).paid_at
