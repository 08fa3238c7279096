"""Two brands, two merchant accounts (issue 27; docs/example-shop.md, "Two brands, two merchant accounts").

Stoep's products sell on ``SHOP_GATEWAY_ACCOUNT``, the second brand's (Vuurhout: the potjie pot and the
brass lamp) on ``SHOP_SECOND_ACCOUNT``: ``shop install`` installs both, each checkout is made on its
products' account (the shop's ``@gateway.account_resolver``), paid, refunded and reconciled there. A cart
mixing the brands is refused with a clear message, and so is a product whose brand has no account.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from typing import Any

import pytest
from sqlalchemy import select

from example_shop import brands, create_app
from example_shop.catalog import SECOND_BRAND, by_sku
from example_shop.config import ShopConfigError
from example_shop.models import latest_checkout
from flask_gateway.models import Installation
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.emulator.support import ACCOUNT, API_KEY
from tests.shop.conftest import SHOP_URL, ShopHarness, Shopper, make_harness, shop_config

SECOND = "demo-vuurhout"
SECOND_KEY = "demo-vuurhout-key"
#: A Stoep product (R 1 199.00) and a Vuurhout one (R 2 499.00).
STOEP_PRODUCT, VUURHOUT_PRODUCT = "mohair-throw", "potjie-pot"


def two_brand_shop(databases: Databases, monkeypatch: pytest.MonkeyPatch, **options: Any) -> ShopHarness:
    """The example shop with its second brand's account, the emulator issuing both accounts."""
    accounts = options.pop("emulator_accounts", {ACCOUNT: API_KEY, SECOND: SECOND_KEY})
    return make_harness(
        databases,
        monkeypatch,
        emulator_accounts=accounts,
        SHOP_SECOND_ACCOUNT=f"{SECOND}:{SECOND_KEY}",
        **options,
    )


