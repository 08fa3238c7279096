"""The deployment test's pieces (``test_deployment.py``): the example shop as an operator runs it.

- ``celery`` (read lazily, PEP 562): the beat app, ``example_shop.celery_app``'s Celery app unchanged but for
  its two tick intervals, from ``DEPLOY_DELIVER_EVERY`` and ``DEPLOY_RECONCILE_EVERY`` (seconds), so a
  reconciliation bound of 20 s can be met. The worker runs ``example_shop.celery_app:celery`` itself. Lazy
  because building it builds the shop from the environment (the test process has no shop environment).
- :class:`Scraper`: ``GET /metrics`` with the bearer token through gunicorn's port, over and over from a
  thread of its own; every scrape kept (when, which figures).
- :func:`doctor`: ``flask --app example_shop gateway doctor`` as a subprocess, its findings parsed.
- :func:`behind_tls_proxy`: a shopper's session as the TLS proxy in front of the shop forwards it
  (``X-Forwarded-Proto: https`` to ``SHOP_TRUSTED_PROXIES=1``; the Secure cookie sent back on the proxy's
  plain-http hop), since ``SHOP_ENV=production`` sets Secure cookies.
- :func:`stop_redis` / :func:`start_redis_again`: the same ``redis-server`` command on the same port.
- :class:`Supervisor`: a Celery worker run as its systemd unit runs it (``Restart=always``, ``RestartSec=1``):
  started again a second after it exits, each exit and restart recorded; :func:`unrecoverable` reads
  Celery's ``Unrecoverable error`` lines from a log and :func:`known_kombu_exit` tells the known kombu bug.
- :func:`access_lines`: gunicorn's access log lines (status, method, path, worker pid).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import requests
import requests.adapters
import requests.cookies
from prometheus_client.parser import text_string_to_metric_families

from tests.processes import WAIT_DEADLINE, Server, wait_for
from tests.redis_server import RedisServer
from tests.reliability.conftest import ROOT
from tests.reliability.support import Recorder, Shopper
from tests.tasks.conftest import Worker

#: gunicorn's access-log line for these tests: status, method, path and the worker's pid (``<1234>``).
ACCESS_FORMAT: Final = "ACCESS %(s)s %(m)s %(U)s %(p)s"
_ACCESS: Final = re.compile(r"ACCESS (\d{3}) (\S+) (\S+) <(\d+)>")
#: The doctor's marks (``flask_gateway.operations.doctor``), at the start of a finding's first line.
_FINDING: Final = re.compile(r"^\[(ok|warn|PROBLEM|unknown)\]\s+([\w-]+): (.*)$")


# --- the beat app ------------------------------------------------------------------------------------------


def _beat_app() -> Any:
    from example_shop.celery_app import celery

    every = {
        "flask-gateway-deliver-outbox": float(os.environ["DEPLOY_DELIVER_EVERY"]),
        "flask-gateway-reconcile": float(os.environ["DEPLOY_RECONCILE_EVERY"]),
    }
    schedule = dict(celery.conf.beat_schedule)
    for name, seconds in every.items():
        entry = dict(schedule[name])
        entry["schedule"] = seconds
        entry["options"] = {**entry.get("options", {}), "expires": seconds}
        schedule[name] = entry
    celery.conf.beat_schedule = schedule
    return celery


def __getattr__(name: str) -> Any:
    if name == "celery":
        return _beat_app()
    raise AttributeError(name)


# --- scrapes -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scrape:
    #: ``time.monotonic()`` when the request was sent, and ``time.monotonic()`` and ``time.time()`` when the
    #: answer came.
    sent: float
    at: float
    wall: float
    status: int
    #: ``(sample name, sorted labels) -> value`` of every sample.
    samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float]
    #: The samples of counter and histogram families (never going down without a restart).
    counting: frozenset[tuple[str, tuple[tuple[str, str], ...]]]

    def value(self, name: str, **labels: str) -> float | None:
        return self.samples.get((name, tuple(sorted(labels.items()))))

    def total(self, name: str, **labels: str) -> float:
        """The sum of ``name`` over the samples whose labels include ``labels``."""
        return sum(
            value
            for (sample, sample_labels), value in self.samples.items()
            if sample == name and set(labels.items()) <= set(sample_labels)
        )

    def overdue(self, job: str) -> float | None:
        return self.value("flask_gateway_job_overdue", job=job)

    def age(self, job: str) -> float | None:
        """Seconds since the job's last finished run, as the scrape says."""
        last = self.value("flask_gateway_job_last_run_timestamp_seconds", job=job)
        return None if last is None else round(self.wall - last, 1)

    def success_age(self, job: str) -> float | None:
        """Seconds since the job's last successful run, as the scrape says (None: it never succeeded)."""
        last = self.value("flask_gateway_job_last_success_timestamp_seconds", job=job)
        return None if last is None else round(self.wall - last, 1)


