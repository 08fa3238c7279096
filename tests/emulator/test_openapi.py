"""The OpenAPI document: in sync with docs/openapi.json, valid OpenAPI 3.1, and true of the emulator.

Schemathesis generates requests for every operation from the document (valid and invalid ones) and sends
them to the in-process emulator (WSGI, no network). Every answer must be documented: status, content type,
headers and body. A small WSGI wrapper signs each request the way the case asks (valid, wrong or missing
credentials), so both the authenticated paths and the 401s are covered.

The generated requests (their values reach the columns) and the U+0000 refusals run on SQLite and on
PostgreSQL (``@pytest.mark.backends``, tests/conftest.py); the checks decided before the database, on SQLite.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import OpenAPIV31SpecValidator, validate
from schemathesis import GenerationMode
from schemathesis.checks import (
    content_type_conformance,
    negative_data_rejection,
    not_a_server_error,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)
from schemathesis.core.parameters import ParameterLocation

from flask_gateway.core.signing import sign
from flask_gateway.core.wire import OPERATOR, SPEC, WireNames
from flask_gateway.emulator import checkouts
from flask_gateway.emulator.models import Account, db
from flask_gateway.emulator.openapi import OPERATIONS, build_document, render
from tests.emulator.conftest import make_emulator
from tests.emulator.support import ACCOUNT, API_KEY, Gateway, create_body, service, v1_checkout_body

DOCS = Path(__file__).resolve().parents[2] / "docs" / "openapi.json"
FRESH_ACCOUNT, FRESH_KEY = "fresh-merchant", "fresh-api-key"
AUTH_HEADER = "X-Fuzz-Auth"  # tells the signing wrapper which credentials to put on the request

CHECKS = [
    not_a_server_error,
    status_code_conformance,
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    negative_data_rejection,
]
#: Examples per operation and generation mode (the whole file stays well under a minute).
MAX_EXAMPLES = 50


# --- the document itself ---------------------------------------------------------------------------


def test_committed_document_is_up_to_date():
    assert DOCS.read_text(encoding="utf-8") == render(), (
        "docs/openapi.json is out of date: run `python -m flask_gateway.emulator.openapi > docs/openapi.json`"
    )


def test_document_is_valid_openapi_3_1():
    document = build_document()
    assert document["openapi"] == "3.1.0"
    validate(document, cls=OpenAPIV31SpecValidator)  # raises on any violation, dangling $refs included


def test_served_document_equals_the_committed_one(emulator_client):
    response = emulator_client.get("/_emulator/openapi.json")
    assert response.status_code == 200
    assert response.get_data(as_text=True) == DOCS.read_text(encoding="utf-8")


def test_document_covers_every_operation_and_its_answers():
    paths = build_document()["paths"]
    expected = {
        ("post", "/v2/create"),
        ("post", "/v2/update"),
        ("post", "/v2/cancel"),
        ("post", "/v2/getstatus"),
        ("post", "/v2/refund"),
        ("post", "/install/v2"),
        ("patch", "/install/v2"),
        ("post", "/api/v1/merchant/configuration"),
        ("post", "/api/v1/merchant/checkout"),
        ("post", "/api/v1/merchant/refund"),
        ("get", "/livez"),
        ("get", "/readyz"),
    }
    assert {(method, path) for path, item in paths.items() for method in item} == expected
    assert paths["/livez"]["get"]["security"] == paths["/readyz"]["get"]["security"] == []
    assert set(paths["/readyz"]["get"]["responses"]) == {"200", "503"}
    create = paths["/v2/create"]["post"]
    assert set(create["responses"]) == {"200", "400", "401", "403", "409", "413", "422", "429", "5XX"}
    assert "idempotent-replay" in create["responses"]["200"]["headers"]
    assert "idempotent-replay" in paths["/v2/refund"]["post"]["responses"]["200"]["headers"]
    assert create["security"] == [{"merchantAccountId": [], "signature": []}]
    assert paths["/install/v2"]["post"]["security"] == []
    assert paths["/api/v1/merchant/checkout"]["post"]["security"] == [{"merchantBasic": []}]
    assert paths["/api/v1/merchant/configuration"]["post"]["requestBody"]["required"] is False


def test_status_payload_documents_exactly_its_16_keys():
    from flask_gateway.core.wire import status_payload_keys

    payload = build_document()["components"]["schemas"]["CheckoutStatusPayload"]
    assert payload["required"] == list(status_payload_keys())
    assert set(payload["properties"]) == set(status_payload_keys())


# --- malformed and oversize bodies, on every JSON endpoint -----------------------------------------

JSON_ENDPOINTS = [(op.method.upper(), op.path) for op in OPERATIONS] + [
    ("POST", "/_emulator/accounts"),
    ("POST", "/_emulator/clock/advance"),
    ("POST", "/_emulator/faults"),
]


def _send(gateway: Gateway, method: str, path: str, raw: bytes):
    """``raw`` with valid credentials of both kinds (signature when the bytes can be signed, Basic)."""
    headers = {
        "Content-Type": "application/json",
        "X-Merchant-Account-ID": ACCOUNT,
        **_basic(ACCOUNT, API_KEY),
    }
    with contextlib.suppress(UnicodeDecodeError):  # bytes that are not UTF-8 cannot be signed
        headers["X-Signature"] = sign(raw, gateway.keys[ACCOUNT])
    return gateway.client.open(path, method=method, data=raw, headers=headers)


@pytest.mark.parametrize(("method", "path"), JSON_ENDPOINTS)
@pytest.mark.parametrize("body", [b"{not json", b'{"a": 1', b"\xff\xfe{}", b"[1, 2]", b'"text"', b"{}}"])
def test_malformed_json_is_400(installed, method, path, body):
    response = _send(installed, method, path, body)
    assert response.status_code == 400, response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    assert isinstance(response.json["message"], str)


@pytest.mark.parametrize(("method", "path"), JSON_ENDPOINTS)
def test_oversize_body_is_413(installed, method, path):
    body = json.dumps({"padding": "x" * (64 * 1024)}).encode()
    response = _send(installed, method, path, body)
    assert response.status_code == 413, response.get_data(as_text=True)
    assert response.mimetype == "application/json"
    assert "64 KiB" in response.json["message"]


def test_body_of_exactly_64_kib_is_not_413(installed):
    raw = json.dumps({"checkoutToken": "v2.x.y", "pad": ""}).encode()
    raw = raw[:-2] + b"x" * (64 * 1024 - len(raw)) + raw[-2:]
    assert len(raw) == 64 * 1024
    assert installed.signed("/v2/getstatus", None, raw=raw).status_code == 404


@pytest.mark.parametrize("expires_at", ["0001-01-01T00:00:00+01:00", "9999-12-31T23:59:59-01:00"])
def test_timestamp_out_of_range_in_utc_is_400_not_500(installed, expires_at):
    """Found while checking the document: such a value overflowed in the conversion to UTC (a 500)."""
    token = installed.create(create_body())["checkoutToken"]
    body = {"checkoutToken": token, "payjustnow": service(expiresAt=expires_at), "checkoutTotalCents": 79800}
    response = installed.signed("/v2/update", body)
    assert response.status_code == 400, response.get_data(as_text=True)
    assert response.json["errors"][0]["field"] == "payjustnow.expiresAt"


@pytest.mark.backends
@pytest.mark.parametrize(("method", "path"), JSON_ENDPOINTS)
def test_nul_character_in_text_is_400(installed, method, path):
    """PostgreSQL text cannot hold U+0000 (it was a 500 there): refused up front on every backend."""
    response = _send(installed, method, path, b'{"merchantAccountId": "a\\u0000b", "ok": ["x", "y\\u0000"]}')
    assert response.status_code == 400, response.get_data(as_text=True)
    assert response.json["errors"] == [{"field": "merchantAccountId", "message": "must not contain \\u0000"}]
    nested = _send(installed, method, path, b'{"payjustnow": {"orderItems": [{"sku": "\\u0000"}]}}')
    assert nested.json["errors"][0]["field"] == "payjustnow.orderItems[0].sku"


@pytest.mark.backends
def test_nul_character_in_credentials_or_tokens_is_refused_not_500(installed):
    v1 = installed.client.post("/api/v1/merchant/configuration", headers=_basic("demo\x00merchant", API_KEY))
    assert v1.status_code == 401
    assert installed.control("checkouts/v2.x%00y/pay").status_code == 404
    assert installed.client.get("/_emulator/dashboard/checkouts/v2.x%00y").status_code == 404


@pytest.mark.parametrize(("method", "path"), [(op.method.upper(), op.path) for op in OPERATIONS])
def test_undocumented_method_is_405_with_allow(emulator_client, method, path):
    other = "PUT" if method != "PUT" else "DELETE"
    response = emulator_client.open(path, method=other, json={})
    assert response.status_code == 405
    assert response.mimetype == "application/json"
    assert method in response.headers["Allow"]


# --- schemathesis against the in-process emulator --------------------------------------------------


def _basic(account: str, key: str) -> dict[str, str]:
    return {"Authorization": "Basic " + base64.b64encode(f"{account}:{key}".encode()).decode()}


class SigningWrapper:
    """WSGI middleware: puts valid, wrong or no credentials on each request (``X-Fuzz-Auth``).

    Signing happens here, over the exact bytes received, so it cannot disagree with how the test client
    serialised the generated body.
    """

    def __init__(self, app: Callable[..., Iterable[bytes]], signing_key: str) -> None:
        self.app = app
        self.signing_key = signing_key

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        mode = environ.pop("HTTP_X_FUZZ_AUTH", "valid")
        if mode == "as-generated":
            return self.app(environ, start_response)
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = environ["wsgi.input"].read(length) if length else b""
        environ["wsgi.input"] = io.BytesIO(body)
        for name in ("HTTP_X_MERCHANT_ACCOUNT_ID", "HTTP_X_SIGNATURE", "HTTP_AUTHORIZATION"):
            environ.pop(name, None)
        if mode != "missing":
            key = self.signing_key if mode == "valid" else "not-the-signing-key"
            api_key = API_KEY if mode == "valid" else "not-the-api-key"
            environ["HTTP_X_MERCHANT_ACCOUNT_ID"] = ACCOUNT
            with contextlib.suppress(UnicodeDecodeError):  # not UTF-8: cannot be signed, sent unsigned
                environ["HTTP_X_SIGNATURE"] = sign(body, key)
            environ["HTTP_AUTHORIZATION"] = _basic(ACCOUNT, api_key)["Authorization"]
        return self.app(environ, start_response)


class Seeded:
    """An installed emulator with checkouts in every state, whose tokens the cases may borrow."""

    def __init__(self, database_url: str, names: WireNames = OPERATOR) -> None:
        accounts = {ACCOUNT: API_KEY, FRESH_ACCOUNT: FRESH_KEY}
        self.app = make_emulator(database_url, accounts=accounts, wire_names=names)
        gateway = Gateway(self.app.test_client())
        self.key = gateway.install(minimum=0, maximum=10**12)  # limits apart: more cases reach the rules
        self.v2_tokens: list[str] = []
        for n, action in enumerate(["open", "pay", "cancel", "consumer-cancel", "refund", "open"]):
            token = gateway.create(create_body(request_id=f"seed-{n}", merchantOrderReference=f"seed-{n}"))[
                "checkoutToken"
            ]
            if action in ("pay", "refund"):
                assert gateway.pay(token).status_code == 200
            if action == "refund":
                refund = {"checkoutToken": token, "merchantRefundReference": "r", "refundAmountCents": 100}
                assert gateway.signed("/v2/refund", refund).status_code == 200
            if action == "cancel":
                assert gateway.signed("/v2/cancel", {"checkoutToken": token}).status_code == 200
            if action == "consumer-cancel":
                assert gateway.consumer_cancel(token).status_code == 200
            self.v2_tokens.append(token)
        self.v1_orders: list[tuple[str, str]] = []
        for n in range(3):
            answer = gateway.v1("checkout", v1_checkout_body(merchant_reference=f"v1-{n}"))
            assert answer.status_code == 200, answer.get_data(as_text=True)
            token = answer.json["data"]["token"]
            if n < 2:  # paid directly: the consumer's v1 payment would call the merchant's URL
                with self.app.app_context():
                    checkout = checkouts.lock(None, token)
                    account = db.session.get(Account, checkout.account_id)
                    assert account is not None
                    checkouts.pay(checkout, account)
                    db.session.commit()
            self.v1_orders.append((token, f"v1-{n}"))
        self.wsgi = SigningWrapper(self.app, self.key)


def _integral(value: Any) -> Any:
    """``100.0`` -> ``100`` throughout: JSON Schema's ``integer`` admits ``100.0``, the emulator does not."""
    if isinstance(value, float) and value.is_integer() and abs(value) < 2**63:
        return int(value)
    if isinstance(value, dict):
        return {key: _integral(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_integral(item) for item in value]
    return value


def _borrow(case: Any, data: st.DataObject, seeded: Seeded) -> None:
    """Point some cases at real checkouts and accounts, so they get past 404s and 401s into the rules."""
    body = case.body
    if not isinstance(body, dict) or (case.meta is not None and case.meta.generation.mode.is_negative):
        return  # a negative case's invalid value may be the very field we would replace
    case.body = body = _integral(body)
    path = case.operation.path
    if "checkoutToken" in body and data.draw(st.booleans(), label="real checkoutToken"):
        body["checkoutToken"] = data.draw(st.sampled_from(seeded.v2_tokens), label="token")
        if "refundAmountCents" in body:  # within what remains refundable, mostly
            body["refundAmountCents"] = data.draw(st.integers(1, 30_000), label="refund amount")
    if path == "/api/v1/merchant/refund" and data.draw(st.booleans(), label="real v1 order"):
        token, reference = data.draw(st.sampled_from(seeded.v1_orders), label="order")
        body["token"] = token
        body["merchant_reference"] = reference
        body["amount"] = data.draw(st.integers(1, 30_000), label="refund amount")
    if path == "/install/v2" and case.method == "POST" and data.draw(st.booleans(), label="real account"):
        account, key = data.draw(
            st.sampled_from([(FRESH_ACCOUNT, FRESH_KEY), (ACCOUNT, API_KEY)]), label="account"
        )
        body["merchantAccountId"] = account
        body["merchantAccountApiKey"] = key


#: A negative case is rejected with one of these (413: the generated body outgrew 64 KiB).
REJECTIONS = ["400", "401", "403", "404", "409", "413", "422"]
SCHEMAS = {
    names.key: schemathesis.openapi.from_dict(
        build_document(names),
        config=schemathesis.Config.from_dict(
            {"checks": {"negative_data_rejection": {"expected-statuses": REJECTIONS}}}
        ),
    )
    for names in (OPERATOR, SPEC)
}
SCHEMA = SCHEMAS[OPERATOR.key]
AUTH_MODES = ["valid", "valid", "valid", "wrong", "missing"]


def _blank(body: object) -> bool:
    return isinstance(body, bytes | str) and not body.strip()


def _headers_are_the_invalid_part(case: Any) -> bool:
    meta = case.meta
    header = meta.components.get(ParameterLocation.HEADER) if meta is not None else None
    return header is not None and header.mode.is_negative


def _fuzz(
    seeded: Seeded,
    method: str,
    path: str,
    mode: GenerationMode,
    *,
    credentials: Sequence[str] = AUTH_MODES,
    max_examples: int | None = None,
    names: WireNames = OPERATOR,
) -> dict[int, int]:
    """Run generated cases against the emulator; answers how often each status came back."""
    operation = SCHEMAS[names.key][path][method]
    secured = bool(operation.definition.raw.get("security"))
    seen: dict[int, int] = {}

    @settings(
        max_examples=max_examples or MAX_EXAMPLES,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def run(case: Any, data: st.DataObject) -> None:
        auth = data.draw(st.sampled_from(list(credentials)), label="credentials")
        if _headers_are_the_invalid_part(case):
            auth = "as-generated"  # schemathesis dropped or mangled the credentials: send them so
        _borrow(case, data, seeded)
        response = case.call(app=seeded.wsgi, headers={AUTH_HEADER: auth})
        checks = CHECKS
        if path == "/api/v1/merchant/configuration" and _blank(case.body):
            # Documented leniency: a blank body (whitespace only) is no body, not malformed JSON.
            checks = [check for check in CHECKS if check is not negative_data_rejection]
        case.validate_response(response, checks=checks, transport_kwargs={"app": seeded.wsgi})
        seen[response.status_code] = seen.get(response.status_code, 0) + 1
        if secured and auth != "valid":
            assert response.status_code >= 400, f"{method} {path} accepted {auth} credentials"

    run()
    return seen


@pytest.mark.backends
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize(("method", "path"), [(op.method.upper(), op.path) for op in OPERATIONS])
def test_emulator_conforms_to_its_document(database_url, method, path, mode):
    seeded = Seeded(database_url)
    _fuzz(seeded, method, path, mode)
    with seeded.app.app_context():
        db.engine.dispose()


@pytest.mark.backends
@pytest.mark.parametrize(("method", "path"), [(op.method.upper(), op.path) for op in OPERATIONS])
def test_emulator_on_the_specs_wire_names_conforms_to_the_spec_named_document(database_url, method, path):
    """``EMULATOR_WIRE_NAMES=spec``: the document says ``service``, ``serviceOrderReference``; the emulator
    answers so (the response checks) and still takes every request the document describes."""
    seeded = Seeded(database_url, SPEC)
    _fuzz(seeded, method, path, GenerationMode.POSITIVE, names=SPEC)
    with seeded.app.app_context():
        db.engine.dispose()


def test_the_spec_named_document_spells_the_specs_words():
    text = json.dumps(build_document(SPEC))
    assert '"service"' in text and '"serviceOrderReference"' in text
    assert "payjustnow" not in text
    operator_text = json.dumps(build_document())
    assert '"payjustnow"' in operator_text and '"payjustnowOrderReference"' in operator_text
    assert '"service"' not in operator_text and "serviceOrderReference" not in operator_text


SECURED = [(op.method.upper(), op.path) for op in OPERATIONS if op.security != "none"]


@pytest.mark.parametrize(("method", "path"), SECURED)
def test_bad_credentials_get_the_documented_401(database_url, method, path):
    """Valid bodies with a wrong signature / API key, or none: refused, as the document says."""
    seeded = Seeded(database_url)
    seen = _fuzz(
        seeded, method, path, GenerationMode.POSITIVE, credentials=["wrong", "missing"], max_examples=15
    )
    assert 401 in seen, seen
    # Checked before the credentials: the body's JSON and the firewall (create, update, v1 checkout).
    assert set(seen) <= {400, 401, 403, 413}, seen
    with seeded.app.app_context():
        db.engine.dispose()


@pytest.mark.parametrize("status", [429, 500, 503])
@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.operation_id)
def test_injected_fault_statuses_are_documented(database_url, operation, status):
    seeded = Seeded(database_url)
    client = seeded.app.test_client()
    rule = {
        "operation": operation.fault_name,
        "kind": "status",
        "status": status,
        "retryAfter": 7,
        "count": 1,
    }
    assert client.post("/_emulator/faults", json=rule).status_code == 201
    case = SCHEMA[operation.path][operation.method.upper()].Case(body={}, media_type="application/json")
    response = case.call(app=seeded.wsgi)
    assert response.status_code == status
    assert response.headers["retry-after"] == ["7"]
    injected = [check for check in CHECKS if check is not not_a_server_error]  # the 5xx is the point
    case.validate_response(response, checks=injected, transport_kwargs={"app": seeded.wsgi})
    with seeded.app.app_context():
        db.engine.dispose()


# --- the health probes and the outage answer -------------------------------------------------------

#: Nothing listens on port 1: the connection is refused at once.
UNREACHABLE = "postgresql+psycopg://gateway@127.0.0.1:1/emulator"
CONFORMS = [check for check in CHECKS if check is not not_a_server_error]  # a 503 is the point


@pytest.mark.parametrize("path", ["/livez", "/readyz"])
def test_health_probes_answer_as_documented(emulator_app, path):
    case = SCHEMA[path]["GET"].Case()
    response = case.call(app=emulator_app)
    assert response.status_code == 200
    case.validate_response(response, checks=CONFORMS, transport_kwargs={"app": emulator_app})


@pytest.mark.parametrize("path", ["/livez", "/readyz"])
def test_health_probes_of_an_emulator_without_its_database_answer_as_documented(path):
    app = make_emulator(UNREACHABLE)
    case = SCHEMA[path]["GET"].Case()
    response = case.call(app=app)
    assert response.status_code == (200 if path == "/livez" else 503)
    case.validate_response(response, checks=CONFORMS, transport_kwargs={"app": app})


@pytest.mark.parametrize("operation", OPERATIONS, ids=lambda op: op.operation_id)
def test_the_outage_answer_is_documented(operation):
    """Every operation of an emulator whose database is away: 503, ``Retry-After``, an ``ErrorBody``."""
    app = make_emulator(UNREACHABLE)
    case = SCHEMA[operation.path][operation.method.upper()].Case(body={}, media_type="application/json")
    response = case.call(app=SigningWrapper(app.wsgi_app, "any-key"))
    assert response.status_code == 503
    assert response.headers["retry-after"] == ["5"]
    case.validate_response(response, checks=CONFORMS, transport_kwargs={"app": app})
