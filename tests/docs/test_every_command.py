"""Every ``flask gateway`` command in every environment the docs show (issue 36, point 2).

- The quickstart's own shop (docs/extension.md: the emulator embedded, SQLite), with its server stopped
  and with it running (``flask --app shop run``, the page's command, serving a paid order's shopper).
- The running demo (``make demo``: the emulator as a process of its own), through the environment file
  the demo writes and its banner names.

Each command is a real ``flask`` process. None may end in a traceback, wait on a lock it holds itself
("database is locked", the emulator's 503), or end without a clear exit status: 0, or the one its page
documents with one line saying why. The time a command takes is not asserted (issue 35): a command that
never ends fails at the last-resort deadline, naming itself.
"""

from __future__ import annotations

import os
import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from example_shop import demo
from tests import secret_watch
from tests.docs.browse import Browser
from tests.docs.steps import File
from tests.docs.test_quickstart import quickstart, walk
from tests.processes import WAIT_DEADLINE, free_port, log_tails, wait_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
#: A command that has not ended by then is stuck (a quiet machine runs each in about 2 s).
STUCK = 4 * WAIT_DEADLINE
#: What no command may print: a traceback, or a wait on a lock the command itself holds.
#: The emulator's account installed from the command line (its API key: GATEWAY_INSTALL_API_KEY).
INSTALL = ("install", "--account", "demo-merchant", "--minimum-cents", "100", "--maximum-cents", "1000000")
NEVER = ("Traceback (most recent call last)", "database is locked", "HTTP 503")


@dataclass(frozen=True)
class Run:
    words: tuple[str, ...]
    returncode: int
    output: str

    def says(self, text: str) -> bool:
        return text in self.output


def gateway(folder: Path, env: dict[str, str], *words: str, app: Sequence[str] = ("--app", "shop")) -> Run:
    """``flask <app> gateway <words>`` in ``folder``, stdin closed (a question gets no answer)."""
    argv = [str(BIN / "flask"), *app, "gateway", *words]
    try:
        done = subprocess.run(
            argv, cwd=folder, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=STUCK
        )
    except subprocess.TimeoutExpired as stuck:
        raise AssertionError(f"flask gateway {' '.join(words)} did not end within {STUCK:.0f} s") from stuck
    return Run(tuple(words), done.returncode, done.stdout + done.stderr)


def stop(server: subprocess.Popen[bytes]) -> None:
    """The server stopped, whatever it was doing (a loaded machine may take a while to end its threads):
    SIGTERM, then SIGKILL if it is still there at the last-resort deadline; never left running."""
    server.terminate()
    try:
        server.wait(timeout=STUCK)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(timeout=STUCK)


def clean_env() -> dict[str, str]:
    return {
        k: v for k, v in os.environ.items() if not k.startswith(("FLASK_", "GATEWAY_", "EMULATOR_", "SHOP_"))
    }


def problems(runs: Sequence[tuple[Run, set[int]]]) -> list[str]:
    """Each run that printed what no command may print, or ended with another status than allowed."""
    found = []
    for run, allowed in runs:
        command = "gateway " + " ".join(run.words)
        for never in NEVER:
            if run.says(never):
                found.append(f"{command}: printed {never!r}:\n{run.output[-1500:]}")
        if run.returncode not in allowed:
            found.append(
                f"{command}: exit {run.returncode}, expected one of {sorted(allowed)}:\n{run.output[-1500:]}"
            )
        if run.returncode != 0 and not re.search(
            r"^(Error|Not refunded|No answer)", run.output, re.MULTILINE
        ):
            found.append(f"{command}: exit {run.returncode} without a line saying why:\n{run.output[-1500:]}")
    return found


