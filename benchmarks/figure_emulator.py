"""Figure 4: the emulator's create and getstatus under gunicorn, each against its yardstick
(``emulator_yardsticks.py``: the least work its contract needs, on the same stack, database and table),
with the bare JSON endpoint of the first round printed for reference.

``bench.py --only 4`` runs it on PostgreSQL and on SQLite. On SQLite alone, with no PostgreSQL cluster::

    .venv/bin/python benchmarks/figure_emulator.py

The load options are ``bench.py``'s, with its defaults (``harness.add_load_options``)."""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from emulator_throughput import Request, ServerOptions, call, create_body, serve
from harness import (
    ACCOUNT,
    API_KEY,
    Load,
    add_load_options,
    alternate,
    line,
    results,
    round_ratios,
    signed_line,
    throughput_line,
)

from flask_gateway.core.wire import dumps


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
        serve("emulator_yardsticks:yardstick_app()", options, env, log) as yardstick_port,
        serve("flask_gateway.emulator:create_app()", options, env, log) as port,
    ):
        # gunicorn listens before its workers have booted (12 of them here, on a busy machine): wait for them.
        _ready(bare_port, ("POST", "/bare", b"{}", {"Content-Type": "application/json"}))
        _ready(port, ("GET", "/_emulator/clock", b"", {}))  # its tables exist from then on
        _ready(yardstick_port, ("POST", "/yardstick/getstatus", b"{}", {}), expect=401)
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
            return [signed_line("/v2/create", create_body(str(uuid.uuid4())), key) for _ in range(count)]

        tokens = []
        for item in creates(200):
            path, *headers, body = item.split("\t")
            status, answer = call(port, ("POST", path, body.encode(), dict(h.split("=", 1) for h in headers)))
            if status != 200:
                raise SystemExit(f"create failed: {status} {answer[:300]!r}")
            tokens.append(json.loads(answer)["checkoutToken"])
        statuses = [signed_line("/v2/getstatus", {"checkoutToken": token}, key) for token in tokens]
        bare_line = line("/bare", {"Content-Type": "application/json"}, b"{}")

        def yardstick(lines: list[str]) -> list[str]:
            return [item.replace("/v2/", "/yardstick/", 1) for item in lines]

        figures = alternate(
            [
                Load("bare", bare_port, lambda count: [bare_line] * 100, unique=False),
                Load("yardstick-create", yardstick_port, lambda count: yardstick(creates(count))),
                Load("create", port, creates),
                Load("yardstick-getstatus", yardstick_port, lambda count: yardstick(statuses), unique=False),
                Load("getstatus", port, lambda count: statuses, unique=False),
            ],
            folder,
            args,
        )
    bare = figures["bare"]
    print(
        f"[4] bare Flask JSON endpoint ({backend} rounds): {bare['ok_per_s']:,.0f} req/s "
        f"(p50 {bare['p50_ms']} ms, p99 {bare['p99_ms']} ms)",
        flush=True,
    )
    out: dict[str, Any] = {"bare": bare}
    for operation in ("create", "getstatus"):
        base, ours = figures[f"yardstick-{operation}"], figures[operation]
        print(
            f"[4] yardstick {operation}, {backend}: {base['ok_per_s']:,.0f} req/s "
            f"(p50 {base['p50_ms']} ms, p99 {base['p99_ms']} ms)",
            flush=True,
        )
        out[f"yardstick_{operation}"] = base
        out[operation] = throughput_line("4", f"emulator {operation} vs yardstick, {backend}", base, ours)
        out[f"{operation}_vs_bare"] = _reference(f"emulator {operation} vs bare JSON, {backend}", bare, ours)
    if backend == "sqlite":  # for reference: the tail target (issue 30) was retired with the queue (issue 38)
        create = figures["create"]
        spread = create["p99_ms"] / create["p50_ms"] if create["p50_ms"] else float("inf")
        print(
            f"[4] emulator create p99/p50, {backend}: p50 {create['p50_ms']} ms, p99 {create['p99_ms']} ms, "
            f"{spread:.1f}x (reference, no target)",
            flush=True,
        )
        out["create_p99_over_p50"] = {"ratio": round(spread, 2)}
    results["figures"][f"4_emulator_{backend}"] = out


def _ready(port: int, request: Request, *, expect: int = 200, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            status, _ = call(port, request)
            if status == expect:
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"the server on port {port} did not answer {request[1]} within {timeout:g} s")
        time.sleep(0.5)


def _reference(name: str, bare: dict[str, Any], ours: dict[str, Any]) -> dict[str, Any]:
    """Against the bare JSON endpoint (the first round's yardstick): printed for reference, no target."""
    ratios = round_ratios(bare, ours)
    ratio = statistics.median(ratios) if ratios else 0.0
    print(
        f"[4] {name:<38} baseline {bare['ok_per_s']:>12,.0f} req/s  measured {ours['ok_per_s']:>12,.0f} req/s"
        f"  ratio {ratio:6.3f}x (reference, no target)",
        flush=True,
    )
    return {"ratio": round(ratio, 3), "round_ratios": [round(r, 3) for r in ratios]}


def main(argv: list[str] | None = None) -> int:
    """Figure 4 on SQLite only (see the module's docstring)."""
    parser = argparse.ArgumentParser(description="figure 4 on SQLite")
    add_load_options(parser)
    parser.add_argument("--pool", type=int, default=20_000, help="distinct requests per create run")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        folder = Path(scratch)
        figure_emulator(args, folder, "sqlite", f"sqlite:///{folder / 'emulator.sqlite3'}")
    print(json.dumps(_summary(results["figures"]), indent=2))
    return 0


def _summary(figures: dict[str, Any]) -> dict[str, Any]:
    """Create's and getstatus's throughput, p50, p99 and ratios (no per-round runs)."""
    fields = ("ok_per_s", "p50_ms", "p99_ms", "ratio", "met")
    summary: dict[str, Any] = {}
    for name, figure in figures.items():
        summary[name] = {}
        for key, value in figure.items():
            if isinstance(value, dict):
                measured = value.get("measured", value)
                summary[name][key] = {
                    field: {**measured, **value}[field] for field in fields if field in {**measured, **value}
                }
    return summary


if __name__ == "__main__":
    sys.exit(main())
