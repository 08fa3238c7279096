"""What every page of the extension shares: the security headers (CSP, no framing) and the 503 page or JSON
while the database is away. Used by the ``admin`` and ``public`` blueprints."""

from __future__ import annotations

from collections.abc import Callable
from typing import Final, TypeVar

from flask import Blueprint, render_template, request
from flask.typing import ResponseReturnValue
from werkzeug.wrappers import Response

from flask_gateway.core.framing import never_framed
from flask_gateway.operations.outages import (
    DATABASE_ERRORS,
    SCHEMA_ERRORS,
    database_unavailable,
    is_database_outage,
    is_missing_schema,
    tables_missing,
)

__all__ = ["POLICY", "answer_outages", "deny_framing"]

R = TypeVar("R", bound=Response)

#: The extension's own pages run no script at all, load everything from the app's origin, post forms
#: only there, and are never framed.
POLICY: Final = (
    "default-src 'self'; script-src 'none'; object-src 'none'; base-uri 'none'; form-action 'self'; "
    "frame-ancestors 'none'"
)


def deny_framing(response: R) -> R:
    """A script-restricting ``Content-Security-Policy`` (:data:`POLICY`), ``X-Frame-Options: DENY``.

    A policy the response already has (the app's) is kept, with ``frame-ancestors 'none'`` replacing any
    looser one and ``script-src 'self'`` added when it restricts scripts nowhere: no page of the extension
    is ever framed, nor runs a script from another origin or an inline one."""
    never_framed(response.headers, policy=POLICY)
    return response


def answer_outages(blueprint: Blueprint, *, pages: Callable[[], bool]) -> None:
    """Answer a database outage in ``blueprint`` (in its views, hooks or the app's hooks for its requests)
    with a 503 and ``Retry-After``, and missing tables the same way, naming the command that creates them;
    any other database error is raised again (a 500, with its traceback).

    ``pages()`` says whether the current request is a page for a person (the ``gateway/unavailable.html``
    page) rather than a caller that reads JSON (``{"message": ...}``: the gateway retries on a 503)."""

    def database_away(error: Exception) -> ResponseReturnValue:
        missing = is_missing_schema(error)
        if not missing and not is_database_outage(error):
            raise error
        unavailable = tables_missing(error) if missing else database_unavailable(error)
        if not pages():
            return unavailable.get_response()
        admin = request.blueprint is not None and request.blueprint.startswith("gateway_admin")
        body = render_template(
            "gateway/unavailable.html", retry_after=unavailable.retry_after, admin=admin, missing=missing
        )
        return body, 503, {"Retry-After": str(unavailable.retry_after), "Cache-Control": "no-store"}

    for error_class in {*DATABASE_ERRORS, *SCHEMA_ERRORS}:
        blueprint.register_error_handler(error_class, database_away)
