"""Reconciliation's pool of polling threads: requests overlap, each checkout is asked about once, the report
is exact, two runs at once split the work, and a run holds a bounded number of checkouts."""

from __future__ import annotations

import json
import threading
import time
from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import requests
from requests.adapters import BaseAdapter
from requests.structures import CaseInsensitiveDict
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from flask_gateway import signals
from flask_gateway.config import GatewayConfig
from flask_gateway.core.timestamps import format_timestamp, utcnow
from flask_gateway.errors import ConfigurationError
from flask_gateway.models import GatewayCheckout
from flask_gateway.operations.reconciliation import (
    AHEAD_PER_THREAD,
    BATCH_SIZE,
    ReconcileReport,
    answers,  # the submodules a test patches: where the run looks the names up
    claiming,
    pool,
    reconcile,
)
from flask_gateway.payments import polling
from flask_gateway.state import get_state
from tests.extension.conftest import EMULATOR_URL, Harness
from tests.extension.operations.operations_support import recording
from tests.extension.payments.test_statement_counts import seed
from tests.processes import WAIT_DEADLINE

# Claims under SKIP LOCKED / BEGIN IMMEDIATE from several threads and runs, one transaction per batch.
pytestmark = pytest.mark.backends


class StubGateway(BaseAdapter):
    """getstatus answered in-process, from any thread: what each token's answer is (``answer(token)``: a
    status, or an exception to raise), how many requests were in flight at once, every token asked."""

    def __init__(
        self,
        answer: Callable[[str], str | BaseException] = lambda token: "PENDING_ORDER",
        *,
        barrier: threading.Barrier | None = None,
        delay: float = 0.0,
        together: int | None = None,
    ) -> None:
        """``together``: no request is answered until that many were in flight at once (once it happened,
        none waits): more than one run's pool can hold proves that two runs were polling together."""
        super().__init__()
        self.answer, self.barrier, self.delay = answer, barrier, delay
        self.lock = threading.Lock()
        self.in_flight = self.most_in_flight = 0
        self.asked: list[str] = []
        self.threads: set[int] = set()
        self.together = together
        self.were_together = threading.Event()

    def send(self, request: Any, *_args: Any, **_kwargs: Any) -> requests.Response:  # type: ignore[override]
        token = json.loads(request.body)["checkoutToken"]
        with self.lock:
            self.asked.append(token)
            self.threads.add(threading.get_ident())
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
            if self.together is not None and self.in_flight >= self.together:
                self.were_together.set()
        try:
            if self.barrier is not None:
                # Raises (so the checkout fails) unless enough come in flight; the deadline is a last resort.
                self.barrier.wait(timeout=WAIT_DEADLINE)
            if self.together is not None and not self.were_together.wait(WAIT_DEADLINE):
                raise requests.ConnectionError(f"never {self.together} requests in flight at once")
            if self.delay:
                time.sleep(self.delay)
            answer = self.answer(token)
        finally:
            with self.lock:
                self.in_flight -= 1
        if isinstance(answer, BaseException):
            raise answer
        response = requests.Response()
        response.status_code = 200
        response._content = json.dumps(_payload(token, answer)).encode()
        response.headers = CaseInsensitiveDict({"Content-Type": "application/json"})
        response.url, response.request = request.url, request
        return response

    def close(self) -> None:
        pass


def _payload(token: str, status: str) -> dict[str, object]:
    now = utcnow()
    paid = status in ("PAID_PENDING_CALLBACK", "PAID")
    return {
        "requestId": "r",
        "checkoutToken": token,
        "checkoutTotalCents": 79800,
        "paymentUrl": f"{EMULATOR_URL}/api/v2/app/checkout/{token}",
        "checkoutPaymentStatus": status,
        "paidAt": format_timestamp(now) if paid else None,
        "paymentReference": 12345 if paid else None,
        "merchantOrderReference": "ORD-1",
        "serviceOrderReference": None,
        "clickTraceId": None,
        "createdAt": format_timestamp(now),
        "updatedAt": format_timestamp(now),
        "expiresAt": format_timestamp(now + timedelta(hours=1)),
        "cancelledAt": None,
        "lastCallbackAttemptedAt": None,
        "lastCallbackAttemptStatusMessage": None,
    }


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


