"""Reconciliation across several merchant accounts (issue 27): every account in one run and one pool, each
checkout asked about with its own account's key, a retired account's checkouts settled too, and one
account's gateway failing (its key refused, its key unreadable) without stopping the others' polls."""

from __future__ import annotations

import json
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import select, update

from flask_gateway import signals
from flask_gateway.core.auth import ACCOUNT_HEADER
from flask_gateway.core.timestamps import utcnow
from flask_gateway.errors import UnknownAccountError
from flask_gateway.models import GatewayCheckout, JobRun
from flask_gateway.operations.reconciliation import ReconcileReport, reconcile
from flask_gateway.payments.accounts import retire_account
from flask_gateway.state import get_state
from tests.extension.conftest import ACCOUNT, EMULATOR_URL, Harness
from tests.extension.operations.cli_support import SECOND, break_signing_key, checkout_of, install_account
from tests.extension.operations.operations_support import load, spy
from tests.extension.operations.test_reconcile_concurrency import StubGateway
from tests.extension.payments.test_statement_counts import seed
from tests.processes import WAIT_DEADLINE

# Claims of several accounts in one IN (...) under SKIP LOCKED / BEGIN IMMEDIATE.
pytestmark = pytest.mark.backends


@pytest.fixture
def two(harness: Harness) -> Harness:
    """The harness's account and a second one, both installed (the second is the default)."""
    harness.install()
    install_account(harness)
    return harness


def run(harness: Harness, **options: Any) -> ReconcileReport:
    options.setdefault("older_than_seconds", 0)
    with harness.shop.app_context():
        return reconcile(**options)


def lose_callbacks(harness: Harness) -> None:
    """Every callback attempt fails from now on: the shop hears of a payment only by asking."""
    harness.emulator.control("faults", {"operation": "callback", "kind": "callback_fail"})


def asked(transport: Any) -> list[str]:
    """The tokens getstatus was asked about, in order."""
    return [s.body["checkoutToken"] for s in transport.sent if s.path == "/v2/getstatus"]


@contextmanager
def confirmations() -> Iterator[list[tuple[str, str]]]:
    """The (token, account) of each ``payment_confirmed``, read when it is sent."""
    seen: list[tuple[str, str]] = []

    def receiver(_sender: Any, **kwargs: Any) -> None:
        seen.append((kwargs["checkout"].token, kwargs["checkout"].merchant_account_id))

    signals.payment_confirmed.connect(receiver)
    try:
        yield seen
    finally:
        signals.payment_confirmed.disconnect(receiver)


def status_of(harness: Harness, checkout_id: int) -> str:
    with harness.shop.app_context():
        return load(harness, checkout_id).status


@pytest.mark.parametrize("concurrency", [1, 4])
def test_one_run_reconciles_every_account_with_its_own_key(two: Harness, concurrency: int) -> None:
    lose_callbacks(two)
    first_id, first_token = checkout_of(two, ACCOUNT, "A-1")
    second_id, second_token = checkout_of(two, SECOND, "B-1")
    _, open_token = checkout_of(two, SECOND, "B-2")
    for token in (first_token, second_token):
        assert two.emulator.pay(token).status_code == 200
    transport = spy(two)
    with confirmations() as confirmed:
        report = run(two, concurrency=concurrency)
    assert (report.due, report.polled, report.confirmed, report.failed) == (3, 3, 2, 0), report.summary()
    # Once each, and each signed with its own account's key (another's: the emulator answers 401).
    assert sorted(asked(transport)) == sorted([first_token, second_token, open_token])
    assert sorted(confirmed) == sorted([(first_token, ACCOUNT), (second_token, SECOND)])
    assert status_of(two, first_id) == status_of(two, second_id) == "PAID_PENDING_CALLBACK"
    first, second = report.accounts[ACCOUNT], report.accounts[SECOND]
    assert (first.due, first.polled, first.confirmed, first.failed, first.default) == (1, 1, 1, 0, False)
    assert (second.due, second.polled, second.confirmed, second.failed, second.default) == (2, 2, 1, 0, True)
    assert list(report.accounts) == [ACCOUNT, SECOND]  # oldest first
    summary = report.summary()
    assert summary.splitlines()[0] == (
        "Polled 3 of 3 due checkout(s): 2 changed, 2 payment(s) confirmed, 0 expired, 0 failed."
    )
    assert "Per account:" in summary
    assert (
        f"  {ACCOUNT}: polled 1 of 1 due, 1 changed, 1 payment(s) confirmed, 0 expired, 0 failed." in summary
    )
    assert (
        f"  {SECOND} (default): polled 2 of 2 due, 1 changed, 1 payment(s) confirmed, 0 expired, 0 failed."
        in summary
    )


