"""The emulator's database over a process's life: made ready on first use, watched through outages, probed.

- **Nothing at start.** ``create_app()`` and ``mount()`` open no connection: a worker process that boots
  while the database is away boots. The tables are created and the accounts of ``EMULATOR_ACCOUNTS`` seeded
  on first use (:meth:`DatabaseState.ensure`): once per app (so once per process), under a lock, before the
  first request that needs the database and before the delivery worker's first poll. While the database is
  away that step fails like any query (a 503) and runs again on the next request. ``flask --app
  flask_gateway.emulator init-db`` does the same step at once (:func:`prepare_database`).
- **Outages** (:func:`flask_gateway.core.outages.is_database_outage`): every JSON route answers 503
  ``{"message": ...}`` and the hosted pages and dashboard a plain 503 page, both with ``Retry-After``
  (:func:`outage_response`); one WARNING when an outage starts and one when it ends
  (:class:`~flask_gateway.core.outages.OutageWatch`, one per app), no traceback per request. While the watch
  says "down", each request that needs the database first makes one round trip (``SELECT 1``): the first
  one that gets through ends the outage and goes on.
- **Readiness** (:func:`readiness`): the named checks of ``GET /readyz``.
"""

from __future__ import annotations

import json
import logging
import threading
from dataclasses import dataclass
from typing import Final, Literal

from flask import Flask, Response, current_app
from sqlalchemy import func, inspect, select
from sqlalchemy.engine import Engine

from flask_gateway.core.outages import (
    DATABASE_ERRORS,
    RETRY_AFTER_SECONDS,
    OutageWatch,
    is_database_outage,
    ping,
)
from flask_gateway.core.sql import create_all_safely
from flask_gateway.emulator.accounts import seed_accounts
from flask_gateway.emulator.models import Account, ClockState, db
from flask_gateway.emulator.settings import EmulatorSettings

__all__ = [
    "DatabaseState",
    "ReadinessCheck",
    "database_state",
    "outage_response",
    "prepare_database",
    "readiness",
]

_log = logging.getLogger("flask_gateway.emulator")

#: ``app.extensions`` key of the app's :class:`DatabaseState`.
STATE_KEY: Final = "gateway_emulator_database"

_OUTAGE_MESSAGE: Final = (
    "The gateway emulator's database is unreachable right now: retry in a few seconds (see Retry-After)."
)
_OUTAGE_BODY: Final = json.dumps({"message": _OUTAGE_MESSAGE})
_OUTAGE_PAGE: Final = (
    "<!doctype html><title>Back shortly</title><h1>The gateway emulator will be right back</h1>"
    "<p>Its database is unreachable for a moment: try again in a few seconds.</p>"
)


class DatabaseState:
    """One emulator app's database: whether its tables and accounts are in place, and its outage watch."""

    def __init__(self, settings: EmulatorSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._prepared = False
        #: One per app: the requests and the delivery worker of a process report to the same watch.
        self.watch = OutageWatch("gateway emulator", _log)

    def ensure(self) -> None:
        """Make the database usable for the current app context, or raise what the driver raises.

        The common case costs nothing (two attribute reads). While the watch says "down": one ``SELECT 1``
        first, so a request that gets through ends the outage (one WARNING). The first call in the
        process creates the tables and seeds the accounts; if that fails it runs again on the next call.
        """
        if self.watch.down:
            ping(db.engine)
            self.watch.succeeded()
        if not self._prepared:
            self._prepare()

    def _prepare(self) -> None:
        # The threads of this process one at a time; several processes may do it at once
        # (``create_all_safely`` takes an advisory lock, ``seed_accounts`` takes a unique violation).
        with self._lock:
            if self._prepared:
                return
            create_all_safely(db.engine, db.metadata)
            seed_accounts(self._settings)
            self._prepared = True


def database_state(app: Flask | None = None) -> DatabaseState:
    """The :class:`DatabaseState` of ``app`` (default: the current app)."""
    target = app if app is not None else current_app
    state: DatabaseState = target.extensions[STATE_KEY]
    return state


def prepare_database(app: Flask) -> None:
    """Create the emulator's tables and seed its accounts now, unless this app did already (``flask ...
    init-db``; test kits that write rows before the first request). Raises the driver's error when the
    database is away."""
    with app.app_context():
        database_state(app).ensure()


def outage_response(error: BaseException, *, html: bool) -> Response:
    """The 503 of a request that met a database outage (counted by the app's watch: one log line)."""
    database_state().watch.failed(error)
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)}
    if html:
        return Response(_OUTAGE_PAGE, status=503, headers=headers, mimetype="text/html")
    return Response(_OUTAGE_BODY, status=503, headers=headers, mimetype="application/json")


