"""Figure 3: the shop's ``/gateway/callback`` under gunicorn, confirmed with getstatus by the real emulator
(gunicorn too), against its yardstick (``apps:confirm_app()``); the first round's one-UPDATE yardstick
(``apps:update_app()``) is run and printed for reference.

``figure_callback``: on PostgreSQL, the rows loaded with ``COPY``. ``figure_callback_sqlite``: the shop on
a SQLite file (WAL with ``synchronous=NORMAL`` on every connection, as the example shop asks with
``GATEWAY_SQLITE_WAL``: ``sqlite_app``) and the emulator on a file of its own, the rows loaded with
``executemany`` in big transactions; it also prints the callback's p99 / p50, for reference (issue 38
retired its target).
``bench.py --only 3`` runs both; the SQLite one alone, with no PostgreSQL::

    .venv/bin/python benchmarks/figure_callback.py --rows 20000 --duration 6
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from emulator_throughput import ServerOptions, call, serve
from harness import (
    ACCOUNT,
    API_KEY,
    Load,
    add_load_options,
    alternate,
    line,
    results,
    throughput_line,
)

from flask_gateway.core.signing import sign
from flask_gateway.core.wire import dumps

#: The loads of one run, each on checkouts of its own (every callback is a real PENDING -> PAID).
LOADS = ("update", "confirm", "callback")


def _token(n: int) -> str:
    return f"v2.{ACCOUNT}.{uuid.UUID(int=n)}"


def _install_emulator(port: int) -> str:
    """Install the benchmark's account on the emulator (its own ``/install/v2``); its signing key."""
    install = {
        "merchantAccountId": ACCOUNT,
        "merchantAccountApiKey": API_KEY,
        "checkoutStatusCallbackUrl": "http://127.0.0.1:9/gateway/callback",  # never called: no delivery
        "minimumCheckoutAmountCents": 0,
        "maximumCheckoutAmountCents": 10**9,
    }
    status, answer = call(port, ("POST", "/install/v2", dumps(install), {"Content-Type": "application/json"}))
    if status != 200:
        raise SystemExit(f"emulator installation failed: {status} {answer[:300]!r}")
    key: str = json.loads(answer)["secretSigningKey"]
    return key


def _copy_emulator_checkouts(cluster: Any, rows: int, now: Any, paid_at: Any) -> None:
    """The same ``rows`` checkouts on the emulator's side, paid (getstatus answers ``PAID``)."""
    import psycopg

    columns = (
        "token, account_id, api_version, status, request_id, total_cents, merchant_order_reference, "
        "details, created_at, updated_at, expires_at, paid_at, payment_reference, refunded_cents"
    )
    expires = now + timedelta(hours=1)
    with (
        psycopg.connect(
            host="127.0.0.1", port=cluster.port, user=cluster.user, dbname="bench_callback_emulator"
        ) as conn,
        conn.cursor() as cursor,
        cursor.copy(f"COPY emulator_checkouts ({columns}) FROM STDIN") as copy,
    ):
        for n in range(rows):
            copy.write_row(
                (_token(n), ACCOUNT, 2, "PAID", f"req-{n}", 79800, f"B-{n}",
                 f'{{"merchantOrderReference": "B-{n}"}}', now, paid_at, expires, paid_at,
                 700_000_000 + n, 0)
            )  # fmt: skip
    with psycopg.connect(
        host="127.0.0.1", port=cluster.port, user=cluster.user, dbname="bench_callback_emulator"
    ) as conn:
        conn.execute("ANALYZE emulator_checkouts")


