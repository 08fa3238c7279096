"""The floors of docs/architecture.md, read from the code's own imports (``ast``, nothing is imported)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from functools import cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "flask_gateway"

#: Floor of each top-level module or sub-package of the extension (docs/architecture.md); the core is 0.
#: A module may import its own floor and those below; a sub-package's modules count as the sub-package.
FLOORS = {
    # the front door, the test kit and the documented Celery path (a re-export of operations.tasks)
    **dict.fromkeys(["__init__", "testing", "pytest_plugin", "tasks"], 8),
    "extension": 7,  # the wiring: init_app, the blueprints, the CLI group, the embedded emulator
    "web": 6,  # the owner's screens and the gateway-facing blueprint
    "operations": 5,  # CLI, doctor, reconcile, health, metrics, rate limits, drift, outages, Celery tasks
    "inbound": 4,  # what the gateway sends: callbacks, v1 outcomes, shoppers coming back
    "payments": 3,  # the money's path: checkouts, transitions, refunds, polling, outbox
    **dict.fromkeys(["state", "urls"], 2),
    **dict.fromkeys(
        ["clock", "config", "errors", "models", "secrets", "signals", "labels", "signing", "_version"], 1
    ),
    "core": 0,
}

#: The role sub-packages, bottom to top: each ``__init__`` says in two lines what lives there and what it imports.
SUB_PACKAGES = ("payments", "inbound", "operations", "web")


#: The top-floor modules that join a shop app and an emulator (docs/architecture.md).
_SEES_BOTH = frozenset({"flask_gateway.testing", "flask_gateway.pytest_plugin"})


def _sees_both(module: str) -> bool:
    """One of :data:`_SEES_BOTH`, or a module of one of them that is a package (``flask_gateway.testing.pool``)."""
    return any(module == name or module.startswith(f"{name}.") for name in _SEES_BOTH)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> Iterator[tuple[str, int, bool]]:
    """(imported module, line, at module level) for every ``flask_gateway`` import of ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    top_level = {id(node) for node in tree.body}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("flask_gateway"):
            # ``from flask_gateway import signals`` imports the submodule; ``from x import name`` imports x.
            submodules = [f"{node.module}.{alias.name}" for alias in node.names]
            modules = _modules()
            targets = [name for name in submodules if name in modules] or [node.module]
            for name in targets:
                yield name, node.lineno, id(node) in top_level or _in_type_checking(tree, node)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("flask_gateway"):
                    yield alias.name, node.lineno, id(node) in top_level


def _in_type_checking(tree: ast.Module, target: ast.AST) -> bool:
    return any(
        isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
        and any(child is target for child in ast.walk(node))
        for node in tree.body
    )


@cache
def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in PACKAGE.rglob("*.py")}


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for imported, _line, _top in _imports(path):
            if imported in modules and imported != name:
                graph[name].add(imported)
    return graph


def _floor(module: str) -> int | None:
    parts = module.split(".")
    if len(parts) == 1:
        return FLOORS["__init__"]
    if parts[1] == "emulator":
        return None
    return FLOORS.get(parts[1])


def test_every_module_of_the_extension_has_a_floor():
    unplaced = [m for m in _modules() if m.split(".")[1:2] != ["emulator"] and _floor(m) is None]
    assert unplaced == [], "add them to FLOORS and to docs/architecture.md"


