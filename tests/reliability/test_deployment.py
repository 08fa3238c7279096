"""The deployment test (issue 25): the example shop deployed as docs/example-shop.md says, with its own files.

One machine, real processes:

- PostgreSQL (the session's throwaway cluster), one database for the emulator and one for the shop;
- the emulator under gunicorn (``tests/reliability/conftest.py``'s ``start_gunicorn``);
- the shop under gunicorn with :data:`SHOP_WORKERS` workers, run with ``-c example_shop/gunicorn.conf.py
  example_shop.wsgi:app`` (its ``logconfig_dict``, its multiprocess-metrics hooks), ``SHOP_ENV=production``
  with the secrets production needs, ``PROMETHEUS_MULTIPROC_DIR`` in gunicorn's environment only (the
  systemd unit of the web server sets it: the worker, beat and the doctor are other servers), the metrics
  route behind ``SHOP_METRICS_TOKEN``, ``SHOP_TRUSTED_PROXIES=1`` (the test's shoppers come as the TLS proxy
  forwards them);
- a ``redis-server`` of its own (stopped and started again on its port), one Celery worker from
  ``example_shop.celery_app`` and beat from the same app with shorter ticks (``tests/reliability/
  deployment.py``: delivery every :data:`DELIVER_EVERY` s, reconciliation every :data:`RECONCILE_EVERY` s).
  The worker runs under a supervisor (``deployment.Supervisor``) as its systemd unit runs it in production
  (``Restart=always``, ``RestartSec=1``: docs/example-shop.md): a worker that exits is started again a
  second later.

``GATEWAY_OUTBOX_DELIVER_AT_ONCE=0``: every payment is fulfilled by the worker's ``deliver_outbox`` task, never
in the request, so a payment made while Redis or the worker is down waits for the background work, and "none
lost" says the background work caught up. Every third shopper's callback is lost (the emulator's
``callback_fail`` fault for all its attempts) and the shopper closes the browser after paying: only the
reconcile task can confirm that payment.

While shoppers pay (one after the other, from a thread) and a scraper reads ``/metrics`` every half second
through gunicorn's port, the test

1. waits until both jobs have run, and the doctor finds no problem (exit 0; ``background-work`` and
   ``broker`` ok);
2. stops Redis: the metric ``flask_gateway_job_overdue{job="deliver"}`` turns 1 (the scrape showing a last
   delivery older than the deliver bound), then the doctor says the delivery is overdue and the broker does
   not answer; starts Redis again: both clear, the delivery the metric shows having run after Redis was
   started again, with the same beat process. The worker either rides the outage
   out (the same process), or exits with the one known crash: Redis gone while a late-acknowledged task
   runs, kombu's redis transport raises ``AttributeError("'NoneType' object has no attribute 'hostname'")``
   closing the lost connection (Celery's ``Unrecoverable error``, exit status 1; celery/kombu issues 582
   and 970), and the supervisor's restart connects once Redis is back and runs the tasks again. Any other
   exit, or an exit at any other time, fails the test;
3. stops the worker and its supervisor (``systemctl stop``: SIGTERM, a warm shutdown) until the delivery is
   overdue, then starts them again: clears, and no exit, no restart;
4. at the end: every payment confirmed and fulfilled once, its ``payment_confirmed`` outbox event delivered
   once, nothing pending or dead; no scrape failed, no counter or histogram went down, the scrapes were
   answered by several workers and each showed every ``create`` call made before it was sent (and none
   beyond those answered by then); no 5xx in gunicorn's access log, no traceback in the shop's log.

Every step waits for its event (a scrape, a doctor's run, a log line, a row), with a last-resort deadline
whose failure shows the logs' tails; no step asserts how long it took. The time to detect and to clear each
outage is ``benchmarks/figure_recovery.py``'s figure (``deployment_run`` returns the outages), held there
against its target. The figures (heartbeat ages during each outage, time to detect and to clear, scrapes,
calls, the worker's restarts) are printed too:
``pytest tests/reliability/test_deployment.py -p no:randomly -n 0 -s``.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import pytest
from werkzeug.security import generate_password_hash

from tests import secret_watch
from tests.conftest import fetch_all, selected_backends
from tests.postgres import PostgresCluster
from tests.processes import WAIT_DEADLINE, Server, log_tails, wait_for
from tests.redis_server import RedisServer, start_redis
from tests.reliability.conftest import (
    ROOT,
    Stack,
    StackPlan,
    installed_on_first_use,
    plan_stack,
    start_gunicorn,
)
from tests.reliability.deployment import (
    ACCESS_FORMAT,
    DoctorRun,
    Exit,
    Scrape,
    Scraper,
    Supervisor,
    access_lines,
    doctor,
    proxied_shopper,
    resets,
    start_redis_again,
    stop_redis,
)
from tests.reliability.support import (
    Recorder,
    add_fault,
    control_get,
    fulfilment_counts,
    order_reference,
    token_of,
    tracebacks,
)
from tests.tasks.conftest import Worker, spawn_celery, wait_ready

pytestmark = pytest.mark.xdist_group("deployment")

SHOP_WORKERS: Final = 3
#: GATEWAY_DELIVER_STALE_SECONDS and GATEWAY_RECONCILE_STALE_SECONDS.
DELIVER_BOUND: Final = 10
RECONCILE_BOUND: Final = 20
#: Beat's ticks (seconds).
DELIVER_EVERY: Final = 2.0
RECONCILE_EVERY: Final = 4.0
#: GATEWAY_RECONCILE_AFTER_SECONDS: a checkout is reconciled once it is this old.
RECONCILE_AFTER: Final = 2
#: The last resort of the wait for every payment to be confirmed and fulfilled at the end: on a quiet
#: machine the last lost callback's payment is confirmed by the next reconcile tick once it is old enough,
#: and fulfilled by the next deliver tick; this is ten times that.
SETTLE_DEADLINE: Final = 10 * (RECONCILE_AFTER + RECONCILE_EVERY + DELIVER_EVERY)
#: The emulator's callback attempts for one payment (EMULATOR_CALLBACK_RETRY_DELAYS has two delays).
CALLBACK_ATTEMPTS: Final = 3
METRICS_TOKEN: Final = "deployment-test-metrics-token-0123456789"
PRODUCTS: Final = ("enamel-kettle", "ilala-basket", "stoneware-mugs")


@dataclass
class Deployment:
    stack: Stack
    redis: RedisServer
    root: Path
    #: The shop's environment file: the web workers, the Celery worker, beat and cron all load it.
    env: dict[str, str]
    #: What gunicorn has on top (prometheus_client's folder).
    web_env: dict[str, str]
    #: The Celery worker's "unit": its processes, exits and restarts.
    workers: Supervisor
    beat: Worker

    @property
    def worker(self) -> Worker:
        """The worker process running now (or the last one)."""
        return self.workers.current

    def start_worker(self) -> Worker:
        """``systemctl start``: a new worker process under the supervisor, consuming."""
        worker = self.workers.start()
        wait_ready(worker, " ready.")
        return worker

    def celery_logs(self) -> dict[str, str]:
        return {process.name: process.log() for process in [*self.workers.started, self.beat]}

    def shop_log(self) -> str:
        return self.stack.shop.log_path.read_text(errors="replace")

    def logs(self) -> list[Server | Path]:
        """Every process's log, for a failure message: the servers, the Celery worker now and beat."""
        return [self.stack.shop, self.stack.emulator, self.worker.log_path, self.beat.log_path]


