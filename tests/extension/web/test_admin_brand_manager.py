"""Delegating a brand (issue 37): one merchant account per admin request, enforced by the extension.

Two brands, as the example shop runs them: Stoep (account A, ``brand-stoep``) and Vuurhout (account B,
``brand-vuurhout``). The manager of Vuurhout walks every admin URL and method of the ``gateway_admin``
blueprints (read from the app's ``url_map``) with every account id (A's, B's, none, an unknown one) and the
ids of A's rows (checkouts, callbacks, outbox events, settings incidents) in the URL, the query string and
the form; no answer shows anything of A's, and no write of theirs touches A's rows. Three ways of saying who
the manager is: the guard docs/extension.md showed before (``viewed_account()``), ``@gateway.admin_accounts``,
and a guard that takes the request's ``account``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from urllib.parse import urlencode

import pytest
from flask import Flask, request
from markupsafe import escape
from sqlalchemy import select

from flask_gateway.core.money import format_money
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import (
    CallbackLog,
    GatewayCheckout,
    Installation,
    OutboxEvent,
    RefundRecord,
    SettingsIncident,
)
from flask_gateway.payments.checkouts import create_checkout
from flask_gateway.payments.installation import InstallSettings, install
from flask_gateway.payments.orders import Customer
from flask_gateway.secrets import mask
from flask_gateway.state import get_state
from flask_gateway.web.admin import viewed_account
from tests.extension.conftest import SHOP_URL, Harness, sample_order
from tests.extension.web.test_admin import ADMIN, admin_rules, emulator_account, methods_of, text, token_of
from tests.extension.web.test_admin_accounts import forged_callback, issue_account

STOEP = "brand-stoep"  # account A: not the manager's
VUURHOUT = "brand-vuurhout"  # account B: the manager's
UNKNOWN = "brand-nobody"
ACCOUNT_IDS = (STOEP, VUURHOUT, UNKNOWN)
KEYS = {STOEP: "stoep-api-key-AAAA", VUURHOUT: "vuurhout-api-key-BBBB"}
EMAILS = {STOEP: "stoep-failures@shop.example", VUURHOUT: "vuurhout-failures@shop.example"}
SHOPPERS = {STOEP: "stoep-shopper@example.com", VUURHOUT: "vuurhout-shopper@example.com"}
LIMITS = {STOEP: (111, 1_111_100), VUURHOUT: (222, 2_222_200)}
ATTACKERS = {STOEP: "https://stoep-attacker.example/steal", VUURHOUT: "https://vuurhout-attacker.example/x"}
DEAD_ERRORS = {STOEP: "RuntimeError: stoep receiver broke", VUURHOUT: "RuntimeError: vuurhout receiver broke"}
NO_ROW = 999_999


def callback_of(account: str) -> str:
    return f"{SHOP_URL}/gateway/callback/{account}"


@dataclasses.dataclass
class Brands:
    """The shop with both brands installed, each with paid and open checkouts, callbacks, outbox events
    (delivered, dead, due) and an open settings incident."""

    harness: Harness
    checkouts: dict[str, list[int]]
    tokens: dict[str, list[str]]
    logs: dict[str, list[int]]
    events: dict[str, list[int]]
    incidents: dict[str, list[int]]
    signing_keys: dict[str, str]
    #: The callback log row of a forged callback: it names no checkout, so it is of no account.
    forged_log: int

    @property
    def shop(self) -> Flask:
        return self.harness.shop


def install_brand(harness: Harness, account: str) -> None:
    issue_account(harness, account, KEYS[account])
    minimum, maximum = LIMITS[account]
    with harness.shop.app_context():
        install(
            InstallSettings(
                merchant_account_id=account,
                api_key=KEYS[account],
                callback_url=callback_of(account),
                callback_failures_email=EMAILS[account],
                minimum_cents=minimum,
                maximum_cents=maximum,
            )
        )


def checkout_of(harness: Harness, account: str, reference: str, *, pay: bool) -> tuple[int, str]:
    order = dataclasses.replace(
        sample_order(reference),
        customer=Customer(first_name="Thandi", last_name="Mokoena", email=SHOPPERS[account]),
    )
    with harness.shop.test_request_context():
        checkout = create_checkout(order, account=account)
        checkout_id, token = checkout.id, checkout.token
    assert token
    if pay:
        assert harness.emulator.pay(token).status_code == 200
        assert harness.emulator.control("deliver").status_code == 200  # its callback, to its own path
    return checkout_id, token


@pytest.fixture
def brands(harness: Harness) -> Brands:
    # Vuurhout first, Stoep second: Stoep is the newest open account, the default for new checkouts (the
    # screens that show "the default account" without ?account= show Stoep's).
    install_brand(harness, VUURHOUT)
    install_brand(harness, STOEP)
    checkouts: dict[str, list[int]] = {}
    tokens: dict[str, list[str]] = {}
    prefix = {STOEP: "STOEP-10", VUURHOUT: "VUUR-20"}
    for account in (STOEP, VUURHOUT):
        made = [
            checkout_of(harness, account, f"{prefix[account]}01", pay=True),
            checkout_of(harness, account, f"{prefix[account]}02", pay=False),
        ]
        checkouts[account] = [checkout_id for checkout_id, _ in made]
        tokens[account] = [token for _, token in made]
    forged_callback(harness)
    with harness.shop.app_context():
        state = get_state()
        session = state.session
        now = utcnow()
        logs = {
            account: list(
                session.scalars(select(CallbackLog.id).where(CallbackLog.checkout_id.in_(checkouts[account])))
            )
            for account in checkouts
        }
        forged = session.scalar(select(CallbackLog.id).where(CallbackLog.checkout_id.is_(None)))
        assert forged is not None and all(logs.values())
        for account, (paid_id, open_id) in checkouts.items():
            session.add_all(
                [
                    OutboxEvent(  # died: every attempt failed
                        checkout_id=paid_id,
                        kind="payment_confirmed",
                        payload={"merchant_account_id": account},
                        state="dead",
                        attempts=5,
                        created_at=now,
                        next_attempt_at=now,
                        last_error=DEAD_ERRORS[account],
                    ),
                    OutboxEvent(  # due now: "Deliver what is due now" would deliver it
                        checkout_id=open_id,
                        kind="checkout_flagged",
                        payload={"merchant_account_id": account},
                        state="pending",
                        attempts=0,
                        created_at=now,
                        next_attempt_at=now - timedelta(minutes=1),
                    ),
                    SettingsIncident(
                        environment=state.config.environment,
                        merchant_account_id=account,
                        setting="callback URL",
                        foreign_value=ATTACKERS[account],
                        our_value=callback_of(account),
                        outcome="repaired",
                        found_at=now,
                        last_seen_at=now,
                        repaired_at=now,
                    ),
                ]
            )
        session.commit()
        events = {
            account: list(
                session.scalars(select(OutboxEvent.id).where(OutboxEvent.checkout_id.in_(checkouts[account])))
            )
            for account in checkouts
        }
        incidents = {
            account: list(
                session.scalars(
                    select(SettingsIncident.id).where(SettingsIncident.merchant_account_id == account)
                )
            )
            for account in checkouts
        }
        signing_keys = {
            account: state.box.decrypt(state.require_installation(account).signing_key_encrypted)
            for account in checkouts
        }
    # Each brand has delivered events too (the payments' own), beside the dead and the due ones.
    assert all(len(ids) >= 3 for ids in events.values()), events
    return Brands(harness, checkouts, tokens, logs, events, incidents, signing_keys, forged)


# --- who the manager is: three ways ---------------------------------------------------------------------------


def documented_guard(brands: Brands) -> None:
    """The brand manager's guard as docs/extension.md showed it before issue 37 (``viewed_account()``)."""

    @brands.harness.gateway.admin_guard
    def brand_manager() -> bool:
        if request.endpoint == "gateway_admin.static":  # the screens' stylesheet
            return True
        return viewed_account() == VUURHOUT


