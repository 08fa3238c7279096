"""Several merchant accounts (issue 27): two accounts installed on one shop, paying side by side.

Each test has the shop of ``tests/extension/conftest.py`` wired to the in-process emulator by the pytest
plugin (``gateway_emulator``), the emulator's demo account installed as the first account, and a second
account (``brand-b``) installed with ``gateway_emulator.install(account=...)``: on both backends.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import func, select

import flask_gateway
from flask_gateway import (
    CheckoutUnavailableError,
    ConfigurationError,
    GatewayCheckout,
    OrderDraft,
    UnknownAccountError,
    create_checkout,
    format_instalment_hint,
    is_available,
    open_checkouts,
    payment_limits,
    payment_plan,
    refresh,
    refund,
    reopen_account,
    retire_account,
    start_checkout,
)
from flask_gateway.models import CallbackLog, Installation
from flask_gateway.state import get_state
from flask_gateway.testing import GatewayEmulator, token_of
from tests.extension.conftest import ACCOUNT, SHOP_URL, Harness, sample_order

pytestmark = pytest.mark.backends

SECOND = "brand-b"
#: The two accounts' minimums differ: 1,000.00 on the first, 5,000.00 on the second.
FIRST_MINIMUM, SECOND_MINIMUM = 100_000, 500_000
MAXIMUM = 2_000_000


@dataclass
class TwoAccounts:
    """The shop with two merchant accounts installed, and the emulator that serves both."""

    harness: Harness
    emulator: GatewayEmulator

    @property
    def shop(self) -> Flask:
        return self.harness.shop

    def checkout(self, reference: str) -> GatewayCheckout:
        """The shop's record of the order's (newest) checkout, loaded and detached."""
        with self.shop.app_context():
            session = get_state().session
            row = session.scalars(
                select(GatewayCheckout)
                .where(GatewayCheckout.order_reference == reference)
                .order_by(GatewayCheckout.id.desc())
            ).first()
            assert row is not None, reference
            session.expunge(row)
            return row

    def count(self) -> int:
        with self.shop.app_context():
            return get_state().session.scalar(select(func.count(GatewayCheckout.id))) or 0

    def gateway_checkouts(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.emulator.control("checkouts", method="GET")["checkouts"]
        return rows

    def logs(self) -> list[tuple[str | None, str, bool]]:
        with self.shop.app_context():
            rows = get_state().session.scalars(select(CallbackLog).order_by(CallbackLog.id))
            return [(r.merchant_account_id, r.outcome, r.verified) for r in rows]


def order(reference: str, total_cents: int = 799_800) -> OrderDraft:
    """The sample order, one line of ``total_cents``."""
    return sample_order(reference, quantity=1, price=total_cents)


@pytest.fixture
def two_accounts(gateway_emulator: GatewayEmulator, plugin_harness: Harness) -> TwoAccounts:
    gateway_emulator.install(minimum_cents=FIRST_MINIMUM, maximum_cents=MAXIMUM)  # the first account's
    gateway_emulator.install(account=SECOND, minimum_cents=SECOND_MINIMUM, maximum_cents=MAXIMUM)
    return TwoAccounts(harness=plugin_harness, emulator=gateway_emulator)


def brand_resolver(draft: OrderDraft | None) -> str | None:
    """The shop's choice: orders of brand B (references ``B-...``) on the second account."""
    if draft is None:
        return None
    return SECOND if draft.reference.startswith("B-") else ACCOUNT


# --- two accounts paying side by side -------------------------------------------------------------------