def _spawn_worker(root: Path, env: dict[str, str], name: str) -> Worker:
    """``celery -A example_shop.celery_app:celery worker --loglevel INFO`` as docs/example-shop.md runs it,
    with two pool processes (its default on a machine of two CPUs: the same here on any machine)."""
    return spawn_celery(
        root, name, "example_shop.celery_app:celery",
        env, "worker", "--pool", "prefork", "--concurrency", "2", "--hostname", f"{name}@%h",
        "--loglevel", "INFO",
    )  # fmt: skip


@pytest.fixture
def deployment(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Deployment]:
    if "postgresql" not in selected_backends(request.config):
        pytest.skip("the deployment test runs on PostgreSQL only, and --database=sqlite was chosen")
    cluster: PostgresCluster = request.getfixturevalue("postgres_cluster")
    with deployed(cluster, tmp_path_factory.mktemp("deployment")) as running:
        yield running


@contextmanager
def deployed(cluster: PostgresCluster, root: Path) -> Iterator[Deployment]:
    """The deployment on ``cluster`` (its files and logs in ``root``), every process stopped afterwards and
    its databases dropped."""
    began = time.monotonic()
    redis = start_redis()
    plans: list[StackPlan] = []
    servers: list[Server] = []
    workers: list[Worker | Supervisor] = []
    try:
        plan = _plan(cluster, redis)
        plans.append(plan)
        yield from _deploy(plan, redis, root, servers, workers, began)
    finally:
        for process in workers:
            process.stop()
        for server in reversed(servers):
            server.stop()
        redis.stop()
        for plan in plans:
            for url in (plan.shop_db, plan.emulator_db):
                cluster.drop_database(url.rsplit("/", 1)[1], wait=False)


