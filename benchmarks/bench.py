"""``make bench``: every performance figure of issue 7, each a ratio against a baseline run now, here.

One line per figure (baseline, measurement, ratio, target) on stdout; everything in
``benchmarks/results/latest.json``. Figures (``--only`` picks some, by number):

1. ``sign`` / ``verify`` on 1 KiB and 64 KiB bodies vs a bare HMAC-SHA256 + base64 (target >= 0.5x speed).
2. ``GatewayClient.create_checkout`` against a local stub server vs a bare ``requests.post`` of the same
   prepared body (target <= 1.15x time).
3. The shop's ``/gateway/callback`` under gunicorn on PostgreSQL with 100,000 checkouts, pre-signed bodies,
   vs a minimal Flask endpoint doing one indexed UPDATE on the same stack (target >= 0.5x throughput).
4. The emulator's create and getstatus vs a bare Flask JSON endpoint, under gunicorn, on PostgreSQL and
   on SQLite (target >= 0.5x throughput).
5. SQL statements per create, status poll and callback with 1,000 and 100,000 rows (must be equal).
6. Reconciliation of 10,000 pending checkouts against the emulator: requests, peak memory, time.
7. A shop's "create, pay, callback, fulfilled" test with the pytest plugin (docs/testing.md's example),
   in-process on SQLite, vs the same shop answering one plain request (target: under 50 ms).

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
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import timeit
import tracemalloc
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for entry in (str(ROOT), str(ROOT / "benchmarks")):
    if entry not in sys.path:  # run as a script from anywhere: the project's code, the tests' helpers
        sys.path.insert(0, entry)

import requests  # noqa: E402
from emulator_throughput import ServerOptions, call, create_body, free_port, serve  # noqa: E402

from flask_gateway.core.signing import sign, verify  # noqa: E402
from flask_gateway.core.wire import dumps  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results" / "latest.json"
LUA = ROOT / "benchmarks" / "wrk" / "requests.lua"
ACCOUNT = "bench-merchant"
API_KEY = "bench-api-key"

results: dict[str, Any] = {"figures": {}}


def report(key: str, name: str, baseline: str, measured: str, ratio: float, target: str, met: bool) -> None:
    verdict = "met" if met else "NOT MET"
    print(
        f"[{key}] {name:<38} baseline {baseline:>18}  measured {measured:>18}  ratio {ratio:6.3f}x "
        f"(target {target}: {verdict})",
        flush=True,
    )


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


def _wait_port(port: int, timeout: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on port {port}")


# --- wrk -------------------------------------------------------------------------------------------


def ensure_wrk() -> str:
    found = shutil.which("wrk")
    if found is None:
        raise SystemExit("wrk is not installed: run 'make bench' (it installs it) or apt-get install -y wrk")
    return found


def run_wrk(
    port: int, lines: list[str], folder: Path, args: argparse.Namespace, *, duration: float
) -> dict[str, Any]:
    """wrk over keep-alive connections, sending ``lines`` (see requests.lua) for ``duration`` seconds."""
    path = folder / f"requests-{uuid.uuid4().hex[:8]}.txt"
    path.write_text("\n".join(lines) + "\n")
    command = [
        ensure_wrk(),
        f"-t{args.wrk_threads}",
        f"-c{args.connections}",
        f"-d{round(duration)}s",  # wrk takes whole seconds
        "--timeout",
        "30s",
        "-s",
        str(LUA),
        f"http://127.0.0.1:{port}",
        "--",
        str(path),
        str(args.wrk_threads),
    ]
    output = subprocess.run(command, capture_output=True, text=True, check=True).stdout  # noqa: S603
    path.unlink()
    match = re.search(r"^WRK_JSON (.*)$", output, re.MULTILINE)
    if match is None:
        raise SystemExit(f"wrk printed no summary:\n{output}")
    data: dict[str, Any] = json.loads(match.group(1))
    errors = (
        data["status_errors"]
        + data["connect_errors"]
        + data["read_errors"]
        + data["write_errors"]
        + data["timeouts"]
    )
    seconds = data["duration_us"] / 1e6
    data.update(
        ok_per_s=round((data["requests"] - errors) / seconds, 1),
        errors=errors,
        p50_ms=round(data["p50_us"] / 1000, 2),
        p99_ms=round(data["p99_us"] / 1000, 2),
        pool=len(lines),
    )
    return data


@dataclass
class Load:
    """One load of an alternating measurement: a server and the requests it gets."""

    name: str
    port: int
    make_lines: Callable[[int], list[str]]
    unique: bool = True
    runs: list[dict[str, Any]] = field(default_factory=list)


def alternate(loads: list[Load], folder: Path, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """A warm-up run of each load, then ``--rounds`` rounds in which each load runs once, one after the
    other (``--duration`` split between the rounds). All servers are up the whole time (idle when not
    loaded), so a baseline and its measurement always run minutes apart at most, seconds apart usually.
    Returns, per load, the totals (requests/s over all its runs) and the median p50/p99 of its runs."""
    pool = max(1000, args.pool // args.rounds)
    for load in loads:
        run_wrk(load.port, load.make_lines(pool), folder, args, duration=args.warmup)
    for _ in range(args.rounds):
        for load in loads:
            figure = run_wrk(
                load.port,
                load.make_lines(pool),
                folder,
                args,
                duration=max(1, round(args.duration / args.rounds)),
            )
            if load.unique and figure["requests"] > figure["pool"]:
                print(
                    f"warning: {load.name}: {figure['requests']} requests from a pool of {pool}",
                    file=sys.stderr,
                )
            load.runs.append(figure)
    out = {}
    for load in loads:
        seconds = sum(run["duration_us"] for run in load.runs) / 1e6
        ok = sum(run["requests"] - run["errors"] for run in load.runs)
        out[load.name] = {
            "ok_per_s": round(ok / seconds, 1),
            "errors": sum(run["errors"] for run in load.runs),
            "p50_ms": round(statistics.median(run["p50_ms"] for run in load.runs), 1),
            "p99_ms": round(statistics.median(run["p99_ms"] for run in load.runs), 1),
            "round_ok_per_s": [run["ok_per_s"] for run in load.runs],
            "runs": load.runs,
        }
    return out


def round_ratios(base: dict[str, Any], ours: dict[str, Any]) -> list[float]:
    return [o / b for o, b in zip(ours["round_ok_per_s"], base["round_ok_per_s"], strict=True) if b]


def line(path: str, headers: dict[str, str], body: bytes) -> str:
    fields = [path, *(f"{name}={value}" for name, value in headers.items()), body.decode("ascii")]
    if any("\t" in field or "\n" in field for field in fields):
        raise ValueError("a request line cannot hold a tab or a newline")
    return "\t".join(fields)


def throughput_line(key: str, name: str, base: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """The ratio is the median of the rounds' ratios (each round: baseline, then measurement)."""
    ratios = round_ratios(base, ours)
    ratio = statistics.median(ratios) if ratios else 0.0
    report(
        key,
        f"{name} (p50 {ours['p50_ms']} ms, p99 {ours['p99_ms']} ms)",
        f"{base['ok_per_s']:,.0f} req/s",
        f"{ours['ok_per_s']:,.0f} req/s",
        ratio,
        ">= 0.5",
        ratio >= 0.5,
    )
    if ours["errors"] or base["errors"]:
        print(f"    errors: baseline {base['errors']}, measured {ours['errors']}", flush=True)
    return {
        "baseline": base,
        "measured": ours,
        "ratio": round(ratio, 3),
        "round_ratios": [round(r, 3) for r in ratios],
        "target": ">= 0.5",
        "met": ratio >= 0.5,
    }


