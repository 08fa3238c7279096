"""Figure 6: ``reconcile()`` of due pending checkouts against the emulator over real HTTP."""

from __future__ import annotations

import argparse
import time
import tracemalloc
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import requests
from emulator_throughput import ServerOptions, serve
from harness import (
    results,
)


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
