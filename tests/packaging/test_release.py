"""A release of the distribution (issue 24, "Ship it"; docs/packaging.md): its name, one version, the
classifiers, ``twine check --strict`` on what ``python -m build`` makes, a wheel built from the sdist the
same as one built from the checkout, and what happens beside the index's unrelated ``flask-gateway``.

The sdist and the wheel are the session's (``flask_gateway_distributions``, built once: tests/conftest.py);
the wheel built straight from the checkout is this module's own build.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.metadata
import json
import re
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from email.parser import Parser
from email.policy import compat32
from pathlib import Path

import pytest
import trove_classifiers
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

import flask_gateway
from flask_gateway._version import DISTRIBUTION
from flask_gateway.operations.doctor import Options, check_package
from tests.packaging.wheel import ROOT, Distributions, build_wheel_from_tree, copy_venv, run_python

PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
VERSION = flask_gateway.__version__
#: The file-name form of the name (wheel and sdist names, the dist-info folder).
FILE_NAME = DISTRIBUTION.replace("-", "_")


def _headers(text: str) -> dict[str, list[str]]:
    headers: dict[str, list[str]] = {}
    for key, value in Parser(policy=compat32).parsestr(text).items():
        headers.setdefault(key, []).append(value)
    return headers


def _wheel_metadata(wheel: Path) -> dict[str, list[str]]:
    with zipfile.ZipFile(wheel) as archive:
        return _headers(archive.read(f"{FILE_NAME}-{VERSION}.dist-info/METADATA").decode("utf-8"))


def _sdist_metadata(sdist: Path) -> dict[str, list[str]]:
    with tarfile.open(sdist) as archive:
        member = archive.extractfile(f"{FILE_NAME}-{VERSION}/PKG-INFO")
        assert member is not None
        return _headers(member.read().decode("utf-8"))


# --- the name and the version ----------------------------------------------------------------------------


def test_the_distribution_is_named_flask_bnpl_gateway_in_one_place():
    """pyproject.toml's literal name and ``_version.DISTRIBUTION`` (what the doctor asks importlib for)."""
    assert PYPROJECT["project"]["name"] == DISTRIBUTION == "flask-bnpl-gateway"
    # The import name and the pytest plugin's name do not move with it (`pytest -p no:flask_gateway`).
    assert PYPROJECT["project"]["entry-points"]["pytest11"] == {
        "flask_gateway": "flask_gateway.pytest_plugin"
    }
    assert PYPROJECT["project"]["dynamic"] == ["version"]
    assert PYPROJECT["tool"]["setuptools"]["dynamic"]["version"] == {
        "attr": "flask_gateway._version.__version__"
    }


def test_the_installed_metadata_is_the_version_of_the_code_that_runs():
    """The development environment (``pip install -e '.[dev]'``): one distribution provides flask_gateway,
    this one, at ``flask_gateway.__version__``. A leftover install under the former name would show here."""
    assert importlib.metadata.version(DISTRIBUTION) == VERSION
    providers = importlib.metadata.packages_distributions()["flask_gateway"]
    assert {canonicalize_name(name) for name in providers} == {DISTRIBUTION}
    assert Version(VERSION) == Version(VERSION.strip())  # a valid PEP 440 version, no stray spaces


def test_the_built_files_carry_the_name_and_the_version(flask_gateway_distributions: Distributions):
    sdist, wheel = flask_gateway_distributions.sdist, flask_gateway_distributions.wheel
    assert wheel.name == f"{FILE_NAME}-{VERSION}-py3-none-any.whl"
    assert sdist.name == f"{FILE_NAME}-{VERSION}.tar.gz"
    with tarfile.open(sdist) as archive:
        assert not [name for name in archive.getnames() if "/docs/_build/" in name], "Sphinx's output shipped"
    for headers in (_wheel_metadata(wheel), _sdist_metadata(sdist)):
        assert headers["Name"] == [DISTRIBUTION]
        assert headers["Version"] == [VERSION]
        assert headers["Requires-Python"] == [PYPROJECT["project"]["requires-python"]]


def test_the_wheel_installed_in_a_fresh_venv_reports_one_version(wheel_venv: Path, tmp_path: Path):
    said = run_python(
        wheel_venv / "python",
        "import importlib.metadata as m, json, flask_gateway\n"
        "print(json.dumps([m.version('flask-bnpl-gateway'), flask_gateway.__version__,"
        " sorted(set(m.packages_distributions()['flask_gateway']))]))",
        cwd=tmp_path,
    )
    metadata_version, package_version, providers = json.loads(said.splitlines()[-1])
    assert metadata_version == package_version == VERSION
    assert [canonicalize_name(name) for name in providers] == [DISTRIBUTION]


