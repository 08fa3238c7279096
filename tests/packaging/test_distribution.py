"""The distribution as a package index serves it (issue 14, "a clean distribution"; docs/packaging.md).

The sdist and the wheel are built once per session from a copy of the checkout (``tests/packaging/wheel.py``,
the fixtures at the end of ``tests/conftest.py``): the wheel holds ``flask_gateway`` and its dist-info only,
every module, template and static file of the package, the LICENSE, a long description whose links work on
an index, and the pytest plugin's entry point; installed into a fresh virtual environment it works without
the repository, where ``example_shop`` cannot be imported.
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
import subprocess
import sys
import tarfile
import zipfile
from email.parser import Parser
from email.policy import compat32
from pathlib import Path, PurePosixPath

import flask_gateway
from tests.packaging.wheel import ROOT, Distributions, copy_venv, run_python, source_files, source_tree

PACKAGE = "flask_gateway"
#: What a shop's app, the emulator's and the extension's screens need besides the modules.
DATA_FOLDERS = {"templates", "static"}


def _wheel_names(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return archive.namelist()


def _wheel_text(wheel: Path, name: str) -> str:
    with zipfile.ZipFile(wheel) as archive:
        return archive.read(name).decode("utf-8")


def _dist_info(wheel: Path) -> str:
    (folder,) = {
        name.split("/")[0] for name in _wheel_names(wheel) if name.split("/")[0].endswith(".dist-info")
    }
    return folder


def _package_files() -> set[str]:
    """The files of ``flask_gateway`` a wheel must hold: its modules, their stubs (``__init__.pyi`` is the
    front door's table, read at import), ``py.typed``, and everything under a ``templates`` or ``static``
    folder, as the checkout has them."""
    wanted = set()
    for path in source_files():
        parts = path.parts
        if parts[0] != PACKAGE:
            continue
        if path.suffix in (".py", ".pyi") or path.name == "py.typed" or DATA_FOLDERS & set(parts[1:-1]):
            wanted.add(path.as_posix())
    return wanted


def _metadata(wheel: Path) -> tuple[dict[str, list[str]], str]:
    message = Parser(policy=compat32).parsestr(_wheel_text(wheel, f"{_dist_info(wheel)}/METADATA"))
    headers: dict[str, list[str]] = {}
    for key, value in message.items():
        headers.setdefault(key, []).append(value)
    body = message.get_payload()
    assert isinstance(body, str)
    return headers, body


#: Markdown inline links and images ``[text](target "title")``, reference definitions ``[id]: target``,
#: autolinks ``<target>``, and HTML ``href``/``src`` attributes.
_LINK_PATTERNS = (
    re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+[\"'(][^)]*)?\)"),
    re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", re.MULTILINE),
    re.compile(r"<([a-zA-Z][a-zA-Z0-9+.-]*:[^>\s]+)>"),
    re.compile(r"""\b(?:href|src)\s*=\s*["']([^"']+)["']""", re.IGNORECASE),
)
#: A target that works wherever the text is shown: an absolute URL, a mail address, or an anchor of the page.
_ABSOLUTE = re.compile(r"^(?:https?://|mailto:|#)")


def breaking_links(markdown: str) -> list[str]:
    """Every link target of ``markdown`` that is relative to where the file lies (breaks on an index's page)."""
    without_code = re.sub(r"```.*?```|`[^`\n]*`", "", markdown, flags=re.DOTALL)
    targets = [match.group(1) for pattern in _LINK_PATTERNS for match in pattern.finditer(without_code)]
    return sorted({target for target in targets if not _ABSOLUTE.match(target)})


def test_the_wheel_holds_flask_gateway_and_its_dist_info_only(flask_gateway_wheel: Path):
    names = _wheel_names(flask_gateway_wheel)
    top_level = {name.split("/")[0] for name in names}
    assert top_level == {PACKAGE, _dist_info(flask_gateway_wheel)}, top_level
    for unwanted in ("example_shop", "tests", "benchmarks", "scripts", "docs"):
        assert not [name for name in names if f"/{unwanted}/" in f"/{name}"], unwanted
    top_level_txt = _wheel_text(flask_gateway_wheel, f"{_dist_info(flask_gateway_wheel)}/top_level.txt")
    assert top_level_txt.split() == [PACKAGE]


def test_the_wheel_holds_every_module_template_and_static_file_of_the_package(flask_gateway_wheel: Path):
    in_wheel = {name for name in _wheel_names(flask_gateway_wheel) if name.startswith(f"{PACKAGE}/")}
    expected = _package_files()
    assert f"{PACKAGE}/py.typed" in expected and f"{PACKAGE}/__init__.pyi" in expected
    assert any("/templates/" in name for name in expected) and any("/static/" in name for name in expected)
    assert sorted(expected - in_wheel) == [], "missing from the wheel"
    assert sorted(in_wheel - expected) == [], "in the wheel but not a module, template or static file"


def test_the_license_is_in_the_dist_info_and_declared_as_an_spdx_expression(flask_gateway_wheel: Path):
    license_text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert license_text.startswith("MIT License\n")
    assert "Copyright (c) 2026 The Flask-Gateway authors" in license_text
    dist_info = _dist_info(flask_gateway_wheel)
    assert _wheel_text(flask_gateway_wheel, f"{dist_info}/licenses/LICENSE") == license_text
    headers, _ = _metadata(flask_gateway_wheel)
    assert headers["License-Expression"] == ["MIT"]
    assert headers["License-File"] == ["LICENSE"]
    assert not [c for c in headers.get("Classifier", []) if c.startswith("License ::")], "SPDX or classifier"


def test_the_long_description_is_docs_pypi_md_and_no_link_of_it_breaks_on_an_index(flask_gateway_wheel: Path):
    headers, description = _metadata(flask_gateway_wheel)
    assert headers["Description-Content-Type"] == ["text/markdown"]
    assert description.strip() == (ROOT / "docs" / "pypi.md").read_text(encoding="utf-8").strip()
    assert breaking_links(description) == []


def test_the_link_check_finds_the_readmes_relative_links():
    """README.md (the repository's front page) links to docs/ and screenshots relatively: fine on a clone,
    broken on an index; the check above would see them."""
    found = breaking_links((ROOT / "README.md").read_text(encoding="utf-8"))
    assert "docs/index.md" in found
    assert any(target.startswith("docs/screenshots/") for target in found)
    assert breaking_links('[a](https://x.example) [b](#here) <https://y.example> ![c](./c.png "t")') == [
        "./c.png"
    ]


def test_the_pytest_plugin_is_an_entry_point(flask_gateway_wheel: Path):
    entry_points = configparser.ConfigParser()
    entry_points.read_string(
        _wheel_text(flask_gateway_wheel, f"{_dist_info(flask_gateway_wheel)}/entry_points.txt")
    )
    assert dict(entry_points["pytest11"]) == {"flask_gateway": "flask_gateway.pytest_plugin"}


def test_the_sdist_holds_the_package_its_build_files_and_the_docs_only(
    flask_gateway_distributions: Distributions,
):
    with tarfile.open(flask_gateway_distributions.sdist) as archive:
        members = [PurePosixPath(name) for name in archive.getnames()]
    (root,) = {member.parts[0] for member in members}
    assert root == flask_gateway_distributions.sdist.name.removesuffix(".tar.gz")
    files = {PurePosixPath(*member.parts[1:]).as_posix() for member in members if len(member.parts) > 1}
    for required in ("pyproject.toml", "PKG-INFO", "LICENSE", "README.md", "docs/pypi.md", "docs/index.md"):
        assert required in files, required
    assert _package_files() <= files
    tops = {name.split("/")[0] for name in files}
    assert not tops & {"example_shop", "tests", "benchmarks", "scripts", ".ci", ".venv"}, tops


_SMOKE = """
import importlib.util, json, os, sys, tempfile

import flask_gateway
import flask_gateway.emulator
from flask import Flask
from flask_sqlalchemy import SQLAlchemy

here = tempfile.mkdtemp(dir=os.getcwd())
os.environ["EMULATOR_DATABASE_URL"] = f"sqlite:///{here}/emulator.sqlite3"
emulator = flask_gateway.emulator.create_app({"SECRET_KEY": "s" * 32})
client = emulator.test_client()
dashboard = client.get("/_emulator/")
dashboard_css = client.get("/static/emulator/dashboard.css")

db = SQLAlchemy()
shop = Flask("shop", instance_path=here)
shop.config.update(
    SECRET_KEY="k" * 32,
    SQLALCHEMY_DATABASE_URI=f"sqlite:///{here}/shop.sqlite3",
    GATEWAY_PUBLIC_URL="https://shop.example",
)
db.init_app(shop)
gateway = flask_gateway.Gateway(shop, db=db)
gateway.admin_guard(lambda: True)
with shop.app_context():
    db.create_all()
shop_client = shop.test_client()
admin = shop_client.get("/gateway/admin/")
admin_css = shop_client.get("/gateway/admin/static/gateway/admin.css")
print(json.dumps({
    "package": os.path.dirname(flask_gateway.__file__),
    "prefix": sys.prefix,
    "version": flask_gateway.__version__,
    "path": sys.path,
    "example_shop": importlib.util.find_spec("example_shop") is not None,
    "tests": importlib.util.find_spec("tests") is not None,
    "dashboard": [dashboard.status_code, b"dashboard.css" in dashboard.data],
    "dashboard_css": dashboard_css.status_code,
    "admin": [admin.status_code, b"admin.css" in admin.data],
    "admin_css": admin_css.status_code,
}))
"""


def test_the_wheel_works_in_a_fresh_venv_without_the_repository(wheel_venv: Path, tmp_path: Path):
    """From an empty folder, in isolated mode: the package is the installed one, its templates and static
    files are served, and neither the example shop nor the tests can be imported."""
    facts = json.loads(run_python(wheel_venv / "python", _SMOKE, cwd=tmp_path).splitlines()[-1])
    assert Path(facts["package"]).is_relative_to(facts["prefix"]), facts["package"]
    assert not [entry for entry in facts["path"] if entry and Path(entry).resolve() == ROOT]
    assert facts["version"] == flask_gateway.__version__
    assert facts["example_shop"] is False
    assert facts["tests"] is False
    assert facts["dashboard"] == [200, True]
    assert facts["dashboard_css"] == 200
    assert facts["admin"] == [200, True]
    assert facts["admin_css"] == 200


def test_the_long_descriptions_example_runs_from_the_wheel(
    wheel_venv: Path, flask_gateway_wheel: Path, tmp_path: Path
):
    """The code a reader of the index's page copies: ``create_app()`` works, the admin screens refuse
    (the guard says no), ``flask gateway init-db`` creates the tables."""
    _, description = _metadata(flask_gateway_wheel)
    (example,) = re.findall(r"```python\n(.*?)```", description, flags=re.DOTALL)
    (tmp_path / "shop.py").write_text(example, encoding="utf-8")
    check = (
        "import sys; sys.path.insert(0, '.')\n"
        "import shop\n"
        "app = shop.create_app()\n"
        "print(app.test_client().get('/gateway/admin/').status_code)\n"
    )
    assert run_python(wheel_venv / "python", check, cwd=tmp_path).strip() == "403"
    created = run_python(
        wheel_venv / "python",
        "import sys; sys.argv = ['flask', '--app', 'shop', 'gateway', 'init-db']; sys.path.insert(0, '.')\n"
        "from flask.cli import main; main()",
        cwd=tmp_path,
    )
    assert created.startswith("Created "), created


#: What docs/packaging.md says is the other project's, not this one's (the index's ``flask-gateway``).
_OTHER_PROJECTS_FILES = {"flask_gateway/cli.py"}


def test_every_file_packaging_md_names_is_in_the_wheel(flask_gateway_wheel: Path):
    """docs/packaging.md's file list is true: every ``flask_gateway/...`` path it names as this project's
    is in the built wheel (a file, or a folder of files), and the other project's are not."""
    names = set(_wheel_names(flask_gateway_wheel))
    page = (ROOT / "docs" / "packaging.md").read_text(encoding="utf-8")
    named = set(re.findall(r"`(flask_gateway/[\w./-]*)`", page))
    assert len(named) >= 4, named
    ours = named - _OTHER_PROJECTS_FILES
    missing = sorted(
        path
        for path in ours
        if path not in names
        and not any(name.startswith(path.rstrip("/") + "/") for name in names)
        and path != "flask_gateway/core/ruff.toml"  # named as what stays out
    )
    assert missing == []
    assert "flask_gateway/core/ruff.toml" not in names
    assert not _OTHER_PROJECTS_FILES & names


def _install_today() -> list[list[str]]:
    """The commands of docs/packaging.md's "Installing before the first release" block, as words."""
    page = (ROOT / "docs" / "packaging.md").read_text(encoding="utf-8")
    block = page.split("<!-- install-today:", 1)[1].split("```sh\n", 1)[1].split("```", 1)[0]
    return [
        shlex.split(line.split("#", 1)[0]) for line in block.splitlines() if line.split("#", 1)[0].strip()
    ]


def test_the_install_commands_that_work_today_work_as_typed(venv_template: Path, tmp_path: Path):
    """docs/packaging.md's commands for today (the package is not on the index yet), typed in fresh
    environments with a clone of the checkout standing in as ``./flask-gateway``: from the clone, and from
    the wheel ``python -m build`` writes there."""
    commands = _install_today()
    assert [words[:2] for words in commands] == [["pip", "install"], ["python", "-m"], ["pip", "install"]]
    source_tree(tmp_path / "flask-gateway")  # the clone: the files git knows of
    from_clone = copy_venv(venv_template, tmp_path / "from-clone")
    from_wheel = copy_venv(venv_template, tmp_path / "from-wheel")
    for number, words in enumerate(commands):
        if words[0] == "pip":
            python = from_wheel if number == 2 else from_clone
            command = [str(python), "-m", *words]
        else:  # python -m build: the checkout's environment has build (make setup), as the page says
            command = [sys.executable, *words[1:]]
        ran = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=900, check=False)
        assert ran.returncode == 0, (words, ran.stdout[-3000:], ran.stderr[-3000:])
    check = (
        "import importlib.metadata as m, flask_gateway, flask_gateway.emulator;"
        "print(m.version('flask-bnpl-gateway'), flask_gateway.Gateway.__name__)"
    )
    for python in (from_clone, from_wheel):
        assert run_python(python, check, tmp_path).split() == [flask_gateway.__version__, "Gateway"]
