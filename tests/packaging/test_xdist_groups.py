"""The suite's own xdist groups hold (``tests/conftest.py``): tests that share an expensive session fixture
run on one worker, which starts it once (issue 30).

With pytest 9.2 and pytest-xdist 3.8, the ``@group`` suffix xdist gives a grouped test's node id was lost
(pytest reads the id from ``item._id``, xdist wrote ``item._nodeid``: pytest-dev/pytest-xdist#1386), and
``--dist loadgroup`` spread every group over both workers: each built the wheel and its venv, started the
reliability stack, the browser. ``pytest_collection_modifyitems_xdist_group_ids`` puts the suffix where
pytest reads it. A small session of its own, two workers, shows it.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

CONFTEST = """
from tests.conftest import pytest_collection_modifyitems_xdist_group_ids  # noqa: F401 (the hook under test)
"""

#: No test waits for the other worker: xdist hands each worker its first unit of work (the group is one, each
#: free test another) before either runs a test, so both take part however fast one of them is.
TESTS = """
import os
from pathlib import Path

import pytest


def _record(kind):
    with Path(os.environ["GROUP_LOG"]).open("a") as log:
        log.write(f"{kind} {os.environ['PYTEST_XDIST_WORKER']}\\n")


@pytest.mark.xdist_group("shared")
@pytest.mark.parametrize("n", range(8))
def test_grouped(n):
    _record("grouped")


@pytest.mark.parametrize("n", range(8))
def test_free(n):
    _record("free")
"""


def test_a_groups_tests_run_on_one_worker_and_the_others_on_both(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_groups=TESTS)
    log = pytester.path / "workers.log"
    monkeypatch.setenv("GROUP_LOG", str(log))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup", "-v")
    result.assert_outcomes(passed=16)
    result.stdout.fnmatch_lines(["*PASSED test_groups.py::test_grouped?0?@shared*"])
    ran = [line.split() for line in log.read_text().splitlines()]
    grouped = {worker for kind, worker in ran if kind == "grouped"}
    assert len([kind for kind, _ in ran if kind == "grouped"]) == 8
    assert len(grouped) == 1, f"the group ran on {sorted(grouped)}"
    assert {worker for _, worker in ran} == {"gw0", "gw1"}  # two workers took part
