"""The emulator's OpenAPI 3.1 document, built from the wire models.

Every v2 and v1 operation, its security, and every status the emulator can answer; and the health probes
(``GET /livez``, ``GET /readyz``). The request bodies use
the models' *validation* schemas, the answers their *serialization* schemas, so the document describes
exactly what the emulator parses and writes. ``docs/openapi.json`` is this document, committed::

    python -m flask_gateway.emulator.openapi > docs/openapi.json

A test checks that the committed file is up to date, and schemathesis checks the emulator against it.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from flask_gateway._version import __version__
from flask_gateway.core.auth import ACCOUNT_HEADER, SIGNATURE_HEADER
from flask_gateway.core.wire import (
    OPERATOR,
    CancelCheckoutRequest,
    CheckoutResponse,
    CheckoutStatusPayload,
    CreateCheckoutRequest,
    ErrorBody,
    GetStatusRequest,
    InstallRequest,
    InstallResponse,
    RefundRequest,
    RefundResponse,
    SettingsResponse,
    SettingsUpdateRequest,
    UpdateCheckoutRequest,
    V1CheckoutRequest,
    V1CheckoutResponse,
    V1ConfigurationRequest,
    V1ConfigurationResponse,
    V1RefundRefused,
    V1RefundRequest,
    V1RefundSucceeded,
    WireNamedModel,
    WireNames,
    status_payload_keys,
)
from flask_gateway.core.wire.names import accepted
from flask_gateway.emulator.api import MAX_BODY_BYTES
from flask_gateway.emulator.idempotency import REPLAY_HEADER
from flask_gateway.emulator.views.health import Liveness, Readiness

__all__ = ["OPERATIONS", "Operation", "build_document", "main", "render"]

OPENAPI_VERSION: Final = "3.1.0"
SCHEMA_REF: Final = "#/components/schemas/{model}"


# --- operations ------------------------------------------------------------------------------------

Security = Literal["v2", "v1", "none"]


@dataclass(frozen=True)
class Operation:
    """One API operation and every answer the emulator can give it (status -> why)."""

    method: str
    path: str
    operation_id: str
    #: The fault-injection name (``POST /_emulator/faults {"operation": ...}``).
    fault_name: str
    tag: str
    summary: str
    description: str
    request: type[BaseModel]
    response: type[BaseModel]
    security: Security
    errors: Mapping[int, str]
    request_required: bool = True
    idempotent: bool = False
    #: Error statuses a replay of a stored answer can carry (with ``idempotent-replay: true``).
    replayable: tuple[int, ...] = ()
    #: Statuses answered with another body than ``ErrorBody`` (v1 refund refusals).
    error_bodies: Mapping[int, tuple[type[BaseModel], ...]] = field(default_factory=dict)


_BAD_REQUEST: Final = (
    "Malformed JSON, not a JSON object, or missing or invalid fields: `errors` names each field "
    "with its path, such as `orderItems[0].priceCents` inside the order details."
)
_V2_UNAUTHORIZED: Final = (
    f"Missing or invalid `{ACCOUNT_HEADER}` / `{SIGNATURE_HEADER}` combination, or the account is not "
    "installed. In the sandbox (`EMULATOR_SANDBOX=1`) the body carries `expectedSignature`."
)
_V1_UNAUTHORIZED: Final = (
    "Missing or wrong HTTP Basic credentials (`merchantAccountId:apiKey`), "
    "with a `WWW-Authenticate` challenge."
)
_TOO_LARGE: Final = f"The body is larger than {MAX_BODY_BYTES // 1024} KiB."
_FIREWALL: Final = (
    "Refused by the web application firewall (`EMULATOR_WAF=strict`): a redirect URL on `localhost`, "
    '`*.localhost` or an IP literal. Body `{"message": "Forbidden"}`.'
)
_NOT_FOUND: Final = "No checkout with this `checkoutToken` for this merchant account."
_IN_FLIGHT: Final = "A request with the same `requestId` is still in flight: retry shortly."
_KEY_REUSED: Final = "The `requestId` was already used with a different body: use a new `requestId`."
_LIMITS: Final = "the total is outside the account's minimum and maximum checkout amounts"

_V2_CHECKOUTS: Final = "v2 checkouts"
_V2_INSTALL: Final = "v2 installation"
_V1: Final = "v1"

OPERATIONS: Final[tuple[Operation, ...]] = (
    Operation(
        method="post",
        path="/v2/create",
        operation_id="createCheckout",
        fault_name="create",
        tag=_V2_CHECKOUTS,
        summary="Create a checkout",
        description=(
            "Creates a `PENDING_ORDER` checkout and answers its `paymentUrl` and `checkoutToken`. "
            "Idempotent by `requestId` (kept 24 hours): a replay answers the stored status and body with "
            "`idempotent-replay: true`."
        ),
        request=CreateCheckoutRequest,
        response=CheckoutResponse,
        security="v2",
        idempotent=True,
        replayable=(400,),
        errors={
            400: f"{_BAD_REQUEST} Also when {_LIMITS}.",
            401: _V2_UNAUTHORIZED,
            403: _FIREWALL,
            409: _IN_FLIGHT,
            413: _TOO_LARGE,
            422: _KEY_REUSED,
        },
    ),
    Operation(
        method="post",
        path="/v2/update",
        operation_id="updateCheckout",
        fault_name="update",
        tag=_V2_CHECKOUTS,
        summary="Update an open checkout",
        description=(
            "Replaces the order of a `PENDING_ORDER` or `CANCELLED_BY_CONSUMER` checkout (the latter "
            "reopens) and gives a new payment window: the order details' `expiresAt` when given, else one "
            "hour."
        ),
        request=UpdateCheckoutRequest,
        response=CheckoutResponse,
        security="v2",
        errors={
            400: f"{_BAD_REQUEST} Also when {_LIMITS}, or the order details' `expiresAt` is in the past.",
            401: _V2_UNAUTHORIZED,
            403: f"The checkout has expired: create a new one. Or: {_FIREWALL}",
            404: _NOT_FOUND,
            409: "The checkout's status does not allow an update.",
            413: _TOO_LARGE,
        },
    ),
    Operation(
        method="post",
        path="/v2/cancel",
        operation_id="cancelCheckout",
        fault_name="cancel",
        tag=_V2_CHECKOUTS,
        summary="Cancel a checkout",
        description=(
            "`PENDING_ORDER` or `CANCELLED_BY_CONSUMER` becomes `CANCELLED_BY_MERCHANT`. The answer carries "
            "a reduced echo of the order details and `cancelledAt`."
        ),
        request=CancelCheckoutRequest,
        response=CheckoutResponse,
        security="v2",
        errors={
            400: _BAD_REQUEST,
            401: _V2_UNAUTHORIZED,
            404: _NOT_FOUND,
            409: "The checkout's status does not allow a cancellation.",
            413: _TOO_LARGE,
        },
    ),
    Operation(
        method="post",
        path="/v2/getstatus",
        operation_id="getCheckoutStatus",
        fault_name="getstatus",
        tag=_V2_CHECKOUTS,
        summary="Get a checkout's status",
        description="The status payload: exactly 16 keys, `null` when unset; the same body as the callback.",
        request=GetStatusRequest,
        response=CheckoutStatusPayload,
        security="v2",
        errors={
            400: _BAD_REQUEST,
            401: _V2_UNAUTHORIZED,
            404: _NOT_FOUND,
            413: _TOO_LARGE,
        },
    ),
    Operation(
        method="post",
        path="/v2/refund",
        operation_id="refundCheckout",
        fault_name="refund",
        tag=_V2_CHECKOUTS,
        summary="Refund a paid checkout",
        description=(
            "Synchronous. `PARTIALLY_REFUNDED` while the refunds total less than `checkoutTotalCents`, "
            "`FULLY_REFUNDED` when they reach it. Idempotent by `requestId` like create; the answer echoes "
            "the request's `requestId` (none when the request had none)."
        ),
        request=RefundRequest,
        response=RefundResponse,
        security="v2",
        idempotent=True,
        replayable=(404, 409),
        errors={
            400: _BAD_REQUEST,
            401: _V2_UNAUTHORIZED,
            404: _NOT_FOUND,
            409: (
                "The checkout's status does not allow a refund, the amount exceeds what remains refundable, "
                f"or: {_IN_FLIGHT}"
            ),
            413: _TOO_LARGE,
            422: _KEY_REUSED,
        },
    ),
    Operation(
        method="post",
        path="/install/v2",
        operation_id="installGateway",
        fault_name="install",
        tag=_V2_INSTALL,
        summary="Install the gateway (once per account)",
        description=(
            "Registers the merchant's settings and answers the `secretSigningKey` that signs every later "
            "request and callback. Needs no signature: the body carries the account id and API key."
        ),
        request=InstallRequest,
        response=InstallResponse,
        security="none",
        errors={
            400: _BAD_REQUEST,
            401: "Unknown `merchantAccountId` or wrong `merchantAccountApiKey`.",
            403: "This account is already installed (installation succeeds once per account).",
            413: _TOO_LARGE,
        },
    ),
    Operation(
        method="patch",
        path="/install/v2",
        operation_id="updateGatewaySettings",
        fault_name="settings",
        tag=_V2_INSTALL,
        summary="Update the gateway settings",
        description=(
            "Any non-empty subset of the four settings; absent ones keep their value. Answers all four "
            "and the `signingKey`."
        ),
        request=SettingsUpdateRequest,
        response=SettingsResponse,
        security="v2",
        errors={
            400: f"{_BAD_REQUEST} Also when the minimum would be above the maximum.",
            401: _V2_UNAUTHORIZED,
            413: _TOO_LARGE,
        },
    ),
    Operation(
        method="post",
        path="/api/v1/merchant/configuration",
        operation_id="v1Configuration",
        fault_name="v1_configuration",
        tag=_V1,
        summary="v1 configuration: limits and payment plan",
        description=(
            "Empty body or `customer`: `minimum_amount` and `maximum_amount`; `amount`: the `payment_plan` "
            "(three instalments); both: all three. A body of whitespace only counts as empty."
        ),
        request=V1ConfigurationRequest,
        response=V1ConfigurationResponse,
        security="v1",
        request_required=False,
        errors={
            400: _BAD_REQUEST,
            401: _V1_UNAUTHORIZED,
            413: _TOO_LARGE,
        },
    ),
    Operation(
        method="post",
        path="/api/v1/merchant/checkout",
        operation_id="v1Checkout",
        fault_name="v1_checkout",
        tag=_V1,
        summary="v1 checkout",
        description=(
            "Creates a v1 order and answers where to send the consumer (`redirect_to`). The outcome reaches "
            "the merchant's success or fail URL (GET with `token`, `status`, `reason`)."
        ),
        request=V1CheckoutRequest,
        response=V1CheckoutResponse,
        security="v1",
        errors={
            400: f"{_BAD_REQUEST} Also when {_LIMITS}, or `order.expires_at` is in the past.",
            401: _V1_UNAUTHORIZED,
            403: _FIREWALL,
            413: _TOO_LARGE,
        },
    ),
    Operation(
        method="post",
        path="/api/v1/merchant/refund",
        operation_id="v1Refund",
        fault_name="v1_refund",
        tag=_V1,
        summary="v1 refund",
        description="A full or partial refund of a paid v1 order.",
        request=V1RefundRequest,
        response=V1RefundSucceeded,
        security="v1",
        errors={
            400: (
                "A refund the gateway refused (unknown order, wrong state, amount above what remains): "
                '`{"status": "FAILED", "reason": {"errors": {"code": 400, "message": ...}}}`. '
                f"Or: {_BAD_REQUEST}"
            ),
            401: _V1_UNAUTHORIZED,
            413: _TOO_LARGE,
        },
        error_bodies={400: (V1RefundRefused, ErrorBody)},
    ),
)

#: Statuses only an injected fault produces (``POST /_emulator/faults {"kind": "status"}``).
FAULT_STATUSES: Final = {
    "429": "Injected fault (`status`): too many requests, with `Retry-After` when the rule sets it.",
    "5XX": (
        "Injected fault (`status`): a server error, with `Retry-After` when the rule sets it. Also 503 with "
        "`Retry-After` while the emulator's database is unreachable: retry after that many seconds."
    ),
}


# --- building the document -------------------------------------------------------------------------


def _models() -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    """Every model the document refers to, once each, with its mode (requests: validation)."""
    seen: dict[tuple[type[BaseModel], JsonSchemaMode], None] = {}
    for op in OPERATIONS:
        seen[(op.request, "validation")] = None
        seen[(op.response, "serialization")] = None
        for bodies in op.error_bodies.values():
            for model in bodies:
                seen[(model, "serialization")] = None
    seen[(ErrorBody, "serialization")] = None
    seen[(Liveness, "serialization")] = None
    seen[(Readiness, "serialization")] = None
    return list(seen)


def _strip_titles(schema: Any) -> Any:
    """Drop pydantic's generated ``title`` of each property (``Merchantaccountid``): noise for readers."""
    if isinstance(schema, dict):
        properties = schema.get("properties")
        cleaned = {key: _strip_titles(value) for key, value in schema.items()}
        if isinstance(properties, dict):
            cleaned["properties"] = {
                name: {k: v for k, v in _strip_titles(prop).items() if k != "title"}
                if isinstance(prop, dict)
                else prop
                for name, prop in properties.items()
            }
        return cleaned
    if isinstance(schema, list):
        return [_strip_titles(item) for item in schema]
    return schema


