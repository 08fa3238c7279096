"""Background work on a Celery task queue: outbox delivery and reconciliation (the optional ``tasks`` extra).

Two tasks, named for the beat schedule and for ``send_task`` from anywhere:

- ``flask_gateway.deliver_outbox`` (:data:`DELIVER_OUTBOX`): delivers the outbox events that are due
  (:func:`flask_gateway.payments.outbox.deliver_due`), one claim per event, so each event's lease starts when
  its own delivery does. Beat sends it every 5 s: an event whose delivering worker died is free 10 s after the
  death (the lease, renewed only while the delivery lives), and delivered by the next tick, so within
  15 s. A tick finding nothing due is one indexed query. It fails only when the database does: a receiver
  that raised is the outbox's business (logged, counted, due again later, dead after the last attempt).
- ``flask_gateway.reconcile`` (:data:`RECONCILE`): one reconciliation run
  (:func:`flask_gateway.operations.reconciliation.reconcile`, its keyword arguments too); it fails, with the
  run's summary, when a checkout could not be polled (the next run tries again). Beat's run asks about the
  checkouts due (``GATEWAY_RECONCILE_AFTER_SECONDS``); ``send_task(RECONCILE, kwargs={"older_than_seconds":
  0})`` asks about every open checkout now (those not polled in the last minute).
- ``flask_gateway.check_settings`` (:data:`CHECK_SETTINGS`): the gateway's settings compared with the shop's
  and put back (:func:`flask_gateway.operations.drift.scheduled_check`), at most once per
  ``GATEWAY_SETTINGS_CHECK_SECONDS`` whichever worker runs it; beat sends it every
  ``GATEWAY_SETTINGS_CHECK_SECONDS`` (:func:`celery_init_app` reads the app's value). It fails when an
  account could not be checked or a repair failed.

Flask's own pattern ("Background Tasks with Celery" in Flask's documentation): every task runs inside
``app.app_context()``, through a ``Task`` subclass. :func:`celery_init_app` is that pattern with the
gateway's tasks, the reliability settings (:data:`RELIABILITY`) and the beat schedule (:data:`BEAT_SCHEDULE`);
:func:`register_tasks` adds the two tasks to a Celery app the shop already has.

What makes it safe to kill a worker at any moment (docs/operations.md#background-work-on-a-task-queue):
a task is acknowledged only once it has run (``acks_late``) and given back to the queue when its worker
process dies (``reject_on_worker_lost``); the outbox's rows are claimed ``FOR UPDATE SKIP LOCKED`` and
leased (:data:`flask_gateway.payments.outbox.CLAIM_LEASE`, renewed while the receivers run), so two workers
never deliver one event at once, and a worker that dies leaves its event to the first tick after the lease
(within 15 s of the death); the receivers' ``event_id``
covers an event delivered again. A lost task message loses nothing: the work is in the database, and the
next beat tick finds it.

A worker that loses Redis retries for as long as it takes (``broker_connection_max_retries = None``;
Celery's default gives up after 100 attempts and the worker exits) and goes on when Redis is back.

``celery`` is imported here only: ``pip install "flask-bnpl-gateway[tasks]"`` (Celery with the Redis client).
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from flask import Flask, current_app, has_app_context

from flask_gateway.errors import ConfigurationError
from flask_gateway.operations.drift import scheduled_check
from flask_gateway.operations.reconciliation import reconcile
from flask_gateway.payments.heartbeats import record_run
from flask_gateway.payments.outbox import DeliveryReport, deliver_due
from flask_gateway.state import get_state

try:
    from celery import Celery, Task
    from celery.beat import PersistentScheduler
    from celery.signals import worker_process_init
except ImportError as exc:  # pragma: no cover - the optional extra is missing
    raise ImportError(
        "flask_gateway.tasks needs Celery: pip install 'flask-bnpl-gateway[tasks]' "
        "(Celery with the Redis client)"
    ) from exc

__all__ = [
    "BEAT_SCHEDULE",
    "BEAT_SCHEDULE_FILE",
    "CHECK_SETTINGS",
    "DELIVER_EVERY",
    "DELIVER_LIMIT",
    "DELIVER_OUTBOX",
    "RECONCILE",
    "RELIABILITY",
    "GatewayTasks",
    "InstanceFolderScheduler",
    "celery_init_app",
    "register_tasks",
]

#: The task that delivers the outbox's due events.
DELIVER_OUTBOX: Final = "flask_gateway.deliver_outbox"
#: The task that runs reconciliation once.
RECONCILE: Final = "flask_gateway.reconcile"
#: The task that compares the gateway's settings with the shop's and puts the shop's back.
CHECK_SETTINGS: Final = "flask_gateway.check_settings"
#: Events one ``deliver_outbox`` task delivers at most; the next tick takes the rest.
DELIVER_LIMIT: Final = 100

#: Seconds between two ``deliver_outbox`` ticks. With the outbox's 10 s lease, an event whose delivering
#: worker died is delivered within 15 s of the death. Cheap when nothing is due: one indexed query.
DELIVER_EVERY: Final = 5.0

#: Beat's schedule for the three tasks: delivery every :data:`DELIVER_EVERY` s, reconciliation every 5
#: minutes, the settings check every 5 minutes (``celery_init_app``: every ``GATEWAY_SETTINGS_CHECK_SECONDS``
#: of the app). A tick that waited longer than its interval in the queue (the workers were busy or down) is
#: dropped (``expires``): the next one does the same work, so ticks never pile up behind a slow run.
BEAT_SCHEDULE: Final[Mapping[str, Mapping[str, Any]]] = {
    "flask-gateway-deliver-outbox": {
        "task": DELIVER_OUTBOX,
        "schedule": DELIVER_EVERY,
        "options": {"expires": DELIVER_EVERY},
    },
    "flask-gateway-reconcile": {"task": RECONCILE, "schedule": 300.0, "options": {"expires": 300.0}},
    "flask-gateway-check-settings": {
        "task": CHECK_SETTINGS,
        "schedule": 300.0,
        "options": {"expires": 300.0},
    },
}

#: The Celery settings a worker needs to lose nothing when it is killed (docs/operations.md explains each).
RELIABILITY: Final[Mapping[str, Any]] = {
    # Acknowledged once the task has run, not when a worker takes it: a killed worker's task is not lost.
    "task_acks_late": True,
    # A pool process that dies (SIGKILL, out of memory) gives its task back to the queue.
    "task_reject_on_worker_lost": True,
    # A worker holds one task beyond those it runs: a busy or stuck worker does not sit on the others'.
    "worker_prefetch_multiplier": 1,
    # Redis gives an unacknowledged task to another worker after this long (a worker that vanished). Far
    # longer than any run of these tasks; their work is leased in the database anyway (10 s, renewed).
    "broker_transport_options": {"visibility_timeout": 3600},
    # The broker connection lost: stop the running late-acknowledged tasks, Redis gives them out again.
    "worker_cancel_long_running_tasks_on_connection_loss": True,
    # A worker that starts before Redis does waits for it (and says so) rather than exiting.
    "broker_connection_retry_on_startup": True,
    # A worker that loses Redis retries for as long as it takes (Celery's default gives up after 100
    # attempts, about an hour and a half, and the worker then exits): it reconnects when Redis is back.
    "broker_connection_max_retries": None,
    # Nothing reads the results: their summaries are in the worker's log.
    "task_ignore_result": True,
}


#: Beat's schedule file (its record of when each entry last ran), in the Flask app's instance folder.
BEAT_SCHEDULE_FILE: Final = "celerybeat-schedule"


class InstanceFolderScheduler(PersistentScheduler):  # type: ignore[misc]  # celery is untyped
    """Celery's default scheduler (``PersistentScheduler``), making its schedule file's folder (the app's
    instance folder) when beat opens the file, the first time beat starts."""

    def setup_schedule(self) -> None:
        folder = os.path.dirname(os.path.abspath(self.schedule_filename))
        os.makedirs(folder, exist_ok=True)
        super().setup_schedule()


@dataclass(frozen=True)
class GatewayTasks:
    """The tasks as registered on one Celery app (``.delay()``, ``.apply_async()``, ``.apply()``)."""

    deliver_outbox: Any
    reconcile: Any
    check_settings: Any = None


def celery_init_app(app: Flask) -> Any:
    """A Celery app for ``app``, as Flask's documentation builds one, with the gateway's tasks.

    Its configuration is :data:`RELIABILITY` and :data:`BEAT_SCHEDULE`, then ``app.config["CELERY"]`` (a
    dict of Celery's lower-case settings: ``broker_url`` at least) over them; a ``beat_schedule`` there adds
    to the gateway's entries (or replaces one of the same name). Beat keeps its schedule file
    (``beat_schedule_filename``) in the app's instance folder, :data:`BEAT_SCHEDULE_FILE`, made when beat
    starts (:class:`InstanceFolderScheduler`), unless ``CELERY`` names one (or ``beat --schedule`` does).
    Every task of it, the shop's own too, runs in ``app.app_context()``. It becomes Celery's default app
    and ``app.extensions["celery"]``; the gateway's tasks are ``celery.tasks[DELIVER_OUTBOX]``,
    ``celery.tasks[RECONCILE]`` and ``celery.tasks[CHECK_SETTINGS]`` (sent every
    ``GATEWAY_SETTINGS_CHECK_SECONDS``).
    """
    celery = Celery(app.name, task_cls=_flask_task(app, Task))
    own: dict[str, Any] = dict(app.config.get("CELERY") or {})
    schedule = {**BEAT_SCHEDULE, **_settings_entry(app), **own.pop("beat_schedule", {})}
    beat_files = {
        # Beat's record of the last runs: in the app's instance folder, not the working directory
        # (made when beat starts, not here: nothing at init touches the disk).
        "beat_schedule_filename": os.path.join(app.instance_path, BEAT_SCHEDULE_FILE),
        "beat_scheduler": InstanceFolderScheduler,
    }
    celery.config_from_object({**RELIABILITY, **beat_files, **own, "beat_schedule": schedule})
    celery.set_default()
    app.extensions["celery"] = celery
    _fresh_connections_after_fork(app)
    _define(celery, base=None)  # its task class is Flask's already
    return celery


def _settings_entry(app: Flask) -> dict[str, Mapping[str, Any]]:
    """Beat's settings check entry, every ``GATEWAY_SETTINGS_CHECK_SECONDS`` of ``app`` (the default when
    the extension is not set up on it yet: its tasks then say so when they run)."""
    try:
        every = float(get_state(app).config.settings_check_seconds)
    except ConfigurationError:
        return {}
    entry = BEAT_SCHEDULE["flask-gateway-check-settings"]
    return {"flask-gateway-check-settings": {**entry, "schedule": every, "options": {"expires": every}}}


def register_tasks(celery: Any, app: Flask | None = None) -> GatewayTasks:
    """Define ``flask_gateway.deliver_outbox``, ``flask_gateway.reconcile`` and
    ``flask_gateway.check_settings`` on the Celery app ``celery``.

    With ``app`` the tasks run in its app context, and each worker process forked by Celery's pool starts
    with fresh database connections (never one inherited from the parent). Without it they run in the app
    context the Celery app's own task class gives (Flask's ``FlaskTask``) and fail, saying so, outside one.
    The reliability settings are set on the tasks themselves (``acks_late``, ``reject_on_worker_lost``);
    the worker's (:data:`RELIABILITY`: prefetch, visibility timeout) are the Celery app's to set.
    """
    if app is None:
        return _define(celery, base=None)
    _fresh_connections_after_fork(app)
    return _define(celery, base=_flask_task(app, celery.Task))


def _define(celery: Any, base: type[Any] | None) -> GatewayTasks:
    options: dict[str, Any] = {
        "acks_late": True,
        "reject_on_worker_lost": True,
        "ignore_result": True,
        # Registered on this Celery app only (Celery's default would add them to every app made later).
        "shared": False,
    }
    if base is not None:
        options["base"] = base
    return GatewayTasks(
        deliver_outbox=celery.task(name=DELIVER_OUTBOX, **options)(_deliver_outbox),
        reconcile=celery.task(name=RECONCILE, **options)(_reconcile),
        check_settings=celery.task(name=CHECK_SETTINGS, **options)(_check_settings),
    )


# --- the tasks -------------------------------------------------------------------------------------------


def _deliver_outbox(limit: int = DELIVER_LIMIT) -> str:
    """Deliver up to ``limit`` due events, claiming them one at a time; the summary for the worker's log."""
    _require_app_context(DELIVER_OUTBOX)
    total = DeliveryReport()
    # One heartbeat for the task run, not one per event (the runs of deliver_due inside record nothing).
    with record_run("deliver") as run:
        for _ in range(limit):
            # One event per claim: its lease starts when its own delivery does, not when a batch was taken,
            # so slow receivers early in a batch never let a later event's lease run out while it waits.
            report = deliver_due(1)
            if not (report.delivered or report.failed):
                break
            total.delivered += report.delivered
            total.failed += report.failed
            total.dead += report.dead
            total.errors.extend(report.errors)
        run.done(str(total), failed=bool(total.errors))
    return f"Outbox: {total}."


