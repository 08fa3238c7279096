"""Figure 7: a shop's "create, pay, callback, fulfilled" test with the pytest plugin."""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path
from typing import Any

from harness import (
    ROOT,
    report,
    results,
)


def figure_plugin_test(args: argparse.Namespace, folder: Path) -> None:
    """docs/testing.md's first test as pytest runs it, fixture included: ``gateway_emulator``'s setup (an
    emulator from the session's pool, reset, wired to a fresh shop, installed), the test's body (place
    the order, Pay, the shopper pays, the callback, ``assert_fulfilled_once``) and the teardown. The shop
    (the docs' ``shop.py``, a SQLite file as the docs' ``conftest.py`` has it) is built fresh for each
    round, untimed, as the shop's own ``app`` fixture does; the yardstick is one plain request to another
    fresh shop of the same kind (its order page), interleaved with the test round by round."""
    import importlib.util
    import re as regex

    from flask_gateway.testing import EmulatorPool, GatewayEmulator

    blocks = regex.findall(
        r"```python\n# shop\.py\n(.*?)```", (ROOT / "docs" / "testing.md").read_text(), regex.S
    )
    source = folder / "plugin_docs_shop.py"
    source.write_text(blocks[0])
    spec = importlib.util.spec_from_file_location("plugin_docs_shop", source)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {source}")
    shop = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(shop)

    def fresh_shop(name: str) -> Any:
        app = shop.create_app(
            {
                "TESTING": True,
                "SQLALCHEMY_DATABASE_URI": f"sqlite:///{folder / f'plugin-{name}.sqlite3'}",
                "WTF_CSRF_ENABLED": False,
                "GATEWAY_PUBLIC_URL": "https://shop.example",
            }
        )
        with app.app_context():
            shop.db.create_all()
        return app

    def close_shop(app: Any) -> None:
        with app.app_context():
            shop.db.engine.dispose()

    pool = EmulatorPool(folder)
    times: dict[str, list[float]] = {"plain": [], "setup": [], "body": [], "teardown": [], "test": []}
    for index in range(args.plugin_rounds):
        plain_app, app = fresh_shop(f"plain-{index}"), fresh_shop(f"test-{index}")
        with plain_app.app_context():
            shop.db.session.add(shop.Order(reference="R-1", total_cents=49900))
            shop.db.session.commit()
        started = time.perf_counter()
        answer = plain_app.test_client().get("/orders/R-1")
        times["plain"].append(time.perf_counter() - started)
        if answer.status_code != 200:
            raise SystemExit(f"the shop's order page answered {answer.status}")

        started = time.perf_counter()
        gateway = GatewayEmulator.start(app, database_url=pool.database_url, pool=pool)
        set_up = time.perf_counter()
        with app.app_context():
            shop.db.session.add(shop.Order(reference="R-1", total_cents=49900))
            shop.db.session.commit()
        redirect = app.test_client().post("/orders/R-1/pay")
        gateway.pay(redirect)
        attempts = gateway.deliver()
        gateway.assert_fulfilled_once("R-1")
        with app.app_context():
            shipments = shop.db.session.execute(shop.db.select(shop.Order.shipments)).scalar_one()
        if (redirect.status_code, attempts, shipments) != (303, 1, 1):
            raise SystemExit(
                f"the plugin test did not pass: {redirect.status}, {attempts} callback(s), {shipments}"
            )
        body = time.perf_counter()
        gateway.close()
        ended = time.perf_counter()
        for key, seconds in (
            ("setup", set_up - started),
            ("body", body - set_up),
            ("teardown", ended - body),
            ("test", ended - started),
        ):
            times[key].append(seconds)
        close_shop(plain_app)
        close_shop(app)
    pool.close()
    shop.payment_confirmed.disconnect(shop.fulfil)
    ms = {key: round(statistics.median(values) * 1000, 1) for key, values in times.items()}
    first = round(times["test"][0] * 1000, 1)
    ratio = ms["test"] / ms["plain"]
    report(
        "7",
        "plugin test: create, pay, callback",
        f"{ms['plain']} ms",
        f"{ms['test']} ms",
        ratio,
        "< 50 ms",
        ms["test"] < 50,
    )
    print(
        f"[7] p50 over {args.plugin_rounds} tests: setup {ms['setup']} ms, body {ms['body']} ms, teardown "
        f"{ms['teardown']} ms; the session's first test (the pooled emulator built) {first} ms",
        flush=True,
    )
    results["figures"]["7_plugin_test"] = {
        "rounds": args.plugin_rounds,
        "p50_ms": ms,
        "first_test_ms": first,
        "ratio": round(ratio, 2),
        "target_ms": 50,
        "met": ms["test"] < 50,
    }