def parse_scrape(text: str, status: int, sent: float, at: float, wall: float) -> Scrape:
    samples: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    counting = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            key = (sample.name, tuple(sorted(sample.labels.items())))
            samples[key] = sample.value
            if family.type in ("counter", "histogram"):
                counting.add(key)
    return Scrape(sent=sent, at=at, wall=wall, status=status, samples=samples, counting=frozenset(counting))


@dataclass
class Scraper:
    """Scrapes ``url`` every ``every`` seconds from a thread of its own until :meth:`stop`."""

    url: str
    token: str
    every: float = 0.5
    scrapes: list[Scrape] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def scrape(self) -> Scrape:
        sent = time.monotonic()
        with requests.Session() as session:  # a new connection: any worker may answer
            answer = session.get(self.url, headers={"Authorization": f"Bearer {self.token}"}, timeout=30)
        found = parse_scrape(
            answer.text if answer.ok else "", answer.status_code, sent, time.monotonic(), time.time()
        )
        with self._lock:
            self.scrapes.append(found)
            if not answer.ok:
                self.errors.append(f"{answer.status_code}: {answer.text[:300]}")
        return found

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.scrape()
            except Exception as exc:  # reported by the test, which asserts there is none
                with self._lock:
                    self.errors.append(repr(exc))
            self._stop.wait(self.every)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)

    def since(self, moment: float) -> list[Scrape]:
        with self._lock:
            return [scrape for scrape in self.scrapes if scrape.at >= moment]

    def first(
        self,
        moment: float,
        predicate: Any,
        *,
        what: str,
        timeout: float = WAIT_DEADLINE,
        logs: Sequence[Server | Path] = (),
    ) -> Scrape:
        """The first scrape from ``moment`` on for which ``predicate(scrape)`` holds (a last-resort deadline,
        whose failure shows the last scrape and the tails of ``logs``)."""

        def found() -> Scrape | None:
            return next((scrape for scrape in self.since(moment) if predicate(scrape)), None)

        def last() -> str:
            with self._lock:
                scrape = self.scrapes[-1] if self.scrapes else None
                errors = self.errors[-3:]
            if scrape is None:
                return f"no scrape; errors {errors}"
            jobs = {job: (scrape.overdue(job), scrape.age(job)) for job in ("deliver", "reconcile")}
            return f"the last scrape: HTTP {scrape.status}, (overdue, age) {jobs}; errors {errors}"

        try:
            result: Scrape = wait_for(found, timeout=timeout, interval=0.1, what=what, logs=logs)
        except AssertionError as timed_out:
            raise AssertionError(f"{timed_out}\n{last()}") from None
        return result


def resets(scrapes: list[Scrape]) -> list[str]:
    """Every counter or histogram sample that went down from one scrape to the next."""
    found = []
    for before, after in itertools.pairwise(scrapes):
        for key in before.counting:
            now = after.samples.get(key)
            if now is None or now < before.samples[key]:
                found.append(f"{key[0]}{dict(key[1])}: {before.samples[key]} -> {now}")
    return found


# --- the doctor --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DoctorRun:
    returncode: int
    output: str
    started: float
    seconds: float
    #: ``check -> [(level, message), ...]`` (a wrapped message joined again).
    findings: Mapping[str, list[tuple[str, str]]]

    def levels(self, check: str) -> list[str]:
        return [level for level, _ in self.findings.get(check, [])]

    def says(self, check: str, level: str, text: str) -> bool:
        return any(lvl == level and text in message for lvl, message in self.findings.get(check, []))


