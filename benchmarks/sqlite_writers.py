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

``--handoff`` measures figure 8 of ``make bench`` instead: how soon a writer of another process gets the
file after a commit. This process holds a write transaction; a forked child begins its write, and 250 ms
later (SQLite's busy handler would then be sleeping in steps of 100 ms) this process commits; the time
from the commit to the end of the child's write, per round. With the lock file (``lock``) the child waits
in ``flock`` and is woken at the commit (target: median under 30 ms); queued in each process only
(``process``) it sleeps in SQLite's busy handler, and the slowest of the rounds shows it (target: over
30 ms, the contrast that shows the figure sees the lock file)::

    .venv/bin/python benchmarks/sqlite_writers.py --handoff --handoff-rounds 9
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

from harness import report, results, summary  # noqa: E402
from sqlalchemy import Column, Integer, MetaData, String, Table, create_engine, func, insert, select  # noqa: E402
from sqlalchemy.engine import Engine  # noqa: E402

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


# --- figure 8: another process's writer handed the file at a commit ---------------------------------

#: Seconds this process holds its write transaction once the child has begun its write.
HOLD = 0.25
#: Rounds per setting of figure 8 (``--handoff-rounds``).
HANDOFF_ROUNDS = 9
#: The last resort of a wait for the child (it answers within milliseconds on a quiet machine).
CHILD_DEADLINE = 120.0


def _handoff_child(url: str, mode: str, commands: Any, answers: Any) -> None:
    """The other process: a write for each command, its start and end (``time.monotonic``: the same clock
    in every process of the machine) put on ``answers``."""
    os.environ[VARIABLE] = mode
    engine = create_engine(url)
    configure_sqlite(engine)
    for _command in iter(commands.get, None):
        answers.put(time.monotonic())
        with engine.begin() as connection:
            connection.execute(insert(rows).values(value="child"))
        answers.put(time.monotonic())
    engine.dispose()


def _configured(url: str, mode: str) -> Engine:
    previous = os.environ.get(VARIABLE)
    os.environ[VARIABLE] = mode
    try:
        engine = create_engine(url)
        configure_sqlite(engine)
    finally:
        if previous is None:
            del os.environ[VARIABLE]
        else:
            os.environ[VARIABLE] = previous
    return engine


def handoffs(folder: Path, mode: str, rounds: int) -> list[float]:
    """Milliseconds from this process's commit (the call) to the end of the child's write that waited for
    it, per round, with ``FLASK_GATEWAY_SQLITE_QUEUE=mode`` in both processes."""
    url = f"sqlite:///{folder / f'handoff-{mode}.sqlite3'}"
    setup = _configured(url, mode)
    metadata.create_all(setup)
    setup.dispose()  # no SQLite connection open across the fork
    context = multiprocessing.get_context("fork")
    commands: multiprocessing.queues.Queue[str | None] = context.Queue()
    answers: multiprocessing.queues.Queue[float] = context.Queue()
    child = context.Process(target=_handoff_child, args=(url, mode, commands, answers))
    child.start()
    engine = _configured(url, mode)
    delays = []
    try:
        for _ in range(rounds):
            with engine.connect() as holder:
                holder.execute(insert(rows).values(value="parent"))  # holds the file
                commands.put("write")
                answers.get(timeout=CHILD_DEADLINE)  # the child begins its write
                time.sleep(HOLD)
                # Read before the commit: the lock file is given back inside it, and the child may have
                # written before this process runs again (the commit's own time, a fraction of a
                # millisecond, is in the figure).
                committing = time.monotonic()
                holder.commit()
            done = answers.get(timeout=CHILD_DEADLINE)
            delays.append((done - committing) * 1000)
    finally:
        commands.put(None)
        child.join(CHILD_DEADLINE)
        engine.dispose()
    return delays


def figure_handoff(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """Figure 8: the handoff with the lock file (median, target < 30 ms) and in SQLite's busy handler
    (the slowest round, target > 30 ms: the figure tells the two apart)."""
    rounds = getattr(args, "handoff_rounds", HANDOFF_ROUNDS)
    lock = handoffs(folder, "lock", rounds)
    busy = handoffs(folder, "process", rounds)
    lock_p50, busy_p50 = statistics.median(lock), statistics.median(busy)
    lock_met, contrast_met = lock_p50 < 30, max(busy) > 30
    report(
        "8",
        "other process's writer after a commit, lock file, median",
        f"{busy_p50:.1f} ms",
        f"{lock_p50:.1f} ms",
        lock_p50 / busy_p50 if busy_p50 else 0.0,
        "< 30 ms",
        lock_met,
    )
    report(
        "8",
        "the same in SQLite's busy handler, slowest",
        f"{max(lock):.1f} ms",
        f"{max(busy):.1f} ms",
        max(busy) / max(lock) if max(lock) else 0.0,
        "> 30 ms",
        contrast_met,
    )
    figure = {
        "rounds": rounds,
        "hold_ms": HOLD * 1000,
        "lock_ms": [round(value, 2) for value in lock],
        "busy_handler_ms": [round(value, 2) for value in busy],
        "lock_median_ms": round(lock_p50, 2),
        "busy_handler_median_ms": round(busy_p50, 2),
        "busy_handler_max_ms": round(max(busy), 2),
        "targets": {"lock_median": "< 30 ms", "busy_handler_max": "> 30 ms"},
        "met": lock_met and contrast_met,
    }
    results["figures"]["8_sqlite_handoff"] = figure
    return figure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--modes", default="off,process,poll,lock", help="settings compared, in order")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, each in the opposite order (4)")
    parser.add_argument("--processes", type=int, default=4, help="writing processes (4, gunicorn's workers)")
    parser.add_argument("--threads", type=int, default=2, help="threads per process (2)")
    parser.add_argument("--seconds", type=float, default=3.0, help="seconds per setting and round (3)")
    parser.add_argument("--inside-ms", type=float, default=1.0, help="CPU work inside each transaction (1)")
    parser.add_argument("--outside-ms", type=float, default=3.0, help="CPU work between transactions (3)")
    parser.add_argument(
        "--handoff",
        action="store_true",
        help="figure 8 instead: how soon another process's writer gets the file after a commit",
    )
    parser.add_argument(
        "--handoff-rounds",
        type=int,
        default=HANDOFF_ROUNDS,
        help=f"rounds per setting of figure 8 ({HANDOFF_ROUNDS})",
    )
    args = parser.parse_args(argv)
    if args.handoff:
        print(f"load average at the start: {os.getloadavg()}", flush=True)
        with tempfile.TemporaryDirectory(prefix="bench-handoff-") as scratch:
            figure = figure_handoff(args, Path(scratch))
        print(f"load average at the end: {os.getloadavg()}", flush=True)
        print(f"lock file (ms): {figure['lock_ms']}\nbusy handler (ms): {figure['busy_handler_ms']}")
        print(f"\n{summary()}", flush=True)
        return 0
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
