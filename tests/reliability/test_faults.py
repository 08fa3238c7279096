"""Faults an operator meets (issue 23): PostgreSQL restarted under load, shop workers killed while handling
callbacks, workers booting while the database is away, a worker stopped mid-callback.

Each test runs its own stack (``conftest.plan_stack``/``launch``: the example shop under gunicorn with 4
*sync* workers, one request at a time each, and the emulator under gunicorn) on a PostgreSQL cluster of this
module that keeps what it acknowledged (``start_cluster(durable=True)``: fsync and synchronous commit on) and
that the tests stop and restart; the session's cluster is never touched. All HTTP goes through ``requests``
to the real processes; counts come from the databases.

- ``test_fault_run_loses_nothing``: the fault run. 60 shoppers, 8 at a time, each fills a cart, checks out
  and pays on the emulator's page (half come back to the shop, half close the browser). PostgreSQL is
  restarted with ``pg_ctl restart -m fast`` once a third of them have paid and ``-m immediate`` (a crash:
  recovery at start) at two thirds. Meanwhile, every 0.3-1 s, a shop worker is SIGKILLed *while it handles a
  callback from the emulator*: ``shop_wsgi.CallbackMarks`` keeps a file ``<pid>-<thread>`` while a request to
  ``/gateway/callback`` is inside that process (created before the app sees it, removed once the answer was
  written), the killer polls that folder every 2 ms and kills a pid it finds there (only a child of the shop's
  gunicorn master). A mark still present once the process is dead proves the kill landed inside the callback;
  the figures say how many did (at least one must). The shop's outbox service runs throughout, as
  docs/operations.md sets it up for a shop without a task queue (``flask gateway deliver --every 5``): once the shoppers are done, the test
  waits until it has delivered every pending event (those a killed worker had claimed, once their lease is
  over), with no cron. Then ``flask gateway deliver`` and ``flask gateway reconcile`` run, as cron would
  (reconciliation confirms what no callback told; the gateway's callbacks still pending are not waited
  for). Asserted: every checkout paid at the gateway is fulfilled exactly once (none twice, none never), no
  outbox event is left, every 5xx a client got is a 503 with ``Retry-After`` (the shop's 502 "we couldn't
  reach the payment provider" on ``POST /checkout`` apart), each outage got some, and none is a 500 (nor in
  the servers' access logs), no 5xx once the database answered again but a client's first request after it
  (the "first retry"), no request unanswered but one in flight while a kill happened, no traceback in the
  servers' logs (an outage is one line when it starts and one when it ends), and the shop serves again
  without a person after each return of the database (the prober, ``/gateway/readyz`` and an order's
  ``status.json`` in turn every 50 ms, got a 200 of each after it): its gunicorn master is the one started,
  with its 4 workers. How long the outbox and the return took is ``benchmarks/figure_recovery.py``'s
  figures (``fault_scenario`` returns them), not assertions. The shop runs with ``--preload`` here (see the
  test).
- ``test_boot_while_the_database_is_away`` (``test_boot_without_database.py``, on a cluster of its own):
  both servers started while PostgreSQL is stopped; their masters stay up, the liveness endpoints answer
  200, a shopper page and the readiness endpoints answer 503 with ``Retry-After``; a worker SIGKILLed
  meanwhile is replaced and loads the app; PostgreSQL started: the shop serves and turns ready (an order
  placed and paid), the same masters, no restart.
- ``test_sigterm_mid_callback_finishes_it``: the emulator's ``getstatus`` is delayed 2 s (a fault rule), so the
  callback of a payment waits inside the shop for its confirmation; once the emulator has taken the rule
  (the getstatus is being held), the worker handling the callback gets SIGTERM
  (gunicorn's graceful stop: ``--graceful-timeout`` 5 s), finishes the callback and answers it 200 (the
  emulator's first and only attempt: ok), the order is paid and fulfilled once, and the master replaces the
  worker. Then the same with SIGTERM to the master (the whole shop stops gracefully): the callback in hand is
  answered 200 before it exits.

Every wait is for an event (a row, a log line, a process, an answer), with a last-resort deadline whose
failure names what it waited for and shows the servers' last log lines. Figures are printed as
``[reliability] ...`` lines (``pytest tests/reliability -s``, or always: the ``report`` fixture). The plan of
the fault run (which shopper comes back, the kills' intervals) is seeded: ``RELIABILITY_SEED=<n>``; which
request meets a fault depends on timing, by design.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final
from urllib.parse import urljoin, urlsplit

import psycopg
import pytest
import requests

from flask_gateway.operations.reconciliation.claiming import CLAIM_LEASE_SECONDS
from flask_gateway.payments.outbox import CLAIM_LEASE
from tests.conftest import fetch_all, selected_backends
from tests.postgres import PostgresCluster, ShutdownMode, start_cluster
from tests.processes import child_pids, is_alive, wait_for
from tests.reliability.conftest import (
    GRACEFUL_TIMEOUT,
    ROOT,
    SHOP_APP,
    Stack,
    StackPlan,
    init_shop_database,
    launch,
    plan_stack,
)
from tests.reliability.support import (
    add_fault,
    checkout_fields,
    control_get,
    csrf_token,
    forms,
    fulfilment_counts,
    gateway_command,
    token_of,
    traceback_spans,
    tracebacks,
)

# Every test here starts servers and stops or restarts this module's cluster: one pytest-xdist worker runs
# them one after the other, and starts the cluster once (``--dist loadgroup``).
pytestmark = pytest.mark.xdist_group("faults")

SEED: Final = int(os.environ.get("RELIABILITY_SEED", "20261126"))
#: Shoppers of the fault run: a restart of each kind lands among them (a third and two thirds in) and a worker
#: is killed inside a callback every 0.3-1 s while they shop (some 30 kills). Twice as many proved the same
#: thing in twice the time.
SHOPPERS: Final = 60
AT_ONCE: Final = 8
SHOP_WORKERS: Final = 4
#: ``pg_ctl restart`` once this many shoppers have paid, and with which shutdown mode.
RESTARTS: Final[tuple[tuple[int, ShutdownMode], ...]] = (
    (SHOPPERS // 3, "fast"),
    (2 * SHOPPERS // 3, "immediate"),
)
#: A shop worker handling a callback is SIGKILLed this often (seconds, drawn uniformly).
KILL_EVERY: Final = (0.3, 1.0)
#: The emulator's callback retries (seconds): five attempts over 15 s, longer than an outage.
CALLBACK_RETRY_DELAYS: Final = "1,2,4,8"
#: ``flask gateway deliver --every`` (seconds): the shop's outbox service during the run (docs/operations.md).
DELIVER_EVERY: Final = 5
#: The last resort of the wait for the outbox service to deliver every event of the run. On a quiet machine
#: it takes at most a lease and a round (docs/operations.md: a dead worker's event is free once its lease is
#: over, and the service's next round delivers it); this is ten times that. How long it really takes is
#: ``benchmarks/figure_recovery.py``'s figure, not this test's.
OUTBOX_DEADLINE: Final = 10 * (CLAIM_LEASE.total_seconds() + DELIVER_EVERY)
#: A shopper who got a 5xx or no answer tries again after this long (a person reloading the page; the
#: 503's Retry-After says 5 s, the prober measures the exact return).
RELOAD_AFTER: Final = 0.5
#: A shopper gives up on a step after this many tries (the test then fails: a shop that does not come back).
MAX_TRIES: Final = 60
PRODUCTS: Final = ("enamel-kettle", "stoneware-mugs", "ilala-basket", "mohair-throw", "brass-desk-lamp")
GATEWAY_PAID: Final = frozenset({"PAID", "PAID_PENDING_CALLBACK", "PARTIALLY_REFUNDED", "FULLY_REFUNDED"})
#: The log lines of ``flask_gateway.core.outages.OutageWatch`` (one when an outage starts, one when it ends).
OUTAGE_STARTS: Final = "the database is unreachable"
OUTAGE_ENDS: Final = "the database answers again"
_ACCESS: Final = re.compile(r"^ACCESS (\d{3}) (\S+) (\S+)", re.M)


# --- the cluster and the stacks ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def durable_cluster(request: pytest.FixtureRequest) -> Iterator[PostgresCluster]:
    """This module's PostgreSQL: fsync on, stopped and restarted by the tests (never the session's)."""
    if "postgresql" not in selected_backends(request.config):
        pytest.skip("the fault tests run on PostgreSQL only, and --database=sqlite was chosen")
    try:
        cluster = start_cluster(durable=True)
    except RuntimeError as exc:
        pytest.fail(f"The fault tests cannot start PostgreSQL: {exc}", pytrace=False)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster(durable_cluster: PostgresCluster) -> Iterator[PostgresCluster]:
    """The module's cluster, running before the test and again after it (whatever the test did to it)."""
    if not durable_cluster.is_running():
        durable_cluster.start_server()
    yield durable_cluster
    if not durable_cluster.is_running():
        durable_cluster.start_server()


