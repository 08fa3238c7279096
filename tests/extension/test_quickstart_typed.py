"""docs/extension.md's quickstart typed top to bottom, the Flask-Migrate part included (issue 28, point 8).

A newcomer types the page in order: the quickstart (``init-db``, ``run``, the owner installs, a shopper
pays), then "The same tables with Flask-Migrate" in the same folder, on the database ``init-db`` made.
The page's files are saved to an empty folder and its console commands run there as written, each in a
subprocess with the project's virtualenv on ``PATH`` (it stands for the page's ``python -m venv`` and
``source .venv/bin/activate``; its ``pip install`` lines run with ``--no-index``, which pip answers
"already satisfied"). ``tests/docs/test_quickstart.py`` runs the same page from the built wheel, each part
on its own; this one runs them one after the other, as typed.

docs/migrations.md's "Tables created without migrations" (a database ``init-db`` made, its rows kept:
``flask db stamp head``) is typed the same way.
"""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests import secret_watch
from tests.docs.steps import Command, File, section, steps
from tests.docs.test_quickstart import quickstart, walk, with_flask_migrate
from tests.processes import free_port

DOCS = Path(__file__).resolve().parents[2] / "docs"
BIN = Path(sys.executable).parent

#: The page's virtualenv steps: the project's virtualenv stands for them.
VENV = ("python -m venv .venv", "source .venv/bin/activate")


