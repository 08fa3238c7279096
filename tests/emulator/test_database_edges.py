"""What PostgreSQL refuses and SQLite takes: every such input is an answer, never a 500, on both backends.

PostgreSQL refuses U+0000 in any text it is given (even in a query) and enforces ``VARCHAR`` lengths;
SQLite accepts both. Each test here runs on both backends (``database_url``, tests/conftest.py).
"""

from __future__ import annotations

import pytest

from flask_gateway.emulator import prepare_database, seed_accounts
from flask_gateway.emulator.checkouts import TOKEN_MAX_LENGTH
from flask_gateway.emulator.models import Account, ClockState, DeliveryAttempt, db
from flask_gateway.emulator.settings import EmulatorSettings
from tests.emulator.conftest import make_emulator
from tests.emulator.support import Gateway, create_body, v1_checkout_body

# What PostgreSQL refuses and SQLite takes: the point of every test here.
pytestmark = pytest.mark.backends


def test_a_long_account_id_still_gets_tokens_that_fit(gateway: Gateway):
    account, api_key = "m" * 255, "long-account-key"
    created = gateway.control("accounts", {"merchantAccountId": account, "merchantAccountApiKey": api_key})
    assert created.status_code == 201, created.get_data(as_text=True)
    gateway.install(account=account, api_key=api_key)

    token = gateway.create(create_body(), account=account)["checkoutToken"]

    assert len(token) == TOKEN_MAX_LENGTH and token.startswith("v2.mmm")
    assert gateway.status(token, account=account)["checkoutPaymentStatus"] == "PENDING_ORDER"
    second = gateway.create(create_body(request_id="req-2"), account=account)["checkoutToken"]
    assert second != token


def test_nul_in_the_account_header_is_an_unknown_account(installed: Gateway):
    response = installed.client.post(
        "/v2/getstatus",
        json={"checkoutToken": "x"},
        headers={"X-Merchant-Account-ID": "demo-merchant\x00", "X-Signature": "x"},
    )
    assert response.status_code == 401
    assert "unknown X-Merchant-Account-ID" in response.json["message"]


@pytest.mark.parametrize(
    "path",
    [
        "/_emulator/callbacks?checkoutToken=%00",
        "/_emulator/callbacks?kind=callback%00",
        "/_emulator/deliveries?state=pending%00",
    ],
)
def test_nul_in_a_control_api_filter_matches_nothing(installed: Gateway, path: str):
    installed.pay(installed.create()["checkoutToken"])  # something the filter could have matched
    response = installed.client.get(path)
    assert response.status_code == 200
    assert next(iter(response.json.values())) == []


def test_a_v1_notice_to_a_fail_url_of_the_longest_length_is_recorded(installed: Gateway, emulator_app):
    """The notice's URL is the fail URL (up to 2048 characters) plus its query: kept whole."""
    base = "https://shop.example/gateway/v1/fail?s="
    fail_url = base + "a" * (2048 - len(base))
    answer = installed.v1("checkout", v1_checkout_body(fail_callback_url=fail_url))
    assert answer.status_code == 200, answer.get_data(as_text=True)

    installed.advance(2 * 3600)  # expires: the ABANDONED notice is attempted (nothing answers it)

    with emulator_app.app_context():
        [attempt] = db.session.query(DeliveryAttempt).all()
        assert attempt.url.startswith(fail_url) and "reason=ABANDONED" in attempt.url
        assert len(attempt.url) > 2048


def test_seeding_survives_another_process_seeding_at_the_same_moment(database_url, monkeypatch):
    """Every worker process of a server seeds the accounts at start. One that looked before another one's
    commit meets that one's rows (a unique violation, formerly raised by the autoflush of its next lookup,
    which stopped the worker: gunicorn then shut the whole server down): it must go on."""
    app = make_emulator(database_url)
    prepare_database(app)  # the other process: seeded already
    with app.app_context():
        real_get = db.session.get

        def as_seen_before_the_other_commit(entity, key, **kwargs):
            return None if entity is Account else real_get(entity, key, **kwargs)

        monkeypatch.setattr(db.session, "get", as_seen_before_the_other_commit)
        seed_accounts(EmulatorSettings(worker=False))  # raises nothing
        monkeypatch.undo()
        assert [a.merchant_account_id for a in db.session.query(Account)] == ["demo-merchant"]
        assert db.session.get(ClockState, 1) is not None
        db.session.remove()
        db.engine.dispose()
