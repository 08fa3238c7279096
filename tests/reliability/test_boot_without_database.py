"""Workers booting while the database is away (issue 23), in a module of its own: it gets a PostgreSQL
cluster of its own (``durable_cluster`` is per module), so the fault run's restarts in test_faults.py never
share one with it.

Everything is waited for as an event: each worker's "app loaded" line (``tests.reliability.APP_LOADED``: a
worker that cannot boot never writes it), the master's replacement of a killed worker, a shopper page
served, the shop ready. How long the shop takes to serve and to turn ready after PostgreSQL starts is
``benchmarks/figure_recovery.py``'s figure (``boot_scenario`` returns it), not an assertion here.

Readiness needs the installation, and the shop installs on first use (``SHOP_AUTO_INSTALL``): on a shopper
request, never on a probe (``example_shop.setup.install_on_first_use``). A worker whose attempt met the
outage (or a gateway that did not answer yet) tries again on a request at least ``RETRY_SECONDS`` (10 s)
later. So the wait for readiness sends a shopper page before each probe, as a shop's traffic would.
"""

from __future__ import annotations

import os
import re
import signal
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import requests

from tests.conftest import fetch_all
from tests.postgres import PostgresCluster
from tests.processes import wait_for
from tests.reliability import APP_LOADED
from tests.reliability.conftest import Stack, init_shop_database
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

_LOADED = re.compile(rf"^{re.escape(APP_LOADED)} (\d+)$", re.M)


@dataclass(frozen=True)
class BootFigures:
    """Seconds from PostgreSQL's start to the shop serving a shopper page, and to its readyz answering 200
    (reported; ``benchmarks/figure_recovery.py`` holds them against their targets)."""

    serving: float
    ready: float


def test_boot_while_the_database_is_away(
    cluster: PostgresCluster,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    report: Callable[[str], None],
) -> None:
    boot_scenario(cluster, tmp_path, report)


def loaded(stack: Stack) -> set[int]:
    """The shop's processes that have built the app (their line in the shop's log)."""
    return {int(pid) for pid in _LOADED.findall(stack.logs()["shop"])}


def shop_page(stack: Stack) -> int | None:
    """A shopper's product page (it installs the shop on first use): its status, None for no answer."""
    try:
        return requests.get(f"{stack.shop.url}/products/enamel-kettle", timeout=30).status_code
    except requests.RequestException:
        return None


def ready_after_shopping(stack: Stack) -> bool:
    """A shopper page (traffic that installs the shop on first use), then the probe: ready?"""
    shop_page(stack)
    try:
        return requests.get(f"{stack.shop.url}/gateway/readyz", timeout=30).status_code == 200
    except requests.RequestException:
        return False


def boot_scenario(database: PostgresCluster, folder: Path, report: Callable[[str], None]) -> BootFigures:
    """Both servers started while PostgreSQL is stopped, a worker killed meanwhile, then PostgreSQL started:
    every check of the test; returns how long the shop took to serve and to turn ready."""
    marks = folder / "callback-marks"
    marks.mkdir()
    plan = fault_plan(database, marks)
    init_shop_database(plan)  # the deployment's step ran earlier; then the database went away
    database.stop_server("fast")
    with running(plan, folder, database) as stack:
        servers = [stack.shop, stack.emulator]
        shop_master, emulator_master = int(stack.shop.process.pid), int(stack.emulator.process.pid)
        # Every worker built the app without its database (one that could not would have stopped the master).
        booted = wait_for(
            lambda: (
                len(workers := workers_of(stack.shop.process)) == SHOP_WORKERS
                and set(workers) <= loaded(stack)
                and workers
            ),
            what=f"the shop's {SHOP_WORKERS} workers to load the app",
            logs=servers,
        )
        assert stack.shop.process.poll() is None, stack.shop.log_tail()

        livez = requests.get(f"{stack.shop.url}/gateway/livez", timeout=30)
        assert livez.status_code == 200, livez.text
        assert requests.get(f"{stack.emulator.url}/livez", timeout=30).status_code == 200
        away = {
            "shop /products": requests.get(f"{stack.shop.url}/products/enamel-kettle", timeout=30),
            "shop /gateway/readyz": requests.get(f"{stack.shop.url}/gateway/readyz", timeout=30),
            "emulator /readyz": requests.get(f"{stack.emulator.url}/readyz", timeout=30),
        }
        for what, answer in away.items():
            assert answer.status_code == 503 and answer.headers.get("Retry-After"), (what, answer.status_code)
        page = away["shop /products"]
        assert "Traceback" not in page.text and "right back" in page.text.lower(), page.text[:500]

        # A worker recycled while the database is still away: the master boots another one, which loads
        # the app, and stays.
        victim = booted[0]
        os.kill(victim, signal.SIGKILL)
        replaced = wait_for(
            lambda: (
                len(workers := workers_of(stack.shop.process)) == SHOP_WORKERS
                and victim not in workers
                and set(workers) <= loaded(stack)
                and workers
            ),
            what="the master to replace the killed worker with one that loads the app",
            logs=servers,
        )
        assert stack.shop.process.poll() is None and stack.emulator.process.poll() is None

        # The database returns: the shop serves and turns ready, installed on first use, no restart.
        database.start_server()
        back = time.monotonic()
        wait_for(lambda: shop_page(stack) == 200, interval=0.05, what="a shopper page", logs=servers)
        serving = time.monotonic() - back
        wait_for(
            lambda: ready_after_shopping(stack),
            interval=0.1,
            what="the shop's readiness (installed on first use by a shopper page)",
            logs=servers,
        )
        readied = time.monotonic() - back
        purchase = Purchase(0, "enamel-kettle", come_back=True)
        exchanges = Exchanges(servers={stack.shop.url: "shop", stack.emulator.url: "emulator"})
        shop(purchase, exchanges, stack, lambda _p: None)
        wait_for(
            lambda: fetch_all(
                stack.shop_db, "SELECT o.status FROM shop_orders o JOIN gateway_checkouts c "
                "ON c.order_reference = o.reference WHERE c.token = :t", t=purchase.token,
            ) == [("paid",)],
            what="the order paid",
            logs=servers,
        )  # fmt: skip
        assert int(stack.shop.process.pid) == shop_master and stack.shop.process.poll() is None
        assert int(stack.emulator.process.pid) == emulator_master and stack.emulator.process.poll() is None
        logs = stack.logs()
        for name, text in logs.items():
            for bad in ("Worker failed to boot", "Shutting down: Master", "exited with code"):
                assert bad not in text, f"{name}: {bad!r}\n{text[-3000:]}"
        report(
            f"boot while the database is away: {SHOP_WORKERS} shop workers loaded the app "
            f"({logs['emulator'].count('Booting worker')} emulator workers booted), livez 200, shopper page "
            f"and readyz 503 with Retry-After {page.headers['Retry-After']} s; a worker SIGKILLed meanwhile "
            f"was replaced (pids {sorted(booted)} -> {sorted(replaced)}); after PostgreSQL started: a "
            f"shopper page served in {serving:.2f} s, readyz 200 in {readied:.2f} s, an order paid; same "
            f"masters (HTTP {dict(Counter(e.status for e in exchanges.items))})"
        )
    return BootFigures(serving=serving, ready=readied)
