"""Metrics labelled by merchant account (issue 27): each account's checkout and callback figures on series of
its own, the label always there (one account: its id), and the sum over accounts the shop's figures."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry

from flask_gateway import refund, register_metrics
from flask_gateway.models import GatewayCheckout
from flask_gateway.operations.metrics import GatewayMetrics
from flask_gateway.state import get_state
from tests.extension.conftest import SHOP_URL, Harness
from tests.extension.operations.support_accounts import ACCOUNT, OTHER, install_both, paid_by
from tests.extension.operations.test_health import come_back, deliver, silence_after
from tests.extension.operations.test_metrics import BY_ACCOUNT, Samples, scrape

pytestmark = pytest.mark.backends


@pytest.fixture
def both(harness: Harness) -> Iterator[tuple[Harness, GatewayMetrics]]:
    install_both(harness)
    handle = register_metrics(harness.shop, CollectorRegistry())
    yield harness, handle
    handle.unregister()


def of(samples: Samples, name: str, **labels: str) -> float:
    return samples[name][tuple(sorted(labels.items()))]


def test_each_account_has_its_own_series(both: tuple[Harness, GatewayMetrics]) -> None:
    harness, handle = both
    silence_after(harness, payments=1)
    by_callback, _ = paid_by(harness, ACCOUNT, "A-1")
    deliver(harness)  # ACCOUNT: confirmed by its callback
    checkout_id, _ = paid_by(harness, OTHER, "B-1")
    come_back(harness, checkout_id)  # OTHER: by the return; its callback not delivered: silent
    refused = harness.client.post(
        "/gateway/callback", data=b"{}", headers={"Content-Type": "application/json", "X-Signature": "x"}
    )
    assert refused.status_code == 401  # names no checkout and no account: counted for none
    with harness.shop.test_request_context(base_url=SHOP_URL):
        checkout = get_state().session.get_one(GatewayCheckout, by_callback)
        refund(checkout, 1000, reason="one cracked mug")

    samples = scrape(handle.registry)

    confirmations = "flask_gateway_confirmations_recent"
    assert of(samples, confirmations, path="callback", account=ACCOUNT) == 1
    assert of(samples, confirmations, path="return", account=ACCOUNT) == 0
    assert of(samples, confirmations, path="return", account=OTHER) == 1
    assert of(samples, confirmations, path="callback", account=OTHER) == 0
    callbacks = "flask_gateway_callbacks_recent"
    assert of(samples, callbacks, outcome="accepted", account=ACCOUNT) == 1
    assert of(samples, callbacks, outcome="accepted", account=OTHER) == 0
    assert of(samples, callbacks, outcome="rejected-signature", account="") == 1
    assert of(samples, callbacks, outcome="rejected-signature", account=ACCOUNT) == 0
    # OTHER's callbacks are silent while ACCOUNT's arrive: the alert fires for OTHER only.
    assert of(samples, "flask_gateway_callbacks_silent", account=ACCOUNT) == 0
    assert of(samples, "flask_gateway_callbacks_silent", account=OTHER) == 1
    assert of(samples, "flask_gateway_awaiting_callback_checkouts", account=OTHER) == 1
    assert of(samples, "flask_gateway_awaiting_callback_checkouts", account=ACCOUNT) == 0
    last = samples["flask_gateway_last_callback_timestamp_seconds"]
    assert set(last) == {(("account", ACCOUNT),)}  # OTHER never got one: absent, as with one account
    assert of(samples, "flask_gateway_refunds", state="SUCCEEDED", account=ACCOUNT) == 1
    assert of(samples, "flask_gateway_refunds", state="SUCCEEDED", account=OTHER) == 0
    # The shop's figures are the sum over the accounts (the unlabelled series of one account before).
    total = sum(v for labels, v in samples[callbacks].items() if dict(labels)["outcome"] == "accepted")
    assert total == 1
    # Every labelled figure carries the label on every series; the shop-wide ones do not.
    for name in BY_ACCOUNT:
        for labels in samples.get(name, {}):
            assert "account" in dict(labels), (name, labels)
    assert of(samples, "flask_gateway_up") == 1


def test_one_account_labels_every_series_with_its_id(harness: Harness) -> None:
    harness.install()
    handle = register_metrics(harness.shop, CollectorRegistry())
    try:
        paid_by(harness, ACCOUNT, "A-1")
        deliver(harness)
        samples = scrape(handle.registry)
    finally:
        handle.unregister()
    accounts = {dict(labels)["account"] for name in BY_ACCOUNT for labels in samples.get(name, {})}
    assert accounts == {ACCOUNT}
    assert of(samples, "flask_gateway_callbacks_recent", outcome="accepted", account=ACCOUNT) == 1
