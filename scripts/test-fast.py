#!/usr/bin/env python3
"""The contributors' fast loop: the in-process tests only, then how many ran and how long they took.

    make test-fast                       # .venv/bin/python scripts/test-fast
    make test-fast TEST_ARGS=-x          # extra pytest arguments
    make test-fast TEST_ARGS=--database=sqlite   # and SQLite only: PostgreSQL is never started

The in-process tests are noxfile.py's ``IN_PROCESS_TESTS`` (the set the minimum-versions run uses): no
browser, no gunicorn stacks, no Celery worker processes, no wheel builds. ``make test`` runs everything.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def in_process_arguments() -> list[str]:
    """noxfile.py's in-process selection: its ignores, then its folders."""
    spec = importlib.util.spec_from_file_location("noxfile", ROOT / "noxfile.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot load noxfile.py")
    noxfile = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(noxfile)
    return [*noxfile.NOT_IN_PROCESS, *noxfile.IN_PROCESS_TESTS]


def main(argv: list[str]) -> int:
    workers = os.environ.get("TEST_WORKERS", "auto")
    with tempfile.TemporaryDirectory() as scratch:
        report = Path(scratch) / "junit.xml"
        command = [sys.executable, "-m", "pytest", "-n", workers, f"--junitxml={report}", *argv]
        command += in_process_arguments()
        started = time.monotonic()
        status = subprocess.call(command, cwd=ROOT)
        wall = time.monotonic() - started
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        if report.exists():
            root = ElementTree.parse(report).getroot()  # noqa: S314 (pytest's own report)
            for suite in root.iter("testsuite"):
                for key in counts:
                    counts[key] += int(suite.get(key, 0))
    ran = counts["tests"] - counts["skipped"]
    outcome = "passed" if status == 0 else f"FAILED (pytest exit {status})"
    print(
        f"make test-fast: {ran:,} in-process tests in {wall:.0f} s, {outcome}: "
        f"{counts['failures']} failed, {counts['errors']} errors, {counts['skipped']} skipped",
        flush=True,
    )
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
