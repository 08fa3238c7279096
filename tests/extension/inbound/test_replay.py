"""Replaying a stored callback (``flask gateway replay-callback``, the admin's callback log): the path a
verified callback takes after its verification (confirmed with getstatus, applied), as a new log row."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import select

from flask_gateway import Gateway, create_checkout, payment_confirmed
from flask_gateway.core.signing import sign
from flask_gateway.models import CallbackLog
from flask_gateway.state import get_state
from flask_gateway.testing import SHOP_URL, GatewayEmulator
from tests.extension.conftest import sample_order

_TOKEN = re.compile(r'name="csrf_token" type="hidden" value="([^"]+)"')


@pytest.fixture
def confirmed(gateway_app: Flask) -> Iterator[list[str]]:
    """The order references ``payment_confirmed`` was sent for, in order."""
    seen: list[str] = []

    def receiver(sender: Any, checkout: Any, **extra: Any) -> None:
        seen.append(checkout.order_reference)

    payment_confirmed.connect(receiver, sender=gateway_app, weak=False)
    yield seen
    payment_confirmed.disconnect(receiver)


def logs(app: Flask) -> list[tuple[int, str, int, str]]:
    with app.app_context():
        rows = get_state().session.scalars(select(CallbackLog).order_by(CallbackLog.id)).all()
        return [(row.id, row.outcome, row.http_status, row.detail) for row in rows]


def a_callback_that_could_not_be_confirmed(gateway_emulator: GatewayEmulator, app: Flask) -> str:
    """A paid checkout whose callback reached the shop, verified, while getstatus answered 503."""
    with app.test_request_context(base_url=SHOP_URL):
        checkout = create_checkout(sample_order())
    gateway_emulator.pay(checkout.token)
    fault = {"operation": "getstatus", "kind": "status", "status": 503, "count": 1}
    gateway_emulator.control("faults", fault)
    assert gateway_emulator.deliver() == 1
    [(log_id, outcome, status, _)] = logs(app)
    assert (outcome, status) == ("confirm-failed", 503)
    return str(log_id)


def test_the_cli_replays_a_verified_callback_through_the_callbacks_path(
    gateway_emulator: GatewayEmulator, gateway_app: Flask, confirmed: list[str]
) -> None:
    log_id = a_callback_that_could_not_be_confirmed(gateway_emulator, gateway_app)
    assert confirmed == []
    runner = gateway_app.test_cli_runner()

    replayed = runner.invoke(args=["gateway", "replay-callback", log_id])
    assert replayed.exit_code == 0, replayed.output
    assert f"Callback #{log_id} replayed as #" in replayed.output
    assert confirmed == ["ORD-1"]  # confirmed with the gateway, then applied
    [_, (new_id, outcome, status, detail)] = logs(gateway_app)
    assert (outcome, status) == ("accepted", 200)
    assert detail.startswith(f"replay of callback #{log_id}: ")
    assert detail == f"replay of callback #{log_id}: PENDING_ORDER -> PAID"
    assert new_id > int(log_id)

    again = runner.invoke(args=["gateway", "replay-callback", log_id])
    assert again.exit_code == 0, again.output
    assert "duplicate" in again.output
    assert confirmed == ["ORD-1"]  # never twice


def test_only_a_verified_callback_can_be_replayed(
    gateway_emulator: GatewayEmulator, gateway_app: Flask
) -> None:
    body = b'{"checkoutToken": "v2.demo-merchant.forged"}'
    refused = gateway_app.test_client().post(
        "/gateway/callback",
        data=body,
        headers={"Content-Type": "application/json", "X-Signature": sign(body, "not-the-key")},
    )
    assert refused.status_code == 401
    [(log_id, outcome, _, _)] = logs(gateway_app)
    assert outcome == "rejected-signature"
    runner = gateway_app.test_cli_runner()
    result = runner.invoke(args=["gateway", "replay-callback", str(log_id)])
    assert result.exit_code == 1
    assert "refused before it was verified" in result.output
    missing = runner.invoke(args=["gateway", "replay-callback", "4242"])
    assert missing.exit_code == 1
    assert "no callback #4242" in missing.output
    assert len(logs(gateway_app)) == 1  # nothing written


def test_the_admin_replays_a_callback_from_the_log(
    gateway_emulator: GatewayEmulator,
    gateway_app: Flask,
    plugin_parts: tuple[Flask, SQLAlchemy, Gateway],
    confirmed: list[str],
) -> None:
    log_id = a_callback_that_could_not_be_confirmed(gateway_emulator, gateway_app)
    plugin_parts[2].admin_guard(lambda: True)
    client = gateway_app.test_client()
    page = client.get("/gateway/admin/callbacks").get_data(as_text=True)
    action = f"/gateway/admin/callbacks/{log_id}/replay"
    assert f'action="{action}"' in page
    token = _TOKEN.search(page)
    assert token is not None
    assert client.post(action).status_code == 400  # CSRF
    assert confirmed == []
    answer = client.post(action, data={"csrf_token": token.group(1)}, follow_redirects=True)
    text = answer.get_data(as_text=True)
    assert f"Callback #{log_id} replayed as #" in text
    assert "Recorded" in text
    assert confirmed == ["ORD-1"]
    assert [outcome for _, outcome, _, _ in logs(gateway_app)] == ["confirm-failed", "accepted"]