@contextmanager
def running(
    plan: StackPlan, log_dir: Path, cluster: PostgresCluster, *, preload: bool = False
) -> Iterator[Stack]:
    """The stack of ``plan`` under gunicorn (the shop with ``SHOP_WORKERS`` sync workers), stopped and its
    databases dropped afterwards. ``preload``: gunicorn's ``--preload`` for the shop (see the fault run)."""
    stack = launch(plan, log_dir, shop_workers=SHOP_WORKERS, shop_threads=1, shop_preload=preload)
    try:
        yield stack
    finally:
        stack.shop.stop()
        stack.emulator.stop()
        if cluster.is_running():
            for url in (plan.shop_db, plan.emulator_db):
                cluster.drop_database(url.rsplit("/", 1)[1], wait=False)


def fault_plan(cluster: PostgresCluster, marks: Path, **emulator_env: str) -> StackPlan:
    """A stack on ``cluster`` whose shop marks the callbacks it handles in ``marks``."""
    return plan_stack(
        cluster,
        emulator_env={"EMULATOR_CALLBACK_RETRY_DELAYS": CALLBACK_RETRY_DELAYS, **emulator_env},
        shop_env={"RELIABILITY_CALLBACK_MARKS": str(marks)},
    )


def database_answers(cluster: PostgresCluster) -> bool:
    try:
        with psycopg.connect(
            host="127.0.0.1", port=cluster.port, user=cluster.user, dbname="postgres", connect_timeout=2
        ) as connection:
            connection.execute("SELECT 1")
        return True
    except psycopg.Error:
        return False


def workers_of(server_process: Any) -> list[int]:
    return child_pids(int(server_process.pid))


def ready(stack: Stack, expected_workers: int = SHOP_WORKERS) -> None:
    """The shop's master runs its workers and the shop is ready (installed, on its schema). A shopper page
    first: it installs the shop on first use (``SHOP_AUTO_INSTALL``); the probes never do."""
    wait_for(
        lambda: len(workers_of(stack.shop.process)) == expected_workers,
        what=f"{expected_workers} shop workers",
        logs=[stack.shop],
    )

    def is_ready() -> bool:
        try:
            requests.get(f"{stack.shop.url}/", timeout=30)
            return requests.get(f"{stack.shop.url}/gateway/readyz", timeout=30).status_code == 200
        except requests.RequestException:
            return False

    wait_for(
        is_ready,
        interval=0.2,
        what="the shop's readiness (installed on first use by a shopper page)",
        logs=[stack.shop, stack.emulator],
    )


