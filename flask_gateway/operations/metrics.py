"""Prometheus metrics (the optional extra: ``pip install "flask-bnpl-gateway[metrics]"``).

``register_metrics(app, registry)`` registers two things in a ``prometheus_client`` registry (the app's
own, or the default one):

- :class:`GatewayCollector`, which reads its figures from the database **at scrape time**: the same on
  every worker process and machine, whichever answers the scrape. Callbacks by outcome and payments
  confirmed by path over a recent window, the last verified callback, whether callbacks are silent, the
  paid checkouts awaiting their callback and the oldest one's age (all from
  ``flask_gateway.operations.health``), refunds by state (failed ones included), the outbox backlog and its
  oldest event's age, and when each background job (deliver, reconcile) last ran, last succeeded and whether
  it is overdue (``flask_gateway.payments.heartbeats``).
  The checkout and callback figures (callbacks, confirmations, the last callback, silent, awaiting, the
  oldest awaiting, refunds) carry an ``account`` label: the merchant account id, always present (a shop
  with one account: its one id on every series; none installed yet: ``""``). With several accounts each
  account's figures are its own (``flask_gateway.operations.health``), and callbacks that count for no
  installed account (refused ones naming no checkout of ours) are under ``account=""``: summing over
  ``account`` gives the shop's figures, as one series did before (docs/operations.md, "Metrics and
  alerts"). The outbox, the jobs and ``flask_gateway_up`` are the shop's, without the label.
- the gateway calls: a latency histogram and an error counter per operation, fed by an observer of the
  core's transport (``flask_gateway.core.http.add_observer``). Without ``PROMETHEUS_MULTIPROC_DIR`` in the
  environment they count this process's calls. With it (prometheus_client's multiprocess mode: several
  gunicorn workers), every process writes its counts to a file in that directory and the registry gets a
  ``MultiProcessCollector`` that adds up the files of every process, those of exited ones included: any
  worker answers a scrape with the whole server's counts, and a replaced worker takes nothing away.

prometheus_client decides where its values live when it is first imported (its ``values`` module reads
``PROMETHEUS_MULTIPROC_DIR`` then): the variable must be in the environment before the server starts, not
set from Python. ``register_metrics`` checks that the two agree and says so when they do not.

Serving them is the app's choice (docs/operations.md, "Metrics and alerts"): a route of its own that
checks a scraper's token and answers ``prometheus_client.generate_latest(registry)``, or
``prometheus_client.make_wsgi_app(registry)`` mounted behind the app's own guard. The extension adds no
route: its admin guard is for people signed in to the shop, not for a scraper.

``prometheus_client`` is imported here only, and only if installed: without it, importing this module
works and ``register_metrics`` raises ``ConfigurationError`` saying what to install.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Final, cast

from flask import Flask
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError

from flask_gateway import models
from flask_gateway.core import http
from flask_gateway.core.http import CallAttempt
from flask_gateway.core.outages import describe_database_error, is_database_outage
from flask_gateway.core.sql import sqlite_read_transactions
from flask_gateway.errors import ConfigurationError
from flask_gateway.models import CallbackOutcome, GatewayCheckout, RefundRecord, RefundState
from flask_gateway.operations.health import CONFIRMATION_PATHS, CallbackHealth, callback_health
from flask_gateway.payments import heartbeats
from flask_gateway.state import get_state

try:
    from prometheus_client import REGISTRY, CollectorRegistry, Counter, Histogram, values
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.multiprocess import MultiProcessCollector
except ImportError:  # the metrics extra is not installed: register_metrics says so
    PROMETHEUS = False
else:
    PROMETHEUS = True

    class _FilesCollector(MultiProcessCollector):
        """The files of every process, read again when a scrape met one a worker is just creating (still
        empty: prometheus_client reads its header and raises ``struct.error``), instead of answering 500."""

        def collect(self) -> Any:
            for attempt in range(3):
                try:
                    return list(super().collect())  # type: ignore[no-untyped-call]
                except struct.error:
                    if attempt == 2:
                        raise
                    time.sleep(0.05)
            return []  # pragma: no cover - the loop returns or raises


if TYPE_CHECKING:
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector

__all__ = [
    "DEFAULT_WINDOW",
    "GatewayCollector",
    "GatewayMetrics",
    "multiprocess_directory",
    "register_metrics",
]

log = logging.getLogger("flask_gateway.metrics")

#: The window of the "recent" figures (callbacks by outcome, confirmations by path).
DEFAULT_WINDOW: Final = timedelta(hours=1)
#: Seconds: a local call takes milliseconds, the gateway's read timeout is 30 s by default.
LATENCY_BUCKETS: Final = (0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
_OUTBOX_STATES: Final = ("pending", "delivered", "dead")


# --- figures from the database, at scrape time ----------------------------------------------------------


@dataclass
class _Families:
    up: GaugeMetricFamily
    window: GaugeMetricFamily
    callbacks: GaugeMetricFamily
    confirmations: GaugeMetricFamily
    last_callback: GaugeMetricFamily
    silent: GaugeMetricFamily
    awaiting: GaugeMetricFamily
    awaiting_age: GaugeMetricFamily
    refunds: GaugeMetricFamily
    outbox: GaugeMetricFamily
    outbox_age: GaugeMetricFamily
    job_last_run: GaugeMetricFamily
    job_last_success: GaugeMetricFamily
    job_overdue: GaugeMetricFamily
    skipped: list[str] = field(default_factory=list)

    @classmethod
    def new(cls, window: timedelta) -> _Families:
        seconds = int(window.total_seconds())
        return cls(
            up=GaugeMetricFamily(
                "flask_gateway_up", "1 when the gateway's figures could be read from the database, else 0"
            ),
            window=GaugeMetricFamily(
                "flask_gateway_metrics_window_seconds", "The window of the *_recent figures, in seconds"
            ),
            callbacks=GaugeMetricFamily(
                "flask_gateway_callbacks_recent",
                f"Callbacks received in the last {seconds} s, by outcome (the callback log) and merchant "
                "account",
                labels=["outcome", "account"],
            ),
            confirmations=GaugeMetricFamily(
                "flask_gateway_confirmations_recent",
                f"Payments confirmed in the last {seconds} s, by the path that confirmed them and merchant "
                "account",
                labels=["path", "account"],
            ),
            last_callback=GaugeMetricFamily(
                "flask_gateway_last_callback_timestamp_seconds",
                "When the merchant account's last verified callback was received (Unix time); absent when "
                "none ever was",
                labels=["account"],
            ),
            silent=GaugeMetricFamily(
                "flask_gateway_callbacks_silent",
                "1 while no verified callback of the merchant account came for "
                "GATEWAY_CALLBACK_SILENCE_MINUTES although GATEWAY_CALLBACK_SILENCE_PAYMENTS of its payments "
                "were confirmed another way",
                labels=["account"],
            ),
            awaiting=GaugeMetricFamily(
                "flask_gateway_awaiting_callback_checkouts",
                "Paid v2 checkouts whose callback was not acknowledged yet (PAID_PENDING_CALLBACK), by "
                "merchant account",
                labels=["account"],
            ),
            awaiting_age=GaugeMetricFamily(
                "flask_gateway_awaiting_callback_oldest_age_seconds",
                "Seconds since the merchant account's oldest paid checkout awaiting its callback was paid "
                "(0: none)",
                labels=["account"],
            ),
            refunds=GaugeMetricFamily(
                "flask_gateway_refunds",
                "Refund records by state (FAILED: refused by the gateway) and merchant account",
                labels=["state", "account"],
            ),
            outbox=GaugeMetricFamily(
                "flask_gateway_outbox_events",
                "Outbox events by state (pending: the backlog)",
                labels=["state"],
            ),
            outbox_age=GaugeMetricFamily(
                "flask_gateway_outbox_oldest_pending_age_seconds",
                "Seconds since the oldest pending outbox event was written (0: none pending)",
            ),
            job_last_run=GaugeMetricFamily(
                "flask_gateway_job_last_run_timestamp_seconds",
                "When the background job last finished a run, on any machine (Unix time); absent when never",
                labels=["job"],
            ),
            job_last_success=GaugeMetricFamily(
                "flask_gateway_job_last_success_timestamp_seconds",
                "When the background job last finished a run without failing (Unix time); absent when never",
                labels=["job"],
            ),
            job_overdue=GaugeMetricFamily(
                "flask_gateway_job_overdue",
                "1 while the background job has not run (or not succeeded) within its bound "
                "(GATEWAY_<JOB>_STALE_SECONDS), else 0",
                labels=["job"],
            ),
        )

    def all(self) -> list[GaugeMetricFamily]:
        families = [self.up, self.window, self.callbacks, self.confirmations, self.last_callback]
        families += [self.silent, self.awaiting, self.awaiting_age, self.refunds]
        if "outbox" not in self.skipped:
            families += [self.outbox, self.outbox_age]
        if "heartbeats" not in self.skipped:
            families += [self.job_last_run, self.job_last_success, self.job_overdue]
        return families


class GatewayCollector:
    """A ``prometheus_client`` collector whose figures come from the app's database at every scrape.

    It enters an app context of ``app`` of its own, so a scrape may come from anywhere: a route of the
    app, ``make_wsgi_app`` beside it, a thread of ``start_http_server``. A database that cannot be read
    makes ``flask_gateway_up`` 0 (and a WARNING line), never a failed scrape.
    """

    def __init__(self, app: Flask, *, window: timedelta = DEFAULT_WINDOW) -> None:
        _require_prometheus()
        if window <= timedelta():
            raise ValueError("the metrics window must be positive")
        self.app = app
        self.window = window

    def describe(self) -> Iterator[Metric]:
        """The metric names, without reading the database (the registry asks when registering)."""
        yield from _Families.new(self.window).all()

    def collect(self) -> Iterator[Metric]:
        families = _Families.new(self.window)
        families.window.add_metric([], self.window.total_seconds())
        try:
            with self.app.app_context():
                self._fill(families)
        except SQLAlchemyError as error:
            if is_database_outage(error):  # gateway_up 0 says it at every scrape: no traceback each time
                log.debug("gateway metrics: the database is away (%s)", describe_database_error(error))
            else:
                log.warning("gateway metrics: the database could not be read", exc_info=True)
            families = _Families.new(self.window)
            families.window.add_metric([], self.window.total_seconds())
            families.up.add_metric([], 0)
        else:
            families.up.add_metric([], 1)
        yield from families.all()

    def _fill(self, families: _Families) -> None:
        state = get_state()
        session = state.session
        with sqlite_read_transactions():
            accounts = [row.merchant_account_id for row in state.installations()]
            session.commit()
        health = callback_health(window=self.window)
        if len(accounts) <= 1:  # one account (or none yet): the shop's figures are its
            _health(families, health, accounts[0] if accounts else "")
        else:
            each = {
                account: callback_health(window=self.window, now=health.checked_at, account=account)
                for account in accounts
            }
            for account, figures in each.items():
                _health(families, figures, account)
            _unattributed(families, health, list(each.values()))
        with sqlite_read_transactions():
            refunds = session.execute(
                select(GatewayCheckout.merchant_account_id, RefundRecord.state, func.count())
                .join(GatewayCheckout, GatewayCheckout.id == RefundRecord.checkout_id)
                .group_by(GatewayCheckout.merchant_account_id, RefundRecord.state)
            ).all()
            session.commit()
        by_account: dict[str, dict[str, int]] = {account: {} for account in accounts or [""]}
        for account, refund_state, count in refunds:
            # One account: every refund is its (whatever an old row says).
            label = account if len(accounts) > 1 else (accounts[0] if accounts else "")
            counts = by_account.setdefault(label, {})
            counts[refund_state] = counts.get(refund_state, 0) + int(count)
        for account, counts in by_account.items():
            states = [*(s.value for s in RefundState), *sorted(set(counts) - set(RefundState))]
            for refund_state in states:
                families.refunds.add_metric([refund_state, account], counts.get(refund_state, 0))
        _outbox(families, health)
        _heartbeats(families, health)


def _health(families: _Families, health: CallbackHealth, account: str) -> None:
    outcomes = [o.value for o in CallbackOutcome]
    for outcome in [*outcomes, *sorted(set(health.callbacks) - set(outcomes))]:
        families.callbacks.add_metric([outcome, account], health.callbacks.get(outcome, 0))
    paths = [*CONFIRMATION_PATHS, *sorted(set(health.confirmations) - set(CONFIRMATION_PATHS))]
    for path in paths:
        families.confirmations.add_metric([path, account], health.confirmations.get(path, 0))
    if health.last_callback_at is not None:
        families.last_callback.add_metric([account], health.last_callback_at.timestamp())
    families.silent.add_metric([account], 1 if health.silent else 0)
    families.awaiting.add_metric([account], health.awaiting_callback)
    age = health.oldest_awaiting_age
    families.awaiting_age.add_metric([account], age.total_seconds() if age is not None else 0)


def _unattributed(families: _Families, shop: CallbackHealth, each: list[CallbackHealth]) -> None:
    """The callbacks that count for no installed account (``account=""``): the shop's minus the accounts'."""
    outcomes = [o.value for o in CallbackOutcome]
    for outcome in [*outcomes, *sorted(set(shop.callbacks) - set(outcomes))]:
        rest = shop.callbacks.get(outcome, 0) - sum(figures.callbacks.get(outcome, 0) for figures in each)
        families.callbacks.add_metric([outcome, ""], max(rest, 0))


def _outbox(families: _Families, health: CallbackHealth) -> None:
    """The outbox backlog, where this version has an outbox (``models.OutboxEvent``); skipped otherwise,
    and when its table is missing from the database (not migrated yet)."""
    model: Any = getattr(models, "OutboxEvent", None)
    if model is None:
        families.skipped.append("outbox")
        return
    session = get_state().session
    try:
        with sqlite_read_transactions():
            counts: dict[str, int] = dict(
                session.execute(select(model.state, func.count()).group_by(model.state)).all()
            )
            oldest = session.scalar(select(func.min(model.created_at)).where(model.state == "pending"))
            session.commit()
    except SQLAlchemyError as error:
        if is_database_outage(error):
            raise  # the database is away, not the outbox table: gateway_up 0
        session.rollback()
        log.warning("gateway metrics: the outbox table could not be read (not migrated?)", exc_info=True)
        families.skipped.append("outbox")
        return
    for state in [*_OUTBOX_STATES, *sorted(set(counts) - set(_OUTBOX_STATES))]:
        families.outbox.add_metric([state], int(counts.get(state, 0)))
    age = max((health.checked_at - oldest).total_seconds(), 0.0) if oldest is not None else 0.0
    families.outbox_age.add_metric([], age)


def _heartbeats(families: _Families, health: CallbackHealth) -> None:
    """When each background job last ran and succeeded, and whether it is overdue
    (``flask_gateway.payments.heartbeats``); skipped when its table cannot be read (not migrated yet)."""
    try:
        statuses = heartbeats.job_status(now=health.checked_at)
    except SQLAlchemyError as error:
        if is_database_outage(error):
            raise  # the database is away, not the table: gateway_up 0
        get_state().session.rollback()
        log.warning(
            "gateway metrics: the background jobs' heartbeats could not be read (not migrated?): %s",
            describe_database_error(error),
        )
        families.skipped.append("heartbeats")
        return
    for status in statuses:
        if status.last_finished_at is not None:
            families.job_last_run.add_metric([status.job], status.last_finished_at.timestamp())
        if status.last_succeeded_at is not None:
            families.job_last_success.add_metric([status.job], status.last_succeeded_at.timestamp())
        families.job_overdue.add_metric([status.job], 1 if status.overdue else 0)


# --- the gateway calls ----------------------------------------------------------------------------------

#: prometheus_client's variable for multiprocess mode (and its deprecated lower-case spelling).
MULTIPROC_VARIABLES: Final = ("PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir")


def multiprocess_directory() -> str | None:
    """The directory of prometheus_client's multiprocess mode, when the environment names one (as
    prometheus_client itself decides: the variable is present), else None."""
    for name in MULTIPROC_VARIABLES:
        if name in os.environ:
            return os.environ[name]
    return None


class CallMetrics:
    """The call latency and errors, as an observer of the transport.

    ``registry`` None: multiprocess mode, the values go to this process's file in the multiprocess
    directory and a ``MultiProcessCollector`` reports them (the objects are in no registry).
    """

    def __init__(self, registry: CollectorRegistry | None) -> None:
        self.registry = registry
        self.users = 0
        self.duration = Histogram(
            "flask_gateway_client_request_duration_seconds",
            "Gateway calls: seconds per attempt, by operation",
            ["operation"],
            registry=registry,
            buckets=LATENCY_BUCKETS,
        )
        self.errors = Counter(
            "flask_gateway_client_request_errors",
            "Gateway call attempts that failed, by operation and kind (timeout, connection, 4xx, 5xx)",
            ["operation", "kind"],
            registry=registry,
        )

    def __call__(self, attempt: CallAttempt) -> None:
        self.duration.labels(attempt.operation).observe(attempt.seconds)
        kind = _error_kind(attempt)
        if kind is not None:
            self.errors.labels(attempt.operation, kind).inc()

    def unregister(self) -> None:
        http.remove_observer(self)
        if self.registry is not None:
            self.registry.unregister(self.duration)
            self.registry.unregister(self.errors)


def _error_kind(attempt: CallAttempt) -> str | None:
    if attempt.failure is not None:
        return attempt.failure
    status = attempt.http_status
    if status is None or 200 <= status < 400:
        return None
    return f"{status // 100}xx"


#: One ``CallMetrics`` per registry (two apps registered in one registry share it); in multiprocess mode
#: one per process (key None), whatever the registries: two objects on one file would overwrite each other.
_CALLS: dict[CollectorRegistry | None, CallMetrics] = {}
_CALLS_LOCK = threading.Lock()


@dataclass
class GatewayMetrics:
    """What :func:`register_metrics` registered (``unregister()`` takes it out again)."""

    registry: CollectorRegistry
    collector: GatewayCollector
    calls: CallMetrics
    #: Multiprocess mode: the collector of every process's call metrics (its files), else None.
    processes: MultiProcessCollector | None = None

    def unregister(self) -> None:
        """Take the collectors out of the registry; the call metrics too when no other app uses them."""
        self.registry.unregister(cast("Collector", self.collector))
        if self.processes is not None:
            self.registry.unregister(cast("Collector", self.processes))
        with _CALLS_LOCK:
            self.calls.users -= 1
            key = None if self.calls.registry is None else self.registry
            if self.calls.users <= 0 and _CALLS.get(key) is self.calls:
                del _CALLS[key]
                self.calls.unregister()


def register_metrics(
    app: Flask, registry: CollectorRegistry | None = None, *, window: timedelta = DEFAULT_WINDOW
) -> GatewayMetrics:
    """Register the gateway's metrics for ``app`` in ``registry`` (default: ``prometheus_client``'s
    ``REGISTRY``): the database figures (:class:`GatewayCollector`, the "recent" ones over ``window``)
    and the gateway call latency and errors: this process's, or with ``PROMETHEUS_MULTIPROC_DIR`` in the
    environment every process's (a ``MultiProcessCollector`` on that directory). Serve the registry as
    docs/operations.md shows.

    One app per registry (the names would collide); call it once per app.
    """
    _require_prometheus()
    directory = multiprocess_directory()
    if directory is not None:
        _check_multiprocess(directory)
    target = REGISTRY if registry is None else registry
    collector = GatewayCollector(app, window=window)
    target.register(cast("Collector", collector))
    processes = None
    try:
        if directory is not None:
            files = _FilesCollector(None, path=directory)  # type: ignore[no-untyped-call]
            target.register(cast("Collector", files))
            processes = files
        key = None if directory is not None else target
        with _CALLS_LOCK:
            calls = _CALLS.get(key)
            if calls is None:
                calls = _CALLS[key] = CallMetrics(None if directory is not None else target)
                http.add_observer(calls)
            calls.users += 1
    except Exception:
        target.unregister(cast("Collector", collector))
        if processes is not None:
            target.unregister(cast("Collector", processes))
        raise
    return GatewayMetrics(registry=target, collector=collector, calls=calls, processes=processes)


def _check_multiprocess(directory: str) -> None:
    """Multiprocess mode asked for by the environment: the directory exists, and prometheus_client
    agrees (it read the variable when first imported, so one set later from Python came too late)."""
    if values.ValueClass is values.MutexValue:
        raise ConfigurationError(
            "PROMETHEUS_MULTIPROC_DIR is set, but it was not when prometheus_client was first imported: its "
            "values live in this process only. Put the variable in the environment before the server "
            "starts (the systemd unit's Environment=, the shell that runs gunicorn), not in Python code "
            "(docs/operations.md#metrics-and-alerts)."
        )
    if not directory or not os.path.isdir(directory) or not os.access(directory, os.W_OK | os.X_OK):
        raise ConfigurationError(
            f"PROMETHEUS_MULTIPROC_DIR={directory!r} is not a directory this process can write: create it "
            "(empty) before the server starts (docs/operations.md#metrics-and-alerts)."
        )


def _require_prometheus() -> None:
    if not PROMETHEUS:
        raise ConfigurationError(
            "Prometheus metrics need the prometheus_client package: "
            'pip install "flask-bnpl-gateway[metrics]" (or prometheus_client itself).'
        )