def pending(harness: Harness, count: int) -> list[str]:
    """``count`` pending v2 checkouts of the installed account (bulk-inserted); their tokens."""
    seed(harness, count)
    with harness.shop.app_context():
        return sorted(t for t in get_state().session.scalars(select(GatewayCheckout.token)) if t)


def stub(harness: Harness, gateway: StubGateway) -> StubGateway:
    get_state(harness.shop).client_options["session"].mount(EMULATOR_URL, gateway)
    return gateway


def run(harness: Harness, **options: Any) -> ReconcileReport:
    options.setdefault("older_than_seconds", 0)
    options.setdefault("paid_window_hours", 0)
    with harness.shop.app_context():
        return reconcile(**options)


def test_requests_overlap_up_to_the_pool(installed: Harness) -> None:
    """Each request waits until four are in flight: only a pool of four polling at once gets through."""
    tokens = pending(installed, 8)
    gateway = stub(installed, StubGateway(barrier=threading.Barrier(4)))
    report = run(installed, concurrency=4)
    assert (report.due, report.polled, report.failed) == (8, 8, 0), report.summary()
    assert gateway.most_in_flight == 4
    assert len(gateway.threads) == 4
    assert sorted(gateway.asked) == tokens


def test_the_default_pool_comes_from_the_configuration(installed: Harness) -> None:
    tokens = pending(installed, 6)
    get_state(installed.shop).config = _with(installed, reconcile_concurrency=3)
    gateway = stub(installed, StubGateway(barrier=threading.Barrier(3)))
    report = run(installed)
    assert (report.polled, report.failed) == (6, 0), report.summary()
    assert gateway.most_in_flight == 3
    assert sorted(gateway.asked) == tokens


def test_concurrency_one_polls_in_the_calling_thread(installed: Harness) -> None:
    pending(installed, 5)
    gateway = stub(installed, StubGateway())
    report = run(installed, concurrency=1)
    assert report.polled == 5
    assert gateway.threads == {threading.get_ident()}
    assert gateway.most_in_flight == 1


def test_each_checkout_once_and_the_report_exact(installed: Harness) -> None:
    """60 checkouts over 8 threads: some paid (confirmed once each), some failing (counted, the run goes
    on), the others still open; every count of the report adds up, one request per checkout."""
    tokens = pending(installed, 60)
    failing = set(tokens[1::7])
    paid = set(tokens[::5]) - failing

    def answer(token: str) -> str | BaseException:
        if token in failing:
            return requests.ConnectTimeout("no answer")
        return "PAID_PENDING_CALLBACK" if token in paid else "PENDING_ORDER"

    gateway = stub(installed, StubGateway(answer, delay=0.002))
    steps: list[tuple[int, int]] = []
    step_threads: set[int] = set()

    def progress(done: int, total: int) -> None:
        steps.append((done, total))
        step_threads.add(threading.get_ident())

    with recording(signals.payment_confirmed) as confirmed:
        report = run(installed, concurrency=8, progress=progress)
    assert Counter(gateway.asked) == Counter(tokens)  # each asked once
    assert (report.due, report.polled, report.failed) == (60, 60 - len(failing), len(failing))
    assert (report.changed, report.confirmed) == (len(paid), len(paid))
    assert report.statuses == {
        "PAID_PENDING_CALLBACK": len(paid),
        "PENDING_ORDER": 60 - len(paid) - len(failing),
    }
    assert {error.token for error in report.errors} == failing
    assert all("did not answer in time" in error.message for error in report.errors)
    assert sorted(call["checkout"].token for call in confirmed.calls) == sorted(paid)
    # progress: once before the first poll, then after every checkout, in the calling thread
    assert steps == [(n, 60) for n in range(61)]
    assert step_threads == {threading.get_ident()}
    with installed.shop.app_context():
        rows = get_state().session.execute(select(GatewayCheckout.token, GatewayCheckout.status)).all()
    assert {token for token, status in rows if status == "PAID_PENDING_CALLBACK"} == paid
    # Nothing is due again in the same period: a second run asks nothing.
    again = run(installed, concurrency=8)
    assert again.polled == 0 and len(gateway.asked) == 60


