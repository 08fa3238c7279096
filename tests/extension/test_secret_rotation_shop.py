"""A shop rotates its keys in the middle of business (issue 37), with the gateway's emulator inside it
(``GATEWAY_ENVIRONMENT="embedded"``): a paid checkout, a shopper on the payment page, a payment the shop
only hears of through reconciliation.

Each phase is a new app on the same database, as a restart of every worker is: before (the old key), during
(the new key, the old one still accepted: ``SECRET_KEY_FALLBACKS``, or ``GATEWAY_ENCRYPTION_KEY=new,old``),
after ``flask gateway rotate-secrets`` and with the old key dropped. Nothing of what was handed out before
is refused while the old key is listed: the return link, the emulator's payment page (its session and CSRF
token), the callbacks, refunds and reconciliation; and everything still works once the key is gone, but
for the links signed with a dropped ``SECRET_KEY``, refused as documented.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet
from flask import Flask
from flask.testing import FlaskClient
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import select

from flask_gateway import (
    PAID_STATUSES,
    Customer,
    Gateway,
    GatewayCheckout,
    InstallSettings,
    OrderDraft,
    OrderLine,
    create_checkout,
    install,
    reconcile,
    refund,
)
from flask_gateway.emulator import embedded_emulator
from flask_gateway.emulator.models import db as emulator_db
from flask_gateway.models import CallbackLog, RefundRecord, RefundState
from flask_gateway.state import get_state
from flask_gateway.urls import return_url
from tests.conftest import Databases
from tests.extension.operations.cli_support import run_gateway

SHOP = "http://127.0.0.1:5000"
OLD_SECRET = "old-shop-secret-key-0123456789abcdef"
NEW_SECRET = "new-shop-secret-key-fedcba9876543210"
OLD_FERNET, NEW_FERNET = Fernet.generate_key().decode(), Fernet.generate_key().decode()


@dataclass(frozen=True)
class Rotation:
    """The configuration of each phase of one kind of rotation."""

    before: dict[str, Any]
    during: dict[str, Any]
    after: dict[str, Any]
    #: Where the older key is listed during the rotation (what the doctor and the command name).
    older_keys_in: str
    #: Whether the links signed before the rotation are refused once the old key is dropped.
    links_die: bool


ROTATIONS = {
    "SECRET_KEY": Rotation(
        before={"SECRET_KEY": OLD_SECRET},
        during={"SECRET_KEY": NEW_SECRET, "SECRET_KEY_FALLBACKS": [OLD_SECRET]},
        after={"SECRET_KEY": NEW_SECRET},
        older_keys_in="SECRET_KEY_FALLBACKS",
        links_die=True,
    ),
    "GATEWAY_ENCRYPTION_KEY": Rotation(
        before={"SECRET_KEY": OLD_SECRET, "GATEWAY_ENCRYPTION_KEY": OLD_FERNET},
        during={"SECRET_KEY": OLD_SECRET, "GATEWAY_ENCRYPTION_KEY": f"{NEW_FERNET},{OLD_FERNET}"},
        after={"SECRET_KEY": OLD_SECRET, "GATEWAY_ENCRYPTION_KEY": NEW_FERNET},
        older_keys_in="GATEWAY_ENCRYPTION_KEY",
        links_die=False,
    ),
}


def make_shop(database_url: str, instance: Path, keys: dict[str, Any]) -> Flask:
    """The shop as one of its worker processes starts it, with ``keys`` (its secret keys) for this phase."""
    app = Flask("rotating_shop", instance_path=str(instance))
    app.config.update(
        SQLALCHEMY_DATABASE_URI=database_url,
        GATEWAY_ENVIRONMENT="embedded",
        GATEWAY_PUBLIC_URL=SHOP,
        GATEWAY_MAX_RETRIES=0,
        TESTING=True,
        **keys,
    )
    db = SQLAlchemy()
    db.init_app(app)
    Gateway(app, db=db)
    with app.app_context():
        db.create_all()
    app.extensions["shop_db"] = db
    return app


def close(app: Flask) -> None:
    embedded = embedded_emulator(app)
    assert embedded is not None
    with embedded.app.app_context():
        emulator_db.engine.dispose()
    with app.app_context():
        get_state(app).dispose()
        app.extensions["shop_db"].engine.dispose()


@pytest.fixture
def phases(databases: Databases, tmp_path: Path) -> Iterator[Callable[[dict[str, Any]], Flask]]:
    """``start(keys)``: the previous phase's app stopped (every worker restarted), a new one with ``keys``."""
    running: list[Flask] = []

    def start(keys: dict[str, Any]) -> Flask:
        if running:
            close(running.pop())
        app = make_shop(databases.url("rotating-shop"), tmp_path / "instance", keys)
        running.append(app)
        return app

    yield start
    for app in running:
        close(app)


