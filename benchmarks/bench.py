"""``make bench``: every performance figure (issues 7 and 16), each a ratio against a yardstick run now, here.

One line per figure (yardstick, measurement, ratio, target) on stdout; everything, the yardsticks' own
numbers included, in ``benchmarks/results/latest.json``. Figures (``--only`` picks some, by number):

1. ``sign`` / ``verify`` on 1 KiB and 64 KiB bodies vs a bare HMAC-SHA256 + base64 (target >= 0.5x speed).
2. ``GatewayClient.create_checkout`` against a local stub server vs a bare ``requests.post`` of the same
   prepared body (target <= 1.15x time).
3. The shop's ``/gateway/callback`` (confirmed with getstatus by the real emulator) under gunicorn on
   PostgreSQL with 100,000 checkouts, vs a minimal endpoint on the same stack that verifies, makes one
   getstatus call to the same emulator, one indexed UPDATE and commits (target >= 0.5x throughput); the
   one-UPDATE endpoint of the first round printed for reference (figure_callback.py, apps.py). The same
   on SQLite (the shop's file and the emulator's, the rows loaded with executemany), with the callback's
   p99 / p50 printed for reference.
4. The emulator's create and getstatus vs endpoints doing the same minimal work on the same database and
   table (create: signature, validation, one INSERT, one commit; getstatus: signature, one indexed SELECT,
   a 16-key answer), under gunicorn, on PostgreSQL and on SQLite (target >= 0.5x; create's p99 / p50 on
   SQLite for reference); a bare Flask JSON endpoint for reference (figure_emulator.py,
   emulator_yardsticks.py).
5. SQL statements per create, status poll and callback with 1,000 and 100,000 rows on SQLite, and with
   1,000 and 1,000,000 on PostgreSQL (loaded with COPY), must be equal; at the million every statement of
   create, poll, callback and reconcile's claim explained (no Seq Scan on the big tables), and the
   callback's and getstatus's p50 within 1.2x of theirs at 1,000 (figure_statements.py).
6. Reconciliation of 10,000 pending checkouts with a pool of ``--reconcile-concurrency`` threads vs a
   yardstick doing its work with as many threads (getstatus, one indexed UPDATE per checkout, in batches;
   no claims, leases or signals) against the same emulator (target >= 0.7x); the emulator's getstatus
   alone (wrk, as many connections) for reference; requests and new connections, peak memory, two runs at
   once splitting the work (figure_reconcile.py).
7. A shop's "create, pay, callback, fulfilled" test with the pytest plugin (docs/testing.md's example),
   in-process on SQLite, vs the same shop answering one plain request (target: under 50 ms); 7b the same
   with ``gateway_sqlite_no_fsync`` (figure_plugin.py).
R. How long recovery takes in the reliability scenarios, run as the tests run them (their checks
   included): the longest wait of an outbox event while shop workers are killed inside callbacks and
   PostgreSQL restarts, the shop serving and ready again after each restart and after a boot without its
   database (targets: the claim lease plus three rounds of the outbox service; under the 503s'
   ``Retry-After``), an outage of Redis and of the Celery worker detected and cleared (the deliver bound plus
   a tick and 4 s; 30 s) (figure_recovery.py, ``--recovery`` picks scenarios). The tests assert the events;
   these are their durations.
T. How soon another Celery worker fulfils the outbox event of a worker SIGKILLed mid-delivery, real time
   (target: lease + tick + 1 s, 16 s) (figure_takeover.py, ``--takeover-rounds``).

The load generator of 3 and 4 is wrk (Debian's package; ``make bench`` installs it) with
``benchmarks/wrk/requests.lua`` sending pre-built requests over keep-alive connections. Client and servers
share this machine's cores: the figures compare two apps under the same conditions, they are not capacity
numbers.
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import hmac
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for entry in (str(ROOT), str(ROOT / "benchmarks")):
    if entry not in sys.path:  # run as a script from anywhere: the project's code, the tests' helpers
        sys.path.insert(0, entry)

import requests  # noqa: E402
from emulator_throughput import create_body, free_port  # noqa: E402
from figure_callback import figure_callback, figure_callback_sqlite  # noqa: E402
from figure_emulator import figure_emulator  # noqa: E402
from figure_plugin import figure_plugin_test  # noqa: E402
from figure_reconcile import figure_reconcile  # noqa: E402
from figure_recovery import SCENARIOS, figure_recovery  # noqa: E402
from figure_statements import figure_million, figure_statements  # noqa: E402
from figure_takeover import figure_takeover  # noqa: E402
from harness import (  # noqa: E402
    ACCOUNT,
    _pg_version,
    _wait_port,
    add_load_options,
    postgres,
    report,
    reported,
    results,
    summary,
)

from flask_gateway.core.signing import sign, verify  # noqa: E402
from flask_gateway.core.wire import dumps  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "latest.json"


# --- 1. signing ----------------------------------------------------------------------------------------


def _json_body(size: int) -> bytes:
    """Compact ASCII JSON of ``size`` bytes, with spaces inside string values as real bodies have."""
    items = []
    body = b""
    n = 0
    while True:
        items.append(
            {"name": f"Enamel kettle number {n}", "sku": f"K-{n}", "quantity": 1, "priceCents": 39900}
        )
        candidate = dumps({"requestId": str(uuid.UUID(int=n)), "payjustnow": {"orderItems": items}})
        if len(candidate) > size:
            break
        body, n = candidate, n + 1
    return body + b" " * (size - len(body))  # exactly ``size`` (trailing whitespace: stripped by both)


def bare_sign(body: bytes, key: bytes) -> str:
    """What the protocol does, with nothing else: HMAC-SHA256 over the bytes, base64 (``hmac.new``)."""
    return base64.b64encode(hmac.new(key, body, hashlib.sha256).digest()).decode("ascii")


def bare_verify(body: bytes, key: bytes, signature: str) -> bool:
    return hmac.compare_digest(bare_sign(body, key).encode("ascii"), signature.encode("ascii"))


def oneshot_sign(body: bytes, key: bytes) -> str:
    """The strictest yardstick: OpenSSL's one-shot ``hmac.digest`` (what ``sign`` itself uses)."""
    return base64.b64encode(hmac.digest(key, body, "sha256")).decode("ascii")


