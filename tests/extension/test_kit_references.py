"""The test kit's helpers take an order reference or a token alike (issue 28, point 6): one resolver
(``GatewayEmulator.resolve``) for every helper, an unknown one refused with a message naming it, and a shop
whose return URLs the emulator will refuse told so at the start, the key to set first."""

from __future__ import annotations

import warnings
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import select

from flask_gateway import GatewayCheckout, create_checkout, refresh
from flask_gateway.state import get_state
from flask_gateway.testing import (
    CheckoutRef,
    GatewayEmulator,
    GatewayEmulatorError,
    GatewayKitWarning,
)
from tests.conftest import Databases
from tests.extension.conftest import make_shop, sample_order


def checkout_for(app: Flask, reference: str) -> GatewayCheckout:
    with app.app_context():
        checkout = create_checkout(sample_order(reference))
        assert checkout.token is not None
        return checkout


def local(app: Flask, token: str) -> GatewayCheckout:
    with app.app_context():
        return get_state().session.scalars(select(GatewayCheckout).filter_by(token=token)).one()


@pytest.mark.backends
def test_every_helper_takes_an_order_reference_or_a_token_alike(
    gateway_app: Flask, gateway_emulator: GatewayEmulator
) -> None:
    checkout = checkout_for(gateway_app, "BP-7")
    token = checkout.token
    # status("BP-7") was HTTP 404 "No checkout with this checkoutToken" (issue 28).
    assert gateway_emulator.status("BP-7") == gateway_emulator.status(token) == "PENDING_ORDER"
    assert gateway_emulator.status(checkout) == "PENDING_ORDER"
    assert gateway_emulator.checkout("BP-7")["checkoutToken"] == token
    assert gateway_emulator.pay("BP-7").status == "PAID_PENDING_CALLBACK"
    assert gateway_emulator.deliver() == 1
    by_reference, by_token = gateway_emulator.callbacks("BP-7"), gateway_emulator.callbacks(token)
    assert len(by_reference) == 1 and by_reference == by_token == gateway_emulator.callbacks(checkout)
    record = gateway_emulator.assert_fulfilled_once("BP-7")
    assert record.token == token and record.order_reference == "BP-7"
    assert gateway_emulator.confirmations("BP-7") == gateway_emulator.confirmations(token) == [record]
    assert gateway_emulator.assert_fulfilled_once(token) == record
    assert gateway_emulator.replay_callback("BP-7").ok
    assert len(gateway_emulator.callbacks("BP-7")) == 1  # the replay is no new attempt of the gateway's
    gateway_emulator.assert_fulfilled_once("BP-7")  # not fulfilled again


def test_an_order_reference_means_its_most_recent_checkout(
    gateway_app: Flask, gateway_emulator: GatewayEmulator
) -> None:
    first = checkout_for(gateway_app, "R-2")
    gateway_emulator.cancel_as_consumer("R-2")
    with gateway_app.app_context():
        refresh(get_state().session.get_one(GatewayCheckout, first.id))  # cancelled: the order pays anew
    second = checkout_for(gateway_app, "R-2")
    assert second.token != first.token

    resolved = gateway_emulator.resolve("R-2")
    assert first.token is not None and second.token is not None
    assert resolved == CheckoutRef(
        given="R-2",
        token=second.token,
        order_reference="R-2",
        by_reference=True,
        order_tokens=(second.token, first.token),
    )
    assert gateway_emulator.resolve(first.token).token == first.token  # a token first
    assert gateway_emulator.resolve(first).by_reference is False
    assert gateway_emulator.status("R-2") == "PENDING_ORDER"
    assert gateway_emulator.status(first.token) == "CANCELLED_BY_CONSUMER"
    gateway_emulator.pay("R-2")
    gateway_emulator.deliver()
    # The order was fulfilled once, by its second checkout; its first one never.
    assert gateway_emulator.assert_fulfilled_once("R-2").token == second.token
    gateway_emulator.assert_not_fulfilled(first.token)
    assert gateway_emulator.confirmations(first) == []


@pytest.mark.parametrize(
    "helper",
    ["status", "checkout", "callbacks", "confirmations", "pay", "cancel_as_consumer", "expire", "redeliver"],
)
def test_an_unknown_reference_or_token_is_refused_naming_it(
    gateway_app: Flask, gateway_emulator: GatewayEmulator, helper: str
) -> None:
    checkout_for(gateway_app, "BP-7")
    with pytest.raises(GatewayEmulatorError) as refused:
        getattr(gateway_emulator, helper)("BP-404")
    message = str(refused.value)
    assert message.startswith("'BP-404' names no checkout at the gateway (neither a checkout token nor an ")
    assert "Its newest checkouts: BP-7 (v2.demo-merchant." in message  # what it does have


