"""The emulator and the example shop as real processes, and a real Chromium driven by Playwright.

Each test leaves a screenshot of its last page in artifacts/e2e/ (git-ignored).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from example_shop.catalog import MAIN_BRAND, SECOND_BRAND
from example_shop.config import SHOP_ZONE
from tests import secret_watch
from tests.processes import Server, free_port, start_flask

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "e2e"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
OWNER_PASSWORD = "owner-password-for-tests"


@dataclass
class Stack:
    emulator: Server
    shop: Server
    #: The shop's own environment variables (beyond os.environ): run ``flask --app example_shop ...``
    #: commands (e.g. ``gateway reconcile``) against the same database and keys.
    shop_env: dict[str, str] = field(default_factory=dict)


def start_stack(
    tmp_path: Path,
    *,
    api_version: str = "v2",
    emulator_env: Mapping[str, str] | None = None,
    **shop_env: str,
) -> Stack:
    """The emulator, then the shop (tables, ``shop install``, server). ``emulator_env`` adds to the
    emulator's environment (e.g. ``EMULATOR_ACCOUNTS``); ``shop_env`` to the shop's."""
    emulator = start_flask(
        "emulator",
        "flask_gateway.emulator",
        {
            "EMULATOR_DATABASE_URL": f"sqlite:///{tmp_path / 'emulator.sqlite3'}",
            "EMULATOR_WAF": "allow-local",
            "EMULATOR_CALLBACK_RETRY_DELAYS": "0.5,0.5",
            "EMULATOR_SECRET_KEY": "emulator-secret-for-tests",
            # As make demo: the account carries the shop's name, the pages show the shop's zone.
            "EMULATOR_ACCOUNTS": f"demo-merchant:demo-api-key:{MAIN_BRAND}",
            "EMULATOR_TIMEZONE": SHOP_ZONE,
            **(emulator_env or {}),
        },
        tmp_path,
        ready_path="/_emulator/clock",
    )
    emulator_env = {
        "GATEWAY_ENVIRONMENT": "emulator",
        "GATEWAY_BASE_URL": emulator.url,
        "GATEWAY_INSTALL_URL": f"{emulator.url}/install",
        "GATEWAY_V1_BASE_URL": emulator.url,
        "GATEWAY_API_VERSION": api_version,
        # The emulator above accepts local return URLs (EMULATOR_WAF=allow-local): no firewall warning.
        "GATEWAY_WAF": "allow-local",
    }
    port = free_port()  # the shop must know its own public URL before it starts
    env = {
        **emulator_env,
        "GATEWAY_PUBLIC_URL": f"http://127.0.0.1:{port}",
        "SHOP_DATABASE_URL": f"sqlite:///{tmp_path / 'shop.sqlite3'}",
        "SHOP_SECRET_KEY": "shop-secret-for-tests",
        "SHOP_ADMIN_PASSWORD": OWNER_PASSWORD,
        **shop_env,
    }
    try:
        # As docs/example-shop.md has an operator do: the tables, the installation, then the server.
        for command in (("shop", "init-db"), ("shop", "install")):
            done = subprocess.run(
                [sys.executable, "-m", "flask", "--app", "example_shop", *command],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, (
                f"flask --app example_shop {' '.join(command)}:\n{done.stdout}{done.stderr}"
            )
        shop = start_flask("shop", "example_shop", env, tmp_path, port=port)
    except BaseException:
        emulator.stop()
        raise
    return Stack(emulator=emulator, shop=shop, shop_env=env)


@pytest.fixture
def stack(tmp_path: Path) -> Iterator[Stack]:
    running = start_stack(tmp_path)
    yield running
    running.shop.stop()
    running.emulator.stop()


@pytest.fixture
def stack_v1(tmp_path: Path) -> Iterator[Stack]:
    running = start_stack(tmp_path, api_version="v1")
    yield running
    running.shop.stop()
    running.emulator.stop()


#: The second brand's (Vuurhout's) merchant account in ``stack_two_accounts``: ``id:apikey``, known to the
#: emulator beside the shop's own (``demo-merchant:demo-api-key``, the shop's default settings).
SECOND_ACCOUNT = "e2e-vuurhout:e2e-vuurhout-api-key"


@pytest.fixture
def stack_two_accounts(tmp_path: Path) -> Iterator[Stack]:
    """The shop selling its second brand on a merchant account of its own (docs/example-shop.md, "Two
    brands, two merchant accounts"): the emulator knows both accounts, ``shop install`` installs both."""
    if secret_watch.active is not None:  # its API key must never show in the servers' logs either
        secret_watch.active.record_secret(SECOND_ACCOUNT.split(":", 1)[1])
    running = start_stack(
        tmp_path,
        emulator_env={
            "EMULATOR_ACCOUNTS": f"demo-merchant:demo-api-key:{MAIN_BRAND},{SECOND_ACCOUNT}:{SECOND_BRAND}"
        },
        SHOP_SECOND_ACCOUNT=SECOND_ACCOUNT,
    )
    yield running
    running.shop.stop()
    running.emulator.stop()


#: How long an ``expect(...)`` waits for what it expects (Playwright's default is 5 s): a last resort, not a
#: measure. On a loaded 2-core machine a page the owner opens can take longer than 5 s, and a test must not
#: fail because the machine is busy (issue 35); a quiet machine shows each of these within a second.
EXPECT_MS = 30_000


@pytest.fixture(scope="session")
def browser():  # type: ignore[no-untyped-def]
    playwright_api = pytest.importorskip("playwright.sync_api")
    playwright_api.expect.set_options(timeout=EXPECT_MS)
    if not Path(CHROMIUM).exists():
        pytest.fail(f"chromium is missing ({CHROMIUM}): run scripts/ensure-system-packages (make test does)")
    with playwright_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


@pytest.fixture
def page(browser, request):  # type: ignore[no-untyped-def]
    context = browser.new_context(viewport={"width": 1200, "height": 900})
    context.set_default_timeout(15_000)
    opened = context.new_page()
    yield opened
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", request.node.name)
    try:
        opened.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)
    finally:
        context.close()
