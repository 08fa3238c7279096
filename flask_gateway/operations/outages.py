"""The extension while the database is away: a 503 with ``Retry-After`` instead of a 500, one log line when
an outage starts and one when it ends, and the recovery noticed on the first request after it.

The rules (what counts as an outage, the two log lines) are the core's (:mod:`flask_gateway.core.outages`,
shared with the emulator); this module ties them to Flask. Each app has one
:class:`~flask_gateway.core.outages.OutageWatch` per process (``get_state().outages``).

An app answers its own pages during an outage with handlers like these (the example shop's, with its own
page for people)::

    from flask_gateway import DATABASE_ERRORS, database_unavailable, is_database_outage

    def database_away(error):
        if not is_database_outage(error):
            raise error  # a constraint, a missing table, a bug: still a 500 with its traceback
        unavailable = database_unavailable(error)  # counted; the first of an outage logs one WARNING
        headers = {"Retry-After": str(unavailable.retry_after)}
        return render_template("unavailable.html"), 503, headers

    for error_class in DATABASE_ERRORS:
        app.register_error_handler(error_class, database_away)

(``database_unavailable(error)`` is also a response on its own: ``{"message": ...}`` as JSON, for an API.)
The extension's own endpoints (the callback, the v1 URLs, the return pages, the admin screens) answer so
without the app's help.

**Recovery.** While the watch is down, every request of the app ends with a probe of the database (one
``SELECT 1``, at most once a second per process, :func:`probe_while_down`): the line "the database answers
again" is logged on the first request after the database returned, whatever that request did. While the
database is up the probe costs one attribute read.
"""

from __future__ import annotations

import logging
from typing import Final

from flask import Flask, current_app, has_app_context, request
from werkzeug.wrappers import Response

from flask_gateway.core.outages import (
    DATABASE_ERRORS,
    RETRY_AFTER_SECONDS,
    SCHEMA_ERRORS,
    OutageWatch,
    is_database_outage,
    is_missing_schema,
    ping,
)
from flask_gateway.errors import DatabaseUnavailable
from flask_gateway.state import EXTENSION_KEY, GatewayState, missing_tables_watch

__all__ = [
    "DATABASE_ERRORS",
    "RETRY_AFTER_SECONDS",
    "SCHEMA_ERRORS",
    "DatabaseUnavailable",
    "database_unavailable",
    "is_database_outage",
    "is_missing_schema",
    "probe_while_down",
    "tables_missing",
    "watch_recovery",
]

_log = logging.getLogger("flask_gateway.outages")

#: The watch of a process whose app has no Flask-Gateway registered (or no app context): the shop's
#: handler still answers 503 and logs once per outage.
_UNREGISTERED: Final = OutageWatch("flask_gateway", _log)
_UNREGISTERED_TABLES: Final = missing_tables_watch()


def _watch(app: Flask | None) -> OutageWatch:
    state = app.extensions.get(EXTENSION_KEY) if app is not None else None
    return state.outages if isinstance(state, GatewayState) else _UNREGISTERED


def _tables_watch() -> OutageWatch:
    state = current_app.extensions.get(EXTENSION_KEY) if has_app_context() else None
    return state.missing_tables if isinstance(state, GatewayState) else _UNREGISTERED_TABLES


def database_unavailable(error: BaseException) -> DatabaseUnavailable:
    """Record ``error`` (a database outage) in the current app's outage watch and return the 503 to
    raise or answer (``retry_after``; JSON ``{"message": ...}`` and ``Retry-After`` when answered as is).

    The first failure of an outage logs one WARNING with the driver's one-line reason (no traceback, no
    statement); the following ones are only counted. Call it for errors :func:`is_database_outage` accepts.
    """
    app = current_app._get_current_object() if has_app_context() else None  # type: ignore[attr-defined]
    _watch(app).failed(error)
    return DatabaseUnavailable(retry_after=RETRY_AFTER_SECONDS)


def tables_missing(
    error: BaseException, command: str = "`flask gateway init-db` or the migrations"
) -> DatabaseUnavailable:
    """Record ``error`` (a missing table or column, :func:`is_missing_schema`) in the current app's watch
    and return the 503 to raise or answer, naming ``command``, what creates the tables. The first failure
    of a spell logs one WARNING; the spell ends on the first request answered with a 2xx afterwards."""
    _tables_watch().failed(error)
    return DatabaseUnavailable(
        f"The shop's database has no tables for this yet: run {command}, then try again.",
        retry_after=RETRY_AFTER_SECONDS,
    )


def probe_while_down(app: Flask) -> bool:
    """While ``app``'s watch is down, ping its database (at most once a second); a ping that connects ends
    the outage and logs "the database answers again". True when the database is (now) up. Never raises:
    it runs at the end of requests already answered."""
    state = app.extensions.get(EXTENSION_KEY)
    if not isinstance(state, GatewayState) or not state.outages.down:  # the common case: one read
        return True
    return _probe(state)


def _probe(state: GatewayState) -> bool:
    try:
        return state.outages.probe(lambda: ping(state.engine))
    except Exception as error:  # not an outage, but not this request's business either
        _log.debug("the database probe failed: %r", error)
        return False


def watch_recovery(app: Flask, state: GatewayState) -> None:
    """After every request of ``app``, :func:`probe_while_down` while ``state``'s watch is down
    (``Gateway.init_app`` does this)."""

    def probe_after(response: Response) -> Response:
        if state.outages.down:  # else nothing: the cost of a request while the database is up
            _probe(state)
        if state.missing_tables.down and 200 <= response.status_code < 300 and request.endpoint != "static":
            state.missing_tables.succeeded()  # a request answered: the tables are there again
        return response

    app.after_request(probe_after)
