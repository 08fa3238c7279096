"""Concurrent requests that must not multiply money or checkouts: refunds and creates, both sides.

- 20 parallel refunds whose sum exceeds the paid amount: on the emulator's API directly, and through the
  shop's admin (20 owner POSTs at once). The refunded total never exceeds the paid total, and the shop's
  record equals the gateway's.
- 20 parallel creates with one ``requestId`` (emulator API): one checkout. 20 concurrent "Pay" submissions
  of one shop order: at most one checkout for the order, on both sides.
"""

from __future__ import annotations

import random
import uuid
from collections import Counter
from collections.abc import Callable
from typing import Any

import requests

from tests.conftest import fetch_all
from tests.reliability.conftest import Stack
from tests.reliability.support import (
    Recorder,
    Shopper,
    add_fault,
    clone,
    control_get,
    control_post,
    csrf_token,
    direct_account,
    log_problems,
    order_reference,
    owner_session,
    place_order,
    signal_counts,
    together,
    token_of,
)

PARALLEL = 20


def _status(answer: object) -> int | str:
    return answer.status_code if isinstance(answer, requests.Response) else repr(answer)


# --- refunds --------------------------------------------------------------------------------------------


def test_parallel_refunds_on_the_gateway_api_never_exceed_the_paid_total(
    stack: Stack, report: Callable[[str], None]
) -> None:
    account = direct_account(stack)
    total = 100_000
    created = account.post("/v2/create", account.create_body(f"req-{uuid.uuid4().hex}", total))
    assert created.status_code in (200, 201), created.text
    token = created.json()["checkoutToken"]
    control_post(stack, f"checkouts/{token}/pay")
    amounts = [random.Random(i).randrange(4_000, 12_000) for i in range(PARALLEL)]
    assert sum(amounts) > total

    def refund(index: int) -> requests.Response:
        with requests.Session() as session:
            return account.post(
                "/v2/refund",
                {
                    "requestId": f"refund-{uuid.uuid4().hex}",
                    "checkoutToken": token,
                    "merchantRefundReference": f"r-{index}",
                    "refundAmountCents": amounts[index],
                    "refundDescription": f"refund {index}",
                },
                session,
            )

    answers = together(PARALLEL, refund)
    statuses = [_status(a) for a in answers]
    assert all(s in (200, 201, 409) for s in statuses), statuses
    refunded = sum(
        amounts[i] for i, a in enumerate(answers) if isinstance(a, requests.Response) and a.status_code < 300
    )
    for answer in answers:
        assert isinstance(answer, requests.Response)
        if answer.status_code == 409:
            assert "exceeds" in answer.json()["message"]
    detail = control_get(stack, f"checkouts/{token}")
    assert detail["refundedCents"] == refunded <= total
    assert sum(r["amountCents"] for r in detail["refunds"]) == refunded
    assert detail["checkoutPaymentStatus"] == (
        "FULLY_REFUNDED" if refunded == total else "PARTIALLY_REFUNDED"
    )
    report(
        f"{PARALLEL} parallel refunds on the API ({sum(amounts)} cents asked, {total} paid): "
        f"{dict(Counter(statuses))}, refunded {refunded} cents"
    )
    assert log_problems(stack) == []


