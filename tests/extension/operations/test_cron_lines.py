"""Every documented cron line, run as written, in an environment as bare as cron's; every systemd unit that
runs ``flask`` or ``celery`` loads the shop's environment file.

Each line of each ```cron block of ``docs/*.md`` is run with ``/bin/sh -c`` and only its paths rewritten:
``/srv/shop`` is a temporary project folder (``.venv`` a link to the virtualenv running the tests,
``myshop/`` the app factory of docs/operations.md as written there, ``example_shop`` a link to the example
shop), and ``/etc/shop/environment`` a temporary environment file. The environment is cron's: ``PATH=/usr/bin:/bin``,
``HOME``, ``SHELL``, ``LOGNAME`` and nothing of this process.

- With a correct environment file (the shop's database, the gateway installed on its embedded emulator)
  each line exits 0 and did its work: ``reconcile`` polled a due checkout whose callback was lost,
  ``deliver`` delivered a due event, ``prune-callbacks`` deleted an old log row, ``doctor`` and
  ``check-settings`` found nothing wrong.
- With the file missing, each exits non-zero with Flask's own error about ``--env-file``; with a file that
  names a database where nothing is installed, each exits non-zero: 78 (``EX_CONFIG``) from the command,
  or 1 from the doctor, which reports it.

Run with ``-s`` to see each line and its exit status (the issue's closing note quotes them).
"""

from __future__ import annotations

import importlib.util
import re
import secrets
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import func, select, update

from flask_gateway import create_checkout
from flask_gateway.core.timestamps import utcnow
from flask_gateway.emulator import embedded_emulator
from flask_gateway.emulator.delivery import _WORKER_KEY
from flask_gateway.models import CallbackLog, GatewayCheckout, OutboxEvent, OutboxState
from flask_gateway.operations.cli import ENVIRONMENT_FILE, EXIT_CONFIGURATION
from flask_gateway.signals import payment_confirmed
from flask_gateway.state import get_state
from flask_gateway.testing import GatewayEmulator
from tests.conftest import Databases, dispose_engines
from tests.extension.conftest import sample_order
from tests.extension.operations.cli_support import run_gateway
from tests.processes import wait_for

ROOT = Path(__file__).resolve().parents[3]
DOCS = ROOT / "docs"
OPERATIONS = DOCS / "operations.md"  # the app factory the lines run (its block is marked as tested here)
PROJECT = "/srv/shop"
_CRON_BLOCK = re.compile(r"^( *)```cron\n(.*?)^\1```", flags=re.MULTILINE | re.DOTALL)
_FACTORY = re.compile(r"```python\n(# myshop/__init__\.py\n.*?)```", flags=re.DOTALL)
_VARIABLE = re.compile(r"^[A-Z_]+=")


@dataclass(frozen=True)
class CronLine:
    page: str
    schedule: str
    command: str

    @property
    def app(self) -> str:
        match = re.search(r"--app (\S+)", self.command)
        assert match, self.command
        return match.group(1)

    @property
    def job(self) -> str:
        """The ``flask gateway`` subcommand the line runs."""
        match = re.search(r" gateway ([a-z-]+)", self.command)
        assert match, self.command
        return match.group(1)

    def __str__(self) -> str:
        return f"{self.schedule} {self.command}"


def cron_lines() -> list[CronLine]:
    """Every job line of every ```cron block (not comments, not ``MAILTO=`` and other variables)."""
    lines = []
    for page in sorted(DOCS.glob("*.md")):
        for _indent, block in _CRON_BLOCK.findall(page.read_text()):
            jobs = 0
            for raw in block.splitlines():
                line = raw.strip()
                if not line or line.startswith("#") or _VARIABLE.match(line):
                    continue
                fields = line.split(None, 5)
                assert len(fields) == 6, f"{page.name}: not a cron line: {line!r}"
                lines.append(CronLine(page.name, " ".join(fields[:5]), fields[5]))
                jobs += 1
            assert jobs, f"{page.name}: a cron block without a job line"
    return lines


LINES = cron_lines()


def test_the_docs_hold_the_cron_lines_this_test_knows() -> None:
    jobs = {(line.page, line.job) for line in LINES}
    assert {
        ("operations.md", "reconcile"),
        ("operations.md", "prune-callbacks"),
        ("operations.md", "deliver"),
        ("operations.md", "doctor"),
        ("operations.md", "check-settings"),
        ("example-shop.md", "reconcile"),
    } <= jobs
    for line in LINES:  # each loads the shop's environment, and keeps a good run's output out of the mail
        assert f"--env-file {ENVIRONMENT_FILE} " in line.command, line
        assert line.command.startswith(f"cd {PROJECT} && "), line


