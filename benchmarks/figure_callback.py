"""Figure 3: the shop's ``/gateway/callback`` under gunicorn on PostgreSQL, confirmed with getstatus by the
real emulator (gunicorn too), against its yardstick (``apps:confirm_app()``); the first round's one-UPDATE
yardstick (``apps:update_app()``) is run and printed for reference."""

from __future__ import annotations

import argparse
import json
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


def figure_callback(args: argparse.Namespace, folder: Path, cluster: Any) -> None:
    import psycopg
    from apps import shop_app
    from sqlalchemy import insert

    from flask_gateway.core.timestamps import utcnow
    from flask_gateway.core.wire import CheckoutStatusPayload
    from flask_gateway.models import Installation
    from flask_gateway.state import get_state

    url = cluster.create_database("bench_shop")
    emulator_url = cluster.create_database("bench_callback_emulator")
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
    with serve("flask_gateway.emulator:create_app()", options, emulator_env, log) as emulator_port:
        gateway_url = f"http://127.0.0.1:{emulator_port}"
        signing_key = _install_emulator(emulator_port)

        app, db = shop_app(url)
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

        started = time.perf_counter()
        stamp = now.isoformat()
        expires = (now + timedelta(hours=1)).isoformat()
        columns = (
            "api_version, order_reference, request_id, token, merchant_account_id, status, total_cents, "
            'paid_cents, refunded_cents, "order", created_at, updated_at, expires_at, flagged'
        )
        with (
            psycopg.connect(
                host="127.0.0.1", port=cluster.port, user=cluster.user, dbname="bench_shop"
            ) as conn,
            conn.cursor() as cursor,
            cursor.copy(f"COPY gateway_checkouts ({columns}) FROM STDIN") as copy,
        ):
            for n in range(rows):
                copy.write_row(
                    ("v2", f"B-{n}", f"req-{n}", _token(n), ACCOUNT, "PENDING_ORDER", 79800, 0, 0,
                     f'{{"reference": "B-{n}"}}', stamp, stamp, expires, False)
                )  # fmt: skip
        with psycopg.connect(
            host="127.0.0.1", port=cluster.port, user=cluster.user, dbname="bench_shop"
        ) as conn:
            conn.execute("ANALYZE gateway_checkouts")
        paid_at = utcnow()
        _copy_emulator_checkouts(cluster, rows, now, paid_at)
        load_s = time.perf_counter() - started
        print(
            f"[3] loaded {rows:,} checkouts with COPY in {load_s:.1f} s, on the shop's side (PENDING_ORDER) "
            "and the emulator's (PAID)",
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
        with (
            serve("apps:update_app()", options, env, log) as update_port,
            serve("apps:confirm_app()", options, env, log) as confirm_port,
            serve("apps:shop_wsgi()", options, env, log) as port,
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
    with psycopg.connect(host="127.0.0.1", port=cluster.port, user=cluster.user, dbname="bench_shop") as conn:
        paid = conn.execute("SELECT count(*) FROM gateway_checkouts WHERE status = 'PAID'").fetchone()
        logs = conn.execute("SELECT outcome, count(*) FROM gateway_callback_log GROUP BY outcome").fetchall()
    print(
        f"[3] yardstick: verify, getstatus to the emulator, one UPDATE, commit: {confirm['ok_per_s']:,.0f} "
        f"req/s (p50 {confirm['p50_ms']} ms, p99 {confirm['p99_ms']} ms)",
        flush=True,
    )
    print(
        f"[3] reference, the first round's yardstick (one UPDATE, commit; no signature, no getstatus): "
        f"{update['ok_per_s']:,.0f} req/s (p50 {update['p50_ms']} ms, p99 {update['p99_ms']} ms)",
        flush=True,
    )
    figure = throughput_line("3", "callback, confirmed, PostgreSQL, 100k rows", confirm, ours)
    reference = throughput_line("3", "callback vs one-UPDATE (reference)", update, ours)
    figure.update(
        yardstick="verify, one signed getstatus to the emulator (keep-alive), one indexed UPDATE, commit",
        confirm_callbacks=True,
        reference_one_update={
            "baseline": update,
            "ratio": reference["ratio"],
            "round_ratios": reference["round_ratios"],
        },
        rows=rows,
        load_seconds=round(load_s, 1),
        paid_rows=paid[0] if paid else 0,
        callback_log=dict(logs),
    )
    results["figures"]["3_callback"] = figure