def test_two_accounts_pay_side_by_side_each_with_its_own_keys(two_accounts: TwoAccounts) -> None:
    shop, emulator = two_accounts.shop, two_accounts.emulator
    with shop.app_context():
        a = create_checkout(order("A-1"), account=ACCOUNT)
        b = create_checkout(order("B-1"), account=SECOND)
        assert (a.merchant_account_id, b.merchant_account_id) == (ACCOUNT, SECOND)
    # The gateway made each checkout for the account the shop asked (its token carries the account).
    assert token_of(a).startswith(f"v2.{ACCOUNT}.") and token_of(b).startswith(f"v2.{SECOND}.")

    emulator.pay(a)
    emulator.pay(b)
    assert emulator.deliver() == 2

    # Each callback went to its account's callback URL, was verified with that account's signing key and
    # confirmed with getstatus signed by that account (a wrong key: 401 or "unconfirmed", never "accepted").
    assert emulator.callbacks(a)[0]["url"] == f"{SHOP_URL}/gateway/callback"
    assert emulator.callbacks(b)[0]["url"] == f"{SHOP_URL}/gateway/callback/{SECOND}"
    assert sorted(two_accounts.logs()) == sorted([(ACCOUNT, "accepted", True), (SECOND, "accepted", True)])
    assert two_accounts.checkout("A-1").status == two_accounts.checkout("B-1").status == "PAID"
    assert emulator.status(a) == emulator.status(b) == "PAID"
    emulator.assert_fulfilled_once("A-1")
    emulator.assert_fulfilled_once("B-1")

    # A refund goes to the checkout's own account (the gateway refuses another account's checkout).
    with shop.app_context():
        assert refund(two_accounts.checkout("B-1"), 100_000, "one cup chipped").state == "SUCCEEDED"
        assert refund(two_accounts.checkout("A-1"), 799_800).state == "SUCCEEDED"
    assert emulator.status(b) == "PARTIALLY_REFUNDED"
    assert emulator.status(a) == "FULLY_REFUNDED"
    # The account is recorded and never changes.
    assert two_accounts.checkout("B-1").merchant_account_id == SECOND


def test_the_shops_resolver_chooses_the_account_from_the_draft(two_accounts: TwoAccounts) -> None:
    shop, emulator = two_accounts.shop, two_accounts.emulator
    seen: list[str | None] = []

    @two_accounts.harness.gateway.account_resolver
    def by_brand(draft: OrderDraft | None) -> str | None:
        seen.append(draft.reference if draft is not None else None)
        return brand_resolver(draft)

    with shop.test_request_context(base_url=SHOP_URL):
        to_a = start_checkout(order("A-7"))
        to_b = start_checkout(order("B-7"))
        assert (to_a.status_code, to_b.status_code) == (303, 303)
        # An explicit account wins over the resolver (which is then not asked).
        explicit = create_checkout(order("B-8"), account=ACCOUNT)
    assert seen == ["A-7", "B-7"]
    assert two_accounts.checkout("A-7").merchant_account_id == ACCOUNT
    assert two_accounts.checkout("B-7").merchant_account_id == SECOND
    assert explicit.merchant_account_id == ACCOUNT
    assert token_of(to_b).startswith(f"v2.{SECOND}.")

    for answer in (to_a, to_b):
        emulator.pay(answer)
    assert emulator.deliver() == 2
    assert two_accounts.checkout("B-7").status == two_accounts.checkout("A-7").status == "PAID"
    emulator.assert_fulfilled_once("A-7")
    emulator.assert_fulfilled_once("B-7")