def every_command(
    folder: Path, env: dict[str, str], order: str, *, app: Sequence[str] = ("--app", "shop")
) -> list[str]:
    """Each command of ``flask gateway --help`` once (their read-only forms first), on a shop with a paid
    ``order`` (empty: a shop with no order)."""

    def run(*words: str) -> Run:
        return gateway(folder, env, *words, app=app)

    listed = run("--help")
    assert listed.returncode == 0, listed.output
    names = set(re.findall(r"^  ([a-z][a-z-]+)\s", listed.output.split("Commands:")[1], re.MULTILINE))
    runs: list[tuple[Run, set[int]]] = [
        (run("accounts"), {0}),
        (run("checkouts"), {0}),
        (run("callbacks"), {0}),
        (run("outbox"), {0}),
        (run("check-settings"), {0}),
        (run("reconcile", "--older-than", "0"), {0}),
        (run("deliver"), {0}),
        # Right after the scheduled commands: the doctor judges their last runs against bounds in minutes
        # (GATEWAY_DELIVER_STALE_SECONDS), and on a busy machine the commands before it take minutes.
        (run("doctor"), {0}),
        (run("init-db"), {0}),
        (run("prune-callbacks", "--older-than-days", "30"), {0}),
        (run("rotate-secrets"), {0}),  # nothing under an older key: changes none
        (run("redeliver", "999999"), {1}),  # no such event: one line
        (run(*INSTALL), {0, 1}),  # installed already: one line
        # The same key again (the quickstart's); the demo's accounts have other ids: one line.
        (run("set-api-key", "--account", "demo-merchant"), {0, 1}),
    ]
    if order:
        runs += [
            (run("status", order), {0}),
            (run("status", order.lower(), "--refresh"), {0}),  # in any case
            (run("refund", order, "1.00"), {1}),  # not confirmed: stdin gives no answer
            (run("refund", order, "1.00", "--yes"), {0}),
            (run("refund", order, "--all", "--yes", "--reason", "returned"), {0}),
            (run("refund", order, "--all", "--yes"), {1}),  # nothing left
            (run("replay-callback", "1"), {0}),
        ]
    else:
        runs += [
            (run("status", "NO-SUCH-ORDER"), {1}),
            (run("refund", "NO-SUCH-ORDER", "--all", "--yes"), {1}),
        ]
        runs += [(run("replay-callback", "999999"), {1})]
    ran = {r.words[0] for r, _ in runs}
    assert ran == names, f"commands not run: {sorted(names - ran)}; not listed: {sorted(ran - names)}"
    return problems(runs)


# --- the quickstart's shop ---------------------------------------------------------------------------------


def buy_and_pay(shop: str) -> str:
    """A shopper's order on the quickstart's shop, paid on the gateway's page; its reference."""
    shopper = Browser()
    order = shopper.submit(shopper.get(shop + "/"), "Buy")
    reference = re.search(r"Order ([0-9A-F]{8})", order.text)
    assert reference is not None, order.text
    paid = shopper.submit(shopper.submit(order, "Pay in 3 instalments"), "Pay")
    assert f"Order {reference.group(1)}: paid" in paid.text, paid.text
    return reference.group(1)


def paid_orders(folder: Path, env: dict[str, str]) -> list[str]:
    """The order references ``flask gateway checkouts`` lists."""
    listed = gateway(folder, env, "checkouts")
    assert listed.returncode == 0, listed.output
    return re.findall(r"\b([0-9A-F]{8})\b", listed.output)


