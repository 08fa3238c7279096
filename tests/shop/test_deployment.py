"""The example shop as a deployable reference (issue 25): its deployment settings from the environment, the
metrics route behind its token, ProxyFix, the login's word on a Secure cookie over http, and the three
files an operator runs (``wsgi.py``, ``celery_app.py``, ``gunicorn.conf.py``), the last under a real gunicorn.
"""

from __future__ import annotations

import json
import logging
import os
import re
import runpy
import signal
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import requests
from flask import Flask, request, url_for
from werkzeug.security import generate_password_hash

from example_shop import create_app
from example_shop.config import ShopConfigError, resolve
from example_shop.extensions import db
from example_shop.views import SECURE_COOKIE_OVER_HTTP
from tests import secret_watch
from tests.conftest import Databases
from tests.processes import free_port, wait_for
from tests.shop.conftest import (
    OWNER_HASH,
    OWNER_PASSWORD,
    SHOP_URL,
    ShopHarness,
    Shopper,
    csrf_token,
    make_harness,
    shop_config,
)

ROOT = Path(__file__).resolve().parents[2]
GUNICORN_CONF = ROOT / "example_shop" / "gunicorn.conf.py"
TOKEN = "metrics-token-for-the-shop-tests-0123456789"
#: What every production start needs besides the database (config.py refuses to start without them).
PRODUCTION = {
    "SHOP_ENV": "production",
    "SHOP_SECRET_KEY": "s" * 64,
    "SHOP_ADMIN_PASSWORD_HASH": OWNER_HASH,
}


def _resolve(tmp_path: Path, **environ: str) -> dict[str, Any]:
    return resolve({}, environ=environ, instance_path=tmp_path / "instance")


# --- the database: one name, SHOP_DATABASE_URL -------------------------------------------------------------


def test_production_without_shop_database_url_refuses_to_start(tmp_path: Path) -> None:
    with pytest.raises(ShopConfigError, match="SHOP_ENV=production needs SHOP_DATABASE_URL") as refused:
        _resolve(tmp_path, **PRODUCTION)
    assert "instance/example_shop.sqlite3" in str(refused.value)  # says what it did not fall back to
    assert not (tmp_path / "instance" / "example_shop.sqlite3").exists()


@pytest.mark.parametrize("other", ["SQLALCHEMY_DATABASE_URI", "DATABASE_URL"])
def test_production_names_the_variable_it_read_when_another_name_is_set(tmp_path: Path, other: str) -> None:
    url = "postgresql+psycopg://shop:hunter2-password@db:5432/shop"
    with pytest.raises(ShopConfigError) as refused:
        _resolve(tmp_path, **PRODUCTION, **{other: url})
    message = str(refused.value)
    assert f"The environment has {other}, which the shop does not read" in message
    assert "name the URL SHOP_DATABASE_URL" in message
    assert "hunter2-password" not in message


def test_development_warns_that_another_name_is_ignored_and_uses_its_file(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="example_shop.config"):
        config = _resolve(tmp_path, DATABASE_URL="postgresql+psycopg://shop:hunter2-password@db/shop")
    assert config["SQLALCHEMY_DATABASE_URI"].endswith("/instance/example_shop.sqlite3")
    warnings = [r.getMessage() for r in caplog.records if r.name == "example_shop.config"]
    assert len(warnings) == 1
    assert "DATABASE_URL, which the shop does not read" in warnings[0]
    assert "SHOP_DATABASE_URL" in warnings[0]
    assert "hunter2-password" not in warnings[0]


def test_development_without_any_database_name_says_nothing(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="example_shop.config"):
        config = _resolve(tmp_path)
    assert config["SQLALCHEMY_DATABASE_URI"].endswith("/instance/example_shop.sqlite3")
    assert not [r for r in caplog.records if r.name == "example_shop.config"]