def oneshot_verify(body: bytes, key: bytes, signature: str) -> bool:
    return hmac.compare_digest(oneshot_sign(body, key).encode("ascii"), signature.encode("ascii"))


def _rates(first: Callable[[], object], second: Callable[[], object], seconds: float) -> tuple[float, float]:
    """Calls per second of each: 10 interleaved rounds (the machine is shared), the best round of each."""
    timers = [timeit.Timer(first), timeit.Timer(second)]
    runs = []
    for timer in timers:
        number, taken = timer.autorange()
        runs.append(max(1, int(number * seconds / 10 / taken)))
    best = [float("inf"), float("inf")]
    for _ in range(10):
        for index, timer in enumerate(timers):
            best[index] = min(best[index], timer.timeit(runs[index]) / runs[index])
    return 1 / best[0], 1 / best[1]


def _signing_pairs(body: bytes, key: str, signature: str) -> dict[str, tuple[Callable[[], object], ...]]:
    """(ours, bare) per figure. The bare HMAC runs over the same bytes: it strips nothing, which is the
    protocol's extra work."""
    key_bytes = key.encode()
    return {
        "sign": (lambda: sign(body, key), lambda: bare_sign(body, key_bytes)),
        "verify": (lambda: verify(body, key, signature), lambda: bare_verify(body, key_bytes, signature)),
        "sign-vs-oneshot": (lambda: sign(body, key), lambda: oneshot_sign(body, key_bytes)),
        "verify-vs-oneshot": (
            lambda: verify(body, key, signature),
            lambda: oneshot_verify(body, key_bytes, signature),
        ),
    }


def figure_signing(args: argparse.Namespace) -> None:
    key = "k" * 43
    key_bytes = key.encode()
    out: dict[str, Any] = {}
    for label, size in (("1KiB", 1024), ("64KiB", 64 * 1024)):
        body = _json_body(size)
        signature = sign(body, key)
        if signature != bare_sign(body.replace(b" ", b""), key_bytes):
            raise SystemExit("sign() does not agree with a bare HMAC of the stripped body")
        pairs = _signing_pairs(body, key, signature)
        for name, (ours, bare) in pairs.items():
            bare_rate, our_rate = _rates(bare, ours, args.sign_seconds)
            ratio = our_rate / bare_rate
            out[f"{name}_{label}"] = {
                "bare_per_s": round(bare_rate),
                "ours_per_s": round(our_rate),
                "ratio": round(ratio, 3),
                "target": ">= 0.5",
                "met": ratio >= 0.5,
            }
            report(
                "1",
                f"{name} {label}",
                f"{bare_rate:,.0f}/s",
                f"{our_rate:,.0f}/s",
                ratio,
                ">= 0.5",
                ratio >= 0.5,
            )
    results["figures"]["1_signing"] = out


