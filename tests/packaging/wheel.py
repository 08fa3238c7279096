"""Flask-Gateway as a package index serves it, and a Python that has only that: for tests that must not
see the repository.

- ``source_tree(dest)`` copies the files git knows of (tracked, or new and not ignored): what a clone
  holds, with the work not yet committed. A build there sees no leftovers of the checkout (``build/``,
  ``flask_gateway.egg-info``, caches) and writes nothing into it (others may be working in it).
- ``build_distributions(dest)`` runs ``python -m build`` on such a copy: the sdist, then the wheel built
  from the sdist, as a user's pip would (isolated, with the ``[build-system]`` requirements).
- ``build_wheel(dest)`` is the same, returning the wheel.
- ``build_wheel_from_tree(dest)`` builds the wheel straight from such a copy (``python -m build --wheel``),
  without the sdist: the release check compares it with the wheel built from the sdist.
- ``fresh_venv(path, *requirements)`` makes a virtual environment with nothing of the repository's, installs
  ``requirements`` (a wheel's path, package names) with their dependencies from the package index, and
  returns its Python.
- ``copy_venv(template, path)`` copies a virtual environment ``fresh_venv`` made (with nothing installed):
  the same fresh environment in a fraction of a second instead of ``venv``'s several (its ``ensurepip``).
- ``run_python(python, code, cwd)`` runs code there in isolated mode (``-I``: no ``PYTHONPATH``, no user
  site, not even the current folder on ``sys.path``).

``tests/conftest.py`` builds on these: the session fixtures ``flask_gateway_wheel``, ``venv_template`` and
``wheel_venv``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Generous: pip may have to fetch setuptools or a dependency from the index when its cache lacks it.
BUILD_TIMEOUT = 600
INSTALL_TIMEOUT = 900


@dataclass(frozen=True)
class Distributions:
    sdist: Path
    wheel: Path


def _environment() -> dict[str, str]:
    """The environment of a build or a fresh venv: nothing that points back at the repository or its venv."""
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in {"PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP"}
    }
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def _run(command: list[str], *, cwd: Path | None = None, timeout: float) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        command, cwd=cwd, env=_environment(), capture_output=True, text=True, timeout=timeout, check=False
    )
    if result.returncode != 0:
        raise RuntimeError(
            f"{' '.join(command)} failed ({result.returncode}):\n{result.stdout[-6000:]}\n{result.stderr[-6000:]}"
        )
    return result


def source_files(root: Path = ROOT) -> list[Path]:
    """The files of the checkout that git knows of (tracked or new, not ignored), relative to ``root``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=root,
        capture_output=True,
        check=True,
    ).stdout.decode()
    names = sorted({name for name in listed.split("\0") if name})
    # A tracked file deleted in the work tree is listed too: only what is there.
    return [Path(name) for name in names if (root / name).is_file()]


def source_tree(dest: Path, root: Path = ROOT) -> Path:
    """A copy of the checkout's source files in ``dest`` (created); returns ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    for name in source_files(root):
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, target)
    return dest


def build_distributions(dest: Path) -> Distributions:
    """The sdist and the wheel (built from the sdist) of the checkout, in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    source = source_tree(dest / "source")
    out = dest / "dist"
    _run([sys.executable, "-m", "build", "--outdir", str(out), str(source)], timeout=BUILD_TIMEOUT)
    sdists = sorted(out.glob("*.tar.gz"))
    wheels = sorted(out.glob("*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        raise RuntimeError(f"expected one sdist and one wheel in {out}, found {sorted(out.iterdir())}")
    return Distributions(sdist=sdists[0], wheel=wheels[0])


def build_wheel(dest: Path) -> Path:
    """The checkout's wheel (built from its sdist), in ``dest``."""
    return build_distributions(dest).wheel


def build_wheel_from_tree(dest: Path) -> Path:
    """The checkout's wheel built straight from (a copy of) its files, not from the sdist, in ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    source = source_tree(dest / "source")
    out = dest / "dist"
    _run([sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(source)], timeout=BUILD_TIMEOUT)
    (wheel,) = out.glob("*.whl")
    return wheel


def venv_bin(venv: Path) -> Path:
    return venv / ("Scripts" if os.name == "nt" else "bin")


def fresh_venv(path: Path, *requirements: str) -> Path:
    """A new virtual environment at ``path`` with ``requirements`` installed (dependencies resolved from the
    package index; pip's cache makes it quick); returns its Python."""
    _run([sys.executable, "-m", "venv", str(path)], timeout=INSTALL_TIMEOUT)
    python = venv_bin(path) / "python"
    if requirements:
        _run([str(python), "-m", "pip", "install", "--quiet", *requirements], timeout=INSTALL_TIMEOUT)
    return python


def copy_venv(template: Path, path: Path, *requirements: str) -> Path:
    """A copy at ``path`` of the virtual environment ``template`` (as ``fresh_venv`` made it, nothing
    installed since), with ``requirements`` installed as ``fresh_venv`` does; returns its Python.

    What names the template's folder is made to name the copy's: ``pyvenv.cfg``, the ``activate`` scripts,
    the shebang of its ``pip`` scripts. Its interpreter is a symlink to the base Python, as in any venv, and
    its ``sys.prefix`` is the folder it is in (``pyvenv.cfg`` beside ``bin``): the copy is a fresh venv."""
    shutil.copytree(template, path, symlinks=True)
    old, new = str(template.resolve()), str(path.resolve())
    for file in [path / "pyvenv.cfg", *venv_bin(path).iterdir()]:
        if file.is_symlink() or not file.is_file():
            continue
        try:
            text = file.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        if old in text:
            file.write_text(text.replace(old, new), encoding="utf-8")
    python = venv_bin(path) / "python"
    if requirements:
        _run([str(python), "-m", "pip", "install", "--quiet", *requirements], timeout=INSTALL_TIMEOUT)
    return python


def run_python(python: Path, code: str, cwd: Path, *, timeout: float = 120) -> str:
    """Run ``code`` with ``python -I`` in ``cwd``; its standard output (raises with its output on failure)."""
    return _run([str(python), "-I", "-c", code], cwd=cwd, timeout=timeout).stdout