# --- PostgreSQL ------------------------------------------------------------------------------------


@contextmanager
def postgres() -> Iterator[Any]:
    from tests.postgres import start_cluster

    cluster = start_cluster()
    try:
        yield cluster
    finally:
        cluster.stop()


def _pg_version(cluster: Any) -> str:
    import psycopg

    with psycopg.connect(host="127.0.0.1", port=cluster.port, user=cluster.user, dbname="postgres") as conn:
        row = conn.execute("SHOW server_version").fetchone()
        return str(row[0]) if row else "?"


# --- 3. the extension's callback -------------------------------------------------------------------


def _token(n: int) -> str:
    return f"v2.{ACCOUNT}.{uuid.UUID(int=n)}"


def figure_callback(args: argparse.Namespace, folder: Path, cluster: Any) -> None:
    import psycopg
    from apps import shop_app
    from sqlalchemy import insert

    from flask_gateway.core.timestamps import utcnow
    from flask_gateway.core.wire import CheckoutStatusPayload
    from flask_gateway.models import Installation
    from flask_gateway.state import get_state

    url = cluster.create_database("bench_shop")
    app, db = shop_app(url)
    signing_key = "s" * 43
    with app.app_context():
        db.create_all()
        state = get_state()
        now = utcnow()
        db.session.execute(
            insert(Installation),
            [
                {
                    "environment": "emulator",
                    "merchant_account_id": ACCOUNT,
                    "api_key_encrypted": state.box.encrypt(API_KEY),
                    "signing_key_encrypted": state.box.encrypt(signing_key),
                    "callback_url": "http://127.0.0.1:8000/gateway/callback",
                    "minimum_cents": 0,
                    "maximum_cents": 10**9,
                    "installed_at": now,
                    "updated_at": now,
                }
            ],
        )
        db.session.commit()
        db.engine.dispose()

    rows = args.rows
    started = time.perf_counter()
    stamp = now.isoformat()
    expires = (now + timedelta(hours=1)).isoformat()
    columns = (
        "api_version, order_reference, request_id, token, merchant_account_id, status, total_cents, "
        'paid_cents, refunded_cents, "order", created_at, updated_at, expires_at, flagged'
    )
    with psycopg.connect(host="127.0.0.1", port=cluster.port, user=cluster.user, dbname="bench_shop") as conn:
        with conn.cursor() as cursor, cursor.copy(f"COPY gateway_checkouts ({columns}) FROM STDIN") as copy:
            for n in range(rows):
                copy.write_row(
                    ("v2", f"B-{n}", f"req-{n}", _token(n), ACCOUNT, "PENDING_ORDER", 79800, 0, 0,
                     f'{{"reference": "B-{n}"}}', stamp, stamp, expires, False)
                )  # fmt: skip
        conn.execute("ANALYZE gateway_checkouts")
    load_s = time.perf_counter() - started
    print(f"[3] loaded {rows:,} checkouts with COPY in {load_s:.1f} s", flush=True)

    half = rows // 2
    paid_at = utcnow()

    def callback_lines(start: int, count: int) -> list[str]:
        out = []
        for n in range(start, start + count):
            body = CheckoutStatusPayload(
                checkoutToken=_token(n),
                checkoutTotalCents=79800,
                checkoutPaymentStatus="PAID",
                paidAt=paid_at,
                paymentReference=700_000_000 + n,
                merchantOrderReference=f"B-{n}",
                gatewayOrderReference=n,
                createdAt=now,
                updatedAt=paid_at,
            ).to_json()
            headers = {
                "Content-Type": "application/json",
                "X-Merchant-Account-ID": ACCOUNT,
                "X-Signature": sign(body, signing_key),
            }
            out.append(line("PATH", headers, body))
        return out

    # Each run gets checkouts of its own, never paid before: every callback is a real PENDING -> PAID.
    cursor = {"bare": 0, "callback": half}

    def lines_for(kind: str, path: str) -> Callable[[int], list[str]]:
        def make(count: int) -> list[str]:
            start = cursor[kind]
            limit = half if kind == "bare" else rows
            count = min(count, limit - start)
            cursor[kind] += count
            return [item.replace("PATH", path, 1) for item in callback_lines(start, count)]

        return make

    options = ServerOptions(workers=args.workers, threads=args.threads)
    env = {"BENCH_DATABASE_URL": url}
    log = folder / "servers.log"
    with (
        serve("apps:update_app()", options, env, log) as bare_port,
        serve("apps:shop_wsgi()", options, env, log) as port,
    ):
        figures = alternate(
            [
                Load("bare", bare_port, lines_for("bare", "/bare-callback")),
                Load("callback", port, lines_for("callback", "/gateway/callback")),
            ],
            folder,
            args,
        )
    base, ours = figures["bare"], figures["callback"]
    with psycopg.connect(host="127.0.0.1", port=cluster.port, user=cluster.user, dbname="bench_shop") as conn:
        paid = conn.execute("SELECT count(*) FROM gateway_checkouts WHERE status = 'PAID'").fetchone()
        logs = conn.execute("SELECT outcome, count(*) FROM gateway_callback_log GROUP BY outcome").fetchall()
    figure = throughput_line("3", "callback, PostgreSQL, 100k rows", base, ours)
    figure.update(
        rows=rows, load_seconds=round(load_s, 1), paid_rows=paid[0] if paid else 0, callback_log=dict(logs)
    )
    results["figures"]["3_callback"] = figure