@pytest.mark.parametrize("concurrency", [1, 4])
def test_an_account_whose_key_the_gateway_refuses_fails_alone(two: Harness, concurrency: int) -> None:
    """The second account's stored key is not the gateway's: each of its polls would be refused (401). The
    first account's lost payment is still found and confirmed; the second's checkouts are counted as
    failed, for that account, and once the gateway refused its key the run stops asking about them."""
    lose_callbacks(two)
    paid_id, paid_token = checkout_of(two, ACCOUNT, "A-1")
    assert two.emulator.pay(paid_token).status_code == 200
    _, open_token = checkout_of(two, ACCOUNT, "A-2")
    refused = [checkout_of(two, SECOND, f"B-{n}")[1] for n in range(5)]
    with two.shop.app_context():
        issued = get_state().require_installation(SECOND).signing_key_encrypted
    break_signing_key(two, SECOND)
    transport = spy(two)
    with confirmations() as confirmed:
        report = run(two, concurrency=concurrency)

    assert confirmed == [(paid_token, ACCOUNT)]
    assert status_of(two, paid_id) == "PAID_PENDING_CALLBACK"
    first, second = report.accounts[ACCOUNT], report.accounts[SECOND]
    assert (first.polled, first.confirmed, first.failed, first.problem) == (2, 1, 0, None)
    assert (second.due, second.polled, second.failed) == (5, 0, 5)
    assert second.problem is not None and "refused" in second.problem and SECOND in second.problem
    assert (report.due, report.polled, report.failed) == (7, 2, 5)
    assert {error.account for error in report.errors} == {SECOND}
    assert {error.token for error in report.errors} == set(refused)
    assert any("HTTP 401" in error.message for error in report.errors)
    # One request per checkout at most; in turn, the first refusal is the last request of that account.
    second_asked = [token for token in asked(transport) if token in refused]
    assert sorted(t for t in asked(transport) if t not in refused) == sorted([paid_token, open_token])
    assert Counter(second_asked).most_common(1)[0][1] == 1
    if concurrency == 1:
        assert len(second_asked) == 1
    else:
        assert 1 <= len(second_asked) <= concurrency
    summary = report.summary()
    assert f"  {SECOND} (default): polled 0 of 5 due, 0 changed" in summary
    assert (
        "5 failed; STOPPED: the gateway refused the key of account second-brand (getstatus: HTTP 401"
        in summary
    )
    assert (
        f"  {ACCOUNT}: polled 2 of 2 due, 1 changed, 1 payment(s) confirmed, 0 expired, 0 failed." in summary
    )
    assert f"of account {SECOND}: not asked: the gateway refused the key of account {SECOND}" in summary
    assert f"of account {SECOND}: getstatus: HTTP 401" in summary  # each failure line names its account
    # The refused account's checkouts are asked about again by a later run, once its key is right.
    with two.shop.app_context():
        get_state().session.execute(
            update(GatewayCheckout).values(last_polled_at=utcnow() - timedelta(hours=1))
        )
        get_state().session.commit()
        get_state().require_installation(SECOND).signing_key_encrypted = issued  # the key put right
        get_state().session.commit()
    again = run(two, concurrency=concurrency)
    assert again.accounts[SECOND].polled == 5 and again.accounts[SECOND].problem is None, again.summary()