# --- 2. client create-checkout vs bare requests.post --------------------------------------------------


class _StubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # headers and body go in separate writes: no delayed-ACK stall
    answer = b"{}"

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.answer)))
        self.end_headers()
        self.wfile.write(self.answer)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _stub_server_main(port: int, answer_file: str) -> None:
    _StubHandler.answer = Path(answer_file).read_bytes()
    ThreadingHTTPServer(("127.0.0.1", port), _StubHandler).serve_forever()


def _create_answer(folder: Path) -> tuple[bytes, dict[str, Any]]:
    """A real create request and the emulator's real answer to it (in-process, SQLite)."""
    from tests.emulator.conftest import make_emulator
    from tests.emulator.support import ACCOUNT as TEST_ACCOUNT
    from tests.emulator.support import Gateway as EmulatorDriver

    app = make_emulator(f"sqlite:///{folder / 'stub.sqlite3'}", public_url="https://gateway.example")
    driver = EmulatorDriver(app.test_client())
    driver.install(callback_url="https://shop.example/gateway/callback")
    body = create_body(str(uuid.uuid4()))
    raw = dumps(body)
    key = driver.keys[TEST_ACCOUNT]
    headers = {
        "Content-Type": "application/json",
        "X-Merchant-Account-ID": TEST_ACCOUNT,
        "X-Signature": sign(raw, key),
    }
    answer = app.test_client().post("/v2/create", data=raw, headers=headers)
    if answer.status_code != 200:
        raise SystemExit(f"the emulator refused the create: {answer.get_data(as_text=True)}")
    return answer.get_data(), body


def figure_client(args: argparse.Namespace, folder: Path) -> None:
    from flask_gateway.core.client import GatewayClient
    from flask_gateway.core.wire import CreateCheckoutRequest

    answer, body = _create_answer(folder)
    (folder / "answer.json").write_bytes(answer)
    port = free_port()
    stub = subprocess.Popen(  # noqa: S603 - our own interpreter and script
        [sys.executable, __file__, "--stub-server", str(port), str(folder / "answer.json")]
    )
    try:
        _wait_port(port)
        key = "k" * 43
        url = f"http://127.0.0.1:{port}"
        session = requests.Session()
        client = GatewayClient(base_url=url, merchant_account_id=ACCOUNT, signing_key=key, session=session)
        request = CreateCheckoutRequest.model_validate(body)
        prepared_body = request.to_json()
        headers = {
            "Content-Type": "application/json",
            "X-Merchant-Account-ID": ACCOUNT,
            "X-Signature": sign(prepared_body, key),
        }
        bare_session = requests.Session()

        def bare() -> None:
            response = bare_session.post(f"{url}/v2/create", data=prepared_body, headers=headers, timeout=30)
            response.raise_for_status()

        def ours() -> None:
            client.create_checkout(request)

        for function in (bare, ours):
            for _ in range(200):
                function()
        bare_times, our_times = [], []
        for _ in range(args.client_rounds):  # interleaved rounds: both see the same machine
            for function, times in ((bare, bare_times), (ours, our_times)):
                started = time.perf_counter()
                for _ in range(args.client_calls):
                    function()
                times.append((time.perf_counter() - started) / args.client_calls)
        # Each round times both, one right after the other: the ratio is the median of the rounds' ratios
        # (the machine is shared: a burst of other work slows a round, not the comparison within it).
        bare_us, our_us = min(bare_times) * 1e6, min(our_times) * 1e6
        ratios = [ours / bare for ours, bare in zip(our_times, bare_times, strict=True)]
        median_ratio = statistics.median(ratios)
        ratio = median_ratio
        results["figures"]["2_client_create"] = {
            "bare_us_per_call": round(bare_us, 1),
            "client_us_per_call": round(our_us, 1),
            "ratio": round(ratio, 3),
            "target": "<= 1.15",
            "met": ratio <= 1.15,
            "calls": args.client_calls * args.client_rounds,
            "ratio_of_best_rounds": round(our_us / bare_us, 3),
        }
        report(
            "2",
            "client create_checkout (time)",
            f"{bare_us:.0f} us",
            f"{our_us:.0f} us",
            ratio,
            "<= 1.15",
            ratio <= 1.15,
        )
    finally:
        stub.terminate()
        stub.wait()


