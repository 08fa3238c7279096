"""Sphinx configuration: the documentation site built from the Markdown pages in docs/ (MyST).

Build it with ``make docs`` (``sphinx-build -E -W --keep-going -n -b html docs docs/_build/html``): warnings
are errors and every cross-reference is checked (nitpicky), which includes every internal link between pages
and every ``page.md#heading`` anchor (``myst_heading_anchors``). docs/packaging.md says what the site is.
"""

from __future__ import annotations

import ast
import builtins
import collections.abc
import dataclasses
import importlib
import inspect
import os
import re
import sys
import tomllib
import typing
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# Read the Docs and a plain checkout both build from the source tree, not from an installed copy.
sys.path.insert(0, str(ROOT))

import flask_gateway  # noqa: E402

project = "Flask-Gateway"
author = "Flask-Gateway contributors"
copyright = "Flask-Gateway contributors"
release = flask_gateway.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
]

source_suffix = {".md": "markdown"}
root_doc = "index"
# openapi.json and the screenshots are files the pages link to or show, not pages: only *.md is read, and
# the links to them are handled below. _build is the output.
exclude_patterns = ["_build"]

# -- MyST --------------------------------------------------------------------------------------------------
# Anchors for headings down to ####, named as GitHub names them, so that `operations.md#metrics-and-alerts`
# works the same on the site and in the repository; a link to an anchor that does not exist is a warning.
myst_heading_anchors = 4

# -- Checking ----------------------------------------------------------------------------------------------
nitpicky = True
# The build runs offline (CI and a developer's machine reach package registries only), so other projects'
# documentation is not linked (intersphinx would fetch their inventories): names from them in signatures
# are shown as text. Everything of this project's own must resolve.
_OTHER_PROJECTS = (
    "flask",
    "werkzeug",
    "jinja2",
    "sqlalchemy",
    "flask_sqlalchemy",
    "requests",
    "pydantic",
    "pydantic_core",
    "blinker",
    "cachetools",
    "limits",
    "flask_limiter",
    "prometheus_client",
    "cryptography",
    "pytest",
    "_pytest",
    "click",
    "celery",
    "alembic",
    "datetime",
    "decimal",
    "enum",
    "collections",
    "typing",
    "types",
    "logging",
    "pathlib",
    "threading",
    "concurrent",
    "contextlib",
    "uuid",
    "email",
    "http",
    "urllib",
    "smtplib",
    "ssl",
    "socket",
    "sqlite3",
    "zoneinfo",
    "random",
    "annotated_types",
)
# Built-in types and typing's names as signatures print them (str, Any, Callable): Python's own.
nitpick_ignore = [
    (role, name)
    for role in ("py:class", "py:exc", "py:data", "py:obj", "py:func")
    for name in {*dir(builtins), *dir(typing), *dir(collections.abc)}
    if not name.startswith("_")
]
nitpick_ignore_regex = [
    (r"py:.*", rf"({'|'.join(_OTHER_PROJECTS)})(\..*)?"),
    # Type variables (Gateway.admin_guard returns the guard it was given; ApiResponse[T]), not classes.
    (r"py:class", r"flask_gateway\.extension\.(GuardT|ResolverT)"),
    (r"py:class", r"flask_gateway\.core\.http\.T_co"),
]

# -- API reference (api.md) --------------------------------------------------------------------------------
autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = False
# Only this project's docstrings: a method that overrides SQLAlchemy's or requests' would otherwise show
# theirs, with references into their documentation.
autodoc_inherit_docstrings = False
# Signatures come from the objects, never from a docstring's first line: a dataclass without a docstring
# gets one generated from its fields, with the annotations as quoted strings (dropped below).
autodoc_docstring_signature = False
# The front door's names are documented where a shop imports them (flask_gateway.X): the page uses the
# names of flask_gateway.__all__, and _check_front_door below makes a name missing from it a warning.

# Names imported for type checking only (`if TYPE_CHECKING:`) reach a signature as the bare name: those of
# other projects are shown as text like the rest of them (the list is what the signatures print).
nitpick_ignore += [
    ("py:class", name)
    for name in ("Flask", "SQLAlchemy", "Session", "scoped_session", "Engine", "Limit", "SansIOResponse")
]

# -- HTML --------------------------------------------------------------------------------------------------
html_theme = "furo"
html_title = f"Flask-Gateway {release}"
html_static_path: list[str] = []
# Sphinx's built-in search (searchindex.js): nothing to configure.

# -- Links to files outside docs/ --------------------------------------------------------------------------
# A few pages link to files elsewhere in the repository (`../tests/documented/FACTS.md`). Those work when
# the Markdown is read in the repository; on the site they become links to the same file on the project's
# repository, at the commit that was built. The repository's address comes from pyproject.toml's
# [project.urls] ("Source" or "Repository"), or from Read the Docs' own variables when it builds; with
# neither (a local build of a checkout without a published address), the link is shown as the file's path
# in the repository, as text, rather than pointing anywhere made up.


def _repository_url() -> str | None:
    urls = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"].get("urls", {})
    for key in ("Source", "Repository", "Source Code"):
        if key in urls:
            return str(urls[key]).removesuffix(".git").rstrip("/")
    clone = os.environ.get("READTHEDOCS_GIT_CLONE_URL", "")
    if clone.startswith("https://"):
        return clone.removesuffix(".git").rstrip("/")
    return None


REPOSITORY_URL = _repository_url()
REPOSITORY_REF = os.environ.get("READTHEDOCS_GIT_COMMIT_HASH") or "main"
_OUTSIDE = re.compile(r"\[([^\]]*)\]\(\.\./([^)#\s]+)(#[^)\s]*)?\)")


