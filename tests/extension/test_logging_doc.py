"""docs/logging.md holds true: its dictConfig blocks run as written and give time, level and logger name;
its gunicorn ``logconfig_dict`` puts gunicorn's lines and the app's in one format under a real gunicorn; its
JSON variant writes one JSON object a line; and its table names every logger of the extension and the
emulator, and no logger that no longer exists."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import requests

from tests import secret_watch
from tests.processes import WAIT_DEADLINE, Server, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "logging.md"
PACKAGE = ROOT / "flask_gateway"

#: time, level, [pid], logger: message (the format of the page's text blocks).
LINE = re.compile(
    r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (DEBUG|INFO|WARNING|ERROR|CRITICAL) \[(\d+)\] ([\w.]+): (.*)$"
)


def python_block(first_line_start: str) -> str:
    blocks = re.findall(r"```python\n(.*?)```", PAGE.read_text(), flags=re.DOTALL)
    (block,) = [block for block in blocks if block.startswith(first_line_start)]
    return block


def run_with(block: str, then: str) -> subprocess.CompletedProcess[str]:
    """``block`` as written (its dictConfig) in a fresh interpreter, then ``then``; stderr is the log."""
    return subprocess.run(
        [sys.executable, "-c", block + "\n" + then],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=ROOT,
    )


EMIT = """
import logging
logging.getLogger("flask_gateway.outbox").info("outbox event %s delivered", 31)
logging.getLogger("flask_gateway.outbox").debug("a DEBUG line, dropped at INFO")
try:
    raise RuntimeError("the warehouse is closed")
except RuntimeError:
    logging.getLogger("flask_gateway.outbox").exception("a receiver failed")
logging.getLogger("flask_gateway.client").info("gateway getstatus: POST ... attempt 1 HTTP 200 in 3 ms")
"""


def test_the_production_dictconfig_gives_time_level_and_logger():
    started = time.time()
    result = run_with(python_block("# logging_setup.py: import it first"), EMIT)
    lines = result.stderr.splitlines()
    first = LINE.match(lines[0])
    assert first is not None, lines[0]
    assert first.groups()[0::2] == ("INFO", "flask_gateway.outbox")
    assert first.group(4) == "outbox event 31 delivered"
    stamp = time.mktime(time.strptime(lines[0][:19], "%Y-%m-%d %H:%M:%S"))  # local time, whole seconds
    assert int(started) <= stamp <= time.time()  # the time of the record: made while the block ran
    assert "a DEBUG line" not in result.stderr  # INFO and up
    failed = LINE.match(lines[1])
    assert failed is not None and failed.group(1) == "ERROR" and failed.group(4) == "a receiver failed"
    assert lines[2] == "Traceback (most recent call last):"  # the traceback under its line
    assert "RuntimeError: the warehouse is closed" in result.stderr
    last = LINE.match(lines[-1])
    assert last is not None and last.group(3) == "flask_gateway.client"  # INFO of the calls is kept


def test_the_json_variant_writes_one_object_a_line():
    result = run_with(python_block("# logging_setup.py, the JSON variant"), EMIT)
    records = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(r["level"], r["logger"]) for r in records] == [
        ("INFO", "flask_gateway.outbox"),
        ("ERROR", "flask_gateway.outbox"),
        ("INFO", "flask_gateway.client"),
    ]
    assert records[0]["message"] == "outbox event 31 delivered"
    assert re.match(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}$", records[0]["time"])
    assert isinstance(records[0]["process"], int)
    assert "RuntimeError: the warehouse is closed" in records[1]["exc_info"]  # inside the object


APP = """
import logging

from flask import Flask

app = Flask("logging_doc_app")
outbox = logging.getLogger("flask_gateway.outbox")


@app.get("/")
def index():
    outbox.info("outbox event %s delivered", 31)
    outbox.debug("a DEBUG line, dropped at INFO")
    app.logger.warning("the app's own logger")
    return "ok"
