"""Figure 4: the emulator's create and getstatus under gunicorn, against their yardsticks."""

from __future__ import annotations

import argparse
import json
import uuid
from pathlib import Path

from emulator_throughput import ServerOptions, call, create_body, serve
from harness import (
    ACCOUNT,
    API_KEY,
    Load,
    alternate,
    line,
    results,
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
        serve("flask_gateway.emulator:create_app()", options, env, log) as port,
    ):
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
        figures = alternate(
            [
                Load("bare", bare_port, lambda count: [bare_line] * 100, unique=False),
                Load("create", port, creates),
                Load("getstatus", port, lambda count: statuses, unique=False),
            ],
            folder,
            args,
        )
    bare, create, getstatus = figures["bare"], figures["create"], figures["getstatus"]
    print(
        f"[4] bare Flask JSON endpoint ({backend} rounds): {bare['ok_per_s']:,.0f} req/s "
        f"(p50 {bare['p50_ms']} ms, p99 {bare['p99_ms']} ms)",
        flush=True,
    )
    out = {
        "bare": bare,
        "create": throughput_line("4", f"emulator create, {backend}", bare, create),
        "getstatus": throughput_line("4", f"emulator getstatus, {backend}", bare, getstatus),
    }
    results["figures"][f"4_emulator_{backend}"] = out
