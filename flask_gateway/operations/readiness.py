"""Readiness: may this process take traffic? The checks behind ``GET /gateway/readyz`` and the doctor.

Three named checks, in this order (a later one is not run when an earlier one fails):

- ``database``: one round trip (``SELECT 1``) on the extension's engine (the shop's, on PostgreSQL);
- ``schema``: every ``gateway_*`` table and column exists (``flask gateway init-db`` or the migrations ran);
- ``installation``: the gateway is installed for the configured ``GATEWAY_ENVIRONMENT``: at least one
  merchant account, open or retired. A shop whose every account is retired takes no new checkouts, but
  its open ones' callbacks, refunds and reconciliation still need the process; the doctor says it
  (docs/decisions.md, "Several merchant accounts").

When all three pass, the answer also says how the background work goes (``background``: per job of
:mod:`flask_gateway.payments.heartbeats`, the seconds since its last finished run and whether it is overdue),
for a dashboard or a human; it never makes the probe fail: a web process serves shoppers while the workers are
down (the doctor, the metric ``flask_gateway_job_overdue`` and its alert say so). It costs one more small
query (the ``gateway_job_runs`` rows, two of them); a probe that cannot read them leaves it out.

A success of ``schema`` and ``installation`` is kept for the life of the process (per app): neither
undoes itself while the shop runs, so a ready process answers a probe with one ``SELECT 1``. A failure is
checked again on every probe, so the process turns ready as soon as it is fixed.

Liveness (``GET /gateway/livez``) has no checks at all: the process answers. It never touches the
database: a database outage must not get every worker killed and restarted by a liveness probe.

The answer names the checks and says what failed in a few fixed words: no secret, no account id, no
database address (a probe URL is not behind the admin guard). The log says more.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from flask import Flask
from sqlalchemy import bindparam, inspect, select
from sqlalchemy.engine import Engine

from flask_gateway.core.outages import describe_database_error, is_database_outage, ping
from flask_gateway.core.sql import sqlite_read_transactions
from flask_gateway.models import GatewayBase, Installation
from flask_gateway.payments.heartbeats import JobStatus, job_status
from flask_gateway.state import GatewayState, leaves_no_transaction

__all__ = ["CHECK_NAMES", "ProbeCheck", "Readiness", "missing_schema", "readiness"]

_log = logging.getLogger("flask_gateway.readiness")

#: The readiness checks, in the order they run and are listed.
CHECK_NAMES: Final = ("database", "schema", "installation")

#: The checks that passed once, per app, in this process (they are not run again).
_PASSED: weakref.WeakKeyDictionary[Flask, set[str]] = weakref.WeakKeyDictionary()


@dataclass(frozen=True)
class ProbeCheck:
    """One check's result: ``ok`` True (passed), False (failed) or None (not run: an earlier one
    failed); ``detail`` says why in a few words safe to show anyone."""

    name: str
    ok: bool | None
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        answer: dict[str, Any] = {"ok": self.ok}
        if self.detail:
            answer["detail"] = self.detail
        return answer


@dataclass(frozen=True)
class Readiness:
    checks: tuple[ProbeCheck, ...]
    #: The background work's heartbeats (informational), when the checks passed and they could be read.
    background: tuple[JobStatus, ...] = ()

    @property
    def ready(self) -> bool:
        return all(check.ok for check in self.checks)

    @property
    def failing(self) -> list[ProbeCheck]:
        return [check for check in self.checks if check.ok is False]

    def summary(self) -> str:
        """``ready`` or ``not ready: database (unreachable)``."""
        if self.ready:
            return "ready"
        return "not ready: " + "; ".join(f"{check.name} ({check.detail})" for check in self.failing)

    def to_json(self) -> dict[str, Any]:
        """The probe's JSON answer (``message`` as in every JSON error of the extension when not ready)."""
        answer: dict[str, Any] = {
            "status": "ready" if self.ready else "unavailable",
            "checks": {check.name: check.to_json() for check in self.checks},
        }
        if not self.ready:
            answer["failing"] = [check.name for check in self.failing]
            answer["message"] = f"Not ready: {self.summary().removeprefix('not ready: ')}."
        if self.background:
            answer["background"] = {status.job: status.to_json() for status in self.background}
        return answer


