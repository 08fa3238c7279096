"""``flask gateway init-db | reconcile | status`` through ``app.test_cli_runner()``."""

from __future__ import annotations

import pytest
from sqlalchemy import inspect

from flask_gateway.models import GatewayBase
from tests.extension.conftest import Harness, sample_order
from tests.extension.operations_support import load, new_checkout


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


def invoke(harness: Harness, *args: str):
    return harness.shop.test_cli_runner().invoke(args=["gateway", *args])


@pytest.mark.backends
def test_init_db_creates_only_the_gateway_tables(harness):
    db = harness.db

    class Product(db.Model):  # type: ignore[name-defined,misc]  # a shop table the command must not create
        __tablename__ = "shop_products"
        id = db.Column(db.Integer, primary_key=True)

    with harness.shop.app_context():
        GatewayBase.metadata.drop_all(db.engine)
        assert not [t for t in inspect(db.engine).get_table_names() if t.startswith("gateway_")]
    result = invoke(harness, "init-db")
    assert result.exit_code == 0, result.output
    assert "Created 7 table(s): gateway_" in result.output
    with harness.shop.app_context():
        tables = set(inspect(db.engine).get_table_names())
    assert {t.name for t in GatewayBase.metadata.sorted_tables} <= tables
    assert "shop_products" not in tables
    again = invoke(harness, "init-db")
    assert again.exit_code == 0
    assert "All 7 gateway tables exist already" in again.output


@pytest.mark.backends
def test_reconcile_command(installed):
    checkout_id, token = new_checkout(installed)
    installed.emulator.control("faults", {"operation": "callback", "kind": "callback_fail"})
    installed.emulator.pay(token)
    result = invoke(installed, "reconcile", "--older-than", "0")
    assert result.exit_code == 0, result.output
    assert "Polling checkouts" in result.output  # the progress bar's label
    assert "Polled 1 of 1 due checkout(s): 1 changed, 1 payment(s) confirmed, 0 expired, 0 failed." in (
        result.output
    )
    assert "Statuses now: PAID_PENDING_CALLBACK 1" in result.output
    with installed.shop.app_context():
        assert load(installed, checkout_id).status == "PAID_PENDING_CALLBACK"

    # The default age (GATEWAY_RECONCILE_AFTER_SECONDS) leaves what just changed alone.
    quiet = invoke(installed, "reconcile", "--quiet")
    assert quiet.exit_code == 0
    assert quiet.output.strip().startswith("Polled 0 of 0 due checkout(s)")
    assert "Polling" not in quiet.output


@pytest.mark.backends
def test_reconcile_command_limit_and_failure_exit_code(installed):
    for n in range(2):
        new_checkout(installed, sample_order(f"ORD-{n}"))
    limited = invoke(installed, "reconcile", "--older-than", "0", "--limit", "1")
    assert limited.exit_code == 0
    assert "Polled 1 of 1 due" in limited.output
    assert invoke(installed, "reconcile", "--limit", "0").exit_code == 2  # click refuses it

    installed.emulator.control("faults", {"operation": "getstatus", "kind": "status", "status": 500})
    failed = invoke(installed, "reconcile", "--older-than", "0")
    assert failed.exit_code == 1
    assert "1 failed" in failed.output
    assert "getstatus: HTTP 500 Injected fault" in failed.output


def test_reconcile_command_not_installed(harness):
    result = invoke(harness, "reconcile")
    assert result.exit_code == 0
    assert "not installed" in result.output


def test_status_command(installed):
    checkout_id, token = new_checkout(installed)
    installed.emulator.pay(token)
    result = invoke(installed, "status", token)
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Local record" in out and f"#{checkout_id} (v2)" in out
    assert "ORD-1" in out and "79800 cents" in out
    assert "PENDING_ORDER" in out  # the shop has not heard yet
    assert "Gateway (getstatus)" in out
    assert "checkoutPaymentStatus            PAID_PENDING_CALLBACK" in out
    with installed.shop.app_context():
        assert load(installed, checkout_id).status == "PENDING_ORDER"  # read only

    refreshed = invoke(installed, "status", token, "--refresh")
    assert refreshed.exit_code == 0
    assert "Refreshed: PENDING_ORDER -> PAID_PENDING_CALLBACK, applied." in refreshed.output
    with installed.shop.app_context():
        assert load(installed, checkout_id).status == "PAID_PENDING_CALLBACK"