def _component(ref: str) -> str:
    return ref.rsplit("/", 1)[-1]


def _reachable(roots: Iterable[str], schemas: Mapping[str, Any]) -> set[str]:
    """The component names ``roots`` refer to, directly or through other components."""
    found: set[str] = set()
    pending = [_component(ref) for ref in roots]
    while pending:
        name = pending.pop()
        if name in found or name not in schemas:
            continue
        found.add(name)
        text = json.dumps(schemas[name])
        pending.extend(_component(ref) for ref in _REF.findall(text))
    return found


_REF: Final = re.compile(r'"\$ref": "([^"]+)"')


def _respell(schema: dict[str, Any], model: type[WireNamedModel], names: WireNames) -> None:
    """Name the model's operator-named fields as ``names`` spells them (pydantic writes the attribute in
    an answer's schema and the first accepted spelling in a request's)."""
    for attribute, role in model.renamed.items():
        spelled = names.name(role)
        written = {attribute, *(str(choice) for choice in accepted(role).choices)}
        properties = schema.get("properties", {})
        schema["properties"] = {
            (spelled if key in written else key): value for key, value in properties.items()
        }
        if "required" in schema:
            schema["required"] = [spelled if key in written else key for key in schema["required"]]


def _tighten(schemas: dict[str, Any], refs: Mapping[type[BaseModel], str], names: WireNames) -> None:
    """Say what the models' validators check but their generated schemas cannot show by themselves.

    - The status payload always carries its 16 keys (``null`` when unset): all required.
    - A settings update names at least one of the four settings.
    - v1 items: the documented object keyed "1", "2", ... or an array (real clients send both).
    - A secret in an answer is not ``writeOnly`` (that marks the API key of a request): the key comes back.
    """
    status = schemas[_component(refs[CheckoutStatusPayload])]
    status["required"] = list(status_payload_keys(names))
    settings = schemas[_component(refs[SettingsUpdateRequest])]
    settings["anyOf"] = [{"required": [name]} for name in settings["properties"]]
    order = schemas["V1Order"]["properties"]
    item = order["items"]["additionalProperties"]
    order["items"] = {
        "oneOf": [
            {"type": "object", "additionalProperties": item, "maxProperties": 500},
            {"type": "array", "items": item, "maxItems": 500},
        ]
    }
    requests = _reachable((refs[op.request] for op in OPERATIONS), schemas)
    for name in _reachable(refs.values(), schemas) - requests:
        for prop in schemas[name].get("properties", {}).values():
            prop.pop("writeOnly", None)


