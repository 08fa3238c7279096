"""Callback health with two merchant accounts (issue 27): each account's figures apart, and one account's
callbacks going silent while the other's arrive is noticed (the shop-wide last callback would hide it)."""

from __future__ import annotations

import logging

import pytest

from flask_gateway import callbacks_silent
from flask_gateway.operations.health import callback_health, check_callback_health
from tests.extension.conftest import Harness
from tests.extension.operations.operations_support import recording
from tests.extension.operations.support_accounts import ACCOUNT, OTHER, install_both, paid_by
from tests.extension.operations.test_health import come_back, deliver, forge_callback, silence_after

pytestmark = pytest.mark.backends  # the account filters are SQL (an outer join, coalesce)


@pytest.fixture
def both(harness: Harness) -> Harness:
    return install_both(harness)


def test_each_accounts_figures_are_its_own(both: Harness) -> None:
    _, token = paid_by(both, ACCOUNT, "A-1")
    deliver(both)  # ACCOUNT's callback confirms it
    by_return, _ = paid_by(both, OTHER, "B-1")
    come_back(both, by_return)  # OTHER's by the shopper's return; its callback not delivered yet
    forge_callback(both, token)  # refused (401), about ACCOUNT's checkout

    with both.shop.app_context():
        shop = callback_health()
        mine = callback_health(account=ACCOUNT)
        other = callback_health(account=OTHER)

    assert shop.account is None and shop.confirmations == {"callback": 1, "return": 1}
    assert shop.callbacks == {"accepted": 1, "rejected-signature": 1}
    assert (mine.account, mine.confirmations) == (ACCOUNT, {"callback": 1})
    assert mine.callbacks == {
        "accepted": 1,
        "rejected-signature": 1,
    }  # the forged one claimed the account (header)
    assert mine.refused == 1 and mine.last_callback_at is not None
    assert (other.account, other.confirmations) == (OTHER, {"return": 1})
    assert other.callbacks == {} and other.refused == 0
    assert other.last_callback_at is None  # ACCOUNT's callback proves nothing of OTHER's
    assert other.awaiting_callback == 1 and mine.awaiting_callback == 0
    assert shop.awaiting_callback == 1
    assert other.summary().startswith(f"Callbacks of merchant account {OTHER}: no verified callback yet")

    deliver(both)  # OTHER's callback arrives on its own path
    with both.shop.app_context():
        other = callback_health(account=OTHER)
    assert other.callbacks == {"accepted": 1} and other.last_callback_at is not None
    assert other.awaiting_callback == 0


def test_one_accounts_silence_while_the_others_callbacks_arrive_is_announced_for_it(
    both: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    silence_after(both, payments=2)
    for reference in ("A-1", "A-2"):
        paid_by(both, ACCOUNT, reference)
        deliver(both)  # ACCOUNT's callbacks arrive
    for reference in ("B-1", "B-2"):
        checkout_id, _ = paid_by(both, OTHER, reference)
        come_back(both, checkout_id)  # OTHER's payments are confirmed by the returns only
    caplog.set_level(logging.INFO, logger="flask_gateway.health")

    with recording(callbacks_silent) as sent, both.shop.app_context():
        shop = check_callback_health()
        again = check_callback_health()  # the same spell: no second signal

    # The shop received a verified callback a moment ago: one watch for the whole shop would say all is well.
    assert shop.last_callback_at is not None
    assert shop.silent and again.silent
    [silence] = shop.silences
    assert (silence.account, silence.named, silence.payments, silence.last_callback_at) == (
        OTHER,
        True,
        2,
        None,
    )
    assert shop.silence == silence
    assert len(sent) == 1
    call = sent.calls[0]
    assert call["account"] == OTHER and call["payments"] == 2 and call["last_callback_at"] is None
    assert call["health"].account == OTHER  # that account's figures
    assert call["health"].confirmations == {"return": 2}
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.getMessage().startswith(
        f"Gateway callbacks of merchant account {OTHER!r} are silent: no verified callback has ever"
    )
    assert shop.summary().startswith(f"Gateway callbacks of merchant account {OTHER!r} are silent")

    with both.shop.app_context():
        assert not callback_health(account=ACCOUNT).silent
        assert callback_health(account=OTHER).silent

    # OTHER's callbacks come: its spell is over, nobody is silent.
    deliver(both)
    with recording(callbacks_silent) as after, both.shop.app_context():
        assert not check_callback_health().silent
    assert len(after) == 0


def test_two_accounts_that_never_got_a_callback_are_two_spells(both: Harness) -> None:
    silence_after(both, payments=1)
    for account, reference in ((ACCOUNT, "A-1"), (OTHER, "B-1")):
        checkout_id, _ = paid_by(both, account, reference)
        come_back(both, checkout_id)
    with recording(callbacks_silent) as sent, both.shop.app_context():
        shop = check_callback_health()
        check_callback_health()
    assert [s.account for s in shop.silences] == [ACCOUNT, OTHER]
    assert sorted(call["account"] for call in sent.calls) == [ACCOUNT, OTHER]  # each once


def test_one_account_is_watched_as_before_and_named_in_the_signal(harness: Harness) -> None:
    harness.install()
    silence_after(harness, payments=1)
    checkout_id, _ = paid_by(harness, ACCOUNT, "A-1")
    come_back(harness, checkout_id)
    with recording(callbacks_silent) as sent, harness.shop.app_context():
        shop = check_callback_health()
    assert shop.silence is not None and not shop.silence.named
    assert shop.silence.account == ACCOUNT
    assert shop.summary().startswith("Gateway callbacks are silent: no verified callback")  # as before
    assert [call["account"] for call in sent.calls] == [ACCOUNT]
    assert sent.calls[0]["health"] is not None and sent.calls[0]["health"].account is None