def accounts_callable(brands: Brands) -> None:
    """``@gateway.admin_accounts``: the accounts the signed-in person may see; the guard only signs in."""
    gateway: Any = brands.harness.gateway
    gateway.admin_guard(lambda: True)
    gateway.admin_accounts(lambda: {VUURHOUT})


def guard_with_account(brands: Brands) -> None:
    """A guard that takes ``account``: the account the request acts on, None for a view of every account."""

    @brands.harness.gateway.admin_guard
    def brand_manager(account: str | None) -> bool:
        return account is None or account == VUURHOUT


MANAGERS: dict[str, Callable[[Brands], None]] = {
    "documented-guard": documented_guard,
    "admin-accounts": accounts_callable,
    "guard-with-account": guard_with_account,
}


@pytest.fixture(params=sorted(MANAGERS))
def manager(request: pytest.FixtureRequest, brands: Brands) -> Brands:
    MANAGERS[request.param](brands)
    return brands


# --- what of A's must never show, and A's rows before and after -----------------------------------------------


def forbidden(brands: Brands) -> dict[str, str]:
    """Everything of Stoep's a page could show, by what it is."""
    minimum, maximum = LIMITS[STOEP]
    found = {
        "A's account id": STOEP,
        "A's callback URL": callback_of(STOEP),
        "A's failure e-mail": EMAILS[STOEP],
        "A's shopper's e-mail": SHOPPERS[STOEP],
        "A's order reference": "STOEP-10",
        "A's masked API key": mask(KEYS[STOEP]),
        "A's masked signing key": mask(brands.signing_keys[STOEP]),
        "A's maximum": format_money(maximum).split(" ", 1)[1],  # "11 111.00"
        "A's maximum (form)": "11111.00",
        "A's minimum": format_money(minimum),
        "A's incident": ATTACKERS[STOEP],
        "A's dead event's error": DEAD_ERRORS[STOEP],
    }
    for index, token in enumerate(brands.tokens[STOEP]):
        found[f"A's checkout token {index}"] = token
    return found