def _json_body(schema: Mapping[str, Any]) -> dict[str, Any]:
    return {"application/json": {"schema": dict(schema)}}


def _header(description: str, schema: Mapping[str, Any], *, required: bool = False) -> dict[str, Any]:
    header: dict[str, Any] = {"description": description, "schema": dict(schema)}
    if required:
        header["required"] = True
    return header


_REPLAY_HEADER_DOC: Final = _header(
    "`true` when this is the stored answer of an earlier request with the same `requestId`.",
    {"type": "string", "enum": ["true"]},
)
_RETRY_AFTER_DOC: Final = _header(
    "Seconds to wait before retrying (when the injected fault sets it; always on the 503 of an unreachable "
    "database).",
    {"type": "integer", "minimum": 0},
)
_CHALLENGE_DOC: Final = _header("The HTTP Basic challenge.", {"type": "string"}, required=True)


def _error_schema(op: Operation, status: int, refs: Mapping[type[BaseModel], str]) -> dict[str, Any]:
    bodies = op.error_bodies.get(status)
    if not bodies:
        return {"$ref": refs[ErrorBody]}
    return {"anyOf": [{"$ref": refs[model]} for model in bodies]}


def _responses(op: Operation, refs: Mapping[type[BaseModel], str]) -> dict[str, Any]:
    ok: dict[str, Any] = {"description": "OK.", "content": _json_body({"$ref": refs[op.response]})}
    if op.idempotent:
        ok["headers"] = {REPLAY_HEADER: _REPLAY_HEADER_DOC}
    responses: dict[str, Any] = {"200": ok}
    for status, why in sorted(op.errors.items()):
        answer: dict[str, Any] = {"description": why, "content": _json_body(_error_schema(op, status, refs))}
        if status in op.replayable:
            answer["headers"] = {REPLAY_HEADER: _REPLAY_HEADER_DOC}
        if status == 401 and op.security == "v1":
            answer["headers"] = {"WWW-Authenticate": _CHALLENGE_DOC}
        responses[str(status)] = answer
    for status_range, why in FAULT_STATUSES.items():
        responses[status_range] = {
            "description": why,
            "headers": {"Retry-After": _RETRY_AFTER_DOC},
            "content": _json_body({"$ref": refs[ErrorBody]}),
        }
    return responses