def test_production_takes_sqlite_when_it_is_named(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    config = _resolve(tmp_path, **PRODUCTION, SHOP_DATABASE_URL=url, DATABASE_URL="postgresql://elsewhere/x")
    assert config["SQLALCHEMY_DATABASE_URI"] == url


def test_a_database_url_that_is_no_url_is_refused_without_repeating_it(tmp_path: Path) -> None:
    with pytest.raises(ShopConfigError, match="SHOP_DATABASE_URL is not a database URL") as refused:
        _resolve(tmp_path, SHOP_DATABASE_URL="shop:hunter2-password@db")
    assert "hunter2-password" not in str(refused.value)


# --- the pool -----------------------------------------------------------------------------------------------


def test_pool_size_and_overflow_reach_the_engine(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'shop.sqlite3'}"
    app = create_app(shop_config(url, SHOP_DB_POOL_SIZE="7", SHOP_DB_MAX_OVERFLOW="3"))
    assert app.config["SQLALCHEMY_ENGINE_OPTIONS"] == {
        "pool_pre_ping": True,
        "pool_size": 7,
        "max_overflow": 3,
    }
    with app.app_context():
        pool = db.engine.pool
        assert pool.size() == 7  # type: ignore[attr-defined]
        assert pool._max_overflow == 3  # type: ignore[attr-defined]


def test_without_pool_settings_the_engine_options_stay_as_they_were(tmp_path: Path) -> None:
    config = _resolve(tmp_path, SHOP_DATABASE_URL=f"sqlite:///{tmp_path / 's.db'}")
    assert config["SQLALCHEMY_ENGINE_OPTIONS"] == {"pool_pre_ping": True}


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        ({"SHOP_DB_POOL_SIZE": "many"}, "SHOP_DB_POOL_SIZE='many' is not a whole number"),
        ({"SHOP_DB_POOL_SIZE": "0"}, "SHOP_DB_POOL_SIZE='0': give a whole number, 1 or more"),
        ({"SHOP_DB_MAX_OVERFLOW": "-1"}, "SHOP_DB_MAX_OVERFLOW='-1': give a whole number, 0 or more"),
        ({"SHOP_DB_MAX_OVERFLOW": "2.5"}, "SHOP_DB_MAX_OVERFLOW='2.5' is not a whole number"),
    ],
)
def test_bad_pool_values_are_explained(tmp_path: Path, environ: dict[str, str], message: str) -> None:
    with pytest.raises(ShopConfigError, match=re.escape(message)):
        _resolve(tmp_path, SHOP_DATABASE_URL=f"sqlite:///{tmp_path / 's.db'}", **environ)


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:"])
def test_pool_settings_on_an_in_memory_database_are_refused(tmp_path: Path, url: str) -> None:
    with pytest.raises(ShopConfigError, match="SHOP_DB_POOL_SIZE means nothing for an in-memory SQLite"):
        _resolve(tmp_path, SHOP_DATABASE_URL=url, SHOP_DB_POOL_SIZE="5")


# --- the Celery broker, the metrics token, the proxies, the log format -----------------------------------


def test_the_celery_broker_becomes_celerys_config_and_nothing_connects(tmp_path: Path) -> None:
    # A port nobody listens on: create_app would fail (or hang) if it connected.
    broker = f"redis://127.0.0.1:{free_port()}/0"
    app = create_app(shop_config(f"sqlite:///{tmp_path / 's.db'}", SHOP_CELERY_BROKER_URL=broker))
    assert app.config["CELERY"] == {"broker_url": broker}
    assert "CELERY" not in _resolve(tmp_path)


def test_a_broker_that_is_no_url_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ShopConfigError, match="SHOP_CELERY_BROKER_URL is not a broker URL"):
        _resolve(tmp_path, SHOP_CELERY_BROKER_URL="localhost:6379")


@pytest.mark.parametrize("token", ["short", "has a space in the middle of it"])
def test_a_weak_metrics_token_is_refused(tmp_path: Path, token: str) -> None:
    with pytest.raises(ShopConfigError, match="SHOP_METRICS_TOKEN is too short or holds spaces"):
        _resolve(tmp_path, SHOP_METRICS_TOKEN=token)