def test_an_account_whose_key_cannot_be_read_is_not_asked_about(two: Harness) -> None:
    """A stored key that does not decrypt (the encryption key changed for that row): its checkouts fail
    without a request; the other account's are polled."""
    _, first_token = checkout_of(two, ACCOUNT, "A-1")
    second_ids = [checkout_of(two, SECOND, f"B-{n}")[0] for n in range(2)]
    with two.shop.app_context():
        installation = get_state().require_installation(SECOND)
        installation.signing_key_encrypted = "not-a-fernet-token"
        get_state().session.commit()
    transport = spy(two)
    report = run(two)
    assert asked(transport) == [first_token]
    assert report.accounts[ACCOUNT].polled == 1
    assert (report.accounts[SECOND].polled, report.accounts[SECOND].failed) == (0, 2)
    assert "signing key" in (report.accounts[SECOND].problem or "")
    assert sorted(error.checkout_id for error in report.errors) == sorted(second_ids)
    assert "STOPPED: the signing key of account second-brand cannot be read" in report.summary()


def test_a_retired_accounts_checkouts_are_reconciled_with_its_own_key(two: Harness) -> None:
    """Retiring closes an account for new checkouts only: the run still settles its open ones (and asks
    about its recently paid ones), with its key."""
    lose_callbacks(two)
    first_id, first_token = checkout_of(two, ACCOUNT, "A-1")
    assert two.emulator.pay(first_token).status_code == 200
    with two.shop.app_context():
        retire_account(ACCOUNT)
    report = run(two, paid_window_hours=72, paid_recheck_seconds=0)
    assert report.accounts[ACCOUNT].retired and not report.accounts[ACCOUNT].default
    assert (report.accounts[ACCOUNT].polled, report.accounts[ACCOUNT].confirmed) == (1, 1), report.summary()
    assert status_of(two, first_id) == "PAID_PENDING_CALLBACK"
    assert f"  {ACCOUNT} (retired): polled 1 of 1 due" in report.summary()
    # The callback arrives at last (the gateway then says PAID); the paid pass asks with the retired key.
    two.emulator.control("faults", method="DELETE")
    two.emulator.advance(3)
    two.emulator.control("deliver")
    assert status_of(two, first_id) == "PAID"
    with two.shop.app_context():
        get_state().session.execute(
            update(GatewayCheckout).values(last_polled_at=utcnow() - timedelta(hours=2))
        )
        get_state().session.commit()
    paid = run(two, paid_window_hours=72, paid_recheck_seconds=0)
    assert (paid.paid_polled, paid.paid_failed) == (1, 0), paid.summary()
    assert (paid.accounts[ACCOUNT].paid_due, paid.accounts[ACCOUNT].paid_polled) == (1, 1)
    assert "checked 1 of 1 paid, 0 changed, 0 failed" in paid.summary()


def test_every_account_retired_is_still_reconciled(two: Harness) -> None:
    """No account open (no default): nothing takes new checkouts, but the open ones are still settled."""
    checkout_of(two, SECOND, "B-1")
    with two.shop.app_context():
        retire_account(ACCOUNT)
        retire_account(SECOND)
    report = run(two)
    assert report.installed and report.polled == 1
    assert not any(account.default for account in report.accounts.values())


def test_one_account_only(two: Harness) -> None:
    first = checkout_of(two, ACCOUNT, "A-1")[1]
    second = checkout_of(two, SECOND, "B-1")[1]
    transport = spy(two)
    report = run(two, account=SECOND)
    assert asked(transport) == [second]
    assert list(report.accounts) == [SECOND] and report.polled == 1
    assert report.other_account == 0  # the first account is installed: not "another account", just not asked
    assert "Per account:" not in report.summary()  # one account in the run: the summary of one
    assert run(two, account=ACCOUNT).polled == 1 and asked(transport) == [second, first]


