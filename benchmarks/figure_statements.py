"""Figure 5: SQL statements per create, status poll and callback, shop side and emulator side, counted at
two table sizes (they must be equal: no N+1, no scan that grows).

- On SQLite, 1,000 and 100,000 checkouts per side (``--statement-rows``), seeded in bulk as the test does
  (``tests/extension/payments/test_statement_counts.py``, which runs the same scenario at 10 and 1,000).
- At a million (issue 30), on PostgreSQL: 1,000 and 1,000,000 checkouts per side (``--million-rows``),
  loaded with ``COPY`` from a generated stream (the shop's checkouts and one event each, the emulator's
  checkouts, paid); the same counts at both sizes; every statement of create, poll, callback and
  reconcile's claim (both passes) explained (``EXPLAIN``) at the million, each plan's node types printed,
  and no ``Seq Scan`` on the big tables; the callback's and the emulator's getstatus p50 at the million
  within 1.2x of theirs at 1,000 (in-process, the two sizes interleaved call by call, so the machine's
  load hits both alike), printed side by side.
"""

from __future__ import annotations

import argparse
import io
import random
import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from harness import record, results

from tests.extension.conftest import ACCOUNT

#: The tables a million rows are loaded into: a plan that reads one of them whole fails the figure.
BIG_TABLES = frozenset({"gateway_checkouts", "gateway_checkout_events", "emulator_checkouts"})
#: The callback's and getstatus's p50 at the million, at most this times theirs at 1,000.
LATENCY_TARGET = 1.2
#: Rows per chunk written to COPY.
CHUNK = 50_000


def figure_statements(args: argparse.Namespace, folder: Path) -> None:
    """SQLite: the counts at ``--statement-rows`` (1,000 and 100,000)."""
    from tests.extension.payments.test_statement_counts import BOUNDS, build_harness, seed, statement_counts

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
    _print_counts("SQLite", args.statement_rows, small, large, BOUNDS)
    print(f"[5] SQLite: counts equal at both sizes: {'met' if equal else 'NOT MET'}", flush=True)
    sizes_text = " / ".join(f"{rows:,}" for rows in args.statement_rows)
    record(
        "5",
        f"statements per create/poll/callback, SQLite {sizes_text}",
        "equal" if equal else "differ",
        "equal",
        equal,
    )
    results["figures"]["5_statements"] = {
        "backend": "sqlite",
        "rows": list(args.statement_rows),
        "counts": {str(rows): value for rows, value in counts.items()},
        "equal": equal,
        "bounds": BOUNDS,
    }


def _print_counts(
    backend: str, sizes: list[int], small: dict[str, Any], large: dict[str, Any], bounds: dict[str, Any]
) -> None:
    for operation in ("create", "poll", "callback"):
        shop_bound, emulator_bound = bounds[operation]
        print(
            f"[5] {backend}: statements per {operation:<9} "
            f"shop {small[operation]['shop']:>3} / {large[operation]['shop']:>3}"
            f"   emulator {small[operation]['emulator']:>3} / {large[operation]['emulator']:>3}"
            f"   ({sizes[0]:,} / {sizes[1]:,} rows; bounds {shop_bound} / {emulator_bound})",
            flush=True,
        )


# --- at a million, on PostgreSQL ------------------------------------------------------------------------


def _database(url: str) -> str:
    from sqlalchemy.engine import make_url

    return str(make_url(url).database)


def _copy(cluster: Any, database: str, table: str, columns: str, lines: Iterator[str]) -> None:
    """``COPY table (columns) FROM STDIN`` (text format), fed in chunks of :data:`CHUNK` lines, into the
    table emptied in the same transaction (``TRUNCATE``: it is new, and so are the tables referring to it),
    so that the rows are written frozen (``FREEZE``: no vacuum needed after)."""
    import psycopg

    with (
        psycopg.connect(host="127.0.0.1", port=cluster.port, user=cluster.user, dbname=database) as conn,
        conn.cursor() as cursor,
    ):
        cursor.execute(f"TRUNCATE {table} CASCADE")
        with cursor.copy(f"COPY {table} ({columns}) FROM STDIN (FREEZE)") as copy:
            _write(copy, lines)


def _write(copy: Any, lines: Iterator[str]) -> None:
    buffer = io.StringIO()
    for count, text_line in enumerate(lines, 1):
        buffer.write(text_line)
        if count % CHUNK == 0:
            copy.write(buffer.getvalue())
            buffer = io.StringIO()
    copy.write(buffer.getvalue())