_SECURITY: Final[Mapping[Security, list[dict[str, list[str]]]]] = {
    "v2": [{"merchantAccountId": [], "signature": []}],
    "v1": [{"merchantBasic": []}],
    "none": [],
}


def _operation(op: Operation, refs: Mapping[type[BaseModel], str]) -> dict[str, Any]:
    return {
        "operationId": op.operation_id,
        "tags": [op.tag],
        "summary": op.summary,
        "description": op.description + f" Fault-injection name: `{op.fault_name}`.",
        "security": _SECURITY[op.security],
        "requestBody": {"required": op.request_required, "content": _json_body({"$ref": refs[op.request]})},
        "responses": _responses(op, refs),
    }


def _paths(operations: Iterable[Operation], refs: Mapping[type[BaseModel], str]) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for op in operations:
        paths.setdefault(op.path, {})[op.method] = _operation(op, refs)
    return {**paths, **_health_paths(refs)}


_HEALTH: Final = "health"
_NO_STORE_DOC: Final = _header(
    "Probes are never cached.", {"type": "string", "const": "no-store"}, required=True
)


def _health_paths(refs: Mapping[type[BaseModel], str]) -> dict[str, Any]:
    """The probes (``emulator/views/health.py``): open, no body, never an injected fault."""
    ready_body = _json_body({"$ref": refs[Readiness]})
    return {
        "/livez": {
            "get": {
                "operationId": "livez",
                "tags": [_HEALTH],
                "summary": "Liveness: the process answers",
                "description": "Touches no database: 200 while the process serves requests, whatever the "
                "database does.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "Alive.",
                        "headers": {"Cache-Control": _NO_STORE_DOC},
                        "content": _json_body({"$ref": refs[Liveness]}),
                    }
                },
            }
        },
        "/readyz": {
            "get": {
                "operationId": "readyz",
                "tags": [_HEALTH],
                "summary": "Readiness: database reachable, schema present, accounts seeded",
                "description": "The named checks `database`, `schema` and `accounts`. The first probe of a "
                "fresh emulator creates its tables and seeds its accounts, as its first request would.",
                "security": [],
                "responses": {
                    "200": {
                        "description": "Every check passes (`failing` is empty).",
                        "headers": {"Cache-Control": _NO_STORE_DOC},
                        "content": ready_body,
                    },
                    "503": {
                        "description": "Some check fails: `failing` names them, `message` says so.",
                        "headers": {
                            "Cache-Control": _NO_STORE_DOC,
                            "Retry-After": {**_RETRY_AFTER_DOC, "required": True},
                        },
                        "content": ready_body,
                    },
                },
            }
        },
    }


