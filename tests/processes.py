"""Real servers for end-to-end tests: separate processes on free loopback ports, logs kept, always stopped."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import requests

from tests import secret_watch

#: How long :func:`wait_for` waits by default: a last resort, not a figure. The events waited for take
#: well under a second on a quiet machine; a loaded 2-core CI machine can be 20 times slower.
WAIT_DEADLINE = 60.0


#: The ports the tests' servers listen on: below the kernel's ephemeral range (Linux: 32768-60999), so
#: that no port handed out for an outgoing connection or a ``bind(0)`` is ever one of them.
PORTS = range(10_000, 32_000)
#: The ports this process handed out: never twice, so two servers started one after the other in a test
#: cannot both be given a port that neither listens on yet.
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on, from this pytest-xdist worker's own share of :data:`PORTS`.

    A port from ``bind(0)`` is free only until someone takes it: two workers starting servers at the same
    moment could be handed the same one, and a server that then failed to bind it was taken for ready by
    its probe, which reached the other worker's server. Each worker drawing from a share no other worker
    uses, and outside the ephemeral range, leaves only its own servers to collide with, which this checks.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    count = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    share = len(PORTS) // max(count, 1)
    start = PORTS.start + share * (index % max(count, 1))
    for _ in range(200):
        port = random.randrange(start, start + share)
        if port in _HANDED_OUT:
            continue  # handed out already: its server may not be listening yet
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use (or in TIME_WAIT): draw another
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError(f"no free port in {start}-{start + share - 1} after 200 draws")


@dataclass
class Server:
    name: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def stop(self) -> None:
        if self.process.poll() is None:
            # SIGINT lets the server stop cleanly. A child started while SIGINT is ignored (pytest run as a
            # background job of a shell without job control) inherits that and would only stop at the
            # kill below, 10 s later: SIGTERM then.
            ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            self.process.send_signal(signal.SIGTERM if ignored else signal.SIGINT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)


def start_flask(
    name: str,
    app: str,
    env: Mapping[str, str],
    log_dir: Path,
    *,
    port: int | None = None,
    ready_path: str = "/",
    timeout: float = WAIT_DEADLINE * 2,
) -> Server:
    """``flask --app APP run`` (threaded, no reloader) on ``port`` (default: a free one); waits for HTTP."""
    port = port or free_port()
    log_path = log_dir / f"{name}.log"
    command = [
        sys.executable,
        "-m",
        "flask",
        "--app",
        app,
        "run",
        "--port",
        str(port),
        "--no-reload",
        "--with-threads",
    ]
    # The child writes the log through its own copy of the descriptor: ours is closed at once.
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT)
    server = Server(name=name, port=port, process=process, log_path=log_path)
    secret_watch.watch_file(log_path)  # scanned for secrets at the end of the session
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"{name} exited with {process.returncode} at start:\n{server.log_tail()}")
        try:
            requests.get(server.url + ready_path, timeout=1)
            return server
        except requests.RequestException:
            time.sleep(0.1)
    server.stop()
    raise RuntimeError(f"{name} did not answer on port {port} within {timeout} s:\n{server.log_tail()}")


def wait_for(  # type: ignore[no-untyped-def]
    predicate,
    *,
    timeout: float = WAIT_DEADLINE,
    interval: float = 0.1,
    what: str = "condition",
    logs: Sequence[Server | Path] = (),
):
    """Poll ``predicate`` until it returns something truthy (returned).

    The deadline is a last resort: its failure names ``what`` was waited for and shows the last lines of
    each log in ``logs`` (servers or log files), so a slow machine and a broken feature can be told apart.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}{log_tails(logs)}")
        time.sleep(interval)


def log_tails(logs: Sequence[Server | Path], lines: int = 30) -> str:
    """The last ``lines`` of each log, headed by its name, for a failure message ('' for none)."""
    parts = []
    for log in logs:
        if isinstance(log, Server):
            parts.append(f"\n--- {log.name} ({log.log_path}), last {lines} lines ---\n{log.log_tail(lines)}")
        else:
            try:
                tail = "\n".join(Path(log).read_text(errors="replace").splitlines()[-lines:])
            except OSError:
                tail = "(no log)"
            parts.append(f"\n--- {log}, last {lines} lines ---\n{tail}")
    return "".join(parts)


def child_pids(pid: int) -> list[int]:
    """The living child processes of ``pid`` (a gunicorn master's workers), from ``/proc`` (Linux)."""
    children = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after the last ")".
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # the process ended while we looked
        if fields[0] != "Z" and int(fields[1]) == pid:
            children.append(int(stat.parent.name))
    return sorted(children)


def is_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, ended but not yet reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"