def row_patterns(brands: Brands) -> dict[str, re.Pattern[str]]:
    """A's row ids where a page shows rows: links, data attributes, the banner's hidden fields."""
    patterns = {}
    for checkout_id in brands.checkouts[STOEP]:
        patterns[f"A's checkout #{checkout_id}"] = re.compile(rf'/checkouts/{checkout_id}["/]')
    for log_id in brands.logs[STOEP]:
        patterns[f"A's callback #{log_id}"] = re.compile(rf"/callbacks/{log_id}/")
    for event_id in brands.events[STOEP]:
        patterns[f"A's outbox event #{event_id}"] = re.compile(
            rf'/outbox/{event_id}/|data-outbox-event="{event_id}"'
        )
    for incident_id in brands.incidents[STOEP]:
        patterns[f"A's incident #{incident_id}"] = re.compile(
            rf'data-drift-incident="{incident_id}"|name="incident" value="{incident_id}"'
        )
    return patterns


def leaks_in(brands: Brands, body: str) -> list[str]:
    found = [what for what, value in forbidden(brands).items() if value in body]
    return found + [what for what, pattern in row_patterns(brands).items() if pattern.search(body)]


def columns(row: Any) -> dict[str, Any]:
    return {column.name: getattr(row, column.name) for column in type(row).__table__.columns}


def stoep_rows(brands: Brands) -> dict[str, Any]:
    """Every row of A's (and the gateway's record of A): a write of the manager's would change one."""
    mine = brands.checkouts[STOEP]
    with brands.shop.app_context():
        session = get_state().session
        snapshot = {
            "installation": columns(
                session.scalars(select(Installation).filter_by(merchant_account_id=STOEP)).one()
            ),
            "checkouts": [
                columns(row)
                for row in session.scalars(select(GatewayCheckout).filter_by(merchant_account_id=STOEP))
            ],
            "callbacks": [
                columns(row)
                for row in session.scalars(select(CallbackLog).where(CallbackLog.checkout_id.in_(mine)))
            ],
            "events": [
                columns(row)
                for row in session.scalars(select(OutboxEvent).where(OutboxEvent.checkout_id.in_(mine)))
            ],
            "refunds": [
                columns(row)
                for row in session.scalars(select(RefundRecord).where(RefundRecord.checkout_id.in_(mine)))
            ],
            "incidents": [
                columns(row)
                for row in session.scalars(select(SettingsIncident).filter_by(merchant_account_id=STOEP))
            ],
        }
        session.rollback()
    snapshot["at the gateway"] = emulator_account(brands.harness, STOEP)
    return snapshot