def order(reference: str) -> OrderDraft:
    return OrderDraft(
        reference=reference,
        lines=(OrderLine(name="Enamel kettle", sku="K-1", quantity=1, unit_price_cents=49900),),
        customer=Customer(first_name="Thandi", last_name="Mokoena", email="thandi@example.com"),
    )


def new_checkout(app: Flask, reference: str) -> GatewayCheckout:
    with app.app_context():
        return create_checkout(order(reference))


def status_of(app: Flask, reference: str) -> str:
    with app.app_context():
        state = get_state()
        found = state.session.scalars(
            select(GatewayCheckout.status).where(GatewayCheckout.order_reference == reference)
        ).one()
        state.session.rollback()
        return str(found)


def gateway_pays(app: Flask, token: str, *, deliver: bool = True) -> None:
    """The consumer pays at the gateway (its control API), and its callbacks are delivered (or not)."""
    client = app.test_client()
    paid = client.post(f"/_gateway/_emulator/checkouts/{token}/pay", json={})
    assert paid.status_code == 200, paid.get_data(as_text=True)
    if deliver:
        assert client.post("/_gateway/_emulator/deliver", json={}).status_code == 200


def deliver(app: Flask) -> None:
    delivered = app.test_client().post("/_gateway/_emulator/deliver", json={})
    assert delivered.status_code == 200, delivered.get_data(as_text=True)


@dataclass
class PaymentPage:
    """A shopper's browser on the emulator's payment page: its cookies and the form's CSRF token."""

    path: str
    cookies: list[tuple[str, str, str]]
    csrf_token: str


def open_payment_page(app: Flask, checkout: GatewayCheckout) -> PaymentPage:
    assert checkout.payment_url is not None and checkout.payment_url.startswith(SHOP)
    path = checkout.payment_url.removeprefix(SHOP)
    client = app.test_client()
    page = client.get(path, base_url=SHOP)
    assert page.status_code == 200, page.get_data(as_text=True)
    found = re.search(r'name="csrf_token"[^>]*value="([^"]+)"', page.get_data(as_text=True))
    assert found is not None, page.get_data(as_text=True)
    cookies = [(c.key, c.value, c.path) for c in client._cookies.values()]
    assert cookies, "the payment page set no session cookie"
    return PaymentPage(path=path, cookies=cookies, csrf_token=found.group(1))


def press_pay(app: Flask, page: PaymentPage) -> str:
    """The shopper presses Pay on the page opened before (the same browser): where it is sent back."""
    client: FlaskClient = app.test_client()
    for key, value, path in page.cookies:
        client.set_cookie(key, value, domain="127.0.0.1", path=path)
    paid = client.post(f"{page.path}/pay", data={"csrf_token": page.csrf_token}, base_url=SHOP)
    assert paid.status_code == 303, paid.get_data(as_text=True)  # not the CSRF page (400)
    return paid.headers["Location"]


def follow_return_link(app: Flask, link: str) -> int:
    assert link.startswith(SHOP), link
    return app.test_client().get(link.removeprefix(SHOP), base_url=SHOP).status_code


def refused_callbacks(app: Flask) -> list[str]:
    with app.app_context():
        state = get_state()
        rows = state.session.scalars(select(CallbackLog).where(CallbackLog.verified.is_(False))).all()
        found = [f"#{row.id} {row.outcome} {row.http_status}" for row in rows]
        state.session.rollback()
        return found


def refund_succeeds(app: Flask, reference: str, cents: int) -> None:
    with app.app_context():
        state = get_state()
        checkout = state.session.scalars(
            select(GatewayCheckout).where(GatewayCheckout.order_reference == reference)
        ).one()
        record = refund(checkout, cents, "rotation test")
        assert record.state == RefundState.SUCCEEDED
        assert state.session.scalars(select(RefundRecord.state)).all()[-1] == RefundState.SUCCEEDED