def _copy_shop_checkouts(cluster: Any, rows: int, now: Any) -> None:
    """``rows`` checkouts on the shop's side, waiting for their payment (``PENDING_ORDER``)."""
    import psycopg

    stamp = now.isoformat()
    expires = (now + timedelta(hours=1)).isoformat()
    columns = (
        "api_version, order_reference, request_id, token, merchant_account_id, status, total_cents, "
        'paid_cents, refunded_cents, "order", created_at, updated_at, expires_at, flagged'
    )
    with (
        psycopg.connect(host="127.0.0.1", port=cluster.port, user=cluster.user, dbname="bench_shop") as conn,
        conn.cursor() as cursor,
        cursor.copy(f"COPY gateway_checkouts ({columns}) FROM STDIN") as copy,
    ):
        for n in range(rows):
            copy.write_row(
                ("v2", f"B-{n}", f"req-{n}", _token(n), ACCOUNT, "PENDING_ORDER", 79800, 0, 0,
                 f'{{"reference": "B-{n}"}}', stamp, stamp, expires, False)
            )  # fmt: skip
    with psycopg.connect(host="127.0.0.1", port=cluster.port, user=cluster.user, dbname="bench_shop") as conn:
        conn.execute("ANALYZE gateway_checkouts")


#: Rows per ``executemany`` (and per transaction) when loading a SQLite file.
_BATCH = 20_000


def _insert_sqlite(url: str, table: Any, rows: int, row: Any) -> None:
    """``rows`` rows of ``row(n)`` into ``table`` of the SQLite file at ``url``, in big transactions, then
    ``ANALYZE`` (what ``COPY`` and ``ANALYZE`` do on PostgreSQL)."""
    from sqlalchemy import create_engine, insert, text

    engine = create_engine(url)
    try:
        statement = insert(table)
        for start in range(0, rows, _BATCH):
            with engine.begin() as connection:
                connection.execute(statement, [row(n) for n in range(start, min(rows, start + _BATCH))])
        with engine.begin() as connection:
            connection.execute(text("ANALYZE"))
    finally:
        engine.dispose()


def _load_sqlite(shop_url: str, emulator_url: str, rows: int, now: Any, paid_at: Any) -> None:
    """The same checkouts as ``COPY`` loads on PostgreSQL, through the models' tables (their types)."""
    from flask_gateway.emulator.models import Checkout as EmulatorCheckout
    from flask_gateway.models import GatewayCheckout

    expires = now + timedelta(hours=1)
    _insert_sqlite(
        shop_url,
        GatewayCheckout.__table__,
        rows,
        lambda n: {
            "api_version": "v2", "order_reference": f"B-{n}", "request_id": f"req-{n}", "token": _token(n),
            "merchant_account_id": ACCOUNT, "status": "PENDING_ORDER", "total_cents": 79800,
            "paid_cents": 0, "refunded_cents": 0, "order": {"reference": f"B-{n}"}, "created_at": now,
            "updated_at": now, "expires_at": expires, "flagged": False,
        },
    )  # fmt: skip
    _insert_sqlite(
        emulator_url,
        EmulatorCheckout.__table__,
        rows,
        lambda n: {
            "token": _token(n), "account_id": ACCOUNT, "api_version": 2, "status": "PAID",
            "request_id": f"req-{n}", "total_cents": 79800, "merchant_order_reference": f"B-{n}",
            "details": {"merchantOrderReference": f"B-{n}"}, "created_at": now, "updated_at": paid_at,
            "expires_at": expires, "paid_at": paid_at, "payment_reference": 700_000_000 + n,
            "refunded_cents": 0,
        },
    )  # fmt: skip


def sqlite_app(factory: str) -> Any:
    """``apps.<factory>()`` on a SQLite file as the example shop runs one (``GATEWAY_SQLITE_WAL``): every
    connection of every engine in the process (the extension's, the shop's, the yardsticks') with
    ``synchronous=NORMAL``, which syncs at checkpoints, not at each commit (the file is in WAL). gunicorn
    serves ``figure_callback:sqlite_app('shop_wsgi')``."""
    import sqlite3

    import apps
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _normal(dbapi_connection: Any, _record: Any) -> None:
        if isinstance(dbapi_connection, sqlite3.Connection):
            dbapi_connection.execute("PRAGMA synchronous=NORMAL")

    return getattr(apps, factory)()