@pytest.mark.parametrize(("raw", "hops"), [("", 0), ("0", 0), ("2", 2)])
def test_trusted_proxies_good_values(tmp_path: Path, raw: str, hops: int) -> None:
    assert _resolve(tmp_path, SHOP_TRUSTED_PROXIES=raw)["SHOP_TRUSTED_PROXIES"] == hops


@pytest.mark.parametrize("raw", ["one", "-1"])
def test_trusted_proxies_bad_values(tmp_path: Path, raw: str) -> None:
    with pytest.raises(ShopConfigError, match="SHOP_TRUSTED_PROXIES="):
        _resolve(tmp_path, SHOP_TRUSTED_PROXIES=raw)


def test_log_format(tmp_path: Path) -> None:
    assert _resolve(tmp_path)["SHOP_LOG_FORMAT"] == "text"
    assert _resolve(tmp_path, SHOP_LOG_FORMAT="JSON")["SHOP_LOG_FORMAT"] == "json"
    with pytest.raises(ShopConfigError, match="SHOP_LOG_FORMAT='xml': use 'text'"):
        _resolve(tmp_path, SHOP_LOG_FORMAT="xml")


# --- GET /metrics --------------------------------------------------------------------------------------------


def test_no_token_no_metrics_route(shop: ShopHarness) -> None:
    assert shop.app.test_client().get(f"{SHOP_URL}/metrics").status_code == 404