def test_no_import_circle():
    graph = _graph()
    state: dict[str, int] = {}
    circles: list[list[str]] = []

    def visit(node: str, trail: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                circles.append([*trail[trail.index(nxt) :], nxt] if nxt in trail else [node, nxt])
            elif nxt not in state:
                visit(nxt, [*trail, nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert circles == []


def _upward(graph: dict[str, set[str]]) -> list[str]:
    """Every import of ``graph`` that runs to a higher floor (or crosses between the emulator and the extension)."""
    upward = []
    for module, imported in ((m, i) for m, targets in graph.items() for i in targets):
        low, high = _floor(module), _floor(imported)
        if module.startswith("flask_gateway.emulator"):
            ok = imported.startswith(
                ("flask_gateway.core", "flask_gateway.emulator", "flask_gateway._version")
            )
        elif module.startswith("flask_gateway.core"):
            ok = imported.startswith(("flask_gateway.core", "flask_gateway._version"))
        elif module == "flask_gateway.extension" and imported == "flask_gateway.emulator":
            ok = True  # GATEWAY_ENVIRONMENT="embedded": the wiring floor mounts the emulator (its front only)
        else:
            ok = _sees_both(module) or (low is not None and high is not None and high <= low)
        if not ok:
            upward.append(f"{module} -> {imported}")
    return sorted(upward)


def test_nothing_imports_upward():
    assert _upward(_graph()) == []


def test_a_planted_upward_import_is_caught():
    """The check above fails on the imports a later change could add: the money's path reaching for a screen
    or for operations, a callback reaching for the CLI, the ground floor reaching for the money's path."""
    planted = {
        "flask_gateway.payments.transitions": "flask_gateway.web.admin.checkouts",
        "flask_gateway.payments.checkouts": "flask_gateway.operations.health",
        "flask_gateway.inbound.callbacks": "flask_gateway.operations.cli",
        "flask_gateway.state": "flask_gateway.payments.outbox",
        "flask_gateway.operations.doctor.runner": "flask_gateway.extension",
    }
    graph = _graph()
    assert all(module in graph and imported in graph for module, imported in planted.items())
    for module, imported in planted.items():
        graph[module].add(imported)
    assert _upward(graph) == sorted(f"{module} -> {imported}" for module, imported in planted.items())


def test_each_sub_package_says_what_lives_there_and_what_it_imports():
    for name in SUB_PACKAGES:
        module = ast.parse((PACKAGE / name / "__init__.py").read_text(encoding="utf-8"))
        docstring = ast.get_docstring(module, clean=False) or ""
        assert len(docstring.splitlines()) == 2, name
        assert "import" in docstring.lower(), name
        # Past the docstring, at most the names its importers use, re-exported: no code of its own.
        code = [node for node in module.body[1:] if not isinstance(node, (ast.ImportFrom, ast.Assign))]
        assert code == [], f"{name}/__init__.py re-exports at most"


def test_the_floors_of_the_sub_packages_go_up_in_order():
    assert [FLOORS[name] for name in SUB_PACKAGES] == sorted({FLOORS[name] for name in SUB_PACKAGES})


def test_the_top_level_holds_only_the_ground_floor_and_the_entry_points():
    """What lies directly in ``flask_gateway/``: the packages, and modules whose floor is written above."""
    top = {path.stem for path in PACKAGE.glob("*.py")} | {
        path.name for path in PACKAGE.iterdir() if (path / "__init__.py").exists()
    }
    assert top == set(FLOORS) | {"emulator"}


def test_the_emulator_never_imports_the_extension_which_only_mounts_it():
    crossing = [
        f"{module} -> {imported}"
        for module, targets in _graph().items()
        for imported in targets
        if not _sees_both(module)
        and module != "flask_gateway"
        and not (module == "flask_gateway.extension" and imported == "flask_gateway.emulator")
        and module.startswith("flask_gateway.emulator") != imported.startswith("flask_gateway.emulator")
        and not imported.startswith(("flask_gateway.core", "flask_gateway._version"))
    ]
    assert crossing == []


def test_a_function_level_import_says_why():
    unexplained = []
    for name, path in _modules().items():
        lines = path.read_text(encoding="utf-8").splitlines()
        for _imported, line, top in _imports(path):
            if top:
                continue
            here, before = lines[line - 1], lines[line - 2] if line > 1 else ""
            if "#" not in here and not before.strip().startswith("#"):
                unexplained.append(f"{name}:{line}")
    assert sorted(set(unexplained)) == []