def figure_callback(args: argparse.Namespace, folder: Path, cluster: Any) -> None:
    """Figure 3 on PostgreSQL (the rows loaded with ``COPY``)."""
    url = cluster.create_database("bench_shop")
    emulator_url = cluster.create_database("bench_callback_emulator")

    def load(rows: int, now: Any, paid_at: Any) -> None:
        _copy_shop_checkouts(cluster, rows, now)
        _copy_emulator_checkouts(cluster, rows, now, paid_at)

    _figure(args, folder, "postgresql", url, emulator_url, load, "COPY")


def figure_callback_sqlite(args: argparse.Namespace, folder: Path) -> None:
    """Figure 3 on SQLite: the shop's file and the emulator's, the rows loaded with ``executemany``."""
    url = f"sqlite:///{folder / 'callback-shop.sqlite3'}"
    emulator_url = f"sqlite:///{folder / 'callback-emulator.sqlite3'}"

    def load(rows: int, now: Any, paid_at: Any) -> None:
        _load_sqlite(url, emulator_url, rows, now, paid_at)

    _figure(args, folder, "sqlite", url, emulator_url, load, "executemany")


def _rows_label(rows: int) -> str:
    return f"{rows // 1000}k rows" if rows >= 1000 and rows % 1000 == 0 else f"{rows:,} rows"