def _plan(cluster: PostgresCluster, redis: RedisServer) -> StackPlan:
    """The two databases, the ports, and the apps' environments."""
    return plan_stack(
        cluster,
        shop_env={
            "SHOP_ENV": "production",
            "SHOP_SECRET_KEY": "deployment-shop-secret-" + "k" * 40,
            "SHOP_ADMIN_PASSWORD_HASH": generate_password_hash("owner-password-of-the-deployment"),
            "SHOP_CELERY_BROKER_URL": redis.url,
            "SHOP_METRICS_TOKEN": METRICS_TOKEN,
            "SHOP_TRUSTED_PROXIES": "1",
            "SHOP_DB_POOL_SIZE": "5",
            "GATEWAY_DELIVER_STALE_SECONDS": str(DELIVER_BOUND),
            "GATEWAY_RECONCILE_STALE_SECONDS": str(RECONCILE_BOUND),
            "GATEWAY_RECONCILE_AFTER_SECONDS": str(RECONCILE_AFTER),
            "GATEWAY_OUTBOX_DELIVER_AT_ONCE": "0",
            # The emulator was started with EMULATOR_WAF=allow-local (its firewall lets 127.0.0.1 through).
            "GATEWAY_WAF": "allow-local",
            "DEPLOY_DELIVER_EVERY": str(DELIVER_EVERY),
            "DEPLOY_RECONCILE_EVERY": str(RECONCILE_EVERY),
        },
    )


def _deploy(
    plan: StackPlan,
    redis: RedisServer,
    root: Path,
    servers: list[Server],
    workers: list[Worker | Supervisor],
    began: float,
) -> Iterator[Deployment]:
    """The deployment step (the shop's tables), then every process; ``servers`` and ``workers`` collect what
    was started, for the fixture to stop."""
    env = dict(plan.shop_env)
    env.pop("SHOP_ADMIN_PASSWORD")  # development only: production takes the hash
    web_env = {**env, "PROMETHEUS_MULTIPROC_DIR": str(root / "prometheus")}
    init = _run_flask(env, "shop", "init-db")
    assert init.returncode == 0, init.stdout + init.stderr
    emulator = start_gunicorn(
        "emulator", "flask_gateway.emulator:create_app()", plan.emulator_env, root,
        port=plan.emulator_port, workers=2, threads=4, ready_path="/livez",
    )  # fmt: skip
    servers.append(emulator)
    shop = start_gunicorn(
        "shop", "example_shop.wsgi:app", web_env, root, port=plan.shop_port, workers=SHOP_WORKERS,
        threads=4, ready_path="/gateway/livez",
        options=["-c", str(ROOT / "example_shop" / "gunicorn.conf.py"), "--access-logformat", ACCESS_FORMAT],
    )  # fmt: skip
    servers.append(shop)
    for server in servers:
        secret_watch.watch_file(server.log_path)
    stack = Stack(
        emulator=emulator, shop=shop, emulator_db=plan.emulator_db, shop_db=plan.shop_db, shop_env=env
    )
    # The first shopper requests auto-install the shop.
    wait_for(lambda: installed_on_first_use(stack), what="the shop's auto-install", logs=servers)
    supervisor = Supervisor("worker", lambda name: _spawn_worker(root, env, name), restart_sec=1.0, say=say)
    workers.append(supervisor)
    worker = supervisor.start()
    beat = spawn_celery(
        root, "beat", "tests.reliability.deployment:celery", env,
        "beat", "--schedule", str(root / "beat-schedule"), "--loglevel", "INFO", "--max-interval", "1",
    )  # fmt: skip
    workers.append(beat)
    wait_ready(worker, " ready.")
    wait_ready(beat, "beat: Starting...")
    say(f"started in {time.monotonic() - began:.0f} s")
    yield Deployment(stack, redis, root, env, web_env, supervisor, beat)


