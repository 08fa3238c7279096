"""A throwaway Redis for the tests: ``redis-server`` on a free loopback port, its own folder, removed afterwards.

Uses Debian's ``redis-server`` (``scripts/ensure-system-packages`` installs it when it is missing). Nothing
is written to disk (``--save ''``, no append-only file); the server runs in the foreground as a child of
the test session and is stopped at the end (SIGTERM, then SIGKILL).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.processes import WAIT_DEADLINE, free_port


def find_redis_server() -> str | None:
    return shutil.which("redis-server") or next(
        (
            str(path)
            for path in (Path("/usr/bin/redis-server"), Path("/usr/sbin/redis-server"))
            if path.exists()
        ),
        None,
    )


@dataclass
class RedisServer:
    root: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    @property
    def log_path(self) -> Path:
        return self.root / "redis.log"

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"

    def ping(self) -> bool:
        """True when the server answers PING (a bare RESP exchange: no client library needed)."""
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                sock.sendall(b"PING\r\n")
                return sock.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self) -> None:
        try:
            if self.process.poll() is None:
                self.process.terminate()
                try:
                    self.process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.process.kill()
                    self.process.wait(timeout=10)
        finally:
            shutil.rmtree(self.root, ignore_errors=True)


def start_redis(timeout: float = WAIT_DEADLINE) -> RedisServer:
    """Start ``redis-server`` on a free loopback port and wait until it answers PING (``timeout``: a last
    resort; it answers in milliseconds on a quiet machine)."""
    binary = find_redis_server()
    if binary is None:
        raise RuntimeError(
            "redis-server is not installed: run scripts/ensure-system-packages (make test does), "
            "or apt-get install -y redis-server"
        )
    root = Path(tempfile.mkdtemp(prefix="flask-gateway-redis-"))
    port = free_port()
    command = [
        binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
        "--daemonize", "no", "--dir", str(root), "--logfile", "", "--protected-mode", "yes",
    ]  # fmt: skip
    with (root / "redis.log").open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=root)
    server = RedisServer(root=root, port=port, process=process)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = server.log_tail()
            server.stop()
            raise RuntimeError(f"redis-server exited with {process.returncode} at start:\n{tail}")
        if server.ping():
            return server
        time.sleep(0.05)
    tail = server.log_tail()
    server.stop()
    raise RuntimeError(f"redis-server did not answer on port {port} within {timeout} s:\n{tail}")