def doctor(env: Mapping[str, str], *arguments: str) -> DoctorRun:
    """``flask --app example_shop gateway doctor`` in a process of its own, with ``env`` over os.environ."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "flask", "--app", "example_shop", "gateway", "doctor", *arguments],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    output = done.stdout + done.stderr
    entries: list[list[str]] = []  # [level, check, message]
    in_message = False
    for line in output.splitlines():
        found = _FINDING.match(line)
        if found:
            level, check, message = found.groups()
            entries.append([level.lower(), check, message])
            in_message = True
        elif in_message and line.startswith(" " * 10) and not line.strip().startswith("fix:"):
            entries[-1][2] += " " + line.strip()
        else:
            in_message = False
    findings: dict[str, list[tuple[str, str]]] = {}
    for level, check, message in entries:
        findings.setdefault(check, []).append((level, message))
    return DoctorRun(done.returncode, output, started, time.monotonic() - started, findings)


# --- shoppers behind the TLS proxy -------------------------------------------------------------------------


class _ProxyHopJar(requests.cookies.RequestsCookieJar):
    """A browser's cookies as the proxy's plain-http hop carries them: the Secure flag is the browser's
    business (it talks https to the proxy), so every cookie is sent back here."""

    def set_cookie(self, cookie: Any, *args: Any, **kwargs: Any) -> Any:
        cookie.secure = False
        return super().set_cookie(cookie, *args, **kwargs)


def behind_tls_proxy(shopper: Shopper) -> Shopper:
    """The shopper's requests as the TLS proxy forwards them: ``X-Forwarded-Proto: https`` (believed with
    ``SHOP_TRUSTED_PROXIES=1``), the page's https origin as ``Referer`` (Flask-WTF checks it on https), and
    the shop's Secure cookie sent back on this plain-http hop."""
    shopper.session.cookies = _ProxyHopJar()
    shopper.session.mount(shopper.shop_url + "/", _ProxyHop(shopper.shop_url))
    return shopper


class _ProxyHop(requests.adapters.HTTPAdapter):
    """The shop's requests only (the gateway is reached directly): the proxy's headers added."""

    def __init__(self, shop_url: str) -> None:
        super().__init__()
        origin = shop_url.replace("http://", "https://", 1)
        self.forwarded = {"X-Forwarded-Proto": "https", "Referer": f"{origin}/"}

    def add_headers(self, request: requests.PreparedRequest, **kwargs: Any) -> None:
        request.headers.update(self.forwarded)


def proxied_shopper(shop_url: str, recorder: Recorder) -> Shopper:
    return behind_tls_proxy(Shopper(shop_url, recorder))


# --- redis-server stopped and started again ----------------------------------------------------------------


def stop_redis(server: RedisServer) -> None:
    """Stop the server (SIGTERM), keeping its folder and port for :func:`start_redis_again`."""
    server.process.terminate()
    server.process.wait(timeout=15)


def start_redis_again(server: RedisServer) -> None:
    """The very command ``start_redis`` ran, on the same port; waits until it answers PING."""
    with server.log_path.open("ab") as log:
        server.process = subprocess.Popen(
            server.process.args, stdout=log, stderr=subprocess.STDOUT, cwd=server.root
        )
    wait_for(
        server.ping,
        interval=0.05,
        what=f"redis-server again on port {server.port}",
        logs=[server.log_path],
    )


# --- gunicorn's access log ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Access:
    status: int
    method: str
    path: str
    pid: int


def access_lines(log: str) -> list[Access]:
    return [Access(int(status), method, path, int(pid)) for status, method, path, pid in _ACCESS.findall(log)]


# --- the worker under a supervisor -------------------------------------------------------------------------

#: Celery's last words before a worker exits (``celery.worker.worker.WorkController.start``), the log line's
#: prefix ``[date time: CRITICAL/MainProcess]`` before it.
_UNRECOVERABLE: Final = re.compile(r"^\[[^]]*\] Unrecoverable error: (.*)$")
_FRAME: Final = re.compile(r'^\s*File "([^"]+)", line \d+, in (\S+)')


@dataclass(frozen=True)
class Unrecoverable:
    """One ``Unrecoverable error: ...`` line of a Celery worker's log and the traceback under it."""

    line: str
    #: The exception as Celery's ``%r`` wrote it: ``AttributeError("'NoneType' object has ...")``.
    error: str
    traceback: str

    def last_frame(self) -> str:
        """The file of the innermost frame of the last traceback (where the exception was raised)."""
        frames = [found.group(1) for found in map(_FRAME.match, self.traceback.splitlines()) if found]
        return frames[-1] if frames else ""


def unrecoverable(log: str) -> list[Unrecoverable]:
    """Every ``Unrecoverable error`` of a worker's log, each with the lines under it up to the next log line."""
    found: list[Unrecoverable] = []
    lines = log.splitlines()
    for index, line in enumerate(lines):
        match = _UNRECOVERABLE.match(line)
        if match is None:
            continue
        rest = list(itertools.takewhile(lambda text: not text.startswith("["), lines[index + 1 :]))
        found.append(Unrecoverable(line, match.group(1), "\n".join(rest)))
    return found