class Newcomer:
    """A shell in an empty folder: files saved, commands typed, servers started in the background."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.env = {
            key: value
            for key, value in os.environ.items()
            if not key.startswith(("FLASK_", "GATEWAY_", "EMULATOR_", "PYTHON", "VIRTUAL_ENV"))
        }
        self.env.update(PATH=f"{BIN}{os.pathsep}{self.env.get('PATH', '')}", VIRTUAL_ENV=str(BIN.parent))
        self.log = folder.parent / f"{folder.name}-server.log"
        secret_watch.watch_file(self.log)
        self.server: subprocess.Popen[bytes] | None = None
        self.said: dict[str, str] = {}

    def type(self, step: File | Command) -> None:
        if isinstance(step, File):
            (self.folder / step.name).write_text(step.text, encoding="utf-8")
            return
        if step.line in VENV:
            return
        if step.is_server:
            self.start(step.argv)
            return
        argv = step.argv
        if argv[:2] == ["pip", "install"]:
            argv = [*argv, "--no-index"]  # installed already in the project's venv; nothing is fetched
        done = subprocess.run(
            argv, cwd=self.folder, env=self.env, capture_output=True, text=True, timeout=300
        )
        output = done.stdout + done.stderr
        assert done.returncode == 0, f"$ {step.line}\n{output}"
        if argv[:2] == ["pip", "install"]:
            assert "Requirement already satisfied" in output, output
        for line in step.output:
            assert line in output, f"$ {step.line}: the page shows {line!r}, the command said:\n{output}"
        self.said[step.line] = output

    def start(self, argv: list[str]) -> None:
        assert self.server is None
        self.env["FLASK_RUN_PORT"] = str(free_port())
        with self.log.open("ab") as out:
            self.server = subprocess.Popen(
                argv, cwd=self.folder, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.env['FLASK_RUN_PORT']}"

    def stop(self) -> None:
        """Ctrl+C, as the page says."""
        if self.server is not None:
            self.server.send_signal(signal.SIGINT)
            try:
                self.server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait(timeout=10)
            self.server = None

    def tables(self) -> set[str]:
        database = sqlite3.connect(self.folder / "instance" / "shop.db")
        try:
            return {
                name for (name,) in database.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
        finally:
            database.close()


@pytest.fixture
def newcomer(tmp_path: Path) -> Iterator[Newcomer]:
    folder = tmp_path / "newcomer"
    folder.mkdir()
    shell = Newcomer(folder)
    yield shell
    shell.stop()


def _migrate_text() -> str:
    page = (DOCS / "extension.md").read_text(encoding="utf-8")
    quick = section(page, "Quickstart: a paid order in one process")
    return quick.split("### The same tables with Flask-Migrate\n", 1)[1].split("\n### ", 1)[0]


def test_the_quickstart_typed_top_to_bottom_with_flask_migrate(newcomer: Newcomer) -> None:
    """init-db, the shop runs and takes a paid order; then the Flask-Migrate continuation, as written, on
    that database: the first migration creates every table, the second finds nothing new, the shop runs
    on the migrated database and takes a paid order again."""
    first = quickstart()
    lines = [s.line for s in first if isinstance(s, Command)]
    assert "flask --app shop init-db" in lines and lines[-1] == "flask --app shop run"
    for step in first:
        newcomer.type(step)
    assert newcomer.server is not None
    walk(newcomer.url, newcomer.server, newcomer.log)
    assert "gateway_installations" in newcomer.tables()  # init-db made them
    newcomer.stop()  # "stop the shop (Ctrl+C)"

    for step in with_flask_migrate():
        newcomer.type(step)

    # The first migration creates the shop's table and the gateway's: it was written against an empty
    # database (the rm), not the one init-db made (it would be empty, and the history never create them).
    [script] = (newcomer.folder / "migrations" / "versions").glob("*.py")
    written = script.read_text(encoding="utf-8")
    assert "op.create_table('orders'" in written
    assert "op.create_table('gateway_checkouts'" in written
    assert "op.create_table('gateway_installations'" in written
    assert "emulator_" not in written
    assert {"orders", "gateway_checkouts", "alembic_version"} <= newcomer.tables()
    text = _migrate_text()
    assert "**If you ran `init-db` above**" in text  # the page says what to do, and this test did it

    # What the page says of db init's output is what it prints.
    said = newcomer.said["flask --app manage db init"]
    quoted = re.search(
        r'"(Please edit\s+configuration/connection/logging settings in) (\.\.\./)(\S+) (.*?)"', text
    )
    assert quoted is not None, "the page quotes db init's last line"
    assert " ".join(quoted.group(1).split()) in said
    assert f"{newcomer.folder}/{quoted.group(3)} {quoted.group(4)}" in said, said

    # "Start the shop again with `flask --app manage run` ... and install the gateway as in step 1."
    assert "`flask --app manage run`" in text
    newcomer.start(["flask", "--app", "manage", "run"])
    assert newcomer.server is not None
    walk(newcomer.url, newcomer.server, newcomer.log)
    newcomer.stop()
    again = subprocess.run(
        ["flask", "--app", "manage", "db", "migrate", "-m", "after a day of trading"],
        cwd=newcomer.folder,
        env=newcomer.env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert again.returncode == 0, again.stdout + again.stderr
    assert "No changes in schema detected." in again.stdout + again.stderr
    assert len(list((newcomer.folder / "migrations" / "versions").glob("*.py"))) == 1


def test_the_continuation_without_the_rm_writes_no_script(newcomer: Newcomer) -> None:
    """Why the page deletes the database first: typed without the ``rm``, on the database init-db made,
    ``db migrate`` finds the tables there and writes nothing (the issue's report)."""
    for step in quickstart():
        if not (isinstance(step, Command) and step.is_server):
            newcomer.type(step)
    for step in with_flask_migrate():
        if isinstance(step, Command) and step.argv[:1] == ["rm"]:
            continue
        if isinstance(step, Command) and step.line.endswith('-m "orders and gateway tables"'):
            newcomer.type(Command(step.line, ("No changes in schema detected.",)))
            break
        newcomer.type(step)
    assert list((newcomer.folder / "migrations" / "versions").glob("*.py")) == []


def test_migrations_adopted_on_a_database_init_db_made_keep_its_rows(newcomer: Newcomer) -> None:
    """docs/migrations.md, "Tables created without migrations": the first script written against an empty
    database, the kept one stamped; its rows stay, and a later migrate finds nothing new."""
    for step in quickstart():
        if not (isinstance(step, Command) and step.is_server):
            newcomer.type(step)
    database = newcomer.folder / "instance" / "shop.db"
    with sqlite3.connect(database) as connection:
        connection.execute("INSERT INTO orders (reference, total_cents, paid) VALUES ('KEEP-1', 49900, 1)")
    connection.close()
    manage = next(s for s in with_flask_migrate() if isinstance(s, File))
    newcomer.type(manage)

    page = (DOCS / "migrations.md").read_text(encoding="utf-8")
    recipe = steps(section(page, "Tables created without migrations"))
    lines = [s.line for s in recipe if isinstance(s, Command)]
    assert "flask --app manage db stamp head" in lines
    for step in recipe:
        newcomer.type(step)

    [script] = (newcomer.folder / "migrations" / "versions").glob("*.py")
    revision = re.search(r"^revision = '([0-9a-f]+)'", script.read_text(encoding="utf-8"), flags=re.MULTILINE)
    assert revision is not None
    assert "op.create_table('gateway_checkouts'" in script.read_text(encoding="utf-8")
    with sqlite3.connect(database) as connection:
        kept = connection.execute("SELECT reference, paid FROM orders").fetchall()
        stamped = connection.execute("SELECT version_num FROM alembic_version").fetchall()
    connection.close()
    assert kept == [("KEEP-1", 1)]
    assert stamped == [(revision.group(1),)]
    assert not (newcomer.folder / "instance" / "shop.db.kept").exists()
