"""The emulator can be closed (issue 12): ``EMULATOR_CONTROL_TOKEN``, JSON-only control POSTs, masked v1 URLs.

Also: JSON nested too deep is a 400 (not a RecursionError 500), and every answer has a Referrer-Policy.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from flask import Flask

from flask_gateway.emulator.models import db
from tests.emulator.conftest import make_emulator
from tests.emulator.support import Gateway, create_body, v1_checkout_body

TOKEN = "control-token-for-tests-0123456789"
_CSRF = re.compile(r'name="csrf_token" value="([^"]+)"')


@pytest.fixture
def closed(database_url: str) -> Iterator[Flask]:
    app = make_emulator(database_url, control_token=TOKEN)
    yield app
    with app.app_context():
        db.engine.dispose()


def bearer(token: str = TOKEN) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_cross_site_form_or_text_post_to_the_control_api_is_415_and_pays_nothing(
    installed: Gateway,
) -> None:
    token = installed.create()["checkoutToken"]

    for content_type in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data"):
        answer = installed.client.post(
            f"/_emulator/checkouts/{token}/pay", data="{}", headers={"Content-Type": content_type}
        )
        assert answer.status_code == 415, content_type
    assert installed.client.post(f"/_emulator/checkouts/{token}/pay").status_code == 415  # no type at all

    assert installed.status(token)["checkoutPaymentStatus"] == "PENDING_ORDER"
    assert installed.control(f"checkouts/{token}/pay").status_code == 200  # JSON, as the API documents


def test_with_a_control_token_the_control_api_needs_it(closed: Flask) -> None:
    client = closed.test_client()
    gateway = Gateway(client)
    gateway.install()
    token = gateway.create()["checkoutToken"]

    assert client.post(f"/_emulator/checkouts/{token}/pay", json={}).status_code == 401
    assert (
        client.post(f"/_emulator/checkouts/{token}/pay", json={}, headers=bearer("wrong-" * 4)).status_code
        == 401
    )
    refused = client.get("/_emulator/checkouts", headers=bearer("nope"))
    assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Bearer")
    assert gateway.status(token)["checkoutPaymentStatus"] == "PENDING_ORDER"

    assert client.post(f"/_emulator/checkouts/{token}/pay", json={}, headers=bearer()).status_code == 200
    assert client.get("/_emulator/callbacks", headers=bearer()).status_code == 200
    assert client.get("/_emulator/clock").status_code == 200  # the health check stays open
    assert client.get(f"/api/v2/app/checkout/{token}").status_code == 200  # the consumer's page too


def test_with_a_control_token_the_dashboard_needs_a_sign_in(closed: Flask) -> None:
    client = closed.test_client()

    first = client.get("/_emulator/dashboard/callbacks")
    assert first.status_code == 303 and "/_emulator/login" in first.headers["Location"]
    assert client.get("/_emulator/").status_code == 303
    form = client.get("/_emulator/login?next=/_emulator/dashboard/callbacks")
    csrf = _CSRF.search(form.get_data(as_text=True))
    assert csrf is not None

    wrong = client.post(
        "/_emulator/login?next=/_emulator/dashboard/callbacks",
        data={"token": "not-the-token", "csrf_token": csrf.group(1)},
    )
    assert wrong.status_code == 401
    assert client.get("/_emulator/").status_code == 303

    right = client.post(
        "/_emulator/login?next=/_emulator/dashboard/callbacks",
        data={"token": TOKEN, "csrf_token": csrf.group(1)},
    )
    assert right.status_code == 303 and right.headers["Location"].endswith("/_emulator/dashboard/callbacks")
    assert client.get("/_emulator/").status_code == 200
    assert client.get("/_emulator/dashboard/callbacks").status_code == 200


def test_the_sign_in_never_redirects_off_the_dashboard(closed: Flask) -> None:
    client = closed.test_client()
    form = client.get("/_emulator/login")
    csrf = _CSRF.search(form.get_data(as_text=True))
    assert csrf is not None
    answer = client.post(
        "/_emulator/login?next=//evil.example/", data={"token": TOKEN, "csrf_token": csrf.group(1)}
    )
    assert answer.status_code == 303 and answer.headers["Location"].endswith("/_emulator/")


def _v1_order(gateway: Gateway) -> str:
    answer = gateway.v1(
        "checkout", v1_checkout_body(fail_callback_url="https://shop.example/v1/fail?ref=SECRETREF")
    )
    assert answer.status_code == 200, answer.get_data(as_text=True)
    return str(answer.json["data"]["token"])


def test_v1_outcome_urls_are_masked_for_anonymous_eyes(installed: Gateway) -> None:
    token = _v1_order(installed)

    page = installed.client.get(f"/_emulator/dashboard/checkouts/{token}").get_data(as_text=True)

    assert "SECRETREF" not in page and "s=abc" not in page
    assert "success_callback_url" in page and "ref=****" in page


def test_v1_outcome_urls_are_shown_to_the_operator(closed: Flask) -> None:
    gateway = Gateway(closed.test_client())
    gateway.install()
    token = _v1_order(gateway)

    page = closed.test_client().get(f"/_emulator/dashboard/checkouts/{token}", headers=bearer())

    assert page.status_code == 200
    assert "ref=SECRETREF" in page.get_data(as_text=True)


@pytest.mark.parametrize(
    "path", ["/v2/create", "/_emulator/faults", "/install/v2", "/api/v1/merchant/checkout"]
)
def test_json_nested_too_deep_is_a_400_not_a_500(installed: Gateway, path: str) -> None:
    for depth in (40, 20_000):
        body = "[" * depth + "]" * depth
        answer = installed.client.post(path, data=body, headers={"Content-Type": "application/json"})
        assert answer.status_code in (400, 401), (path, depth, answer.status_code)
        assert answer.json is not None and "message" in answer.json
    nested = '{"a":' * 50 + "1" + "}" * 50
    answer = installed.signed("/v2/create", None, raw=nested.encode())
    assert answer.status_code == 400


def test_every_emulator_answer_has_a_referrer_policy(installed: Gateway) -> None:
    token = installed.create(create_body())["checkoutToken"]
    for path in ("/_emulator/", f"/api/v2/app/checkout/{token}", "/_emulator/clock", "/nowhere"):
        assert installed.client.get(path).headers["Referrer-Policy"] in ("no-referrer", "same-origin"), path
