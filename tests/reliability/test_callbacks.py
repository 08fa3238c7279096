"""Concurrent confirmations of one payment: the shop fulfils each paid order exactly once.

Fulfilments are counted as rows (the order's ``paid`` history row, written in the transaction that sets
``paid_at`` and ``fulfilled_at``), signals as rows of ``reliability_signals`` (``shop_wsgi``), across the
shop's four gunicorn worker processes.

The emulator's own callback attempts are made to fail (``callback_fail``, nothing is sent) while these
tests run: the confirmations racing are exactly the ones the test releases.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import pytest
import requests

from example_shop import create_app as create_shop_app
from example_shop.extensions import db as shop_db
from flask_gateway.operations.reconciliation import ReconcileReport, reconcile
from tests.conftest import fetch_all
from tests.processes import wait_for
from tests.reliability.conftest import Stack
from tests.reliability.support import (
    Recorder,
    add_fault,
    callback_request,
    clone,
    control_get,
    control_post,
    csrf_token,
    fulfilment_counts,
    log_problems,
    order_reference,
    owner_session,
    place_order,
    signal_counts,
    together,
    token_of,
)

CALLBACKS = 50
ORDERS_PER_ROUND = 4
ROUNDS = 5


def _post_callback(stack: Stack, body: bytes, headers: dict[str, str]) -> requests.Response:
    with requests.Session() as session:  # a connection of its own
        return session.post(f"{stack.shop.url}/gateway/callback", data=body, headers=headers, timeout=60)


def test_fifty_identical_callbacks_fulfil_once(stack: Stack, report: Callable[[str], None]) -> None:
    add_fault(stack, operation="callback", kind="callback_fail")
    _shopper, payment_url = place_order(stack, {"enamel-kettle": 1, "stoneware-mugs": 2})
    token = token_of(payment_url)
    reference = order_reference(stack, token)
    paid = control_post(stack, f"checkouts/{token}/pay")
    assert paid["checkoutPaymentStatus"] == "PAID_PENDING_CALLBACK"
    body, headers = callback_request(stack, token)

    answers = together(CALLBACKS, lambda _: _post_callback(stack, body, headers))

    statuses = [a.status_code if isinstance(a, requests.Response) else repr(a) for a in answers]
    assert statuses == [200] * CALLBACKS
    outcomes = dict(
        fetch_all(
            stack.shop_db,
            "SELECT l.outcome, count(*) FROM gateway_callback_log l JOIN gateway_checkouts c "
            "ON c.id = l.checkout_id WHERE c.token = :token GROUP BY l.outcome",
            token=token,
        )
    )
    assert outcomes == {"accepted": 1, "duplicate": CALLBACKS - 1}
    assert signal_counts(stack, [reference], "payment_confirmed") == {reference: 1}
    assert fulfilment_counts(stack, [reference]) == {reference: 1}
    order = fetch_all(
        stack.shop_db, "SELECT status, fulfilled_at FROM shop_orders WHERE reference = :r", r=reference
    )
    assert order[0][0] == "paid" and order[0][1] is not None
    report(f"{CALLBACKS} identical callbacks for {reference}: {outcomes}, 1 signal, 1 fulfilment")
    assert log_problems(stack) == []


def test_callback_racing_the_return_page_fulfils_once(stack: Stack, report: Callable[[str], None]) -> None:
    """The shopper comes back from the payment page (the return page confirms with getstatus) at the very
    moment the signed callback arrives; round after round, each order is fulfilled once."""
    add_fault(stack, operation="callback", kind="callback_fail")
    recorder = Recorder()
    references: list[str] = []
    sources: dict[str, int] = {}
    for _round in range(ROUNDS):
        racers = []
        for _ in range(ORDERS_PER_ROUND):
            shopper, payment_url = place_order(stack, {"ilala-basket": 1}, recorder)
            token = token_of(payment_url)
            # The consumer pays; the shopper's browser has not followed the redirect back yet.
            paid = shopper.pay_or_cancel(payment_url, "pay", follow=False)
            assert paid.status_code == 303, paid.status_code
            return_url = paid.headers["Location"]
            body, headers = callback_request(stack, token)
            racers.append((shopper.fresh_connections(), return_url, body, headers))
            references.append(order_reference(stack, token))

        def race(index: int, racers: list = racers) -> int:  # type: ignore[type-arg]
            shopper, return_url, body, headers = racers[index // 2]
            if index % 2 == 0:
                return _post_callback(stack, body, headers).status_code
            page = shopper.session.get(return_url, timeout=60)  # return page -> order page
            assert "/orders/view/" in page.url, page.url
            return page.status_code

        answers = together(2 * ORDERS_PER_ROUND, race)
        assert answers == [200] * (2 * ORDERS_PER_ROUND)
        for source, count in fetch_all(
            stack.shop_db,
            "SELECT e.source, count(*) FROM gateway_checkout_events e JOIN gateway_checkouts c "
            "ON c.id = e.checkout_id WHERE e.applied AND e.to_status IN ('PAID', 'PAID_PENDING_CALLBACK') "
            "AND e.from_status NOT IN ('PAID', 'PAID_PENDING_CALLBACK') "
            "AND c.order_reference = ANY(:refs) GROUP BY e.source",
            refs=references[-ORDERS_PER_ROUND:],
        ):
            sources[source] = sources.get(source, 0) + count

    assert sum(sources.values()) == len(references)  # each payment confirmed by one event
    assert signal_counts(stack, references, "payment_confirmed") == dict.fromkeys(references, 1)
    assert fulfilment_counts(stack, references) == dict.fromkeys(references, 1)
    statuses = fetch_all(
        stack.shop_db, "SELECT status FROM shop_orders WHERE reference = ANY(:refs)", refs=references
    )
    assert [s for (s,) in statuses] == ["paid"] * len(references)
    assert recorder.server_errors() == []
    assert log_problems(stack) == []
    report(f"{len(references)} orders, callback racing the return page: payment confirmed by {sources}")


def test_owner_cancel_racing_the_consumer_payment_settles_one_way(
    stack: Stack, report: Callable[[str], None]
) -> None:
    """The owner cancels the open checkout in the admin at the very moment the consumer clicks Pay on the
    gateway's page. The gateway lets one of them win; the shop ends as the gateway says (paid and fulfilled
    once, or cancelled and never fulfilled), whatever order the callback, the return page and the cancel's
    answer arrive in."""
    recorder = Recorder()
    owner = owner_session(stack, recorder)
    token_for_forms = csrf_token(owner.get(f"{stack.shop.url}/admin/", timeout=30).text)
    references: list[str] = []
    for _round in range(ROUNDS):
        racers = []
        for _ in range(ORDERS_PER_ROUND):
            shopper, payment_url = place_order(stack, {"mohair-throw": 1}, recorder)
            page = shopper.session.get(payment_url, timeout=30)  # the page is open, Pay about to be clicked
            reference = order_reference(stack, token_of(payment_url))
            references.append(reference)
            racers.append((shopper.fresh_connections(), payment_url, page, reference, clone(owner, recorder)))

        def race(index: int, racers: list = racers) -> int:  # type: ignore[type-arg]
            shopper, payment_url, page, reference, admin = racers[index // 2]
            if index % 2 == 0:
                # The click on the page opened before the race (a reload could already show the cancel).
                return shopper.pay_or_cancel(payment_url, "pay", page=page).status_code
            answer = admin.post(
                f"{stack.shop.url}/admin/orders/{reference}/cancel",
                data={"csrf_token": token_for_forms},
                timeout=60,
            )
            return answer.status_code

        answers = together(2 * ORDERS_PER_ROUND, race)
        # Pay: the order page (200), or the gateway's "already cancelled" (409). Cancel: the admin's page.
        assert all(a in (200, 409) for a in answers[0::2]), answers
        assert answers[1::2] == [200] * ORDERS_PER_ROUND, answers

    wait_for(
        lambda: not control_get(stack, "deliveries", state="pending")["deliveries"],
        timeout=60,
        what="the callbacks to be delivered",
    )
    gateway = dict(
        fetch_all(
            stack.emulator_db,
            "SELECT merchant_order_reference, status FROM emulator_checkouts WHERE merchant_order_reference = ANY(:r)",
            r=references,
        )
    )
    shop = dict(
        fetch_all(
            stack.shop_db, "SELECT reference, status FROM shop_orders WHERE reference = ANY(:r)", r=references
        )
    )
    fulfilled = fulfilment_counts(stack, references)
    expected = {"PAID": "paid", "PAID_PENDING_CALLBACK": "paid", "CANCELLED_BY_MERCHANT": "cancelled"}
    for reference in references:
        assert gateway[reference] in expected, (reference, gateway[reference])
        assert shop[reference] == expected[gateway[reference]], (
            reference,
            shop[reference],
            gateway[reference],
        )
        assert fulfilled[reference] == (1 if shop[reference] == "paid" else 0), reference
    assert signal_counts(stack, references, "payment_confirmed") == {
        r: 1 if shop[r] == "paid" else 0 for r in references
    }
    assert recorder.server_errors() == []
    assert log_problems(stack) == []
    report(
        f"{len(references)} orders, owner cancel racing the consumer's Pay: "
        f"gateway {dict(Counter(gateway.values()))}, shop {dict(Counter(shop.values()))}"
    )


def test_reconcile_runs_racing_callbacks_and_return_pages_fulfil_once(
    stack: Stack, report: Callable[[str], None], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two reconciliation runs (the cron job, in a process of their own: the shop's app built here, on the
    same database) start at the moment the callbacks and the shoppers' return pages of the same freshly
    paid orders arrive at the gunicorn workers. Every order is fulfilled once, whoever confirms it."""
    add_fault(stack, operation="callback", kind="callback_fail")
    recorder = Recorder()
    racers = []
    for _ in range(2 * ORDERS_PER_ROUND):
        shopper, payment_url = place_order(stack, {"potjie-pot": 1}, recorder)
        token = token_of(payment_url)
        paid = shopper.pay_or_cancel(payment_url, "pay", follow=False)
        assert paid.status_code == 303
        body, headers = callback_request(stack, token)
        racers.append((shopper, paid.headers["Location"], body, headers, order_reference(stack, token)))
    references = [racer[4] for racer in racers]
    for racer in racers:
        racer[0].fresh_connections()

    for name, value in stack.shop_env.items():
        monkeypatch.setenv(name, value)
    cron = create_shop_app()
    with cron.app_context():  # warm: connections made, nothing due yet
        assert reconcile(older_than_seconds=10**9).polled == 0
    reports: list[ReconcileReport] = []

    def race(index: int) -> int:
        if index < 2:
            with cron.app_context():
                reports.append(reconcile(older_than_seconds=0))
            return 200
        shopper, return_url, body, headers, _reference = racers[(index - 2) // 2]
        if index % 2 == 0:
            return _post_callback(stack, body, headers).status_code
        return shopper.session.get(return_url, timeout=60).status_code

    try:
        answers = together(2 + 2 * len(racers), race)
    finally:
        with cron.app_context():
            shop_db.session.remove()
            shop_db.engine.dispose()
    assert answers == [200] * len(answers), answers
    assert all(not r.errors for r in reports), [r.errors for r in reports]

    confirmed_by = dict(
        fetch_all(
            stack.shop_db,
            "SELECT e.source, count(*) FROM gateway_checkout_events e JOIN gateway_checkouts c "
            "ON c.id = e.checkout_id WHERE e.applied AND e.to_status IN ('PAID', 'PAID_PENDING_CALLBACK') "
            "AND e.from_status NOT IN ('PAID', 'PAID_PENDING_CALLBACK') AND c.order_reference = ANY(:r) "
            "GROUP BY e.source",
            r=references,
        )
    )
    assert sum(confirmed_by.values()) == len(references)
    assert fulfilment_counts(stack, references) == dict.fromkeys(references, 1)
    assert sum(r.confirmed for r in reports) == confirmed_by.get("reconcile", 0)
    # The gunicorn workers' signals (the cron process has no counter): one per order they confirmed.
    counted = signal_counts(stack, references, "payment_confirmed")
    assert sum(counted.values()) == len(references) - confirmed_by.get("reconcile", 0)
    assert all(n <= 1 for n in counted.values())
    assert recorder.server_errors() == []
    assert log_problems(stack) == []
    report(
        f"{len(references)} orders, 2 reconcile runs racing callbacks and return pages: confirmed by "
        f"{confirmed_by}; the runs polled {[r.polled for r in reports]}"
    )