# --- the walk ------------------------------------------------------------------------------------------------


def url_values(brands: Brands, argument: str) -> list[Any]:
    """Every value the walk puts in a URL argument: A's rows, B's rows, a row that does not exist."""
    rows = {
        "checkout_id": brands.checkouts,
        "log_id": {**brands.logs, "forged": [brands.forged_log]},
        "event_id": brands.events,
    }
    if argument in rows:
        return [value for ids in rows[argument].values() for value in ids] + [NO_ROW]
    if argument == "account":
        return list(ACCOUNT_IDS)
    if argument == "filename":
        return ["gateway/admin.css"]
    raise AssertionError(f"the walk has no values for the URL argument {argument!r}: add them to url_values")


def bindings(brands: Brands, rule: Any) -> list[dict[str, Any]]:
    combos: list[dict[str, Any]] = [{}]
    for argument in sorted(rule.arguments):
        combos = [{**combo, argument: value} for combo in combos for value in url_values(brands, argument)]
    return combos


def queries(method: str) -> list[dict[str, str]]:
    accounts: list[dict[str, str]] = [{}, *({"account": account} for account in ACCOUNT_IDS)]
    if method != "GET":
        return accounts
    return accounts + [{**query, "show": "delivered"} for query in accounts]  # the outbox's delivered events


def forms(brands: Brands, token: str) -> list[dict[str, Any]]:
    """Every field any admin form reads; one form aimed at A's account and rows, one at B's."""
    every_incident = [str(i) for ids in brands.incidents.values() for i in ids]
    # The settings' fields are B's own values (the settings screen's account comes from ?account=).
    minimum, maximum = LIMITS[VUURHOUT]
    base = {
        "csrf_token": token,
        "callback_url": callback_of(VUURHOUT),
        "callback_failures_email": EMAILS[VUURHOUT],
        "minimum_amount": f"{minimum / 100:.2f}",
        "maximum_amount": f"{maximum / 100:.2f}",
        "confirm_local": "y",
        "incident": every_incident,
        "by": "Vuurhout's manager",
        "next": f"{ADMIN}/checkouts",
        "amount": "1.00",
        "reason": "the walk",
        "confirmed": "y",
        "refunded_before": "0",
    }
    return [
        {
            **base,
            "merchant_account_id": account,
            "api_key": KEYS[account],
            "signing_key": brands.signing_keys[account],
            "account": account,
        }
        for account in (STOEP, VUURHOUT)
    ]


@dataclasses.dataclass
class Walk:
    requests: int = 0
    #: (endpoint, method) pairs requested.
    covered: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    leaks: list[str] = dataclasses.field(default_factory=list)
    errors: list[str] = dataclasses.field(default_factory=list)


def walk(brands: Brands, client: Any, token: str) -> Walk:
    done = Walk()
    for rule in admin_rules(brands.shop):
        for method in methods_of(rule):
            for values in bindings(brands, rule):
                with brands.shop.test_request_context():
                    from flask import url_for

                    path = url_for(rule.endpoint, **values)
                for query in queries(method):
                    for form in forms(brands, token) if method == "POST" else [None]:
                        answer = client.open(path, method=method, query_string=query, data=form)
                        body = answer.get_data(as_text=True)
                        answer.close()
                        with client.session_transaction() as session:  # flashed, shown on the next page
                            flashed = " ".join(message for _, message in session.pop("_flashes", []))
                        done.requests += 1
                        done.covered.add((rule.endpoint, method))
                        aimed = "" if form is None else f" form for {form['account']}"
                        where = f"{method} {path}?{'&'.join(f'{k}={v}' for k, v in query.items())}{aimed}"
                        if answer.status_code >= 500:
                            done.errors.append(f"{where}: {answer.status_code}")
                        # The banner's form sends the person back to the page they asked for: not a leak.
                        asked = escape(f"{path}?{urlencode(query)}")
                        body = body.replace(f'name="next" value="{asked}"', "")
                        found = leaks_in(brands, body + " " + flashed)
                        if found:
                            done.leaks.append(f"{where} ({answer.status_code}): {', '.join(found)}")
    return done