@pytest.mark.parametrize("path", ["state machine", "unchanged in bulk"])
def test_an_answer_that_does_not_apply_fails_alone(
    installed: Harness, monkeypatch: pytest.MonkeyPatch, path: str
) -> None:
    """The answers are applied several per transaction: one that raises is rolled back alone, the others of
    its batch are applied, and nothing is asked twice. Whether it raises in the state machine (the bulk
    path off) or in the bulk path of the answers that change nothing (its whole batch rolled back)."""
    tokens = pending(installed, 30)
    broken = tokens[7]
    record_answer = polling.record_answer
    record_unchanged = polling.record_unchanged_answers

    def flaky(payload: Any, checkout_id: int, known: str, source: str) -> Any:
        if payload.checkoutToken == broken:
            raise RuntimeError("cannot apply")
        return record_answer(payload, checkout_id, known, source)

    def flaky_bulk(said: list[tuple[int, str, Any]], *args: Any, **kwargs: Any) -> Any:
        if any(payload.checkoutToken == broken for _id, _known, payload in said):
            raise RuntimeError("cannot apply")
        return record_unchanged(said, *args, **kwargs)

    if path == "state machine":
        monkeypatch.setattr(answers, "record_unchanged_answers", lambda *_args, **_kwargs: {})
        monkeypatch.setattr(answers, "record_answer", flaky)
    else:
        monkeypatch.setattr(answers, "record_unchanged_answers", flaky_bulk)
    gateway = stub(installed, StubGateway(delay=0.002))
    report = run(installed, concurrency=4)
    assert (report.polled, report.failed) == (29, 1)
    assert [error.token for error in report.errors] == [broken]
    assert Counter(gateway.asked) == Counter(tokens)
    with installed.shop.app_context():
        events = {c.token: len(c.events) for c in get_state().session.scalars(select(GatewayCheckout))}
    # Seeded with one event each; an applied answer adds one.
    assert events == {token: 1 if token == broken else 2 for token in tokens}


@pytest.mark.parametrize("path", ["state machine", "unchanged in bulk"])
@pytest.mark.parametrize("concurrency", [1, 4])
def test_a_database_outage_stops_the_run_without_a_traceback_per_checkout(
    installed: Harness,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    concurrency: int,
    path: str,
) -> None:
    """Applying each answer alone would fail the same way: the run stops at once (``flask gateway
    reconcile`` says so in one line) and the next run asks again."""
    pending(installed, 30)
    tried: list[str] = []

    def away(payload: Any, *_args: Any) -> Any:
        tried.append(payload.checkoutToken)
        raise OperationalError("UPDATE", {}, Exception("server closed the connection unexpectedly"))

    def away_in_bulk(said: list[tuple[int, str, Any]], *_args: Any, **_kwargs: Any) -> Any:
        return away(said[0][2])

    stub(installed, StubGateway())
    if path == "state machine":
        monkeypatch.setattr(answers, "record_unchanged_answers", lambda *_args, **_kwargs: {})
        monkeypatch.setattr(answers, "record_answer", away)
    else:
        monkeypatch.setattr(answers, "record_unchanged_answers", away_in_bulk)
    with pytest.raises(OperationalError, match="server closed the connection"):
        run(installed, concurrency=concurrency)
    assert len(tried) == 1  # not once more per checkout of the batch, nor for the next checkouts
    assert not [r for r in caplog.records if r.exc_info], [r.getMessage() for r in caplog.records]