# --- HTTP exchanges, timed ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Exchange:
    """One HTTP request a client (a shopper, the prober) made, and what came of it."""

    client: str
    server: str  # "shop" or "emulator"
    method: str
    path: str
    sent: float  # time.monotonic()
    answered: float
    status: int | None  # None: no answer (connection refused or reset, timeout)
    retry_after: str | None
    error: str = ""


@dataclass
class Exchanges:
    """Every exchange of the run (thread safe), and the database's outages as the test caused them."""

    servers: dict[str, str]  # base URL -> name
    lock: threading.Lock = field(default_factory=threading.Lock)
    items: list[Exchange] = field(default_factory=list)
    #: (mode, down: before pg_ctl was called, up: the database answered again), time.monotonic().
    outages: list[tuple[str, float, float]] = field(default_factory=list)

    def send(
        self, client: str, session: requests.Session, method: str, url: str, **kwargs: Any
    ) -> requests.Response | None:
        """One request (redirects not followed); None when no answer came."""
        server = next(name for base, name in self.servers.items() if url.startswith(base))
        sent = time.monotonic()
        try:
            answer = session.request(method, url, allow_redirects=False, timeout=30, **kwargs)
        except requests.RequestException as exc:
            self._add(
                Exchange(
                    client,
                    server,
                    method,
                    urlsplit(url).path,
                    sent,
                    time.monotonic(),
                    None,
                    None,
                    type(exc).__name__,
                )
            )
            return None
        self._add(
            Exchange(
                client, server, method, urlsplit(url).path, sent, time.monotonic(), answer.status_code,
                answer.headers.get("Retry-After"),
            )
        )  # fmt: skip
        return answer

    def _add(self, exchange: Exchange) -> None:
        with self.lock:
            self.items.append(exchange)

    def during_outage(self, exchange: Exchange) -> bool:
        """The request was in flight (or sent) while the database was away."""
        return any(exchange.sent <= up and exchange.answered >= down for _mode, down, up in self.outages)

    def since_return(self, exchange: Exchange) -> float | None:
        """Seconds from the database's last return to the sending of ``exchange`` (None: no outage before)."""
        ups = [up for _mode, _down, up in self.outages if up < exchange.sent]
        return exchange.sent - max(ups) if ups else None


def is_server_error(exchange: Exchange) -> bool:
    return exchange.status is not None and exchange.status >= 500


def checkout_502(exchange: Exchange) -> bool:
    """The shop's "we couldn't reach the payment provider" page (its create met the gateway's outage)."""
    return (exchange.server, exchange.status, exchange.method, exchange.path) == (
        "shop",
        502,
        "POST",
        "/checkout",
    )


# --- the shopper -------------------------------------------------------------------------------------------


@dataclass
class Purchase:
    number: int
    product: str
    come_back: bool
    token: str = ""
    reference: str = ""
    #: Wall-clock time (time.time()) of the emulator's answer to Pay: the payment is committed.
    paid_at: float = 0.0
    tries: int = 0
    #: The order page the shopper came back to (``/orders/view/<signed reference>``).
    order_page: str = ""


