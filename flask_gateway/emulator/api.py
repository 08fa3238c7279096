"""Request plumbing shared by the emulator's JSON routes: body parsing, authentication, answers."""

from __future__ import annotations

import base64
import binascii
import hmac
import json
from collections.abc import Iterable, Mapping
from typing import Any, Final, TypeVar

from flask import Flask, Response, current_app, g, request
from pydantic import ValidationError
from werkzeug.exceptions import HTTPException, RequestEntityTooLarge

from flask_gateway.core.auth import ACCOUNT_HEADER, SIGNATURE_HEADER
from flask_gateway.core.outages import is_database_outage
from flask_gateway.core.signing import sign, verify
from flask_gateway.core.wire import WireModel, dumps
from flask_gateway.emulator import clock
from flask_gateway.emulator.database import outage_response
from flask_gateway.emulator.models import Account, db
from flask_gateway.emulator.problems import ApiProblem, ResponseDropped, field_path, validation_problem
from flask_gateway.emulator.settings import EmulatorSettings

__all__ = [
    "authenticate_v1",
    "authenticate_v2",
    "base_url",
    "json_response",
    "parse",
    "raw_body",
    "read_json",
    "refuse_malformed_json",
    "refuse_oversize",
    "register_error_handlers",
    "settings",
]

WireModelT = TypeVar("WireModelT", bound=WireModel)

#: Bodies over this size answer 413 (DESIGN: 64 KiB).
MAX_BODY_BYTES = 64 * 1024


def settings() -> EmulatorSettings:
    value: EmulatorSettings = current_app.extensions["gateway_emulator"]
    return value


def base_url() -> str:
    """Where consumers reach this emulator (for ``paymentUrl`` and ``redirect_to``)."""
    return settings().public_url or request.url_root.rstrip("/")


def raw_body() -> bytes:
    """The exact bytes received (signatures are checked on these, never on re-serialised JSON)."""
    return request.get_data(cache=True)


def read_json() -> dict[str, Any]:
    """The body as a JSON object; 400 for anything else (empty, malformed, an array, bad UTF-8)."""
    raw = raw_body()
    if not raw.strip():
        raise ApiProblem(400, "The request body is empty: send a JSON object.")
    data = _parsed(raw)
    if not isinstance(data, dict):
        raise ApiProblem(400, "The request body must be a JSON object.")
    nul = _nul_at(data)
    if nul is not None:
        # PostgreSQL text cannot hold U+0000 (a 500 there); refuse it on every backend alike.
        raise ApiProblem(
            400,
            "Text must not contain the NUL character (\\u0000).",
            errors=[{"field": field_path(nul), "message": "must not contain \\u0000"}],
        )
    return data


def refuse_oversize() -> None:
    """413 for a body over ``MAX_CONTENT_LENGTH`` before anything else runs (the CSRF check, the
    credentials), also on routes that never read their body (``/_emulator/reset``, the hosted forms)."""
    limit = request.max_content_length
    if limit is not None and request.content_length is not None and request.content_length > limit:
        raise RequestEntityTooLarge()


def refuse_malformed_json() -> None:
    """400 for a non-empty body that claims to be JSON and is not, on every JSON API route: also where
    the route takes no body (``pay``, ``deliver``...), so junk is never acted on as if it were fine."""
    mimetype = request.mimetype
    if mimetype != "application/json" and not mimetype.endswith("+json"):
        return
    raw = raw_body()
    if not raw.strip():
        return
    _parsed(raw)


def _parsed(raw: bytes) -> Any:
    """``raw`` parsed (``_loads``), once per request: the route reads the body the check parsed."""
    cached = g.get("_emulator_json")
    if cached is not None and cached[0] is raw:
        return cached[1]
    data = _loads(raw)
    g._emulator_json = (raw, data)
    return data


#: No request of the API nests deeper than a few levels; deeper JSON is refused before it is parsed (the
#: parser, and every walk over its result, would otherwise run out of stack: a 500).
MAX_JSON_DEPTH: Final = 32


def _depth_over(raw: bytes, limit: int) -> bool:
    """Whether ``raw`` opens more than ``limit`` arrays/objects at once (brackets inside strings ignored)."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False  # cannot nest deeper than it opens (the usual body: no walk over its bytes)
    depth = 0
    in_string = escaped = False
    for byte in raw:
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:  # quote
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth > limit:
                return True
        elif byte in (0x5D, 0x7D):  # ] }
            depth -= 1
    return False


def _loads(raw: bytes) -> Any:
    if _depth_over(raw, MAX_JSON_DEPTH):
        raise ApiProblem(400, f"The request body nests JSON deeper than {MAX_JSON_DEPTH} levels.")
    try:
        return json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ApiProblem(400, f"The request body is not valid JSON: {exc}.") from None


def _nul_at(value: object, location: tuple[int | str, ...] = ()) -> tuple[int | str, ...] | None:
    """Where the first U+0000 is in a parsed JSON value (in a key or a string), or None."""
    if isinstance(value, str):
        return location if "\x00" in value else None
    items: Iterable[tuple[int | str, object]]
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, item in items:
        if isinstance(key, str) and "\x00" in key:
            return (*location, key)
        found = _nul_at(item, (*location, key))
        if found is not None:
            return found
    return None


def parse(model: type[WireModelT], data: Mapping[str, Any]) -> WireModelT:
    """Validate ``data`` against ``model`` (its JSON names, in either wire-name set); 400 naming each
    invalid field, a missing one as this emulator's wire names spell it."""
    try:
        return model.from_wire(data)
    except ValidationError as exc:
        raise validation_problem(exc, settings().wire_names) from None