def _figure(
    args: argparse.Namespace,
    folder: Path,
    backend: str,
    url: str,
    emulator_url: str,
    load: Callable[[int, Any, Any], None],
    loaded_with: str,
) -> None:
    from apps import shop_app
    from sqlalchemy import create_engine, insert, text

    from flask_gateway.core.timestamps import utcnow
    from flask_gateway.core.wire import CheckoutStatusPayload
    from flask_gateway.models import Installation
    from flask_gateway.state import get_state

    options = ServerOptions(workers=args.workers, threads=args.threads)
    log = folder / "servers.log"
    emulator_env = {
        "EMULATOR_DATABASE_URL": emulator_url,
        "EMULATOR_ACCOUNTS": f"{ACCOUNT}:{API_KEY}",
        "EMULATOR_SECRET_KEY": "benchmark-only",
        "EMULATOR_PUBLIC_URL": "http://127.0.0.1",
        "EMULATOR_WORKER": "0",  # no callback is delivered by the emulator here: no worker polling its outbox
    }
    rows = args.rows
    name = {"postgresql": "PostgreSQL", "sqlite": "SQLite"}[backend]
    with serve("flask_gateway.emulator:create_app()", options, emulator_env, log) as emulator_port:
        gateway_url = f"http://127.0.0.1:{emulator_port}"
        signing_key = _install_emulator(emulator_port)

        app, db = shop_app(url)
        with app.app_context():
            db.create_all()
            if backend == "sqlite":  # WAL, as the example shop asks (GATEWAY_SQLITE_WAL): the file's setting
                db.session.execute(text("PRAGMA journal_mode=WAL"))
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

        started = time.perf_counter()
        paid_at = utcnow()
        load(rows, now, paid_at)
        load_s = time.perf_counter() - started
        print(
            f"[3] {name}: loaded {rows:,} checkouts with {loaded_with} in {load_s:.1f} s, on the shop's side "
            "(PENDING_ORDER) and the emulator's (PAID)",
            flush=True,
        )

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

        # Each load gets checkouts of its own, never paid before: every callback is a real PENDING -> PAID.
        share = rows // len(LOADS)
        per_run = max(1, share // (args.rounds + 1))  # the warm-up and each round: fresh checkouts
        cursor = {kind: i * share for i, kind in enumerate(LOADS)}

        def lines_for(kind: str, path: str) -> Callable[[int], list[str]]:
            def make(count: int) -> list[str]:
                start = cursor[kind]
                count = min(count, per_run)
                cursor[kind] += count
                return [item.replace("PATH", path, 1) for item in callback_lines(start, count)]

            return make

        env = {
            "BENCH_DATABASE_URL": url,
            "BENCH_GATEWAY_URL": gateway_url,
            "BENCH_ACCOUNT": ACCOUNT,
            "BENCH_SIGNING_KEY": signing_key,  # the benchmark's throwaway key, for the yardstick
        }

        def spec(factory: str) -> str:
            return (
                f"apps:{factory}()" if backend == "postgresql" else f"figure_callback:sqlite_app('{factory}')"
            )

        with (
            serve(spec("update_app"), options, env, log) as update_port,
            serve(spec("confirm_app"), options, env, log) as confirm_port,
            serve(spec("shop_wsgi"), options, env, log) as port,
        ):
            figures = alternate(
                [
                    Load("update", update_port, lines_for("update", "/bare-callback")),
                    Load("confirm", confirm_port, lines_for("confirm", "/confirm-callback")),
                    Load("callback", port, lines_for("callback", "/gateway/callback")),
                ],
                folder,
                args,
            )
    update, confirm, ours = figures["update"], figures["confirm"], figures["callback"]
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            paid = connection.execute(text("SELECT count(*) FROM gateway_checkouts WHERE status = 'PAID'"))
            paid_rows = paid.scalar_one()
            logs = connection.execute(
                text("SELECT outcome, count(*) FROM gateway_callback_log GROUP BY outcome")
            ).all()
    finally:
        engine.dispose()
    print(
        f"[3] yardstick, {name}: verify, getstatus to the emulator, one UPDATE, commit: "
        f"{confirm['ok_per_s']:,.0f} req/s (p50 {confirm['p50_ms']} ms, p99 {confirm['p99_ms']} ms)",
        flush=True,
    )
    print(
        f"[3] reference, {name}, the first round's yardstick (one UPDATE, commit; no signature, no "
        f"getstatus): {update['ok_per_s']:,.0f} req/s (p50 {update['p50_ms']} ms, p99 {update['p99_ms']} ms)",
        flush=True,
    )
    figure = throughput_line("3", f"callback, confirmed, {name}, {_rows_label(rows)}", confirm, ours)
    suffix = "" if backend == "postgresql" else f", {name}"
    reference = throughput_line("3", f"callback vs one-UPDATE (reference){suffix}", update, ours, target=None)
    figure.update(
        yardstick="verify, one signed getstatus to the emulator (keep-alive), one indexed UPDATE, commit",
        confirm_callbacks=True,
        reference_one_update={
            "baseline": update,
            "ratio": reference["ratio"],
            "round_ratios": reference["round_ratios"],
        },
        rows=rows,
        loaded_with=loaded_with,
        load_seconds=round(load_s, 1),
        paid_rows=paid_rows,
        callback_log=dict(logs),
    )
    if backend == "sqlite":  # for reference: the tail target (issue 30) was retired with the queue (issue 38)
        spread = ours["p99_ms"] / ours["p50_ms"] if ours["p50_ms"] else float("inf")
        print(
            f"[3] callback p99/p50, {name}: p50 {ours['p50_ms']} ms, p99 {ours['p99_ms']} ms, "
            f"{spread:.1f}x (reference, no target)",
            flush=True,
        )
        figure["p99_over_p50"] = {"ratio": round(spread, 2)}
    results["figures"]["3_callback" if backend == "postgresql" else f"3_callback_{backend}"] = figure


def main(argv: list[str] | None = None) -> int:
    """Figure 3 on SQLite only (see the module's description)."""
    parser = argparse.ArgumentParser(description="figure 3 on SQLite: the shop's callback, its yardstick")
    add_load_options(parser)
    parser.add_argument("--pool", type=int, default=20_000, help="distinct requests per callback run")
    parser.add_argument("--rows", type=int, default=100_000, help="existing checkouts (100,000)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-") as scratch:
        figure_callback_sqlite(args, Path(scratch))
    figure = results["figures"]["3_callback_sqlite"]
    summary = {
        "callback": {key: figure["measured"][key] for key in ("ok_per_s", "p50_ms", "p99_ms", "errors")},
        "yardstick": {key: figure["baseline"][key] for key in ("ok_per_s", "p50_ms", "p99_ms", "errors")},
        "ratio": figure["ratio"],
        "p99_over_p50": figure["p99_over_p50"],
        "paid_rows": figure["paid_rows"],
        "callback_log": figure["callback_log"],
    }
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