def _link_outside_docs(match: re.Match[str]) -> str:
    text, path, anchor = match.group(1), match.group(2), match.group(3) or ""
    if REPOSITORY_URL is None:
        return f"`{path}`"
    return f"[{text}]({REPOSITORY_URL}/blob/{REPOSITORY_REF}/{path}{anchor})"


def _rewrite_outside_links(app: Any, docname: str, source: list[str]) -> None:
    source[0] = _OUTSIDE.sub(_link_outside_docs, source[0])


# -- The front door's #: comments --------------------------------------------------------------------------
# A constant or a signal has no docstring of its own: its documentation is the `#:` comment where it is
# defined. autodoc reads those comments in the module a name is documented under (flask_gateway), so for
# the front door's re-exported data the comment is looked up in the module that defines it, following the
# imports.


def _attribute_comment(module_name: str, name: str, seen: frozenset[str] = frozenset()) -> list[str] | None:
    from sphinx.pycode import ModuleAnalyzer

    if module_name in seen:
        return None
    analyzer = ModuleAnalyzer.for_module(module_name)
    comment = analyzer.find_attr_docs().get(("", name))
    if comment:
        return list(comment)
    tree = ast.parse(analyzer.code)
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.ImportFrom)
            and node.module
            and any(alias.name == name for alias in node.names)
        ):
            found = _attribute_comment(node.module, name, seen | {module_name})
            if found:
                return found
    # A package whose names are served lazily from its stub's table (flask_gateway/__init__.pyi).
    stub = Path(importlib.import_module(module_name).__file__ or "").with_suffix(".pyi")
    if stub.name == "__init__.pyi" and stub.is_file():
        for node in ast.parse(stub.read_text()).body:
            if isinstance(node, ast.ImportFrom) and any(alias.name == name for alias in node.names):
                return _attribute_comment(f"{module_name}.{node.module}", name, seen | {module_name})
    return None


def _front_door_data(app: Any, what: str, name: str, obj: Any, options: Any, lines: list[str]) -> None:
    if what == "class" and dataclasses.is_dataclass(obj) and "".join(lines).startswith(f"{obj.__name__}("):
        lines[:] = []  # the docstring dataclass() made up: the signature again
        return
    if what != "data" or not name.startswith("flask_gateway."):
        return
    module_name, _, attribute = name.rpartition(".")
    comment = _attribute_comment(module_name, attribute)
    if comment:
        lines[:] = comment
    elif type(obj).__doc__ and "\n".join(lines).strip() == inspect.cleandoc(type(obj).__doc__):
        lines[:] = []  # not its documentation: its type's (str's for __version__)


# -- Signatures ----------------------------------------------------------------------------------------------
# A pydantic model's generated signature lists every field with its validation metadata (annotated_types,
# patterns, JSON Schema examples): unreadable, and not how a shop builds one (by field name or wire alias,
# protocol.md). The class is shown without it; its docstring says what the message is.


def _no_model_signature(
    app: Any,
    what: str,
    name: str,
    obj: Any,
    options: Any,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str, str] | None:
    from pydantic import BaseModel

    if what == "class" and isinstance(obj, type) and issubclass(obj, BaseModel):
        return ("", "")
    if signature and "<factory>" in signature:
        # A dataclass field with a default_factory prints its default as <factory>, which is not Python:
        # Sphinx then splits the signature at every comma (list[tuple[int, str]] in pieces). `...` says
        # "has a default" and parses.
        return (signature.replace("<factory>", "..."), return_annotation or "")
    return None


# -- Every exported name is in the reference ---------------------------------------------------------------


def _check_front_door(app: Any, env: Any) -> None:
    from sphinx.util import logging

    documented = set(env.get_domain("py").objects)
    for module_name in (
        "flask_gateway",
        "flask_gateway.emulator",
        "flask_gateway.testing",
        "flask_gateway.pytest_plugin",
    ):
        module = importlib.import_module(module_name)
        for name in module.__all__:
            if f"{module_name}.{name}" not in documented:
                logging.getLogger(__name__).warning(
                    "%s.%s is exported (__all__) but not in the API reference (api.md)", module_name, name
                )


# -- Short names in docstrings ------------------------------------------------------------------------------
# A docstring names its neighbours shortly (:class:`GatewayCollector` in flask_gateway.metrics), and a type
# imported for type checking reaches a signature as its bare name (``CallbackLog``). The page documents the
# front door's names under flask_gateway, so such a name is looked up the way Sphinx's `.name` syntax does:
# anywhere in the reference, by its last part. Not found, or found twice, it stays a warning.


def _resolve_short_name(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    if node.get("refdomain") != "py" or node.get("refspecific"):
        return None
    target = node.get("reftarget", "")
    if not target or "." in target.strip("~"):
        return None
    short = node.copy()
    short["refspecific"] = True
    domain = env.get_domain("py")
    return domain.resolve_xref(env, node["refdoc"], app.builder, node["reftype"], target, short, contnode)


def setup(app: Any) -> None:
    from pygments.lexers.special import TextLexer

    # Pygments has no lexer for a crontab or an HAProxy configuration (operations.md's recipes): plain text.
    app.add_lexer("cron", TextLexer)
    app.add_lexer("haproxy", TextLexer)
    app.connect("source-read", _rewrite_outside_links)
    app.connect("autodoc-process-docstring", _front_door_data)
    app.connect("autodoc-process-signature", _no_model_signature)
    app.connect("env-check-consistency", _check_front_door)
    app.connect("missing-reference", _resolve_short_name)