@dataclass
class Shopper:
    """A browser (its cookies) whose every request is timed in ``exchanges``; a step is tried again (after
    ``RELOAD_AFTER``) while it gets a 5xx or no answer, as a person reloads the page."""

    name: str
    exchanges: Exchanges
    shop_url: str
    session: requests.Session = field(default_factory=requests.Session)

    def until_answered(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        for _ in range(MAX_TRIES):
            answer = self.exchanges.send(self.name, self.session, method, url, **kwargs)
            if answer is not None and answer.status_code < 500:
                return answer
            time.sleep(RELOAD_AFTER)
        raise AssertionError(
            f"{self.name}: {method} {url} got no answer but 5xx or none in {MAX_TRIES} tries"
        )

    def follow(self, answer: requests.Response) -> requests.Response:
        """Follow redirects (GET), each hop tried until answered."""
        hops = 0
        while answer.is_redirect and hops < 10:
            answer = self.until_answered("GET", urljoin(answer.url, answer.headers["Location"]))
            hops += 1
        return answer


def shop(
    purchase: Purchase,
    exchanges: Exchanges,
    stack: Stack,
    paid: Callable[[Purchase], None],
    came_back: Callable[[Purchase], None] = lambda _p: None,
) -> Purchase:
    """Cart, checkout form, Pay on the emulator's page; then back to the shop, or the browser closed."""
    shopper = Shopper(f"shopper-{purchase.number}", exchanges, stack.shop.url)
    base = stack.shop.url
    page = shopper.until_answered("GET", f"{base}/products/{purchase.product}")
    assert page.status_code == 200, (page.status_code, page.url)
    added = shopper.until_answered(
        "POST",
        f"{base}/cart/add/{purchase.product}",
        data={"csrf_token": csrf_token(page.text), "quantity": "1"},
    )
    assert added.is_redirect, added.status_code
    form_page = shopper.until_answered("GET", f"{base}/checkout")
    assert form_page.status_code == 200, form_page.status_code
    form = checkout_fields(form_page.text)
    # The same form (its attempt id) until the shop hands out a checkout: a resubmit never makes a second one.
    submitted = None
    for _ in range(MAX_TRIES):
        purchase.tries += 1
        submitted = shopper.until_answered("POST", f"{base}/checkout", data=form)
        if submitted.status_code == 303:
            break
        assert submitted.status_code == 200, (submitted.status_code, submitted.text[:300])
        time.sleep(RELOAD_AFTER)  # the form again, with "please try again": submitted again
    assert submitted is not None and submitted.status_code == 303, f"{shopper.name}: no checkout"
    payment_url = urljoin(f"{base}/", submitted.headers["Location"])
    purchase.token = token_of(payment_url)
    path = urlsplit(payment_url).path
    root = payment_url[: -len(path)]
    for _ in range(MAX_TRIES):
        page = shopper.until_answered("GET", payment_url)
        assert page.status_code == 200, (page.status_code, payment_url)
        token = forms(page.text).get(f"{path}/pay")
        if token is None:  # paid by an earlier click whose answer was lost
            assert control_get(stack, f"checkouts/{purchase.token}")["checkoutPaymentStatus"] in GATEWAY_PAID
            break
        answer = shopper.exchanges.send(
            shopper.name, shopper.session, "POST", f"{root}{path}/pay", data={"csrf_token": token}
        )
        if answer is not None and answer.status_code == 303:
            break
        assert answer is None or answer.status_code >= 500, (answer.status_code, answer.text[:300])
        time.sleep(RELOAD_AFTER)
    else:
        raise AssertionError(f"{shopper.name}: could not pay")
    purchase.paid_at = time.time()
    paid(purchase)
    if purchase.come_back and answer is not None:
        back = shopper.follow(answer)
        assert back.status_code == 200 and "/orders/view/" in back.url, (back.status_code, back.url)
        purchase.order_page = back.url
        came_back(purchase)
    return purchase


# --- the fault makers ---------------------------------------------------------------------------------------


@dataclass
class Kill:
    pid: int
    #: time.monotonic() right before ``os.kill`` and right after it: the kill happened in between.
    before: float
    at: float
    #: The process died with its callback mark in place: killed inside the callback, before its answer.
    inside_callback: bool


class CallbackKiller(threading.Thread):
    """Every 0.3-1 s (seeded), SIGKILL a shop worker that is handling a callback (its mark is in ``marks``)."""

    def __init__(self, master_pid: int, marks: Path, rng: random.Random) -> None:
        super().__init__(name="callback-killer", daemon=True)
        self.master_pid = master_pid
        self.marks = marks
        self.rng = rng
        self.kills: list[Kill] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.wait(self.rng.uniform(*KILL_EVERY)):
            while not self.stopping.is_set():
                pid = self._one_in_a_callback()
                if pid is not None and self._kill(pid):
                    break
                time.sleep(0.002)

    def _one_in_a_callback(self) -> int | None:
        marked = {int(mark.name.split("-", 1)[0]) for mark in self.marks.iterdir()}
        # Only the shop master's own workers (a stale mark's pid may have been reused by anything).
        candidates = sorted(marked & set(child_pids(self.master_pid)))
        return self.rng.choice(candidates) if candidates else None

    def _kill(self, pid: int) -> bool:
        """SIGKILL ``pid`` if it is still inside its callback (looked at again right before: the worker may
        have answered meanwhile and taken a shopper's request). A few microseconds remain between that look
        and the kill: ``Kill.inside_callback`` says whether the kill landed inside."""
        if not any(self.marks.glob(f"{pid}-*")):
            return False
        before = time.monotonic()
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        at = time.monotonic()
        deadline = at + 5
        while is_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.001)
        stale = list(self.marks.glob(f"{pid}-*"))
        self.kills.append(Kill(pid, before, at, inside_callback=bool(stale)))
        for mark in stale:
            mark.unlink(missing_ok=True)
        return True


class Prober(threading.Thread):
    """Every 50 ms, in turn: the shop's readiness, and an order's ``status.json`` (the order page's poll, a
    shopper's request that reads the database) once a shopper came back to an order page (``pages``)."""

    def __init__(self, exchanges: Exchanges, shop_url: str, pages: list[str]) -> None:
        super().__init__(name="prober", daemon=True)
        self.exchanges = exchanges
        self.shop_url = shop_url
        self.pages = pages
        self.stopping = threading.Event()

    def run(self) -> None:
        sessions = {"readyz": requests.Session(), "page": requests.Session()}
        turn = 0
        while not self.stopping.wait(0.05):
            turn += 1
            if turn % 2 or not self.pages:
                self.exchanges.send(
                    "prober-readyz", sessions["readyz"], "GET", f"{self.shop_url}/gateway/readyz"
                )
            else:
                self.exchanges.send("prober-page", sessions["page"], "GET", f"{self.pages[0]}/status.json")


def restart_database(cluster: PostgresCluster, mode: ShutdownMode, exchanges: Exchanges) -> None:
    down = time.monotonic()
    cluster.restart(mode)
    wait_for(
        lambda: database_answers(cluster),
        interval=0.01,
        what="PostgreSQL after its restart",
        logs=[cluster.root / "log"],
    )
    with exchanges.lock:
        exchanges.outages.append((mode, down, time.monotonic()))


# --- the fault run ---------------------------------------------------------------------------------------------


def test_fault_run_loses_nothing(
    cluster: PostgresCluster, tmp_path: Path, report: Callable[[str], None]
) -> None:
    fault_scenario(cluster, tmp_path, report)


@dataclass(frozen=True)
class FaultRunFigures:
    """How long things took in a fault run: reported, never asserted (``benchmarks/figure_recovery.py``
    holds them against their targets)."""

    #: (shutdown mode, seconds PostgreSQL was away) per restart.
    outages: list[tuple[str, float]]
    #: (shutdown mode, seconds from the database's return to the shop serving an order's status.json, to
    #: its readyz answering 200) per restart.
    returns: list[tuple[str, float | None, float | None]]
    #: Every outbox event of the run: (kind, attempts, seconds from its writing to its delivery).
    outbox_waits: dict[int, tuple[str, int, float]]
    shopping_seconds: float


def fault_scenario(cluster: PostgresCluster, folder: Path, report: Callable[[str], None]) -> FaultRunFigures:
    """The fault run on a stack of its own on ``cluster`` (its logs in ``folder``), every check included."""
    rng = random.Random(SEED)
    marks = folder / "callback-marks"
    marks.mkdir()
    plan = fault_plan(cluster, marks)
    init_shop_database(plan)
    # --preload: a killed worker is replaced by a fork of the master, in milliseconds. Without it every
    # replacement imports the app again (1.3-1.8 s of CPU): at a kill every 0.3-1 s, a 2-core CI machine would
    # spend the run booting workers. A worker that imports and creates the app while the database is away
    # is test_boot_while_the_database_is_away's (no --preload there).
    with running(plan, folder, cluster, preload=True) as stack:
        ready(stack)
        return fault_run(stack, cluster, marks, rng, report)