# --- 4. the emulator ---------------------------------------------------------------------------------


def _signed_line(path: str, body: dict[str, Any], key: str) -> str:
    raw = dumps(body)
    headers = {
        "Content-Type": "application/json",
        "X-Merchant-Account-ID": ACCOUNT,
        "X-Signature": sign(raw, key),
    }
    return line(path, headers, raw)


def figure_emulator(args: argparse.Namespace, folder: Path, backend: str, database_url: str) -> None:
    options = ServerOptions(workers=args.workers, threads=args.threads)
    env = {
        "EMULATOR_DATABASE_URL": database_url,
        "EMULATOR_ACCOUNTS": f"{ACCOUNT}:{API_KEY}",
        "EMULATOR_SECRET_KEY": "benchmark-only",
        "EMULATOR_PUBLIC_URL": "http://127.0.0.1",
    }
    log = folder / "servers.log"
    with (
        serve("apps:bare_app()", options, {}, log) as bare_port,
        serve("flask_gateway.emulator:create_app()", options, env, log) as port,
    ):
        install = {
            "merchantAccountId": ACCOUNT,
            "merchantAccountApiKey": API_KEY,
            "checkoutStatusCallbackUrl": "http://127.0.0.1:9/callback",  # never called: nothing gets paid
            "minimumCheckoutAmountCents": 0,
            "maximumCheckoutAmountCents": 10**9,
        }
        status, answer = call(
            port, ("POST", "/install/v2", dumps(install), {"Content-Type": "application/json"})
        )
        if status != 200:
            raise SystemExit(f"installation failed: {status} {answer[:300]!r}")
        key = json.loads(answer)["secretSigningKey"]

        def creates(count: int) -> list[str]:
            return [_signed_line("/v2/create", create_body(str(uuid.uuid4())), key) for _ in range(count)]

        tokens = []
        for item in creates(200):
            path, *headers, body = item.split("\t")
            status, answer = call(port, ("POST", path, body.encode(), dict(h.split("=", 1) for h in headers)))
            if status != 200:
                raise SystemExit(f"create failed: {status} {answer[:300]!r}")
            tokens.append(json.loads(answer)["checkoutToken"])
        statuses = [_signed_line("/v2/getstatus", {"checkoutToken": token}, key) for token in tokens]
        bare_line = line("/bare", {"Content-Type": "application/json"}, b"{}")
        figures = alternate(
            [
                Load("bare", bare_port, lambda count: [bare_line] * 100, unique=False),
                Load("create", port, creates),
                Load("getstatus", port, lambda count: statuses, unique=False),
            ],
            folder,
            args,
        )
    bare, create, getstatus = figures["bare"], figures["create"], figures["getstatus"]
    print(
        f"[4] bare Flask JSON endpoint ({backend} rounds): {bare['ok_per_s']:,.0f} req/s "
        f"(p50 {bare['p50_ms']} ms, p99 {bare['p99_ms']} ms)",
        flush=True,
    )
    out = {
        "bare": bare,
        "create": throughput_line("4", f"emulator create, {backend}", bare, create),
        "getstatus": throughput_line("4", f"emulator getstatus, {backend}", bare, getstatus),
    }
    results["figures"][f"4_emulator_{backend}"] = out