def test_an_unknown_account_is_refused_before_the_run(two: Harness) -> None:
    with two.shop.app_context():
        with pytest.raises(UnknownAccountError, match="installed: demo-merchant, second-brand") as raised:
            reconcile(account="nope")
        assert raised.value.account == "nope"
        # Not a failed run of the job: the heartbeat never heard of it.
        assert get_state().session.scalar(select(JobRun).where(JobRun.job == "reconcile")) is None


def test_checkouts_of_an_account_not_installed_are_counted_not_polled(two: Harness) -> None:
    checkout_id, _ = checkout_of(two, SECOND, "B-1")
    checkout_of(two, ACCOUNT, "A-1")
    with two.shop.app_context():
        get_state().session.execute(
            update(GatewayCheckout)
            .where(GatewayCheckout.id == checkout_id)
            .values(merchant_account_id="gone")
        )
        get_state().session.commit()
    report = run(two)
    assert (report.polled, report.other_account) == (1, 1)
    assert "1 open checkout(s) belong to another merchant account and were skipped." in report.summary()


def test_one_account_reads_as_before(harness: Harness) -> None:
    """A shop with one account: the report holds that account, and its summary has no per-account lines."""
    harness.install()
    checkout_of(harness, ACCOUNT, "A-1")
    report = run(harness)
    assert list(report.accounts) == [ACCOUNT] and report.accounts[ACCOUNT].default
    assert report.summary().splitlines() == [
        "Polled 1 of 1 due checkout(s): 0 changed, 0 payment(s) confirmed, 0 expired, 0 failed.",
        "Statuses now: Awaiting payment (PENDING_ORDER): 1",
        "Checked 0 of 0 paid checkout(s) due from the last 72 hour(s): 0 changed, 0 failed.",
    ]


class AccountsSeen(StubGateway):
    """The stub gateway of the concurrency tests, also recording which account signed each question."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.signed_as: dict[str, list[str]] = {}

    def send(self, request: Any, *args: Any, **kwargs: Any) -> Any:
        token = json.loads(request.body)["checkoutToken"]
        with self.lock:
            self.signed_as.setdefault(token, []).append(request.headers[ACCOUNT_HEADER])
        return super().send(request, *args, **kwargs)


@pytest.mark.parametrize("concurrency", [4, 1])
def test_two_runs_at_once_split_every_accounts_work(two: Harness, concurrency: int) -> None:
    """80 checkouts, half of each account: two runs started together (one pool each) ask about each one
    once, signed as its own account, and both runs do some of the work."""
    seed(two, 80)
    with two.shop.app_context():
        session = get_state().session
        ids = list(session.scalars(select(GatewayCheckout.id).order_by(GatewayCheckout.id)))
        for checkout_id in ids[1::2]:
            session.execute(
                update(GatewayCheckout)
                .where(GatewayCheckout.id == checkout_id)
                .values(merchant_account_id=SECOND, token=f"v2.{SECOND}.seed-{checkout_id}")
            )
        session.commit()
        rows = session.execute(select(GatewayCheckout.token, GatewayCheckout.merchant_account_id))
        owner = {str(row[0]): str(row[1]) for row in rows}
    # No answer until one more request is in flight than one run's pool holds: both runs are polling.
    gateway = AccountsSeen(together=concurrency + 1)
    get_state(two.shop).client_options["session"].mount(EMULATOR_URL, gateway)
    start = threading.Barrier(2)
    reports: list[ReconcileReport] = []
    failures: list[BaseException] = []

    def one_run() -> None:
        try:
            with two.shop.app_context():
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
    assert first.polled + second.polled == 80 and first.polled > 0 and second.polled > 0
    assert not first.errors and not second.errors
    assert Counter(gateway.asked) == Counter(list(owner))  # each asked once, by one of the runs
    assert gateway.signed_as == {token: [account] for token, account in owner.items()}
    for account in (ACCOUNT, SECOND):
        assert first.accounts[account].polled + second.accounts[account].polled == 40
