"""Heartbeats of the background work: did ``deliver`` and ``reconcile`` run lately, and how did it go?

Every run of a background job records itself in ``gateway_job_runs`` (:class:`~flask_gateway.models.JobRun`),
one row per job updated in place, in the shop's database: shared by every process on every machine. The
hooks are inside the functions themselves (:func:`~flask_gateway.payments.outbox.deliver_due`,
:func:`~flask_gateway.operations.reconciliation.reconcile`), so every way of running them records: ``flask
gateway deliver`` (each ``--every`` round), ``flask gateway reconcile``, the Celery tasks, the admin's
"Deliver what is due now", a shop's own call.

- **What is written**: when the run started and finished, ``ok`` or ``failed`` (it raised, or its report
  has errors: a receiver that raised, a checkout that could not be polled, the gateway not installed), a
  one-line summary, the host name and pid, the count of runs and of failures.
- **What it costs**: a delivery (every 5 s under Celery, mostly with nothing due) writes once, when it
  ends: one ``UPDATE`` of one row by primary key (an ``INSERT`` the first time). A reconciliation, which may
  run for minutes, also writes when it starts, so a long run is visible as started.
- **Never in the caller's way**: each write is a short transaction of its own on a connection of its own
  (an in-memory SQLite database, with one connection for the app, writes through the extension's session
  once it has no transaction open). A write that fails (the table missing: the migrations not run; the
  database away) logs one WARNING per failing spell and per job, and the job goes on; a database outage
  then fails the job itself as it always did.
- **Nested runs**: a run inside another run of the same job (a task that calls ``deliver_due(1)`` in a
  loop inside its own :func:`record_run`) records nothing itself: the outer one records the whole.

:func:`job_status` reads the records (one query) and says, per job, how long ago it last finished and
whether it is **overdue**: never ran although the gateway was installed longer than the bound ago, or its
last finished run, or its last successful one, is older than the bound (``GATEWAY_DELIVER_STALE_SECONDS``,
``GATEWAY_RECONCILE_STALE_SECONDS``). The doctor (``background-work``), the admin status page, the
readiness answer (informational) and the metrics report it.

The settings check (``flask_gateway.operations.drift``) keeps a row of its own, :data:`SETTINGS_CHECK`, not
one of :data:`JOBS`: every scheduled run (Celery beat, each ``reconcile``, ``flask gateway check-settings``)
first takes its turn with :func:`claim_turn` (one ``UPDATE`` that moves ``last_started_at`` only when it
is older than the period), so however many processes run, the gateway is asked once per
``GATEWAY_SETTINGS_CHECK_SECONDS``; :func:`finish_turn` records how it went and :func:`settings_check_status`
reads it back (overdue: no check finished for three periods while installed; the doctor says so).
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Final, Literal
from urllib.parse import urlsplit, urlunsplit

from sqlalchemy import Connection, insert, literal, or_, select, true, update
from sqlalchemy.exc import IntegrityError

from flask_gateway.core.outages import describe_database_error, is_database_outage
from flask_gateway.core.spells import Spells
from flask_gateway.core.sql import commit_keeping_loaded, sqlite_in_memory, sqlite_read_transactions
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import Installation, JobRun
from flask_gateway.state import GatewayState, get_state, leaves_no_transaction

__all__ = [
    "JOBS",
    "SETTINGS_CHECK",
    "JobStatus",
    "Run",
    "broker_unreachable",
    "claim_turn",
    "finish_turn",
    "job_status",
    "mask_url",
    "record_run",
    "settings_check_status",
]

_log = logging.getLogger("flask_gateway.heartbeats")

#: The background jobs that record heartbeats.
JOBS: Final = ("deliver", "reconcile")
#: The settings check's row (not one of :data:`JOBS`: :func:`claim_turn`, :func:`settings_check_status`).
SETTINGS_CHECK: Final = "check-settings"
#: A settings check is overdue when none finished for this many of its periods.
SETTINGS_CHECK_PERIODS: Final = 3
#: Jobs whose start is written when they start (long runs); the others write once, when they end.
_ANNOUNCED: Final = frozenset({"reconcile"})
#: The longest summary kept (one line).
SUMMARY_LENGTH: Final = 500

Outcome = Literal["ok", "failed"]

#: The jobs whose run is in progress in this context (a nested run of the same job records nothing).
_RUNNING: ContextVar[frozenset[str]] = ContextVar("flask_gateway_heartbeat_running", default=frozenset())


class Run:
    """What a run tells :func:`record_run` before it ends: its summary and whether it failed."""

    def __init__(self, job: str, started_at: datetime) -> None:
        self.job = job
        self.started_at = started_at
        self.summary = ""
        self.failed = False

    def done(self, summary: str, *, failed: bool = False) -> None:
        """The run's one-line summary (newlines become `` | ``); ``failed``: its report has errors."""
        self.summary = summary
        self.failed = failed