def test_metrics_route_needs_the_token_and_serves_the_gateways_figures(
    databases: Databases, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    shop = make_harness(databases, monkeypatch, SHOP_METRICS_TOKEN=TOKEN)  # installing calls the gateway
    client = shop.app.test_client()
    for headers in (
        {},
        {"Authorization": "Bearer wrong-token-of-the-same-kind-0123456789"},
        {"Authorization": TOKEN},
    ):
        refused = client.get(f"{SHOP_URL}/metrics", headers=headers)
        assert refused.status_code == 401
        assert refused.headers["WWW-Authenticate"].startswith("Bearer")
        assert b"flask_gateway" not in refused.data

    scrape = client.get(f"{SHOP_URL}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert scrape.status_code == 200
    assert scrape.headers["Content-Type"].startswith("text/plain; version=")
    body = scrape.get_data(as_text=True)
    assert "\nflask_gateway_up 1.0\n" in body  # the database figures, read at the scrape
    assert "flask_gateway_outbox_events" in body
    calls = re.findall(
        r'^flask_gateway_client_request_duration_seconds_count\{operation="[^"]+"\} (\S+)$', body, re.M
    )
    assert calls and sum(float(count) for count in calls) >= 1  # the installation's calls, this process's
    # Nothing of the shop's own pages: no session cookie, no page headers for a scraper.
    assert "Set-Cookie" not in scrape.headers


def test_a_scrape_while_the_database_is_away_answers_with_up_0(monkeypatch: pytest.MonkeyPatch) -> None:
    """Prometheus hears of the outage from the figures (``flask_gateway_up 0``), not from a failed scrape."""
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    away = f"postgresql+psycopg://shop:secret-password@127.0.0.1:{free_port()}/shop"
    app = create_app(shop_config(away, SHOP_METRICS_TOKEN=TOKEN))
    scrape = app.test_client().get(f"{SHOP_URL}/metrics", headers={"Authorization": f"Bearer {TOKEN}"})
    assert scrape.status_code == 200
    assert "\nflask_gateway_up 0.0\n" in scrape.get_data(as_text=True)


def test_metrics_token_without_prometheus_client_is_a_clear_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # import fails as if not installed
    with pytest.raises(ShopConfigError, match=r"flask-bnpl-gateway\[metrics\]"):
        create_app(shop_config(f"sqlite:///{tmp_path / 's.db'}", SHOP_METRICS_TOKEN=TOKEN))


# --- ProxyFix ------------------------------------------------------------------------------------------------


def _echo(app: Flask) -> Flask:
    def where() -> dict[str, Any]:
        return {"url": url_for("shop.index", _external=True), "remote": request.remote_addr}

    app.add_url_rule("/_where", "where", where)
    return app


FORWARDED = {
    "X-Forwarded-Proto": "https",
    "X-Forwarded-Host": "shop.example.com",
    "X-Forwarded-For": "198.51.100.7",
}


def test_behind_a_trusted_proxy_urls_are_https_and_the_client_is_the_shopper(tmp_path: Path) -> None:
    app = _echo(create_app(shop_config(f"sqlite:///{tmp_path / 's.db'}", SHOP_TRUSTED_PROXIES="1")))
    answer = app.test_client().get("http://10.0.0.5:8000/_where", headers=FORWARDED).json
    assert answer == {"url": "https://shop.example.com/", "remote": "198.51.100.7"}


def test_without_trusted_proxies_the_forwarded_headers_are_not_believed(tmp_path: Path) -> None:
    app = _echo(create_app(shop_config(f"sqlite:///{tmp_path / 's.db'}")))
    answer = app.test_client().get("http://10.0.0.5:8000/_where", headers=FORWARDED).json
    assert answer == {"url": "http://10.0.0.5:8000/", "remote": "127.0.0.1"}


# --- the login over plain http with a Secure cookie ---------------------------------------------------------


def _production(databases: Databases, **config: Any) -> Flask:
    from tests.shop.conftest import create_shop

    return create_shop(shop_config(databases.url(), SHOP_ENV="production", **config))


def _http_login_post(app: Flask, base: str, headers: dict[str, str] | None = None) -> Any:
    """The owner's login as a browser does it over ``base``: the form's page, then its POST. A browser keeps
    a Secure cookie for https only, so over http the POST comes without the session (a fresh client)."""
    page = app.test_client().get(f"{base}/admin/login", headers=headers or {})
    assert "Secure" in page.headers["Set-Cookie"]
    data = {"csrf_token": csrf_token(page.get_data(as_text=True)), "password": OWNER_PASSWORD}
    return app.test_client().post(f"{base}/admin/login", data=data, headers=headers or {})


def test_login_over_http_with_a_secure_cookie_names_the_cause_and_the_fix(databases: Databases) -> None:
    app = _production(databases)
    answer = _http_login_post(app, "http://shop.example")
    assert answer.status_code == 400
    page = answer.get_data(as_text=True)
    assert "This shop needs https" in page
    assert "SHOP_TRUSTED_PROXIES" in page and "https://" in page and "Secure" in page
    assert "The form had expired" not in page
    assert "SHOP_TRUSTED_PROXIES" in SECURE_COOKIE_OVER_HTTP


def test_a_lost_session_over_https_still_says_the_form_expired(databases: Databases) -> None:
    app = _production(databases)
    answer = _http_login_post(app, "https://shop.example")
    assert answer.status_code == 400
    page = answer.get_data(as_text=True)
    assert "The form had expired" in page
    assert "SHOP_TRUSTED_PROXIES" not in page


def test_login_behind_a_trusted_tls_proxy_works(databases: Databases) -> None:
    app = _production(databases, SHOP_TRUSTED_PROXIES="1")
    owner = Shopper(app.test_client())
    owner.url = lambda path: f"http://shop.example{path}"  # type: ignore[method-assign]
    proxy = {"X-Forwarded-Proto": "https", "X-Forwarded-Host": "shop.example"}
    page = owner.client.get("http://shop.example/admin/login", headers=proxy)
    data = {"csrf_token": csrf_token(page.get_data(as_text=True)), "password": OWNER_PASSWORD}
    answer = owner.client.post(
        "http://shop.example/admin/login", data=data, headers={**proxy, "Referer": "https://shop.example/"}
    )
    assert answer.status_code == 303, answer.get_data(as_text=True)
    assert answer.headers["Location"].endswith("/admin/")


# --- wsgi.py, celery_app.py ----------------------------------------------------------------------------------


def _environment(tmp_path: Path, **extra: str) -> dict[str, str]:
    """The shop's environment for a subprocess, none of the runner's SHOP_*/GATEWAY_* (the autouse fixture
    removed them from ``os.environ``)."""
    environ = {name: value for name, value in os.environ.items() if name != "PROMETHEUS_MULTIPROC_DIR"}
    environ.update(
        SHOP_DATABASE_URL=f"sqlite:///{tmp_path / 'shop.sqlite3'}",
        SHOP_SECRET_KEY="k" * 64,  # no key file written into the project's instance folder
        **extra,
    )
    return environ


def _python(code: str, environ: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=environ, capture_output=True, text=True, timeout=120
    )


def test_wsgi_module_builds_the_shop_from_the_environment(tmp_path: Path) -> None:
    code = "from example_shop.wsgi import app; print(app.name, app.config['SQLALCHEMY_DATABASE_URI'])"
    result = _python(code, _environment(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == f"example_shop sqlite:///{tmp_path / 'shop.sqlite3'}"


def test_celery_app_has_the_gateways_tasks_and_the_shops_broker(tmp_path: Path) -> None:
    broker = f"redis://127.0.0.1:{free_port()}/3"
    code = (
        "from example_shop.celery_app import celery, app\n"
        "print(celery.conf.broker_url)\n"
        "print(' '.join(sorted(n for n in celery.tasks if n.startswith('flask_gateway.'))))\n"
        "print(celery.conf.beat_schedule_filename or '')\n"
        "print(app.instance_path)\n"
    )
    result = _python(code, _environment(tmp_path, SHOP_CELERY_BROKER_URL=broker))
    assert result.returncode == 0, result.stderr
    url, tasks, schedule, instance = result.stdout.splitlines()
    assert url == broker
    assert tasks == "flask_gateway.check_settings flask_gateway.deliver_outbox flask_gateway.reconcile"
    # beat's schedule file is kept out of the working directory (the app's instance folder)
    assert schedule and Path(schedule).is_absolute() and Path(schedule).parent == Path(instance)


def test_celery_app_without_a_broker_says_which_variable(tmp_path: Path) -> None:
    result = _python("import example_shop.celery_app", _environment(tmp_path))
    assert result.returncode != 0
    assert "ShopConfigError: The Celery worker and beat need SHOP_CELERY_BROKER_URL" in result.stderr


# --- gunicorn.conf.py ----------------------------------------------------------------------------------------


def test_child_exit_marks_the_worker_dead_in_the_multiprocess_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "metrics"
    folder.mkdir()
    monkeypatch.setenv("PROMETHEUS_MULTIPROC_DIR", str(folder))
    settings = runpy.run_path(str(GUNICORN_CONF))
    (folder / "gauge_livesum_4242.db").write_bytes(b"")
    (folder / "counter_4242.db").write_bytes(b"")
    settings["child_exit"](None, SimpleNamespace(pid=4242))
    assert sorted(p.name for p in folder.iterdir()) == ["counter_4242.db"]  # counters outlive their worker


@pytest.mark.parametrize(
    ("name", "value"), [("SHOP_WORKERS", "0"), ("SHOP_THREADS", "many"), ("SHOP_LOG_FORMAT", "xml")]
)
def test_gunicorn_conf_refuses_bad_values(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with pytest.raises(RuntimeError, match=f"{name}='{value}'"):
        runpy.run_path(str(GUNICORN_CONF))


def test_gunicorn_conf_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SHOP_BIND", "SHOP_WORKERS", "SHOP_THREADS", "SHOP_LOG_FORMAT"):
        monkeypatch.delenv(name, raising=False)
    settings = runpy.run_path(str(GUNICORN_CONF))
    assert settings["bind"] == ["127.0.0.1:8000"]
    assert 3 <= settings["workers"] <= 8
    assert settings["threads"] == 4
    assert settings["logconfig_dict"]["root"]["level"] == "INFO"


#: ``2026-11-26 23:11:20,773 INFO [16390] gunicorn.error: Starting gunicorn``: time, level, pid, logger.
TEXT_LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \[\d+\] [\w.]+: "
)


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_gunicorn_serves_the_shop_with_the_config_file(tmp_path: Path, log_format: str) -> None:
    """``gunicorn -c example_shop/gunicorn.conf.py example_shop.wsgi:app``, as docs/example-shop.md runs it:
    two workers, /gateway/livez and a scrape answer, every log line has time, level and logger, and the
    multiprocess folder is made and emptied of an old run's files (and only those)."""
    port = free_port()
    metrics = tmp_path / "prometheus"
    if log_format == "json":
        metrics.mkdir()
        (metrics / "counter_99999.db").write_bytes(b"old run")
        (metrics / "README").write_text("not prometheus_client's")
    environ = _environment(
        tmp_path,
        SHOP_BIND=f"127.0.0.1:{port}",
        SHOP_WORKERS="2",
        SHOP_THREADS="2",
        SHOP_LOG_FORMAT=log_format,
        SHOP_METRICS_TOKEN=TOKEN,
        PROMETHEUS_MULTIPROC_DIR=str(metrics),
    )
    init = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "example_shop", "shop", "init-db"],
        cwd=ROOT,
        env={k: v for k, v in environ.items() if k not in ("SHOP_METRICS_TOKEN", "PROMETHEUS_MULTIPROC_DIR")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert init.returncode == 0, init.stderr
    log_path = tmp_path / "gunicorn.log"
    secret_watch.watch_file(log_path)
    command = [
        sys.executable,
        "-m",
        "gunicorn",
        "-c",
        "example_shop/gunicorn.conf.py",
        "example_shop.wsgi:app",
    ]
    with log_path.open("wb") as log:
        server = subprocess.Popen(command, cwd=ROOT, env=environ, stdout=log, stderr=subprocess.STDOUT)
    try:
        base = f"http://127.0.0.1:{port}"

        def answered() -> list[requests.Response]:
            """The answer (in a list: a response that is not ok is falsy), or none yet."""
            assert server.poll() is None, log_path.read_text()
            try:
                # The master listens at once; a request waits there until a worker has booted.
                return [requests.get(f"{base}/gateway/livez", timeout=30)]
            except requests.RequestException:
                return []

        (live,) = wait_for(answered, interval=0.2, what="gunicorn to answer /gateway/livez", logs=[log_path])
        assert live.status_code == 200 and live.json() == {"status": "ok"}
        assert requests.get(f"{base}/metrics", timeout=10).status_code == 401
        scrape = requests.get(f"{base}/metrics", headers={"Authorization": f"Bearer {TOKEN}"}, timeout=10)
        assert scrape.status_code == 200 and "\nflask_gateway_up 1.0\n" in scrape.text
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    assert server.returncode == 0, "\n".join(lines)
    if log_format == "text":
        assert all(TEXT_LINE.match(line) for line in lines), "\n".join(lines)
        records = [{"logger": line.split("] ", 1)[1].split(":", 1)[0], "message": line} for line in lines]
    else:
        records = [json.loads(line) for line in lines]
        assert all({"time", "level", "logger", "process", "message"} <= record.keys() for record in records)
    loggers = {record["logger"] for record in records}
    assert {"gunicorn.error", "gunicorn.access"} <= loggers
    assert sum("Booting worker" in record["message"] for record in records) == 2
    # The access log, each request once (one handler: no line twice through the root logger).
    assert sum('"GET /metrics HTTP/1.1" 401' in record["message"] for record in records) == 1
    assert TOKEN not in log_path.read_text()
    if log_format == "json":
        assert sorted(p.name for p in metrics.iterdir() if not p.name.endswith(".db")) == ["README"]
        assert not (metrics / "counter_99999.db").exists()
    else:
        assert metrics.is_dir()  # made by on_starting, before any worker loads the app


# --- docs/example-shop.md, "Deploying it" -------------------------------------------------------------------

DOC = ROOT / "docs" / "example-shop.md"


def _environment_file() -> str:
    text = DOC.read_text()
    match = re.search(r"```sh\n# /etc/shop/environment\n(.*?)```", text, re.S)
    assert match, "docs/example-shop.md shows no /etc/shop/environment"
    return match.group(1)


def test_the_documented_environment_file_starts_the_shop_in_production(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The file as the doc shows it, read as ``flask --env-file`` reads it (python-dotenv), its ``<...>``
    placeholders filled in: the shop builds, in production, with every deployment setting applied."""
    import io

    from cryptography.fernet import Fernet
    from dotenv import dotenv_values

    text = _environment_file()
    values = dotenv_values(stream=io.StringIO(text))  # as Flask's --env-file reads it (interpolating)
    filled = {
        "SHOP_SECRET_KEY": "k" * 64,
        "SHOP_ADMIN_PASSWORD_HASH": OWNER_HASH,
        "SHOP_METRICS_TOKEN": TOKEN,
        "GATEWAY_ENCRYPTION_KEY": Fernet.generate_key().decode(),
    }
    assert values["SHOP_ADMIN_PASSWORD_HASH"] == "<scrypt:32768:8:1$...$...>"  # quoted: "$" kept as it is
    # A real hash written as the doc's line writes it comes back whole.
    real = generate_password_hash("owner password", method="pbkdf2:sha256:1000")
    line = re.search(r"^SHOP_ADMIN_PASSWORD_HASH=.*$", text, re.M)
    assert line is not None
    written = line.group(0).replace("<scrypt:32768:8:1$...$...>", real)
    assert dotenv_values(stream=io.StringIO(written))["SHOP_ADMIN_PASSWORD_HASH"] == real
    for name, value in values.items():
        assert value is not None, name
        if value.startswith("<"):
            value = filled.get(name, "placeholder")
        monkeypatch.setenv(name, re.sub(r"<[^>]+>", "placeholder", value))
    monkeypatch.delenv("PROMETHEUS_MULTIPROC_DIR", raising=False)
    app = create_app()
    assert app.config["SHOP_ENV"] == "production"
    assert app.config["SQLALCHEMY_DATABASE_URI"].startswith("postgresql+psycopg://shop:")
    assert app.config["SQLALCHEMY_ENGINE_OPTIONS"] == {
        "pool_pre_ping": True,
        "pool_size": 5,
        "max_overflow": 5,
    }
    assert app.config["CELERY"] == {"broker_url": "redis://redis.internal:6379/0"}
    assert app.config["SHOP_TRUSTED_PROXIES"] == 1 and app.config["SESSION_COOKIE_SECURE"] is True
    assert "shop_metrics" in app.view_functions
    # Every name in the file is one the shop, gunicorn.conf.py or the extension reads.
    sources = (
        "".join(path.read_text() for path in (ROOT / "example_shop").glob("*.py"))
        + (ROOT / "flask_gateway" / "config.py").read_text()
    )
    assert [name for name in values if f'"{name}"' not in sources] == []


def test_the_deployment_section_runs_the_tested_commands() -> None:
    text = DOC.read_text()
    section = text[text.index("## Deploying it") : text.index("## URL map")]
    for command in (
        "gunicorn -c example_shop/gunicorn.conf.py example_shop.wsgi:app",  # test_gunicorn_serves_the_shop...
        "celery -A example_shop.celery_app:celery worker",
        "celery -A example_shop.celery_app:celery beat",
    ):
        assert command in section
    # Every deployment setting is in the configuration table or gunicorn's.
    for name in (
        "SHOP_DATABASE_URL",
        "SHOP_DB_POOL_SIZE",
        "SHOP_DB_MAX_OVERFLOW",
        "SHOP_CELERY_BROKER_URL",
        "SHOP_METRICS_TOKEN",
        "SHOP_TRUSTED_PROXIES",
        "SHOP_LOG_FORMAT",
        "SHOP_BIND",
        "SHOP_WORKERS",
        "SHOP_THREADS",
        "PROMETHEUS_MULTIPROC_DIR",
    ):
        assert re.search(rf"^\| (`SHOP_\w+`, )?`{name}`", text, re.M), name
