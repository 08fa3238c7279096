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
    fresh shop of the same kind (its order page), interleaved with the test round by round.

    Two variants alternate round by round, each on a fresh shop: the docs' conftest as it is (figure 7,
    the shop's SQLite file with SQLite's default journal and flushes), and the same with the plugin's
    ``gateway_sqlite_no_fsync = true`` (7b: the shop's commits without fsync)."""
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

    def one_test(app: Any, *, no_fsync: bool) -> tuple[float, float, float]:
        """The docs' first test on ``app``: its setup, body and teardown, in seconds."""
        started = time.perf_counter()
        gateway = GatewayEmulator.start(
            app, database_url=pool.database_url, pool=pool, sqlite_no_fsync=no_fsync
        )
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
        return set_up - started, body - set_up, ended - body

    pool = EmulatorPool(folder)
    variants = ("", "no_fsync")  # the docs' conftest as it is; the same with gateway_sqlite_no_fsync = true
    times: dict[str, dict[str, list[float]]] = {
        variant: {"setup": [], "body": [], "teardown": [], "test": []} for variant in variants
    }
    plain: list[float] = []
    for index in range(args.plugin_rounds):
        plain_app = fresh_shop(f"plain-{index}")
        with plain_app.app_context():
            shop.db.session.add(shop.Order(reference="R-1", total_cents=49900))
            shop.db.session.commit()
        started = time.perf_counter()
        answer = plain_app.test_client().get("/orders/R-1")
        plain.append(time.perf_counter() - started)
        if answer.status_code != 200:
            raise SystemExit(f"the shop's order page answered {answer.status}")
        close_shop(plain_app)
        # The two variants alternate which goes first, each on a fresh shop (built untimed).
        for variant in variants if index % 2 == 0 else variants[::-1]:
            app = fresh_shop(f"test{variant}-{index}")
            steps = one_test(app, no_fsync=variant == "no_fsync")
            for key, seconds in zip(("setup", "body", "teardown", "test"), (*steps, sum(steps)), strict=True):
                times[variant][key].append(seconds)
            close_shop(app)
    pool.close()
    shop.payment_confirmed.disconnect(shop.fulfil)
    plain_ms = round(statistics.median(plain) * 1000, 1)
    for variant in variants:
        ms = {key: round(statistics.median(values) * 1000, 1) for key, values in times[variant].items()}
        first = round(times[variant]["test"][0] * 1000, 1)
        ratio = ms["test"] / plain_ms
        key, name = ("7", "plugin test: create, pay, callback")
        if variant:
            key, name = "7b", "the same, gateway_sqlite_no_fsync"
        report(key, name, f"{plain_ms} ms", f"{ms['test']} ms", ratio, "< 50 ms", ms["test"] < 50)
        print(
            f"[{key}] p50 over {args.plugin_rounds} tests: setup {ms['setup']} ms, body {ms['body']} ms, "
            f"teardown {ms['teardown']} ms; the first test {first} ms"
            + ("" if variant else " (the session's first: the pooled emulator built)"),
            flush=True,
        )
        results["figures"]["7_plugin_test" + (f"_{variant}" if variant else "")] = {
            "rounds": args.plugin_rounds,
            "p50_ms": {**ms, "plain": plain_ms},
            "first_test_ms": first,
            "ratio": round(ratio, 2),
            "target_ms": 50,
            "met": ms["test"] < 50,
        }
