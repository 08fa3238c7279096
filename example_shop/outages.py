"""The shop while its database is away: "We'll be right back" (503 with ``Retry-After``), never a 500.

A database restart or failover makes every request that needs the database fail for a few seconds. The
shop answers those requests with the extension's outage interface (``flask_gateway.operations.outages``):

- a page for people: ``shop/unavailable.html`` in the shop's own look, 503 with ``Retry-After``;
- JSON for the JSON endpoints (the order page's ``status.json``, or a client that asks for JSON):
  ``{"message": ...}``, 503 with ``Retry-After`` (the order page's script simply polls again);
- one WARNING when the outage starts and one when it ends (the extension's watch counts the requests
  refused meanwhile and notices the recovery at the end of the first request after it), no traceback per
  request.

Missing tables (the shop started before ``flask --app example_shop shop init-db``, or a migration not run)
are answered the same way, 503 with one WARNING per spell, the page and the log naming the command. Other
errors (a constraint, a bug) are raised again: a 500 with its traceback. The extension's own endpoints
(``/gateway/...``) answer outages and missing tables themselves.
"""

from __future__ import annotations

from typing import Final

from flask import Flask, g, jsonify, render_template, request
from flask.typing import ResponseReturnValue

from flask_gateway import (
    DATABASE_ERRORS,
    SCHEMA_ERRORS,
    database_unavailable,
    is_database_outage,
    is_missing_schema,
    tables_missing,
)

__all__ = ["INIT_COMMAND", "MESSAGE", "database_away", "register"]

#: What a JSON client reads (the page says the same in more words).
MESSAGE: Final = "We'll be right back: the shop cannot reach its records for a moment. Try again shortly."
#: The command that creates the shop's tables and the gateway's, named where they are missing.
INIT_COMMAND: Final = "`flask --app example_shop shop init-db`"


def database_away() -> bool:
    """True while this request is being answered with the outage page: the page's template helpers must not
    ask the database (the owner's login check reads the session version from it)."""
    return bool(g.get("shop_database_away"))


def _wants_json() -> bool:
    if request.path.endswith(".json") or request.is_json:
        return True
    return request.accept_mimetypes.best_match(("text/html", "application/json")) == "application/json"


def _answer(error: Exception) -> ResponseReturnValue:
    missing = is_missing_schema(error)
    if not missing and not is_database_outage(error):
        raise error  # neither an outage nor missing tables: Flask's 500, with its traceback in the log
    # Counted; the first failure of a spell logs one line.
    problem = tables_missing(error, INIT_COMMAND) if missing else database_unavailable(error)
    headers = {"Retry-After": str(problem.retry_after), "Cache-Control": "no-store"}
    if _wants_json():
        return jsonify(message=problem.description if missing else MESSAGE), 503, headers
    g.shop_database_away = True
    page = render_template(
        "shop/unavailable.html", retry_after=problem.retry_after, missing=missing, command=INIT_COMMAND
    )
    return page, 503, headers


def register(app: Flask) -> None:
    """Answer database outages and missing tables on every shop page (the extension's blueprints handle
    their own first)."""
    for error_class in {*DATABASE_ERRORS, *SCHEMA_ERRORS}:
        app.register_error_handler(error_class, _answer)