class _Failing:
    """The jobs whose heartbeat could not be written in this process, per database (one WARNING per
    failing spell)."""

    def __init__(self) -> None:
        self._spells: Spells[tuple[str, str]] = Spells()

    def failed(self, where: str, job: str, error: BaseException, *, quiet: bool) -> None:
        if self._spells.failed((where, job)) and not quiet:
            _log.warning(
                "the heartbeat of %s could not be recorded (%s): the job went on; doctor, the status page "
                "and the metrics will call it overdue. If the table gateway_job_runs is missing, run the "
                "migrations (or flask gateway init-db)",
                job,
                describe_database_error(error),
            )
        else:
            _log.debug("the heartbeat of %s could not be recorded: %s", job, describe_database_error(error))

    def succeeded(self, where: str, job: str) -> None:
        if self._spells.succeeded((where, job)) is not None:
            _log.warning("the heartbeat of %s is recorded again", job)


_FAILING: Final = _Failing()


@contextmanager
def record_run(job: str) -> Iterator[Run]:
    """Record one run of ``job`` (one of :data:`JOBS`) around the block, in an app context.

    The block may call ``run.done(summary, failed=...)``; a block that raises is a failed run (the error
    propagates unchanged). The records never make the job fail: see the module docstring.
    """
    if job not in JOBS:
        raise ValueError(f"unknown job {job!r}: one of {', '.join(JOBS)}")
    running = _RUNNING.get()
    run = Run(job, utcnow())
    if job in running:  # the outer run of the same job records the whole
        yield run
        return
    token = _RUNNING.set(running | {job})
    try:
        if job in _ANNOUNCED:
            _write(job, {"last_started_at": run.started_at, **_where()}, quiet=False)
        try:
            yield run
        except BaseException as error:
            outage = isinstance(error, Exception) and is_database_outage(error)
            _finish(run, "failed", f"raised {type(error).__name__}: {_first_line(error)}", quiet=outage)
            raise
        _finish(run, "failed" if run.failed else "ok", run.summary, quiet=False)
    finally:
        _RUNNING.reset(token)


def _finish(run: Run, outcome: Outcome, summary: str, *, quiet: bool) -> None:
    now = utcnow()
    values: dict[str, Any] = {
        "last_finished_at": now,
        "last_outcome": outcome,
        "last_summary": _one_line(summary),
        **_where(),
    }
    if run.job not in _ANNOUNCED:
        values["last_started_at"] = run.started_at
    if outcome == "ok":
        values["last_succeeded_at"] = now
    _write(run.job, values, finished=True, failed=outcome == "failed", quiet=quiet)


def _where() -> dict[str, Any]:
    return {"host": socket.gethostname()[:255], "pid": os.getpid()}


def _one_line(text: str) -> str:
    line = " | ".join(part.strip() for part in text.strip().splitlines() if part.strip())
    return line if len(line) <= SUMMARY_LENGTH else line[: SUMMARY_LENGTH - 3] + "..."


def _first_line(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0][:200] if lines else ""


def _write(
    job: str, values: dict[str, Any], *, finished: bool = False, failed: bool = False, quiet: bool
) -> None:
    """Upsert ``job``'s row in a short transaction of its own; never raises (one WARNING per spell)."""
    where = ""
    try:
        state = get_state()
        where = state.engine.url.render_as_string(hide_password=True)
        try:
            _in_own_transaction(state, lambda connection: _upsert(connection, job, values, finished, failed))
        except IntegrityError:  # another process wrote the first row meanwhile: it is there now
            _in_own_transaction(state, lambda connection: _upsert(connection, job, values, finished, failed))
    except Exception as error:
        _FAILING.failed(where, job, error, quiet=quiet)
    else:
        _FAILING.succeeded(where, job)


