"""A configuration mistake under the ``flask`` command is one line and exit status 78, never a traceback.

``ConfigurationError`` is a ``click.ClickException``: ``flask run``, ``flask gateway ...`` and the shop's own
commands print ``Error: <what is wrong>. <how to fix it>`` and exit 78 (``EX_CONFIG``); ``--debug`` prints
the traceback above it; ``flask gateway doctor`` reports it as a finding. Each runs the real ``flask``
command in a process of its own on a shop module written for the test, as a newcomer would type it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import click
import pytest
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

from flask_gateway import EX_CONFIG, ConfigurationError, Gateway
from flask_gateway.extension import _doctor_asked

SHOP = '''
import os
from flask import Flask
from flask_sqlalchemy import SQLAlchemy
from flask_gateway import Gateway

db = SQLAlchemy()
app = Flask(__name__)
app.config.update(SQLALCHEMY_DATABASE_URI="sqlite:///shop.sqlite3")
app.config.update({key[5:]: value for key, value in os.environ.items() if key.startswith("TEST_")})
db.init_app(app)
gateway = Gateway(app, db=db)


@app.cli.command("init-db")
def init_db():
    """The shop's own command: it loads the app like every other."""
    db.create_all()
'''

SANDBX = {"TEST_SECRET_KEY": "k" * 32, "TEST_GATEWAY_ENVIRONMENT": "sandbx"}
SANDBX_LINE = "Error: GATEWAY_ENVIRONMENT='sandbx': use 'sandbox', 'production', 'emulator' or 'embedded'."


def flask(folder: Path, settings: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    env = {name: value for name, value in os.environ.items() if not name.startswith(("FLASK_", "GATEWAY_"))}
    return subprocess.run(
        [sys.executable, "-m", "flask", "--app", "shop", *args],
        cwd=folder,
        env={**env, **settings},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    (tmp_path / "shop.py").write_text(SHOP, encoding="utf-8")
    return tmp_path


@pytest.mark.parametrize(
    "args",
    [("run", "--port", "0"), ("gateway", "status", "ORDER-1"), ("gateway", "init-db"), ("init-db",)],
    ids=["run", "gateway status", "gateway init-db", "shop init-db"],
)
def test_a_configuration_mistake_is_one_line_and_exit_78(folder: Path, args: tuple[str, ...]) -> None:
    ran = flask(folder, SANDBX, *args)
    assert ran.returncode == EX_CONFIG == 78, ran.stderr
    assert ran.stderr.splitlines() == [SANDBX_LINE]
    assert "Traceback" not in ran.stdout + ran.stderr
    assert not (folder / "shop.sqlite3").exists()  # nothing ran: the server did not start, no table made


def test_every_kind_of_mistake_says_what_and_how_in_its_line(folder: Path) -> None:
    no_key = flask(folder, {"TEST_GATEWAY_ENVIRONMENT": "sandbox"}, "gateway", "status", "ORDER-1")
    assert no_key.returncode == 78
    ((line,),) = [no_key.stderr.splitlines()]
    assert line.startswith("Error: Flask-Gateway encrypts") and "set the app's SECRET_KEY" in line
    production = {
        "TEST_SECRET_KEY": "k" * 32,
        "TEST_GATEWAY_ENVIRONMENT": "production",
        "TEST_GATEWAY_BASE_URL": "https://gateway.example",
        "TEST_GATEWAY_INSTALL_URL": "https://gateway.example/install",
        "TEST_GATEWAY_V1_BASE_URL": "https://gateway.example/v1",
        "TEST_GATEWAY_PUBLIC_URL": "http://shop.example",
    }
    plain_http = flask(folder, production, "run", "--port", "0")
    assert plain_http.returncode == 78
    ((line,),) = [plain_http.stderr.splitlines()]
    assert line.startswith("Error: GATEWAY_PUBLIC_URL") and "https" in line, line


def test_debug_prints_the_traceback_above_the_line(folder: Path) -> None:
    ran = flask(folder, SANDBX, "--debug", "gateway", "status", "ORDER-1")
    assert ran.returncode == 78
    assert "Traceback (most recent call last)" in ran.stderr
    assert ran.stderr.splitlines()[-1] == SANDBX_LINE


def test_the_doctor_reports_it_as_a_finding(folder: Path) -> None:
    ran = flask(folder, SANDBX, "gateway", "doctor", "--no-network")
    assert ran.returncode == 1, ran.stdout + ran.stderr
    assert "Traceback" not in ran.stdout + ran.stderr
    assert ran.stdout.startswith("[PROBLEM] configuration: GATEWAY_ENVIRONMENT='sandbx': use 'sandbox'")
    assert "docs/configuration.md" in ran.stdout and "1 problem" in ran.stdout
    fixed = flask(
        folder, {**SANDBX, "TEST_GATEWAY_ENVIRONMENT": "embedded"}, "gateway", "doctor", "--no-network"
    )
    assert "[PROBLEM] configuration" not in fixed.stdout and "[ok]      configuration" in fixed.stdout, (
        fixed.stdout
    )


def test_outside_the_command_line_it_is_an_ordinary_exception() -> None:
    app = Flask("shop")
    app.config.update(SECRET_KEY="k" * 32, SQLALCHEMY_DATABASE_URI="sqlite://", GATEWAY_ENVIRONMENT="sandbx")
    db = SQLAlchemy(app)
    with pytest.raises(ConfigurationError, match="GATEWAY_ENVIRONMENT='sandbx'") as raised:
        Gateway(app, db=db)
    assert isinstance(raised.value, RuntimeError) and isinstance(raised.value, click.ClickException)
    assert "gateway.misconfigured" not in app.extensions  # deferred only for the doctor


@pytest.mark.parametrize(
    ("argv", "asked"),
    [
        (["--app", "shop", "gateway", "doctor"], True),
        (["-A", "shop", "gateway", "doctor", "--no-network"], True),
        (["--app=shop", "gateway", "doctor"], True),
        (["--app", "shop", "gateway", "status", "doctor"], False),
        (["--app", "shop", "run"], False),
        (["--app", "doctor", "gateway", "status"], False),
    ],
)
def test_the_doctor_is_recognised_only_when_a_command_group_loads_the_app(
    argv: list[str], asked: bool
) -> None:
    assert _doctor_asked(argv) is False  # no click context: a server or a test loads the app
    with click.Context(click.Group("flask")):
        assert _doctor_asked(argv) is asked
    with click.Context(click.Command("run")):
        assert _doctor_asked(argv) is False
