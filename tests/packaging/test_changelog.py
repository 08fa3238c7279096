"""CHANGELOG.md, CONTRIBUTING.md and SECURITY.md stay true (issue 24).

- The changelog's form (CONTRIBUTING.md, "Write a changelog entry"): ``## Version X.Y.Z`` sections, newest
  first, each followed by ``Unreleased`` (the newest only) or ``Released YYYY-MM-DD``; the newest is the
  package's version; every entry ends with the issue it belongs to, ``(#N)``; the settings and commands it
  names exist.
- Every command CONTRIBUTING.md tells a contributor to type exists: its ``make`` targets in the Makefile,
  its ``nox`` sessions in noxfile.py, the paths it names in the repository.
- The relative links of the three files lead to a file, and to a heading of it when they name one.
- The sdist holds the three files (MANIFEST.in).
"""

from __future__ import annotations

import ast
import re
import subprocess
import tarfile
from datetime import date

import pytest
from packaging.version import Version

import flask_gateway
from flask_gateway.config import DEFAULTS
from flask_gateway.operations.cli import gateway_cli
from flask_gateway.operations.cli.accounts import API_KEY_VARIABLE
from tests.packaging.wheel import ROOT, Distributions

PROJECT_FILES = ("CHANGELOG.md", "CONTRIBUTING.md", "SECURITY.md")

VERSION_HEADING = re.compile(r"^## Version (?P<version>\S+)$")
RELEASED = re.compile(r"^Released (?P<date>\d{4}-\d{2}-\d{2})$")
#: An entry ends with its issue, or issues: "(#23)", "(#4, #12, #15)".
ISSUES_AT_THE_END = re.compile(r"\((#\d+)(, #\d+)*\)$")


def _text(name: str) -> str:
    return (ROOT / name).read_text(encoding="utf-8")


def _versions() -> list[tuple[str, list[str]]]:
    """The changelog's version sections: (version, the section's lines after its heading)."""
    sections: list[tuple[str, list[str]]] = []
    for line in _text("CHANGELOG.md").splitlines():
        heading = VERSION_HEADING.match(line)
        if heading:
            sections.append((heading["version"], []))
        elif line.startswith("## "):
            pytest.fail(f"CHANGELOG.md: a second-level heading that is not '## Version X.Y.Z': {line!r}")
        elif sections:
            sections[-1][1].append(line)
    assert sections, "CHANGELOG.md has no '## Version X.Y.Z' section"
    return sections


def _release_line(lines: list[str]) -> str:
    return next(line for line in lines if line.strip())


def _entries() -> list[str]:
    """Every bullet of the changelog's version sections, its continuation lines joined."""
    entries: list[str] = []
    for _version, lines in _versions():
        for line in lines:
            if line.startswith("- "):
                entries.append(line[2:].strip())
            elif line.startswith("  ") and line.strip() and entries:
                entries[-1] += " " + line.strip()
    return entries


def test_the_newest_version_is_the_packages_and_is_unreleased_or_dated():
    newest, lines = _versions()[0]
    package = Version(flask_gateway.__version__)
    # A development version (0.2.0.dev0) is the unreleased section of 0.2.0, as the Pallets projects do.
    assert Version(newest) == Version(package.base_version), (
        f"CHANGELOG.md's newest section is {newest}, flask_gateway/_version.py says {package}: change both "
        "together"
    )
    release = _release_line(lines)
    assert release == "Unreleased" or RELEASED.match(release), (
        f"the line under '## Version {newest}' is {release!r}: 'Unreleased' or 'Released YYYY-MM-DD'"
    )
    if package.is_devrelease:
        assert release == "Unreleased", f"{package} is a development version: its section is 'Unreleased'"


def test_only_the_newest_version_is_unreleased_and_versions_and_dates_go_back_in_time():
    sections = _versions()
    versions = [Version(version) for version, _lines in sections]
    assert versions == sorted(versions, reverse=True), f"versions not newest first: {versions}"
    assert len(set(versions)) == len(versions), f"a version appears twice: {versions}"
    dates = []
    for version, lines in sections[1:]:
        released = RELEASED.match(_release_line(lines))
        assert released, f"'## Version {version}' is older than the newest: it needs 'Released YYYY-MM-DD'"
        dates.append(date.fromisoformat(released["date"]))
    assert dates == sorted(dates, reverse=True), f"release dates not newest first: {dates}"


def test_every_entry_names_its_issue():
    entries = _entries()
    assert len(entries) > 20, (
        "the changelog's entries were not found (bullets '- ' with 2-space continuations)"
    )
    missing = [entry for entry in entries if not ISSUES_AT_THE_END.search(entry)]
    assert not missing, "entries that do not end with their issue, '(#N)':\n" + "\n".join(missing)