def test_status_command_unknown_token(installed):
    result = invoke(installed, "status", "v2.demo-merchant.nope")
    assert result.exit_code == 1
    assert "No local checkout has token v2.demo-merchant.nope" in result.output
    assert "HTTP 404" in result.output


def _received_callbacks(installed: Harness) -> int:
    """One accepted callback (delivered by the emulator) and one forged (refused), returns the checkout id."""
    checkout_id, token = new_checkout(installed)
    installed.emulator.pay(token)
    assert installed.emulator.control("deliver").status_code == 200
    forged = installed.client.post(
        "/gateway/callback",
        data=b'{"checkoutToken":"' + token.encode() + b'"}',
        headers={"Content-Type": "application/json", "X-Signature": "bm9wZQ==", "X-Merchant-Account-ID": "x"},
    )
    assert forged.status_code == 401
    return checkout_id


def test_callbacks_command_lists_the_newest_first_and_filters(installed):
    checkout_id = _received_callbacks(installed)
    result = invoke(installed, "callbacks")
    assert result.exit_code == 0, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 2
    assert "HTTP 401" in lines[0] and "rejected-signature" in lines[0] and "NOT verified" in lines[0]
    assert "no checkout" in lines[0]  # nothing of an unverified body is trusted, not even its token
    assert "HTTP 200" in lines[1] and "accepted" in lines[1] and f"checkout #{checkout_id}" in lines[1]

    refused = invoke(installed, "callbacks", "--refused").output.strip().splitlines()
    assert len(refused) == 1 and "rejected-signature" in refused[0]
    accepted = invoke(installed, "callbacks", "--outcome", "accepted").output.strip().splitlines()
    assert len(accepted) == 1 and "accepted" in accepted[0]
    assert invoke(installed, "callbacks", "--outcome", "mismatch").output.strip() == "No callbacks match."
    assert invoke(installed, "callbacks", "--outcome", "bogus").exit_code == 2


@pytest.mark.backends
def test_prune_callbacks_deletes_only_old_rows_and_keeps_the_history(installed):
    from datetime import timedelta

    from sqlalchemy import func, select, update

    from flask_gateway.models import CallbackLog, CheckoutEvent
    from flask_gateway.state import get_state

    checkout_id = _received_callbacks(installed)
    with installed.shop.app_context():
        session = get_state().session
        oldest = session.scalars(select(CallbackLog).order_by(CallbackLog.id)).first()
        assert oldest is not None
        session.execute(
            update(CallbackLog)
            .where(CallbackLog.id == oldest.id)
            .values(received_at=oldest.received_at - timedelta(days=91))
        )
        session.commit()
        events = session.scalar(select(func.count()).select_from(CheckoutEvent))

    result = invoke(installed, "prune-callbacks", "--older-than-days", "90")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Deleted 1 callback log row(s) received before ")
    with installed.shop.app_context():
        session = get_state().session
        left = session.scalars(select(CallbackLog)).all()
        assert [row.outcome for row in left] == ["rejected-signature"]
        assert session.scalar(select(func.count()).select_from(CheckoutEvent)) == events
        assert load(installed, checkout_id).status == "PAID"  # the checkout is untouched
    assert invoke(installed, "prune-callbacks").exit_code == 2  # --older-than-days or --refused is required


def test_prune_callbacks_refused_purges_a_flood_now_and_keeps_verified_rows(installed):
    from sqlalchemy import select

    from flask_gateway.models import CallbackLog
    from flask_gateway.state import get_state

    checkout_id = _received_callbacks(installed)  # one accepted, one refused, both just now
    for _ in range(3):
        installed.client.post("/gateway/callback", data=b"{}", headers={"X-Signature": "bm9wZQ=="})

    result = invoke(installed, "prune-callbacks", "--refused")

    assert result.exit_code == 0, result.output
    assert result.output.strip() == "Deleted 4 refused (never verified) callback log row(s)."
    with installed.shop.app_context():
        left = get_state().session.scalars(select(CallbackLog)).all()
        assert [(row.outcome, row.verified, row.checkout_id) for row in left] == [
            ("accepted", True, checkout_id)
        ]
    assert invoke(installed, "prune-callbacks").exit_code == 2  # says what to delete