def fault_run(
    stack: Stack, cluster: PostgresCluster, marks: Path, rng: random.Random, report: Callable[[str], None]
) -> FaultRunFigures:
    started = time.monotonic()
    master = int(stack.shop.process.pid)
    stack.mark_logs()
    purchases = [Purchase(n, rng.choice(PRODUCTS), come_back=rng.random() < 0.5) for n in range(SHOPPERS)]
    exchanges = Exchanges(servers={stack.shop.url: "shop", stack.emulator.url: "emulator"})
    order_pages: list[str] = []
    paid_count = 0
    paid_lock = threading.Condition()

    def paid(purchase: Purchase) -> None:
        nonlocal paid_count
        with paid_lock:
            paid_count += 1
            paid_lock.notify_all()

    def came_back(purchase: Purchase) -> None:
        order_pages.append(purchase.order_page)

    def restarts() -> None:
        for threshold, mode in RESTARTS:

            def reached(threshold: int = threshold) -> bool:
                return paid_count >= threshold

            with paid_lock:
                if not paid_lock.wait_for(reached, timeout=300):
                    return
            restart_database(cluster, mode, exchanges)

    killer = CallbackKiller(master, marks, random.Random(rng.random()))
    prober = Prober(exchanges, stack.shop.url, order_pages)
    restarter = threading.Thread(target=restarts, name="restarts", daemon=True)
    # The shop's outbox service, as docs/operations.md sets it up for a shop without a task queue.
    outbox_log = stack.shop.log_path.with_name("deliver-every.log")
    with outbox_log.open("wb") as log:
        outbox_service = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "flask",
                "--app",
                SHOP_APP,
                "gateway",
                "deliver",
                "--every",
                str(DELIVER_EVERY),
            ],
            env={**os.environ, **stack.shop_env, "RELIABILITY_PROCESS": "deliver-every"},
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        for thread in (killer, prober, restarter):
            thread.start()
        try:
            with ThreadPoolExecutor(AT_ONCE) as pool:
                done = list(pool.map(lambda p: shop(p, exchanges, stack, paid, came_back), purchases))
        finally:
            killer.stopping.set()
            killer.join(10)
            restarter.join(120)
        shopping_seconds = time.monotonic() - started
        settle_outbox(stack, outbox_log)
        # Callbacks the gateway still has to make are not waited for: what no callback told the shop,
        # reconciliation below does (an attempt whose record step met an outage stays leased for 60 s).
        pending = len(control_get(stack, "deliveries", state="pending")["deliveries"])
    finally:
        outbox_service.send_signal(signal.SIGTERM)  # the round in progress finishes, then it stops
        try:
            outbox_service.wait(30)
        except subprocess.TimeoutExpired:
            outbox_service.kill()
            outbox_service.wait(10)
    prober.stopping.set()
    prober.join(10)
    service_output = outbox_log.read_text(errors="replace")
    assert outbox_service.returncode == 0, service_output[-3000:]
    assert len(exchanges.outages) == len(RESTARTS), exchanges.outages

    # Cron: the shop's outbox, then reconciliation, then the outbox again (what reconciliation confirmed); again
    # once the claims of the checkouts still untold have lapsed, as the next run of the schedule would.
    cli_started = time.time()
    delivered, reconciled, cron_rounds = cron_until_told(stack, [p.token for p in done])

    # --- the money --------------------------------------------------------------------------------------
    references = {
        token: str(reference)
        for token, reference in fetch_all(
            stack.shop_db,
            "SELECT token, order_reference FROM gateway_checkouts WHERE token = ANY(:t)",
            t=[p.token for p in done],
        )
    }
    assert len(references) == SHOPPERS, "a shopper's checkout is not in the shop"
    for purchase in done:
        purchase.reference = references[purchase.token]
    refs = [p.reference for p in done]
    gateway = dict(
        fetch_all(
            stack.emulator_db,
            "SELECT merchant_order_reference, status FROM emulator_checkouts WHERE merchant_order_reference = ANY(:r)",
            r=refs,
        )
    )
    paid_at_gateway = {ref for ref in refs if gateway.get(ref) in GATEWAY_PAID}
    fulfilled = fulfilment_counts(stack, refs)
    once = [ref for ref in paid_at_gateway if fulfilled[ref] == 1]
    twice = [ref for ref in refs if fulfilled[ref] > 1]
    never = [ref for ref in paid_at_gateway if fulfilled[ref] == 0]
    unpaid_fulfilled = [ref for ref in refs if ref not in paid_at_gateway and fulfilled[ref]]
    left = fetch_all(
        stack.shop_db,
        "SELECT o.id, o.kind, o.state, o.attempts FROM gateway_outbox o WHERE o.state <> 'delivered'",
    )
    # How long each event of the run waited, from its writing to its delivery (the service's, or a request's).
    outbox_waits = {
        int(event_id): (str(kind), int(attempts), epoch(delivered) - epoch(created))
        for event_id, kind, attempts, created, delivered in fetch_all(
            stack.shop_db,
            "SELECT id, kind, attempts, created_at, delivered_at FROM gateway_outbox WHERE delivered_at IS NOT NULL",
        )
    }
    fulfilled_at = {
        str(ref): at
        for ref, at in fetch_all(
            stack.shop_db, "SELECT reference, fulfilled_at FROM shop_orders WHERE reference = ANY(:r)", r=refs
        )
    }
    waits = {
        p.reference: epoch(fulfilled_at[p.reference]) - p.paid_at
        for p in done
        if fulfilled_at[p.reference] is not None
    }
    by_cli = [ref for ref in waits if epoch(fulfilled_at[ref]) >= cli_started]
    last_paid = max(p.paid_at for p in done)
    in_run = [wait for ref, wait in waits.items() if ref not in by_cli]

    # --- what clients got ---------------------------------------------------------------------------------
    items = sorted(exchanges.items, key=lambda e: e.sent)
    errors = [e for e in items if is_server_error(e)]
    during = [e for e in errors if exchanges.during_outage(e)]
    after = [e for e in errors if not exchanges.during_outage(e) and exchanges.since_return(e) is not None]
    outside = [e for e in errors if not exchanges.during_outage(e) and exchanges.since_return(e) is None]
    # After the database answered again, only a client's first request may still meet a 5xx (the first retry).
    first_after: set[int] = set()
    for _mode, _down, up in exchanges.outages:
        seen: set[str] = set()
        for index, exchange in enumerate(items):
            if exchange.sent > up and exchange.client not in seen:
                seen.add(exchange.client)
                first_after.add(index)
    late = [
        f"{e.client}: {e.status} {e.method} {e.path} ({e.server}) sent {exchanges.since_return(e):.2f} s after "
        "the return"
        for index, e in enumerate(items)
        if is_server_error(e) and e in after and index not in first_after
    ]
    not_503 = [e for e in errors if not checkout_502(e) and (e.status != 503 or not e.retry_after)]
    no_answer = [e for e in items if e.status is None]
    # A shopper's request goes unanswered only when a kill missed its callback (the worker answered it in the
    # microseconds between the killer's last look and the signal, and had taken that request).
    missed = [kill for kill in killer.kills if not kill.inside_callback]
    # Explained: the request was in flight while the kill happened (sent before it ended, its failure seen
    # after it began): the order of the two, no allowance in seconds.
    unexplained = [
        e
        for e in no_answer
        if not (
            e.server == "shop" and any(e.sent <= kill.at and kill.before <= e.answered for kill in missed)
        )
    ]
    refused_during = [
        any(e.status == 503 and e.retry_after and e.sent <= up and e.answered >= down for e in items)
        for _mode, down, up in exchanges.outages
    ]
    returns = []
    for mode, _down, up in exchanges.outages:
        served = next(
            (e for e in items if e.client == "prober-page" and e.sent >= up and e.status == 200), None
        )
        readied = next(
            (e for e in items if e.client == "prober-readyz" and e.sent >= up and e.status == 200), None
        )
        returns.append(
            (mode, served.answered - up if served else None, readied.answered - up if readied else None)
        )

    # --- the servers -------------------------------------------------------------------------------------
    logs = stack.logs()
    access = {
        name: Counter(status for status, _m, _p in _ACCESS.findall(text)) for name, text in logs.items()
    }
    access_500 = {
        name: [f"{s} {m} {p}" for s, m, p in _ACCESS.findall(text) if s == "500"]
        for name, text in logs.items()
    }
    traced = {name: tracebacks(text)[1] for name, text in logs.items()}
    outage_lines = {name: (text.count(OUTAGE_STARTS), text.count(OUTAGE_ENDS)) for name, text in logs.items()}
    booted = logs["shop"].count("Booting worker")
    # The shop serves again without a person: the same master, its workers, ready.
    ready(stack)
    assert stack.shop.process.poll() is None and int(stack.shop.process.pid) == master
    assert "Worker failed to boot" not in logs["shop"] and "Shutting down: Master" not in logs["shop"]

    inside = sum(kill.inside_callback for kill in killer.kills)
    report(
        f"fault run (seed {SEED}): {SHOPPERS} shoppers, {AT_ONCE} at a time, shopping took {shopping_seconds:.0f} s; "
        f"PostgreSQL (fsync on) restarted: "
        + ", ".join(f"-m {mode} {up - down:.2f} s" for mode, down, up in exchanges.outages)
    )
    report(
        f"shop workers SIGKILLed: {len(killer.kills)}, {inside} of them inside a callback (its mark still in "
        f"place when the process was dead); workers booted by the shop's master: {booted}"
    )
    report(
        f"paid at the gateway: {len(paid_at_gateway)} of {SHOPPERS}; fulfilled once {len(once)}, twice "
        f"{len(twice)}, never {len(never)}; fulfilled without a payment {len(unpaid_fulfilled)}; outbox events "
        f"left {len(left)}"
    )
    report(
        f"5xx answers to clients: during the outages {dict(Counter((e.server, e.status) for e in during))}, "
        f"after the database answered again {dict(Counter((e.server, e.status) for e in after))} (of them a "
        f"client's first request after it: {len(after) - len(late)}), outside any outage "
        f"{dict(Counter((e.server, e.status) for e in outside))}; no answer at all: {len(no_answer)} (a kill that missed its callback: {len(no_answer) - len(unexplained)}); "
        f"HTTP exchanges {len(items)}"
    )
    report(
        "from the database's return to the shop serving (an order's status.json 200) / ready (readyz 200): "
        + ", ".join(f"-m {mode}: {fmt(served)} / {fmt(readied)}" for mode, served, readied in returns)
    )
    report(
        f"from payment to fulfilment: longest {max(waits.values()):.1f} s, median "
        f"{sorted(waits.values())[len(waits) // 2]:.2f} s, over 5 s {sum(w > 5 for w in waits.values())}; "
        f"{len(in_run)} fulfilled while the shop served (longest {max(in_run, default=0):.1f} s), {len(by_cli)} "
        f"by the deliver/reconcile run at the end ({cli_started - last_paid:.1f} s after the last payment); "
        f"deliver: {delivered} delivered; reconcile ({cron_rounds} round(s)): {' '.join(reconciled.stdout.split())} The gateway's "
        f"callbacks still pending then: {pending}"
    )
    slowest = max(outbox_waits.values(), key=lambda found: found[2], default=("none", 0, 0.0))
    report(
        f"outbox (flask gateway deliver --every {DELIVER_EVERY} running, lease {CLAIM_LEASE.total_seconds():g} s): "
        f"{len(outbox_waits)} events delivered, {sum(1 for _k, a, _w in outbox_waits.values() if a > 1)} after a "
        f"failed attempt; longest from writing to delivery {slowest[2]:.1f} s ({slowest[0]}, {slowest[1]} "
        f"attempt(s)), over 5 s {sum(1 for _k, _a, w in outbox_waits.values() if w > 5)}; the service's "
        f"rounds: {service_rounds(service_output)}"
    )
    report(
        f"access log statuses: { ({name: dict(c) for name, c in access.items()}) }; outage log lines "
        f"(starts, ends): {outage_lines}"
    )

    assert never == [] and twice == [] and unpaid_fulfilled == [], (never, twice, unpaid_fulfilled)
    assert len(paid_at_gateway) == SHOPPERS  # every shopper paid (the last step each completed)
    assert inside > 0, killer.kills  # the kills did land inside callbacks: the run tested what it says
    assert left == [], left
    assert tracebacks(service_output)[1] == [], service_output[-3000:]
    assert access_500 == {"shop": [], "emulator": []}, (access_500, traceback_blocks(logs["shop"]))
    assert not_503 == [], not_503
    assert late == [], "\n".join(late)
    assert outside == [], outside
    assert unexplained == [], unexplained
    # Each outage was answered with 503 + Retry-After (so the check above is not vacuous), and after each
    # return the shop served an order's page and turned ready again, no person involved.
    assert all(refused_during), list(
        zip([mode for mode, _d, _u in exchanges.outages], refused_during, strict=True)
    )
    assert all(served is not None and readied is not None for _m, served, readied in returns), returns
    assert traced == {"shop": [], "emulator": []}, traced
    return FaultRunFigures(
        outages=[(mode, up - down) for mode, down, up in exchanges.outages],
        returns=returns,
        outbox_waits=outbox_waits,
        shopping_seconds=shopping_seconds,
    )