def test_the_settings_and_commands_the_changelog_names_exist():
    text = _text("CHANGELOG.md")
    keys = set(re.findall(r"\bGATEWAY_[A-Z0-9_]+\b", text))
    assert keys, "no GATEWAY_* key found: the pattern is wrong"
    # The settings, and the one environment variable the commands read (the API key, never an option).
    known_keys = set(DEFAULTS) | {API_KEY_VARIABLE}
    assert keys <= known_keys, f"keys the extension does not have: {sorted(keys - known_keys)}"
    commands = set(re.findall(r"`flask gateway ([a-z-]+)", text))
    assert commands, "no 'flask gateway' command found: the pattern is wrong"
    known = set(gateway_cli.commands)
    assert commands <= known, f"commands 'flask gateway' does not have: {sorted(commands - known)}"


def _make_targets() -> set[str]:
    return set(re.findall(r"^([a-z][a-z0-9-]*):", _text("Makefile"), flags=re.MULTILINE))


def _nox_sessions() -> set[str]:
    tree = ast.parse(_text("noxfile.py"))
    sessions: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef):
            continue
        for decorator in node.decorator_list:
            call = decorator if isinstance(decorator, ast.Call) else None
            target = call.func if call else decorator
            if ast.unparse(target) != "nox.session":
                continue
            # @nox.session(name="min") names the session; a bare @nox.session takes the function's name.
            named = [keyword.value for keyword in (call.keywords if call else ()) if keyword.arg == "name"]
            name = named[0].value if named and isinstance(named[0], ast.Constant) else node.name
            sessions.add(str(name))
    return sessions


def test_every_make_target_and_nox_session_contributing_names_exists():
    text = _text("CONTRIBUTING.md")
    targets = set(re.findall(r"\bmake ([a-z][a-z0-9-]*)", text))
    assert {"setup", "test", "lint"} <= targets, "the pattern no longer finds CONTRIBUTING.md's make commands"
    assert targets <= _make_targets(), f"not in the Makefile: {sorted(targets - _make_targets())}"
    sessions = set(re.findall(r"\bnox -s ([a-z][a-z0-9_-]*)", text))
    if sessions:
        assert sessions <= _nox_sessions(), f"not in noxfile.py: {sorted(sessions - _nox_sessions())}"


def test_every_path_contributing_names_exists():
    text = _text("CONTRIBUTING.md")
    paths = set(
        re.findall(r"(?<![\w/.])((?:tests|scripts|docs|flask_gateway|example_shop|\.ci)/[\w./-]*)", text)
    )
    assert "scripts/ensure-system-packages" in paths, "the pattern no longer finds CONTRIBUTING.md's paths"
    # What a build writes (make docs: docs/_build/html) is not in a fresh clone: it must be ignored by git.
    built = {path for path in paths if path.startswith("docs/_build")}
    assert all(_ignored_by_git(path) for path in built), f"build output not in .gitignore: {sorted(built)}"
    missing = sorted(path for path in paths - built if not (ROOT / path.rstrip(".")).exists())
    assert not missing, f"paths CONTRIBUTING.md names that do not exist: {missing}"


def _ignored_by_git(path: str) -> bool:
    return subprocess.run(["git", "check-ignore", "-q", "--no-index", path], cwd=ROOT).returncode == 0


def _anchors(markdown: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as hyphens."""
    anchors = set()
    for heading in re.findall(r"^#{1,6} (.+)$", markdown, flags=re.MULTILINE):
        anchors.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("name", PROJECT_FILES)
def test_relative_links_lead_to_a_file_and_heading(name: str):
    links = re.findall(r"\]\(([^)\s]+)\)", _text(name))
    broken = []
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = ROOT / path if path else ROOT / name
        if not target.is_file():
            broken.append(f"{link}: no file {path}")
        elif anchor and anchor not in _anchors(target.read_text(encoding="utf-8")):
            broken.append(f"{link}: no heading #{anchor} in {target.relative_to(ROOT)}")
    assert not broken, f"{name}: " + "; ".join(broken)


def test_the_sdist_holds_the_changelog_contributing_and_security_policy(
    flask_gateway_distributions: Distributions,
):
    sdist = flask_gateway_distributions.sdist
    top = sdist.name.removesuffix(".tar.gz")
    with tarfile.open(sdist) as archive:
        for name in PROJECT_FILES:
            try:
                member = archive.extractfile(f"{top}/{name}")
            except KeyError:
                pytest.fail(f"{name} is not in the sdist: MANIFEST.in must include it")
            assert member is not None
            assert member.read().decode("utf-8") == _text(name), f"the sdist's {name} is not the checkout's"
