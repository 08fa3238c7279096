"""docs/extension.md's quickstart, followed as a newcomer would: from an empty folder to a paid order.

The page's files are saved to an empty folder and its commands typed into a shell there, in order, in a
fresh virtualenv holding only the wheel built from the sdist (``wheel_venv``: the page's ``python -m venv``
and ``source .venv/bin/activate`` steps; its ``pip install flask-bnpl-gateway`` runs there with ``--no-index``,
which pip answers "already satisfied" only when the page names the installed wheel); the server the page
starts runs in the background (on a free port: ``FLASK_RUN_PORT``, as ``flask run`` reads it). Then the page's walk: the
owner signs in and installs, a shopper buys and pays on the gateway's page, the order says paid. Nothing
the page does not show is done, and nothing of the repository is on the path.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flask_gateway._version import DISTRIBUTION
from tests import secret_watch
from tests.docs.browse import Browser
from tests.docs.steps import Command, File, section, steps
from tests.processes import WAIT_DEADLINE, free_port, wait_for

DOCS = Path(__file__).resolve().parents[2] / "docs"

#: The page's setup steps that ``wheel_venv`` has done already (a fresh venv with the built wheel).
VENV_STEPS = ("python -m venv .venv", "source .venv/bin/activate", "pip install flask-bnpl-gateway")


def _quickstart_page() -> list[str]:
    """The quickstart's own text, then each of its ``###`` subsections."""
    page = (DOCS / "extension.md").read_text(encoding="utf-8")
    return section(page, "Quickstart: a paid order in one process").split("\n### ")


def quickstart() -> list[File | Command]:
    return steps(_quickstart_page()[0])


def with_flask_migrate() -> list[File | Command]:
    """ "The same tables with Flask-Migrate": the steps that replace ``init-db``."""
    [subsection] = [s for s in _quickstart_page()[1:] if s.startswith("The same tables with Flask-Migrate")]
    return steps(subsection)


def test_the_quickstart_has_the_steps_this_test_follows() -> None:
    found = quickstart()
    assert [s.name for s in found if isinstance(s, File)] == ["shop.py"]
    commands = [s.line for s in found if isinstance(s, Command)]
    assert tuple(commands[:3]) == VENV_STEPS
    assert commands[3:] == ["flask --app shop init-db", "flask --app shop run"]


@pytest.fixture
def newcomer(tmp_path: Path, wheel_venv: Path) -> Iterator[dict[str, object]]:
    folder = tmp_path / "newcomer"
    folder.mkdir()
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("FLASK_", "GATEWAY_", "EMULATOR_", "PYTHON", "VIRTUAL_ENV"))
    }
    env.update(PATH=f"{wheel_venv}{os.pathsep}{env.get('PATH', '')}", VIRTUAL_ENV=str(wheel_venv.parent))
    env["FLASK_RUN_PORT"] = str(free_port())
    servers: list[subprocess.Popen[bytes]] = []
    state: dict[str, object] = {"folder": folder, "env": env, "servers": servers}
    yield state
    for server in servers:
        server.terminate()
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(timeout=10)