def test_availability_limits_and_the_hint_follow_the_chosen_account(two_accounts: TwoAccounts) -> None:
    shop = two_accounts.shop
    total = 200_000  # above the first account's minimum, below the second's
    with shop.test_request_context(base_url=SHOP_URL):
        assert is_available(total, account=ACCOUNT) is True
        assert is_available(total, account=SECOND) is False
        assert is_available(600_000, account=SECOND) is True
        limits_a, limits_b = payment_limits(account=ACCOUNT), payment_limits(account=SECOND)
        assert limits_a is not None and limits_b is not None
        assert (limits_a.minimum_cents, limits_b.minimum_cents) == (FIRST_MINIMUM, SECOND_MINIMUM)
        assert payment_plan(total, account=SECOND) is None
        assert format_instalment_hint(total, account=SECOND) == ""
        plan = payment_plan(total, account=ACCOUNT)
        assert plan is not None and sum(plan.amounts) == total
        assert format_instalment_hint(total, account=ACCOUNT).startswith("or ")
        # No account named and no resolver: the default account, the newest one still open (the second).
        assert is_available(total) is False
        limits = payment_limits()
        assert limits is not None and limits.minimum_cents == SECOND_MINIMUM

        # With a resolver, the draft decides.
        two_accounts.harness.gateway.account_resolver(brand_resolver)
        assert is_available(total, draft=order("A-2", total)) is True
        assert is_available(total, draft=order("B-2", total)) is False
        limits = payment_limits(draft=order("A-2", total))
        assert limits is not None and limits.minimum_cents == FIRST_MINIMUM
        assert format_instalment_hint(total, draft=order("A-2", total)).startswith("or ")
        assert format_instalment_hint(total, draft=order("B-2", total)) == ""

        # Below the chosen account's minimum: not offered, and nothing is created.
        with pytest.raises(CheckoutUnavailableError, match="offered from R "):
            start_checkout(order("B-3", total))
        assert start_checkout(order("A-3", total)).status_code == 303
    assert two_accounts.checkout("A-3").merchant_account_id == ACCOUNT
    assert two_accounts.count() == 1


def test_the_resolver_is_asked_once_per_call(two_accounts: TwoAccounts) -> None:
    asked: list[str | None] = []

    @two_accounts.harness.gateway.account_resolver
    def counting(draft: OrderDraft | None) -> str | None:
        asked.append(draft.reference if draft is not None else None)
        return brand_resolver(draft)

    with two_accounts.shop.test_request_context(base_url=SHOP_URL):
        assert format_instalment_hint(600_000, draft=order("A-1", 600_000)).startswith("or ")
        assert asked == ["A-1"]
        assert start_checkout(order("B-1")).status_code == 303
        assert asked == ["A-1", "B-1"]
        assert is_available(600_000) is True  # no draft: the resolver is given None
        assert asked == ["A-1", "B-1", None]


# --- retiring an account ---------------------------------------------------------------------------------


def test_a_retired_account_takes_no_new_checkout_but_its_open_one_goes_on(two_accounts: TwoAccounts) -> None:
    shop, emulator = two_accounts.shop, two_accounts.emulator
    with shop.app_context():
        # Their tokens: the rollback after a refused create (below) expires the rows the session holds.
        open_one = token_of(create_checkout(order("B-1"), account=SECOND))
        paid_one = token_of(create_checkout(order("B-2"), account=SECOND))
        assert open_checkouts(SECOND) == 2

        retired = retire_account(SECOND)
        assert retired.retired and retired.retired_at is not None
        assert retire_account(SECOND).retired_at == retired.retired_at  # again: nothing changes

        with pytest.raises(CheckoutUnavailableError, match="'brand-b' is retired"):
            create_checkout(order("B-3"), account=SECOND)
        assert is_available(799_800, account=SECOND) is False
        assert payment_limits(account=SECOND) is None
        # The default moves to the other open account.
        limits = payment_limits()
        assert limits is not None and limits.minimum_cents == FIRST_MINIMUM
        assert create_checkout(order("A-1")).merchant_account_id == ACCOUNT
    with (
        shop.test_request_context(base_url=SHOP_URL),
        pytest.raises(CheckoutUnavailableError, match="retired"),
    ):
        start_checkout(order("B-4"), account=SECOND)
    assert {r["merchantOrderReference"] for r in two_accounts.gateway_checkouts()} == {"B-1", "B-2", "A-1"}

    # The retired account's open checkouts: paid, polled, their callbacks applied, refunded.
    emulator.pay(open_one)
    with shop.app_context():
        assert refresh(two_accounts.checkout("B-1")).after == "PAID_PENDING_CALLBACK"
    emulator.pay(paid_one)
    assert emulator.deliver() == 2
    assert (SECOND, "accepted", True) in two_accounts.logs()
    assert two_accounts.checkout("B-1").status == two_accounts.checkout("B-2").status == "PAID"
    emulator.assert_fulfilled_once("B-1")
    emulator.assert_fulfilled_once("B-2")
    with shop.app_context():
        assert refund(two_accounts.checkout("B-2"), 799_800).state == "SUCCEEDED"
        assert refresh(two_accounts.checkout("B-2")).after == "FULLY_REFUNDED"
        assert open_checkouts(SECOND) == 0
    assert emulator.status(paid_one) == "FULLY_REFUNDED"

    with shop.app_context():
        assert reopen_account(SECOND).retired is False
        assert create_checkout(order("B-5"), account=SECOND).merchant_account_id == SECOND
        limits = payment_limits()  # the newest open account is the default again
        assert limits is not None and limits.minimum_cents == SECOND_MINIMUM