def known_kombu_exit(error: Unrecoverable) -> bool:
    """The kombu bug a worker meets when Redis goes away while a late-acknowledged task runs: closing the lost
    connection, ``restore_unacked`` builds a new pool from a connection already let go, and kombu's redis
    transport raises ``AttributeError("'NoneType' object has no attribute 'hostname'")`` (celery/kombu issues
    582 and 970 show the same AttributeError paths). An AttributeError raised in kombu's redis transport, or
    one naming ``hostname`` with that transport in the traceback; never any other crash."""
    if not error.error.startswith("AttributeError("):
        return False
    if "kombu/transport/redis.py" not in error.traceback:
        return False
    return "hostname" in error.error or error.last_frame().endswith("kombu/transport/redis.py")


@dataclass(frozen=True)
class Exit:
    """A supervised process that exited by itself (never one the supervisor stopped)."""

    name: str
    returncode: int
    #: ``time.monotonic()`` when the supervisor saw it gone.
    at: float
    #: Celery's ``Unrecoverable error`` lines in its log (none: it exited without saying why).
    errors: tuple[Unrecoverable, ...]

    def known(self) -> bool:
        """Exited with status 1 after Celery logged the known kombu bug (:func:`known_kombu_exit`) only."""
        return self.returncode == 1 and bool(self.errors) and all(map(known_kombu_exit, self.errors))

    def describe(self) -> str:
        said = "; ".join(error.line for error in self.errors) or "no 'Unrecoverable error' line"
        return f"{self.name} exited with status {self.returncode}: {said}"


@dataclass
class Supervisor:
    """A process run as systemd runs a unit with ``Restart=always`` and ``RestartSec=1`` (docs/example-shop.md's
    ``shop-celery-worker.service``): :meth:`start` is ``systemctl start`` (a new process), :meth:`stop` is
    ``systemctl stop`` (the process stopped, no restart), and in between a process that exits for any
    reason is started again ``restart_sec`` seconds later, whatever is left of its process group killed first
    (systemd's control group). ``spawn(name)`` starts one process named ``<name><n>`` (n: 1, 2, ...)."""

    name: str
    spawn: Callable[[str], Worker]
    restart_sec: float = 1.0
    #: Where the supervisor's own events go (a restart, when it happens), besides :attr:`exits`.
    say: Callable[[str], None] = print
    #: Every process started, in order (the last one is :attr:`current`).
    started: list[Worker] = field(default_factory=list)
    #: ``time.monotonic()`` when each of :attr:`started` was started.
    started_at: list[float] = field(default_factory=list)
    exits: list[Exit] = field(default_factory=list)
    #: Processes started again after an exit (not those :meth:`start` started).
    restarts: int = 0
    #: What went wrong in the supervisor itself (asserted empty by the test).
    errors: list[str] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def current(self) -> Worker:
        return self.started[-1]

    def _spawn(self) -> Worker:
        process = self.spawn(f"{self.name}{len(self.started) + 1}")
        self.started.append(process)
        self.started_at.append(time.monotonic())
        return process

    def start(self) -> Worker:
        """A new process, watched until :meth:`stop`."""
        if self._thread is not None:
            raise RuntimeError(f"the {self.name} supervisor is running already")
        self._stop = threading.Event()
        process = self._spawn()
        self._thread = threading.Thread(target=self._run, name=f"supervisor-{self.name}", daemon=True)
        self._thread.start()
        return process

    def _run(self) -> None:
        try:
            while not self._stop.wait(0.1):
                process = self.current
                returncode = process.process.poll()
                if returncode is None:
                    continue
                # The pool processes left of its group go with it, as systemd stops a unit's control group.
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                gone = Exit(process.name, returncode, time.monotonic(), tuple(unrecoverable(process.log())))
                self.exits.append(gone)
                self.say(f"supervisor: {gone.describe()}; starting it again in {self.restart_sec:g} s")
                if self._stop.wait(self.restart_sec):
                    return
                started = self._spawn()
                self.restarts += 1
                self.say(f"supervisor: restart {self.restarts}: {started.name} started (pid {started.pid})")
        except Exception as exc:  # reported by the test, which asserts there is none
            self.errors.append(repr(exc))

    def stop(self) -> None:
        """No restart from now on, then the current process stopped (SIGTERM, a warm shutdown; SIGKILL of
        its group after 15 s) unless it exited already and the supervisor saw it."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
            self._thread = None
        if not self.started:
            return
        process = self.current
        if any(gone.name == process.name for gone in self.exits):
            return  # exited, reaped and its group killed by the supervisor: its pid may be another's now
        process.stop()
