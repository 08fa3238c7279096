"""Prometheus metrics (flask_gateway.operations.metrics): the database figures at scrape time, the transport's observer
for call latency and errors, the optional import, and docs/operations.md's recipe and alert rules."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests
import responses
import yaml  # type: ignore[import-untyped]  # PyYAML comes with schemathesis (dev extras)
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import select
from sqlalchemy.exc import OperationalError

from flask_gateway import models, refund, register_metrics
from flask_gateway.core import http
from flask_gateway.core.client import GatewayClient
from flask_gateway.core.errors import GatewayServerError, GatewayTimeoutError
from flask_gateway.core.http import CallAttempt
from flask_gateway.core.timestamps import utcnow
from flask_gateway.errors import ConfigurationError, RefundDeclinedError
from flask_gateway.operations import metrics as metrics_module
from flask_gateway.operations.metrics import GatewayMetrics
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.extension.conftest import ACCOUNT, Harness, make_shop
from tests.extension.operations.operations_support import load
from tests.extension.operations.test_health import come_back, deliver, fail_callbacks, forge_callback, paid

DOCS = Path(__file__).resolve().parents[3] / "docs"

#: Sample name -> {labels (sorted items) -> value}.
Samples = dict[str, dict[tuple[tuple[str, str], ...], float]]


def scrape(registry: CollectorRegistry) -> Samples:
    """The registry's exposition text, parsed back with prometheus_client's own parser."""
    found: Samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for sample in family.samples:
            found.setdefault(sample.name, {})[tuple(sorted(sample.labels.items()))] = sample.value
    return found


#: The figures labelled by merchant account (issue 27): the label is always there, a shop with one account
#: has its one id on every series. ``value`` names the harness's account unless told another.
BY_ACCOUNT = frozenset(
    {
        "flask_gateway_callbacks_recent",
        "flask_gateway_confirmations_recent",
        "flask_gateway_last_callback_timestamp_seconds",
        "flask_gateway_callbacks_silent",
        "flask_gateway_awaiting_callback_checkouts",
        "flask_gateway_awaiting_callback_oldest_age_seconds",
        "flask_gateway_refunds",
    }
)


def value(samples: Samples, name: str, **labels: str) -> float:
    if name in BY_ACCOUNT:
        labels.setdefault("account", ACCOUNT)
    return samples[name][tuple(sorted(labels.items()))]


@pytest.fixture
def installed(harness: Harness) -> Harness:
    harness.install()
    return harness


@pytest.fixture
def registered(installed: Harness) -> Iterator[GatewayMetrics]:
    handle = register_metrics(installed.shop, CollectorRegistry())
    yield handle
    handle.unregister()


# --- the transport's observers (the core) ------------------------------------------------------------

BASE = "https://gateway.test"
TOKEN = "v2.merchant-1.6f1c5a0e-2d59-4a51-9a41-0f4b7e9d3c11"
STATUS = {"checkoutToken": TOKEN, "checkoutTotalCents": 3000, "checkoutPaymentStatus": "PAID"}


@pytest.fixture
def attempts() -> Iterator[list[CallAttempt]]:
    seen: list[CallAttempt] = []
    http.add_observer(seen.append)
    yield seen
    http.remove_observer(seen.append)


def client(retries: int = 2) -> GatewayClient:
    return GatewayClient(
        base_url=BASE,
        merchant_account_id="merchant-1",
        signing_key="k" * 16,
        max_retries=retries,
        sleep=lambda _: None,
    )


@responses.activate
def test_the_transport_tells_its_observers_every_attempt(attempts, monkeypatch):
    # The transport's clock is the test's: each answer "takes" what its callback moves the clock by.
    clock = [100.0]
    monkeypatch.setattr(http, "time", SimpleNamespace(perf_counter=lambda: clock[0]))

    def answer(status: int, body: dict[str, Any], takes: float) -> Any:
        def respond(_request: Any) -> tuple[int, dict[str, str], str]:
            clock[0] += takes
            return status, {"Content-Type": "application/json"}, json.dumps(body)

        return respond

    responses.add_callback(
        responses.POST, f"{BASE}/v2/getstatus", callback=answer(503, {"message": "busy"}, 0.25)
    )
    responses.add_callback(responses.POST, f"{BASE}/v2/getstatus", callback=answer(200, STATUS, 1.5))
    client().get_status(TOKEN)
    assert [(a.operation, a.method, a.attempt, a.http_status, a.failure) for a in attempts] == [
        ("getstatus", "POST", 1, 503, None),
        ("getstatus", "POST", 2, 200, None),
    ]
    assert [a.seconds for a in attempts] == [0.25, 1.5]  # from sending each request to its answer

    attempts.clear()
    responses.post(f"{BASE}/v2/cancel", body=requests.ReadTimeout("slow"))
    responses.post(f"{BASE}/v2/getstatus", body=requests.ConnectionError("refused"))
    with pytest.raises(GatewayTimeoutError):
        client().cancel_checkout(TOKEN)
    with pytest.raises(Exception, match="could not reach"):
        client(retries=0).get_status(TOKEN)
    assert [(a.operation, a.http_status, a.failure) for a in attempts] == [
        ("cancel", None, "timeout"),  # cancel is not repeated after a read timeout
        ("getstatus", None, "connection"),
    ]


@responses.activate
def test_an_observer_that_raises_never_fails_the_call(attempts, caplog):
    def broken(attempt: CallAttempt) -> None:
        raise RuntimeError("observer bug")

    http.add_observer(broken)
    http.add_observer(broken)  # once only
    try:
        responses.post(f"{BASE}/v2/getstatus", json=STATUS)
        assert client().get_status(TOKEN).data.checkoutPaymentStatus == "PAID"
    finally:
        http.remove_observer(broken)
    assert len(attempts) == 1  # the observers after it still ran
    assert [r.message for r in caplog.records if "observer" in r.message] == [
        f"gateway call observer {broken!r} failed"
    ]
    http.remove_observer(attempts.append)
    responses.post(f"{BASE}/v2/getstatus", status=500, json={})
    with pytest.raises(GatewayServerError):
        client(retries=0).get_status(TOKEN)
    assert len(attempts) == 1  # removed: no longer told


# --- the database figures ------------------------------------------------------------------------------


@pytest.mark.backends
def test_a_scrape_reads_the_figures_from_the_database(installed: Harness, registered: GatewayMetrics):
    registry = registered.registry
    quiet = scrape(registry)
    assert value(quiet, "flask_gateway_up") == 1
    assert value(quiet, "flask_gateway_callbacks_silent") == 0
    assert value(quiet, "flask_gateway_confirmations_recent", path="callback") == 0
    assert "flask_gateway_last_callback_timestamp_seconds" not in quiet  # none ever received

    by_callback, token = paid(installed, "ORD-CB")
    deliver(installed)
    by_return, _ = paid(installed, "ORD-RET")
    come_back(installed, by_return)
    deliver(installed)
    forge_callback(installed, token)
    fail_callbacks(installed)
    waiting, _ = paid(installed, "ORD-WAIT")
    come_back(installed, waiting)  # its callback never comes
    installed.emulator.control("faults", {"operation": "refund", "kind": "status", "status": 400})
    with installed.shop.app_context():
        with pytest.raises(RefundDeclinedError):
            refund(load(installed, by_callback), 1000)
        received_at = get_state().session.scalar(
            select(models.CallbackLog.received_at)
            .where(models.CallbackLog.verified.is_(True))
            .order_by(models.CallbackLog.id.desc())
            .limit(1)
        )
        waiting_paid_at = load(installed, waiting).paid_at

    scraped_from = utcnow()
    samples = scrape(registry)
    scraped_by = utcnow()

    assert value(samples, "flask_gateway_up") == 1
    assert value(samples, "flask_gateway_metrics_window_seconds") == 3600
    assert value(samples, "flask_gateway_callbacks_recent", outcome="accepted") == 2
    assert value(samples, "flask_gateway_callbacks_recent", outcome="rejected-signature") == 1
    assert value(samples, "flask_gateway_callbacks_recent", outcome="mismatch") == 0
    assert value(samples, "flask_gateway_confirmations_recent", path="callback") == 1
    assert value(samples, "flask_gateway_confirmations_recent", path="return") == 2
    assert value(samples, "flask_gateway_confirmations_recent", path="reconcile") == 0
    assert value(samples, "flask_gateway_refunds", state="FAILED") == 1
    assert value(samples, "flask_gateway_refunds", state="SUCCEEDED") == 0
    assert value(samples, "flask_gateway_awaiting_callback_checkouts") == 1
    age = value(samples, "flask_gateway_awaiting_callback_oldest_age_seconds")
    # Its age at the scrape: between the ages before and after it (the order of events, not a duration).
    assert (
        (scraped_from - waiting_paid_at).total_seconds()
        <= age
        <= (scraped_by - waiting_paid_at).total_seconds()
    )
    last = value(samples, "flask_gateway_last_callback_timestamp_seconds")
    assert last == pytest.approx(received_at.timestamp(), abs=0.001)
    assert value(samples, "flask_gateway_callbacks_silent") == 0

    # This process's calls to the gateway, per operation: three creates; a getstatus for the callback that
    # confirmed ORD-CB and for each return (ORD-RET's callback found its payment known: no call); the
    # declined refund (a 400 is not retried).
    calls = "flask_gateway_client_request_duration_seconds_count"
    assert value(samples, calls, operation="create") == 3
    assert value(samples, calls, operation="getstatus") == 3
    assert value(samples, calls, operation="refund") == 1
    assert value(samples, "flask_gateway_client_request_errors_total", operation="refund", kind="4xx") == 1
    assert ("operation", "getstatus") not in {
        label for labels in samples["flask_gateway_client_request_errors_total"] for label in labels
    }


@pytest.mark.backends
def test_every_worker_reports_the_same_database_figures(installed: Harness, databases: Databases):
    """A second app on the same database (another worker process, another machine) scrapes the same."""
    checkout_id, _ = paid(installed, "ORD-1")
    come_back(installed, checkout_id)
    other, db, _gateway = make_shop(databases.url("main"))
    first = register_metrics(installed.shop, CollectorRegistry())
    second = register_metrics(other, CollectorRegistry())
    try:
        here, there = scrape(first.registry), scrape(second.registry)
    finally:
        first.unregister()
        second.unregister()
        with other.app_context():
            get_state().dispose()
            db.engine.dispose()
    for name in ("flask_gateway_confirmations_recent", "flask_gateway_awaiting_callback_checkouts"):
        assert here[name] == there[name], name
    assert value(there, "flask_gateway_confirmations_recent", path="return") == 1


def test_the_recent_window_is_the_registrations(installed: Harness):
    checkout_id, _ = paid(installed, "ORD-1")
    come_back(installed, checkout_id)
    with installed.shop.app_context():
        checkout = load(installed, checkout_id)
        assert checkout.payment_confirmed_at is not None
        checkout.payment_confirmed_at = checkout.payment_confirmed_at - timedelta(minutes=20)
        for event in checkout.events:
            event.at -= timedelta(minutes=20)
        get_state().session.commit()
    short = register_metrics(installed.shop, CollectorRegistry(), window=timedelta(minutes=10))
    try:
        samples = scrape(short.registry)
    finally:
        short.unregister()
    assert value(samples, "flask_gateway_metrics_window_seconds") == 600
    assert value(samples, "flask_gateway_confirmations_recent", path="return") == 0  # 20 minutes ago
    with pytest.raises(ValueError, match="positive"):
        register_metrics(installed.shop, CollectorRegistry(), window=timedelta())


def test_the_outbox_backlog_where_there_is_an_outbox(
    installed: Harness, registered: GatewayMetrics, monkeypatch: pytest.MonkeyPatch
):
    outbox = getattr(models, "OutboxEvent", None)
    if outbox is None:
        pytest.skip("this version has no outbox (flask_gateway.models.OutboxEvent)")
    checkout_id, _ = paid(installed, "ORD-1")
    come_back(installed, checkout_id)
    before = scrape(registered.registry)
    pending = value(before, "flask_gateway_outbox_events", state="pending")
    dead = value(before, "flask_gateway_outbox_events", state="dead")
    now = utcnow()
    with installed.shop.app_context():
        session = get_state().session
        for state, minutes in (("pending", 10), ("pending", 2), ("dead", 60)):
            session.add(
                outbox(
                    checkout_id=checkout_id,
                    kind="payment_confirmed",
                    payload={},
                    state=state,
                    attempts=8 if state == "dead" else 1,
                    created_at=now - timedelta(minutes=minutes),
                    next_attempt_at=now + timedelta(minutes=5),
                    last_error="RuntimeError: the warehouse is closed",
                )
            )
        session.commit()
    samples = scrape(registered.registry)
    assert value(samples, "flask_gateway_outbox_events", state="pending") == pending + 2
    assert value(samples, "flask_gateway_outbox_events", state="dead") == dead + 1
    assert value(samples, "flask_gateway_outbox_oldest_pending_age_seconds") >= 600

    monkeypatch.delattr(models, "OutboxEvent")
    without = scrape(registered.registry)
    assert "flask_gateway_outbox_events" not in without
    assert "flask_gateway_outbox_oldest_pending_age_seconds" not in without
    assert value(without, "flask_gateway_up") == 1


def test_without_an_outbox_the_rest_is_scraped(
    installed: Harness, registered: GatewayMetrics, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delattr(models, "OutboxEvent", raising=False)
    samples = scrape(registered.registry)
    assert value(samples, "flask_gateway_up") == 1
    assert not any(name.startswith("flask_gateway_outbox") for name in samples)


def test_a_database_that_cannot_be_read_is_up_0_not_a_failed_scrape(
    installed: Harness, registered: GatewayMetrics, monkeypatch: pytest.MonkeyPatch, caplog
):
    def broken(**_options):
        raise OperationalError("SELECT 1", {}, Exception("no such table: gateway_callback_log"))

    monkeypatch.setattr(metrics_module, "callback_health", broken)
    samples = scrape(registered.registry)
    assert value(samples, "flask_gateway_up") == 0
    assert "flask_gateway_confirmations_recent" not in samples
    assert "the database could not be read" in caplog.text


def test_a_database_outage_is_up_0_without_a_traceback_per_scrape(
    installed: Harness, registered: GatewayMetrics, monkeypatch: pytest.MonkeyPatch, caplog
):
    """``flask_gateway_up`` 0 says it at every scrape; the log is not filled with one traceback each."""

    def away(**_options):
        raise OperationalError("SELECT 1", {}, Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(metrics_module, "callback_health", away)
    for _ in range(3):
        assert value(scrape(registered.registry), "flask_gateway_up") == 0
    assert not [r for r in caplog.records if r.levelno >= 30 or r.exc_info]


def test_unregister_takes_everything_out(installed: Harness):
    registry = CollectorRegistry()
    handle = register_metrics(installed.shop, registry)
    assert handle.calls in http._observers
    handle.unregister()
    assert handle.calls not in http._observers
    assert generate_latest(registry) == b""


def test_one_app_per_registry(installed: Harness):
    registry = CollectorRegistry()
    handle = register_metrics(installed.shop, registry)
    try:
        with pytest.raises(ValueError, match="Duplicated"):
            register_metrics(installed.shop, registry)  # one app per registry: the names would collide
        assert handle.calls in http._observers  # the refused registration took nothing away
    finally:
        handle.unregister()


# --- prometheus_client is optional ---------------------------------------------------------------------


def test_without_prometheus_client_the_module_imports_and_register_metrics_says_what_to_install():
    code = (
        "import sys\n"
        "sys.modules['prometheus_client'] = None  # not installed\n"
        "import flask_gateway.operations.metrics as m\n"
        "from flask import Flask\n"
        "try:\n"
        "    m.register_metrics(Flask('x'))\n"
        "except Exception as error:\n"
        "    print(m.PROMETHEUS, type(error).__name__, error)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.startswith("False ConfigurationError Prometheus metrics need the prometheus_client")
    assert 'pip install "flask-bnpl-gateway[metrics]"' in result.stdout


def test_prometheus_client_is_imported_by_the_metrics_module_only():
    code = (
        "import sys, importlib, pkgutil, flask_gateway\n"
        "for info in pkgutil.iter_modules(flask_gateway.__path__):\n"
        "    if info.name not in ('metrics', 'testing', 'pytest_plugin'):\n"
        "        importlib.import_module('flask_gateway.' + info.name)\n"
        "print('prometheus_client' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "False"


def test_register_metrics_refuses_without_the_package(installed: Harness, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(metrics_module, "PROMETHEUS", False)
    with pytest.raises(ConfigurationError, match=re.escape('pip install "flask-bnpl-gateway[metrics]"')):
        register_metrics(installed.shop, CollectorRegistry())


# --- docs/operations.md: the recipe and the alert rules ---------------------------------------------------


def _section(heading: str) -> str:
    page = (DOCS / "operations.md").read_text()
    return page.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", _section("Metrics and alerts"), flags=re.DOTALL)


def test_the_recipe_serves_the_metrics_behind_a_token(installed: Harness, monkeypatch: pytest.MonkeyPatch):
    (recipe,) = [block for block in _blocks("python") if block.startswith("# metrics.py")]
    namespace: dict[str, object] = {"__name__": "shop_metrics"}
    exec(compile(recipe, "docs/operations.md#metrics.py", "exec"), namespace)  # noqa: S102
    app = installed.shop
    app.config["METRICS_TOKEN"] = "scraper-token-0123456789"
    handle = namespace["init_metrics"](app)  # type: ignore[operator]
    try:
        client = app.test_client()
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers={"Authorization": "Bearer wrong"}).status_code == 401
        answer = client.get("/metrics", headers={"Authorization": "Bearer scraper-token-0123456789"})
        assert answer.status_code == 200
        assert answer.mimetype == "text/plain"
        families = {f.name for f in text_string_to_metric_families(answer.get_data(as_text=True))}
        assert {"flask_gateway_up", "flask_gateway_callbacks_silent", "flask_gateway_refunds"} <= families
        assert "python_gc_objects_collected" not in families  # the app's own registry, not the process's
        # Every metric the alert rules name is one a scrape shows.
        exposed = set(scrape(handle.registry)) | {
            f"flask_gateway_client_request_duration_seconds_{suffix}" for suffix in ("bucket", "count", "sum")
        }
        exposed |= {"flask_gateway_client_request_errors_total", "flask_gateway_outbox_events"}
        exposed |= {"flask_gateway_outbox_oldest_pending_age_seconds"}
        (rules,) = [yaml.safe_load(block) for block in _blocks("yaml") if block.startswith("groups:")]
        named = set()
        for group in rules["groups"]:
            for rule in group["rules"]:
                assert {"alert", "expr", "for", "labels", "annotations"} <= set(rule), rule
                named |= set(re.findall(r"flask_gateway_\w+", rule["expr"]))
        assert named and named <= exposed, named - exposed
        assert {"GatewayCallbacksSilent", "GatewayCallbackOverdue"} <= {
            rule["alert"] for group in rules["groups"] for rule in group["rules"]
        }
    finally:
        handle.unregister()  # type: ignore[attr-defined]


def test_the_scrape_config_sends_the_token():
    (config,) = [yaml.safe_load(block) for block in _blocks("yaml") if block.startswith("scrape_configs:")]
    job = config["scrape_configs"][0]
    assert job["metrics_path"] == "/metrics"
    assert job["authorization"]["credentials_file"]


# --- the background jobs' heartbeats (flask_gateway.payments.heartbeats) ------------------------------------------


def _job_row(app, job: str) -> models.JobRun:
    with app.app_context():
        session = get_state().session
        row = session.get(models.JobRun, job)
        assert row is not None
        session.expunge(row)
        session.rollback()
        return row


@pytest.mark.backends
def test_the_heartbeats_of_the_background_jobs(installed: Harness, registered: GatewayMetrics):
    from flask_gateway import deliver_due
    from flask_gateway.payments.heartbeats import record_run

    quiet = scrape(registered.registry)
    assert value(quiet, "flask_gateway_job_overdue", job="deliver") == 0  # installed a moment ago
    assert value(quiet, "flask_gateway_job_overdue", job="reconcile") == 0
    assert "flask_gateway_job_last_run_timestamp_seconds" not in quiet  # absent: never ran
    assert "flask_gateway_job_last_success_timestamp_seconds" not in quiet

    app = installed.shop
    with app.app_context():
        deliver_due()
        with record_run("reconcile") as run:
            run.done("Polled 1 of 1 due checkout(s): 1 could not be polled", failed=True)
    delivered, reconciled = _job_row(app, "deliver"), _job_row(app, "reconcile")
    assert delivered.last_finished_at is not None and reconciled.last_finished_at is not None
    samples = scrape(registered.registry)
    last_run = "flask_gateway_job_last_run_timestamp_seconds"
    last_success = "flask_gateway_job_last_success_timestamp_seconds"
    assert value(samples, last_run, job="deliver") == pytest.approx(delivered.last_finished_at.timestamp())
    assert value(samples, last_success, job="deliver") == value(samples, last_run, job="deliver")
    assert value(samples, last_run, job="reconcile") == pytest.approx(reconciled.last_finished_at.timestamp())
    assert ("job", "reconcile") not in {label for labels in samples[last_success] for label in labels}
    assert value(samples, "flask_gateway_job_overdue", job="deliver") == 0

    # Past the bound: the deliver job last ran two bounds ago (another machine's cron stopped, say).
    with app.app_context():
        bound = timedelta(seconds=get_state().config.deliver_stale_seconds)
        session = get_state().session
        row = session.get(models.JobRun, "deliver")
        assert row is not None
        two_bounds_ago = utcnow() - 2 * bound
        row.last_finished_at = row.last_succeeded_at = two_bounds_ago
        session.commit()
    stale = scrape(registered.registry)
    assert value(stale, "flask_gateway_job_overdue", job="deliver") == 1
    assert value(stale, last_run, job="deliver") == pytest.approx(two_bounds_ago.timestamp())


def test_heartbeats_that_cannot_be_read_leave_the_rest_scraped(
    installed: Harness, registered: GatewayMetrics, monkeypatch: pytest.MonkeyPatch, caplog
):
    from flask_gateway.payments import heartbeats

    def missing(**_options):
        raise OperationalError("SELECT", {}, Exception("no such table: gateway_job_runs"))

    monkeypatch.setattr(heartbeats, "job_status", missing)
    samples = scrape(registered.registry)
    assert value(samples, "flask_gateway_up") == 1
    assert not any(name.startswith("flask_gateway_job_") for name in samples)
    assert "heartbeats could not be read (not migrated?)" in caplog.text

    def away(**_options):
        raise OperationalError("SELECT", {}, Exception("server closed the connection unexpectedly"))

    monkeypatch.setattr(heartbeats, "job_status", away)
    assert value(scrape(registered.registry), "flask_gateway_up") == 0  # the database, not the table


# --- multiprocess mode: refused with its fix when it cannot work ------------------------------------------


def test_multiprocess_mode_after_prometheus_client_was_imported_is_refused(
    installed: Harness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """This process imported prometheus_client without the variable: its values live in memory."""
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    registry = CollectorRegistry()
    with pytest.raises(ConfigurationError, match="not when prometheus_client was first imported"):
        register_metrics(installed.shop, registry)
    assert generate_latest(registry) == b""  # nothing left registered
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR")
    register_metrics(installed.shop, registry).unregister()  # without the variable: as before


def test_multiprocess_mode_registers_the_files_collector(
    installed: Harness, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    from prometheus_client import values
    from prometheus_client.multiprocess import MultiProcessCollector

    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path / "missing"))
    monkeypatch.setattr(values, "ValueClass", values.MultiProcessValue())  # as if imported with it set
    with pytest.raises(ConfigurationError, match="is not a directory this process can write"):
        register_metrics(installed.shop, CollectorRegistry())
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(tmp_path))
    registry = CollectorRegistry()
    handle = register_metrics(installed.shop, registry)
    try:
        assert isinstance(handle.processes, MultiProcessCollector)
        assert handle.calls.registry is None  # the call metrics are in no registry: in the files
        handle.calls(CallAttempt("getstatus", "POST", 1, 0.2, 503, None))
        samples = scrape(registry)
        assert (
            value(samples, "flask_gateway_client_request_duration_seconds_count", operation="getstatus") == 1
        )
        assert (
            value(samples, "flask_gateway_client_request_errors_total", operation="getstatus", kind="5xx")
            == 1
        )
        assert value(samples, "flask_gateway_up") == 1
        assert list(tmp_path.glob("*.db"))  # written to this process's files
    finally:
        handle.unregister()
        _close_multiprocess_files(values.ValueClass)
    assert handle.calls not in http._observers
    assert generate_latest(registry) == b""


def _close_multiprocess_files(value_class: Any) -> None:
    """Close the files prometheus_client's multiprocess values opened in this process (the test's folder
    goes away): ``close_all_files`` where it exists (0.21 and later); before it, the files are held in the
    value class's closure, as a dict of ``MmapedDict``."""
    close_all = getattr(value_class, "close_all_files", None)
    if close_all is not None:
        close_all()
        return
    for attribute in vars(value_class).values():
        for cell in getattr(attribute, "__closure__", None) or ():
            held = cell.cell_contents
            if isinstance(held, dict):
                for opened in held.values():
                    if hasattr(opened, "close"):
                        opened.close()
                held.clear()
