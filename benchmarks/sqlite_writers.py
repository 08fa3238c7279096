"""The SQLite write queue's settings compared without HTTP (issue 30): several processes of several threads
write to one SQLite file through engines ``configure_sqlite`` set up, as gunicorn's workers do, and each
write transaction's time (waiting for the file, then its work) is recorded.

Each thread repeats: a write transaction (``BEGIN IMMEDIATE`` in its turn, a read, an insert, ``--inside-ms``
of CPU work, commit), then ``--outside-ms`` of CPU work outside it (the rest of a request). The settings of
``FLASK_GATEWAY_SQLITE_QUEUE`` run one after the other in rounds, in the opposite order each round, each
on a database file of its own; printed per setting: transactions per second, p50, p99, p99 / p50, max::

    .venv/bin/python benchmarks/sqlite_writers.py --modes off,process,poll,lock --rounds 4

No wrk, no gunicorn, no network: what is left is the wait for the file, the GIL and the CPU the machine
gives. On a shared machine compare the settings within a round, and read several rounds.
"""

from __future__ import annotations

import argparse
import multiprocessing
import multiprocessing.queues
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, insert, select  # noqa: E402

from flask_gateway.core.sql import configure_sqlite  # noqa: E402

VARIABLE = "FLASK_GATEWAY_SQLITE_QUEUE"
metadata = MetaData()
rows = Table("rows", metadata, Column("id", Integer, primary_key=True), Column("value", String(40)))


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _process(
    url: str, mode: str, threads: int, start: float, stop: float, inside: float, outside: float, out: Any
) -> None:
    os.environ[VARIABLE] = mode
    engine = create_engine(url)
    configure_sqlite(engine)
    times: list[float] = []
    lock = threading.Lock()

    def work(number: int) -> None:
        mine = []
        time.sleep(max(0.0, start - time.monotonic()))
        step = 0
        while time.monotonic() < stop:
            began = time.perf_counter()
            with engine.begin() as connection:
                connection.execute(select(func.max(rows.c.id))).scalar()
                connection.execute(insert(rows).values(value=f"{os.getpid()}-{number}-{step}"))
                _spin(inside)
            mine.append(time.perf_counter() - began)
            _spin(outside)
            step += 1
        with lock:
            times.extend(mine)

    workers = [threading.Thread(target=work, args=(number,)) for number in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    engine.dispose()
    out.put(times)


def measure(args: argparse.Namespace, folder: Path, mode: str, run: int) -> dict[str, float]:
    url = f"sqlite:///{folder / f'writers-{mode}-{run}.sqlite3'}"
    engine = create_engine(url)
    configure_sqlite(engine)
    metadata.create_all(engine)
    engine.dispose()
    context = multiprocessing.get_context("fork")
    out: multiprocessing.queues.Queue[list[float]] = context.Queue()
    start = time.monotonic() + 1.0  # every process started and connected by then
    stop = start + args.seconds
    processes = [
        context.Process(
            target=_process,
            args=(url, mode, args.threads, start, stop, args.inside_ms / 1000, args.outside_ms / 1000, out),
        )
        for _ in range(args.processes)
    ]
    for process in processes:
        process.start()
    times = [value for _ in processes for value in out.get(timeout=args.seconds + 120)]
    for process in processes:
        process.join()
    times.sort()
    p50 = statistics.median(times) * 1000
    p99 = times[int(len(times) * 0.99)] * 1000
    return {
        "per_s": len(times) / args.seconds,
        "p50_ms": p50,
        "p99_ms": p99,
        "spread": p99 / p50,
        "max_ms": times[-1] * 1000,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--modes", default="off,process,poll,lock", help="settings compared, in order")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, each in the opposite order (4)")
    parser.add_argument("--processes", type=int, default=4, help="writing processes (4, gunicorn's workers)")
    parser.add_argument("--threads", type=int, default=2, help="threads per process (2)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per setting and round (3)")
    parser.add_argument("--inside-ms", type=float, default=1.0, help="CPU work inside each transaction (1)")
    parser.add_argument("--outside-ms", type=float, default=3.0, help="CPU work between transactions (3)")
    args = parser.parse_args(argv)
    modes = [mode.strip() for mode in args.modes.split(",")]
    results: dict[str, list[dict[str, float]]] = {mode: [] for mode in modes}
    print(f"load average at the start: {os.getloadavg()}", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-writers-") as scratch:
        for run in range(args.rounds):
            for mode in modes if run % 2 == 0 else reversed(modes):
                figure = measure(args, Path(scratch), mode, run)
                results[mode].append(figure)
                print(
                    f"round {run + 1} {mode:<8} {figure['per_s']:7.0f} tx/s  p50 {figure['p50_ms']:6.1f} ms  "
                    f"p99 {figure['p99_ms']:7.1f} ms  p99/p50 {figure['spread']:5.1f}x  "
                    f"max {figure['max_ms']:7.1f} ms",
                    flush=True,
                )
    print(f"load average at the end: {os.getloadavg()}", flush=True)
    print("medians of the rounds:")
    for mode, figures in results.items():
        print(
            f"  {mode:<8} {statistics.median(f['per_s'] for f in figures):7.0f} tx/s  "
            f"p50 {statistics.median(f['p50_ms'] for f in figures):6.1f} ms  "
            f"p99 {statistics.median(f['p99_ms'] for f in figures):7.1f} ms  "
            f"p99/p50 {statistics.median(f['spread'] for f in figures):5.1f}x"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
