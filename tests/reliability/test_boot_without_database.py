"""Workers booting while the database is away (issue 23), in a module of its own: it gets a PostgreSQL
cluster of its own (``durable_cluster`` is per module), so the fault run's restarts in test_faults.py never
share one with it (run after them on the same cluster, its readiness could miss the 30 s bound)."""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest
import requests

from tests.conftest import fetch_all
from tests.postgres import PostgresCluster
from tests.processes import wait_for
from tests.reliability.conftest import init_shop_database
from tests.reliability.test_faults import (  # noqa: F401 (the fixtures, registered in this module)
    SHOP_WORKERS,
    Exchanges,
    Purchase,
    cluster,
    durable_cluster,
    fault_plan,
    running,
    shop,
    workers_of,
)

# It starts servers and stops and starts its cluster: on the faults worker, after or before the others.
pytestmark = pytest.mark.xdist_group("faults")


def test_boot_while_the_database_is_away(
    cluster: PostgresCluster,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    report: Callable[[str], None],
) -> None:
    marks = tmp_path / "callback-marks"
    marks.mkdir()
    plan = fault_plan(cluster, marks)
    init_shop_database(plan)  # the deployment's step ran earlier; then the database went away
    cluster.stop_server("fast")
    with running(plan, tmp_path, cluster) as stack:
        shop_master, emulator_master = int(stack.shop.process.pid), int(stack.emulator.process.pid)
        wait_for(
            lambda: stack.logs()["shop"].count("Booting worker") >= SHOP_WORKERS,
            timeout=30,
            what="the shop's workers to boot",
        )
        time.sleep(1)  # a worker that fails to boot exits at once: give it the time
        assert len(workers_of(stack.shop.process)) == SHOP_WORKERS, stack.shop.log_tail()

        livez = requests.get(f"{stack.shop.url}/gateway/livez", timeout=10)
        assert livez.status_code == 200, livez.text
        assert requests.get(f"{stack.emulator.url}/livez", timeout=10).status_code == 200
        away = {
            "shop /products": requests.get(f"{stack.shop.url}/products/enamel-kettle", timeout=10),
            "shop /gateway/readyz": requests.get(f"{stack.shop.url}/gateway/readyz", timeout=10),
            "emulator /readyz": requests.get(f"{stack.emulator.url}/readyz", timeout=10),
        }
        for what, answer in away.items():
            assert answer.status_code == 503 and answer.headers.get("Retry-After"), (what, answer.status_code)
        page = away["shop /products"]
        assert "Traceback" not in page.text and "right back" in page.text.lower(), page.text[:500]

        # A worker recycled while the database is still away: the master boots another one, and stays.
        victim = workers_of(stack.shop.process)[0]
        os.kill(victim, signal.SIGKILL)
        wait_for(
            lambda: (
                len(workers_of(stack.shop.process)) == SHOP_WORKERS
                and victim not in workers_of(stack.shop.process)
            ),
            timeout=30,
            what="the master to replace the killed worker",
        )
        wait_for(
            lambda: stack.logs()["shop"].count("Booting worker") >= SHOP_WORKERS + 1,
            timeout=30,
            what="the replacement to boot",
        )
        time.sleep(1)
        assert stack.shop.process.poll() is None and stack.emulator.process.poll() is None
        assert len(workers_of(stack.shop.process)) == SHOP_WORKERS

        # The database returns: the shop serves within seconds, installed on first use, no restart.
        cluster.start_server()
        back = time.monotonic()
        serving = wait_for(
            lambda: (
                requests.get(f"{stack.shop.url}/products/enamel-kettle", timeout=10).status_code == 200
                and time.monotonic()
            ),
            timeout=15,
            interval=0.05,
            what="a shopper page",
        )
        readied = wait_for(
            lambda: (
                requests.get(f"{stack.shop.url}/gateway/readyz", timeout=10).status_code == 200
                and time.monotonic()
            ),
            timeout=30,
            interval=0.1,
            what="the shop's readiness (installed on first use)",
        )
        purchase = Purchase(0, "enamel-kettle", come_back=True)
        exchanges = Exchanges(servers={stack.shop.url: "shop", stack.emulator.url: "emulator"})
        shop(purchase, exchanges, stack, lambda _p: None)
        wait_for(
            lambda: fetch_all(
                stack.shop_db, "SELECT o.status FROM shop_orders o JOIN gateway_checkouts c "
                "ON c.order_reference = o.reference WHERE c.token = :t", t=purchase.token,
            ) == [("paid",)],
            timeout=30,
            what="the order paid",
        )  # fmt: skip
        assert int(stack.shop.process.pid) == shop_master and stack.shop.process.poll() is None
        assert int(stack.emulator.process.pid) == emulator_master and stack.emulator.process.poll() is None
        logs = stack.logs()
        for name, text in logs.items():
            for bad in ("Worker failed to boot", "Shutting down: Master", "exited with code"):
                assert bad not in text, f"{name}: {bad!r}\n{text[-3000:]}"
        report(
            f"boot while the database is away: {SHOP_WORKERS} shop workers and {logs['emulator'].count('Booting worker')} "
            f"emulator workers booted, livez 200, shopper page and readyz 503 with Retry-After "
            f"{page.headers['Retry-After']} s; a worker SIGKILLed meanwhile was replaced; after PostgreSQL started: "
            f"a shopper page served in {serving - back:.2f} s, readyz 200 in {readied - back:.2f} s, an order "
            f"paid; same masters (HTTP {dict(Counter(e.status for e in exchanges.items))})"
        )
