"""The front door: its one table (``flask_gateway/__init__.pyi``) is what ``__all__``, ``dir()`` and the lazy
loading serve, and every name in it is what its module defines."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import flask_gateway

TABLE = Path(flask_gateway.__file__).with_suffix(".pyi")


def table() -> dict[str, str]:
    """Each public name of the table and the module it comes from."""
    names: dict[str, str] = {}
    for node in ast.parse(TABLE.read_text()).body:
        if isinstance(node, ast.Expr | ast.AnnAssign):  # the docstring, the declaration of __all__
            continue
        assert isinstance(node, ast.ImportFrom) and node.level == 1 and node.module, ast.dump(node)
        for alias in node.names:
            # "Name as Name": re-exported for type checkers; another alias would be served as its original name.
            assert alias.asname == alias.name, f"{node.module}: {alias.name} as {alias.asname}"
            assert alias.name not in names, f"{alias.name} listed twice"
            names[alias.name] = f"flask_gateway.{node.module}"
    return names


def test_every_public_name_resolves_to_its_definition():
    names = table()
    assert len(names) > 100
    assert flask_gateway.__all__ == sorted(names)
    assert dir(flask_gateway) == sorted(names)
    for name, module in names.items():
        assert getattr(flask_gateway, name) is getattr(importlib.import_module(module), name), name


def test_a_name_not_in_the_table_is_an_attribute_error():
    with pytest.raises(AttributeError):
        getattr(flask_gateway, "not_a_public_name")  # noqa: B009
    assert "_version" not in flask_gateway.__all__


def test_no_public_name_is_shadowed_by_a_submodule():
    """A submodule named like a public name (``flask_gateway.reconcile``) would replace it once imported."""
    code = (
        "import importlib, pkgutil, flask_gateway\n"
        "for info in pkgutil.iter_modules(flask_gateway.__path__):\n"
        "    importlib.import_module('flask_gateway.' + info.name)\n"
        "import types\n"
        "print(sorted(n for n in flask_gateway.__all__ "
        "if isinstance(getattr(flask_gateway, n), types.ModuleType)))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_the_front_door_imports_neither_flask_nor_sqlalchemy():
    code = (
        "import sys, flask_gateway\n"
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'flask', 'sqlalchemy', 'flask_sqlalchemy'}))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