# --- classifiers -------------------------------------------------------------------------------------------

_PYTHON = re.compile(r"Programming Language :: Python :: (3\.\d+)")


def test_the_classifiers_exist_and_say_python_flask_typing_and_status(
    flask_gateway_distributions: Distributions,
):
    classifiers = PYPROJECT["project"]["classifiers"]
    assert _wheel_metadata(flask_gateway_distributions.wheel)["Classifier"] == classifiers
    # An index refuses an unknown classifier at upload; twine check does not look.
    assert [c for c in classifiers if c not in trove_classifiers.classifiers] == []
    assert [c for c in classifiers if c in trove_classifiers.deprecated_classifiers] == []
    assert len(set(classifiers)) == len(classifiers)
    for required in ("Framework :: Flask", "Typing :: Typed", "Programming Language :: Python :: 3 :: Only"):
        assert required in classifiers, required
    assert any(c.startswith("Topic :: Office/Business :: Financial") for c in classifiers)
    assert "Intended Audience :: Developers" in classifiers
    # PEP 639: `license = "MIT"` says it; setuptools refuses a License classifier beside it.
    assert PYPROJECT["project"]["license"] == "MIT"
    assert not [c for c in classifiers if c.startswith("License ::")]

    # The Python versions: each allowed by requires-python, the lowest allowed one listed, none skipped.
    allowed = SpecifierSet(PYPROJECT["project"]["requires-python"])
    listed = [Version(match.group(1)) for c in classifiers if (match := _PYTHON.fullmatch(c))]
    assert listed == sorted(listed) and listed, listed
    assert all(version in allowed for version in listed), (listed, allowed)
    assert Version("3.10") not in allowed and listed[0] == Version("3.11")
    assert [v.minor for v in listed] == list(range(listed[0].minor, listed[-1].minor + 1))
    assert f"3.{sys.version_info.minor}" in [str(v) for v in listed], "the Python that runs the suite"

    # One status, and docs/packaging.md says which and why.
    (status,) = [c for c in classifiers if c.startswith("Development Status :: ")]
    assert status in ("Development Status :: 3 - Alpha", "Development Status :: 4 - Beta")
    assert f"**{status}**" in (ROOT / "docs" / "packaging.md").read_text(encoding="utf-8")


# --- twine check and the wheel from the sdist ---------------------------------------------------------------