def _reconcile(**options: Any) -> str:
    """One reconciliation run (``options``: the keywords of
    :func:`~flask_gateway.operations.reconciliation.reconcile`)."""
    _require_app_context(RECONCILE)
    report = reconcile(**options)
    summary = report.summary()
    if report.errors:  # the task is recorded as failed (and logged); the next run tries again
        raise RuntimeError(summary)
    return summary


def _check_settings(force: bool = False) -> str:
    """The scheduled settings check (:func:`~flask_gateway.operations.drift.scheduled_check`): nothing when
    another run checked within ``GATEWAY_SETTINGS_CHECK_SECONDS``; its summary for the worker's log."""
    _require_app_context(CHECK_SETTINGS)
    result = scheduled_check(force=force)
    summary = result.summary()
    if result.failed:  # recorded as failed (and logged); the next tick tries again
        raise RuntimeError(summary)
    return summary


# --- Flask's pattern -------------------------------------------------------------------------------------


def _flask_task(app: Flask, base: type[Any]) -> type[Any]:
    """Flask's ``FlaskTask``: a Task subclass whose every run is inside ``app.app_context()``."""

    class FlaskTask(base):  # type: ignore[misc]  # celery is untyped
        def __call__(self, *args: object, **kwargs: object) -> object:
            with app.app_context():
                return self.run(*args, **kwargs)

    return FlaskTask