# --- 5. statements per operation ------------------------------------------------------------------


def figure_statements(args: argparse.Namespace, folder: Path) -> None:
    from tests.extension.test_statement_counts import BOUNDS, build_harness, seed, statement_counts

    counts = {}
    for rows in args.statement_rows:
        h = build_harness(
            f"sqlite:///{folder / f'shop-{rows}.sqlite3'}", f"sqlite:///{folder / f'emu-{rows}.sqlite3'}"
        )
        h.install()
        started = time.perf_counter()
        seed(h, rows)
        print(
            f"[5] seeded {rows:,} checkouts on each side in {time.perf_counter() - started:.1f} s", flush=True
        )
        counts[rows] = statement_counts(h)
    small, large = (counts[rows] for rows in args.statement_rows)
    equal = small == large
    for operation in ("create", "poll", "callback"):
        shop_bound, emulator_bound = BOUNDS[operation]
        print(
            f"[5] statements per {operation:<9} "
            f"shop {small[operation]['shop']:>3} / {large[operation]['shop']:>3}"
            f"   emulator {small[operation]['emulator']:>3} / {large[operation]['emulator']:>3}"
            f"   ({args.statement_rows[0]:,} / {args.statement_rows[1]:,} rows; "
            f"bounds {shop_bound} / {emulator_bound})",
            flush=True,
        )
    print(f"[5] counts equal at both sizes: {'met' if equal else 'NOT MET'}", flush=True)
    results["figures"]["5_statements"] = {
        "backend": "sqlite",
        "rows": list(args.statement_rows),
        "counts": {str(rows): value for rows, value in counts.items()},
        "equal": equal,
        "bounds": BOUNDS,
    }