def test_parallel_owner_refunds_in_the_shop_never_exceed_the_paid_total(
    stack: Stack, report: Callable[[str], None]
) -> None:
    recorder = Recorder()
    shopper, payment_url = place_order(stack, {"enamel-kettle": 2}, recorder)  # R 798.00
    token = token_of(payment_url)
    reference = order_reference(stack, token)
    page = shopper.pay_or_cancel(payment_url, "pay")
    assert page.status_code == 200 and "/orders/view/" in page.url
    total = 79_800

    owner = owner_session(stack, recorder)
    order_page = owner.get(f"{stack.shop.url}/admin/orders/{reference}", timeout=30)
    assert 'data-payment-status="paid"' in order_page.text
    token_for_forms = csrf_token(order_page.text)
    amounts = [random.Random(i).randrange(2_000, 8_000) for i in range(PARALLEL)]
    assert sum(amounts) > total
    owners = [clone(owner, recorder) for _ in range(PARALLEL)]

    def refund(index: int) -> requests.Response:
        # The confirmation step's submit (the owner saw R 0.00 refunded): every owner confirms at once.
        cents = amounts[index]
        return owners[index].post(
            f"{stack.shop.url}/admin/orders/{reference}/refund",
            data={
                "csrf_token": token_for_forms,
                "amount": f"{cents // 100}.{cents % 100:02d}",
                "reason": f"parallel refund {index}",
                "confirmed": "y",
                "refunded_before": "0",
            },
            timeout=60,
        )

    answers = together(PARALLEL, refund)
    statuses = [_status(a) for a in answers]
    # 303 to the order page (refunded, or the reason it was not); 409: refunded meanwhile, shown again for
    # a new confirmation (nothing sent); 400: more than what is left.
    assert all(s in (200, 400, 409) for s in statuses), statuses

    ((local_refunded, local_total, status),) = fetch_all(
        stack.shop_db,
        "SELECT refunded_cents, total_cents, status FROM gateway_checkouts WHERE token = :t",
        t=token,
    )
    records = fetch_all(
        stack.shop_db,
        "SELECT r.state, r.amount_cents FROM gateway_refunds r JOIN gateway_checkouts c "
        "ON c.id = r.checkout_id WHERE c.token = :t",
        t=token,
    )
    succeeded = [amount for state, amount in records if state == "SUCCEEDED"]
    assert succeeded, "no refund went through"
    gateway = control_get(stack, f"checkouts/{token}")
    assert local_total == total
    assert local_refunded == gateway["refundedCents"] == sum(succeeded) <= total
    assert len(gateway["refunds"]) == len(succeeded)
    assert [state for state, _ in records if state == "PENDING"] == []
    assert status == gateway["checkoutPaymentStatus"]
    ((order_refunded,),) = fetch_all(
        stack.shop_db, "SELECT refunded_cents FROM shop_orders WHERE reference = :r", r=reference
    )
    assert order_refunded == local_refunded
    assert signal_counts(stack, [reference], "refund_succeeded") == {reference: len(succeeded)}
    assert recorder.server_errors() == []
    assert log_problems(stack) == []
    report(
        f"{PARALLEL} parallel owner refunds ({sum(amounts)} cents asked, {total} paid): answers "
        f"{dict(Counter(statuses))}, records {dict(Counter(s for s, _ in records))}, refunded "
        f"{local_refunded} cents on both sides"
    )


# --- creates --------------------------------------------------------------------------------------------


def test_parallel_creates_with_one_request_id_make_one_checkout(
    stack: Stack, report: Callable[[str], None]
) -> None:
    account = direct_account(stack)
    request_id = f"req-{uuid.uuid4().hex}"
    body = account.create_body(request_id)

    def create(_: int) -> requests.Response:
        with requests.Session() as session:
            return account.post("/v2/create", body, session)

    answers = together(PARALLEL, create)
    statuses = [_status(a) for a in answers]
    # Created (the first), the stored answer replayed, or 409 while the first is still in flight.
    assert all(s in (200, 201, 409) for s in statuses), statuses
    tokens = {a.json()["checkoutToken"] for a in answers if isinstance(a, requests.Response) and a.ok}
    rows = fetch_all(
        stack.emulator_db,
        "SELECT token FROM emulator_checkouts WHERE account_id = :a AND request_id = :r",
        a=account.account,
        r=request_id,
    )
    assert len(rows) == 1
    assert tokens == {rows[0][0]}
    replay = account.post("/v2/create", body)
    assert replay.ok and replay.headers.get("idempotent-replay") == "true"
    assert replay.json()["checkoutToken"] == rows[0][0]
    report(f"{PARALLEL} parallel creates, one requestId: {dict(Counter(statuses))}, 1 checkout")
    assert log_problems(stack) == []


def _checkouts_of(stack: Stack, reference: str) -> tuple[list[Any], list[Any]]:
    """(the shop's gateway_checkouts rows, the emulator's checkouts) of one order."""
    local = fetch_all(
        stack.shop_db,
        "SELECT id, status, token FROM gateway_checkouts WHERE order_reference = :r",
        r=reference,
    )
    remote = fetch_all(
        stack.emulator_db,
        "SELECT token, status FROM emulator_checkouts WHERE merchant_order_reference = :r",
        r=reference,
    )
    return local, remote


def test_parallel_pay_submissions_of_one_order_make_one_checkout(
    stack: Stack, report: Callable[[str], None]
) -> None:
    """The shopper is back on the checkout form of an order whose checkout is open (Back from the payment
    page) and submits it 20 times at once: the same checkout every time."""
    recorder = Recorder()
    shopper, payment_url = place_order(stack, {"ilala-basket": 1}, recorder)
    reference = order_reference(stack, token_of(payment_url))
    form = shopper.checkout_form()
    browsers = [clone(shopper.session, recorder) for _ in range(PARALLEL)]

    def submit(index: int) -> requests.Response:
        return browsers[index].post(
            f"{stack.shop.url}/checkout", data=form, allow_redirects=False, timeout=60
        )

    answers = together(PARALLEL, submit)
    assert [_status(a) for a in answers] == [303] * PARALLEL
    assert {a.headers["Location"] for a in answers if isinstance(a, requests.Response)} == {payment_url}
    local, remote = _checkouts_of(stack, reference)
    assert len(local) == 1 and len(remote) == 1
    assert recorder.server_errors() == []
    report(f"{PARALLEL} parallel Pay submissions of an order with an open checkout: 1 checkout")