def settle_outbox(stack: Stack, service_log: Path) -> None:
    """Wait until no outbox event is pending, with the shop's outbox service (``deliver --every``) running and
    no cron: the events a killed worker had claimed are delivered by the service once their lease is over."""

    def none_pending() -> bool:
        ((events,),) = fetch_all(stack.shop_db, "SELECT count(*) FROM gateway_outbox WHERE state = 'pending'")
        return events == 0

    wait_for(
        none_pending,
        timeout=OUTBOX_DEADLINE,
        interval=0.5,
        what="the outbox service to deliver every event of the run (a killed worker's once its lease is over)",
        logs=[stack.shop, service_log],
    )


def traceback_blocks(text: str, limit: int = 3) -> str:
    """The first ``limit`` tracebacks of a log, whole (the lines before each too: what was logged with it),
    for a failure's message."""
    lines = text.splitlines()
    spans = list(itertools.islice(traceback_spans(lines), limit))
    blocks = ["\n".join(lines[max(start - 2, 0) : end + 1]) for start, end in spans]
    return "\n\n".join(blocks) or "(no traceback in the log)"


def service_rounds(output: str) -> str:
    """What ``deliver --every`` reported: its rounds that did something, summed."""
    counted = [tuple(int(n) for n in found.groups()) for found in _DELIVER_REPORT.finditer(output)]
    delivered, failed, dead = (sum(column) for column in zip(*counted, strict=True)) if counted else (0, 0, 0)
    return f"{len(counted)} round(s) with work: {delivered} delivered, {failed} failed, {dead} dead"


