"""Rate limits on a storage that fails (flask_gateway/operations/ratelimit.py, issue 25): the requests are let through,
and each process logs one WARNING when the storage starts failing and one when it works again (how long,
how many requests were let through), not a traceback per request.

With a real ``redis-server`` (``GATEWAY_RATELIMIT_STORAGE_URI=redis://...``) stopped and started again on
its port, under the instalment hint's limit (``GATEWAY_PLAN_RATE_LIMIT``: a check and a count per visitor
lookup; the gateway's plans here fit no rule, so each new total is a lookup).
"""

from __future__ import annotations

import logging
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest
import redis.connection
import redis.retry
from limits import parse
from sqlalchemy.exc import OperationalError

import flask_gateway.emulator.views.v1 as emulator_v1
from flask_gateway import clear_payment_plan_cache, format_instalment_hint
from flask_gateway.core.wire import V1PaymentPlan
from flask_gateway.emulator import clock as emulator_clock
from flask_gateway.errors import ConfigurationError
from flask_gateway.operations.ratelimit import RateLimit, StorageWatch, make_storage
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.extension.conftest import SHOP_URL, Harness, build_harness
from tests.processes import wait_for
from tests.redis_server import RedisServer, find_redis_server, start_redis

LOGGER = "flask_gateway.ratelimit"


@pytest.fixture
def redis_server() -> Iterator[RedisServer]:
    server = start_redis()
    yield server
    server.stop()


def stop(server: RedisServer) -> None:
    """Stop the server, keeping its folder and port (to start it again there)."""
    server.process.terminate()
    server.process.wait(timeout=10)
    assert not server.ping()


def start_again(server: RedisServer) -> None:
    binary = find_redis_server()
    assert binary is not None
    command = [
        binary, "--port", str(server.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--daemonize", "no", "--dir", str(server.root), "--logfile", "", "--protected-mode", "yes",
    ]  # fmt: skip
    with server.log_path.open("ab") as log:
        server.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=server.root)
    wait_for(
        server.ping,
        interval=0.05,
        what="redis-server to answer PING on its port again",
        logs=[server.log_path],
    )


def _whole_rands(amount_cents: int) -> V1PaymentPlan:
    each = amount_cents // 300 * 100
    return V1PaymentPlan(due_at=emulator_clock.now(), amount=each, excess=amount_cents - 3 * each)


@pytest.fixture
def shop(
    databases: Databases, monkeypatch: pytest.MonkeyPatch, redis_server: RedisServer
) -> Iterator[Harness]:
    clear_payment_plan_cache()
    # Plans that fit no rule (whole rands, the rest with the first; the totals below are not within 2 cents
    # of a multiple of R 3.00, where they would): each new total is asked, so each hint is a lookup under the
    # limit (a plan computed from a learned rule would cost none: issue 29).
    monkeypatch.setattr(emulator_v1, "payment_plan", _whole_rands)
    harness = build_harness(
        databases,
        monkeypatch,
        GATEWAY_RATELIMIT_STORAGE_URI=redis_server.url,
        GATEWAY_PLAN_RATE_LIMIT="3 per minute",
    )
    harness.install()
    yield harness
    clear_payment_plan_cache()


def hints(harness: Harness, address: str, count: int, first_total: int) -> list[bool]:
    """Instalment hints for ``count`` new cart totals of one visitor: shown (True) or left out (limited)."""
    shown = []
    for cents in range(first_total, first_total + count):
        with harness.shop.test_request_context(base_url=SHOP_URL, environ_base={"REMOTE_ADDR": address}):
            shown.append(bool(format_instalment_hint(cents)))
    return shown


def storage_lines(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if r.name == LOGGER and r.levelno >= logging.INFO]