def test_parallel_pay_submissions_after_a_lost_create_answer_make_one_checkout(
    stack: Stack, report: Callable[[str], None]
) -> None:
    """The first Pay got no answer (503s until the client gave up: the checkout stays CREATING with its
    requestId); then 20 submissions at once resend that one request: one checkout on each side."""
    recorder = Recorder()
    shopper = Shopper(stack.shop.url, recorder)
    shopper.add_to_cart("ilala-basket", 1)
    form = shopper.checkout_form()
    add_fault(stack, operation="create", kind="status", status=503, count=3)  # the first try and 2 retries
    first = shopper.submit_checkout(form)
    assert first.status_code == 502, first.status_code
    ((reference,),) = fetch_all(
        stack.shop_db,
        "SELECT o.reference FROM shop_orders o JOIN gateway_checkouts c ON c.order_reference = o.reference "
        "WHERE c.status = 'CREATING' ORDER BY o.id DESC LIMIT 1",
    )
    recorder.statuses.clear()  # the 502 above was the point: from here on none is expected
    browsers = [clone(shopper.session, recorder) for _ in range(PARALLEL)]

    def submit(index: int) -> requests.Response:
        return browsers[index].post(
            f"{stack.shop.url}/checkout", data=form, allow_redirects=False, timeout=60
        )

    answers = together(PARALLEL, submit)
    statuses = [_status(a) for a in answers]
    # 303 to the payment page, or 502 "try again" while the one request is in flight (the gateway's 409).
    assert all(s in (303, 502) for s in statuses), statuses
    assert 303 in statuses
    again = shopper.submit_checkout(form)
    assert again.status_code == 303
    local, remote = _checkouts_of(stack, reference)
    assert len(local) == 1 and len(remote) == 1, (local, remote)
    assert local[0][1] == "PENDING_ORDER" and local[0][2] == remote[0][0]
    assert {
        a.headers["Location"] for a in answers if isinstance(a, requests.Response) and a.status_code == 303
    } == {again.headers["Location"]}
    report(
        f"{PARALLEL} parallel Pay submissions after a lost create answer: {dict(Counter(statuses))}, "
        "1 checkout on each side"
    )
    assert log_problems(stack) == []


def test_parallel_first_submissions_of_a_new_order_make_one_order_and_one_checkout(
    stack: Stack, report: Callable[[str], None]
) -> None:
    """20 submissions of one checkout page at once, before any answer came back (a multiple click): the
    page's ``attempt`` names one order, and the concurrent creates for that brand-new order (the
    extension's per-order lock) make one checkout."""
    recorder = Recorder()
    shopper = Shopper(stack.shop.url, recorder)
    shopper.add_to_cart("brass-desk-lamp", 1)
    form = shopper.checkout_form()
    before = {r for (r,) in fetch_all(stack.shop_db, "SELECT reference FROM shop_orders")}
    browsers = [clone(shopper.session, recorder) for _ in range(PARALLEL)]

    def submit(index: int) -> requests.Response:
        return browsers[index].post(
            f"{stack.shop.url}/checkout", data=form, allow_redirects=False, timeout=60
        )

    answers = together(PARALLEL, submit)
    statuses = [_status(a) for a in answers]
    # 303 to the payment page, or 502 "try again" while the one create is in flight (the gateway's 409).
    assert all(s in (303, 502) for s in statuses), statuses
    placed = {r for (r,) in fetch_all(stack.shop_db, "SELECT reference FROM shop_orders")} - before
    assert len(placed) == 1, placed
    (reference,) = placed
    again = shopper.submit_checkout(form)
    assert again.status_code == 303
    local, remote = _checkouts_of(stack, reference)
    assert len(local) == 1 and len(remote) == 1, (local, remote)
    assert local[0][2] == remote[0][0]
    locations = {
        a.headers["Location"] for a in answers if isinstance(a, requests.Response) and a.status_code == 303
    }
    assert locations <= {again.headers["Location"]}
    assert recorder.server_errors() == []
    report(
        f"{PARALLEL} parallel first submissions of one checkout page: {dict(Counter(statuses))}, "
        "1 order, 1 checkout on each side"
    )