def epoch(value: datetime) -> float:
    return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()


def fmt(seconds: float | None) -> str:
    return "never" if seconds is None else f"{seconds:.2f} s"


_DELIVER_REPORT: Final = re.compile(r"Outbox: (\d+) delivered, (\d+) failed, (\d+) dead\.")


def cron_until_told(
    stack: Stack, tokens: list[str], rounds: int = 3
) -> tuple[int, subprocess.CompletedProcess[str], int]:
    """``deliver``, ``reconcile --older-than 0``, ``deliver``, as a schedule runs them, until every checkout of
    ``tokens`` that the gateway holds as paid is fulfilled by the shop.

    A checkout polled within the last :data:`CLAIM_LEASE_SECONDS` is not due to reconciliation (a shopper's
    return polls it; a poll that met an outage leaves it unchanged): when some are still untold after a round,
    the next round runs once their claims have lapsed (read from the shop's database, not guessed), as the
    schedule's next run would. Returns the events delivered, the last reconcile's output and the rounds run.
    """
    delivered = 0
    for round_ in range(1, rounds + 1):
        delivered += deliver_until_settled(stack)
        reconciled = gateway_command(stack, "reconcile", "reconcile", "--older-than", "0", "--quiet")
        assert reconciled.returncode == 0, reconciled.stdout + reconciled.stderr
        delivered += deliver_until_settled(stack)
        shop = {
            str(token): (str(reference), lapses)
            for token, reference, lapses in fetch_all(
                stack.shop_db,
                "SELECT token, order_reference, EXTRACT(EPOCH FROM last_polled_at + make_interval(secs => :lease) "
                "- clock_timestamp()) FROM gateway_checkouts WHERE token = ANY(:t)",
                t=tokens,
                lease=CLAIM_LEASE_SECONDS,
            )
        }
        paid = {
            str(reference)
            for reference, status in fetch_all(
                stack.emulator_db,
                "SELECT merchant_order_reference, status FROM emulator_checkouts "
                "WHERE merchant_order_reference = ANY(:r)",
                r=[reference for reference, _lapses in shop.values()],
            )
            if status in GATEWAY_PAID
        }
        fulfilled = fulfilment_counts(stack, sorted(paid))
        untold = [
            lapses for reference, lapses in shop.values() if reference in paid and not fulfilled[reference]
        ]
        if not untold or round_ == rounds:
            return delivered, reconciled, round_
        time.sleep(max([float(lapses or 0) for lapses in untold] + [0.0]) + 0.5)
    raise AssertionError("unreachable: the last round returns")