@pytest.mark.backends
def test_a_brand_manager_sees_and_touches_nothing_of_the_other_brand(manager: Brands) -> None:
    client = manager.shop.test_client()
    page = client.get(f"{ADMIN}/checkouts/{manager.checkouts[VUURHOUT][0]}")  # their own checkout
    assert page.status_code == 200  # (what it shows is checked by the walk, which asks for it again)
    before = stoep_rows(manager)

    done = walk(manager, client, token_of(page))

    every = {(rule.endpoint, method) for rule in admin_rules(manager.shop) for method in methods_of(rule)}
    assert done.covered == every  # every endpoint and method of the admin blueprints, none skipped
    after = stoep_rows(manager)
    changed = [part for part in before if before[part] != after[part]]
    problems = done.errors + done.leaks
    if changed:
        problems.append(f"the manager's requests changed A's {', '.join(changed)}")
    assert not problems, f"{done.requests} requests:\n" + "\n".join(problems)


# --- what the manager does see: their own brand -----------------------------------------------------------------


def test_a_brand_manager_sees_their_own_brand(manager: Brands) -> None:
    """Not a wall of refusals: the manager's own account's pages show its data, banner and events, and their
    writes reach their own rows (the incident acknowledged, their due event delivered)."""
    client = manager.shop.test_client()
    mine, still_open = manager.checkouts[VUURHOUT]
    detail = client.get(f"{ADMIN}/checkouts/{mine}")
    assert detail.status_code == 200
    html = text(detail)
    assert (
        "VUUR-2001" in html and f'data-drift-incident="{manager.incidents[VUURHOUT][0]}"' in html
    )  # B's banner
    assert ATTACKERS[VUURHOUT] in html

    listed = text(client.get(f"{ADMIN}/checkouts", query_string={"account": VUURHOUT}))
    assert "VUUR-2001" in listed and "VUUR-2002" in listed
    outbox = text(client.get(f"{ADMIN}/outbox/", query_string={"account": VUURHOUT, "show": "delivered"}))
    assert "VUUR-2001" in outbox
    dead = text(client.get(f"{ADMIN}/outbox/", query_string={"account": VUURHOUT}))
    assert DEAD_ERRORS[VUURHOUT] in dead
    settings = text(client.get(f"{ADMIN}/settings", query_string={"account": VUURHOUT}))
    assert EMAILS[VUURHOUT] in settings

    token = token_of(detail)
    acknowledged = client.post(
        f"{ADMIN}/settings-incidents/acknowledge",
        query_string={"account": VUURHOUT},
        data={"csrf_token": token, "incident": [str(i) for ids in manager.incidents.values() for i in ids]},
    )
    assert acknowledged.status_code == 302
    delivered = client.post(
        f"{ADMIN}/outbox/deliver-due", query_string={"account": VUURHOUT}, data={"csrf_token": token}
    )
    assert delivered.status_code == 302
    with manager.shop.app_context():
        session = get_state().session
        by_account = {
            incident.merchant_account_id: incident.acknowledged_at
            for incident in session.scalars(select(SettingsIncident))
        }
        due = {
            event.checkout_id: event.state
            for event in session.scalars(select(OutboxEvent).where(OutboxEvent.kind == "checkout_flagged"))
        }
    assert by_account[VUURHOUT] is not None and by_account[STOEP] is None
    assert due == {still_open: "delivered", manager.checkouts[STOEP][1]: "pending"}


# --- every admin view declares its account ---------------------------------------------------------------------