def _twine_check(*files: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "twine", "check", "--strict", *map(str, files)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_twine_check_strict_passes_on_the_sdist_and_the_wheel(flask_gateway_distributions: Distributions):
    checked = _twine_check(flask_gateway_distributions.sdist, flask_gateway_distributions.wheel)
    output = checked.stdout + checked.stderr
    assert checked.returncode == 0, output
    assert output.count("PASSED") == 2, output
    assert "WARNING" not in output, output


def test_twine_check_strict_would_catch_a_wheel_without_its_long_description(
    flask_gateway_distributions: Distributions, tmp_path: Path
):
    """The check above is not a formality: the same wheel with its METADATA body cut off fails."""
    original = flask_gateway_distributions.wheel
    broken = tmp_path / original.name
    metadata_name = f"{FILE_NAME}-{VERSION}.dist-info/METADATA"
    with zipfile.ZipFile(original) as source, zipfile.ZipFile(broken, "w") as target:
        for item in source.infolist():
            data = source.read(item)
            if item.filename == metadata_name:
                head = data.decode("utf-8").split("\n\n", 1)[0]
                data = "\n".join(
                    line for line in head.splitlines() if not line.startswith("Description-Content-Type")
                ).encode("utf-8")
            target.writestr(item, data)
    checked = _twine_check(broken)
    assert checked.returncode != 0, checked.stdout + checked.stderr
    assert "long_description" in checked.stdout + checked.stderr


@pytest.fixture(scope="module")
def wheel_from_the_checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel_from_tree(tmp_path_factory.mktemp("wheel-from-checkout"))


def _contents(wheel: Path) -> dict[str, str]:
    with zipfile.ZipFile(wheel) as archive:
        return {name: hashlib.sha256(archive.read(name)).hexdigest() for name in archive.namelist()}


def test_a_wheel_built_from_the_sdist_holds_the_same_files_as_one_built_from_the_checkout(
    flask_gateway_distributions: Distributions, wheel_from_the_checkout: Path
):
    """Nothing the wheel needs is missing from the sdist (MANIFEST.in, package-data): the same names,
    byte for byte (RECORD included, which lists every file's hash)."""
    from_sdist = _contents(flask_gateway_distributions.wheel)
    from_checkout = _contents(wheel_from_the_checkout)
    assert wheel_from_the_checkout.name == flask_gateway_distributions.wheel.name
    assert sorted(from_checkout.keys() - from_sdist.keys()) == [], "only in the wheel built from the checkout"
    assert sorted(from_sdist.keys() - from_checkout.keys()) == [], "only in the wheel built from the sdist"
    assert {name for name in from_sdist if from_sdist[name] != from_checkout[name]} == set()
    assert len(from_sdist) > 100  # the package, not an empty shell


# --- beside the index's flask-gateway -----------------------------------------------------------------------

#: The index's flask-gateway 0.1.0a0 (a reverse proxy): its wheel's files, with stand-in contents. A
#: stand-in rather than the real download: the same layout, no network, nothing that can change under us.
OTHER_FILES = {
    "flask_gateway/__init__.py": '"""The other project\'s package (a stand-in)."""\nOTHER_PROJECT = True\n',
    "flask_gateway/cli.py": "def main():\n    pass\n",
    "flask_gateway/gateway_server.py": "",
    "flask_gateway/patch.py": "",
    "flask_gateway/templates/index.html": "<!doctype html>\n",
}
OTHER_SUMMARY = "A Flask-based reverse proxy server for routing to sub-Flask apps"


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def other_project_wheel(folder: Path) -> Path:
    """A wheel named as the index's ``flask-gateway`` 0.1.0a0, holding its files."""
    dist_info = "flask_gateway-0.1.0a0.dist-info"
    files = {name: text.encode() for name, text in OTHER_FILES.items()}
    files[f"{dist_info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: flask-gateway\nVersion: 0.1.0a0\nSummary: {OTHER_SUMMARY}\n"
    ).encode()
    files[f"{dist_info}/WHEEL"] = (
        b"Wheel-Version: 1.0\nGenerator: tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    )
    files[f"{dist_info}/top_level.txt"] = b"flask_gateway\n"
    record = [_record_line(name, data) for name, data in files.items()] + [f"{dist_info}/RECORD,,"]
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / "flask_gateway-0.1.0a0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return wheel


def _pip(python: Path, *args: str) -> str:
    done = subprocess.run(
        [str(python), "-m", "pip", *args], capture_output=True, text=True, timeout=300, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout + done.stderr


def _site_packages(python: Path, cwd: Path) -> Path:
    return Path(run_python(python, "import sysconfig; print(sysconfig.get_path('purelib'))", cwd).strip())


_IMPORT = (
    "import json, flask_gateway\n"
    "try:\n    from flask_gateway import Gateway  # noqa\n    error = None\n"
    "except ImportError as exc:\n    error = str(exc)\n"
    "print(json.dumps([getattr(flask_gateway, '__file__', None), error]))"
)


def test_installed_over_this_project_the_other_flask_gateway_replaces_its_files_and_pip_says_nothing(
    flask_gateway_wheel: Path, venv_template: Path, tmp_path: Path
):
    """docs/packaging.md's list, the other project installed last: its ``__init__.py`` and ``cli.py`` replace
    ours without a word from pip, ``from flask_gateway import Gateway`` fails, and uninstalling it then
    deletes those files, leaving a package without its ``__init__.py``."""
    python = copy_venv(venv_template, tmp_path / "venv")  # a fresh venv
    # No dependencies: only the files matter here (nothing imports Flask).
    _pip(python, "install", "--no-deps", "--no-index", str(flask_gateway_wheel))
    said = _pip(python, "install", "--no-deps", "--no-index", str(other_project_wheel(tmp_path / "other")))
    assert "warning" not in said.lower() and "flask_gateway/" not in said, said
    site = _site_packages(python, tmp_path)
    assert (site / "flask_gateway" / "__init__.py").read_text() == OTHER_FILES["flask_gateway/__init__.py"]
    assert (site / "flask_gateway" / "cli.py").read_text() == OTHER_FILES["flask_gateway/cli.py"]
    assert (site / "flask_gateway" / "extension.py").is_file()  # ours, still there: a mix of the two
    listed = _pip(python, "list")
    assert re.search(r"^flask-gateway\s+0\.1\.0a0$", listed, re.MULTILINE), listed
    assert re.search(rf"^flask-bnpl-gateway\s+{re.escape(VERSION)}$", listed, re.MULTILINE), listed
    file, error = json.loads(run_python(python, _IMPORT, tmp_path).splitlines()[-1])
    assert file == str(site / "flask_gateway" / "__init__.py")
    assert error is not None and "cannot import name 'Gateway' from 'flask_gateway'" in error

    _pip(python, "uninstall", "--yes", "flask-gateway")
    assert not (site / "flask_gateway" / "__init__.py").exists()
    assert not (site / "flask_gateway" / "cli.py").exists()
    assert (site / "flask_gateway" / "extension.py").is_file()
    file, error = json.loads(run_python(python, _IMPORT, tmp_path).splitlines()[-1])
    assert file is None  # an empty namespace package
    assert error is not None and "cannot import name 'Gateway'" in error


def test_installed_over_the_other_flask_gateway_this_project_works_until_the_other_is_uninstalled(
    flask_gateway_wheel: Path, venv_template: Path, tmp_path: Path
):
    python = copy_venv(venv_template, tmp_path / "venv")  # a fresh venv
    _pip(python, "install", "--no-deps", "--no-index", str(other_project_wheel(tmp_path / "other")))
    said = _pip(python, "install", "--no-deps", "--no-index", str(flask_gateway_wheel))
    assert "warning" not in said.lower() and "flask_gateway/" not in said, said
    site = _site_packages(python, tmp_path)
    init = (site / "flask_gateway" / "__init__.py").read_text()
    # Ours, whole (the front door's table beside it: its names are loaded from __init__.pyi).
    assert init == (ROOT / "flask_gateway" / "__init__.py").read_text() and "OTHER_PROJECT" not in init
    assert (site / "flask_gateway" / "__init__.pyi").read_text() == (
        ROOT / "flask_gateway" / "__init__.pyi"
    ).read_text()
    assert (site / "flask_gateway" / "gateway_server.py").is_file()  # the other's, beside ours

    # Uninstalling the other project (say, the one installed by mistake) deletes the files it shared.
    _pip(python, "uninstall", "--yes", "flask-gateway")
    assert not (site / "flask_gateway" / "__init__.py").exists()
    assert not (site / "flask_gateway" / "cli.py").exists()
    assert (site / "flask_gateway" / "extension.py").is_file()
    # The way out (docs/packaging.md): uninstall both, install this one again.
    _pip(python, "uninstall", "--yes", DISTRIBUTION)
    _pip(python, "install", "--no-deps", "--no-index", str(flask_gateway_wheel))
    assert (site / "flask_gateway" / "__init__.py").read_text() == init
    assert (site / "flask_gateway" / "operations" / "cli" / "__init__.py").is_file()
    assert not (site / "flask_gateway" / "cli.py").exists()  # the other's only: gone with it


# --- flask gateway doctor's package check ------------------------------------------------------------------


def _dist_info(folder: Path, name: str, version: str, summary: str) -> None:
    dist_info = folder / f"{name.replace('-', '_')}-{version}.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\nSummary: {summary}\n", encoding="utf-8"
    )
    (dist_info / "top_level.txt").write_text("flask_gateway\n", encoding="utf-8")


def test_the_doctor_finds_this_distribution_alone():
    (finding,) = check_package(Options())
    assert (finding.check, finding.level) == ("package", "ok")
    assert (
        finding.message == f"flask-bnpl-gateway {VERSION}, the only installed distribution of flask_gateway"
    )


def test_the_doctor_names_the_other_flask_gateway_and_how_to_get_out(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    """Real metadata on ``sys.path`` (a dist-info folder, as pip leaves it), read by importlib.metadata."""
    _dist_info(tmp_path, "flask-gateway", "0.1.0a0", OTHER_SUMMARY)
    monkeypatch.syspath_prepend(str(tmp_path))

    (finding,) = check_package(Options())
    assert finding.level == "problem"
    assert finding.message.startswith(f"flask-gateway 0.1.0a0 ('{OTHER_SUMMARY}') is installed too")
    assert "uninstalling either deletes files the other needs" in finding.message
    assert finding.fix == (
        "pip uninstall flask-gateway flask-bnpl-gateway, then pip install flask-bnpl-gateway "
        "(docs/packaging.md#two-distributions-one-flask_gateway)"
    )


def test_the_doctor_sees_metadata_that_is_not_the_version_that_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    _dist_info(tmp_path, DISTRIBUTION, "9.9.9", "this project, another release")
    monkeypatch.syspath_prepend(str(tmp_path))

    (finding,) = check_package(Options())
    assert finding.level == "problem"
    assert finding.message == (
        f"the installed flask-bnpl-gateway says 9.9.9, but the flask_gateway that runs is {VERSION}: the "
        "files of two installs are mixed"
    )
    assert finding.fix.startswith("pip install --force-reinstall flask-bnpl-gateway==9.9.9")