def test_a_newcomer_takes_a_paid_order_in_one_process(
    newcomer: dict[str, object], flask_gateway_wheel: Path
) -> None:
    folder: Path = newcomer["folder"]  # type: ignore[assignment]
    env: dict[str, str] = newcomer["env"]  # type: ignore[assignment]
    servers: list[subprocess.Popen[bytes]] = newcomer["servers"]  # type: ignore[assignment]
    assert list(folder.iterdir()) == []
    log = folder.parent / "server.log"
    secret_watch.watch_file(log)

    for step in quickstart():
        if isinstance(step, File):
            (folder / step.name).write_text(step.text, encoding="utf-8")
        elif step.line == VENV_STEPS[-1]:
            # wheel_venv installed the wheel; the page's command, without the index, finds it installed.
            argv = [*step.argv, "--no-index"]
            done = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"$ {step.line}\n{done.stdout}\n{done.stderr}"
            assert f"Requirement already satisfied: {DISTRIBUTION}" in done.stdout, done.stdout
            assert installed_from(env) == flask_gateway_wheel.as_uri()
        elif step.line in VENV_STEPS:
            continue  # done by wheel_venv: a fresh virtualenv with the wheel installed
        elif step.is_server:
            with log.open("ab") as out:
                servers.append(
                    subprocess.Popen(step.argv, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
                )
        else:
            done = subprocess.run(step.argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120)
            assert done.returncode == 0, f"$ {step.line}\n{done.stdout}\n{done.stderr}"

    walk(f"http://127.0.0.1:{env['FLASK_RUN_PORT']}", servers[0], log)


def installed_from(env: dict[str, str]) -> str:
    """Where the newcomer's venv got the distribution from (pip's ``direct_url.json``): the wheel's URL."""
    python = Path(env["VIRTUAL_ENV"]) / "bin" / "python"
    code = (
        "import importlib.metadata as m, json\n"
        f"print(json.loads(m.distribution({DISTRIBUTION!r}).read_text('direct_url.json'))['url'])"
    )
    return subprocess.run(
        [str(python), "-I", "-c", code], env=env, capture_output=True, text=True, check=True, timeout=60
    ).stdout.strip()


def test_the_quickstarts_shop_under_one_sync_worker_never_waits_for_itself(tmp_path: Path) -> None:
    """One process handling one request at a time (gunicorn, one sync worker): the shop's calls to the
    embedded gateway, and the gateway's callbacks to the shop, go in-process, never over its own socket."""
    folder = tmp_path / "shop"
    folder.mkdir()
    shop_py = next(s for s in quickstart() if isinstance(s, File))
    (folder / shop_py.name).write_text(shop_py.text, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FLASK_", "GATEWAY_", "EMULATOR_"))}
    bin_dir = Path(sys.executable).parent
    subprocess.run([str(bin_dir / "flask"), "--app", "shop", "init-db"], cwd=folder, env=env, check=True)
    port = free_port()
    log = tmp_path / "gunicorn.log"
    secret_watch.watch_file(log)
    command = [str(bin_dir / "gunicorn"), "--workers", "1", "--worker-class", "sync", "--threads", "1"]
    command += ["--bind", f"127.0.0.1:{port}", "--timeout", "20", "shop:create_app()"]
    with log.open("ab") as out:
        server = subprocess.Popen(command, cwd=folder, env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        walk(f"http://127.0.0.1:{port}", server, log)
    finally:
        server.terminate()
        server.wait(timeout=20)


def walk(shop: str, server: subprocess.Popen[bytes], log: Path) -> None:
    """The page's walk in a browser (the owner installs, a shopper buys and pays), up to the paid order
    page and the gateway's callback; ``log`` is the server's, shown if a wait fails."""
    browser = Browser()

    def up() -> bool:
        assert server.poll() is None, log.read_text(errors="replace")
        try:
            return browser.get(shop + "/").status == 200
        except OSError:
            return False

    wait_for(up, timeout=2 * WAIT_DEADLINE, what="the shop to answer", logs=[log])

    # 1. The owner signs in and installs the gateway with the emulator's account.
    install = browser.submit(browser.get(shop + "/login"), "Sign in", password="owner")
    assert install.url == shop + "/gateway/admin/install", install.text[:500]
    installed = browser.submit(
        install,
        "Install",
        merchant_account_id="demo-merchant",
        api_key="demo-api-key",
        minimum_amount="1.00",
        maximum_amount="10000.00",
    )
    assert installed.status == 200, installed.text[:2000]
    assert "installed" in installed.text.lower(), installed.text[:2000]

    # 2. A shopper buys, and pays on the gateway's page (the embedded emulator, on the shop's address).
    shopper = Browser()
    order = shopper.submit(shopper.get(shop + "/"), "Buy")
    assert "awaiting payment" in order.text, order.text
    payment_page = shopper.submit(order, "Pay in 3 instalments")
    assert payment_page.url.startswith(shop + "/_gateway/api/v2/app/checkout/v2.demo-merchant."), (
        payment_page.url
    )
    assert "R 499.00" in payment_page.text
    back = shopper.submit(payment_page, "Pay")

    # 3. Back on the order page: paid.
    reference = re.search(r"Order ([0-9A-F]{8})", order.text)
    assert reference is not None
    assert back.url == f"{shop}/orders/{reference.group(1)}", back.url
    assert f"Order {reference.group(1)}: paid" in back.text, back.text

    # The gateway's signed callback arrives too (the emulator's worker, in-process), verified and confirmed,
    # and pays nothing twice: the order was paid already, so it is "already recorded" or the first record.
    def callback_outcomes() -> list[str] | None:
        page = browser.get(shop + "/gateway/admin/callbacks")
        found = re.findall(r'data-callback-outcome="([a-z-]+)"', page.text)
        # "received": stored and still being processed (the emulator's worker thread, in-process): not yet.
        return found if found and "received" not in found else None

    outcomes = wait_for(callback_outcomes, what="the gateway's callback", logs=[log])
    assert outcomes in (["duplicate"], ["accepted"]), outcomes


def test_the_quickstarts_tables_with_flask_migrate(newcomer: dict[str, object]) -> None:
    """The quickstart's shop with the page's Flask-Migrate steps instead of ``init-db``: one migration for
    the shop's and the gateway's tables that runs as written, and a second ``migrate`` that finds nothing new
    (the output the page shows); once the embedded emulator has made its own tables (on first use), a
    migrate still leaves them alone."""
    folder: Path = newcomer["folder"]  # type: ignore[assignment]
    env: dict[str, str] = newcomer["env"]  # type: ignore[assignment]
    shop_py = next(s for s in quickstart() if isinstance(s, File))
    (folder / shop_py.name).write_text(shop_py.text, encoding="utf-8")
    migrate_steps = with_flask_migrate()
    assert [s.name for s in migrate_steps if isinstance(s, File)] == ["manage.py"]
    ran = []
    for step in migrate_steps:
        if isinstance(step, File):
            (folder / step.name).write_text(step.text, encoding="utf-8")
            continue
        done = subprocess.run(step.argv, cwd=folder, env=env, capture_output=True, text=True, timeout=300)
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"$ {step.line}\n{output}"
        for line in step.output:
            assert line in output, f"$ {step.line}: the page shows {line!r}, the command said:\n{output}"
        ran.append(step.line)
    assert ran[-1] == 'flask --app manage db migrate -m "nothing new"'

    [script] = (folder / "migrations" / "versions").glob("*.py")
    text = script.read_text(encoding="utf-8")
    assert "op.create_table('orders'" in text
    assert "op.create_table('gateway_checkouts'" in text
    assert "emulator_" not in text  # the embedded emulator's tables are not the shop's to create or drop
    assert "flask_gateway" not in text  # nothing to import: sa.DateTime(timezone=True)
    assert {"orders", "gateway_checkouts", "gateway_installations", "alembic_version"} <= _tables(folder)

    # Then the shop runs: the embedded emulator makes its own tables on first use, in the same database
    # (here at once, as its first request would). A later migrate leaves them alone: nothing new.
    python = Path(env["VIRTUAL_ENV"]) / "bin" / "python"
    first_use = (
        "import sys; sys.path.insert(0, '.')\n"
        "from flask_gateway.emulator import embedded_emulator, prepare_database\n"
        "from manage import app\n"
        "prepare_database(embedded_emulator(app).app)\n"
    )
    subprocess.run([str(python), "-c", first_use], cwd=folder, env=env, check=True, timeout=120)
    assert "emulator_checkouts" in _tables(folder)  # the embedded emulator's own, beside the shop's
    again = subprocess.run(
        ["flask", "--app", "manage", "db", "migrate", "-m", "again"],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "No changes in schema detected." in again.stdout + again.stderr
    assert "emulator_checkouts" in _tables(folder)  # untouched


def _tables(folder: Path) -> set[str]:
    database = sqlite3.connect(folder / "instance" / "shop.db")
    try:
        return {name for (name,) in database.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    finally:
        database.close()
