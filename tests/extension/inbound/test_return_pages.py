"""GET /gateway/return/<kind>: the URL is a hint; getstatus decides; the shopper lands on the order page."""

from __future__ import annotations

import pytest
from jinja2 import DictLoader

from flask_gateway.urls import v1_outcome_url
from tests.conftest import Databases
from tests.extension.conftest import Harness, build_harness
from tests.extension.inbound.inbound_support import (
    create_v1_checkout,
    create_v2_checkout,
    record_signals,
    return_path,
    snapshot,
)

received = pytest.fixture(record_signals)


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


@pytest.fixture
def builtin(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> Harness:
    """A shop without GATEWAY_ORDER_ENDPOINT: the extension's own return page is shown."""
    h = build_harness(databases, monkeypatch, GATEWAY_ORDER_ENDPOINT=None)
    h.install()
    return h


def test_confirm_asks_getstatus_and_redirects_to_the_order_page(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    installed.emulator.pay(token)

    answer = installed.client.get(return_path(installed, checkout_id, "confirm"))

    assert answer.status_code == 303
    assert answer.headers["Location"] == "/orders/ORD-1"
    assert answer.headers["Cache-Control"] == "no-store"
    assert answer.headers["Referrer-Policy"] == "no-referrer"
    state = snapshot(installed, checkout_id)
    assert state["status"] == "PAID_PENDING_CALLBACK"
    assert state["events"][-1][:4] == ("return", "PENDING_ORDER", "PAID_PENDING_CALLBACK", True)
    assert [kw["source"] for kw in received["payment_confirmed"]] == ["return"]


def test_the_url_alone_never_changes_the_status(installed: Harness, received) -> None:
    checkout_id, _ = create_v2_checkout(installed)  # not paid

    answer = installed.client.get(return_path(installed, checkout_id, "confirm"))

    assert answer.status_code == 303
    assert snapshot(installed, checkout_id)["status"] == "PENDING_ORDER"
    assert received["payment_confirmed"] == []


def test_visiting_twice_confirms_once(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    installed.emulator.pay(token)
    path = return_path(installed, checkout_id, "confirm")

    assert installed.client.get(path).status_code == 303
    assert installed.client.get(path).status_code == 303

    assert len(received["payment_confirmed"]) == 1


def test_cancel_records_the_consumer_cancellation(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    installed.emulator.consumer_cancel(token)

    answer = installed.client.get(return_path(installed, checkout_id, "cancel"))

    assert answer.status_code == 303
    assert snapshot(installed, checkout_id)["status"] == "CANCELLED_BY_CONSUMER"
    assert [kw["source"] for kw in received["checkout_cancelled"]] == ["return"]


def test_cancel_page_of_a_paid_checkout_still_shows_it_paid(installed: Harness, received) -> None:
    # A cancel link opened after paying (another tab): getstatus wins over the URL's kind.
    checkout_id, token = create_v2_checkout(installed)
    installed.emulator.pay(token)

    installed.client.get(return_path(installed, checkout_id, "cancel"))

    assert snapshot(installed, checkout_id)["status"] == "PAID_PENDING_CALLBACK"
    assert received["checkout_cancelled"] == []


def test_gateway_down_still_sends_the_shopper_to_the_order_page(installed: Harness, received) -> None:
    checkout_id, token = create_v2_checkout(installed)
    installed.emulator.pay(token)
    fault = {"operation": "getstatus", "kind": "status", "status": 503, "count": 1}
    assert installed.emulator.control("faults", fault).status_code == 201

    answer = installed.client.get(return_path(installed, checkout_id, "confirm"))

    assert answer.status_code == 303
    assert answer.headers["Location"] == "/orders/ORD-1"
    assert snapshot(installed, checkout_id)["status"] == "PENDING_ORDER"
    assert received["payment_confirmed"] == []
    # The next visit (or the callback, or reconciliation) settles it.
    installed.client.get(return_path(installed, checkout_id, "confirm"))
    assert snapshot(installed, checkout_id)["status"] == "PAID_PENDING_CALLBACK"


@pytest.mark.parametrize("case", ["edited", "missing", "other-kind", "v1-ref", "garbage"])
def test_a_forged_link_is_a_400_page_and_changes_nothing(installed: Harness, received, case: str) -> None:
    checkout_id, token = create_v2_checkout(installed)
    installed.emulator.pay(token)
    confirm = return_path(installed, checkout_id, "confirm")
    cancel = return_path(installed, checkout_id, "cancel")
    ref = confirm.partition("ref=")[2]
    middle = len(ref) - 10  # inside the signature (the last base64 character has insignificant bits)
    edited = ref[:middle] + ("A" if ref[middle] != "A" else "B") + ref[middle + 1 :]
    path = {
        "edited": f"/gateway/return/confirm?ref={edited}",
        "missing": "/gateway/return/confirm",
        # The cancel link's reference on the confirm page: the kind is part of what is signed.
        "other-kind": f"/gateway/return/confirm?ref={cancel.partition('ref=')[2]}",
        "garbage": "/gateway/return/confirm?ref=%00%ff",
    }.get(case)
    if case == "v1-ref":
        with installed.shop.test_request_context():
            v1_ref = v1_outcome_url(checkout_id, "v1-success").partition("ref=")[2]
        path = f"/gateway/return/confirm?ref={v1_ref}"
    before = snapshot(installed, checkout_id)

    answer = installed.client.get(path)

    assert answer.status_code == 400
    assert answer.mimetype == "text/html"
    assert "not valid" in answer.get_data(as_text=True)
    assert snapshot(installed, checkout_id) == before
    assert received["payment_confirmed"] == []


def test_an_unknown_kind_is_404(installed: Harness) -> None:
    checkout_id, _ = create_v2_checkout(installed)
    ref = return_path(installed, checkout_id, "confirm").partition("ref=")[2]

    assert installed.client.get(f"/gateway/return/paid?ref={ref}").status_code == 404


def test_built_in_page_shows_the_confirmed_status(builtin: Harness, received) -> None:
    paid_id, paid_token = create_v2_checkout(builtin, "ORD-PAID", total=123456)
    open_id, _ = create_v2_checkout(builtin, "ORD-OPEN")
    builtin.emulator.pay(paid_token)

    paid = builtin.client.get(return_path(builtin, paid_id, "confirm"))
    pending = builtin.client.get(return_path(builtin, open_id, "confirm"))

    assert paid.status_code == pending.status_code == 200
    assert paid.headers["Cache-Control"] == "no-store"
    paid_html, pending_html = paid.get_data(as_text=True), pending.get_data(as_text=True)
    assert 'data-state="paid"' in paid_html
    assert "ORD-PAID" in paid_html
    assert "R 1 234.56" in paid_html
    assert 'data-state="processing"' in pending_html
    assert [kw["source"] for kw in received["payment_confirmed"]] == ["return"]


def test_built_in_page_for_cancelled_and_for_v1(builtin: Harness) -> None:
    cancelled_id, cancelled_token = create_v2_checkout(builtin, "ORD-C")
    builtin.emulator.consumer_cancel(cancelled_token)
    v1_id, _ = create_v1_checkout(builtin, "ORD-V1")

    cancelled = builtin.client.get(return_path(builtin, cancelled_id, "cancel"))
    v1_open = builtin.client.get(return_path(builtin, v1_id, "cancel"))  # v1: no getstatus, shown as is

    assert 'data-state="cancelled"' in cancelled.get_data(as_text=True)
    assert v1_open.status_code == 200
    assert 'data-state="processing"' in v1_open.get_data(as_text=True)
    assert snapshot(builtin, v1_id)["status"] == "PENDING_ORDER"


def test_the_app_can_override_the_built_in_page(builtin: Harness) -> None:
    builtin.shop.jinja_loader = DictLoader(
        {"gateway/return.html": "custom {{ state }} {{ checkout.order_reference }}"}
    )
    checkout_id, _ = create_v2_checkout(builtin)

    answer = builtin.client.get(return_path(builtin, checkout_id, "confirm"))

    assert answer.get_data(as_text=True) == "custom processing ORD-1"
