"""The front door: every name in ``flask_gateway.__all__`` resolves, and is what its module defines."""

from __future__ import annotations

import subprocess
import sys

import flask_gateway


def test_every_public_name_resolves_to_its_definition():
    for name in flask_gateway.__all__:
        value = getattr(flask_gateway, name)
        module = flask_gateway._MODULE_OF.get(name)
        if module is not None:
            assert value is getattr(sys.modules[module], name), name
    assert sorted(flask_gateway.__all__) == sorted(set(flask_gateway.__all__))
    assert dir(flask_gateway) == sorted(flask_gateway.__all__)


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