def _in_own_transaction(state: GatewayState, write: Callable[[Connection], None]) -> None:
    engine = state.engine
    if engine.dialect.name == "sqlite":
        # A transaction of the extension's session (SQLite: it may hold the write lock) must not wait on
        # ours: the verbs that record end theirs at their first claim anyway.
        session = state.session
        if session.in_transaction():
            commit_keeping_loaded(session)
        if sqlite_in_memory(engine):  # one connection for the whole app: through the session
            try:
                write(session.connection())
                commit_keeping_loaded(session)
            except BaseException:
                session.rollback()
                raise
            return
    with engine.begin() as connection:
        write(connection)


def _upsert(connection: Connection, job: str, values: dict[str, Any], finished: bool, failed: bool) -> None:
    """One ``UPDATE`` by primary key; the first time, an ``INSERT``."""
    changes = dict(values)
    if finished:
        changes["runs"] = JobRun.runs + 1
        changes["failures"] = JobRun.failures + (1 if failed else 0)
    updated = connection.execute(update(JobRun).where(JobRun.job == job).values(**changes))
    if not updated.rowcount:
        first = {"job": job, "runs": int(finished), "failures": int(finished and failed), **values}
        connection.execute(insert(JobRun).values(**first))


# --- reading ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobStatus:
    """What the records say of one job, at ``checked_at``."""

    job: str
    last_started_at: datetime | None
    last_finished_at: datetime | None
    last_succeeded_at: datetime | None
    #: ``ok``, ``failed``, or None (never finished).
    last_outcome: str | None
    last_summary: str | None
    host: str | None
    #: Since the last finished run (None: never finished).
    age: timedelta | None
    bound: timedelta
    overdue: bool
    pid: int | None = None
    runs: int = 0
    failures: int = 0
    #: When the gateway was installed (for this environment), if it is.
    installed_at: datetime | None = None
    #: The time the status was computed for (``now``).
    checked_at: datetime | None = None

    @property
    def running(self) -> bool:
        """A run began after the last one finished: still going, or it died on the way."""
        return self.last_started_at is not None and (
            self.last_finished_at is None or self.last_started_at > self.last_finished_at
        )

    @property
    def config_key(self) -> str:
        if self.job == SETTINGS_CHECK:
            return f"{SETTINGS_CHECK_PERIODS} x GATEWAY_SETTINGS_CHECK_SECONDS"
        return f"GATEWAY_{self.job.upper()}_STALE_SECONDS"

    def describe(self) -> str:
        """One line for people: when it last ran, how that went, and whether that is too long ago."""
        now = self.checked_at or utcnow()
        bound = f"the bound is {human_duration(self.bound)} ({self.config_key})"
        if self.last_finished_at is None:
            text = f"{self.job}: never finished a run"
            if self.running and self.last_started_at is not None:
                text += f" (one started {_ago(now, self.last_started_at)}{self._where()})"
            elif self.installed_at is not None:
                text += f" since the gateway was installed {_ago(now, self.installed_at)}"
            return text + (f": overdue, {bound}" if self.overdue else "")
        text = (
            f"{self.job}: last run finished {_ago(now, self.last_finished_at)}{self._where()}, "
            f"{self.last_outcome or 'unknown'}"
        )
        if self.last_summary:
            text += f" ({self.last_summary})"
        if self.last_outcome != "ok":
            text += (
                f"; last success {_ago(now, self.last_succeeded_at)}"
                if self.last_succeeded_at is not None
                else "; it never succeeded"
            )
        if self.running and self.last_started_at is not None:
            text += f"; a run started {_ago(now, self.last_started_at)} has not finished"
        return text + (f": overdue, {bound}" if self.overdue else "")

    def _where(self) -> str:
        if not self.host:
            return ""
        return f" on {self.host}" + (f" (pid {self.pid})" if self.pid is not None else "")

    def to_json(self) -> dict[str, Any]:
        """``age_seconds`` and ``overdue``: the readiness answer's part (nothing secret)."""
        return {
            "age_seconds": None if self.age is None else round(self.age.total_seconds(), 1),
            "overdue": self.overdue,
        }