_DESCRIPTION: Final = """\
The gateway emulator's API: the v2 checkout gateway and the v1 merchant endpoints, as the emulator
implements them (docs/emulator.md, docs/decisions.md). With the emulator at R: `{base_url}` = R,
`{install_url}` = R/install, `{v1_base_url}` = R.

v2 requests are signed: `X-Signature` is base64(HMAC-SHA256(secretSigningKey, body without whitespace)),
with `X-Merchant-Account-ID`. v1 requests use HTTP Basic `merchantAccountId:apiKey`.

Integers are JSON integers: amounts are whole cents, and `100.0` is refused like `"100"`.
Every error is a JSON object with a `message` (400s add `errors`, sandbox 401s `expectedSignature`).
Statuses 429 and 5XX are only produced by fault injection (`POST /_emulator/faults`), except a 503 with
`Retry-After` while the emulator's database is unreachable.
"""


def build_document(names: WireNames = OPERATOR) -> dict[str, Any]:
    """The OpenAPI 3.1 document (a fresh dict each call), the operator-named fields spelled by ``names``."""
    key_map, definitions = models_json_schema(_models(), ref_template=SCHEMA_REF, by_alias=True)
    schemas = {name: _strip_titles(schema) for name, schema in sorted(definitions.get("$defs", {}).items())}
    refs: dict[type[BaseModel], str] = {}
    for (model, _mode), schema in key_map.items():
        if isinstance(model, type) and issubclass(model, BaseModel):
            refs[model] = str(schema["$ref"])
            if issubclass(model, WireNamedModel):
                _respell(schemas[_component(refs[model])], model, names)  # this mode's component
    _tighten(schemas, refs, names)
    return {
        "openapi": OPENAPI_VERSION,
        "jsonSchemaDialect": "https://spec.openapis.org/oas/3.1/dialect/base",
        "info": {
            "title": "Gateway emulator API",
            "version": __version__,
            "description": _DESCRIPTION,
            "license": {"name": "MIT", "identifier": "MIT"},
        },
        "servers": [{"url": "/", "description": "The emulator's root (R)."}],
        "tags": [
            {"name": _V2_CHECKOUTS, "description": "Signed v2 checkout operations."},
            {"name": _V2_INSTALL, "description": "Installation (unsigned) and settings (signed)."},
            {"name": _V1, "description": "The older v1 merchant endpoints (HTTP Basic, answers in `data`)."},
            {"name": _HEALTH, "description": "Probes for process managers and load balancers (open)."},
        ],
        "paths": _paths(OPERATIONS, refs),
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "merchantAccountId": {
                    "type": "apiKey",
                    "in": "header",
                    "name": ACCOUNT_HEADER,
                    "description": "The merchant account id; goes with `X-Signature`.",
                },
                "signature": {
                    "type": "apiKey",
                    "in": "header",
                    "name": SIGNATURE_HEADER,
                    "description": (
                        "base64(HMAC-SHA256(secretSigningKey, body with every JavaScript `\\s` character "
                        "removed))."
                    ),
                },
                "merchantBasic": {
                    "type": "http",
                    "scheme": "basic",
                    "description": "v1: `merchantAccountId:apiKey`.",
                },
            },
        },
    }


def render(document: Mapping[str, Any] | None = None) -> str:
    """The document as the committed ``docs/openapi.json`` text (indented, ASCII, trailing newline)."""
    return json.dumps(build_document() if document is None else document, indent=2, ensure_ascii=True) + "\n"


def main() -> int:
    sys.stdout.write(render())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
