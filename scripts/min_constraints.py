#!/usr/bin/env python3
"""Write a pip constraints file that pins every runtime dependency to its declared lower bound.

    python scripts/min_constraints.py [OUTPUT]      # default: print to standard output

Reads ``pyproject.toml``: the ``dependencies`` list and the runtime extras (``metrics``, ``tasks``; not
``dev``, the test tools). Each requirement's ``>=`` bound becomes ``name==bound``: ``flask>=3.0`` gives
``flask==3.0``, which pip matches to 3.0.0. Extras are dropped (``celery[redis]>=5.4`` gives
``celery==5.4``): pip refuses extras in a constraints file, and the extra's packages come with the
requirement itself. ``nox -s min`` (noxfile.py) installs the project with this file and then checks that
every package named here is installed at exactly that version, so a test tool that needs a newer release of
a runtime dependency fails the session instead of lifting it unseen.

A runtime requirement without a ``>=`` bound is an error: its minimum could not be tested.
"""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: The extras a shop installs (docs/operations.md); ``dev`` holds the test and lint tools.
RUNTIME_EXTRAS = ("metrics", "tasks")

# A requirement as this project writes them: name, optional [extras], then comma-separated specifiers.
# (No markers or URLs in the runtime lists; one there is reported rather than guessed at.)
_REQUIREMENT = re.compile(r"^\s*(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(?P<specs>[^;@]*)$")
_LOWER = re.compile(r"^>=\s*(?P<version>[0-9][0-9A-Za-z.+!-]*)$")


def normalize(name: str) -> str:
    """The package index's form of a name (PEP 503): ``Flask_SQLAlchemy`` and ``flask-sqlalchemy`` agree."""
    return re.sub(r"[-_.]+", "-", name).lower()


def runtime_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    requirements = list(project.get("dependencies", []))
    extras = project.get("optional-dependencies", {})
    for extra in RUNTIME_EXTRAS:
        if extra not in extras:
            raise SystemExit(f"pyproject.toml: no [project.optional-dependencies] {extra!r}")
        requirements.extend(extras[extra])
    return requirements


def lower_bounds(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """``{normalized name: lower bound}`` for every runtime requirement, in pyproject.toml's order."""
    bounds: dict[str, str] = {}
    for requirement in runtime_requirements(pyproject):
        match = _REQUIREMENT.match(requirement)
        if match is None:
            raise SystemExit(f"pyproject.toml: cannot read the requirement {requirement!r}")
        lowers = [
            lower.group("version")
            for spec in match.group("specs").split(",")
            if (lower := _LOWER.match(spec.strip()))
        ]
        if len(lowers) != 1:
            raise SystemExit(
                f"pyproject.toml: {requirement!r} needs exactly one '>=' lower bound for the "
                "minimum-versions session (nox -s min) to install"
            )
        name = normalize(match.group("name"))
        if name in bounds and bounds[name] != lowers[0]:
            raise SystemExit(f"pyproject.toml: {name} has two lower bounds, {bounds[name]} and {lowers[0]}")
        bounds[name] = lowers[0]
    return bounds


def constraints(pyproject: Path = ROOT / "pyproject.toml") -> str:
    lines = ["# scripts/min_constraints.py from pyproject.toml: every runtime dependency at its minimum."]
    lines += [f"{name}=={version}" for name, version in lower_bounds(pyproject).items()]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if len(argv) > 1:
        raise SystemExit("usage: scripts/min_constraints.py [OUTPUT]")
    text = constraints()
    if argv:
        Path(argv[0]).write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