def bounds(state: GatewayState) -> dict[str, timedelta]:
    """Each job's bound: past it without a (successful) run, the job is overdue."""
    return {
        "deliver": timedelta(seconds=state.config.deliver_stale_seconds),
        "reconcile": timedelta(seconds=state.config.reconcile_stale_seconds),
    }


@leaves_no_transaction
def job_status(*, now: datetime | None = None) -> list[JobStatus]:
    """Each job of :data:`JOBS`, in that order, as the records say at ``now`` (default: now). Reads only:
    one query. Raises what the driver raises when the database or
    the table cannot be read."""
    state = get_state()
    now = now or utcnow()
    installed = (
        select(Installation.installed_at)
        .where(Installation.environment == state.config.environment)
        .order_by(Installation.id.desc())
        .limit(1)
        .scalar_subquery()
    )
    # One statement whatever the table holds: a row of one (the installation's time) joined to each job's.
    one = select(literal(1).label("one")).subquery()
    statement = select(installed.label("installed_at"), JobRun).select_from(one).outerjoin(JobRun, true())
    with sqlite_read_transactions():
        rows = state.session.execute(statement).all()
    installed_at = rows[0].installed_at if rows else None
    records = {row.JobRun.job: row.JobRun for row in rows if row.JobRun is not None}
    limits = bounds(state)
    return [_status(job, records.get(job), limits[job], installed_at, now) for job in JOBS]


# --- the settings check's turn --------------------------------------------------------------------------


def claim_turn(job: str, every: timedelta, *, now: datetime | None = None, force: bool = False) -> bool:
    """Take ``job``'s turn (:data:`SETTINGS_CHECK`): True for one caller per ``every``, across processes and
    machines; False when another run started less than ``every`` before ``now``. ``force``: the turn is taken
    whatever the last start (a person ran it by hand), and the period starts again.

    One ``UPDATE`` moves the row's ``last_started_at`` to ``now`` only when it is older than ``now - every``
    (two processes at once: the database lets one of them change the row); the first time, an ``INSERT``
    (another process's first row meanwhile: not our turn). When the row cannot be written (the table
    missing: the migrations not run; the database away) the turn is taken: the check runs more often than
    asked rather than never, and one WARNING says why.
    """
    now = now or utcnow()
    values: dict[str, Any] = {"last_started_at": now, **_where()}
    due = () if force else (or_(JobRun.last_started_at.is_(None), JobRun.last_started_at <= now - every),)
    taken: list[bool] = []

    def claim(connection: Connection) -> None:
        taken.clear()
        if connection.execute(update(JobRun).where(JobRun.job == job, *due).values(**values)).rowcount:
            taken.append(True)
        elif connection.scalar(select(JobRun.job).where(JobRun.job == job)) is not None:
            taken.append(False)
        else:
            connection.execute(insert(JobRun).values(job=job, runs=0, failures=0, **values))
            taken.append(True)

    where = ""
    try:
        state = get_state()
        where = state.engine.url.render_as_string(hide_password=True)
        _in_own_transaction(state, claim)
    except IntegrityError:  # another process wrote the first row meanwhile: its turn
        return False
    except Exception as error:
        _FAILING.failed(where, job, error, quiet=False)
        return True
    _FAILING.succeeded(where, job)
    return bool(taken and taken[0])


def finish_turn(job: str, summary: str, *, failed: bool, now: datetime | None = None) -> None:
    """Record the end of the run whose turn :func:`claim_turn` gave: when, ``ok`` or ``failed``, its
    one-line summary. Never raises (one WARNING per failing spell)."""
    now = now or utcnow()
    values: dict[str, Any] = {
        "last_finished_at": now,
        "last_outcome": "failed" if failed else "ok",
        "last_summary": _one_line(summary),
        **_where(),
    }
    if not failed:
        values["last_succeeded_at"] = now
    _write(job, values, finished=True, failed=failed, quiet=False)


