"""The example shop as gunicorn serves it in the reliability tests, plus a durable signal counter and a
receiver that can be made to fail.

``gunicorn tests.reliability.shop_wsgi:app``: the unchanged shop (``example_shop.create_app()``, configured by
the environment), and one receiver per extension signal that inserts a row into ``reliability_signals``
(on a connection of its own, committed at once). The tests count those rows: how often each signal was sent
for an order, across every worker process, never from log lines.

The shop's fulfilment (``example_shop.models.on_payment_confirmed``) is wrapped by :func:`fulfil_or_fail`:
while a test has switched failures on (the one row of ``reliability_receiver_faults``: a seed, a rate and
the attempts that may fail), a seeded share of the deliveries of ``payment_confirmed`` raise
:class:`InjectedReceiverFailure` before the shop's receiver runs. Whether a delivery fails depends only on
the seed, the outbox event's id and the attempt (:func:`injected`): a retry of the same event can succeed,
and a run is replayed with its seed. Blinker calls a signal's receivers in no guaranteed order, hence a
wrapper in place of the shop's receiver rather than a failing receiver connected before it. Every delivery
the wrapper sees is a row of ``reliability_receiver_calls`` (the event, its attempt, injected or not, and
which process delivered it: ``RELIABILITY_PROCESS``, ``server`` unless a test's subprocess says
``deliver`` or ``reconcile``). With failures off (every other test) the wrapper only calls the shop.

The CLI subprocesses of a test (``flask --app tests.reliability.shop_wsgi:app gateway deliver``) load this
same module, as cron runs the same app as the server: the failing receiver is there too.

Nothing here touches the database at import (a worker that boots while PostgreSQL is down must boot, like the
shop it wraps): the tables are made by the deployment's step, run before the servers start
(``conftest.init_shop_database``): the shop's ``flask ... shop init-db`` and this module's
``flask --app tests.reliability.shop_wsgi:app reliability init-db``. Under gunicorn, a process that has built
the app writes one line to its log (``tests.reliability.APP_LOADED`` and its pid): a worker that cannot boot
never writes it.

Callback marks (``RELIABILITY_CALLBACK_MARKS=<folder>``, the fault tests): while a worker handles a request to
the extension's callback endpoint, the file ``<folder>/<pid>-<thread>`` exists. A WSGI middleware outside the app
creates it before the app sees the request and removes it once the answer was written to the socket (the
response iterable closed), so a mark present means "this process is inside a callback, answer not yet sent":
the fault run SIGKILLs such a pid, and a mark still there after the kill proves the kill landed inside it.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Final

import click
from sqlalchemy import (
    Boolean,
    Column,
    DateTime,
    Float,
    Integer,
    MetaData,
    String,
    Table,
    create_engine,
    func,
    insert,
    select,
    text,
)

from example_shop import create_app
from example_shop.models import on_payment_confirmed
from flask_gateway import signals
from flask_gateway.core.sql import create_all_safely
from tests.reliability import APP_LOADED

#: The extension's callback endpoint (``GATEWAY_URL_PREFIX`` is the default ``/gateway``).
CALLBACK_PATH: Final = "/gateway/callback"

metadata = MetaData()
#: One row per signal sent: which signal, for which order, from which process.
signal_rows: Final = Table(
    "reliability_signals",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("signal", String(40), nullable=False),
    Column("reference", String(255), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", DateTime(timezone=True), server_default=func.now()),
)
#: At most one row: failures are on (its seed, rate, and how many first attempts of an event may fail).
receiver_faults: Final = Table(
    "reliability_receiver_faults",
    metadata,
    Column("id", Integer, primary_key=True),
    Column("seed", Integer, nullable=False),
    Column("rate", Float, nullable=False),
    Column("failing_attempts", Integer, nullable=False),
)
#: One row per delivery of ``payment_confirmed`` while failures are on.
receiver_calls: Final = Table(
    "reliability_receiver_calls",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
    Column("event_id", Integer, nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("injected", Boolean, nullable=False),
    Column("reference", String(255), nullable=False),
    Column("process", String(20), nullable=False),
    Column("pid", Integer, nullable=False),
    Column("at", DateTime(timezone=True), server_default=func.now()),
)

# No connection yet (engines connect on first use). Pre-ping: a restart of PostgreSQL leaves broken
# connections in the pool, and a counter that failed on one would fail the delivery it counts.
_engine = create_engine(os.environ["SHOP_DATABASE_URL"], pool_size=2, max_overflow=10, pool_pre_ping=True)

app = create_app()
PROCESS: Final = os.environ.get("RELIABILITY_PROCESS", "server")
if "gunicorn" in sys.modules:
    print(f"{APP_LOADED} {os.getpid()}", file=sys.stderr, flush=True)  # noqa: T201 - read by the tests


@click.group("reliability", help="The reliability tests' own tables.")
def reliability_cli() -> None:
    pass


@reliability_cli.command("init-db")
def init_db() -> None:
    """Create the tables of this module (signal counts, receiver faults and calls)."""
    create_all_safely(_engine, metadata)
    click.echo("reliability tables ready")


app.cli.add_command(reliability_cli)


class CallbackMarks:
    """WSGI middleware: ``<folder>/<pid>-<thread>`` exists while that thread handles a callback (module
    docstring)."""

    def __init__(self, wsgi_app: Callable[..., Iterable[bytes]], folder: Path) -> None:
        self.wsgi_app = wsgi_app
        self.folder = folder

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ.get("PATH_INFO") != CALLBACK_PATH:
            return self.wsgi_app(environ, start_response)
        # One file per request (a threaded worker may handle several callbacks at once).
        mark = self.folder / f"{os.getpid()}-{threading.get_ident()}"
        mark.touch()
        try:
            body = self.wsgi_app(environ, start_response)
        except BaseException:
            mark.unlink(missing_ok=True)
            raise
        return self._sent(body, mark)

    @staticmethod
    def _sent(body: Iterable[bytes], mark: Path) -> Iterator[bytes]:
        # gunicorn writes each chunk before asking for the next and closes the iterable at the end (also
        # when the client went away): the ``finally`` runs once the whole answer went out.
        try:
            yield from body
        finally:
            close = getattr(body, "close", None)
            try:
                if close is not None:
                    close()
            finally:
                mark.unlink(missing_ok=True)


if os.environ.get("RELIABILITY_CALLBACK_MARKS"):
    app.wsgi_app = CallbackMarks(app.wsgi_app, Path(os.environ["RELIABILITY_CALLBACK_MARKS"]))  # type: ignore[method-assign]


class InjectedReceiverFailure(RuntimeError):
    """What the failing receiver raises (the tests tell its tracebacks from real ones by this name)."""


def injected(seed: int, event_id: int, attempt: int, rate: float) -> bool:
    """Whether delivery ``attempt`` (1, 2, ...) of outbox event ``event_id`` fails: a seeded draw."""
    digest = hashlib.sha256(f"{seed}:{event_id}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64 < rate


def fulfil_or_fail(sender: object, checkout: Any, event_id: int | None = None, **extra: Any) -> None:
    """The shop's fulfilment, unless this delivery is one that fails (failures on, a seeded draw)."""
    failure = None
    if event_id is not None:
        with _engine.begin() as connection:
            faults = connection.execute(select(receiver_faults)).first()
            if faults is not None:
                # The attempts are counted after each delivery: this one is the next.
                attempt = 1 + int(
                    connection.scalar(
                        text("SELECT attempts FROM gateway_outbox WHERE id = :id"), {"id": event_id}
                    )
                    or 0
                )
                fails = attempt <= faults.failing_attempts and injected(
                    faults.seed, event_id, attempt, faults.rate
                )
                connection.execute(
                    insert(receiver_calls).values(
                        event_id=event_id,
                        attempt=attempt,
                        injected=fails,
                        reference=checkout.order_reference,
                        process=PROCESS,
                        pid=os.getpid(),
                    )
                )
                if fails:
                    failure = InjectedReceiverFailure(
                        f"injected: delivery {attempt} of outbox event {event_id} (seed {faults.seed})"
                    )
    if failure is not None:
        raise failure
    on_payment_confirmed(sender, checkout=checkout, event_id=event_id, **extra)


def _counter(name: str) -> Any:
    def receive(sender: object, checkout: Any, **extra: object) -> None:
        with _engine.begin() as connection:
            connection.execute(
                insert(signal_rows).values(signal=name, reference=checkout.order_reference, pid=os.getpid())
            )

    receive.__name__ = f"count_{name}"
    return receive


# Kept in a module global: blinker holds receivers weakly.
_receivers: Final = {
    name: _counter(name)
    for name in ("payment_confirmed", "checkout_cancelled", "checkout_expired", "refund_succeeded")
}
for _name, _receiver in _receivers.items():
    getattr(signals, _name).connect(_receiver)
signals.payment_confirmed.disconnect(on_payment_confirmed)
signals.payment_confirmed.connect(fulfil_or_fail)
