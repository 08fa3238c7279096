"""Figure 6: ``reconcile()`` of due pending checkouts against the emulator over real HTTP, against a yardstick
that does reconcile's work with nothing more (issue 30), in the same run, against the same emulator.

The yardstick (:func:`yardstick_run`): a pool of as many threads as reconcile's
(``GATEWAY_RECONCILE_CONCURRENCY``), each sending signed getstatus calls over a keep-alive ``requests``
session of its own, fed with the due checkouts' ids and tokens read page by page (keyset, by id); the run's
thread applies the answers that came in with one indexed ``UPDATE`` per checkout (by primary key: the
status answered and ``last_polled_at``), up to :data:`YARDSTICK_BATCH` in one transaction. No claims, no
leases, no row locks, no events, no outbox, no signals, no ORM entity, no validation beyond the token.

The order of one run: wrk getstatus alone (for reference: the emulator's rate with both cores), the
yardstick, reconcile of every due checkout (timed, the figure), the yardstick again (the ratio is against
the mean of the two yardstick runs, so a change of the machine's load during the run shows as their
spread), wrk getstatus alone again, then two runs of ``reconcile()`` at once on the same checkouts made due
again (the work split, no checkout polled twice; peak memory with ``tracemalloc`` there, as it slows the
process too much to run during the timed run), then ``concurrency=1`` on a part of them (what a run was
before the pool).

Alone: ``.venv/bin/python benchmarks/figure_reconcile.py`` (``--help``): ``--reconcile-rows N`` (10,000),
``--ratio-only`` (the yardstick, reconcile, the yardstick again: the ratio in a minute or two, no bound
checked), ``--profile FOLDER`` (cProfile of the timed run's thread and of its polling threads).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import queue
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests
from emulator_throughput import ServerOptions, serve
from harness import line, record, results, run_wrk
from sqlalchemy import Engine, bindparam, select, text

from flask_gateway.core.signing import sign
from flask_gateway.core.wire import dumps

#: The sequential comparison (``concurrency=1``) polls at most this many checkouts.
SEQUENTIAL_ROWS = 500
#: Seconds of each wrk run of getstatus alone (after a warm-up of ``--warmup`` seconds).
WRK_SECONDS = 5
#: The yardstick's answers applied in one transaction at most (reconcile's ``WRITE_BATCH``).
YARDSTICK_BATCH = 100
#: Reconcile's rate against the yardstick's: the target (issue 30).
TARGET = 0.7


@dataclass
class YardstickRun:
    """What one run of the yardstick did."""

    polled: int = 0
    errors: int = 0
    seconds: float = 0.0
    cpu_seconds: float = 0.0
    emulator_cpu_seconds: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)

    @property
    def rate(self) -> float:
        return self.polled / self.seconds if self.seconds else 0.0


def yardstick_run(
    engine: Engine, base_url: str, account: str, key: str, *, workers: int, cutoff: datetime
) -> YardstickRun:
    """Reconcile's work and nothing more: getstatus for every due checkout of ``account`` (open, unchanged
    since ``cutoff``) from ``workers`` threads, each answer applied with one indexed ``UPDATE`` per
    checkout, many per transaction (see the module docstring)."""
    from flask_gateway.models import GatewayCheckout
    from flask_gateway.operations.reconciliation import POLLED_STATUSES

    table = GatewayCheckout.__table__
    page = (
        select(table.c.id, table.c.token)
        .where(
            table.c.api_version == "v2",
            table.c.token.is_not(None),
            table.c.status.in_(POLLED_STATUSES),
            table.c.merchant_account_id == account,
            table.c.updated_at <= cutoff,
            table.c.id > bindparam("after"),
        )
        .order_by(table.c.id)
        .limit(bindparam("size"))
    )
    applied = text("UPDATE gateway_checkouts SET status = :status, last_polled_at = :now WHERE id = :id")
    url = f"{base_url.rstrip('/')}/v2/getstatus"
    capacity = 4 * workers + 10  # reconcile's bound on the checkouts held at once
    tasks: queue.Queue[tuple[int, str] | None] = queue.Queue(maxsize=capacity)
    answers: queue.SimpleQueue[tuple[int, str | None]] = queue.SimpleQueue()

    def work() -> None:
        session = requests.Session()
        while (task := tasks.get()) is not None:
            checkout_id, token = task
            raw = dumps({"checkoutToken": token})
            headers = {
                "Content-Type": "application/json",
                "X-Merchant-Account-ID": account,
                "X-Signature": sign(raw, key),
            }
            status: str | None = None
            try:
                reply = session.post(url, data=raw, headers=headers, timeout=30)
                if reply.status_code == 200:
                    answer = reply.json()
                    if answer.get("checkoutToken") == token:
                        status = str(answer["checkoutPaymentStatus"])
            except (requests.RequestException, ValueError, KeyError):
                status = None
            answers.put((checkout_id, status))
        session.close()

    run = YardstickRun()
    threads = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
    cpu = time.process_time()
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    after, held, exhausted = 0, 0, False
    try:
        while True:
            while not exhausted and capacity - held >= 10:
                with engine.begin() as conn:
                    rows = conn.execute(page, {"after": after, "size": capacity - held}).all()
                if not rows:
                    exhausted = True
                    break
                for checkout_id, token in rows:
                    tasks.put_nowait((checkout_id, token))
                held += len(rows)
                after = rows[-1][0]
            if held == 0:
                break
            batch = [answers.get()]
            while len(batch) < YARDSTICK_BATCH:
                try:
                    batch.append(answers.get_nowait())
                except queue.Empty:
                    break
            held -= len(batch)
            now = datetime.now(UTC)
            done = [{"id": i, "status": status, "now": now} for i, status in batch if status is not None]
            run.errors += len(batch) - len(done)
            if done:
                with engine.begin() as conn:
                    conn.execute(applied, done)
            run.polled += len(batch)
            run.statuses.update(str(item["status"]) for item in done)
    finally:
        for _ in threads:
            tasks.put(None)
        for thread in threads:
            thread.join()
    run.seconds = time.perf_counter() - started
    run.cpu_seconds = time.process_time() - cpu
    return run


def figure_reconcile(args: argparse.Namespace, folder: Path) -> None:
    """``reconcile()`` of due pending checkouts against the emulator served over real HTTP (gunicorn on the
    same SQLite database), with the extension's own HTTP sessions (keep-alive, as in production)."""
    import dataclasses

    import urllib3.connectionpool
    from sqlalchemy import update

    from flask_gateway.models import GatewayCheckout
    from flask_gateway.operations.reconciliation import ReconcileReport, reconcile
    from flask_gateway.state import get_state
    from tests.extension.conftest import ACCOUNT as SHOP_ACCOUNT
    from tests.extension.conftest import API_KEY as SHOP_API_KEY
    from tests.extension.conftest import EMULATOR_URL
    from tests.extension.payments.test_statement_counts import build_harness, seed

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
    lock = threading.Lock()
    sent: Counter[str] = Counter()
    # Polls per checkout of the two-runs check, by seed number: allocated before tracemalloc starts, so the
    # check itself adds nothing to the peak measured.
    polls = bytearray(checkouts)
    record_tokens = False
    send, new_conn = requests.Session.send, urllib3.connectionpool.HTTPConnectionPool._new_conn

    def counted_send(self: requests.Session, request: Any, **k: Any) -> Any:
        with lock:
            sent["requests"] += 1
        if record_tokens and request.body:
            number = int(json.loads(request.body)["checkoutToken"].rsplit("-", 1)[1])
            with lock:
                polls[number] = min(polls[number] + 1, 255)
        return send(self, request, **k)

    def counted_conn(self: Any) -> Any:
        with lock:
            sent["connections"] += 1
        return new_conn(self)

    def made_due(session: Any) -> None:
        """Every checkout due again: last changed an hour ago, never polled."""
        session.execute(
            update(GatewayCheckout).values(
                updated_at=datetime.now(UTC) - timedelta(hours=1), last_polled_at=None
            )
        )
        session.commit()

    with (
        serve("flask_gateway.emulator:create_app()", options, env, folder / "servers.log") as port,
        h.shop.app_context(),
    ):
        state = get_state()
        state.client_options.clear()  # the extension's own sessions, over the network
        url = f"http://127.0.0.1:{port}"
        state.config = dataclasses.replace(state.config, base_url=url, install_url=f"{url}/install")
        concurrency = getattr(args, "reconcile_concurrency", None) or state.config.reconcile_concurrency
        session = state.session
        installation = state.require_installation()
        key = state.box.decrypt(installation.signing_key_encrypted)
        tokens = [t for t in session.scalars(select(GatewayCheckout.token)) if t]
        made_due(session)

        # The baseline: the emulator's getstatus alone, signed for the shop's own checkouts, over as many
        # keep-alive connections as reconcile's pool has threads.
        def getstatus_line(token: str) -> str:
            raw = dumps({"checkoutToken": token})
            headers = {
                "Content-Type": "application/json",
                "X-Merchant-Account-ID": SHOP_ACCOUNT,
                "X-Signature": sign(raw, key),
            }
            return line("/v2/getstatus", headers, raw)

        lines = [getstatus_line(token) for token in tokens]
        wrk_args = argparse.Namespace(
            **{**vars(args), "connections": concurrency, "wrk_threads": min(args.wrk_threads, concurrency)}
        )
        for _ in range(10):  # until every gunicorn worker has started and answers (slow on a busy machine)
            warm = run_wrk(port, lines, folder, wrk_args, duration=max(1, args.warmup))
            if warm["ok_per_s"] > 0 and not warm["errors"]:
                break
        else:
            raise SystemExit(f"the emulator does not answer getstatus: {warm}")
        ratio_only = getattr(args, "ratio_only", False)
        alone = [] if ratio_only else [run_wrk(port, lines, folder, wrk_args, duration=WRK_SECONDS)]

        requests.Session.send = counted_send  # type: ignore[method-assign]
        urllib3.connectionpool.HTTPConnectionPool._new_conn = counted_conn  # type: ignore[method-assign]
        try:
            yardsticks: list[YardstickRun] = []

            def yardstick() -> None:
                made_due(session)
                emulator_before = _server_cpu(port)
                sent.clear()
                run = yardstick_run(
                    state.engine,
                    url,
                    SHOP_ACCOUNT,
                    key,
                    workers=concurrency,
                    cutoff=datetime.now(UTC) - timedelta(seconds=60),
                )
                run.emulator_cpu_seconds = _server_cpu(port) - emulator_before
                if run.polled != checkouts or run.errors or sent.get("requests", 0) != checkouts:
                    raise SystemExit(
                        f"the yardstick did not poll every checkout once: polled {run.polled:,} of "
                        f"{checkouts:,}, {run.errors} errors, {sent.get('requests', 0):,} requests"
                    )
                yardsticks.append(run)
                sent.clear()

            yardstick()
            made_due(session)
            emulator_cpu, shop_cpu = _server_cpu(port), time.process_time()
            started = time.perf_counter()
            with _profiled(getattr(args, "profile", None)):
                result = reconcile(older_than_seconds=60, concurrency=concurrency, account=SHOP_ACCOUNT)
            seconds = time.perf_counter() - started
            emulator_cpu, shop_cpu = _server_cpu(port) - emulator_cpu, time.process_time() - shop_cpu
            timed = dict(sent)
            sent.clear()
            yardstick()
            if ratio_only:
                _print_ratio(
                    checkouts, concurrency, yardsticks, result, seconds, timed, shop_cpu, emulator_cpu
                )
                return
            alone.append(run_wrk(port, lines, folder, wrk_args, duration=WRK_SECONDS))

            # Two runs at once, on the same checkouts made due again: the work split, none polled twice.
            made_due(session)
            record_tokens = True
            reports: list[ReconcileReport] = []

            def one_run() -> None:
                with h.shop.app_context():
                    reports.append(
                        reconcile(older_than_seconds=60, concurrency=concurrency, account=SHOP_ACCOUNT)
                    )

            tracemalloc.start()
            split_started = time.perf_counter()
            runs = [threading.Thread(target=one_run) for _ in range(2)]
            for run in runs:
                run.start()
            for run in runs:
                run.join()
            split_seconds = time.perf_counter() - split_started
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            split = dict(sent)
            record_tokens = False
            sent.clear()

            # What a run was before the pool: one checkout at a time (on a part of them).
            made_due(session)
            sequential_rows = min(SEQUENTIAL_ROWS, checkouts)
            sequential_started = time.perf_counter()
            sequential = reconcile(
                older_than_seconds=60, concurrency=1, limit=sequential_rows, account=SHOP_ACCOUNT
            )
            sequential_seconds = time.perf_counter() - sequential_started
        finally:
            requests.Session.send = send  # type: ignore[method-assign]
            urllib3.connectionpool.HTTPConnectionPool._new_conn = new_conn  # type: ignore[method-assign]

    polled = result.polled
    rate = polled / seconds
    alone_rates = [run["ok_per_s"] for run in alone]
    alone_mean = sum(alone_rates) / len(alone_rates)
    alone_ratio = rate / alone_mean if alone_mean else 0.0
    yardstick_rates = [run.rate for run in yardsticks]
    baseline = sum(yardstick_rates) / len(yardstick_rates)
    ratio = rate / baseline if baseline else 0.0
    per_checkout = timed.get("requests", 0) / checkouts
    counts_ok = timed.get("requests", 0) <= checkouts and polled == checkouts and not result.errors
    split_polls = [r.polled for r in reports]
    polled_once = polls.count(1)
    most_polls = max(polls, default=0)
    split_ok = (
        sum(split_polls) == checkouts
        and all(split_polls)
        and polled_once == checkouts
        and not any(r.errors for r in reports)
    )
    sequential_rate = sequential.polled / sequential_seconds
    met = counts_ok and split_ok and ratio >= TARGET
    yardstick_cpu = sum(run.cpu_seconds for run in yardsticks) / len(yardsticks)
    yardstick_emulator_cpu = sum(run.emulator_cpu_seconds for run in yardsticks) / len(yardsticks)
    print(
        f"[6] reference, the emulator's getstatus alone (wrk -c{concurrency}, {WRK_SECONDS} s before and "
        f"after): {' / '.join(f'{r:,.0f}' for r in alone_rates)} req/s; reconcile is {alone_ratio:.3f}x that",
        flush=True,
    )
    print(
        f"[6] yardstick, {concurrency} threads: getstatus, one indexed UPDATE per checkout, "
        f"{YARDSTICK_BATCH} per transaction (before / after reconcile): "
        f"{' / '.join(f'{r:,.0f}' for r in yardstick_rates)} checkouts/s; CPU per checkout: its process "
        f"{yardstick_cpu / checkouts * 1000:.2f} ms, the emulator's "
        f"{yardstick_emulator_cpu / checkouts * 1000:.2f} ms",
        flush=True,
    )
    print(
        f"[6] reconcile {checkouts:,} pending, concurrency {concurrency}: {rate:,.0f} checkouts/s "
        f"({seconds:.1f} s), {ratio:.3f}x the yardstick (target >= {TARGET}x: "
        f"{'met' if ratio >= TARGET else 'NOT MET'}); {timed.get('requests', 0):,} requests "
        f"({per_checkout:.2f} per checkout, target <= 1: {'met' if counts_ok else 'NOT MET'}) over "
        f"{timed.get('connections', 0)} new connection(s), polled {polled:,}, errors {len(result.errors)}; "
        f"CPU per checkout: reconcile's process {shop_cpu / checkouts * 1000:.2f} ms, the emulator's "
        f"{emulator_cpu / checkouts * 1000:.2f} ms",
        flush=True,
    )
    print(
        f"[6] two runs at once: polled {' + '.join(f'{p:,}' for p in split_polls)} = {sum(split_polls):,} "
        f"of {checkouts:,}, {split.get('requests', 0):,} requests, {polled_once:,} checkouts polled once "
        f"(most polls of one checkout: {most_polls}; "
        f"{'split, none twice' if split_ok else 'NOT SPLIT CLEANLY'}), {split.get('connections', 0)} new "
        f"connection(s), {split_seconds:.1f} s with tracemalloc on, peak memory {peak / 2**20:.1f} MiB",
        flush=True,
    )
    print(
        f"[6] concurrency 1 (as before the pool), {sequential.polled:,} checkouts: "
        f"{sequential_rate:,.0f} checkouts/s; the pool is {rate / sequential_rate:.1f}x that",
        flush=True,
    )
    record(
        "6",
        f"reconcile {checkouts:,} vs its yardstick (same work)",
        f"{ratio:.3f}x",
        f">= {TARGET}",
        ratio >= TARGET,
    )
    record("6", "requests per checkout, errors 0", f"{per_checkout:.2f}", "<= 1", counts_ok)
    record(
        "6",
        "two runs at once: every checkout polled once",
        "split" if split_ok else "not split",
        "split",
        split_ok,
    )
    results["figures"]["6_reconcile"] = {
        "checkouts": checkouts,
        "concurrency": concurrency,
        "checkouts_per_s": round(rate, 1),
        "yardstick": "getstatus from as many threads, one indexed UPDATE per checkout, "
        f"{YARDSTICK_BATCH} per transaction; no claims, leases, locks, events or signals",
        "yardstick_per_s": round(baseline, 1),
        "yardstick_runs_per_s": [round(r, 1) for r in yardstick_rates],
        "yardstick_cpu_ms_per_checkout": {
            "yardstick": round(yardstick_cpu / checkouts * 1000, 2),
            "emulator": round(yardstick_emulator_cpu / checkouts * 1000, 2),
        },
        "getstatus_alone_per_s": round(alone_mean, 1),
        "getstatus_alone_runs_per_s": alone_rates,
        "ratio_to_getstatus_alone": round(alone_ratio, 3),
        "ratio": round(ratio, 3),
        "target": f">= {TARGET}",
        "requests": timed.get("requests", 0),
        "requests_per_checkout": round(per_checkout, 3),
        "connections": timed.get("connections", 0),
        "polled": polled,
        "errors": len(result.errors),
        "statuses": dict(result.statuses),
        "seconds": round(seconds, 1),
        "cpu_ms_per_checkout": {
            "reconcile": round(shop_cpu / checkouts * 1000, 2),
            "emulator": round(emulator_cpu / checkouts * 1000, 2),
        },
        "split": {
            "polled": split_polls,
            "requests": split.get("requests", 0),
            "polled_once": polled_once,
            "max_polls_of_one": most_polls,
            "connections": split.get("connections", 0),
            "seconds_with_tracemalloc": round(split_seconds, 1),
            "ok": split_ok,
        },
        "peak_memory_mib": round(peak / 2**20, 1),
        "sequential": {"polled": sequential.polled, "checkouts_per_s": round(sequential_rate, 1)},
        "met": met,
    }