@leaves_no_transaction
def settings_check_status(*, now: datetime | None = None) -> JobStatus:
    """The settings check as its row says at ``now``: overdue when no check finished (or none succeeded)
    for :data:`SETTINGS_CHECK_PERIODS` periods of ``GATEWAY_SETTINGS_CHECK_SECONDS`` while the gateway is
    installed. Reads only; raises what the driver raises when the table cannot be read."""
    state = get_state()
    now = now or utcnow()
    bound = timedelta(seconds=SETTINGS_CHECK_PERIODS * state.config.settings_check_seconds)
    with sqlite_read_transactions():
        record = state.session.scalar(
            select(JobRun).where(JobRun.job == SETTINGS_CHECK).execution_options(populate_existing=True)
        )
        installed_at = state.session.scalar(
            select(Installation.installed_at)
            .where(Installation.environment == state.config.environment)
            .order_by(Installation.id.desc())
            .limit(1)
        )
    return _status(SETTINGS_CHECK, record, bound, installed_at, now)


def _status(
    job: str, record: JobRun | None, bound: timedelta, installed_at: datetime | None, now: datetime
) -> JobStatus:
    finished = record.last_finished_at if record else None
    succeeded = record.last_succeeded_at if record else None
    age = now - finished if finished is not None else None
    if finished is None:
        # Never ran: overdue once the gateway has been installed longer than the bound (not installed:
        # nothing to do yet; the doctor's installation finding says so).
        overdue = installed_at is not None and now - installed_at > bound
    elif age is not None and age > bound:
        overdue = True
    else:
        # Runs, but does it succeed? Never succeeded counts from the installation (or at once, without one).
        since = succeeded or installed_at
        overdue = since is None or now - since > bound
    return JobStatus(
        job=job,
        last_started_at=record.last_started_at if record else None,
        last_finished_at=finished,
        last_succeeded_at=succeeded,
        last_outcome=record.last_outcome if record else None,
        last_summary=record.last_summary if record else None,
        host=record.host if record else None,
        age=age,
        bound=bound,
        overdue=overdue,
        pid=record.pid if record else None,
        runs=record.runs if record else 0,
        failures=record.failures if record else 0,
        installed_at=installed_at,
        checked_at=now,
    )


def human_duration(delta: timedelta) -> str:
    """``42 s``, ``5 min``, ``2 h 5 min``, ``3 d 4 h``: a duration for people."""
    seconds = max(0, int(delta.total_seconds()))
    if seconds < 120:
        return f"{seconds} s"
    minutes = seconds // 60
    if minutes < 120:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 48:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def _ago(now: datetime, then: datetime) -> str:
    return f"{human_duration(now - then)} ago"


# --- the broker ------------------------------------------------------------------------------------------


def mask_url(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = f"{user}:***@{host}" + (f":{parts.port}" if parts.port is not None else "")
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def broker_unreachable(url: str, *, timeout: float = 3.0) -> str | None:
    """None when the Celery broker at ``url`` answers within ``timeout`` seconds, else why not (one line,
    no password). Uses kombu when installed (any transport), else a TCP connection to the URL's host."""
    try:
        kombu: Any = importlib.import_module("kombu")  # optional: installed with Celery
    except ImportError:
        return _socket_unreachable(url, timeout)
    try:
        with kombu.Connection(url, connect_timeout=timeout) as connection:
            connection.ensure_connection(max_retries=1, interval_start=0, timeout=timeout)
    except ImportError:  # the transport's client library is missing here: the network can still tell
        return _socket_unreachable(url, timeout)
    except Exception as error:
        if type(error).__name__ == "VersionMismatch":
            # kombu's transport refuses this machine's client library (redis-py older than it needs): a
            # fault of the doctor's environment, not of the broker; the network can still tell.
            return _socket_unreachable(url, timeout)
        return _masked(f"{type(error).__name__}: {_first_line(error)}", url)
    return None


def _masked(text: str, url: str) -> str:
    """``text`` with ``url`` masked, and its password wherever else it appears."""
    text = text.replace(url, mask_url(url))
    password = urlsplit(url).password
    return text.replace(password, "***") if password else text


def _socket_unreachable(url: str, timeout: float) -> str | None:
    parts = urlsplit(url)
    default = {"redis": 6379, "rediss": 6379, "amqp": 5672, "amqps": 5671}.get(parts.scheme)
    try:
        port = parts.port or default
    except ValueError:
        return "the URL's port is not a number"
    if not parts.hostname or port is None:
        return "no host and port in the URL to try (install kombu to check other transports)"
    try:
        with socket.create_connection((parts.hostname, port), timeout=timeout):
            return None
    except OSError as error:
        return f"{type(error).__name__}: {error.strerror or error}"