# --- a project folder, an environment file, and the shop's database with work due -----------------------


@dataclass
class Site:
    """``/srv/shop`` and ``/etc/shop/environment`` for one line, and the app built from them in this
    process (to put work in its database and read what the line did)."""

    project: Path
    environment_file: Path
    environment: dict[str, str]
    home: Path

    def rewrite(self, command: str, *, environment_file: Path | None = None) -> str:
        """Only the paths change."""
        return command.replace(ENVIRONMENT_FILE, str(environment_file or self.environment_file)).replace(
            PROJECT, str(self.project)
        )

    def run(self, command: str) -> subprocess.CompletedProcess[str]:
        """``/bin/sh -c COMMAND`` with cron's environment."""
        return subprocess.run(
            ["/bin/sh", "-c", command],
            env={"PATH": "/usr/bin:/bin", "HOME": str(self.home), "SHELL": "/bin/sh", "LOGNAME": "shop"},
            cwd=self.home,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )


def write_environment(path: Path, values: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{name}={value}\n" for name, value in values.items()))


@pytest.fixture
def site(tmp_path: Path, databases: Databases) -> Site:
    project = tmp_path / "srv" / "shop"
    (project / "myshop").mkdir(parents=True)
    (project / ".venv").symlink_to(sys.prefix)  # this run's virtualenv (nox's min and newest too)
    (project / "example_shop").symlink_to(ROOT / "example_shop")
    ((factory,),) = [_FACTORY.findall(OPERATIONS.read_text())]
    (project / "myshop" / "__init__.py").write_text(factory)
    home = tmp_path / "home"
    home.mkdir()
    environment = {
        "SHOP_SECRET_KEY": secrets.token_hex(32),
        "SHOP_DATABASE_URL": databases.url("shop"),
        "GATEWAY_ENVIRONMENT": "embedded",
    }
    environment_file = tmp_path / "etc" / "shop" / "environment"
    write_environment(environment_file, environment)
    return Site(project, environment_file, environment, home)


def build_app(
    site: Site, name: str, monkeypatch: pytest.MonkeyPatch, environment: dict[str, str] | None = None
) -> Flask:
    """The line's app, in this process, from the same environment (the example shop: from this checkout,
    the same code as the link in the project folder)."""
    for key, value in (environment or site.environment).items():
        monkeypatch.setenv(key, value)
    # No delivery thread for the embedded emulator of this process (the test sends the callbacks itself):
    # one left running would poll the test's database after the test. The line's own process has one.
    monkeypatch.setenv("EMULATOR_WORKER", "0")
    if name == "example_shop":
        from example_shop import create_app

        app = create_app()
        assert app.test_cli_runner().invoke(args=["shop", "init-db"]).exit_code == 0
    else:
        spec = importlib.util.spec_from_file_location(
            f"cron_{name}_{secrets.token_hex(4)}", site.project / name / "__init__.py"
        )
        assert spec is not None and spec.loader is not None
        module: ModuleType = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        app = module.create_app()
    created = run_gateway(app, "init-db")
    assert created.exit_code == 0, created.output
    return app


@dataclass
class Work:
    """What a line should find due, and how to tell it did it."""

    checkout_id: int | None = None
    event_id: int | None = None
    old_log_id: int | None = None


def _paid_checkout(app: Flask, emulator: GatewayEmulator, reference: str, *, lose_callback: bool) -> int:
    """A checkout the shopper paid; its callback comes at once, or (``lose_callback``) never."""
    with app.test_request_context(base_url="http://127.0.0.1:5000"):  # the shopper's request
        checkout = create_checkout(sample_order(reference))
        assert checkout.token is not None
        checkout_id, token = checkout.id, checkout.token
    if lose_callback:
        # Without a count the rule stays: every attempt fails (the emulator's thread retries): lost for good.
        emulator.control("faults", {"operation": "callback", "kind": "callback_fail"})
    emulator.pay(token)
    emulator.deliver()  # the callback is sent now (and fails, when it is to be lost)
    return checkout_id


def _age(app: Flask, checkout_id: int) -> None:
    with app.app_context():
        session = get_state().session
        hour_ago = utcnow() - timedelta(hours=1)
        session.execute(
            update(GatewayCheckout)
            .where(GatewayCheckout.id == checkout_id)
            .values(created_at=hour_ago, updated_at=hour_ago)
        )
        session.commit()


def _written_event(app: Flask, checkout_id: int) -> OutboxEvent:
    """The checkout's outbox event once its first delivery attempt is over: the emulator's own delivery
    thread may be the one sending the callback (``deliver()`` then finds nothing due and returns at once)."""

    def attempted() -> OutboxEvent | None:
        with app.app_context():
            return (
                get_state()
                .session.scalars(
                    select(OutboxEvent).where(
                        OutboxEvent.checkout_id == checkout_id, OutboxEvent.attempts > 0
                    )
                )
                .first()
            )

    event: OutboxEvent = wait_for(
        attempted, interval=0.05, what="the callback to confirm the payment (its event attempted once)"
    )
    return event


def prepare(app: Flask, emulator: GatewayEmulator, job: str) -> Work:
    work = Work()
    if job == "reconcile":
        work.checkout_id = _paid_checkout(app, emulator, "ORD-CRON-1", lose_callback=True)
        with app.app_context():
            assert get_state().session.get(GatewayCheckout, work.checkout_id).status == "PENDING_ORDER"
        _age(app, work.checkout_id)
    elif job == "deliver":

        def down(sender: Any, **kwargs: Any) -> None:
            raise ConnectionError("the stock service is down")

        payment_confirmed.connect(down, sender=app)
        try:  # the callback confirms the payment; delivering its event at once raises
            checkout_id = _paid_checkout(app, emulator, "ORD-CRON-2", lose_callback=False)
            event = _written_event(app, checkout_id)
        finally:
            payment_confirmed.disconnect(down, sender=app)
        with app.app_context():
            session = get_state().session
            event = session.get_one(OutboxEvent, event.id)
            assert (event.state, event.attempts) == (OutboxState.PENDING, 1)
            work.event_id = event.id
            event.next_attempt_at = utcnow() - timedelta(minutes=1)  # due now
            session.commit()
    elif job == "prune-callbacks":
        refused = app.test_client().post("/gateway/callback", data=b"{}", headers={"X-Signature": "bm9wZQ=="})
        assert refused.status_code in (400, 401), refused.status_code
        with app.app_context():
            session = get_state().session
            row = session.scalars(select(CallbackLog)).one()
            row.received_at = utcnow() - timedelta(days=120)
            work.old_log_id = row.id
            session.commit()
    return work


def assert_done(app: Flask, job: str, work: Work) -> None:
    with app.app_context():
        session = get_state().session
        if job == "reconcile":
            checkout = session.get(GatewayCheckout, work.checkout_id)
            assert checkout is not None and checkout.last_polled_at is not None
            assert checkout.status == "PAID_PENDING_CALLBACK"  # the payment the lost callback carried
        elif job == "deliver":
            event = session.get(OutboxEvent, work.event_id)
            assert event is not None and (event.state, event.attempts) == (OutboxState.DELIVERED, 2)
        elif job == "prune-callbacks":
            assert session.get(CallbackLog, work.old_log_id) is None
            assert session.scalar(select(func.count()).select_from(CallbackLog)) == 0


@pytest.fixture
def shop_app(site: Site, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[Flask]:
    line: CronLine = request.param
    app = build_app(site, line.app, monkeypatch)
    yield app
    embedded = embedded_emulator(app)
    assert embedded is not None and _WORKER_KEY not in embedded.app.extensions  # no thread left behind
    with app.app_context():
        get_state().dispose()
    dispose_engines()


def say(label: str, command: str, ran: subprocess.CompletedProcess[str]) -> None:
    print(f"\n[{label}] exit status {ran.returncode}: {command}", file=sys.stderr)  # noqa: T201  (-s)
    for stream in (ran.stdout, ran.stderr):
        if stream.strip():
            print("    " + stream.strip().replace("\n", "\n    "), file=sys.stderr)  # noqa: T201


@pytest.mark.backends
@pytest.mark.parametrize("shop_app", LINES, ids=[f"{line.page}:{line.job}" for line in LINES], indirect=True)
def test_a_documented_cron_line_run_as_written_does_its_work_and_fails_when_misconfigured(
    site: Site,
    shop_app: Flask,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    line: CronLine = request.node.callspec.params["shop_app"]
    backend = site.environment["SHOP_DATABASE_URL"].split(":", 1)[0]  # the shop's database, as in the file
    with GatewayEmulator.start(shop_app, database_url=site.environment["SHOP_DATABASE_URL"]) as emulator:
        work = prepare(shop_app, emulator, line.job)
        dispose_engines()  # the line's process has the database to itself, as cron's would

        command = site.rewrite(line.command)
        ran = site.run(command)
        say(f"{line.page}, {backend}: configured", str(line), ran)
        assert ran.returncode == 0, ran.stdout + ran.stderr
        assert ran.stdout == ran.stderr == "", "a good run keeps quiet: cron would mail any output"
        assert_done(shop_app, line.job, work)

    # The environment file is missing: Flask itself stops, before the app is built.
    missing = site.run(site.rewrite(line.command, environment_file=tmp_path / "nowhere" / "environment"))
    say(f"{line.page}, {backend}: no environment file", str(line), missing)
    assert missing.returncode != 0
    assert "--env-file" in missing.stdout and "does not exist" in missing.stdout, missing.stdout

    # The file names a database where the gateway was never installed (tables there, nothing installed).
    elsewhere = tmp_path / "elsewhere" / "environment"
    other_environment = {
        **site.environment,
        "SHOP_DATABASE_URL": f"sqlite:///{tmp_path / 'elsewhere.sqlite3'}",
    }
    write_environment(elsewhere, other_environment)
    build_app(site, line.app, monkeypatch, other_environment)  # its tables, and nothing installed
    dispose_engines()
    uninstalled = site.run(site.rewrite(line.command, environment_file=elsewhere))
    say(f"{line.page}, {backend}: nothing installed", str(line), uninstalled)
    if line.job == "doctor":  # it reports the missing installation itself, as a problem
        assert uninstalled.returncode == 1, uninstalled.stdout
        assert "not installed" in uninstalled.stdout, uninstalled.stdout
    else:
        assert uninstalled.returncode == EXIT_CONFIGURATION, uninstalled.stdout
        assert "Error: the gateway is not installed for the embedded environment in SQLite file " in (
            uninstalled.stdout
        )
    assert uninstalled.stdout.startswith(f"Using database SQLite file {tmp_path / 'elsewhere.sqlite3'}, ")


# --- systemd units ------------------------------------------------------------------------------------


_INI_BLOCK = re.compile(r"```ini\n(.*?)```", flags=re.DOTALL)
_UNIT_HEADER = re.compile(r"^# /etc/systemd/system/(\S+?\.service)(.*)$", flags=re.MULTILINE)


def systemd_units() -> list[tuple[str, str, str]]:
    """(page, unit name or "", the unit's text) for every ``.service`` unit in an ```ini block; a unit
    written as "as X.service, with ..." or "the same, with ..." gets X's (or the previous unit's) text
    before its own lines."""
    units: list[tuple[str, str, str]] = []
    for page in sorted(DOCS.glob("*.md")):
        for block in _INI_BLOCK.findall(page.read_text()):
            if "[Service]" not in block and "ExecStart=" not in block:
                continue
            headers = list(_UNIT_HEADER.finditer(block))
            if not headers:
                units.append((page.name, "", block))
                continue
            texts: dict[str, str] = {}
            previous = ""
            for index, header in enumerate(headers):
                end = headers[index + 1].start() if index + 1 < len(headers) else len(block)
                text = block[header.start() : end]
                name, rest = header.group(1), header.group(2)
                base = re.search(r"as (\S+\.service)", rest)
                inherited = ""
                if base:
                    inherited = texts.get(base.group(1)) or next(
                        (t for _p, n, t in units if n == base.group(1)), ""
                    )
                    assert inherited, f"{page.name}: {name} refers to {base.group(1)}, not shown"
                elif "the same" in rest:
                    inherited = previous
                texts[name] = inherited + text
                previous = texts[name]
                units.append((page.name, name, texts[name]))
    return units


def test_every_systemd_unit_that_runs_flask_or_celery_loads_the_environment_file() -> None:
    units = systemd_units()
    running = []
    for page, name, text in units:
        starts = [line for line in text.splitlines() if line.startswith("ExecStart=")]
        if not any(re.search(r"/(flask|celery) ", shlex.join(start.split())) for start in starts):
            continue
        running.append((page, name))
        assert f"EnvironmentFile={ENVIRONMENT_FILE}" in text.splitlines(), (page, name or text[:80])
    assert ("operations.md", "myshop-outbox.service") in running
    assert ("example-shop.md", "shop-celery-worker.service") in running
    assert len(running) >= 5, running