def _print_ratio(
    checkouts: int,
    concurrency: int,
    yardsticks: list[YardstickRun],
    result: Any,
    seconds: float,
    timed: dict[str, int],
    shop_cpu: float,
    emulator_cpu: float,
) -> None:
    """``--ratio-only``: the yardstick, reconcile and their ratio (no reference, no split, no sequential)."""
    rates = [run.rate for run in yardsticks]
    rate = result.polled / seconds
    ratio = rate / (sum(rates) / len(rates))
    yardstick_cpu = sum(run.cpu_seconds for run in yardsticks) / len(yardsticks)
    print(
        f"[6] yardstick {' / '.join(f'{r:,.0f}' for r in rates)} checkouts/s (CPU "
        f"{yardstick_cpu / checkouts * 1000:.2f} ms per checkout); reconcile {rate:,.0f} checkouts/s "
        f"({seconds:.1f} s, CPU {shop_cpu / checkouts * 1000:.2f} ms per checkout, the emulator's "
        f"{emulator_cpu / checkouts * 1000:.2f} ms), {ratio:.3f}x (target >= {TARGET}x); concurrency "
        f"{concurrency}, {timed.get('requests', 0):,} requests for {checkouts:,} checkouts, polled "
        f"{result.polled:,}, errors {len(result.errors)}",
        flush=True,
    )