def test_with_every_account_retired_nothing_is_offered(two_accounts: TwoAccounts) -> None:
    with two_accounts.shop.app_context():
        retire_account(ACCOUNT)
        retire_account(SECOND)
        assert is_available(799_800) is False
        assert payment_limits() is None
        with pytest.raises(flask_gateway.NotInstalledError, match="Every merchant account installed here"):
            create_checkout(order("A-1"))
    with (
        two_accounts.shop.test_request_context(base_url=SHOP_URL),
        pytest.raises(CheckoutUnavailableError),
    ):
        start_checkout(order("A-2"))
    assert two_accounts.count() == 0


# --- installing a second account --------------------------------------------------------------------------


def _rows(shop: Flask) -> list[tuple[int, str, str, str, str | None]]:
    with shop.app_context():
        state = get_state()
        return [
            (
                row.id,
                row.merchant_account_id,
                state.box.decrypt(row.api_key_encrypted),
                state.box.decrypt(row.signing_key_encrypted),
                row.callback_url,
            )
            for row in state.session.scalars(select(Installation).order_by(Installation.id))
        ]


def test_installing_a_second_account_keeps_the_first_ones_row_keys_and_checkouts(
    gateway_emulator: GatewayEmulator, plugin_harness: Harness
) -> None:
    shop = plugin_harness.shop
    with shop.app_context():
        first_checkout = create_checkout(order("A-1"))
    [first] = _rows(shop)
    assert first[1] == ACCOUNT

    gateway_emulator.install(account=SECOND, minimum_cents=SECOND_MINIMUM, maximum_cents=MAXIMUM)

    rows = _rows(shop)
    assert rows[0] == first  # the same row, API key, signing key and callback URL
    assert rows[1][1:3] == (SECOND, f"{SECOND}-api-key")
    assert rows[1][3] != first[3]
    assert rows[1][4] == f"{SHOP_URL}/gateway/callback/{SECOND}"
    with shop.app_context():
        assert [i.merchant_account_id for i in get_state().installations()] == [ACCOUNT, SECOND]
        assert get_state().session.get(GatewayCheckout, first_checkout.id) is not None
    # The emulator issued the account and installed it with the shop's settings.
    accounts = {
        a["merchantAccountId"]: a for a in gateway_emulator.control("accounts", method="GET")["accounts"]
    }
    assert accounts[SECOND]["installed"] is True
    assert accounts[SECOND]["minimumCheckoutAmountCents"] == SECOND_MINIMUM
    assert accounts[SECOND]["checkoutStatusCallbackUrl"] == f"{SHOP_URL}/gateway/callback/{SECOND}"

    # The first account's checkout, made before, is paid and its callback still verifies with its key.
    gateway_emulator.pay(first_checkout)
    assert gateway_emulator.deliver() == 1
    with shop.app_context():
        log = get_state().session.scalars(select(CallbackLog)).one()
        assert (log.merchant_account_id, log.outcome, log.verified) == (ACCOUNT, "accepted", True)
    gateway_emulator.assert_fulfilled_once("A-1")

    # Installing it again changes that account's settings only (the gateway installs an account once).
    gateway_emulator.install(account=SECOND, minimum_cents=600_000, maximum_cents=MAXIMUM)
    gateway_emulator.install(minimum_cents=300, maximum_cents=MAXIMUM)  # the first account's settings
    with shop.app_context():
        state = get_state()
        assert state.require_installation(SECOND).minimum_cents == 600_000
        assert state.require_installation(ACCOUNT).minimum_cents == 300
        assert len(state.installations()) == 2