def deliver_until_settled(stack: Stack, runs: int = 6) -> int:
    """``flask gateway deliver`` until no outbox event is pending: an event leased by a worker that was killed
    is delivered once its lease is over (sleeping until then). Returns how many it delivered."""
    delivered = 0
    for _ in range(runs):
        ran = gateway_command(stack, "deliver", "deliver")
        counted = _DELIVER_REPORT.search(ran.stdout)
        assert ran.returncode == 0 and counted is not None, ran.stdout + ran.stderr
        delivered += int(counted[1])
        ((pending, wait),) = fetch_all(
            stack.shop_db,
            "SELECT count(*), EXTRACT(EPOCH FROM max(GREATEST(next_attempt_at, claimed_until)) - clock_timestamp()) "
            "FROM gateway_outbox WHERE state = 'pending'",
        )
        if pending == 0:
            return delivered
        time.sleep(min(max(float(wait or 0), 0) + 0.2, 15))
    raise AssertionError(f"outbox events still pending after {runs} runs of flask gateway deliver")


# --- boot while the database is away ----------------------------------------------------------------------


# --- graceful shutdown ------------------------------------------------------------------------------------------


def test_sigterm_mid_callback_finishes_it(
    cluster: PostgresCluster, tmp_path: Path, report: Callable[[str], None]
) -> None:
    marks = tmp_path / "callback-marks"
    marks.mkdir()
    # One callback attempt only within the test: an answered first attempt is the only way to "ok".
    plan = fault_plan(cluster, marks, EMULATOR_CALLBACK_RETRY_DELAYS="600")
    init_shop_database(plan)
    with running(plan, tmp_path, cluster) as stack:
        ready(stack)
        figures = []
        for target in ("worker", "master"):
            figures.append(sigterm_during_a_callback(stack, marks, target))
        report(
            f"graceful shutdown (gunicorn --graceful-timeout {GRACEFUL_TIMEOUT} s, the callback's getstatus "
            "delayed 2 s): " + "; ".join(figures)
        )


def sigterm_during_a_callback(stack: Stack, marks: Path, target: str) -> str:
    """Pay an order (the shopper leaves: only the callback tells the shop), SIGTERM ``target`` (the worker
    handling the callback, or the master) while the callback waits for its delayed ``getstatus``."""
    master = int(stack.shop.process.pid)
    purchase = Purchase(0, "stoneware-mugs", come_back=False)
    exchanges = Exchanges(servers={stack.shop.url: "shop", stack.emulator.url: "emulator"})
    add_fault(stack, operation="getstatus", kind="delay", delayMs=2000, count=1)
    shop(purchase, exchanges, stack, lambda _p: None)

    def handling() -> int | None:
        found = [int(mark.name.split("-", 1)[0]) for mark in marks.iterdir()]
        return found[0] if found else None

    pid = wait_for(
        handling, interval=0.005, what="the shop to handle the callback", logs=[stack.shop, stack.emulator]
    )
    assert pid in workers_of(stack.shop.process)
    # The emulator took the delay rule (it is gone): the callback's getstatus is being held there now.
    wait_for(
        lambda: control_get(stack, "faults")["faults"] == [],
        interval=0.01,
        what="the callback's getstatus to reach the emulator (the delay rule taken)",
        logs=[stack.shop, stack.emulator],
    )
    assert handling() == pid  # inside the callback, waiting for the delayed getstatus
    signalled = time.monotonic()
    os.kill(master if target == "master" else pid, signal.SIGTERM)
    wait_for(lambda: not is_alive(pid), interval=0.01, what="the worker to exit", logs=[stack.shop])
    exited = time.monotonic() - signalled  # reported only
    assert not list(marks.iterdir()), "the worker exited inside the callback"  # the answer went out first

    # The emulator records its attempt once it has the answer: a moment after the worker sent it.
    attempts = wait_for(
        lambda: fetch_all(
            stack.emulator_db,
            "SELECT a.ok, a.message FROM emulator_delivery_attempts a JOIN emulator_deliveries d "
            "ON d.id = a.delivery_id JOIN emulator_checkouts c ON c.id = d.checkout_id WHERE c.token = :t "
            "ORDER BY a.id",
            t=purchase.token,
        ),
        what="the emulator's record of its callback attempt",
        logs=[stack.shop, stack.emulator],
    )
    assert [ok for ok, _message in attempts] == [True], attempts  # one attempt, answered 200
    ((status, reference),) = fetch_all(
        stack.shop_db,
        "SELECT o.status, o.reference FROM shop_orders o JOIN gateway_checkouts c ON c.order_reference = o.reference "
        "WHERE c.token = :t",
        t=purchase.token,
    )
    assert status == "paid" and fulfilment_counts(stack, [reference]) == {reference: 1}
    if target == "master":
        stack.shop.process.wait(60)
        assert "Shutting down: Master" in stack.logs()["shop"]
    else:
        wait_for(
            lambda: len(workers_of(stack.shop.process)) == SHOP_WORKERS,
            what="the master to replace the worker",
            logs=[stack.shop],
        )
        assert stack.shop.process.poll() is None
    return (
        f"SIGTERM to the {target}: the worker finished the callback and exited {exited:.2f} s later, the "
        f"emulator's one attempt {attempts[0][1]!r}, the order paid and fulfilled once"
    )