# --- the run -----------------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    model = ""
    try:
        for text in Path("/proc/cpuinfo").read_text().splitlines():
            if text.startswith("model name"):
                model = text.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "nproc": os.cpu_count(),
        "cpu": model,
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
    }


def main(argv: list[str] | None = None) -> int:
    if argv is None and len(sys.argv) > 1 and sys.argv[1] == "--stub-server":
        _stub_server_main(int(sys.argv[2]), sys.argv[3])
        return 0
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--only", default="1,2,3,4,5,6,7,R,T", help="figures to run, by number (all)")
    add_load_options(parser)
    parser.add_argument("--pool", type=int, default=20_000, help="distinct requests per create/callback run")
    parser.add_argument("--rows", type=int, default=100_000, help="existing checkouts for figure 3")
    parser.add_argument("--sign-seconds", type=float, default=2.0)
    parser.add_argument("--client-calls", type=int, default=100)
    parser.add_argument("--client-rounds", type=int, default=31)
    parser.add_argument("--statement-rows", type=int, nargs=2, default=[1_000, 100_000])
    parser.add_argument(
        "--million-rows",
        type=int,
        nargs=2,
        default=[1_000, 1_000_000],
        help="figure 5 on PostgreSQL: the two table sizes compared (1,000 and 1,000,000)",
    )
    parser.add_argument(
        "--latency-calls", type=int, default=300, help="figure 5: callbacks and getstatus timed per size"
    )
    parser.add_argument("--reconcile-rows", type=int, default=10_000)
    parser.add_argument(
        "--reconcile-concurrency",
        type=int,
        default=None,
        help="figure 6's pool of polling threads (GATEWAY_RECONCILE_CONCURRENCY's default)",
    )
    parser.add_argument("--plugin-rounds", type=int, default=30, help="tests timed for figure 7 (30)")
    parser.add_argument(
        "--recovery",
        default=",".join(SCENARIOS),
        help=f"figure R's scenarios, comma-separated ({','.join(SCENARIOS)})",
    )
    parser.add_argument(
        "--takeover-rounds", type=int, default=3, help="figure T: workers killed, one per round (3)"
    )
    parser.add_argument("--output", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    wanted = {part.strip() for part in args.only.split(",")}

    results["machine"] = machine()
    results["started_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    results["settings"] = {
        "server": f"gunicorn --workers {args.workers} --threads {args.threads}",
        "load": f"wrk -t{args.wrk_threads} -c{args.connections}, {args.rounds} alternating rounds, "
        f"{args.duration:g} s per load in all (warm-up {args.warmup:g} s)",
    }
    print(f"machine: {results['machine']}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        folder = Path(scratch)
        if "1" in wanted:
            figure_signing(args)
        if "2" in wanted:
            figure_client(args, folder)
        if wanted & {"3", "4"}:
            with postgres() as cluster:
                results["machine"]["postgresql"] = _pg_version(cluster)
                if "3" in wanted:
                    figure_callback(args, folder, cluster)
                    figure_callback_sqlite(args, folder)
                if "4" in wanted:
                    emulator_url = cluster.create_database("bench_emulator")
                    figure_emulator(args, folder, "postgresql", emulator_url)
                    figure_emulator(args, folder, "sqlite", f"sqlite:///{folder / 'emulator.sqlite3'}")
        if "5" in wanted:
            figure_statements(args, folder)
            with postgres() as cluster:
                results["machine"]["postgresql"] = _pg_version(cluster)
                figure_million(args, folder, cluster)
        if "6" in wanted:
            figure_reconcile(args, folder)
        if "7" in wanted:
            figure_plugin_test(args, folder)
        if "R" in wanted:
            figure_recovery(args, folder)
        if "T" in wanted:
            figure_takeover(args, folder)
        log = folder / "servers.log"
        if log.exists() and log.read_text().strip():
            print(
                f"server log (warnings and errors):\n{log.read_text(errors='replace')[-3000:]}",
                file=sys.stderr,
            )
    results["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    results["summary"] = reported
    print(f"\nevery figure against its target:\n{summary()}", flush=True)
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"results written to {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