@dataclass(frozen=True)
class ReadinessCheck:
    """One named check of ``GET /readyz``."""

    name: Literal["database", "schema", "accounts"]
    #: None: not run, because an earlier check failed.
    ok: bool | None
    #: What was found, in words (a table or account name; never a secret, nor the database's address).
    detail: str


def readiness(engine: Engine, settings: EmulatorSettings) -> list[ReadinessCheck]:
    """``database`` (a connection and a query), ``schema`` (every emulator table exists),
    ``accounts`` (every account of ``EMULATOR_ACCOUNTS`` and the clock row exist), in that order; a check
    that cannot run because an earlier one failed is not run (``ok`` None). Runs in an app context; first
    gives the lazy preparation its chance, so a probe alone makes a fresh emulator ready."""
    state = database_state()
    try:
        state.ensure()
    except DATABASE_ERRORS:
        pass  # the checks below say what is missing
    except Exception:  # a check must answer, whatever is wrong (the log has the cause)
        _log.exception("gateway emulator: preparing the database failed")
    finally:
        db.session.rollback()
    try:
        with engine.connect() as connection:
            names = set(inspect(connection).get_table_names())
            missing = sorted(set(db.metadata.tables) - names)
            seeded: set[str] = set()
            clock_row = False
            if not missing:
                wanted = list(settings.accounts)
                if wanted:
                    seeded = set(
                        connection.execute(
                            select(Account.merchant_account_id).where(Account.merchant_account_id.in_(wanted))
                        ).scalars()
                    )
                clock_row = bool(connection.execute(select(func.count()).select_from(ClockState)).scalar())
    except DATABASE_ERRORS as error:
        if not is_database_outage(error):
            raise
        state.watch.failed(error)
        # No reason: this answer is open to anyone (the driver's names the host); the log line has it.
        return [
            ReadinessCheck(name="database", ok=False, detail="unreachable"),
            ReadinessCheck(name="schema", ok=None, detail="not checked: the database does not answer"),
            ReadinessCheck(name="accounts", ok=None, detail="not checked: the database does not answer"),
        ]
    state.watch.succeeded()
    checks = [ReadinessCheck(name="database", ok=True, detail="reachable")]
    if missing:
        checks.append(ReadinessCheck(name="schema", ok=False, detail=f"missing tables: {', '.join(missing)}"))
        checks.append(ReadinessCheck(name="accounts", ok=None, detail="not checked: tables are missing"))
        return checks
    checks.append(ReadinessCheck(name="schema", ok=True, detail=f"{len(db.metadata.tables)} tables present"))
    absent = sorted(set(settings.accounts) - seeded)
    if absent or not clock_row:
        what = [f"accounts not seeded: {', '.join(absent)}"] if absent else []
        what += [] if clock_row else ["the clock row is missing"]
        checks.append(ReadinessCheck(name="accounts", ok=False, detail="; ".join(what)))
    else:
        checks.append(
            ReadinessCheck(name="accounts", ok=True, detail=f"{len(settings.accounts)} account(s) seeded")
        )
    return checks