# --- 6. reconciliation ---------------------------------------------------------------------------


def figure_reconcile(args: argparse.Namespace, folder: Path) -> None:
    """``reconcile()`` of due pending checkouts against the emulator served over real HTTP (gunicorn on the
    same SQLite database), with the extension's own HTTP sessions (keep-alive, as in production)."""
    import dataclasses

    import urllib3.connectionpool
    from sqlalchemy import update

    from flask_gateway.models import GatewayCheckout
    from flask_gateway.reconciliation import reconcile
    from flask_gateway.state import get_state
    from tests.extension.conftest import ACCOUNT as SHOP_ACCOUNT
    from tests.extension.conftest import API_KEY as SHOP_API_KEY
    from tests.extension.conftest import EMULATOR_URL
    from tests.extension.test_statement_counts import build_harness, seed

    checkouts = args.reconcile_rows
    emulator_url = f"sqlite:///{folder / 'rec-emu.sqlite3'}"
    h = build_harness(f"sqlite:///{folder / 'rec-shop.sqlite3'}", emulator_url)
    h.install()
    seed(h, checkouts)
    env = {
        "EMULATOR_DATABASE_URL": emulator_url,
        "EMULATOR_ACCOUNTS": f"{SHOP_ACCOUNT}:{SHOP_API_KEY}",
        "EMULATOR_SECRET_KEY": "benchmark-only",
        "EMULATOR_PUBLIC_URL": EMULATOR_URL,
    }
    options = ServerOptions(workers=args.workers, threads=args.threads)
    sent = {"requests": 0, "connections": 0}
    send, new_conn = requests.Session.send, urllib3.connectionpool.HTTPConnectionPool._new_conn

    def counted_send(self: requests.Session, *a: Any, **k: Any) -> Any:
        sent["requests"] += 1
        return send(self, *a, **k)

    def counted_conn(self: Any) -> Any:
        sent["connections"] += 1
        return new_conn(self)

    with (
        serve("flask_gateway.emulator:create_app()", options, env, folder / "servers.log") as port,
        h.shop.app_context(),
    ):
        state = get_state()
        state.client_options.clear()  # the extension's own sessions, over the network
        url = f"http://127.0.0.1:{port}"
        state.config = dataclasses.replace(state.config, base_url=url, install_url=f"{url}/install")
        session = state.session
        # Due for reconciliation: last changed an hour ago, never polled.
        session.execute(update(GatewayCheckout).values(updated_at=datetime.now(UTC) - timedelta(hours=1)))
        session.commit()
        requests.Session.send = counted_send  # type: ignore[method-assign]
        urllib3.connectionpool.HTTPConnectionPool._new_conn = counted_conn  # type: ignore[method-assign]
        try:
            tracemalloc.start()
            started = time.perf_counter()
            result = reconcile(older_than_seconds=60)
            seconds = time.perf_counter() - started
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
        finally:
            requests.Session.send = send  # type: ignore[method-assign]
            urllib3.connectionpool.HTTPConnectionPool._new_conn = new_conn  # type: ignore[method-assign]
    polled = result.polled
    ok = sent["requests"] <= checkouts and polled == checkouts and not result.errors
    print(
        f"[6] reconcile {checkouts:,} pending: {sent['requests']:,} requests "
        f"({sent['requests'] / checkouts:.2f} per checkout, target <= 1: {'met' if ok else 'NOT MET'}) "
        f"over {sent['connections']} connection(s), polled {polled:,}, errors {len(result.errors)}, "
        f"peak memory {peak / 2**20:.1f} MiB (tracemalloc), {seconds:.1f} s ({checkouts / seconds:,.0f} "
        "checkouts/s; emulator under gunicorn on SQLite)",
        flush=True,
    )
    results["figures"]["6_reconcile"] = {
        "checkouts": checkouts,
        "requests": sent["requests"],
        "connections": sent["connections"],
        "polled": polled,
        "errors": len(result.errors),
        "statuses": dict(result.statuses),
        "peak_memory_mib": round(peak / 2**20, 1),
        "seconds": round(seconds, 1),
        "met": ok,
    }


