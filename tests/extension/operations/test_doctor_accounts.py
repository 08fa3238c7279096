"""``flask gateway doctor`` and ``/gateway/readyz`` with two merchant accounts (issue 27): the installation,
settings and callback findings made for each account and naming it; a retired account reported as retired
with its open checkouts; every account retired is a problem for the doctor, not for readiness."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import requests
from sqlalchemy import select
from sqlalchemy.engine import make_url

from flask_gateway.models import CallbackLog
from flask_gateway.operations.doctor import run_checks
from flask_gateway.payments.accounts import retire_account
from flask_gateway.payments.installation import InstallSettings, install
from flask_gateway.state import get_state
from flask_gateway.testing import DEMO_ACCOUNT
from tests.extension.operations.test_doctor import (  # noqa: F401  (setups: the fixture)
    ATTACKER_URL,
    SHOP,
    Setup,
    _checkout_waiting,
    doctor,
    findings,
    problems,
    setups,
)

pytestmark = pytest.mark.backends  # the installations' queries, the retired account's open checkouts

OTHER = "second-brand"
OTHER_KEY = "second-brand-api-key"


def install_other(setup: Setup) -> None:
    """Issue OTHER on the emulator (its control API) and install it beside the first account, on its own
    callback path."""
    made = setup.gateway.client.post(
        "/_emulator/accounts", json={"merchantAccountId": OTHER, "merchantAccountApiKey": OTHER_KEY}
    )
    assert made.status_code in (200, 201), made.get_data(as_text=True)
    with setup.shop.app_context():
        install(
            InstallSettings(
                merchant_account_id=OTHER,
                api_key=OTHER_KEY,
                callback_url=f"{SHOP}/gateway/callback/{OTHER}",
                callback_failures_email=None,
                minimum_cents=100,
                maximum_cents=10_000_000,
            )
        )


@pytest.fixture
def two(setups: Callable[..., Setup]) -> Setup:  # noqa: F811
    setup = setups()
    install_other(setup)
    return setup


def move_callback_of(setup: Setup, account: str) -> None:
    """Someone signs a settings update for ``account`` through the sandbox's 401 answer."""
    raw = json.dumps({"checkoutStatusCallbackUrl": ATTACKER_URL}).encode()
    headers = {"Content-Type": "application/json", "X-Merchant-Account-ID": account}
    client = setup.gateway.client
    refused = client.patch("/install/v2", data=raw, headers={**headers, "X-Signature": "junk"})
    signed = {**headers, "X-Signature": refused.json["expectedSignature"]}
    assert client.patch("/install/v2", data=raw, headers=signed).status_code == 200


def test_two_healthy_accounts_pass_each_named(two: Setup) -> None:
    result = doctor(two.shop)

    assert result.exit_code == 0, result.output
    found = findings(result.stdout)
    [(mark, installation)] = found["installation"]
    assert mark == "ok"
    assert (
        f"installed: merchant account {DEMO_ACCOUNT}, callback URL {SHOP}/gateway/callback," in installation
    )
    assert (
        f"installed: merchant account {OTHER} (the default for new checkouts), callback URL "
        f"{SHOP}/gateway/callback/{OTHER}," in installation
    )
    [(mark, settings)] = found["settings"]
    assert mark == "ok"
    for account in (DEMO_ACCOUNT, OTHER):
        assert f"merchant account {account}: the gateway's callback URL, e-mail, limits" in settings
    [(mark, callback)] = found["callback"]
    assert mark == "ok"
    assert f"merchant account {DEMO_ACCOUNT}: POST {SHOP}/gateway/callback answered 401" in callback
    assert f"merchant account {OTHER}: POST {SHOP}/gateway/callback/{OTHER} answered 401" in callback
    [(mark, public)] = found["public-url"]
    assert (
        mark == "ok" and f"{OTHER}: {SHOP}/gateway/callback/{OTHER}" in public
    )  # its own path is the shop's
    with two.shop.app_context():
        rows = get_state().session.scalars(select(CallbackLog)).all()
    assert sorted((row.outcome, row.http_status) for row in rows) == [("doctor-probe", 401)] * 2


def test_the_doctor_holds_no_lock_while_the_shop_answers_its_probes(two: Setup) -> None:
    """The shop records each probe (a write). Were the doctor still in a transaction while probing (on
    SQLite: the writer's lock), a shop in another process would wait for it past the probe's timeout, and
    the doctor would report a healthy shop as not answering (the running demo: 21 s, then ReadTimeout).
    Each probe here first takes SQLite's write lock itself, at once or not at all."""
    if two.databases.backend != "sqlite":
        pytest.skip("SQLite's one writer (PostgreSQL's row locks are the writes' own)")
    path: str = make_url(two.databases.url("main")).database or ""
    assert path
    free: list[str] = []

    class LockFree(requests.Session):
        def post(self, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
            other = sqlite3.connect(path, timeout=0, isolation_level=None)  # another connection: no waiting
            try:
                other.execute("BEGIN IMMEDIATE")  # "database is locked" if the doctor holds it
                other.execute("ROLLBACK")
            finally:
                other.close()
            free.append(str(url))
            return super().post(url, *args, **kwargs)

    with two.shop.app_context():
        report = run_checks(http=LockFree(), timeout=2)
    callbacks = [f for f in report.findings if f.check == "callback"]
    assert sorted(free) == [f"{SHOP}/gateway/callback", f"{SHOP}/gateway/callback/{OTHER}"], report.findings
    assert [f.level for f in callbacks] == ["ok", "ok"], callbacks


def test_one_accounts_drift_is_its_own_problem(two: Setup) -> None:
    move_callback_of(two, OTHER)

    result = doctor(two.shop)

    assert result.exit_code == 1, result.output
    assert list(problems(result.stdout)) == ["settings"]
    [said] = [text for mark, text in findings(result.stdout)["settings"] if mark == "PROBLEM"]
    assert said.startswith(f"merchant account {OTHER}: the gateway's settings differ from the shop's:")
    assert ATTACKER_URL in said and DEMO_ACCOUNT not in said.partition(" fix: ")[0]
    with two.shop.app_context():
        state = get_state()
        assert state.require_installation(OTHER).settings_drift
        assert state.require_installation(DEMO_ACCOUNT).settings_drift == []


def test_a_retired_account_is_reported_with_its_open_checkouts_and_all_retired_is_a_problem(
    two: Setup,
) -> None:
    _checkout_waiting(two, timedelta(minutes=1))  # the default account's: OTHER
    with two.shop.app_context():
        retire_account(OTHER)

    result = doctor(two.shop, "--no-network")

    assert result.exit_code == 0, result.output
    [(mark, installation)] = findings(result.stdout)["installation"]
    assert mark == "ok"
    assert f"merchant account {OTHER} is retired (closed for new checkouts since " in installation
    assert "1 open checkout(s) left on it, whose callbacks, refunds and reconciliation go on" in installation
    assert f"installed: merchant account {DEMO_ACCOUNT} (the default for new checkouts)" in installation

    with two.shop.app_context():
        retire_account(DEMO_ACCOUNT)
    result = doctor(two.shop, "--no-network")

    assert result.exit_code == 1, result.output
    assert list(problems(result.stdout)) == ["installation"]
    said = problems(result.stdout)["installation"]
    assert f"every merchant account installed here is retired ({DEMO_ACCOUNT}, {OTHER})" in said
    # Readiness: installed (retired accounts' callbacks, refunds and reconciliation still need the process).
    answer = two.shop.test_client().get("/gateway/readyz")
    assert answer.status_code == 200, answer.get_json()
    assert answer.get_json()["checks"]["installation"] == {"ok": True}
