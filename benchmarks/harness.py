"""What every figure of ``benchmarks/bench.py`` shares: the result lines, wrk, alternating rounds of a
baseline and its measurement, a throwaway PostgreSQL cluster."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
for entry in (str(ROOT), str(ROOT / "benchmarks")):
    if entry not in sys.path:  # run as a script from anywhere: the project's code, the tests' helpers
        sys.path.insert(0, entry)

from flask_gateway.core.signing import sign  # noqa: E402
from flask_gateway.core.wire import dumps  # noqa: E402

LUA = ROOT / "benchmarks" / "wrk" / "requests.lua"
ACCOUNT = "bench-merchant"
API_KEY = "bench-api-key"

#: Everything the run measured, written to the results file at the end.
results: dict[str, Any] = {"figures": {}}


#: Every figure reported in this run, in order: printed again together by ``summary()`` at the end.
reported: list[dict[str, Any]] = []


def record(key: str, name: str, value: str, target: str, met: bool) -> None:
    """Keep one figure's verdict for the summary (``report`` does it for the ratios it prints)."""
    reported.append({"figure": key, "name": name, "value": value, "target": target, "met": met})


def report(key: str, name: str, baseline: str, measured: str, ratio: float, target: str, met: bool) -> None:
    verdict = "met" if met else "NOT MET"
    # A target in milliseconds is met by the time measured, not by the ratio printed beside it.
    record(key, name, measured.strip() if target.endswith(" ms") else f"{ratio:.3f}x", target, met)
    print(
        f"[{key}] {name:<38} baseline {baseline:>18}  measured {measured:>18}  ratio {ratio:6.3f}x "
        f"(target {target}: {verdict})",
        flush=True,
    )


def summary() -> str:
    """Every figure of the run against its target, one line each, and how many were met."""
    if not reported:
        return "no figure was reported"
    lines = [f"{'fig':<4} {'figure':<64} {'value':>12}  {'target':<12} verdict"]
    for row in reported:
        lines.append(
            f"{row['figure']:<4} {row['name'][:64]:<64} {row['value']:>12}  {row['target']:<12} "
            f"{'met' if row['met'] else 'NOT MET'}"
        )
    met = sum(1 for row in reported if row["met"])
    lines.append(f"{met} of {len(reported)} targets met")
    return "\n".join(lines)


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


def add_load_options(parser: argparse.ArgumentParser) -> None:
    """The options of the loads wrk sends and the gunicorn servers they hit (``bench.py`` and each figure
    module run alone: one set of defaults)."""
    parser.add_argument(
        "--duration", type=float, default=12.0, help="timed seconds per load, all rounds (12)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds of baseline and load (3)")
    parser.add_argument("--warmup", type=float, default=3.0, help="untimed seconds before each (3)")
    parser.add_argument("--connections", type=int, default=16, help="wrk keep-alive connections (16)")
    parser.add_argument("--wrk-threads", type=int, default=2, help="wrk threads (2)")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn worker processes (4)")
    parser.add_argument("--threads", type=int, default=2, help="gunicorn threads per worker (2)")


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


def throughput_line(
    key: str, name: str, base: dict[str, Any], ours: dict[str, Any], target: float | None = 0.5
) -> dict[str, Any]:
    """The ratio is the median of the rounds' ratios (each round: baseline, then measurement). With
    ``target=None`` the line is for reference: printed, not counted in the summary."""
    ratios = round_ratios(base, ours)
    ratio = statistics.median(ratios) if ratios else 0.0
    label = f"{name} (p50 {ours['p50_ms']} ms, p99 {ours['p99_ms']} ms)"
    baseline, measured = f"{base['ok_per_s']:,.0f} req/s", f"{ours['ok_per_s']:,.0f} req/s"
    met = target is None or ratio >= target
    if target is None:
        print(
            f"[{key}] {label:<38} baseline {baseline:>18}  measured {measured:>18}  ratio {ratio:6.3f}x "
            "(reference, no target)",
            flush=True,
        )
    else:
        report(key, label, baseline, measured, ratio, f">= {target:g}", met)
    if ours["errors"] or base["errors"]:
        print(f"    errors: baseline {base['errors']}, measured {ours['errors']}", flush=True)
    return {
        "baseline": base,
        "measured": ours,
        "ratio": round(ratio, 3),
        "round_ratios": [round(r, 3) for r in ratios],
        "target": None if target is None else f">= {target:g}",
        "met": met,
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


def signed_line(path: str, body: dict[str, Any], key: str) -> str:
    raw = dumps(body)
    headers = {
        "Content-Type": "application/json",
        "X-Merchant-Account-ID": ACCOUNT,
        "X-Signature": sign(raw, key),
    }
    return line(path, headers, raw)