def _sql(cluster: Any, database: str, *statements: str) -> list[Any]:
    import psycopg

    out = []
    with psycopg.connect(
        host="127.0.0.1", port=cluster.port, user=cluster.user, dbname=database, autocommit=True
    ) as conn:
        for statement in statements:
            cursor = conn.execute(statement)
            out.append(cursor.fetchall() if cursor.description else None)
    return out


def seed_token(n: int) -> str:
    """The token of loaded checkout ``n`` (zero-padded: the loaded keys come in index order, so COPY appends
    to each index instead of inserting all over it)."""
    return f"v2.{ACCOUNT}.seed-{n:07d}"


def load(cluster: Any, shop_url: str, emulator_url: str, rows: int, now: datetime) -> float:
    """``rows`` v2 checkouts on each side, loaded with COPY (seconds taken): on the shop's side pending, with
    one event each, last changed over the past 30 days (oldest first, as a shop's table grows); on the
    emulator's side the same tokens, paid (getstatus answers ``PAID``; a callback claiming it is
    confirmed). The two sides load at once (two server processes), each table then analysed."""
    import threading

    started = time.perf_counter()
    shop, emulator = _database(shop_url), _database(emulator_url)
    span = timedelta(days=30) / rows
    first = now - timedelta(days=30)
    expires = (now + timedelta(days=1)).isoformat()
    paid_at = now.isoformat()

    def stamp(n: int) -> str:
        return (first + span * n).isoformat()

    def shop_side() -> None:
        # Ids given (1..rows, the table is new), so the events need not wait to learn them.
        _copy(
            cluster,
            shop,
            "gateway_checkouts",
            "id, api_version, order_reference, request_id, token, merchant_account_id, status, total_cents, "
            'paid_cents, refunded_cents, "order", created_at, updated_at, expires_at, flagged',
            (
                f"{n + 1}\tv2\tSEED-{n:07d}\tseed-{n:07d}\t{seed_token(n)}\t{ACCOUNT}\tPENDING_ORDER\t79800\t"
                f'0\t0\t{{"reference": "SEED-{n:07d}"}}\t{at}\t{at}\t{expires}\tf\n'
                for n in range(rows)
                for at in (stamp(n),)
            ),
        )
        _sql(
            cluster,
            shop,
            "SELECT setval(pg_get_serial_sequence('gateway_checkouts', 'id'), max(id)) "
            "FROM gateway_checkouts",
        )
        _copy(
            cluster,
            shop,
            "gateway_checkout_events",
            "checkout_id, at, source, from_status, to_status, applied, detail",
            (f"{n + 1}\t{stamp(n)}\tcreate\tCREATING\tPENDING_ORDER\tt\tseeded\n" for n in range(rows)),
        )
        _sql(cluster, shop, "ANALYZE gateway_checkouts", "ANALYZE gateway_checkout_events")

    def emulator_side() -> None:
        _copy(
            cluster,
            emulator,
            "emulator_checkouts",
            "token, account_id, api_version, status, request_id, total_cents, merchant_order_reference, "
            "details, created_at, updated_at, expires_at, paid_at, payment_reference, refunded_cents",
            (
                f"{seed_token(n)}\t{ACCOUNT}\t2\tPAID\tseed-{n:07d}\t79800\tSEED-{n:07d}\t"
                f'{{"merchantOrderReference": "SEED-{n:07d}"}}\t{stamp(n)}\t{paid_at}\t{expires}\t{paid_at}\t'
                f"{700_000_000 + n}\t0\n"
                for n in range(rows)
            ),
        )
        _sql(cluster, emulator, "ANALYZE emulator_checkouts")

    failures: list[BaseException] = []

    def run(side: Any) -> None:
        try:
            side()
        except BaseException as error:  # re-raised below, in the calling thread
            failures.append(error)

    threads = [threading.Thread(target=run, args=(side,)) for side in (shop_side, emulator_side)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return time.perf_counter() - started


class Recorder:
    """The statements (and their parameters) each counted block of ``statement_counts`` sent, by
    operation and side: it stands in for the test module's ``counting`` (same list of statements)."""

    #: The order in which ``statement_counts`` opens its counted blocks, in each of its two rounds.
    BLOCKS = (
        ("create", "shop"),
        ("create", "emulator"),
        ("poll", "shop"),
        ("poll", "emulator"),
        ("callback", "shop"),
        ("callback", "emulator"),
    )

    def __init__(self) -> None:
        self.blocks = 0
        #: (operation, side) -> [(statement, parameters)], of the last round.
        self.statements: dict[tuple[str, str], list[tuple[str, Any]]] = {}

    @contextmanager
    def counting(self, engine: Any) -> Iterator[list[str]]:
        from sqlalchemy import event

        name = self.BLOCKS[self.blocks % len(self.BLOCKS)]
        self.blocks += 1
        statements: list[str] = []
        recorded: list[tuple[str, Any]] = self.statements.setdefault(name, [])
        recorded.clear()

        def record(_conn: Any, _cursor: Any, statement: str, parameters: Any, *_args: Any) -> None:
            statements.append(statement)
            recorded.append((statement, parameters))

        event.listen(engine, "before_cursor_execute", record)
        try:
            yield statements
        finally:
            event.remove(engine, "before_cursor_execute", record)


def _plan_nodes(plan: dict[str, Any]) -> Iterator[dict[str, Any]]:
    yield plan
    for child in plan.get("Plans", ()):
        yield from _plan_nodes(child)


def explain(engine: Any, statement: str, parameters: Any) -> list[str] | None:
    """The node types of the plan of ``statement`` (``Seq Scan on table`` names the table, as does an
    index scan its index); None for what has no plan (BEGIN, COMMIT, SAVEPOINT...)."""
    if statement.lstrip().split(None, 1)[0].upper() not in {"SELECT", "INSERT", "UPDATE", "DELETE", "WITH"}:
        return None
    if isinstance(parameters, list | tuple) and parameters and isinstance(parameters[0], dict | list | tuple):
        parameters = parameters[0]  # executemany: the first row's plan
    with engine.connect() as conn:
        [[document]] = conn.exec_driver_sql(f"EXPLAIN (FORMAT JSON) {statement}", parameters).all()
        conn.rollback()
    nodes = []
    for node in _plan_nodes(document[0]["Plan"]):
        kind = node["Node Type"]
        if kind == "ModifyTable":
            kind = f"{node.get('Operation', '')} {node.get('Relation Name', '')}".strip()
        elif "Index Name" in node:
            kind = f"{kind} using {node['Index Name']}"
        elif "Relation Name" in node:
            kind = f"{kind} on {node['Relation Name']}"
        nodes.append(kind)
    return nodes


def _short(statement: str, width: int = 72) -> str:
    one = " ".join(statement.split())
    return one if len(one) <= width else one[: width - 3] + "..."


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def figure_million(args: argparse.Namespace, folder: Path, cluster: Any) -> None:
    """PostgreSQL: the counts at ``--million-rows`` (1,000 and 1,000,000), the plans at the larger size, and
    the callback's and getstatus's p50 at both."""
    from flask_gateway.core.timestamps import utcnow
    from flask_gateway.operations.reconciliation import BATCH_SIZE, _due
    from flask_gateway.operations.reconciliation.claiming import _claim_rows, _paid_due
    from flask_gateway.state import get_state
    from tests.extension.payments import test_statement_counts as counts_module
    from tests.extension.payments.test_statement_counts import BOUNDS, build_harness, signed_callback

    sizes = list(args.million_rows)
    harnesses, counts, loads, recorders = {}, {}, {}, {}
    for rows in sizes:
        shop_url = cluster.create_database(f"bench_million_shop_{rows}")
        emulator_url = cluster.create_database(f"bench_million_emulator_{rows}")
        h = build_harness(shop_url, emulator_url)
        h.install()
        loads[rows] = load(cluster, shop_url, emulator_url, rows, utcnow())
        print(
            f"[5] PostgreSQL: loaded {rows:,} checkouts on each side (and {rows:,} events) with COPY in "
            f"{loads[rows]:.1f} s",
            flush=True,
        )
        recorder = Recorder()
        original = counts_module.counting
        counts_module.counting = recorder.counting
        try:
            counts[rows] = counts_module.statement_counts(h)
        finally:
            counts_module.counting = original
        harnesses[rows], recorders[rows] = h, recorder
    small, large = (counts[rows] for rows in sizes)
    equal = small == large
    _print_counts("PostgreSQL", sizes, small, large, BOUNDS)

    # The plans at the larger size: every statement of the three operations, and reconcile's claims.
    big = harnesses[sizes[-1]]
    with big.shop.app_context():
        shop_engine = get_state().engine
    emulator_engine = _emulator_engine(big)
    statements: dict[tuple[str, str], list[tuple[str, Any]]] = dict(recorders[sizes[-1]].statements)
    claim_times: dict[int, list[float]] = {}
    claim_counts: dict[str, dict[int, int]] = {}
    for rows in sizes:
        h = harnesses[rows]
        with h.shop.app_context():
            state = get_state()
            now = utcnow()
            passes = {
                "claim (open)": (_due([ACCOUNT], now, now), False),
                "claim (paid)": (
                    _paid_due(
                        [ACCOUNT],
                        window_start=now - timedelta(hours=72),
                        recheck_cutoff=now - timedelta(hours=1),
                        lease_cutoff=now - timedelta(hours=1),
                    ),
                    True,
                ),
            }
            times = claim_times.setdefault(rows, [])
            for name, (where, paid) in passes.items():
                for attempt in range(6):
                    recorder = Recorder()
                    with recorder.counting(state.engine) as sent:
                        started = time.perf_counter()
                        _claim_rows(where, BATCH_SIZE, paid=paid)
                        elapsed = time.perf_counter() - started
                        state.session.rollback()  # nothing claimed: the figure changes no row
                    if attempt and not paid:
                        times.append(elapsed)
                    if attempt == 0:
                        claim_counts.setdefault(name, {})[rows] = len(sent)
                    if rows == sizes[-1] and attempt == 0 and sent:
                        statements[(name, "shop")] = list(recorder.statements[Recorder.BLOCKS[0]])
    for name, per_size in claim_counts.items():
        equal = equal and per_size[sizes[0]] == per_size[sizes[-1]]
        print(
            f"[5] PostgreSQL: statements per {name:<12} shop {per_size[sizes[0]]:>3} / "
            f"{per_size[sizes[-1]]:>3}   ({sizes[0]:,} / {sizes[-1]:,} rows)",
            flush=True,
        )
    print(f"[5] PostgreSQL: counts equal at both sizes: {'met' if equal else 'NOT MET'}", flush=True)
    record(
        "5",
        f"statements per call and claim, PostgreSQL {sizes[0]:,} / {sizes[-1]:,}",
        "equal" if equal else "differ",
        "equal",
        equal,
    )
    plans: dict[str, list[dict[str, Any]]] = {}
    scans: list[str] = []
    for (operation, side), recorded in statements.items():
        engine = shop_engine if side == "shop" else emulator_engine
        for statement, parameters in recorded:
            nodes = explain(engine, statement, parameters)
            if nodes is None:
                continue
            plans.setdefault(operation, []).append(
                {"side": side, "statement": _short(statement, 200), "nodes": nodes}
            )
            bad = [node for node in nodes if node.startswith("Seq Scan on ") and node[12:] in BIG_TABLES]
            scans.extend(f"{operation} ({side}): {node}: {_short(statement)}" for node in bad)
            print(f"[5]   {operation:<12} {side:<8} {_short(statement, 60):<60}  {' > '.join(nodes)}")
    no_scan = not scans
    for scan in scans:
        print(f"[5]   SEQ SCAN: {scan}", flush=True)
    print(
        f"[5] PostgreSQL at {sizes[-1]:,}: {sum(len(v) for v in plans.values())} statements explained, "
        f"no Seq Scan on {', '.join(sorted(BIG_TABLES))}: {'met' if no_scan else 'NOT MET'}",
        flush=True,
    )
    record("5", f"Seq Scan on the big tables at {sizes[-1]:,}", str(len(scans)), "0", no_scan)

    latencies = _latencies(args, harnesses, sizes, signed_callback)
    latency_ok = True
    summary: dict[str, Any] = {}
    for name, by_size in latencies.items():
        p50 = {rows: statistics.median(values) * 1000 for rows, values in by_size.items()}
        p99 = {rows: _percentile(values, 0.99) * 1000 for rows, values in by_size.items()}
        ratio = p50[sizes[-1]] / p50[sizes[0]]
        ok = ratio <= LATENCY_TARGET
        latency_ok = latency_ok and ok
        summary[name] = {
            "p50_ms": {str(k): round(v, 2) for k, v in p50.items()},
            "p99_ms": {str(k): round(v, 2) for k, v in p99.items()},
            "calls": len(by_size[sizes[0]]),
            "ratio": round(ratio, 3),
            "met": ok,
        }
        print(
            f"[5] {name:<22} p50 {p50[sizes[0]]:6.2f} ms at {sizes[0]:,} | {p50[sizes[-1]]:6.2f} ms at "
            f"{sizes[-1]:,}  (p99 {p99[sizes[0]]:.2f} | {p99[sizes[-1]]:.2f} ms)  ratio {ratio:.3f}x "
            f"(target <= {LATENCY_TARGET}x: {'met' if ok else 'NOT MET'})",
            flush=True,
        )
        record(
            "5", f"{name} p50 at {sizes[-1]:,} / at {sizes[0]:,}", f"{ratio:.3f}x", f"<= {LATENCY_TARGET}", ok
        )
    claim_p50 = {rows: statistics.median(values) * 1000 for rows, values in claim_times.items()}
    print(
        f"[5] reconcile's claim of {BATCH_SIZE} (open pass, SELECT ... FOR UPDATE SKIP LOCKED and UPDATE, "
        f"rolled back): p50 {claim_p50[sizes[0]]:.2f} ms at {sizes[0]:,} | {claim_p50[sizes[-1]]:.2f} ms "
        f"at {sizes[-1]:,} (for reference)",
        flush=True,
    )
    results["figures"]["5_million"] = {
        "backend": "postgresql",
        "rows": sizes,
        "load_seconds": {str(k): round(v, 1) for k, v in loads.items()},
        "counts": {str(rows): value for rows, value in counts.items()},
        "claim_counts": {name: {str(k): v for k, v in c.items()} for name, c in claim_counts.items()},
        "equal": equal,
        "plans": plans,
        "seq_scans_on_big_tables": scans,
        "latency": summary,
        "claim_p50_ms": {str(k): round(v, 2) for k, v in claim_p50.items()},
        "target": f"counts equal, no Seq Scan on the big tables, p50 at the larger size <= {LATENCY_TARGET}x",
        "met": equal and no_scan and latency_ok,
    }


def _emulator_engine(h: Any) -> Any:
    from flask_gateway.emulator.models import db as emulator_db

    with h.emulator.client.application.app_context():
        return emulator_db.engine


def _latencies(
    args: argparse.Namespace, harnesses: dict[int, Any], sizes: list[int], signed_callback: Any
) -> dict[str, dict[int, list[float]]]:
    """Seconds per call, in-process: the shop's callback (a real PENDING -> PAID confirmed by getstatus)
    and the emulator's getstatus, each on checkouts spread over the whole table, the sizes interleaved."""
    from flask_gateway.state import get_state

    for h in harnesses.values():  # the emulator's driver signs getstatus with the key the shop installed
        with h.shop.app_context():
            state = get_state()
            h.emulator.keys[ACCOUNT] = state.box.decrypt(state.require_installation().signing_key_encrypted)
    calls = min(args.latency_calls, sizes[0] // 2)
    warm = 20
    chosen = {rows: random.Random(rows).sample(range(rows), calls + warm) for rows in sizes}
    prepared = {
        rows: [signed_callback(harnesses[rows], seed_token(n), "PAID") for n in chosen[rows]]
        for rows in sizes
    }
    clients = {rows: harnesses[rows].client for rows in sizes}
    out: dict[str, dict[int, list[float]]] = {"callback (shop)": {}, "getstatus (emulator)": {}}
    for index in range(calls + warm):
        for rows in sizes:
            h = harnesses[rows]
            token = seed_token(chosen[rows][(index * 7919) % len(chosen[rows])])
            started = time.perf_counter()
            answer = h.emulator.signed("/v2/getstatus", {"checkoutToken": token})
            elapsed = time.perf_counter() - started
            if answer.status_code != 200:
                raise SystemExit(f"getstatus answered {answer.status_code}: {answer.get_data(as_text=True)}")
            if index >= warm:
                out["getstatus (emulator)"].setdefault(rows, []).append(elapsed)
            body, headers = prepared[rows][index]
            started = time.perf_counter()
            answer = clients[rows].post("/gateway/callback", data=body, headers=headers)
            elapsed = time.perf_counter() - started
            if answer.status_code != 200:
                raise SystemExit(
                    f"the callback answered {answer.status_code}: {answer.get_data(as_text=True)}"
                )
            if index >= warm:
                out["callback (shop)"].setdefault(rows, []).append(elapsed)
    return out