def test_limit_with_a_pool(installed: Harness) -> None:
    pending(installed, 30)
    gateway = stub(installed, StubGateway())
    report = run(installed, concurrency=4, limit=7)
    assert (report.due, report.polled) == (7, 7)
    assert len(gateway.asked) == 7
    assert run(installed, concurrency=4).polled == 23
    assert len(set(gateway.asked)) == 30


def test_a_run_holds_a_bounded_number_of_checkouts(
    installed: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """200 due, 2 threads: the run claims a little at a time, and never holds (claimed, not yet applied)
    more than AHEAD_PER_THREAD * 2 + BATCH_SIZE of them, whatever the number due."""
    pending(installed, 200)
    claims: list[int] = []
    done = 0
    most_held = 0
    claim_rows = claiming._claim_rows

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal most_held
        rows = claim_rows(*args, **kwargs)
        claims.append(len(rows))
        most_held = max(most_held, sum(claims) - done)
        return rows

    def progress(now_done: int, _total: int) -> None:
        nonlocal done
        done = now_done

    monkeypatch.setattr(pool, "_claim_rows", counted)
    stub(installed, StubGateway(delay=0.001))
    report = run(installed, concurrency=2, progress=progress)
    assert report.polled == 200
    bound = AHEAD_PER_THREAD * 2 + BATCH_SIZE
    assert 0 < most_held <= bound
    assert max(claims) <= bound
    assert len([c for c in claims if c]) >= 200 // bound


@pytest.mark.parametrize("concurrency", [4, 1])
def test_two_runs_at_once_split_the_work(installed: Harness, concurrency: int) -> None:
    """Two runs started together, each with its own pool: every checkout is asked about once, by one of
    them, and both do some of the work."""
    tokens = pending(installed, 80)
    # No answer until one more request is in flight than one run's pool holds: the other run is polling
    # too, so both do some of the work, however the machine schedules the two.
    gateway = stub(installed, StubGateway(together=concurrency + 1))
    start = threading.Barrier(2)
    reports: list[ReconcileReport] = []
    failures: list[BaseException] = []

    def one_run() -> None:
        try:
            with installed.shop.app_context():
                start.wait(timeout=WAIT_DEADLINE)
                reports.append(reconcile(older_than_seconds=0, paid_window_hours=0, concurrency=concurrency))
        except BaseException as error:
            failures.append(error)

    runs = [threading.Thread(target=one_run) for _ in range(2)]
    for thread in runs:
        thread.start()
    for thread in runs:
        thread.join(timeout=2 * WAIT_DEADLINE)
    assert not failures
    assert gateway.were_together.is_set()
    first, second = reports
    assert first.polled + second.polled == 80
    assert first.polled > 0 and second.polled > 0
    assert not first.errors and not second.errors
    assert Counter(gateway.asked) == Counter(tokens)  # nobody asked twice


def test_concurrency_is_checked(installed: Harness) -> None:
    with pytest.raises(ValueError, match="concurrency"):
        run(installed, concurrency=0)
    with pytest.raises(ConfigurationError, match="GATEWAY_RECONCILE_CONCURRENCY"):
        GatewayConfig.from_mapping({"GATEWAY_RECONCILE_CONCURRENCY": 0})
    assert GatewayConfig.from_mapping({}).reconcile_concurrency == 8


def test_the_cli_option(installed: Harness) -> None:
    pending(installed, 6)
    gateway = stub(installed, StubGateway(barrier=threading.Barrier(3)))
    result = installed.shop.test_cli_runner().invoke(
        args=["gateway", "reconcile", "--older-than", "0", "--concurrency", "3", "--quiet"]
    )
    assert result.exit_code == 0, result.output
    assert "Polled 6 of 6" in result.output
    assert gateway.most_in_flight == 3
    refused = installed.shop.test_cli_runner().invoke(args=["gateway", "reconcile", "--concurrency", "0"])
    assert refused.exit_code == 2


def _with(harness: Harness, **changes: Any) -> GatewayConfig:
    import dataclasses

    return dataclasses.replace(get_state(harness.shop).config, **changes)