@pytest.fixture
def quickstart_shop(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    folder = tmp_path / "shop"
    folder.mkdir()
    shop_py = next(s for s in quickstart() if isinstance(s, File))
    (folder / shop_py.name).write_text(shop_py.text, encoding="utf-8")
    env = {**clean_env(), "GATEWAY_INSTALL_API_KEY": "demo-api-key"}
    subprocess.run(
        [str(BIN / "flask"), "--app", "shop", "init-db"], cwd=folder, env=env, check=True, timeout=STUCK
    )
    return folder, env


def test_every_command_on_the_quickstarts_shop_running_and_stopped(
    quickstart_shop: tuple[Path, dict[str, str]], tmp_path: Path
) -> None:
    folder, env = quickstart_shop
    port = free_port()
    log = tmp_path / "flask-run.log"
    secret_watch.watch_file(log)
    with log.open("ab") as out:
        server = subprocess.Popen(
            [str(BIN / "flask"), "--app", "shop", "run", "--port", str(port)],
            cwd=folder,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        shop = f"http://127.0.0.1:{port}"
        walk(shop, server, log)  # the owner installs, a shopper buys and pays
        second = buy_and_pay(shop)  # for the commands run once the server has stopped
        first = next(ref for ref in paid_orders(folder, env) if ref != second)
        running = every_command(folder, env, first)
        assert running == [], "\n\n".join(running) + log_tails([log])
    finally:
        stop(server)
    stopped = every_command(folder, env, second)
    assert stopped == [], "\n\n".join(stopped)


# --- the demo ------------------------------------------------------------------------------------------------


@pytest.fixture
def running_demo(tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """``make demo`` on free ports, its data in ``tmp_path``; its shop's environment file, once it is up."""
    shop_port, emulator_port = free_port(), free_port()
    env = {
        **clean_env(),
        "DEMO_DATA_DIR": str(tmp_path),
        "DEMO_SHOP_PORT": str(shop_port),
        "DEMO_EMULATOR_PORT": str(emulator_port),
    }
    log_path = tmp_path / "demo.log"
    secret_watch.watch_file(log_path)
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "example_shop.demo"], env=env, cwd=ROOT, stdout=log, stderr=log
        )
    try:
        wait_for(
            lambda: (
                process.poll() is None
                and "Press Ctrl-C to stop both." in log_path.read_text(errors="replace")
            ),
            what="the demo's banner",
            logs=[log_path],
        )
        data = tmp_path / demo.data_folder(shop_port, emulator_port).name
        banner = log_path.read_text(errors="replace")
        assert demo.commands_line(data) in banner, banner
        yield data / demo.ENV_FILE, process
    finally:
        stop(process)  # SIGTERM: the demo stops both of its servers, as on Ctrl-C


def test_every_command_against_the_running_demo(running_demo: tuple[Path, subprocess.Popen[bytes]]) -> None:
    env_file, process = running_demo
    env = {**clean_env(), "GATEWAY_INSTALL_API_KEY": "demo-api-key"}
    found = every_command(ROOT, env, "", app=("--env-file", str(env_file), "--app", "example_shop"))
    assert process.poll() is None, "the demo stopped while the commands ran"
    assert found == [], "\n\n".join(found)


def test_a_command_waiting_on_the_shops_database_says_so_and_goes_on(
    quickstart_shop: tuple[Path, dict[str, str]],
) -> None:
    """Another process holds the quickstart's SQLite write lock (a server mid-write): a command that
    writes says it is waiting, on its own line, while it waits, and ends normally once the lock is free."""
    folder, env = quickstart_shop
    installed = gateway(folder, env, *INSTALL)
    assert installed.returncode == 0, installed.output
    holder = sqlite3.connect(folder / "instance" / "shop.db", isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    argv = [str(BIN / "flask"), "--app", "shop", "gateway", "prune-callbacks", "--older-than-days", "30"]
    command = subprocess.Popen(
        argv,
        cwd=folder,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    said: list[str] = []
    assert command.stderr is not None
    reader = threading.Thread(target=lambda: said.extend(command.stderr or []), daemon=True)
    reader.start()
    try:
        wait_for(
            lambda: (
                any(line.startswith("Waiting for the database (") for line in said)
                or command.poll() is not None
            ),
            what="the command's line saying it waits for the database",
        )
        assert command.poll() is None, "".join(said)  # said while it waits
    finally:
        holder.execute("COMMIT")
        holder.close()
    out, _ = command.communicate(timeout=STUCK)
    reader.join(timeout=STUCK)
    assert command.returncode == 0, out + "".join(said)
    assert "another process is writing to the SQLite file" in "".join(said)
    assert "Deleted" in out or "deleted" in out.lower(), out
