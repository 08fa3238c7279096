"""The gateway-call metrics under gunicorn with several workers: prometheus_client's multiprocess mode.

A real server (``gunicorn --workers 4``, sync workers) with docs/operations.md's ``gunicorn.conf.py``
recipe and ``PROMETHEUS_MULTIPROC_DIR`` in its environment, serving a small app whose gateway is the
embedded emulator (``GATEWAY_ENVIRONMENT="embedded"``): ``POST /calls?n=N`` makes N ``getstatus`` calls to
it (each refused with a 4xx: a key the emulator does not know; or a 5xx while its SQLite file is busy: an
error all the same), ``GET /metrics`` answers the registry of ``register_metrics``. Real scrapes over
HTTP, each answered by whichever worker the kernel hands it to, must show every call of every worker,
never less than the scrape before, and the same after a worker is killed and replaced.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from tests import secret_watch
from tests.processes import WAIT_DEADLINE, Server, child_pids, free_port, is_alive, wait_for

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
WORKERS = 4

APP = """
import os

from flask import Flask, Response, request
from flask_sqlalchemy import SQLAlchemy
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from flask_gateway import Gateway, register_metrics
from flask_gateway.core.errors import GatewayError
from flask_gateway.state import get_state

TOKEN = "v2.demo-merchant.6f1c5a0e-2d59-4a51-9a41-0f4b7e9d3c11"


def create_app():
    app = Flask("multiprocess_shop", instance_path=os.environ["MP_INSTANCE"])
    app.config.update(
        SECRET_KEY="multiprocess-shop-secret-key-0123456789",
        SQLALCHEMY_DATABASE_URI=os.environ["MP_DATABASE"],
        GATEWAY_ENVIRONMENT="embedded",
        GATEWAY_MAX_RETRIES=0,
    )
    db = SQLAlchemy()
    db.init_app(app)
    Gateway(app, db=db)
    app.extensions["mp_db"] = db
    registry = CollectorRegistry()
    register_metrics(app, registry)

    @app.post("/calls")
    def calls():
        client = get_state().signed_client("demo-merchant", "not-the-demo-signing-key")
        for _ in range(int(request.args["n"])):
            try:
                client.get_status(TOKEN)
            except GatewayError:
                pass
        return {"pid": os.getpid()}

    @app.get("/metrics")
    def metrics():
        answer = Response(generate_latest(registry), mimetype=CONTENT_TYPE_LATEST)
        answer.headers["X-Worker"] = str(os.getpid())
        return answer

    return app


def init_db():
    app = create_app()
    with app.app_context():
        app.extensions["mp_db"].create_all()
"""

CALLS = "flask_gateway_client_request_duration_seconds_count"
ERRORS = "flask_gateway_client_request_errors_total"


def gunicorn_recipe() -> str:
    """docs/operations.md's ``gunicorn.conf.py`` for multiprocess mode, as written."""
    page = (DOCS / "operations.md").read_text()
    section = page.split("## Metrics and alerts\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    (recipe,) = [block for block in blocks if block.startswith("# gunicorn.conf.py")]
    return recipe


@dataclass
class Scrape:
    worker: int
    calls: float
    errors: float
    infinity_bucket: float
    up_samples: int


@dataclass
class MultiWorkerServer:
    server: Server
    metrics_dir: Path

    @property
    def url(self) -> str:
        return self.server.url

    def workers(self) -> list[int]:
        return child_pids(self.server.process.pid)

    def calls(self, n: int) -> int:
        answer = requests.post(f"{self.url}/calls", params={"n": n}, timeout=60)
        assert answer.status_code == 200, (answer.status_code, self.server.log_tail())
        return int(answer.json()["pid"])

    def scrape(self) -> Scrape:
        answer = requests.get(f"{self.url}/metrics", timeout=60)
        assert answer.status_code == 200, (answer.status_code, self.server.log_tail())
        calls = errors = infinity = 0.0
        up = 0
        for family in text_string_to_metric_families(answer.text):
            for sample in family.samples:
                if sample.name == CALLS and sample.labels == {"operation": "getstatus"}:
                    calls = sample.value
                elif sample.name == ERRORS and sample.labels["operation"] == "getstatus":
                    errors += sample.value  # 4xx (the key is refused); 5xx if the emulator's SQLite is busy
                elif sample.name == CALLS.replace("_count", "_bucket") and sample.labels.get("le") == "+Inf":
                    infinity = sample.value
                elif sample.name == "flask_gateway_up":
                    assert sample.value == 1, self.server.log_tail()
                    up += 1
        return Scrape(int(answer.headers["X-Worker"]), calls, errors, infinity, up)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[MultiWorkerServer]:
    (tmp_path / "mp_app.py").write_text(APP)
    (tmp_path / "gunicorn.conf.py").write_text(gunicorn_recipe())
    metrics_dir = tmp_path / "prometheus"
    metrics_dir.mkdir()
    # A previous run's file (not even a valid one): the recipe removes it before the workers start.
    (metrics_dir / "counter_1.db").write_bytes(b"left over from the last run")
    env = {
        **os.environ,
        "PROMETHEUS_MULTIPROC_DIR": str(metrics_dir),
        "MP_DATABASE": f"sqlite:///{tmp_path / 'shop.db'}",
        "MP_INSTANCE": str(tmp_path / "instance"),
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)]),
    }
    subprocess.run(
        [sys.executable, "-c", "import mp_app; mp_app.init_db()"],
        env=env,
        cwd=tmp_path,
        check=True,
        timeout=120,
    )
    port = free_port()
    log_path = tmp_path / "gunicorn.log"
    command = [
        sys.executable, "-m", "gunicorn", "--config", str(tmp_path / "gunicorn.conf.py"),
        "--workers", str(WORKERS), "--worker-class", "sync", "--bind", f"127.0.0.1:{port}",
        "--timeout", "120", "--graceful-timeout", "5", "--error-logfile", "-", "--log-level", "info",
        "mp_app:create_app()",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path)
    running = Server(name="multiprocess", port=port, process=process, log_path=log_path)
    secret_watch.watch_file(log_path)
    try:

        def answers() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {process.returncode}:\n{running.log_tail()}")
            try:
                requests.get(f"{running.url}/metrics", timeout=60)
            except requests.RequestException:
                return False
            return True

        wait_for(answers, timeout=2 * WAIT_DEADLINE, interval=0.2, what="gunicorn to answer", logs=[running])
        wait_for(lambda: len(child_pids(process.pid)) == WORKERS, what="4 workers", logs=[running])
        yield MultiWorkerServer(running, metrics_dir)
    finally:
        # SIGTERM: gunicorn's graceful stop, each worker finishes the request it is writing (SIGINT, the quick
        # stop, ends a worker mid-write with a SystemExit traceback in the log, a fault of the stop, not of
        # the metrics).
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                running.stop()
    log_text = log_path.read_text(errors="replace")
    assert "Traceback" not in log_text, log_text[-4000:]


