"""The documentation site's sources stay whole (docs/conf.py; ``make docs`` builds it, CI runs that).

The build itself fails on a broken link or anchor and on an exported name missing from the reference;
these checks read the sources, so that a page or a name left out shows up in the test run too, without
Sphinx (the ``docs`` extra is not in ``dev``).
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

import flask_gateway
import flask_gateway.emulator
import flask_gateway.pytest_plugin
import flask_gateway.testing

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
API = (DOCS / "api.md").read_text(encoding="utf-8")

_DIRECTIVE = re.compile(r"^\.\. (auto\w+|module|currentmodule):: (\S+)", re.MULTILINE)


def _documented() -> set[str]:
    """The full names the API page documents: ``.. autoX:: name`` under the current ``.. module::``, and
    every ``__all__`` name of a module given to ``automodule`` with ``:members:``."""
    names: set[str] = set()
    current = ""
    for kind, target in _DIRECTIVE.findall(API):
        if kind in ("module", "currentmodule"):
            current = target
        elif kind == "automodule":
            module = __import__(target, fromlist=["__all__"])
            names.update(f"{target}.{name}" for name in module.__all__)
        else:
            names.add(target if target.startswith("flask_gateway.") else f"{current}.{target}")
    return names


@pytest.mark.parametrize(
    "module",
    [flask_gateway, flask_gateway.testing, flask_gateway.emulator, flask_gateway.pytest_plugin],
    ids=lambda module: module.__name__,
)
def test_the_api_reference_documents_every_exported_name(module):
    missing = {f"{module.__name__}.{name}" for name in module.__all__} - _documented()
    assert not missing, f"docs/api.md does not document {sorted(missing)}"


def test_the_api_reference_documents_the_emulators_mount_and_the_fixtures():
    documented = _documented()
    assert {"flask_gateway.emulator.mount", "flask_gateway.emulator.create_app"} <= documented
    fixtures = {
        "gateway_app",
        "gateway_emulator",
        "gateway_emulator_settings",
        "gateway_emulator_database_url",
    }
    assert {f"flask_gateway.pytest_plugin.{name}" for name in fixtures} <= documented


def test_the_api_reference_names_nothing_that_does_not_exist():
    for name in _documented():
        module, _, attribute = name.rpartition(".")
        assert hasattr(__import__(module, fromlist=[attribute]), attribute), name


def test_the_navigation_holds_every_page_once():
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    (toctree,) = re.findall(r"^```\{toctree\}\n(.*?)^```", index, flags=re.MULTILINE | re.DOTALL)
    entries = [line.strip() for line in toctree.splitlines() if line.strip() and not line.startswith(":")]
    pages = sorted(page.stem for page in DOCS.glob("*.md") if page.name != "index.md")
    assert sorted(entries) == pages
    assert len(entries) == len(set(entries))


def test_the_build_is_strict_locally_in_ci_and_on_read_the_docs():
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    (command,) = re.findall(r"^docs:.*\n\t(.*)$", makefile, flags=re.MULTILINE)
    assert command.split()[1:] == ["-E", "-W", "--keep-going", "-n", "-b", "html", "docs", "docs/_build/html"]
    assert "pip install --quiet -e '.[docs]'" in makefile
    assert re.search(r"^make docs$", (ROOT / ".ci" / "run").read_text(encoding="utf-8"), flags=re.MULTILINE)

    rtd = (ROOT / ".readthedocs.yaml").read_text(encoding="utf-8")
    assert "configuration: docs/conf.py" in rtd
    assert "fail_on_warning: true" in rtd
    assert re.search(r"extra_requirements:\n\s+- docs\n", rtd)
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "optional-dependencies"
    ]
    assert {re.split(r"[<>=!~\[]", requirement)[0] for requirement in extras["docs"]} >= {
        "sphinx",
        "myst-parser",
    }
    assert "nitpicky = True" in (DOCS / "conf.py").read_text(encoding="utf-8")
