"""The admin screens with several merchant accounts (issue 27): the account switcher and the account columns,
each checkout's account, the status page's accounts with retire and reopen, installing another account, one
account's settings, and ``viewed_account()`` for a guard that lets a brand manager see only their brand.

A shop with one account sees none of it (the first test, and every test of test_admin.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from flask import request
from sqlalchemy import select

from flask_gateway.errors import CheckoutUnavailableError
from flask_gateway.models import CallbackLog, GatewayCheckout, OutboxEvent
from flask_gateway.payments.checkouts import create_checkout
from flask_gateway.payments.installation import InstallSettings, install
from flask_gateway.state import get_state
from flask_gateway.web.admin import viewed_account
from tests.extension.conftest import ACCOUNT, API_KEY, SHOP_URL, Harness, sample_order
from tests.extension.web.test_admin import ADMIN, emulator_account, text, token_of, visible

SECOND = "second-brand"
SECOND_KEY = "second-brand-api-key"
CALLBACK = f"{SHOP_URL}/gateway/callback"


# --- helpers -------------------------------------------------------------------------------------------


@pytest.fixture
def admin(harness: Harness) -> Harness:
    """The harness with an admin guard that lets everyone in."""
    harness.gateway.admin_guard(lambda: True)
    return harness


def issue_account(harness: Harness, account: str = SECOND, api_key: str = SECOND_KEY) -> None:
    """The gateway's account manager issues another merchant account (the emulator's control API)."""
    answer = harness.emulator.control(
        "accounts", {"merchantAccountId": account, "merchantAccountApiKey": api_key}
    )
    assert answer.status_code in (200, 201), answer.get_data(as_text=True)


def install_second(harness: Harness, *, maximum: int = 5_000_000) -> None:
    issue_account(harness)
    with harness.shop.app_context():
        install(
            InstallSettings(
                merchant_account_id=SECOND,
                api_key=SECOND_KEY,
                callback_url=f"{CALLBACK}/{SECOND}",
                callback_failures_email=None,
                minimum_cents=100,
                maximum_cents=maximum,
            )
        )


@pytest.fixture
def two(admin: Harness) -> Harness:
    """Two accounts installed: ACCOUNT (the first) and SECOND (the newest: the default account)."""
    admin.install()
    install_second(admin)
    return admin


def paid(harness: Harness, reference: str, account: str) -> int:
    """A checkout of ``account``, paid on the emulator, its signed callback delivered to its callback URL."""
    with harness.shop.test_request_context():
        checkout = create_checkout(sample_order(reference), account=account)
        checkout_id, token = checkout.id, checkout.token
    assert token and harness.emulator.pay(token).status_code == 200
    assert harness.emulator.control("deliver").status_code == 200
    with harness.shop.app_context():
        stored = get_state().session.get_one(GatewayCheckout, checkout_id)
        assert (stored.merchant_account_id, stored.status) == (account, "PAID")
    return checkout_id


def started(harness: Harness, reference: str, account: str) -> int:
    """A checkout of ``account``, created and left open."""
    with harness.shop.test_request_context():
        return create_checkout(sample_order(reference), account=account).id


def forged_callback(harness: Harness) -> None:
    """A callback that names no checkout and is not signed: logged, refused, of no account."""
    answer = harness.client.post(
        "/gateway/callback",
        data=b'{"forged": true}',
        headers={"Content-Type": "application/json", "X-Signature": "bm9wZQ=="},
    )
    assert answer.status_code == 401


def rows(html: str, attribute: str) -> list[str]:
    """The values of ``attribute`` on the page, in order (``data-checkout-account="..."``)."""
    import re

    return re.findall(rf'{attribute}="([^"]*)"', html)


def words(html: str) -> str:
    """The text a person reads, without the space ``visible`` leaves before punctuation after a tag."""
    return visible(html).replace(" ,", ",").replace(" .", ".").replace(" :", ":")


def callback_logs(harness: Harness) -> dict[int, int | None]:
    with harness.shop.app_context():
        return dict(get_state().session.execute(select(CallbackLog.id, CallbackLog.checkout_id)).all())


# --- one account: nothing new ----------------------------------------------------------------------------


def test_a_shop_with_one_account_sees_no_switcher_and_no_account_column(admin):
    admin.install()
    checkout_id = paid(admin, "ORD-1", ACCOUNT)
    client = admin.client
    pages = {
        "status": text(client.get(f"{ADMIN}/")),
        "checkouts": text(client.get(f"{ADMIN}/checkouts")),
        "checkout": text(client.get(f"{ADMIN}/checkouts/{checkout_id}")),
        "callbacks": text(client.get(f"{ADMIN}/callbacks")),
        "settings": text(client.get(f"{ADMIN}/settings")),
    }
    for name, html in pages.items():
        assert "data-account-switcher" not in html, name
        assert "data-checkout-account" not in html and "data-callback-account" not in html, name
        assert "All accounts" not in html and "?account=" not in html, name  # no link carries an account
        assert "&amp;account=" not in html, name
    assert "Merchant accounts" not in pages["status"] and "Retire" not in pages["status"]
    assert 'id="gateway-installation"' in pages["status"]  # the page as it always was
    assert '<th scope="col">Account</th>' not in pages["checkouts"] + pages["callbacks"]
    assert f"<dt>Merchant account</dt><dd>{ACCOUNT}</dd>" in pages["checkout"]  # as before
    # The install screen says the account is installed, and would add another one.
    install_page = text(client.get(f"{ADMIN}/install"))
    assert f'data-installed-accounts="{ACCOUNT}"' in install_page
    assert "another merchant account" in visible(install_page)


# --- the lists -------------------------------------------------------------------------------------------


@pytest.mark.backends
def test_the_lists_show_every_account_or_the_chosen_one(two):
    first = paid(two, "A-1", ACCOUNT)
    second = paid(two, "B-1", SECOND)
    waiting = started(two, "B-2", SECOND)
    forged_callback(two)
    client = two.client

    every = text(client.get(f"{ADMIN}/checkouts"))
    assert "data-account-switcher" in every
    assert rows(every, "data-account") == ["", ACCOUNT, SECOND]  # All accounts, then each, oldest first
    assert 'data-account="" aria-current="page"' in every
    assert rows(every, "data-checkout-account") == [SECOND, SECOND, ACCOUNT]  # newest first
    assert '<th scope="col">Account</th>' in every

    only_b = client.get(f"{ADMIN}/checkouts?account={SECOND}")
    assert only_b.status_code == 200
    html = text(only_b)
    assert f'data-account="{SECOND}" aria-current="page"' in html
    assert "2 checkouts" in html and "B-1" in html and "B-2" in html and "A-1" not in html
    assert "data-checkout-account" not in html  # one account: no column
    assert f'<input type="hidden" name="account" value="{SECOND}">' in html  # the filter form keeps it
    assert f'href="{ADMIN}/checkouts/{waiting}"' in html and f'href="{ADMIN}/checkouts/{first}"' not in html
    # The switcher keeps the other filters; the nav keeps the account.
    filtered = text(client.get(f"{ADMIN}/checkouts?account={SECOND}&status=PAID"))
    assert "1 checkout" in filtered and "B-1" in filtered and "B-2" not in filtered
    assert f'href="{ADMIN}/checkouts?status=PAID&amp;account={ACCOUNT}"' in filtered or (
        f'href="{ADMIN}/checkouts?account={ACCOUNT}&amp;status=PAID"' in filtered
    )
    assert f'href="{ADMIN}/callbacks?account={SECOND}"' in filtered

    logs = callback_logs(two)
    assert sorted(checkout for checkout in logs.values() if checkout) == [first, second]
    all_callbacks = text(client.get(f"{ADMIN}/callbacks"))
    assert rows(all_callbacks, "data-callback-account") == ["", SECOND, ACCOUNT]  # the forged one: none
    assert "3 callbacks" in all_callbacks
    b_callbacks = text(client.get(f"{ADMIN}/callbacks?account={SECOND}"))
    assert "1 callback" in b_callbacks and f'href="{ADMIN}/checkouts/{second}"' in b_callbacks
    assert f'href="{ADMIN}/checkouts/{first}"' not in b_callbacks and "forged" not in b_callbacks
    a_refused = text(client.get(f"{ADMIN}/callbacks?account={ACCOUNT}&refused=1"))
    assert "No callbacks match these filters." in a_refused


def test_each_checkout_page_says_its_account(two):
    checkout_id = started(two, "B-1", SECOND)
    html = text(two.client.get(f"{ADMIN}/checkouts/{checkout_id}"))
    assert f'data-checkout-account="{SECOND}"' in html
    assert f"Merchant account {SECOND}. Everything on this page is done with this account's keys." in words(
        html
    )
    assert f'href="{ADMIN}/checkouts?account={SECOND}"' in html  # its account's list, and the nav's
    assert f'href="{ADMIN}/settings?account={SECOND}"' in html


@pytest.mark.parametrize("path", ["/checkouts", "/callbacks", "/settings"])
@pytest.mark.parametrize("account", ["no-such-account", "nul\x00byte", "x" * 5000, " "])
def test_an_account_that_is_not_installed_is_a_404_that_names_the_installed_ones(two, path, account):
    from urllib.parse import quote

    answer = two.client.get(f"{ADMIN}{path}?account={quote(account)}")
    assert answer.status_code == 404
    assert "is not installed" in text(answer) and f"installed: {ACCOUNT}, {SECOND}" in text(answer)


def test_an_accounts_own_screens_answer_404_for_an_account_not_installed(two):
    client = two.client
    page = client.get(f"{ADMIN}/")
    assert client.get(f"{ADMIN}/accounts/nobody/retire").status_code == 404
    answer = client.post(f"{ADMIN}/accounts/nobody/reopen", data={"csrf_token": token_of(page)})
    assert answer.status_code == 404 and "is not installed" in text(answer)


# --- the status page: each account, retire and reopen ------------------------------------------------------


@pytest.mark.backends
def test_the_status_page_shows_each_account_and_what_is_left_on_a_retired_one(two):
    paid(two, "A-1", ACCOUNT)
    left = started(two, "B-1", SECOND)
    client = two.client
    status = text(client.get(f"{ADMIN}/"))
    assert 'data-accounts="2"' in status
    assert rows(status, "data-account-state") == ["open", "open"]
    shown = visible(status)
    assert f"{SECOND} default for new checkouts" in shown  # the newest open account
    assert f"{CALLBACK}/{SECOND}" in status and "R 50 000.00" in status  # its own callback URL and limit
    assert rows(status, "data-open-checkouts") == ["0", "1"]
    assert f'href="{ADMIN}/accounts/{SECOND}/retire"' in status

    # Retiring: first what it means (nothing changes by looking), then the POST.
    confirm = client.get(f"{ADMIN}/accounts/{SECOND}/retire")
    page = text(confirm)
    assert confirm.status_code == 200 and "data-retire-confirm" in page
    assert "no new checkouts" in visible(page)
    assert 'data-open-checkouts="1"' in page and "1 open checkout" in visible(page)
    assert f"go to {ACCOUNT}, the newest open account" in words(page)
    assert "data-last-open-account" not in page
    with two.shop.app_context():
        assert get_state().installation(SECOND).retired_at is None  # type: ignore[union-attr]

    retired = client.post(
        f"{ADMIN}/accounts/{SECOND}/retire", data={"csrf_token": token_of(confirm)}, follow_redirects=True
    )
    html = text(retired)
    assert f"Merchant account {SECOND} is retired" in html
    assert "Its 1 open checkout, refunds and callbacks go on until settled." in html
    assert rows(html, "data-account-state") == ["open", "retired"]
    assert "Retired since" in html and "left on this retired account" in html
    assert f'action="{ADMIN}/accounts/{SECOND}/reopen"' in html
    assert f"{ACCOUNT} default for new checkouts" in visible(html)
    with two.shop.test_request_context():
        with pytest.raises(CheckoutUnavailableError):
            create_checkout(sample_order("B-2"), account=SECOND)
        assert get_state().session.get_one(GatewayCheckout, left).status == "PENDING_ORDER"  # untouched
    # The lists offer the retired account too.
    assert f"{SECOND} (retired)" in text(client.get(f"{ADMIN}/checkouts"))

    reopened = client.post(
        f"{ADMIN}/accounts/{SECOND}/reopen", data={"csrf_token": token_of(retired)}, follow_redirects=True
    )
    assert f"Merchant account {SECOND} is open again" in text(reopened)
    assert rows(text(reopened), "data-account-state") == ["open", "open"]
    with two.shop.test_request_context():
        assert create_checkout(sample_order("B-3"), account=SECOND).merchant_account_id == SECOND


def test_the_status_page_names_the_account_whose_callbacks_went_silent(two):
    state = get_state(two.shop)
    state.config = dataclasses.replace(state.config, callback_silence_payments=1, callback_silence_minutes=30)
    paid(two, "A-1", ACCOUNT)  # its callback arrives
    with two.shop.test_request_context():
        checkout = create_checkout(sample_order("B-1"), account=SECOND)
        checkout_id, token = checkout.id, checkout.token
    assert token and two.emulator.pay(token).status_code == 200  # its callback never comes
    client = two.client
    page = client.get(f"{ADMIN}/checkouts/{checkout_id}")
    client.post(f"{ADMIN}/checkouts/{checkout_id}/refresh", data={"csrf_token": token_of(page)})
    html = text(client.get(f"{ADMIN}/"))
    assert rows(html, "data-callbacks-silent") == [SECOND]  # not ACCOUNT, whose callback came
    assert f"The gateway's callbacks for merchant account {SECOND} are not reaching the shop" in words(html)
    assert f'href="{ADMIN}/settings?account={SECOND}"' in html


@pytest.mark.backends
def test_each_accounts_settings_are_compared_with_the_gateway_apart(two):
    def checked_at() -> dict[str, Any]:
        with two.shop.app_context():
            return {row.merchant_account_id: row.settings_checked_at for row in get_state().installations()}

    with two.shop.app_context():  # the shop's record of SECOND no longer says what the gateway has
        state = get_state()
        state.require_installation(SECOND).maximum_cents = 4_000_000
        state.session.commit()
    before = checked_at()
    client = two.client
    status = client.get(f"{ADMIN}/")
    assert rows(text(status), "data-account-drift") == ["none", "none"]  # as installed
    token = token_of(status)
    compared = client.post(
        f"{ADMIN}/check-settings?account={SECOND}", data={"csrf_token": token}, follow_redirects=True
    )
    html = text(compared)
    assert f"The gateway's settings of {SECOND} differ from the shop's" in words(html)
    assert rows(html, "data-account-drift") == ["none", "found"]
    assert "maximum amount (cents)" in html
    after = checked_at()
    assert after[ACCOUNT] == before[ACCOUNT] and after[SECOND] != before[SECOND]  # only SECOND was asked
    compared = client.post(
        f"{ADMIN}/check-settings?account={ACCOUNT}", data={"csrf_token": token}, follow_redirects=True
    )
    assert f"The gateway's settings of {ACCOUNT} are the shop's." in words(text(compared))
    assert checked_at()[ACCOUNT] != before[ACCOUNT]
    unknown = client.post(
        f"{ADMIN}/check-settings?account=nobody", data={"csrf_token": token}, follow_redirects=True
    )
    assert unknown.status_code == 200 and "&#39;nobody&#39; is not installed" in text(unknown)


def test_retiring_the_last_open_account_says_so_and_the_status_page_does_not_call_it_uninstalled(admin):
    admin.install()
    client = admin.client
    confirm = client.get(f"{ADMIN}/accounts/{ACCOUNT}/retire")
    assert "data-last-open-account" in text(confirm)
    client.post(f"{ADMIN}/accounts/{ACCOUNT}/retire", data={"csrf_token": token_of(confirm)})
    status = text(client.get(f"{ADMIN}/"))
    assert "Not installed" not in status
    assert "data-every-account-retired" in status and rows(status, "data-account-state") == ["retired"]
    again = client.get(f"{ADMIN}/accounts/{ACCOUNT}/retire")
    assert "data-already-retired" in text(again) and "data-retire-confirm" not in text(again)
    # The settings of a retired account stay editable (its open checkouts still get callbacks).
    settings = client.get(f"{ADMIN}/settings")
    assert settings.status_code == 200 and f'data-settings-account="{ACCOUNT}"' in text(settings)


# --- installing another account, and one account's settings -----------------------------------------------


@pytest.mark.backends
def test_installing_another_account_through_the_screen(admin):
    admin.install()
    issue_account(admin)
    client = admin.client
    with admin.shop.app_context():
        first_key = get_state().require_installation(ACCOUNT).signing_key_encrypted

    page = client.get(f"{ADMIN}/install")
    html = text(page)
    assert 'name="merchant_account_id" required spellcheck="false" type="text" value=""' in html  # not A
    assert 'name="callback_url" spellcheck="false" type="text" value=""' in html  # may be left empty
    assert f"{CALLBACK}/&lt;merchant account id&gt;" in html  # the further account's own address
    form = {
        "csrf_token": token_of(page),
        "merchant_account_id": SECOND,
        "api_key": SECOND_KEY,
        "callback_url": "",  # left empty: the account's own callback path
        "minimum_amount": "2",
        "maximum_amount": "30 000",
    }
    installed = client.post(f"{ADMIN}/install", data=form)
    assert installed.status_code == 302, text(installed)
    status = text(client.get(f"{ADMIN}/"))
    assert f"installed beside {ACCOUNT}" in status and rows(status, "data-account") == [ACCOUNT, SECOND]
    with admin.shop.app_context():
        state = get_state()
        second = state.require_installation(SECOND)
        assert (second.callback_url, second.minimum_cents, second.maximum_cents) == (
            f"{CALLBACK}/{SECOND}",
            200,
            3_000_000,
        )
        assert state.require_installation(ACCOUNT).signing_key_encrypted == first_key  # the first: as it was
        assert state.box.decrypt(second.api_key_encrypted) == SECOND_KEY
    assert emulator_account(admin, SECOND)["checkoutStatusCallbackUrl"] == f"{CALLBACK}/{SECOND}"
    assert emulator_account(admin, ACCOUNT)["checkoutStatusCallbackUrl"] == CALLBACK
    # The account's own callback path works: a payment on it is recorded through it.
    paid(admin, "B-1", SECOND)

    # An id installed here already: a form error that points to its settings, nothing sent or changed.
    again = client.post(f"{ADMIN}/install", data={**form, "merchant_account_id": ACCOUNT, "api_key": API_KEY})
    assert again.status_code == 200
    assert f"Merchant account {ACCOUNT} is already installed in this shop" in text(again)
    assert f"{ADMIN}/settings?account={ACCOUNT}" in text(again) and 'aria-invalid="true"' in text(again)
    with admin.shop.app_context():
        assert get_state().require_installation(ACCOUNT).signing_key_encrypted == first_key
    assert emulator_account(admin, ACCOUNT)["checkoutStatusCallbackUrl"] == CALLBACK


def test_the_first_account_installed_keeps_the_shops_callback_path(admin):
    client = admin.client
    page = client.get(f"{ADMIN}/install")
    assert f'value="{CALLBACK}"' in text(page) and 'name="callback_url" required' in text(page)
    form: dict[str, Any] = {
        "csrf_token": token_of(page),
        "merchant_account_id": ACCOUNT,
        "api_key": API_KEY,
        "callback_url": "",  # the first account: required, as always
        "minimum_amount": "1",
        "maximum_amount": "2",
    }
    refused = client.post(f"{ADMIN}/install", data=form)
    assert refused.status_code == 200 and "This field is required." in text(refused)
    assert emulator_account(admin)["installed"] is False


@pytest.mark.backends
def test_the_settings_screen_edits_one_account(two):
    client = two.client
    default = text(client.get(f"{ADMIN}/settings"))
    assert f'data-settings-account="{SECOND}"' in default  # the default account: the newest open one
    page = client.get(f"{ADMIN}/settings?account={ACCOUNT}")
    html = text(page)
    assert f'data-settings-account="{ACCOUNT}"' in html
    assert f'value="{CALLBACK}"' in html and 'value="100000.00"' in html
    assert f'action="{ADMIN}/settings?account={ACCOUNT}"' in html
    assert rows(html, "data-account") == [ACCOUNT, SECOND]  # the switcher, without "All accounts"
    assert "Check the shop's addresses" not in html

    second_page = text(client.get(f"{ADMIN}/settings?account={SECOND}"))
    assert f'value="{CALLBACK}/{SECOND}"' in second_page
    assert "Check the shop's addresses" not in second_page  # its own callback path is the shop's
    saved = client.post(
        f"{ADMIN}/settings?account={ACCOUNT}",
        data={
            "csrf_token": token_of(page),
            "callback_url": CALLBACK,
            "callback_failures_email": "brand-a@shop.example",
            "minimum_amount": "5",
            "maximum_amount": "700",
        },
    )
    assert saved.status_code == 302
    a, b = emulator_account(two, ACCOUNT), emulator_account(two, SECOND)
    assert (a["maximumCheckoutAmountCents"], a["callbackFailuresEmail"]) == (70000, "brand-a@shop.example")
    assert (b["maximumCheckoutAmountCents"], b["callbackFailuresEmail"]) == (5_000_000, None)
    with two.shop.app_context():
        state = get_state()
        assert state.require_installation(ACCOUNT).maximum_cents == 70000
        assert state.require_installation(SECOND).maximum_cents == 5_000_000


# --- the guard: a brand manager sees only their brand ------------------------------------------------------


@pytest.mark.backends
def test_a_guard_can_let_a_brand_manager_see_only_their_brand(two: Harness) -> None:
    seen: list[str | None] = []

    @two.gateway.admin_guard
    def brand_a_only() -> bool:
        if request.endpoint == "gateway_admin.static":  # the stylesheet: no account's
            return True
        account = viewed_account()
        seen.append(account)
        return account == ACCOUNT

    mine = paid(two, "A-1", ACCOUNT)
    theirs = paid(two, "B-1", SECOND)
    client = two.client
    assert client.get(f"{ADMIN}/checkouts/{mine}").status_code == 200
    stylesheet = client.get(f"{ADMIN}/static/gateway/admin.css")
    stylesheet.close()  # a file response
    assert stylesheet.status_code == 200
    assert client.get(f"{ADMIN}/checkouts/{theirs}").status_code == 403
    # The checkout in the URL decides, whatever the query string says.
    assert client.get(f"{ADMIN}/checkouts/{theirs}?account={ACCOUNT}").status_code == 403
    assert seen[-1] == SECOND
    # The views of every account are refused; the brand's own list is allowed, and shows only the brand.
    for every in ("/", "/checkouts", "/callbacks", "/install", "/outbox/"):
        assert client.get(f"{ADMIN}{every}").status_code == 403, every
        assert seen[-1] is None
    listed = client.get(f"{ADMIN}/checkouts?account={ACCOUNT}")
    assert listed.status_code == 200 and "A-1" in text(listed) and "B-1" not in text(listed)
    assert client.get(f"{ADMIN}/checkouts?account={SECOND}").status_code == 403
    assert client.get(f"{ADMIN}/callbacks?account={ACCOUNT}").status_code == 200
    # The settings screen without ?account= edits the default account (SECOND): refused; its own: allowed.
    assert client.get(f"{ADMIN}/settings").status_code == 403 and seen[-1] == SECOND
    assert client.get(f"{ADMIN}/settings?account={ACCOUNT}").status_code == 200
    assert client.get(f"{ADMIN}/accounts/{SECOND}/retire").status_code == 403
    assert client.get(f"{ADMIN}/accounts/{ACCOUNT}/retire").status_code == 200
    # Actions on the other brand's rows: refused before anything happens (the guard runs first).
    with two.shop.app_context():
        session = get_state().session
        their_log = session.scalar(select(CallbackLog.id).where(CallbackLog.checkout_id == theirs))
        their_event = session.scalar(select(OutboxEvent.id).where(OutboxEvent.checkout_id == theirs))
    assert their_log and their_event
    page = client.get(f"{ADMIN}/checkouts/{mine}")
    token = token_of(page)
    assert client.post(f"{ADMIN}/callbacks/{their_log}/replay", data={"csrf_token": token}).status_code == 403
    assert seen[-1] == SECOND
    assert client.post(f"{ADMIN}/outbox/{their_event}/deliver", data={"csrf_token": token}).status_code == 403
    assert seen[-1] == SECOND
    assert client.post(f"{ADMIN}/checkouts/{theirs}/cancel", data={"csrf_token": token}).status_code == 403
    assert client.post(f"{ADMIN}/accounts/{SECOND}/retire", data={"csrf_token": token}).status_code == 403
    with two.shop.app_context():
        assert get_state().require_installation(SECOND).retired_at is None
    assert len(callback_logs(two)) == 2  # nothing replayed
    # A row that does not exist is of no account: refused like the views of every account.
    assert client.get(f"{ADMIN}/checkouts/999999").status_code == 403 and seen[-1] is None


def test_viewed_account_outside_an_admin_request_is_none(two):
    with two.shop.test_request_context(f"/anything?account={ACCOUNT}"):
        assert viewed_account() is None
    with two.shop.app_context():
        assert viewed_account() is None