def _run_flask(env: dict[str, str], *arguments: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flask", "--app", "example_shop", *arguments],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


# --- the shoppers ------------------------------------------------------------------------------------------


@dataclass
class Payment:
    token: str
    reference: str
    lost: bool
    phase: str


@dataclass
class Shoppers:
    """Shoppers paying one after the other from a thread: every third one's callback lost."""

    stack: Stack
    recorder: Recorder = field(default_factory=Recorder)
    payments: list[Payment] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: ``create`` calls completed (a 303 from POST /checkout) and when (``time.monotonic()``).
    creates: list[float] = field(default_factory=list)
    phase: str = "start"
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _unsettled: list[str] = field(default_factory=list)

    def pay(self, index: int) -> None:
        lost = index % 3 == 2
        shopper = proxied_shopper(self.stack.shop.url, self.recorder)
        shopper.add_to_cart(PRODUCTS[index % len(PRODUCTS)])
        answer = shopper.submit_checkout(shopper.checkout_form())
        assert answer.status_code == 303, (answer.status_code, answer.text[:300])
        self.creates.append(time.monotonic())
        payment_url = answer.headers["Location"]
        token = token_of(payment_url)
        if lost:
            # No other payment's callback may take the fault's uses: those sent earlier are delivered first.
            for earlier in self._unsettled:
                wait_for(
                    lambda token=earlier: self._callback_ok(token),
                    what=f"the callback of {earlier}",
                    logs=[self.stack.shop, self.stack.emulator],
                )
            self._unsettled.clear()
            add_fault(self.stack, operation="callback", kind="callback_fail", count=CALLBACK_ATTEMPTS)
        paid = shopper.pay_or_cancel(payment_url, "pay", follow=not lost)
        if lost:  # the shopper closed the browser; every callback attempt fails
            assert paid.status_code == 303, paid.status_code
            wait_for(
                lambda: control_get(self.stack, "faults")["faults"] == [],
                what=f"the {CALLBACK_ATTEMPTS} failed callback attempts for {token}",
                logs=[self.stack.shop, self.stack.emulator],
            )
        else:
            if paid.status_code != 200 or "/orders/view/" not in paid.url:
                text = re.sub(r"<[^>]*>|\s+", " ", paid.text)
                raise AssertionError(f"paying ended at {paid.status_code} {paid.url}: {text[:1500]}")
            self._unsettled.append(token)
        self.payments.append(Payment(token, order_reference(self.stack, token), lost, self.phase))

    def _callback_ok(self, token: str) -> bool:
        attempts = control_get(self.stack, "callbacks", checkoutToken=token)["callbacks"]
        return any(attempt["ok"] for attempt in attempts)

    def _run(self) -> None:
        index = 0
        while not self._stop.is_set():
            try:
                self.pay(index)
            except Exception as exc:  # asserted empty by the test
                self.errors.append(f"payment {index}: {exc!r}")
                say(f"payment {index} failed: {exc}")
            index += 1
            self._stop.wait(0.3)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="shoppers", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(120)


def say(text: str) -> None:
    """A figure for the closing note (``pytest -s`` shows it)."""
    print(f"[deployment] {text}", flush=True)  # noqa: T201 - the figures this test measures


# --- the test ----------------------------------------------------------------------------------------------


@dataclass
class Outage:
    name: str
    began: float
    detected_metric: float = 0.0
    detected_doctor: float = 0.0
    #: When the doctor run that reported it began.
    doctor_began: float = 0.0
    ended: float = 0.0
    #: ``time.time()`` right before the stopped part was started again: a job's run finished after it is
    #: a run after the outage.
    restarting_wall: float = 0.0
    cleared_metric: float = 0.0
    cleared_doctor: float = 0.0
    max_deliver_age: float = 0.0
    max_reconcile_age: float = 0.0
    doctor_during: str = ""

    def line(self) -> str:
        return (
            f"{self.name}: deliver overdue in the metric after {self.detected_metric - self.began:.1f} s, in "
            f"doctor's run begun at {self.doctor_began - self.began:.1f} s (done at "
            f"{self.detected_doctor - self.began:.1f} s; bound {DELIVER_BOUND} s + tick {DELIVER_EVERY:g} s); "
            f"down {self.ended - self.began:.1f} s; fine again in the metric {self.cleared_metric - self.ended:.1f} s "
            f"and in doctor {self.cleared_doctor - self.ended:.1f} s after the restart; heartbeat ages at most "
            f"deliver {self.max_deliver_age:.1f} s, reconcile {self.max_reconcile_age:.1f} s"
        )


def _both_fine(scrape: Scrape) -> bool:
    """Both jobs ran (before the first run "not overdue" means "installed less than the bound ago") and
    neither is overdue."""
    return scrape.status == 200 and all(
        scrape.overdue(job) == 0 and scrape.age(job) is not None for job in ("deliver", "reconcile")
    )


def _doctor_fine(run: DoctorRun) -> bool:
    """No problem at all (exit 0), and both jobs and the broker fine."""
    return run.returncode == 0 and run.levels("background-work") == ["ok"] and run.levels("broker") == ["ok"]


def _ages(outage: Outage, scrapes: list[Scrape]) -> None:
    for scrape in scrapes:
        outage.max_deliver_age = max(outage.max_deliver_age, scrape.age("deliver") or 0.0)
        outage.max_reconcile_age = max(outage.max_reconcile_age, scrape.age("reconcile") or 0.0)


def _until_doctor(
    deployment: Deployment, predicate: Any, *, what: str, timeout: float = WAIT_DEADLINE
) -> DoctorRun:
    """Run the doctor until ``predicate(run)`` holds (a last-resort deadline); the first run that says so."""
    deadline = time.monotonic() + timeout
    runs = []
    while True:
        run = doctor(deployment.env)
        runs.append(run)
        if predicate(run):
            return run
        if time.monotonic() > deadline:
            raise AssertionError(
                f"timed out after {timeout} s waiting for {what}; the doctor said:\n{run.output}"
                + log_tails(deployment.logs())
            )


def _still_running(*processes: Worker) -> None:
    """Each Celery process is the one started before the outage, alive (else its last words)."""
    for process in processes:
        if not process.alive():
            log = process.log()
            last = [line for line in log.splitlines() if "CRITICAL" in line or "Unrecoverable" in line]
            raise AssertionError(
                f"{process.name} exited with {process.process.returncode} during the outage: "
                f"{last or log[-2000:]}"
            )


def _only_known_exits(exits: list[Exit]) -> None:
    """Every exit of the worker was the known kombu crash (``deployment.known_kombu_exit``), nothing else."""
    unknown = [gone for gone in exits if not gone.known()]
    assert unknown == [], "\n\n".join(
        f"{gone.describe()}\n" + "\n".join(error.traceback[-3000:] for error in gone.errors)
        for gone in unknown
    )


def _worker_rode_out_redis(deployment: Deployment, worker_pid: int, since: int) -> str:
    """After the Redis outage (cleared): the same worker process, or, if it exited with the known crash, the
    supervisor's restart, which connected to Redis and ran tasks again (its log: ready, then a deliver task
    that succeeded). ``since``: how many exits the supervisor had seen before the outage. Returns the name of
    the worker process running now."""
    supervisor = deployment.workers
    assert supervisor.errors == []
    exits = supervisor.exits[since:]
    if not exits:
        assert deployment.worker.pid == worker_pid
        _still_running(deployment.worker)
        return deployment.worker.name
    _only_known_exits(exits)
    assert supervisor.restarts == len(supervisor.exits)
    restarted = deployment.worker
    assert restarted.pid != worker_pid
    assert supervisor.started_at[-1] > exits[-1].at, "no restart after the last exit"
    _still_running(restarted)
    wait_ready(restarted, " ready.")
    wait_for(
        lambda: re.search(r"Task flask_gateway\.deliver_outbox\[[^]]+\] succeeded", restarted.log()),
        what=f"a deliver_outbox task run by {restarted.name}, the restarted worker",
        logs=deployment.logs(),
    )
    return restarted.name


def _outage_detected(deployment: Deployment, scraper: Scraper, outage: Outage, *, broker_down: bool) -> None:
    """The metric turns overdue once the last delivery is older than the bound, and then the doctor says so
    too (it reads the same heartbeats). How long after the outage began is a figure
    (``benchmarks/figure_recovery.py``), not an assertion: the test waits for the event."""
    seen = scraper.first(
        outage.began,
        lambda s: s.overdue("deliver") == 1,
        what=f"deliver overdue in the metric ({outage.name})",
        logs=deployment.logs(),
    )
    outage.detected_metric = seen.at
    # Overdue means "the last finished run, or the last successful one, is older than the bound", as the
    # scrape itself shows it: a run that failed when the outage began is a recent finish but no success.
    finished, succeeded = seen.age("deliver"), seen.success_age("deliver")
    assert finished is not None and succeeded is not None, (outage.name, finished, succeeded)
    assert max(finished, succeeded) >= DELIVER_BOUND, (outage.name, finished, succeeded)

    def overdue(run: DoctorRun) -> bool:
        return run.says("background-work", "problem", "deliver: last run finished") and (
            not broker_down or run.says("broker", "problem", "does not answer")
        )

    run = _until_doctor(deployment, overdue, what=f"doctor to report the {outage.name}")
    outage.detected_doctor = run.started + run.seconds
    outage.doctor_began = run.started
    outage.doctor_during = run.output
    assert run.returncode == 1, run.output
    if not broker_down:
        assert run.levels("broker") == ["ok"], run.output


def _outage_cleared(deployment: Deployment, scraper: Scraper, outage: Outage) -> None:
    """The doctor and the metric say both jobs are fine again, and the delivery they show ran after the
    stopped part was started again (waited for as events; how long it took is a figure)."""
    run = _until_doctor(deployment, _doctor_fine, what=f"doctor fine after the {outage.name}")
    outage.cleared_doctor = run.started + run.seconds
    seen = scraper.first(
        outage.ended, _both_fine, what=f"both jobs fine in the metric ({outage.name})", logs=deployment.logs()
    )
    outage.cleared_metric = seen.at
    last = seen.value("flask_gateway_job_last_run_timestamp_seconds", job="deliver")
    assert last is not None and last >= outage.restarting_wall, (outage.name, last, outage.restarting_wall)
    _ages(outage, scraper.since(outage.began))


def test_deployment_reports_each_outage_and_loses_no_payment(deployment: Deployment) -> None:
    deployment_run(deployment)


def deployment_run(deployment: Deployment) -> list[Outage]:
    """The two outages and every check of the test; returns the outages with their figures (when each was
    detected and cleared), which ``benchmarks/figure_recovery.py`` holds against their targets."""
    stack = deployment.stack
    began = time.monotonic()
    shoppers = Shoppers(stack)
    scraper = Scraper(stack.shop.url + "/metrics", METRICS_TOKEN)
    outages: list[Outage] = []
    try:
        shoppers.start()
        scraper.start()
        # Both jobs ran (beat's first ticks), and the metric says so.
        healthy = scraper.first(0.0, _both_fine, what="both jobs' heartbeats", logs=deployment.logs())
        baseline = _until_doctor(deployment, _doctor_fine, what="doctor fine at the start")
        say(
            f"at the start, doctor (exit {baseline.returncode}, {baseline.seconds:.1f} s):\n{baseline.output}"
        )
        wait_for(
            lambda: shoppers.payments or shoppers.errors, what="the first payment", logs=deployment.logs()
        )
        assert shoppers.errors == []
        calm = [(healthy.at, 0.0)]

        # 1. Redis stopped: beat sends nothing, the worker gets nothing. The worker may exit with the known
        # kombu crash (a task of its running when Redis went away); its supervisor starts it again.
        assert deployment.workers.exits == [], [gone.describe() for gone in deployment.workers.exits]
        worker_pid, beat_pid = deployment.worker.pid, deployment.beat.pid
        shoppers.phase = "redis down"
        calm[-1] = (calm[-1][0], time.monotonic())
        stop_redis(deployment.redis)
        redis = Outage("Redis stopped", time.monotonic())
        outages.append(redis)
        _outage_detected(deployment, scraper, redis, broker_down=True)
        _still_running(deployment.beat)
        _only_known_exits(deployment.workers.exits)
        redis.restarting_wall = time.time()
        start_redis_again(deployment.redis)
        redis.ended = time.monotonic()
        shoppers.phase = "after redis"
        _outage_cleared(deployment, scraper, redis)
        assert deployment.beat.pid == beat_pid
        _still_running(deployment.beat)
        after_redis = _worker_rode_out_redis(deployment, worker_pid, since=0)
        redis_exits = list(deployment.workers.exits)
        calm.append((redis.cleared_metric, 0.0))

        # 2. The worker stopped (its unit stopped: no restart; SIGTERM, a warm shutdown), longer than the
        # deliver bound, then started again.
        shoppers.phase = "worker down"
        calm[-1] = (calm[-1][0], time.monotonic())
        stopped = Outage("worker stopped", time.monotonic())
        deployment.workers.stop()
        outages.append(stopped)
        _outage_detected(deployment, scraper, stopped, broker_down=False)
        assert not deployment.worker.alive(), "the stopped worker was started again"
        stopped.restarting_wall = time.time()
        deployment.start_worker()
        stopped.ended = time.monotonic()
        shoppers.phase = "after worker"
        _outage_cleared(deployment, scraper, stopped)
        _still_running(deployment.worker, deployment.beat)
        calm.append((stopped.cleared_metric, 0.0))

        shoppers.stop()
        # Every payment made reaches the shop (reconcile: the lost callbacks; deliver: the fulfilment).
        tokens = [payment.token for payment in shoppers.payments]
        wait_for(
            lambda: _all_fulfilled(stack, shoppers.payments),
            timeout=SETTLE_DEADLINE,
            what="every payment confirmed and fulfilled, and its outbox event settled",
            logs=deployment.logs(),
        )
        calm[-1] = (calm[-1][0], time.monotonic())
        scraper.scrape()
    finally:
        shoppers.stop()
        scraper.stop()

    # --- what the shop did with the payments
    assert shoppers.errors == []
    payments = shoppers.payments
    references = [payment.reference for payment in payments]
    lost = [payment for payment in payments if payment.lost]
    assert len(payments) >= 6 and len(lost) >= 2, [(p.phase, p.lost) for p in payments]
    assert {p.phase for p in payments} >= {"redis down", "worker down"}, "no payment during an outage"
    assert fulfilment_counts(stack, references) == dict.fromkeys(references, 1)
    orders = fetch_all(
        stack.shop_db,
        "SELECT status, count(*) FROM shop_orders WHERE reference = ANY(:refs) AND fulfilled_at IS NOT NULL "
        "GROUP BY status",
        refs=references,
    )
    assert orders == [("paid", len(references))]
    unconfirmed = fetch_all(
        stack.shop_db,
        "SELECT token FROM gateway_checkouts WHERE token = ANY(:tokens) AND payment_confirmed_at IS NULL",
        tokens=tokens,
    )
    assert unconfirmed == []
    events = fetch_all(
        stack.shop_db,
        "SELECT c.token, e.state, count(*) FROM gateway_outbox e JOIN gateway_checkouts c ON c.id = e.checkout_id "
        "WHERE e.kind = 'payment_confirmed' GROUP BY c.token, e.state",
    )
    assert sorted(events) == sorted((token, "delivered", 1) for token in tokens)
    assert (
        fetch_all(
            stack.shop_db,
            "SELECT state, count(*) FROM gateway_outbox WHERE state <> 'delivered' GROUP BY state",
        )
        == []
    )
    confirmed_by = dict(
        fetch_all(
            stack.shop_db,
            "SELECT c.token, e.source FROM gateway_checkout_events e JOIN gateway_checkouts c ON c.id = e.checkout_id "
            "WHERE e.applied AND e.to_status IN ('PAID', 'PAID_PENDING_CALLBACK') "
            "AND e.from_status NOT IN ('PAID', 'PAID_PENDING_CALLBACK')",
        )
    )
    assert {payment.token: confirmed_by.get(payment.token) for payment in lost} == {
        payment.token: "reconcile" for payment in lost
    }

    # --- the scrapes
    scrapes = [scrape for scrape in scraper.scrapes if scrape.at >= healthy.at]
    assert scraper.errors == []
    assert resets(scrapes) == []
    for start, end in calm:
        window = [scrape for scrape in scrapes if start <= scrape.at <= end]
        assert window and all(_both_fine(scrape) for scrape in window), [
            (round(s.at - began, 1), s.overdue("deliver"), s.overdue("reconcile"))
            for s in window
            if not _both_fine(s)
        ]
    # Whichever worker answers, it shows every create call made before the scrape was sent, and no more
    # than those made until it answered (one shopper at a time: one call at most in flight).
    wrong = []
    for scrape in scrapes:
        shown = scrape.value("flask_gateway_client_request_duration_seconds_count", operation="create") or 0
        before = sum(1 for at in shoppers.creates if at < scrape.sent)
        until = sum(1 for at in shoppers.creates if at < scrape.at)
        if not before <= shown <= until + 1:
            wrong.append((round(scrape.at - began, 1), before, shown, until))
    assert wrong == []
    last = scrapes[-1]
    creates = last.value("flask_gateway_client_request_duration_seconds_count", operation="create")
    assert creates == len(shoppers.creates) == len(payments)
    access = access_lines(deployment.shop_log())
    scrape_pids = {line.pid for line in access if line.path == "/metrics"}
    checkout_pids = {line.pid for line in access if line.path == "/checkout" and line.method == "POST"}
    assert len(scrape_pids) >= 2 and len(checkout_pids) >= 2, (scrape_pids, checkout_pids)
    assert [line for line in access if line.status >= 500] == []
    assert shoppers.recorder.server_errors() == []
    assert tracebacks(deployment.shop_log())[1] == []
    # The worker exited only during the Redis outage and only with the known crash, each time restarted.
    supervisor = deployment.workers
    assert supervisor.errors == []
    assert supervisor.exits == redis_exits, [gone.describe() for gone in supervisor.exits]
    assert supervisor.restarts == len(redis_exits)
    assert all(redis.began <= gone.at <= redis.cleared_doctor for gone in redis_exits), [
        (gone.name, round(gone.at - redis.began, 1)) for gone in redis_exits
    ]
    logs = deployment.celery_logs()
    crashed = {gone.name for gone in redis_exits}
    assert [name for name, log in logs.items() if "Unrecoverable error" in log and name not in crashed] == []

    calls = {
        operation: int(
            last.value("flask_gateway_client_request_duration_seconds_count", operation=operation) or 0
        )
        for operation in ("create", "getstatus", "install")
    }
    phases = {
        phase: sum(1 for p in payments if p.phase == phase)
        for phase in dict.fromkeys(p.phase for p in payments)
    }
    say(
        f"{len(payments)} payments ({len(lost)} with every callback lost: confirmed by reconcile), each "
        f"fulfilled once by the worker's deliver task; by phase: {phases}"
    )
    say(
        f"{len(scrapes)} scrapes over {scrapes[-1].at - scrapes[0].at:.0f} s answered by {len(scrape_pids)} "
        f"gunicorn workers, no counter reset; gateway calls in the last scrape: {calls}"
    )
    for outage in outages:
        say(outage.line())
    if redis_exits:
        say(
            f"worker restarted by its supervisor {supervisor.restarts} time(s) during the Redis outage: "
            + "; ".join(
                f"{gone.describe()} {gone.at - redis.began:.1f} s after Redis stopped" for gone in redis_exits
            )
            + f"; {after_redis} (the restart) connected once Redis was back and ran the tasks again"
        )
    else:
        say(
            "worker restarted by its supervisor: 0 times (no restart: the same worker rode out the Redis outage)"
        )
    say(
        f"'Traceback' lines in the Celery logs: { {name: log.count('Traceback') for name, log in logs.items()} }"
        f"; beat could not send {logs['beat'].count('Message Error')} ticks while Redis was down"
    )
    say(f"doctor during the Redis outage:\n{outages[0].doctor_during}")
    say(f"whole test {time.monotonic() - began:.0f} s")
    return outages


def _all_fulfilled(stack: Stack, payments: list[Payment]) -> bool:
    """Every order fulfilled, and no outbox event of these payments pending any more: the receiver commits
    the fulfilment, the delivery marks its event delivered in a transaction of its own a moment later (what
    each is then is asserted after the wait)."""
    references = [payment.reference for payment in payments]
    if fulfilment_counts(stack, references) != dict.fromkeys(references, 1):
        return False
    pending = fetch_all(
        stack.shop_db,
        "SELECT count(*) FROM gateway_outbox e JOIN gateway_checkouts c ON c.id = e.checkout_id "
        "WHERE c.token = ANY(:tokens) AND e.state = 'pending'",
        tokens=[payment.token for payment in payments],
    )
    return pending == [(0,)]