@pytest.fixture
def shop2(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> ShopHarness:
    return two_brand_shop(databases, monkeypatch)


def _token(redirect: Any) -> str:
    assert redirect.status_code == 303, redirect.get_data(as_text=True)
    return str(redirect.headers["Location"]).rsplit("/", 1)[1]


def _deliver(shop: ShopHarness) -> None:
    """The emulator sends its due callbacks now (to the shop, in-process)."""
    answer = shop.emulator.control("deliver")
    assert answer.status_code == 200, answer.get_data(as_text=True)


def _emulator_checkout(shop: ShopHarness, token: str) -> Any:
    answer = shop.emulator.control(f"checkouts/{token}", method="GET")
    assert answer.status_code == 200, answer.get_data(as_text=True)
    return answer.json


def _callback_urls(shop: ShopHarness, token: str) -> set[str]:
    answer = shop.emulator.client.get(f"/_emulator/callbacks?checkoutToken={token}")
    return {attempt["url"] for attempt in answer.json["callbacks"] if attempt["ok"]}


def _refund_everything(owner: Shopper, reference: str) -> str:
    """The owner refunds the whole order from its page: review, then confirm; the page after it."""
    page = f"/admin/orders/{reference}"
    review = owner.submit(page, f"{page}/refund", {"everything": "y", "reason": "Returned"})
    html = review.get_data(as_text=True)
    assert review.status_code == 200, html
    form = html.split("data-refund-confirm", 1)[1].split("</form>", 1)[0]
    confirmation = dict(re.findall(r'<input type="hidden" name="([a-z_]+)" value="([^"]*)">', form))
    done = owner.post(f"{page}/refund", confirmation)
    assert done.status_code == 303, done.get_data(as_text=True)
    return owner.get(page).get_data(as_text=True)


def _reconcile(shop: ShopHarness) -> str:
    result = shop.app.test_cli_runner().invoke(args=["gateway", "reconcile", "--older-than", "0"])
    assert result.exit_code == 0, result.output
    return result.output


@pytest.mark.backends
def test_shop_install_installs_both_accounts_each_on_its_callback_path(shop2: ShopHarness) -> None:
    with shop2.app.app_context():
        rows = {row.merchant_account_id: row for row in get_state().installations()}
    assert set(rows) == {ACCOUNT, SECOND}
    assert rows[ACCOUNT].callback_url == f"{SHOP_URL}/gateway/callback"
    assert rows[SECOND].callback_url == f"{SHOP_URL}/gateway/callback/{SECOND}"
    assert not rows[ACCOUNT].retired and not rows[SECOND].retired
    # The second brand's was installed first: the shop's own account is the extension's default one.
    with shop2.app.app_context():
        default = get_state().installation()
        assert default is not None and default.merchant_account_id == ACCOUNT
    assert shop2.install() == "already-here"  # a second run (every deploy runs it) changes nothing
    result = shop2.app.test_cli_runner().invoke(args=["shop", "install"])
    assert result.exit_code == 0 and "was installed already" in result.output, result.output


@pytest.mark.backends
def test_each_brand_is_paid_refunded_and_reconciled_on_its_own_account(shop2: ShopHarness) -> None:
    # Stoep's order: paid on the shop's account, its callback on /gateway/callback.
    stoep = shop2.shopper()
    stoep.add(STOEP_PRODUCT)
    stoep_token = _token(stoep.checkout())
    assert stoep_token.startswith(f"v2.{ACCOUNT}.")
    stoep_ref = shop2.latest_reference()
    shop2.emulator.pay(stoep_token)
    _deliver(shop2)
    assert shop2.order(stoep_ref).status == "paid"
    assert _callback_urls(shop2, stoep_token) == {f"{SHOP_URL}/gateway/callback"}

    # Vuurhout's order: made on the second account; its callback is missed, reconcile catches it up with
    # that account's keys.
    vuurhout = shop2.shopper()
    product = vuurhout.get(f"/products/{VUURHOUT_PRODUCT}").get_data(as_text=True)
    assert (
        f'data-brand="{SECOND_BRAND}"' in product and "data-instalment-hint" in product
    )  # its account's plan
    vuurhout.add(VUURHOUT_PRODUCT)
    cart = vuurhout.get("/cart").get_data(as_text=True)
    assert f'data-brand="{SECOND_BRAND}"' in cart and 'data-action="checkout"' in cart
    vuurhout_token = _token(vuurhout.checkout())
    assert vuurhout_token.startswith(f"v2.{SECOND}.")
    vuurhout_ref = shop2.latest_reference()
    shop2.emulator.pay(vuurhout_token)
    assert shop2.order(vuurhout_ref).status == "processing"
    _reconcile(shop2)
    assert shop2.order(vuurhout_ref).status == "paid"
    # The late callback comes to the account's own path, is verified with its key, and changes nothing.
    _deliver(shop2)
    assert _callback_urls(shop2, vuurhout_token) == {f"{SHOP_URL}/gateway/callback/{SECOND}"}
    assert shop2.events(vuurhout_ref, "paid") == 1 and shop2.events(stoep_ref, "paid") == 1

    with shop2.app.app_context():
        accounts = {
            reference: checkout.merchant_account_id
            for reference in (stoep_ref, vuurhout_ref)
            if (checkout := latest_checkout(reference)) is not None
        }
    assert accounts == {stoep_ref: ACCOUNT, vuurhout_ref: SECOND}

    # The owner sees each order's account, and refunds either.
    owner = shop2.shopper()
    owner.log_in()
    listing = owner.get("/admin/").get_data(as_text=True)
    assert "data-setup-warnings" not in listing  # both callback paths are this shop's
    for reference, account in accounts.items():
        row = listing.split(f'data-order-reference="{reference}"', 1)[1].split("</tr>", 1)[0]
        assert f'data-account="{account}"' in row
    for reference, account in accounts.items():
        page = _refund_everything(owner, reference)
        assert f'<dd data-account="{account}">{account}</dd>' in page
        assert shop2.order(reference).status == "refunded"
    assert shop2.order(stoep_ref).refunded_cents == 119_900
    assert shop2.order(vuurhout_ref).refunded_cents == 249_900
    for token, account, cents in ((stoep_token, ACCOUNT, 119_900), (vuurhout_token, SECOND, 249_900)):
        record = _emulator_checkout(shop2, token)
        assert (record["merchantAccountId"], record["refundedCents"]) == (account, cents)

    # Reconciled: one run asks each account about its own checkouts, and every record agrees.
    _reconcile(shop2)
    for reference in (stoep_ref, vuurhout_ref):
        assert shop2.order(reference).status == "refunded"
        with shop2.app.app_context():
            checkout = latest_checkout(reference)
            assert checkout is not None and not checkout.flagged
            assert checkout.refunded_cents == checkout.total_cents


@pytest.mark.backends
def test_the_v1_flow_pays_each_brand_on_its_account(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v1: the signed success URL proves each payment, each checkout made with its account's credentials."""
    shop = two_brand_shop(databases, monkeypatch, GATEWAY_API_VERSION="v1")
    for product, account in ((STOEP_PRODUCT, ACCOUNT), (VUURHOUT_PRODUCT, SECOND)):
        shopper = shop.shopper()
        shopper.add(product)
        token = _token(shopper.checkout())
        reference = shop.latest_reference()
        outcome = shop.pay_on_gateway(f"/{token}")
        assert outcome["merchantMessage"] == "OK"
        assert shop.order(reference).status == "paid"
        assert _emulator_checkout(shop, token)["merchantAccountId"] == account
        with shop.app.app_context():
            checkout = latest_checkout(reference)
            assert checkout is not None and checkout.api_version == "v1"
            assert checkout.merchant_account_id == account


@pytest.mark.backends
def test_a_cart_mixing_the_brands_is_refused_with_a_clear_message(shop2: ShopHarness) -> None:
    shopper = shop2.shopper()
    shopper.add(STOEP_PRODUCT)
    shopper.add(VUURHOUT_PRODUCT)
    cart = shopper.get("/cart").get_data(as_text=True)
    assert "data-brand-problem" in cart and 'data-action="checkout"' not in cart
    assert "Stoep and Vuurhout, which are paid separately" in cart

    page = shopper.get("/checkout")
    assert page.status_code == 200 and 'data-action="pay"' not in page.get_data(as_text=True)
    answer = shopper.checkout()
    html = answer.get_data(as_text=True)
    assert answer.status_code == 409, html
    assert "Check out one brand at a time" in html
    assert shop2.order_count() == 0  # nothing placed, nothing sent to the gateway

    # One brand at a time works.
    shopper.submit("/cart", f"/cart/remove/{VUURHOUT_PRODUCT}")
    assert _token(shopper.checkout()).startswith(f"v2.{ACCOUNT}.")


@pytest.mark.backends
def test_an_unknown_brand_gives_a_clear_page_never_a_500(
    shop2: ShopHarness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The resolver meets a product whose brand has no account here (a catalog mistake)."""
    potjie = by_sku("STP-KIT-003")
    assert potjie is not None
    mystery = dataclasses.replace(potjie, brand="Mystery Brand")
    monkeypatch.setattr(brands, "by_sku", lambda sku: mystery if sku == potjie.sku else by_sku(sku))
    shopper = shop2.shopper()
    shopper.add(VUURHOUT_PRODUCT)
    answer = shopper.checkout()
    html = answer.get_data(as_text=True)
    assert answer.status_code == 409, html
    assert "Products of Mystery Brand can&#39;t be paid in instalments here yet" in html
    assert "Nothing was charged" in html
    reference = shop2.latest_reference()
    with shop2.app.app_context():
        assert latest_checkout(reference) is None  # nothing was sent to the gateway

    # A product the catalog no longer knows (its SKU in the draft): the same kind of answer.
    monkeypatch.setattr(brands, "by_sku", lambda sku: None)
    answer = shopper.checkout()
    assert answer.status_code == 409
    assert "no longer in our catalog" in answer.get_data(as_text=True)


@pytest.mark.backends
def test_a_second_account_the_gateway_refuses_leaves_the_first_selling(
    databases: Databases, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The emulator does not know the second account: ``shop install`` says so (exit 1) and names the
    variable; Stoep still sells, and the Vuurhout cart says payment is not available, never a 500."""
    shop = two_brand_shop(databases, monkeypatch, install=False, emulator_accounts={ACCOUNT: API_KEY})
    with caplog.at_level(logging.ERROR, logger="example_shop.setup"):
        assert shop.install() == "refused"
    assert "Check SHOP_SECOND_ACCOUNT" in caplog.text and SECOND_KEY not in caplog.text
    result = shop.app.test_cli_runner().invoke(args=["shop", "install"])
    assert result.exit_code == 1, result.output
    with shop.app.app_context():
        assert [row.merchant_account_id for row in get_state().installations()] == [ACCOUNT]

    stoep = shop.shopper()
    stoep.add(STOEP_PRODUCT)
    assert _token(stoep.checkout()).startswith(f"v2.{ACCOUNT}.")

    vuurhout = shop.shopper()
    vuurhout.add(VUURHOUT_PRODUCT)
    cart = vuurhout.get("/cart").get_data(as_text=True)
    assert "data-payment-unavailable" in cart and 'data-action="checkout"' not in cart
    answer = vuurhout.checkout()
    assert answer.status_code == 409, answer.get_data(as_text=True)


@pytest.mark.backends
def test_with_one_account_every_product_sells_on_it_as_before(shop: ShopHarness, shopper: Shopper) -> None:
    """No SHOP_SECOND_ACCOUNT: one account, the brands mix in one cart and nothing names them."""
    shopper.add(STOEP_PRODUCT)
    shopper.add(VUURHOUT_PRODUCT)
    cart = shopper.get("/cart").get_data(as_text=True)
    assert "data-brand" not in cart and 'data-action="checkout"' in cart
    assert "data-brand" not in shopper.get(f"/products/{VUURHOUT_PRODUCT}").get_data(as_text=True)
    assert _token(shopper.checkout()).startswith(f"v2.{ACCOUNT}.")
    with shop.app.app_context():
        assert len(get_state().session.scalars(select(Installation)).all()) == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("demo-vuurhout", "is not 'id:apikey'"),
        ("demo-vuurhout:", "is not 'id:apikey'"),
        ("a:b,c:d", "is not 'id:apikey'"),
        ("demo merchant:secret-key-1", "may hold letters, digits"),
        (f"{ACCOUNT}:secret-key-1", "needs a merchant account of its own"),
    ],
)
def test_a_wrong_second_account_stops_the_shop_naming_the_variable(
    tmp_path: Any, value: str, message: str
) -> None:
    with pytest.raises(ShopConfigError, match=re.escape(message)) as raised:
        create_app(shop_config(f"sqlite:///{tmp_path / 'shop.sqlite3'}", SHOP_SECOND_ACCOUNT=value))
    assert "SHOP_SECOND_ACCOUNT" in str(raised.value)
    assert "secret-key-1" not in str(raised.value)  # the API key is never repeated


def test_the_second_account_from_the_environment(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SHOP_SECOND_ACCOUNT", f"{SECOND}:{SECOND_KEY}")
    app = create_app(shop_config(f"sqlite:///{tmp_path / 'shop.sqlite3'}"))
    assert (app.config["SHOP_SECOND_ACCOUNT_ID"], app.config["SHOP_SECOND_ACCOUNT_API_KEY"]) == (
        SECOND,
        SECOND_KEY,
    )
    assert "SHOP_SECOND_ACCOUNT" not in app.config  # the raw value (with its key) is not kept