@contextlib.contextmanager
def _profiled(folder: Path | None) -> Iterator[None]:
    """``--profile FOLDER``: cProfile of the run's thread and of each polling thread of the timed run,
    written to ``FOLDER`` (``run.pstats``, ``polling.pstats``: the threads' merged) and their top functions
    printed (by own time). Slows the run: its figures are not comparable."""
    if folder is None:
        yield
        return
    import cProfile
    import pstats

    from flask_gateway.operations.reconciliation import pool

    folder.mkdir(parents=True, exist_ok=True)
    threads: list[cProfile.Profile] = []
    work = pool._work

    def profiled_work(*args: Any) -> None:
        profile = cProfile.Profile()
        threads.append(profile)
        profile.runcall(work, *args)

    pool._work = profiled_work  # type: ignore[assignment]
    run = cProfile.Profile()
    run.enable()
    try:
        yield
    finally:
        run.disable()
        pool._work = work
    run.dump_stats(folder / "run.pstats")
    for name, stats in (("run's thread", pstats.Stats(run)), ("polling threads", pstats.Stats(*threads))):
        if name == "polling threads":
            stats.dump_stats(folder / "polling.pstats")
        print(f"[6] profile, {name}, by own time:", flush=True)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(25)


def main(argv: list[str] | None = None) -> int:
    """Figure 6 alone (see the module's docstring)."""
    parser = argparse.ArgumentParser(description="figure 6: reconcile against a yardstick doing its work")
    parser.add_argument("--reconcile-rows", type=int, default=10_000, help="due checkouts (10,000)")
    parser.add_argument(
        "--reconcile-concurrency",
        type=int,
        default=None,
        help="the pool of polling threads (GATEWAY_RECONCILE_CONCURRENCY's default)",
    )
    parser.add_argument(
        "--ratio-only",
        action="store_true",
        help="only the yardstick, reconcile and the yardstick again (no reference, no bounds): quick",
    )
    parser.add_argument("--profile", type=Path, default=None, help="cProfile the timed run into FOLDER")
    parser.add_argument("--warmup", type=float, default=3.0, help="untimed seconds of wrk first (3)")
    parser.add_argument("--wrk-threads", type=int, default=2, help="wrk threads (2)")
    parser.add_argument("--workers", type=int, default=4, help="gunicorn worker processes (4)")
    parser.add_argument("--threads", type=int, default=2, help="gunicorn threads per worker (2)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        figure_reconcile(args, Path(scratch))
    return 0


def _server_cpu(port: int) -> float:
    """CPU seconds used so far by the processes serving ``port`` (gunicorn's arbiter and workers; Linux)."""
    import os
    import subprocess

    pids = subprocess.run(  # noqa: S603
        ["pgrep", "-f", f"127.0.0.1:{port}"],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
    ).stdout.split()
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


if __name__ == "__main__":
    sys.exit(main())