# --- bad input --------------------------------------------------------------------------------------------


def test_an_unknown_account_is_refused_naming_the_installed_ones(two_accounts: TwoAccounts) -> None:
    shop = two_accounts.shop
    with shop.test_request_context(base_url=SHOP_URL):
        with pytest.raises(UnknownAccountError) as raised:
            create_checkout(order("X-1"), account="brand-x")
        assert raised.value.account == "brand-x"
        assert "'brand-x' is not installed" in str(raised.value)
        assert f"installed: {ACCOUNT}, {SECOND}" in str(raised.value)
        with pytest.raises(UnknownAccountError):
            start_checkout(order("X-2"), account="brand-x")
        for odd in ("brand\x00b", "b" * 300, ""):  # U+0000 (PostgreSQL refuses it), too long, empty
            with pytest.raises(UnknownAccountError):
                create_checkout(order("X-6"), account=odd)
            assert is_available(799_800, account=odd) is False
        with pytest.raises(UnknownAccountError):
            retire_account("brand-x")
        assert is_available(799_800, account="brand-x") is False
        assert payment_limits(account="brand-x") is None
        assert format_instalment_hint(799_800, account="brand-x") == ""

        # The resolver's answer is checked as an argument would be.
        two_accounts.harness.gateway.account_resolver(lambda draft: "brand-x")
        with pytest.raises(UnknownAccountError, match=f"installed: {ACCOUNT}, {SECOND}"):
            create_checkout(order("X-3"))
        with pytest.raises(UnknownAccountError):
            start_checkout(order("X-4"))
        assert is_available(799_800, draft=order("X-5")) is False
    assert two_accounts.count() == 0
    assert two_accounts.gateway_checkouts() == []


@pytest.mark.parametrize("answer", [42, b"brand-b", ["brand-b"]], ids=["int", "bytes", "list"])
def test_a_resolver_answering_no_account_id_is_a_configuration_error(
    two_accounts: TwoAccounts, answer: Any
) -> None:
    two_accounts.harness.gateway.account_resolver(lambda draft: answer)
    with two_accounts.shop.test_request_context(base_url=SHOP_URL):
        with pytest.raises(ConfigurationError, match=f"answered {type(answer).__name__}: it must answer"):
            create_checkout(order("X-1"))
        with pytest.raises(ConfigurationError):
            start_checkout(order("X-2"))
    assert two_accounts.count() == 0
    assert two_accounts.gateway_checkouts() == []


# --- docs/extension.md, "Several merchant accounts" -------------------------------------------------------

DOCS = Path(__file__).resolve().parents[3] / "docs"


def _section(heading: str) -> str:
    page = (DOCS / "extension.md").read_text(encoding="utf-8")
    return page.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def test_the_documented_example_runs(gateway_emulator: GatewayEmulator, plugin_harness: Harness) -> None:
    """The section's code block, run on the shop: a second account installed (the test kit does what the
    owner's install screen does), a resolver by brand, each order paid on its account."""
    code = re.findall(r"```python\n(.*?)```", _section("Several merchant accounts"), flags=re.DOTALL)[0]
    gateway_emulator.install(account="brand-b")
    shop, gateway = plugin_harness.shop, plugin_harness.gateway
    namespace: dict[str, Any] = {"gateway": gateway, "app": shop}
    exec(compile(code, "docs/extension.md", "exec"), namespace)  # noqa: S102 - our own documentation
    with shop.test_request_context(base_url=SHOP_URL):
        assert namespace["pay"]("KITCHEN-1").status_code == 303
        assert namespace["pay"]("B-1").status_code == 303
    for reference, account in (("KITCHEN-1", ACCOUNT), ("B-1", "brand-b")):
        checkout = TwoAccounts(plugin_harness, gateway_emulator).checkout(reference)
        assert checkout.merchant_account_id == account
        gateway_emulator.pay(checkout)
    assert gateway_emulator.deliver() == 2
    gateway_emulator.assert_fulfilled_once("KITCHEN-1")
    gateway_emulator.assert_fulfilled_once("B-1")


