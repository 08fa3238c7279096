"""Throughput of the emulator next to a bare Flask endpoint, served the same way (a benchmark, not a test).

Both apps run under the same server (gunicorn, ``-w 2 --threads 4`` by default) on a free loopback port,
one after the other, and get the same load: several client threads, each with its own keep-alive
connection, sending pre-built requests for a fixed time. Printed, one line per figure:

- requests/s of ``POST /bare`` (a bare Flask app answering a small JSON object),
- requests/s of emulator ``POST /v2/create`` (signed, a new requestId each time),
- requests/s of emulator ``POST /v2/getstatus`` (signed),
- the ratio of each emulator figure to the bare one (target >= 0.5).

Results also go to ``benchmarks/results/emulator_throughput.json``. Usage::

    .venv/bin/python benchmarks/emulator_throughput.py                 # SQLite in a temporary folder
    .venv/bin/python benchmarks/emulator_throughput.py --database-url postgresql+psycopg://...

Client and servers share this machine's cores: the figures compare the two apps, they are not capacity
numbers.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from flask import Flask, jsonify
from flask.typing import ResponseReturnValue

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: import the project's own code
    sys.path.insert(0, str(ROOT))

from flask_gateway.core.signing import sign  # noqa: E402
from flask_gateway.core.wire import dumps  # noqa: E402

#: A new account each run, so a database kept between runs (``--database-url``) needs no reset.
ACCOUNT = f"bench-{uuid.uuid4().hex[:12]}"
API_KEY = "bench-api-key"
TARGET_RATIO = 0.5
RESULTS = ROOT / "benchmarks" / "results" / "emulator_throughput.json"

Request = tuple[str, str, bytes, dict[str, str]]  # method, path, body, headers
#: Hands out the next request to send; None when there is none left (the client stops).
Source = Callable[[], Request | None]


def create_bare_app() -> Flask:
    """The yardstick: one JSON endpoint, no database, no validation."""
    app = Flask("bare")

    @app.post("/bare")
    def bare() -> ResponseReturnValue:
        return jsonify(ok=True, answer=42)

    return app


# --- servers ---------------------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass(frozen=True)
class ServerOptions:
    workers: int = 2
    threads: int = 4


@contextmanager
def serve(app_spec: str, options: ServerOptions, env: dict[str, str], log: Path) -> Iterator[int]:
    """Run ``gunicorn app_spec`` on a free loopback port until the block ends; yields the port."""
    port = free_port()
    command = [
        sys.executable,
        "-m",
        "gunicorn",
        "--workers",
        str(options.workers),
        "--threads",
        str(options.threads),
        "--bind",
        f"127.0.0.1:{port}",
        "--keep-alive",
        "30",
        "--log-level",
        "warning",
        "--pythonpath",
        f"{ROOT},{ROOT / 'benchmarks'}",
        app_spec,
    ]
    with log.open("ab") as output:
        # The command is built here from constants and numbers, never from outside input.
        process = subprocess.Popen(  # noqa: S603
            command, env={**os.environ, **env}, stdout=output, stderr=output, cwd=ROOT
        )
    try:
        _wait_until_listening(port, process, log)
        yield port
    except BaseException:
        print(f"server log ({app_spec}):\n{log.read_text(errors='replace')[-3000:]}", file=sys.stderr)
        raise
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _wait_until_listening(
    port: int, process: subprocess.Popen[bytes], log: Path, timeout: float = 60
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with {process.returncode}; see {log}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"the server did not listen on port {port} within {timeout:g} s; see {log}")


# --- load ------------------------------------------------------------------------------------------


def call(port: int, request: Request) -> tuple[int, bytes]:
    """One request on a fresh connection (set-up calls, outside the timed loop)."""
    method, path, body, headers = request
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


@dataclass
class Figure:
    name: str
    requests: int
    seconds: float
    errors: int
    latency_ms_p50: float
    latency_ms_p99: float
    statuses: dict[str, int] = field(default_factory=dict)

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def drive(
    name: str, port: int, next_request: Source, *, duration: float, threads: int, warmup: float
) -> Figure:
    """``threads`` clients, each on its own keep-alive connection, for ``warmup`` + ``duration`` seconds.

    Only the requests answered 200 during the timed part count; anything else is an error.
    """
    lock = threading.Lock()
    started = threading.Event()
    start_at = time.perf_counter() + warmup
    stop_at = start_at + duration
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    counts = {"ok": 0, "errors": 0}

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine: list[float] = []
        ok = errors = 0
        seen: dict[str, int] = {}
        started.wait()
        while True:
            request = next_request()
            if request is None:
                break
            method, path, body, headers = request
            before = time.perf_counter()
            if before >= stop_at:
                break
            try:
                connection.request(method, path, body=body, headers=headers)
                response = connection.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException):
                connection.close()
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                status = 0
            after = time.perf_counter()
            if before < start_at or after > stop_at:
                continue  # warm-up, or finished after the end: not counted
            seen[str(status)] = seen.get(str(status), 0) + 1
            if status == 200:
                ok += 1
                mine.append(after - before)
            else:
                errors += 1
        connection.close()
        with lock:
            counts["ok"] += ok
            counts["errors"] += errors
            latencies.extend(mine)
            for status_text, count in seen.items():
                statuses[status_text] = statuses.get(status_text, 0) + count

    workers = [threading.Thread(target=client, name=f"{name}-{n}") for n in range(threads)]
    for worker in workers:
        worker.start()
    started.set()
    for worker in workers:
        worker.join()
    latencies.sort()
    return Figure(
        name=name,
        requests=counts["ok"],
        seconds=duration,
        errors=counts["errors"],
        latency_ms_p50=round(_percentile(latencies, 50) * 1000, 2),
        latency_ms_p99=round(_percentile(latencies, 99) * 1000, 2),
        statuses=statuses,
    )


def _percentile(sorted_values: Sequence[float], percent: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, round(percent / 100 * (len(sorted_values) - 1)))
    return sorted_values[index]


def cycle(requests: Sequence[Request]) -> Source:
    """Hand out ``requests`` in turn, from any thread."""
    lock = threading.Lock()
    position = [0]

    def next_request() -> Request:
        with lock:
            request = requests[position[0] % len(requests)]
            position[0] += 1
        return request

    return next_request


def once_each(requests: Sequence[Request]) -> Source:
    """Hand out each request once (unique requestIds); None when the pool runs dry."""
    lock = threading.Lock()
    position = [0]

    def next_request() -> Request | None:
        with lock:
            if position[0] >= len(requests):
                return None
            request = requests[position[0]]
            position[0] += 1
        return request

    return next_request


# --- the emulator's requests -----------------------------------------------------------------------


def create_body(request_id: str) -> dict[str, Any]:
    return {
        "requestId": request_id,
        "payjustnow": {
            "merchantOrderReference": f"bench-{request_id[:8]}",
            "orderAmountCents": 79800,
            "orderItems": [
                {
                    "name": "Kettle",
                    "sku": "K-1",
                    "quantity": 2,
                    "priceCents": 39900,
                    "imageUrl": "https://shop.example/k.png",
                    "pageUrl": "https://shop.example/k",
                    "searchTerms": ["kettle"],
                }
            ],
            "confirmRedirectUrl": "https://shop.example/return/ok",
            "cancelRedirectUrl": "https://shop.example/return/cancel",
        },
        "checkoutTotalCents": 79800,
    }


def signed(path: str, body: dict[str, Any], key: str) -> Request:
    raw = dumps(body)
    headers = {
        "Content-Type": "application/json",
        "X-Merchant-Account-ID": ACCOUNT,
        "X-Signature": sign(raw, key),
    }
    return ("POST", path, raw, headers)


def install(port: int) -> str:
    body = {
        "merchantAccountId": ACCOUNT,
        "merchantAccountApiKey": API_KEY,
        # Nothing listens there and no checkout gets paid: no callback is ever sent.
        "checkoutStatusCallbackUrl": "http://127.0.0.1:9/callback",
        "minimumCheckoutAmountCents": 0,
        "maximumCheckoutAmountCents": 10**9,
    }
    status, answer = call(port, ("POST", "/install/v2", dumps(body), {"Content-Type": "application/json"}))
    if status != 200:
        raise SystemExit(f"installation failed: {status} {answer[:300]!r}")
    key: str = json.loads(answer)["secretSigningKey"]
    return key


# --- the run ---------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--duration", type=float, default=10.0, help="timed seconds per figure (10)")
    parser.add_argument("--warmup", type=float, default=2.0, help="untimed seconds before each (2)")
    parser.add_argument("--clients", type=int, default=8, help="client threads (8)")
    parser.add_argument("--workers", type=int, default=2, help="gunicorn worker processes (2)")
    parser.add_argument("--threads", type=int, default=4, help="gunicorn threads per worker (4)")
    parser.add_argument("--database-url", help="the emulator's database (default: SQLite in a temp folder)")
    parser.add_argument("--pool-factor", type=float, default=1.5, help="create bodies per bare request/s*s")
    parser.add_argument("--output", type=Path, default=RESULTS, help=f"JSON results ({RESULTS})")
    args = parser.parse_args(argv)

    options = ServerOptions(workers=args.workers, threads=args.threads)
    timing = {"duration": args.duration, "threads": args.clients, "warmup": args.warmup}
    with tempfile.TemporaryDirectory(prefix="emulator-bench-") as scratch:
        folder = Path(scratch)
        log = folder / "servers.log"
        database = args.database_url or f"sqlite:///{folder / 'emulator.sqlite3'}"

        with serve("emulator_throughput:create_bare_app()", options, {}, log) as port:
            bare_request: Request = ("POST", "/bare", b"{}", {"Content-Type": "application/json"})
            bare = drive("bare", port, cycle([bare_request]), **timing)
        _report(bare)

        env = {
            "EMULATOR_DATABASE_URL": database,
            "EMULATOR_ACCOUNTS": f"{ACCOUNT}:{API_KEY}",
            "EMULATOR_SECRET_KEY": "benchmark-only",
            "EMULATOR_PUBLIC_URL": "http://127.0.0.1",
        }
        with serve("flask_gateway.emulator:create_app()", options, env, log) as port:
            key = install(port)
            # Enough unique create requests for the emulator to go as fast as the bare app, and then some.
            pool = int(bare.per_second * (args.duration + args.warmup) * args.pool_factor) + 1000
            creates = [signed("/v2/create", create_body(uuid.uuid4().hex), key) for _ in range(pool)]
            tokens = []
            for request in creates[-100:]:
                status, answer = call(port, request)
                if status != 200:
                    raise SystemExit(f"create failed: {status} {answer[:300]!r}")
                tokens.append(json.loads(answer)["checkoutToken"])
            statuses = [signed("/v2/getstatus", {"checkoutToken": token}, key) for token in tokens]
            create = drive("emulator create", port, once_each(creates[:-100]), **timing)
            if create.requests + create.errors >= len(creates) - 100:
                print("warning: the create pool ran out before the end: raise --pool-factor", file=sys.stderr)
            _report(create, bare)
            getstatus = drive("emulator getstatus", port, cycle(statuses), **timing)
            _report(getstatus, bare)
        server_log = log.read_text(errors="replace").strip()

    results = {
        "server": f"gunicorn --workers {args.workers} --threads {args.threads} (both apps)",
        "database": "sqlite (temporary file)" if not args.database_url else _redact(args.database_url),
        "clients": args.clients,
        "duration_s": args.duration,
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "figures": {
            figure.name: {**asdict(figure), "requests_per_second": round(figure.per_second, 1)}
            for figure in (bare, create, getstatus)
        },
        "ratios": {
            "create_to_bare": round(create.per_second / bare.per_second, 3),
            "getstatus_to_bare": round(getstatus.per_second / bare.per_second, 3),
        },
        "target_ratio": TARGET_RATIO,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2) + "\n")
    print(f"results written to {args.output}")
    if server_log:
        print(f"server log (warnings and errors):\n{server_log[-2000:]}", file=sys.stderr)
    return 0


def _report(figure: Figure, bare: Figure | None = None) -> None:
    line = (
        f"{figure.name:<20} {figure.per_second:9.1f} requests/s"
        f"  (p50 {figure.latency_ms_p50} ms, p99 {figure.latency_ms_p99} ms, errors {figure.errors})"
    )
    print(line, flush=True)
    if bare is not None:
        ratio = figure.per_second / bare.per_second if bare.per_second else 0.0
        verdict = "meets" if ratio >= TARGET_RATIO else "BELOW"
        print(
            f"{figure.name + ' / bare':<20} {ratio:9.3f} ratio ({verdict} the {TARGET_RATIO} target)",
            flush=True,
        )


def _redact(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    if "@" in rest:
        rest = "****@" + rest.split("@", 1)[1]
    return f"{scheme}{sep}{rest}"


if __name__ == "__main__":
    raise SystemExit(main())