"""


def test_the_gunicorn_logconfig_puts_its_lines_and_the_apps_in_one_format(tmp_path: Path):
    (tmp_path / "logging_doc_app.py").write_text(APP)
    (tmp_path / "gunicorn.conf.py").write_text(python_block("# gunicorn.conf.py: gunicorn's lines"))
    port = free_port()
    log_path = tmp_path / "gunicorn.log"
    command = [
        sys.executable, "-m", "gunicorn", "--config", str(tmp_path / "gunicorn.conf.py"), "--workers", "2",
        "--bind", f"127.0.0.1:{port}", "logging_doc_app:app",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, cwd=tmp_path, env=os.environ
        )
    server = Server(name="logging-doc", port=port, process=process, log_path=log_path)
    secret_watch.watch_file(log_path)
    try:
        answers: list[requests.Response] = []

        def answered() -> bool:
            assert process.poll() is None, f"gunicorn exited with {process.returncode}:\n{server.log_tail()}"
            try:
                # A long read timeout: a request that gave up while the workers were still booting
                # (a loaded machine) would leave gunicorn a closed socket to write to, and its traceback.
                answers.append(requests.get(server.url + "/", timeout=(5, 60)))
            except requests.RequestException:
                return False
            return True

        wait_for(
            answered, timeout=2 * WAIT_DEADLINE, interval=0.2, what="gunicorn to answer /", logs=[server]
        )
        assert answers[-1].text == "ok"
    finally:
        server.stop()
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    parsed = [LINE.match(line) for line in lines]
    # Every record starts with a formatted line; only an ERROR record's traceback (exc_info) may follow it
    # on lines of its own (gunicorn logs one when a client goes away before its answer is written).
    bare, level = [], None
    for line, match in zip(lines, parsed, strict=True):
        if match:
            level = match.group(1)
        elif level not in ("ERROR", "CRITICAL"):
            bare.append(line)
    assert bare == [], bare
    said = {(m.group(3), m.group(1)) for m in parsed if m}
    assert ("gunicorn.error", "INFO") in said  # gunicorn's own lines: "Booting worker with pid ..."
    assert ("gunicorn.access", "INFO") in said  # its access log
    assert ("flask_gateway.outbox", "INFO") in said  # the extension's INFO kept
    assert ("logging_doc_app", "WARNING") in said  # Flask's app.logger in the same format
    assert "a DEBUG line" not in log_path.read_text()
    workers = {m.group(2) for m in parsed if m and m.group(3) == "gunicorn.error" and "Booting" in m.group(4)}
    assert len(workers) == 2


# --- the table of loggers --------------------------------------------------------------------------------


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def loggers_in_code() -> set[str]:
    """Every ``logging.getLogger(...)`` of the package (a literal name, or ``__name__``), and the emulator
    app's own Flask logger (``app.logger``: the app is ``Flask(__name__)`` in ``emulator/app.py``)."""
    names = set()
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "getLogger"):
                continue
            (argument,) = node.args
            if isinstance(argument, ast.Name) and argument.id == "__name__":
                names.add(module_name(path))
            else:
                assert isinstance(argument, ast.Constant) and isinstance(argument.value, str), (
                    f"{path}:{node.lineno}: a logger name to list"
                )
                names.add(argument.value)
    emulator = PACKAGE / "emulator"
    if any(re.search(r"\bapp\.logger\.", p.read_text()) for p in emulator.rglob("*.py")):
        assert "Flask(__name__" in (emulator / "app.py").read_text()
        names.add("flask_gateway.emulator.app")
    return names


def loggers_in_table() -> list[str]:
    section = PAGE.read_text().split("## Every logger of the extension and the emulator\n", 1)[1]
    return re.findall(r"^\| `([\w.]+)` \|", section, flags=re.MULTILINE)


def test_the_table_lists_every_logger_and_no_other():
    in_code, in_table = loggers_in_code(), loggers_in_table()
    assert len(in_table) == len(set(in_table)), "a logger listed twice"
    assert {"flask_gateway.outbox", "flask_gateway.ratelimit", "flask_gateway.emulator.delivery"} <= in_code
    assert sorted(in_code - set(in_table)) == [], "loggers of the code missing from docs/logging.md"
    assert sorted(set(in_table) - in_code) == [], "loggers in docs/logging.md that no code uses"


def test_the_emulators_app_logger_is_the_one_listed(tmp_path: Path):
    from flask_gateway.emulator.app import create_app

    app = create_app({"SECRET_KEY": "emulator-secret-for-the-logging-test"}, instance_path=str(tmp_path))
    assert app.logger.name == "flask_gateway.emulator.app"
    assert app.logger.name in loggers_in_table()