# --- 7. a shop's test with the pytest plugin --------------------------------------------------------


def figure_plugin_test(args: argparse.Namespace, folder: Path) -> None:
    """docs/testing.md's first test as pytest runs it, fixture included: ``gateway_emulator``'s setup (an
    emulator from the session's pool, reset, wired to a fresh shop, installed), the test's body (place
    the order, Pay, the shopper pays, the callback, ``assert_fulfilled_once``) and the teardown. The shop
    (the docs' ``shop.py``, a SQLite file as the docs' ``conftest.py`` has it) is built fresh for each
    round, untimed, as the shop's own ``app`` fixture does; the yardstick is one plain request to another
    fresh shop of the same kind (its order page), interleaved with the test round by round."""
    import importlib.util
    import re as regex

    from flask_gateway.testing import EmulatorPool, GatewayEmulator

    blocks = regex.findall(
        r"```python\n# shop\.py\n(.*?)```", (ROOT / "docs" / "testing.md").read_text(), regex.S
    )
    source = folder / "plugin_docs_shop.py"
    source.write_text(blocks[0])
    spec = importlib.util.spec_from_file_location("plugin_docs_shop", source)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {source}")
    shop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shop)

    def fresh_shop(name: str) -> Any:
        app = shop.create_app(
            {
                "TESTING": True,
                "SQLALCHEMY_DATABASE_URI": f"sqlite:///{folder / f'plugin-{name}.sqlite3'}",
                "WTF_CSRF_ENABLED": False,
                "GATEWAY_PUBLIC_URL": "https://shop.example",
            }
        )
        with app.app_context():
            shop.db.create_all()
        return app

    def close_shop(app: Any) -> None:
        with app.app_context():
            shop.db.engine.dispose()

    pool = EmulatorPool(folder)
    times: dict[str, list[float]] = {"plain": [], "setup": [], "body": [], "teardown": [], "test": []}
    for index in range(args.plugin_rounds):
        plain_app, app = fresh_shop(f"plain-{index}"), fresh_shop(f"test-{index}")
        with plain_app.app_context():
            shop.db.session.add(shop.Order(reference="R-1", total_cents=49900))
            shop.db.session.commit()
        started = time.perf_counter()
        answer = plain_app.test_client().get("/orders/R-1")
        times["plain"].append(time.perf_counter() - started)
        if answer.status_code != 200:
            raise SystemExit(f"the shop's order page answered {answer.status}")

        started = time.perf_counter()
        gateway = GatewayEmulator.start(app, database_url=pool.database_url, pool=pool)
        set_up = time.perf_counter()
        with app.app_context():
            shop.db.session.add(shop.Order(reference="R-1", total_cents=49900))
            shop.db.session.commit()
        redirect = app.test_client().post("/orders/R-1/pay")
        gateway.pay(redirect)
        attempts = gateway.deliver()
        gateway.assert_fulfilled_once("R-1")
        with app.app_context():
            shipments = shop.db.session.execute(shop.db.select(shop.Order.shipments)).scalar_one()
        if (redirect.status_code, attempts, shipments) != (303, 1, 1):
            raise SystemExit(
                f"the plugin test did not pass: {redirect.status}, {attempts} callback(s), {shipments}"
            )
        body = time.perf_counter()
        gateway.close()
        ended = time.perf_counter()
        for key, seconds in (
            ("setup", set_up - started),
            ("body", body - set_up),
            ("teardown", ended - body),
            ("test", ended - started),
        ):
            times[key].append(seconds)
        close_shop(plain_app)
        close_shop(app)
    pool.close()
    shop.payment_confirmed.disconnect(shop.fulfil)
    ms = {key: round(statistics.median(values) * 1000, 1) for key, values in times.items()}
    first = round(times["test"][0] * 1000, 1)
    ratio = ms["test"] / ms["plain"]
    report(
        "7",
        "plugin test: create, pay, callback",
        f"{ms['plain']} ms",
        f"{ms['test']} ms",
        ratio,
        "< 50 ms",
        ms["test"] < 50,
    )
    print(
        f"[7] p50 over {args.plugin_rounds} tests: setup {ms['setup']} ms, body {ms['body']} ms, teardown "
        f"{ms['teardown']} ms; the session's first test (the pooled emulator built) {first} ms",
        flush=True,
    )
    results["figures"]["7_plugin_test"] = {
        "rounds": args.plugin_rounds,
        "p50_ms": ms,
        "first_test_ms": first,
        "ratio": round(ratio, 2),
        "target_ms": 50,
        "met": ms["test"] < 50,
    }


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
    parser.add_argument("--only", default="1,2,3,4,5,6,7", help="figures to run, by number (all)")
    parser.add_argument(
        "--duration", type=float, default=12.0, help="timed seconds per load, all rounds (12)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of baseline and load (3)")
    parser.add_argument("--warmup", type=float, default=3.0, help="untimed seconds before each (3)")
    parser.add_argument("--connections", type=int, default=16, help="wrk keep-alive connections (16)")
    parser.add_argument("--wrk-threads", type=int, default=2, help="wrk threads (2)")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn worker processes (4)")
    parser.add_argument("--threads", type=int, default=2, help="gunicorn threads per worker (2)")
    parser.add_argument("--pool", type=int, default=20_000, help="distinct requests per create/callback run")
    parser.add_argument("--rows", type=int, default=100_000, help="existing checkouts for figure 3")
    parser.add_argument("--sign-seconds", type=float, default=2.0)
    parser.add_argument("--client-calls", type=int, default=100)
    parser.add_argument("--client-rounds", type=int, default=31)
    parser.add_argument("--statement-rows", type=int, nargs=2, default=[1_000, 100_000])
    parser.add_argument("--reconcile-rows", type=int, default=10_000)
    parser.add_argument("--plugin-rounds", type=int, default=30, help="tests timed for figure 7 (30)")
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
                if "4" in wanted:
                    emulator_url = cluster.create_database("bench_emulator")
                    figure_emulator(args, folder, "postgresql", emulator_url)
                    figure_emulator(args, folder, "sqlite", f"sqlite:///{folder / 'emulator.sqlite3'}")
        if "5" in wanted:
            figure_statements(args, folder)
        if "6" in wanted:
            figure_reconcile(args, folder)
        if "7" in wanted:
            figure_plugin_test(args, folder)
        log = folder / "servers.log"
        if log.exists() and log.read_text().strip():
            print(
                f"server log (warnings and errors):\n{log.read_text(errors='replace')[-3000:]}",
                file=sys.stderr,
            )
    results["finished_at"] = datetime.now(UTC).isoformat(timespec="seconds")
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(f"results written to {args.output}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
