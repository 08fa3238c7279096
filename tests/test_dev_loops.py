"""The contributors' loops: ``make test-fast`` (scripts/test-fast.py) and ``make test-loaded`` (scripts/test-loaded.py)."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

from tests.processes import is_alive

ROOT = Path(__file__).resolve().parent.parent


def test_test_loaded_runs_the_command_beside_busy_loops_it_stops_and_reports_the_load():
    command = [
        sys.executable,
        str(ROOT / "scripts" / "test-loaded.py"),
        sys.executable,
        "-c",
        "raise SystemExit(3)",
    ]
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "BURNERS": "2"}, check=False
    )
    assert done.returncode == 3, done.stdout + done.stderr  # the command's own status
    started = re.search(r"2 busy-loop burners \(PIDs (\d+) (\d+)\)", done.stdout)
    assert started, done.stdout
    assert re.search(r"exited 3 after \d+ s; load average \(1 min\) [\d.]+", done.stdout), done.stdout
    # Stopped by PID whatever the command did: no burner outlives the run.
    assert not [pid for pid in map(int, started.groups()) if is_alive(pid)]


def test_test_fast_runs_the_in_process_selection_and_says_how_many_ran_and_how_long():
    # One quick test of the selection (-k), in this process's own interpreter: the line counts what ran.
    command = [
        sys.executable,
        str(ROOT / "scripts" / "test-fast.py"),
        "-p",
        "no:randomly",
        "-q",
        "--database=sqlite",
        "-k",
        "test_a_naive_stored_time_is_utc_and_shown_in_the_zone_with_its_abbreviation",
    ]
    env = {**os.environ, "TEST_WORKERS": "0"}
    done = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    line = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(
        r"make test-fast: 1 in-process tests in \d+ s, passed: 0 failed, 0 errors, 0 skipped", line
    ), line


def test_test_fast_selects_what_the_minimum_versions_run_selects():
    # One list of the in-process tests (noxfile.py), read by both: the fast loop is not a second opinion.
    spec = importlib.util.spec_from_file_location("test_fast", ROOT / "scripts" / "test-fast.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    selection = module.in_process_arguments()
    assert "tests/extension" in selection
    assert "--ignore=tests/extension/test_quickstart_typed.py" in selection
    for out_of_process in ("tests/e2e", "tests/reliability", "tests/packaging", "tests/docs", "tests/tasks"):
        assert out_of_process not in selection