def test_redis_down_logs_one_line_when_it_fails_and_one_when_it_works_again(
    shop: Harness,
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
):
    caplog.set_level(logging.INFO)
    caplog.set_level(logging.INFO, logger=LOGGER)  # as in production (the test run has it at DEBUG)
    assert hints(shop, "203.0.113.5", 4, 10_000) == [True, True, True, False]  # Redis counts: limited
    assert storage_lines(caplog) == []

    # The watch's clock is the test's (it says how long a spell lasted); the redis client's retries are
    # counted: their backoff recorded, never slept, and every connection attempt.
    clock = [100.0]
    watch = get_state(shop.shop).plan_limit.watch  # type: ignore[union-attr]
    watch._clock = lambda: clock[0]
    backoffs: list[float] = []
    monkeypatch.setattr(redis.retry, "sleep", backoffs.append)
    attempts: list[str] = []
    connect = redis.connection.Connection._connect

    def counted(self: redis.connection.Connection) -> Any:
        try:
            return connect(self)
        except OSError as error:
            attempts.append(type(error).__name__)
            raise

    monkeypatch.setattr(redis.connection.Connection, "_connect", counted)

    stop(redis_server)
    down = hints(shop, "198.51.100.8", 6, 20_000)
    assert down == [True] * 6  # let through: the limit is not applied while its storage fails
    # Failing costs no wait per request: each hint's check and count tried to connect once each, were
    # refused at once (no connect timeout waited), and nothing was retried after a backoff.
    assert attempts == ["ConnectionRefusedError"] * 12, attempts
    assert backoffs == []
    (failing,) = storage_lines(caplog)  # one line for the whole spell, not a traceback per request
    assert failing.levelno == logging.WARNING
    message = failing.getMessage()
    assert message.startswith(f"rate limits: the storage ({redis_server.url}) fails (ConnectionError: ")
    assert message.endswith(
        "): the limits are not applied, requests are let through, until it works again (one line will say when)"
    )
    assert not failing.exc_info  # no traceback unless the logger is at DEBUG
    assert not [r for r in caplog.records if r.exc_info], "a traceback was logged"

    start_again(redis_server)
    clock[0] = 142.5
    assert hints(shop, "192.0.2.7", 4, 30_100) == [True, True, True, False]  # limited again
    failing_again, recovered = storage_lines(caplog)
    assert failing_again is failing
    assert recovered.levelno == logging.WARNING
    assert recovered.getMessage() == (
        f"rate limits: the storage ({redis_server.url}) works again after 42.5 s; 6 request(s) were let "
        "through without their limit meanwhile"
    )

    # A second spell is a new one: its own line, and with the logger at DEBUG its traceback.
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    stop(redis_server)
    assert hints(shop, "198.51.100.9", 2, 40_000) == [True, True]
    warnings = [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING]
    assert len(warnings) == 1 and warnings[0].exc_info
    assert [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.DEBUG]  # each failure


def test_the_limits_on_one_storage_share_its_spells(shop: Harness):
    state = get_state(shop.shop)
    assert isinstance(state.plan_limit, RateLimit) and isinstance(state.callback_limit, RateLimit)
    assert state.plan_limit.watch is state.callback_limit.watch  # one outage: one line, not one per limit


class _Broken:
    """A limiter whose storage raises ``error``."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def test(self, *_args: Any) -> bool:
        raise self.error

    def hit(self, *_args: Any) -> bool:
        raise self.error


def _limit(error: Exception, watch: StorageWatch) -> RateLimit:
    return RateLimit(name="plan-lookups", item=parse("3/minute"), limiter=_Broken(error), watch=watch)  # type: ignore[arg-type]


def test_the_database_away_is_left_to_the_outage_line(caplog: pytest.LogCaptureFixture):
    """The app's database as the storage, and the database away: the request's own work answers 503 and
    logs the outage once (flask_gateway.operations.outages); the limit says nothing above DEBUG."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    watch = StorageWatch("the app's database")
    limit = _limit(
        OperationalError("SELECT", {}, Exception("server closed the connection unexpectedly")), watch
    )
    assert limit.retry_after("203.0.113.5") is None
    limit.hit("203.0.113.5")
    assert not watch.failing
    assert [r.levelno for r in caplog.records if r.name == LOGGER] == [logging.DEBUG, logging.DEBUG]


def test_the_spell_length_and_the_requests_let_through(caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.INFO, logger=LOGGER)
    now = [100.0]
    watch = StorageWatch("memcached://cache:11211", clock=lambda: now[0])
    limit = _limit(ConnectionRefusedError(111, "Connection refused"), watch)
    for _ in range(3):
        assert limit.retry_after("203.0.113.5") is None  # let through
        limit.hit("203.0.113.5")  # not counted (nothing let through by it)
    assert (watch.failing, watch.let_through) == (True, 3)
    now[0] = 142.5
    watch.succeeded()
    watch.succeeded()  # once
    assert [r.getMessage() for r in caplog.records if r.name == LOGGER] == [
        "rate limits: the storage (memcached://cache:11211) fails (ConnectionRefusedError: [Errno 111] "
        "Connection refused): the limits are not applied, requests are let through, until it works again (one "
        "line will say when)",
        "rate limits: the storage (memcached://cache:11211) works again after 42.5 s; 3 request(s) were let "
        "through without their limit meanwhile",
    ]
    assert (watch.failing, watch.let_through) == (False, 0)


def test_a_storage_password_is_never_shown():
    storage = make_storage("redis://shop:s3cret-pass@127.0.0.1:1/0")
    from flask_gateway.operations.ratelimit import watch_of

    assert watch_of(storage).label == "redis://shop:***@127.0.0.1:1/0"
    with pytest.raises(ConfigurationError) as refused:
        make_storage("nosuchscheme://shop:s3cret-pass@host:1")
    assert "s3cret-pass" not in str(refused.value)
    assert "nosuchscheme://shop:***@host:1" in str(refused.value)