def test_every_scrape_counts_every_workers_calls_and_never_goes_down(server: MultiWorkerServer):
    assert not (server.metrics_dir / "counter_1.db").exists()  # the previous run's file is gone
    first = server.scrape()
    assert (first.calls, first.errors, first.up_samples) == (0, 0, 1)

    per_request = 3
    served: list[int] = []
    made = 0
    scrapes: list[Scrape] = []
    stop = threading.Event()

    def keep_scraping() -> None:  # concurrent with the calls: no scrape may ever show less than the last
        while not stop.is_set():
            scrapes.append(server.scrape())

    scraper = threading.Thread(target=keep_scraping)
    scraper.start()
    try:
        with ThreadPoolExecutor(max_workers=WORKERS) as pool:
            served = list(pool.map(lambda _: server.calls(per_request), range(24)))
        made = per_request * len(served)
    finally:
        stop.set()
        scraper.join(timeout=120)
    calls_seen = [scrape.calls for scrape in scrapes]
    assert calls_seen == sorted(calls_seen), calls_seen  # never down
    assert all(0 <= seen <= made for seen in calls_seen)
    assert len(set(served)) >= 2, served  # the calls were spread over several workers

    # At rest: every scrape, whichever worker answers it, shows every call of every worker.
    settled = [server.scrape() for _ in range(12)]
    for scrape in settled:
        assert (scrape.calls, scrape.errors, scrape.infinity_bucket) == (made, made, made), scrape
        assert scrape.up_samples == 1  # the database figures: one collector, collected once
    answered_by = {scrape.worker for scrape in settled} | {scrape.worker for scrape in scrapes}
    assert len(answered_by) >= 2, answered_by  # scrapes answered by several workers, all with the totals
    for scrape in settled:  # the answering worker made only part of the calls it reports
        assert served.count(scrape.worker) * per_request < made == scrape.calls

    # A worker killed (as the OOM killer or --max-requests would end one) and replaced by the master: its
    # calls stay counted; the totals never go down.
    victim = max(set(served) & set(server.workers()), key=served.count)
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: not is_alive(victim), what="the killed worker to end", logs=[server.server])
    replaced = wait_for(
        lambda: len(workers := server.workers()) == WORKERS and victim not in workers and workers,
        what="the master to start a new worker",
        logs=[server.server],
    )
    assert victim not in replaced
    after_kill = [server.scrape() for _ in range(8)]
    assert all(scrape.calls == made for scrape in after_kill), [s.calls for s in after_kill]

    more = [server.calls(per_request) for _ in range(8)]
    made += per_request * len(more)
    final = [server.scrape() for _ in range(8)]
    assert all((s.calls, s.errors) == (made, made) for s in final), [(s.calls, s.errors) for s in final]
