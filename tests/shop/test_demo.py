"""``make demo`` (example_shop/demo.py): one data folder per port pair, so two demos never share an
installation; the banner names the other flow, not the one running; both merchant accounts (Stoep's and
the second brand's) are installed, each on its callback path."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from example_shop import demo
from tests.processes import WAIT_DEADLINE, free_port, log_tails, wait_for

ROOT = Path(__file__).resolve().parents[2]
#: The banner's last words: the demo prints it once both of its processes answer.
BANNER_END = "Press Ctrl-C to stop both."


def test_each_port_pair_has_its_own_data_folder() -> None:
    assert demo.data_folder(5000, 5050) != demo.data_folder(5001, 5051)
    assert demo.data_folder(5000, 5050) != demo.data_folder(5000, 5051)
    assert demo.data_folder(5000, 5050).name == "shop-5000-emulator-5050"


def test_the_banner_names_the_flow_running_and_how_to_run_the_other() -> None:
    v2 = demo.banner("http://127.0.0.1:5000", "http://127.0.0.1:5050", "v2", Path("/d"), "token-one")
    v1 = demo.banner("http://127.0.0.1:5001", "http://127.0.0.1:5051", "v1", Path("/d"), "token-two")
    assert "sign in with the control token token-one" in v2
    assert "API version:        v2 (DEMO_API_VERSION=v1 make demo runs the v1 flow)" in v2
    assert "API version:        v1 (make demo without DEMO_API_VERSION runs the v2 flow)" in v1
    assert "DEMO_API_VERSION=v1" not in v1  # the v1 demo does not tell you how to start the v1 demo
    assert "Merchant accounts:  demo-merchant (Stoep), demo-vuurhout (Vuurhout" in v2


def _installed_callback_urls(
    folder: Path, process: subprocess.Popen[bytes], log_path: Path
) -> dict[str, str]:
    """Each installed account's callback URL, once both of the demo's accounts are installed (the demo
    still running; on a machine busy with other tests, starting two demos at once takes a while)."""

    def both_installed() -> dict[str, str] | None:
        if process.poll() is not None:
            raise AssertionError(
                f"the demo exited with {process.returncode} before installing both accounts:"
                + log_tails([log_path], lines=60)
            )
        database = folder / "shop.sqlite3"
        if not database.exists():
            return None
        try:
            with sqlite3.connect(database, timeout=10) as connection:
                rows = connection.execute(
                    "SELECT merchant_account_id, callback_url FROM gateway_installations"
                ).fetchall()
        except sqlite3.OperationalError:  # the tables are being created
            return None
        return {str(account): str(url) for account, url in rows} if len(rows) >= 2 else None

    # Two demos of two processes each start at once: three times the usual last resort.
    found: dict[str, str] = wait_for(
        both_installed,
        timeout=3 * WAIT_DEADLINE,
        interval=0.3,
        what=f"both of the demo's accounts installed in {folder}",
        logs=[log_path],
    )
    return found


def test_two_demos_on_other_ports_each_install_their_own_shop(tmp_path: Path) -> None:
    """The v2 demo and a v1 demo side by side: each shop is installed with its own callback URL."""
    runs = []
    for api_version in ("v2", "v1"):
        shop_port, emulator_port = free_port(), free_port()
        env = {
            **os.environ,
            "DEMO_DATA_DIR": str(tmp_path),
            "DEMO_SHOP_PORT": str(shop_port),
            "DEMO_EMULATOR_PORT": str(emulator_port),
            "DEMO_API_VERSION": api_version,
        }
        log = (tmp_path / f"demo-{api_version}.log").open("wb")
        process = subprocess.Popen(
            [sys.executable, "-m", "example_shop.demo"], env=env, cwd=ROOT, stdout=log, stderr=log
        )
        runs.append((process, shop_port, emulator_port, log))
    try:
        for (process, shop_port, emulator_port, _log), api_version in zip(runs, ("v2", "v1"), strict=True):
            folder = tmp_path / demo.data_folder(shop_port, emulator_port).name  # DEMO_DATA_DIR
            # The shop's account on the callback path it always had; the second brand's on its own.
            log_path = tmp_path / f"demo-{api_version}.log"
            assert _installed_callback_urls(folder, process, log_path) == {
                "demo-merchant": f"http://127.0.0.1:{shop_port}/gateway/callback",
                "demo-vuurhout": f"http://127.0.0.1:{shop_port}/gateway/callback/demo-vuurhout",
            }
        for api_version in ("v2", "v1"):  # both running: their banners are printed
            log_path = tmp_path / f"demo-{api_version}.log"
            wait_for(
                lambda path=log_path: BANNER_END in path.read_text(errors="replace"),
                what=f"the banner's {BANNER_END!r}",
                logs=[log_path],
            )
    finally:
        for process, *_rest, log in runs:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=30)
            log.close()
    for api_version in ("v2", "v1"):
        output = (tmp_path / f"demo-{api_version}.log").read_text(errors="replace")
        assert "already installed" not in output
        assert f"API version:        {api_version}" in output
