"""Figure 3: the shop's ``/gateway/callback`` under gunicorn on PostgreSQL, against its yardstick."""

from __future__ import annotations

import argparse
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

from emulator_throughput import ServerOptions, serve
from harness import (
    ACCOUNT,
    API_KEY,
    Load,
    alternate,
    line,
    results,
    throughput_line,
)

from flask_gateway.core.signing import sign


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