def json_response(
    body: WireModel | Mapping[str, Any], status: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    payload = body.to_json(settings().wire_names) if isinstance(body, WireModel) else dumps(body)
    return Response(payload, status=status, headers=dict(headers or {}), mimetype="application/json")


def _unauthorized(message: str, account: Account | None) -> ApiProblem:
    extra: dict[str, Any] = {}
    if settings().sandbox and account is not None and account.signing_key:
        extra["expectedSignature"] = sign(raw_body(), account.signing_key)
    return ApiProblem(401, message, extra=extra)


def authenticate_v2() -> Account:
    """The installed account that signed the request; 401 otherwise (sandbox: with the expected signature)."""
    account_id = request.headers.get(ACCOUNT_HEADER, "")
    signature = request.headers.get(SIGNATURE_HEADER, "")
    # U+0000 cannot name an account (and PostgreSQL refuses it in a query: a 500).
    known = account_id and "\x00" not in account_id
    account = (clock.request_account(account_id) or db.session.get(Account, account_id)) if known else None
    if account is None:
        raise ApiProblem(401, f"Missing or unknown {ACCOUNT_HEADER}.")
    if not account.installed or not account.signing_key:
        raise ApiProblem(401, "This merchant account is not installed: call the installation first.")
    if not signature:
        raise _unauthorized(f"Missing {SIGNATURE_HEADER}.", account)
    if not verify(raw_body(), account.signing_key, signature):
        raise _unauthorized(f"Invalid {ACCOUNT_HEADER} / {SIGNATURE_HEADER} combination.", account)
    return account


def authenticate_v1() -> Account:
    """HTTP Basic ``merchantAccountId:apiKey``; 401 with a ``WWW-Authenticate`` challenge otherwise."""
    challenge = {"WWW-Authenticate": 'Basic realm="gateway v1"'}
    header = request.headers.get("Authorization", "")
    scheme, _, encoded = header.partition(" ")
    if scheme.lower() != "basic" or not encoded:
        raise ApiProblem(
            401, "v1 endpoints need HTTP Basic authentication (merchantAccountId:apiKey).", headers=challenge
        )
    try:
        account_id, sep, api_key = (
            base64.b64decode(encoded.strip(), validate=True).decode("utf-8").partition(":")
        )
    except (binascii.Error, UnicodeDecodeError):
        raise ApiProblem(401, "Malformed HTTP Basic credentials.", headers=challenge) from None
    # U+0000 cannot name an account (and PostgreSQL refuses it in a query: a 500).
    known = sep and account_id and "\x00" not in account_id
    account = db.session.get(Account, account_id) if known else None
    if account is None or not hmac.compare_digest(account.api_key.encode(), api_key.encode()):
        raise ApiProblem(401, "Unknown merchant account or wrong API key.", headers=challenge)
    return account


def register_error_handlers(app: Flask) -> None:
    """JSON answers for API problems and HTTP errors on API paths; HTML pages keep Flask's pages. A
    database outage is a 503 with ``Retry-After`` (``emulator/database.py``), any other error a 500."""

    @app.errorhandler(ApiProblem)
    def _problem(problem: ApiProblem) -> Response:
        return json_response(problem.body(), problem.status, problem.headers)

    @app.errorhandler(HTTPException)
    def _http(error: HTTPException) -> Response | HTTPException:
        if _wants_html():
            return error
        message = {
            413: f"The request body is larger than {MAX_BODY_BYTES // 1024} KiB.",
            404: "Not found.",
            405: "Method not allowed.",
        }.get(error.code or 500, error.description or error.name)
        # Keep the error's own headers (405: ``Allow``), not its HTML content type.
        headers = {name: value for name, value in error.get_headers() if name.lower() != "content-type"}
        return json_response({"message": message}, error.code or 500, headers)

    @app.errorhandler(Exception)
    def _unexpected(error: Exception) -> Response:
        if isinstance(error, ResponseDropped):
            raise error
        if is_database_outage(error):
            # The database is away (or dropped this request's connection): 503 with Retry-After, one log
            # line per outage (the app's watch), no traceback per request.
            return outage_response(error, html=_wants_html())
        current_app.logger.exception("unexpected error in the emulator")
        if _wants_html():
            return Response(
                "<!doctype html><title>Error</title><h1>Something went wrong</h1>"
                "<p>The gateway emulator failed unexpectedly; its log has the details.</p>",
                status=500,
                mimetype="text/html",
            )
        return json_response({"message": "The emulator failed unexpectedly; see its log."}, 500)


def _wants_html() -> bool:
    """Hosted payment pages and the dashboard are HTML; everything else answers JSON."""
    path = request.path
    return path in ("/", "/_emulator/") or path.startswith(HTML_PREFIXES)


#: Path prefixes that serve HTML pages.
HTML_PREFIXES = ("/api/v2/app/", "/api/v1/app/", "/_emulator/dashboard")