def _require_app_context(task: str) -> None:
    if not has_app_context():
        raise RuntimeError(
            f"{task} ran outside a Flask app context: register it with register_tasks(celery, app), or "
            "give the Celery app Flask's FlaskTask (celery_init_app does both)"
        )
    get_state(current_app)  # the extension is set up on this app (a clear error otherwise)


#: The apps whose engines are renewed in each forked pool process.
_FORK_SAFE: weakref.WeakSet[Flask] = weakref.WeakSet()


def _fresh_connections_after_fork(app: Flask) -> None:
    """After Celery's prefork pool forks a worker process: drop the pooled connections it inherited.

    A connection opened by the parent (the app's factory created tables, say) must not be used by two
    processes at once; ``dispose(close=False)`` forgets them in the child without touching them
    (SQLAlchemy's recipe for ``os.fork``), and the child opens its own.
    """
    if app in _FORK_SAFE:
        return
    _FORK_SAFE.add(app)
    app_ref = weakref.ref(app)  # the signal keeps the receiver for good, not the app

    def renew(**_signal: object) -> None:
        forked = app_ref()
        if forked is None:
            return
        with forked.app_context():
            state = get_state(forked)
            engines = {id(engine): engine for engine in (*state.db.engines.values(), state.engine)}
            for engine in engines.values():
                engine.dispose(close=False)

    # Held strongly by the signal (the closure would otherwise be collected at once).
    worker_process_init.connect(renew, weak=False)