#: Each admin endpoint and how it finds its one account (or that it is a view of every account). A new
#: endpoint fails here until it is declared, and its declaration written down here.
DECLARED = {
    "gateway_admin.static": "every account",
    "gateway_admin.index": "every account",
    "gateway_admin.install_screen": "a POST's form field merchant_account_id, else every account",
    "gateway_admin.settings_screen": "?account=, else the default account",
    "gateway_admin.check_settings_now": "?account=, else the default account",
    "gateway_admin.change_api_key": "?account=, else the default account",
    "gateway_admin.checkouts": "?account=, else every account",
    "gateway_admin.checkout_detail": "the account of the checkout in the URL (checkout_id)",
    "gateway_admin.refresh_checkout": "the account of the checkout in the URL (checkout_id)",
    "gateway_admin.cancel_checkout": "the account of the checkout in the URL (checkout_id)",
    "gateway_admin.refund_checkout": "the account of the checkout in the URL (checkout_id)",
    "gateway_admin.callbacks": "?account=, else every account",
    "gateway_admin.replay_callback_now": "the account of the callback in the URL (log_id)",
    "gateway_admin.retire": "the account in the URL (account)",
    "gateway_admin.reopen": "the account in the URL (account)",
    "gateway_admin.acknowledge_settings_incidents": "?account=, else every account",
    "gateway_admin.outbox.index": "?account=, else every account",
    "gateway_admin.outbox.deliver_due_now": "?account=, else every account",
    "gateway_admin.outbox.deliver_again": "the account of the outbox event in the URL (event_id)",
}


def test_every_admin_endpoint_declares_the_account_it_acts_on(harness: Harness) -> None:
    from flask_gateway.web.admin.access import declaration, undeclared

    app = harness.shop
    endpoints = {rule.endpoint for rule in admin_rules(app)}
    assert undeclared(app) == []
    assert {endpoint: str(declaration(endpoint, app)) for endpoint in endpoints} == DECLARED


def test_an_admin_view_that_does_not_declare_its_account_is_refused(
    harness: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """Fail closed: an endpoint of the admin blueprint added without a declaration answers 403 whatever
    the guard says, and ``undeclared`` names it."""
    from flask_gateway.web.admin.access import undeclared

    app = harness.shop
    harness.gateway.admin_guard(lambda: True)
    app.add_url_rule("/gateway/admin/export.csv", "gateway_admin.export", lambda: "every account's rows")
    assert undeclared(app) == ["gateway_admin.export"]
    answer = app.test_client().get("/gateway/admin/export.csv")
    assert answer.status_code == 403 and "every account's rows" not in text(answer)
    assert "gateway_admin.export does not declare the merchant account" in caplog.text


def test_the_guard_is_told_each_requests_declared_account(brands: Brands) -> None:
    """``viewed_account()`` and a guard's ``account``: the row's account whatever ``?account=`` says, and
    None for a view of every account whatever ``?account=`` says."""
    told: list[tuple[str | None, str | None]] = []

    @brands.harness.gateway.admin_guard
    def record(account: str | None) -> bool:
        told.append((account, viewed_account()))
        return True

    client = brands.shop.test_client()
    theirs = brands.checkouts[STOEP][0]
    cases = [
        (f"{ADMIN}/checkouts/{theirs}?account={VUURHOUT}", STOEP),
        (f"{ADMIN}/?account={VUURHOUT}", None),
        (f"{ADMIN}/install?account={VUURHOUT}", None),
        (f"{ADMIN}/checkouts", None),
        (f"{ADMIN}/checkouts?account={VUURHOUT}", VUURHOUT),
        (f"{ADMIN}/outbox/?account={VUURHOUT}", VUURHOUT),
        (f"{ADMIN}/settings", STOEP),  # the default account: the newest one still open
        (f"{ADMIN}/accounts/{VUURHOUT}/retire?account={STOEP}", VUURHOUT),
    ]
    for url, account in cases:
        told.clear()
        assert client.get(url).status_code == 200, url
        assert told[0] == (account, account), url