def test_the_fulfilment_assertions_fail_on_an_unknown_one(gateway_emulator: GatewayEmulator) -> None:
    with pytest.raises(AssertionError, match=r"^Expected the order or checkout 'BP-404' to be fulfilled"):
        gateway_emulator.assert_fulfilled_once("BP-404")
    # It passed before: a misspelt reference proved nothing was fulfilled.
    with pytest.raises(AssertionError) as unknown:
        gateway_emulator.assert_not_fulfilled("BP-404")
    assert str(unknown.value).splitlines() == [
        "Cannot tell whether the order or checkout 'BP-404' was fulfilled: it names no checkout.",
        "The gateway has no checkout by that token or order reference: did the shop create one "
        "(start_checkout) with this emulator?",
    ]


# --- the configuration the kit cannot work with: the key first ------------------------------------------


def _start(databases: Databases, **config: Any) -> tuple[Flask, GatewayEmulator | None, list[str]]:
    shop, db, _ = make_shop(databases.url("main"), **config)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        gateway = GatewayEmulator.start(shop, database_url=databases.url("emulator"))
    gateway.close()
    with shop.app_context():
        db.engine.dispose()
    return shop, gateway, [str(w.message) for w in caught if issubclass(w.category, GatewayKitWarning)]


def test_local_return_urls_are_named_by_their_key_first(databases: Databases) -> None:
    _, _, unset = _start(databases, GATEWAY_PUBLIC_URL=None)
    assert len(unset) == 1
    assert unset[0].startswith(
        "GATEWAY_PUBLIC_URL is not set, so the shop's return URLs are on http://localhost (localhost): the "
        "emulator's firewall refuses them"
    )
    assert "Set GATEWAY_PUBLIC_URL to a public address such as https://shop.example" in unset[0]
    _, _, ip = _start(databases, GATEWAY_PUBLIC_URL="http://127.0.0.1:5000")
    assert ip and ip[0].startswith("GATEWAY_PUBLIC_URL='http://127.0.0.1:5000' is on an IP address: ")
    assert _start(databases, GATEWAY_PUBLIC_URL=None, GATEWAY_WAF="allow-local")[2] == []
    assert _start(databases)[2] == []  # https://shop.example: nothing to say


def test_as_an_error_the_summary_line_starts_with_the_key(databases: Databases) -> None:
    """Under ``filterwarnings = error`` the fixture's setup fails; pytest's one-line summary is the first line
    of ``exconly()``, cut at the terminal's width: the key comes right after the class."""
    shop, db, _ = make_shop(databases.url("main"), GATEWAY_PUBLIC_URL=None)
    before = dict(get_state(shop).client_options)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(GatewayKitWarning) as failed:
            GatewayEmulator.start(shop, database_url=databases.url("emulator"))
    assert failed.exconly().startswith(
        "flask_gateway.testing.GatewayKitWarning: GATEWAY_PUBLIC_URL is not set"
    )
    assert get_state(shop).client_options == before  # refused before it changed anything on the shop
    with shop.app_context():
        db.engine.dispose()


@pytest.mark.backends
def test_an_order_reference_in_another_case_names_its_order_when_that_is_one(
    gateway_app: Flask, gateway_emulator: GatewayEmulator
) -> None:
    checkout = checkout_for(gateway_app, "6E238593")
    assert gateway_emulator.resolve("6e238593") == CheckoutRef(
        given="6e238593",
        token=checkout.token or "",
        order_reference="6E238593",  # as the shop stored it: the fulfilment helpers match on it
        by_reference=True,
        order_tokens=(checkout.token or "",),
    )
    assert gateway_emulator.pay("6e238593").status == "PAID_PENDING_CALLBACK"
    gateway_emulator.deliver()
    assert gateway_emulator.assert_fulfilled_once("6e238593").order_reference == "6E238593"

    checkout_for(gateway_app, "ab-1")
    checkout_for(gateway_app, "AB-1")
    assert gateway_emulator.resolve("ab-1").order_reference == "ab-1"  # exactly as written: that one
    with pytest.raises(GatewayEmulatorError, match=r"'Ab-1' matches the order references 'AB-1', 'ab-1'"):
        gateway_emulator.resolve("Ab-1")