def missing_schema(engine: Engine) -> list[str]:
    """The extension's tables (``gateway_x``) and columns (``gateway_x.y``) the database lacks (an
    empty list: all there). Raises what the driver raises when the database cannot be read."""
    inspector = inspect(engine)
    existing = set(inspector.get_table_names())
    missing: list[str] = []
    for table in GatewayBase.metadata.sorted_tables:
        if table.name not in existing:
            missing.append(table.name)
            continue
        have = {column["name"] for column in inspector.get_columns(table.name)}
        missing += [f"{table.name}.{column.name}" for column in table.columns if column.name not in have]
    return missing


def readiness(
    app: Flask, state: GatewayState, *, record: bool = True, cache: bool = True, background: bool = True
) -> Readiness:
    """Run the readiness checks for ``app`` (in its app context). ``record``: a database outage counts in
    the app's outage watch (one WARNING per outage) and a success ends one; ``cache``: keep and use the
    successes of this process (the doctor asks afresh); ``background``: add the heartbeats when ready."""
    passed = _PASSED.setdefault(app, set()) if cache else set()
    with sqlite_read_transactions():  # nothing here writes: no SQLite write lock
        database = _run("database", lambda: _database(state, record=record))
        if not database.ok:
            skipped = "not checked: the database does not answer"
            return Readiness((database, *(ProbeCheck(name, None, skipped) for name in CHECK_NAMES[1:])))
        schema = _cached(passed, "schema", lambda: _schema(state))
        if not schema.ok:  # its query would fail on a missing table: say why it was not asked
            installation = ProbeCheck("installation", None, "not checked: the schema is not current")
        else:
            installation = _cached(passed, "installation", lambda: _installation(state))
        checks = (database, schema, installation)
        if background and all(check.ok for check in checks):
            return Readiness(checks, _background())
    return Readiness(checks)


def _background() -> tuple[JobStatus, ...]:
    """The heartbeats, or none when they cannot be read (informational: never a failed probe)."""
    try:
        return tuple(job_status())
    except Exception as error:
        _log.debug("readiness: the heartbeats could not be read: %s", describe_database_error(error))
        return ()


def _cached(passed: set[str], name: str, check: Callable[[], ProbeCheck]) -> ProbeCheck:
    if name in passed:
        return ProbeCheck(name, True)
    result = _run(name, check)
    if result.ok:
        passed.add(name)
    return result


def _run(name: str, check: Callable[[], ProbeCheck]) -> ProbeCheck:
    """A check that raises fails (a probe never answers 500): one log line, no traceback."""
    try:
        return check()
    except Exception as error:
        if is_database_outage(error):
            # The database went away between two checks: the next probe's database check tells it.
            return ProbeCheck(name, False, "the database stopped answering")
        _log.warning("readiness check %s failed: %s", name, describe_database_error(error))
        return ProbeCheck(name, False, f"error ({type(error).__name__}): see the server log")


def _database(state: GatewayState, *, record: bool) -> ProbeCheck:
    try:
        ping(state.engine)
    except Exception as error:
        if not is_database_outage(error):
            raise
        if record:
            state.outages.failed(error)
        return ProbeCheck("database", False, "unreachable")
    if record:
        state.outages.succeeded()
    return ProbeCheck("database", True)


def _schema(state: GatewayState) -> ProbeCheck:
    missing = missing_schema(state.engine)
    if not missing:
        return ProbeCheck("schema", True)
    shown = ", ".join(missing[:5]) + (f" and {len(missing) - 5} more" if len(missing) > 5 else "")
    return ProbeCheck("schema", False, f"missing {shown}: run the migrations or flask gateway init-db")


#: Any account installed for an environment, open or retired (one id, no ORM entity).
_ANY_ACCOUNT: Final = (
    select(Installation.id).where(Installation.environment == bindparam("environment")).limit(1)
)


@leaves_no_transaction
def _installation(state: GatewayState) -> ProbeCheck:
    if state.session.execute(_ANY_ACCOUNT, {"environment": state.config.environment}).first() is not None:
        return ProbeCheck("installation", True)
    return ProbeCheck("installation", False, f"not installed for the {state.config.environment} environment")