def test_the_signals_say_which_account_they_are_about(two_accounts: TwoAccounts) -> None:
    """``checkout_created``, ``payment_confirmed`` and ``callback_rejected`` carry ``account``: the checkout's."""
    shop, emulator = two_accounts.shop, two_accounts.emulator
    heard: list[tuple[str, str | None, str | None]] = []

    def listener(name: str) -> Any:
        def receive(sender: Any, checkout: Any = None, account: str | None = None, **extra: Any) -> None:
            heard.append((name, account, None if checkout is None else checkout.merchant_account_id))

        return receive

    receivers = {
        signal: listener(signal.name)
        for signal in (
            flask_gateway.checkout_created,
            flask_gateway.payment_confirmed,
            flask_gateway.callback_rejected,
        )
    }
    for signal, receiver in receivers.items():
        signal.connect(receiver)
    try:
        with shop.app_context():
            b = create_checkout(order("B-9"), account=SECOND)
        emulator.pay(b)
        assert emulator.deliver() == 1
        # A claim about B's checkout signed with the first account's key: refused, about account B.
        with shop.app_context():
            first_key = get_state().box.decrypt(get_state().installation(ACCOUNT).signing_key_encrypted)
        body = b'{"checkoutToken": "%s", "checkoutPaymentStatus": "PAID"}' % token_of(b).encode()
        answer = shop.test_client().post(
            "/gateway/callback",
            data=body,
            headers={"X-Signature": flask_gateway.sign(body, first_key), "Content-Type": "application/json"},
        )
        assert answer.status_code == 401
    finally:
        for signal, receiver in receivers.items():
            signal.disconnect(receiver)
    assert heard == [
        ("gateway-checkout-created", SECOND, SECOND),
        ("gateway-payment-confirmed", SECOND, SECOND),
        ("gateway-callback-rejected", None, None),  # refused before its checkout was trusted: no checkout
    ]


def test_the_documented_brand_manager_sees_only_its_brand(two_accounts: TwoAccounts) -> None:
    """The section's block with ``@gateway.admin_accounts``: a manager of the first account sees its
    checkout's page, not the second account's (404, as for none), and the list of every account shows only
    the first account's checkouts; the owner sees both."""
    blocks = re.findall(r"```python\n(.*?)```", _section("Several merchant accounts"), flags=re.DOTALL)
    guard_code = next(block for block in blocks if "admin_accounts" in block)
    shop = two_accounts.shop
    with shop.app_context():
        mine = create_checkout(order("A-7"), account=ACCOUNT).id
        theirs = create_checkout(order("B-7"), account=SECOND).id
    manager = SimpleNamespace(is_authenticated=True, is_owner=False, brand_account=ACCOUNT)
    namespace: dict[str, Any] = {"gateway": two_accounts.harness.gateway, "current_user": manager}
    exec(compile(guard_code, "docs/extension.md", "exec"), namespace)  # noqa: S102 - our own documentation
    client = shop.test_client()
    assert client.get(f"/gateway/admin/checkouts/{mine}").status_code == 200
    assert client.get(f"/gateway/admin/checkouts/{theirs}").status_code == 404
    assert client.get(f"/gateway/admin/checkouts?account={SECOND}").status_code == 404
    listed = client.get("/gateway/admin/checkouts").get_data(as_text=True)  # every account: theirs only
    assert "A-7" in listed and "B-7" not in listed
    manager.is_owner = True
    assert client.get(f"/gateway/admin/checkouts/{theirs}").status_code == 200
    assert "B-7" in client.get("/gateway/admin/checkouts").get_data(as_text=True)
