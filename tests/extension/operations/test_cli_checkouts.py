"""``flask gateway checkouts`` and a checkout named by its order reference or its token (issue 28, point 5):
the list (status in words, order, total with the symbol, age; ``--status``, ``--account``, ``--limit``,
``--json``), ``status`` and ``callbacks --checkout`` finding a checkout by either, an unknown one refused
without asking the gateway, the payment page on the shop's public address, and every printed time in
``GATEWAY_TIMEZONE``."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Iterator
from datetime import UTC
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from sqlalchemy import update

from flask_gateway import create_checkout, refresh
from flask_gateway.models import GatewayCheckout
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.extension.conftest import ACCOUNT, Harness, build_harness, sample_order
from tests.extension.operations.cli_support import SECOND, checkout_of, install_account, run_gateway
from tests.extension.operations.operations_support import new_checkout

ISO_UTC = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z\Z")


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


def invoke(harness: Harness, *args: str) -> Any:
    return run_gateway(harness.shop, *args)


def getstatus_calls(caplog: pytest.LogCaptureFixture) -> int:
    return sum("gateway getstatus:" in record.getMessage() for record in caplog.records)


def paid_and_open(harness: Harness) -> tuple[str, str]:
    """ORD-1 paid (its callback delivered), then ORD-2 left open: their tokens."""
    _, paid = new_checkout(harness, sample_order("ORD-1"))
    assert harness.emulator.pay(paid).status_code == 200
    assert harness.emulator.control("deliver").status_code == 200
    _, open_ = new_checkout(harness, sample_order("ORD-2", quantity=1, price=24900))
    return paid, open_


# --- flask gateway checkouts ----------------------------------------------------------------------------


@pytest.mark.backends
def test_checkouts_lists_the_newest_first_in_words_and_money(installed: Harness) -> None:
    paid, open_ = paid_and_open(installed)
    result = invoke(installed, "checkouts")
    assert result.exit_code == 0, result.output
    header, newest, older = result.stdout.strip().splitlines()
    assert header.split() == ["Status", "Order", "Total", "Age", "Token"]  # one account: no account column
    assert newest.split("  ")[0] == "Awaiting payment" and "ORD-2" in newest and "R 249.00" in newest
    assert newest.endswith(open_) and "just now" in newest
    assert older.startswith("Paid ") and "ORD-1" in older and "R 798.00" in older and older.endswith(paid)
    assert "PAID" not in result.stdout and "79800" not in result.stdout  # no code, no bare cents
    assert "account" not in result.stdout.lower()


@pytest.mark.parametrize("given", ["paid", "PAID", "Paid", "  paid  "])
def test_checkouts_status_takes_a_code_or_its_words_in_any_case(installed: Harness, given: str) -> None:
    paid_and_open(installed)
    rows = invoke(installed, "checkouts", "--status", given).stdout.strip().splitlines()[1:]
    assert len(rows) == 1 and "ORD-1" in rows[0]


def test_checkouts_filters_limits_and_refuses_an_unknown_status(installed: Harness) -> None:
    paid_and_open(installed)
    waiting = invoke(installed, "checkouts", "--status", "awaiting payment").stdout.strip().splitlines()
    assert len(waiting) == 2 and "ORD-2" in waiting[1]
    both = invoke(installed, "checkouts", "--status", "PENDING_ORDER", "--status", "paid").stdout
    assert "ORD-1" in both and "ORD-2" in both
    limited = invoke(installed, "checkouts", "--limit", "1").stdout.strip().splitlines()
    assert len(limited) == 2 and "ORD-2" in limited[1]
    none = invoke(installed, "checkouts", "--status", "expired")
    assert (none.exit_code, none.stdout.strip()) == (0, "No Expired checkouts.")
    bad = invoke(installed, "checkouts", "--status", "payed")
    assert bad.exit_code == 2
    assert "'payed' is no checkout status" in bad.stderr and "PAID (Paid)" in bad.stderr
    assert "Traceback" not in bad.output


@pytest.mark.backends
def test_checkouts_json_gives_codes_cents_and_iso_utc_times(installed: Harness) -> None:
    paid, open_ = paid_and_open(installed)
    result = invoke(installed, "checkouts", "--json")
    assert result.exit_code == 0, result.output
    newest, older = json.loads(result.stdout)
    assert (newest["order_reference"], newest["token"], newest["status"], newest["total_cents"]) == (
        "ORD-2",
        open_,
        "PENDING_ORDER",
        24900,
    )
    assert (older["order_reference"], older["token"], older["status"]) == ("ORD-1", paid, "PAID")
    assert (older["total_cents"], older["paid_cents"], older["refunded_cents"]) == (79800, 79800, 0)
    assert older["account"] == ACCOUNT
    assert ISO_UTC.match(older["created_at"]) and ISO_UTC.match(older["paid_at"])
    assert newest["paid_at"] is None
    assert json.loads(invoke(installed, "checkouts", "--json", "--status", "expired").stdout) == []


def test_checkouts_before_any_installation_is_an_answer(harness: Harness) -> None:
    result = invoke(harness, "checkouts")
    assert (result.exit_code, result.stdout.strip()) == (0, "No checkouts.")


@pytest.fixture
def two(harness: Harness) -> Harness:
    harness.install()
    install_account(harness)
    return harness


def test_checkouts_of_several_accounts_name_each_and_filter(two: Harness) -> None:
    checkout_of(two, ACCOUNT, "A-1")
    checkout_of(two, SECOND, "B-1")
    every = invoke(two, "checkouts").stdout.strip().splitlines()
    assert every[0].split() == ["Status", "Order", "Total", "Age", "Account", "Token"]
    assert f" {SECOND} " in every[1] and "B-1" in every[1]
    assert f" {ACCOUNT} " in every[2] and "A-1" in every[2]
    mine = invoke(two, "checkouts", "--account", ACCOUNT).stdout.strip().splitlines()
    assert len(mine) == 2 and "A-1" in mine[1]
    assert invoke(two, "checkouts", "--account", SECOND, "--status", "paid").stdout.strip() == (
        f"No Paid checkouts of account {SECOND}."
    )
    unknown = invoke(two, "checkouts", "--account", "nope")
    assert unknown.exit_code == 1 and "The merchant account 'nope' is not installed" in unknown.stderr


# --- a checkout by its order reference or its token -----------------------------------------------------


@pytest.mark.backends
def test_status_finds_a_checkout_by_its_order_reference(installed: Harness, caplog) -> None:
    _, token = new_checkout(installed, sample_order("5D57F3C7"))
    installed.emulator.pay(token)
    by_reference = invoke(installed, "status", "5D57F3C7")
    assert by_reference.exit_code == 0, by_reference.output
    assert "No local checkout" not in by_reference.output
    assert f"  token            {token}" in by_reference.stdout
    assert "checkoutPaymentStatus            PAID_PENDING_CALLBACK" in by_reference.stdout
    by_token = invoke(installed, "status", token)
    assert by_token.exit_code == 0
    assert by_token.stdout == by_reference.stdout  # the same checkout either way

    caplog.clear()
    with caplog.at_level(logging.INFO, logger="flask_gateway.client"):
        unknown = invoke(installed, "status", "5D57F3C8")
    assert unknown.exit_code == 1 and unknown.stdout == ""
    assert "no checkout has the token or order reference '5D57F3C8'" in unknown.stderr
    assert getstatus_calls(caplog) == 0  # the gateway is not asked about a guess (it was: HTTP 404)


def test_an_order_with_several_checkouts_shows_its_most_recent_and_says_so(installed: Harness) -> None:
    first_id, first = new_checkout(installed, sample_order("R-7"))
    installed.emulator.consumer_cancel(first)
    with installed.shop.app_context():
        refresh(get_state().session.get_one(GatewayCheckout, first_id))  # cancelled: the order may pay anew
    _, second = new_checkout(installed, sample_order("R-7"))
    assert second != first
    result = invoke(installed, "status", "R-7")
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == (
        f"Order R-7 has 2 checkouts: this is the most recent ({second}); the others: {first} (give a token "
        "for one of them)."
    )
    assert f"  token            {second}" in result.stdout
    older = invoke(installed, "status", first)
    assert f"  token            {first}" in older.stdout and "has 2 checkouts" not in older.stdout


def test_account_narrows_an_order_reference(two: Harness) -> None:
    checkout_of(two, ACCOUNT, "A-1")
    refused = invoke(two, "status", "A-1", "--account", SECOND)
    assert refused.exit_code == 1 and refused.stdout == ""
    assert refused.stderr.strip().splitlines()[-1] == (
        f"Error: no checkout of the merchant account {SECOND} has the token or order reference 'A-1' in "
        "this shop's database (`flask gateway checkouts` lists the recent ones); the gateway was not asked."
    )
    found = invoke(two, "status", "A-1", "--account", ACCOUNT)
    assert found.exit_code == 0, found.output
    assert f"merchant account {ACCOUNT}" in found.stdout


def test_callbacks_by_checkout_take_an_order_reference_or_a_token(installed: Harness) -> None:
    paid, _ = paid_and_open(installed)
    _, other = new_checkout(installed, sample_order("ORD-3"))
    installed.emulator.pay(other)
    installed.emulator.control("deliver")
    every = invoke(installed, "callbacks").stdout.strip().splitlines()
    assert len(every) == 2
    assert "  order ORD-3: " in every[0] and "  order ORD-1: " in every[1]  # the order, not checkout #1
    for given in ("ORD-1", paid):
        lines = invoke(installed, "callbacks", "--checkout", given).stdout.strip().splitlines()
        assert len(lines) == 1 and "  order ORD-1: " in lines[0], given
    assert invoke(installed, "callbacks", "--checkout", "ORD-2").stdout.strip() == "No callbacks match."
    unknown = invoke(installed, "callbacks", "--checkout", "ORD-9")
    assert unknown.exit_code == 1 and "the token or order reference 'ORD-9'" in unknown.stderr


# --- times in GATEWAY_TIMEZONE --------------------------------------------------------------------------


@pytest.fixture
def johannesburg(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> Iterator[Harness]:
    built = build_harness(databases, monkeypatch, GATEWAY_TIMEZONE="Africa/Johannesburg")
    built.install()
    yield built
    with built.shop.app_context():
        built.db.engine.dispose()


def test_every_time_a_command_prints_is_in_the_configured_zone(johannesburg: Harness) -> None:
    checkout_id, token = new_checkout(johannesburg, sample_order("Z-1"))
    johannesburg.emulator.pay(token)
    johannesburg.emulator.control("deliver")
    with johannesburg.shop.app_context():
        created = get_state().session.get_one(GatewayCheckout, checkout_id).created_at
    utc = created.replace(tzinfo=UTC) if created.tzinfo is None else created.astimezone(UTC)
    local = utc.astimezone(ZoneInfo("Africa/Johannesburg"))  # UTC+2 all year
    status = invoke(johannesburg, "status", "Z-1").stdout
    assert f"  created          {local:%Y-%m-%d %H:%M:%S} SAST" in status
    assert " UTC" not in status.split("Gateway (getstatus)")[0]
    callbacks = invoke(johannesburg, "callbacks").stdout
    assert re.search(r"#\d+  \d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} SAST  HTTP 200", callbacks)
    accounts = invoke(johannesburg, "accounts").stdout
    assert re.search(r"\n  installed        \d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2} SAST\n", accounts)
    listed = json.loads(invoke(johannesburg, "checkouts", "--json").stdout)
    assert listed[0]["created_at"] == f"{utc:%Y-%m-%dT%H:%M:%S}Z"  # --json stays UTC


# --- the payment page on the shop's public address ------------------------------------------------------


def _embedded_shop(tmp_path: Path, **config: Any) -> Any:
    from tests.extension.test_embedded import install_the_demo_account, make_shop

    shop = make_shop(tmp_path, **config)
    with shop.test_request_context(base_url="http://127.0.0.1:5000"):
        install_the_demo_account()
        checkout = create_checkout(sample_order("E-1"))
    return shop, checkout.token


@pytest.mark.parametrize(
    ("config", "page"),
    [
        (
            {},
            "/_gateway/api/v2/app/checkout/{token} (on the shop's own address: GATEWAY_PUBLIC_URL is not set)",
        ),
        (
            {"GATEWAY_PUBLIC_URL": "https://shop.example"},
            "https://shop.example/_gateway/api/v2/app/checkout/{token}",
        ),
    ],
    ids=["no-public-url", "public-url"],
)
def test_status_shows_the_payment_page_on_the_shops_address(
    tmp_path: Path, config: dict[str, Any], page: str
) -> None:
    from tests.extension.test_embedded import close

    shop, token = _embedded_shop(tmp_path, **config)
    try:
        result = run_gateway(shop, "status", "E-1")
        assert result.exit_code == 0, result.output
        assert f"  payment page     {page.format(token=token)}" in result.stdout
        assert f"  paymentUrl                       {page.format(token=token)}" in result.stdout
        assert "http://localhost" not in result.stdout  # never an address made up outside a request
        assert "http://127.0.0.1:5000" not in result.stdout
    finally:
        close(shop)


def test_a_checkout_the_gateway_never_created_is_shown_not_asked_about(installed: Harness) -> None:
    checkout_id, _ = new_checkout(installed, sample_order("F-1"))
    with installed.shop.app_context():
        session = get_state().session
        session.execute(
            update(GatewayCheckout)
            .where(GatewayCheckout.id == checkout_id)
            .values(token=None, status="FAILED")
        )
        session.commit()
    result = invoke(installed, "status", "F-1")
    assert result.exit_code == 1
    assert (
        "Not created (FAILED)" in result.stdout
        and "  token            - (the gateway gave none)" in result.stdout
    )
    assert "The gateway gave this checkout no token: there is nothing to ask it about." in result.stdout


def test_status_reads_in_words_and_money(installed: Harness) -> None:
    paid_and_open(installed)
    result = invoke(installed, "status", "ORD-1")
    assert result.exit_code == 0, result.output
    local = result.stdout.split("Gateway (getstatus)")[0]
    assert "  status           Paid (PAID)\n" in local  # the code beside the words, for an operator
    assert "  total            R 798.00\n" in local and "  refunded         R 0.00\n" in local
    events = local.split("  recent events\n")[1].splitlines()
    assert events[0].endswith("  Checkout created: Being created -> Awaiting payment: created")
    assert "  Gateway callback: Awaiting payment -> Paid: " in events[1]
    assert "cents" not in local
    for code in ("PENDING_ORDER", "PAID_PENDING_CALLBACK"):  # the stored details in words too
        assert code not in local
    [line] = invoke(installed, "callbacks").stdout.strip().splitlines()
    assert line.endswith(
        "  order ORD-1: Awaiting payment \u2192 Paid"
    )  # was: checkout #1: PENDING_ORDER -> PAID


@pytest.mark.backends
def test_an_order_reference_in_another_case_finds_its_order_when_that_names_one(installed: Harness) -> None:
    _, token = new_checkout(installed, sample_order("6E238593"))
    typed = invoke(installed, "status", "6e238593")  # as a person copies it from an e-mail in lower case
    assert typed.exit_code == 0, typed.output
    assert f"  token            {token}" in typed.stdout
    assert "  order            6E238593" in typed.stdout
    listed = invoke(installed, "callbacks", "--checkout", "6e238593")
    assert listed.exit_code == 0, listed.output

    # Two orders whose references differ only by case: the exact one wins, another spelling is refused.
    _, lower = new_checkout(installed, sample_order("ab-1"))
    _, upper = new_checkout(installed, sample_order("AB-1"))
    assert f"  token            {lower}" in invoke(installed, "status", "ab-1").stdout
    assert f"  token            {upper}" in invoke(installed, "status", "AB-1").stdout
    ambiguous = invoke(installed, "status", "Ab-1")
    assert ambiguous.exit_code == 1 and ambiguous.stdout == ""
    assert ambiguous.stderr.strip().splitlines()[-1] == (
        "Error: 'Ab-1' matches the order references 'AB-1', 'ab-1', which differ only by case: give the "
        "reference exactly as the shop wrote it"
    )