def doctor_installation_lines(app: Flask) -> str:
    result = run_gateway(app, "doctor", "--no-network")
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    # A finding's lines: its marked first line and the indented ones under it.
    mine, inside = [], False
    for line in lines:
        if line.startswith("["):
            inside = "installation:" in line.split("]", 1)[1][:20]
        if inside:
            mine.append(line.strip())
    assert mine, result.stdout
    return " ".join(mine)


@pytest.mark.backends
@pytest.mark.parametrize("kind", sorted(ROTATIONS))
def test_a_rotation_in_the_middle_of_business_refuses_nothing(
    phases: Callable[[dict[str, Any]], Flask], kind: str
) -> None:
    rotation = ROTATIONS[kind]

    # --- before: the old key --------------------------------------------------------------------------
    shop = phases(rotation.before)
    with shop.app_context():
        install(
            InstallSettings(
                merchant_account_id="demo-merchant",
                api_key="demo-api-key",
                callback_url=f"{SHOP}/gateway/callback",
                callback_failures_email=None,
                minimum_cents=100,
                maximum_cents=10_000_000,
            )
        )
    paid = new_checkout(shop, "PAID-1")
    assert paid.token is not None
    gateway_pays(shop, paid.token)
    assert status_of(shop, "PAID-1") == "PAID"
    on_the_page = new_checkout(shop, "OPEN-1")  # the shopper is on the payment page at the rotation
    page = open_payment_page(shop, on_the_page)
    with shop.app_context():
        handed_out = return_url(on_the_page.id, "confirm")  # the gateway holds it since the create
    unheard = new_checkout(shop, "OPEN-2")  # paid during the rotation; its callback never arrives
    assert unheard.token is not None

    # --- during: the new key, the old one still accepted (every worker restarted) ---------------------
    shop = phases(rotation.during)
    assert (
        doctor_installation_lines(shop).count(
            f"2 stored secrets still need an older key: run flask gateway rotate-secrets, then drop it from "
            f"{rotation.older_keys_in}."
        )
        == 1
    )
    link = press_pay(shop, page)  # the page opened before: its session and CSRF token still good
    assert link == handed_out
    assert follow_return_link(shop, link) == 200
    deliver(shop)  # the callback, verified with the signing key stored under the old key
    assert status_of(shop, "OPEN-1") == "PAID"
    gateway_pays(shop, unheard.token, deliver=False)
    with shop.app_context():
        report = reconcile(older_than_seconds=0)
    assert (report.errors, report.confirmed) == ([], 1), report
    assert status_of(shop, "OPEN-2") in PAID_STATUSES  # confirmed (the gateway still awaits its callback)
    refund_succeeds(shop, "PAID-1", 10000)  # the API key stored under the old key
    assert refused_callbacks(shop) == []

    first = run_gateway(shop, "rotate-secrets")
    assert first.exit_code == 0, first.stdout + first.stderr
    assert first.stdout.splitlines()[0] == (
        "Re-encrypted 2 of 2 stored secrets under the current key; none still needs an older key."
    )
    again = run_gateway(shop, "rotate-secrets")
    assert again.exit_code == 0, again.stdout + again.stderr
    assert again.stdout.splitlines()[0].startswith("Re-encrypted 0 of 2 stored secrets")
    assert f"no stored secret needs an older key of {rotation.older_keys_in} any more" in (
        doctor_installation_lines(shop)
    )

    # --- after: the old key dropped (every worker restarted again) ------------------------------------
    shop = phases(rotation.after)
    assert "older key" not in doctor_installation_lines(shop)
    assert "cannot be decrypted" not in doctor_installation_lines(shop)
    fresh = new_checkout(shop, "NEW-1")
    link = press_pay(shop, open_payment_page(shop, fresh))
    assert follow_return_link(shop, link) == 200
    deliver(shop)
    assert status_of(shop, "NEW-1") == "PAID"
    refund_succeeds(shop, "PAID-1", 20000)
    refund_succeeds(shop, "NEW-1", 49900)
    later = new_checkout(shop, "OPEN-3")
    assert later.token is not None
    gateway_pays(shop, later.token, deliver=False)
    with shop.app_context():
        report = reconcile(older_than_seconds=0)
    assert (report.errors, report.confirmed) == ([], 1), report
    assert refused_callbacks(shop) == []
    # A link signed with a SECRET_KEY no longer listed is refused (the runbook's warning); one signed with
    # the same SECRET_KEY (only GATEWAY_ENCRYPTION_KEY rotated) stays good.
    assert follow_return_link(shop, handed_out) == (400 if rotation.links_die else 200)
