"""Every ``pip install`` the project shows names this distribution (issue 24): the index's ``flask-gateway``
is an unrelated project, and the docs once told every reader to install it.

The pages (``README.md``, the other Markdown files at the root but ``CHANGELOG.md``, ``docs/**/*.md``) are
read for commands in fenced code blocks and in inline code (``pip install`` alone in inline code names the
command, it is not one); a ``pip install`` in plain prose fails the test (put it in code, where a reader
copies it from and this test reads it). The error messages and docstrings of ``flask_gateway`` and
``example_shop`` that suggest an install are read too, and the Makefile. Each requirement must be
``flask-bnpl-gateway`` (or ``.``, the checkout) with extras that ``pyproject.toml`` declares, or one of
``THIRD_PARTY``. ``CHANGELOG.md`` is history: it may quote a command that was wrong (the docs' own
``pip install flask-gateway`` before 0.1.0), to tell a reader what to undo.
"""

from __future__ import annotations

import ast
import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from flask_gateway._version import DISTRIBUTION
from tests.packaging.wheel import ROOT

EXTRAS = set(
    tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
)

#: The other packages the pages legitimately tell a reader to install, and why. Anything else fails.
THIRD_PARTY = {
    "flask-migrate": "docs/migrations.md and the quickstart: a shop's migrations (not a dependency: optional)",
    "psycopg": "docs/operations.md: the PostgreSQL driver a shop on PostgreSQL adds",
    "nox": "the version-range sessions (minimum and newest dependencies) a contributor runs",
    "pip": "pip install --upgrade pip, before an editable install",
    "build": "docs/packaging.md: python -m build writes the wheel from a clone, before the first release",
    "pytest": "docs/testing.md: the shop's own tests run the testing kit's fixtures under pytest (not a dependency)",
    "python-json-logger": "docs/logging.md and the example shop's SHOP_LOG_FORMAT=json: JSON log lines (optional)",
}

#: pip options that take a value (the value is not a requirement, except -e's).
_WITH_VALUE = {
    "-r", "--requirement", "-c", "--constraint", "-i", "--index-url", "--extra-index-url", "-f",
    "--find-links", "-t", "--target", "--python-version", "--platform", "--prefix", "--root",
}  # fmt: skip
_FLAGS = {
    "-U", "--upgrade", "--pre", "-q", "--quiet", "-v", "--verbose", "--no-deps", "--force-reinstall",
    "--user", "--no-index", "--dry-run", "--no-cache-dir", "--require-hashes", "--no-build-isolation",
}  # fmt: skip
_COMMAND = re.compile(r"\bpip3? install\b(?P<rest>.*)")
#: Tokens of a command line: quoted strings, or runs without spaces.
_TOKEN = re.compile(r""""[^"]*"|'[^']*'|\S+""")
#: A requirement as a reader writes it: a name, extras, a version specifier; or a local path.
_REQUIREMENT = re.compile(r"^(?:[A-Za-z0-9][A-Za-z0-9._-]*|\.)(?:\[[^\]]*\])?(?:[<>=!~][^\s]*)?$")
#: This project from a local path, as docs/packaging.md installs it before the first release: the folder
#: of a clone (``./flask-gateway``, ``/path/to/flask-gateway``, extras allowed) or the wheel built there.
_LOCAL = re.compile(
    r"^(?:\.{0,2}/|/)(?:[\w.-]+/)*(?:flask-gateway(?:\[[^\]]*\])?|flask_bnpl_gateway-[\w.]+-py3-none-any\.whl)$"
)
_FENCE = re.compile(r"^(?P<fence>```+|~~~+)[^\n]*\n(?P<body>.*?)^(?P=fence)[ \t]*$", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"(?P<ticks>`+)(?P<code>.+?)(?P=ticks)", re.DOTALL)


@dataclass(frozen=True)
class Install:
    where: str
    line: str
    #: The requirements it names (``-e`` values included; a path ``.`` is the checkout).
    requirements: tuple[str, ...]
    #: Problems with the command itself (an option this test does not know, a requirement file missing).
    problems: tuple[str, ...] = ()


def parse(where: str, line: str) -> list[Install]:
    """The ``pip install`` commands of one line of code (a code block's line, an inline code span, a line
    of a Python string). The command ends at a shell separator, a comment, or the first word that is
    neither an option nor a requirement (prose after the command, in a message)."""
    found = []
    for match in _COMMAND.finditer(line):
        if not match.group("rest").strip():
            continue  # `pip install` alone: the command's name in a sentence
        requirements: list[str] = []
        problems: list[str] = []
        tokens = [token.strip("\"'") for token in _TOKEN.findall(match.group("rest"))]
        index = 0
        while index < len(tokens):
            token = tokens[index]
            index += 1
            if token in {"&&", "||", ";", "|", "\\"} or token.startswith("#"):
                break
            if token in _FLAGS:
                continue
            if token in _WITH_VALUE:
                value = tokens[index] if index < len(tokens) else ""
                index += 1
                if token in {"-r", "--requirement", "-c", "--constraint"} and not (ROOT / value).is_file():
                    problems.append(f"{token} {value}: no such file in the repository")
                continue
            if token in {"-e", "--editable"}:
                continue  # its value is the next token, a requirement
            if token.startswith("-"):
                problems.append(
                    f"{token}: an option this test does not know (add it to _FLAGS or _WITH_VALUE)"
                )
                continue
            if _LOCAL.match(token):  # a clone's folder or the wheel built there (before the first release)
                requirements.append(token)
                continue
            if not _REQUIREMENT.match(token):
                break  # prose after the command
            requirements.append(token)
        if not requirements and not problems:
            problems.append("names nothing to install")
        found.append(Install(where, line.strip(), tuple(requirements), tuple(problems)))
    return found


def check(install: Install) -> list[str]:
    """What is wrong with one command: a distribution that is not this one nor a listed third party, an
    extra this project does not declare, or a problem of the command itself."""
    wrong = [f"{install.where}: `{install.line}`: {problem}" for problem in install.problems]
    for text in install.requirements:
        # An f-string's placeholder (``=={ours.version}``) stands for some version.
        text = re.sub(r"\{[^}]*\}", "0", text)
        if text == "." or text.startswith(".["):
            name, extras = DISTRIBUTION, set(re.findall(r"[^\[\],\s]+", text[1:]))
        elif _LOCAL.match(text):
            bracket = text.partition("[")[2]
            name, extras = DISTRIBUTION, set(re.findall(r"[^\[\],\s]+", bracket))
        else:
            try:
                requirement = Requirement(text)
            except InvalidRequirement as error:
                wrong.append(f"{install.where}: `{install.line}`: {text!r} is not a requirement ({error})")
                continue
            name, extras = canonicalize_name(requirement.name), set(requirement.extras)
        if name == DISTRIBUTION:
            unknown = sorted(extras - EXTRAS)
            if unknown:
                wrong.append(
                    f"{install.where}: `{install.line}`: no extra {unknown} (declared: {sorted(EXTRAS)})"
                )
        elif name not in THIRD_PARTY:
            wrong.append(
                f"{install.where}: `{install.line}`: {name!r} is neither {DISTRIBUTION} nor a listed third party"
                + (" (the index's flask-gateway is another project)" if name == "flask-gateway" else "")
            )
    return wrong


def markdown_installs(where: str, text: str) -> tuple[list[Install], list[str]]:
    """The commands of a Markdown page (code blocks, inline code), and the ``pip install`` found in prose."""
    installs: list[Install] = []
    for block in _FENCE.finditer(text):
        # A line ending in a backslash goes on on the next one.
        for line in block.group("body").replace("\\\n", " ").splitlines():
            installs += parse(where, line)
    prose = _FENCE.sub("", text)
    for span in _INLINE.finditer(prose):
        installs += parse(where, " ".join(span.group("code").split()))
    left = _INLINE.sub("", prose)
    in_prose = [f"{where}: {line.strip()}" for line in left.splitlines() if _COMMAND.search(line)]
    return installs, in_prose


def _strings(source: str) -> list[str]:
    """A module's string constants and f-strings; an f-string's ``{DISTRIBUTION}`` is the name, any other
    placeholder stays ``{...}`` (a version, say)."""
    tree = ast.parse(source)
    parts = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    strings = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in parts:
            strings.append(node.value)
        elif isinstance(node, ast.JoinedStr):
            text = ""
            for part in node.values:
                if isinstance(part, ast.Constant):
                    text += str(part.value)
                elif isinstance(part, ast.FormattedValue):
                    expression = ast.unparse(part.value)
                    text += DISTRIBUTION if expression == "DISTRIBUTION" else "{" + expression + "}"
            strings.append(text)
    return strings


def python_installs(where: str, source: str) -> list[Install]:
    """The commands in a module's string constants (messages, docstrings) and f-strings."""
    installs = []
    for string in _strings(source):
        if "pip" in string:
            for line in string.splitlines():
                # Inline code of a docstring (``pip install ...``) ends at its backticks.
                spans = [m.group("code") for m in _INLINE.finditer(line) if _COMMAND.search(m.group("code"))]
                for code in spans or [line]:
                    installs += parse(where, code)
    return installs


def pages() -> list[Path]:
    # Not Sphinx's output (docs/_build).
    docs = [page for page in (ROOT / "docs").rglob("*.md") if "_build" not in page.parts]
    return sorted({*ROOT.glob("*.md"), *docs} - {ROOT / "CHANGELOG.md"})


def every_install() -> tuple[list[Install], list[str]]:
    installs: list[Install] = []
    in_prose: list[str] = []
    for page in pages():
        found, prose = markdown_installs(page.relative_to(ROOT).as_posix(), page.read_text(encoding="utf-8"))
        installs += found
        in_prose += prose
    for package in ("flask_gateway", "example_shop"):
        for module in sorted((ROOT / package).rglob("*.py")):
            where = module.relative_to(ROOT).as_posix()
            installs += python_installs(where, module.read_text(encoding="utf-8"))
    for line in (ROOT / "Makefile").read_text(encoding="utf-8").splitlines():
        installs += parse("Makefile", line)
    return installs, in_prose


def test_every_pip_install_names_this_distribution_and_its_extras():
    installs, in_prose = every_install()
    assert in_prose == [], "pip install in prose: put the command in code"
    assert [wrong for install in installs for wrong in check(install)] == []

    # The reader finds them: the quickstart's, the extras' (in docs and in the error messages), the checkout's.
    where = {(install.where, requirement) for install in installs for requirement in install.requirements}
    assert ("docs/extension.md", "flask-bnpl-gateway") in where
    assert ("docs/pypi.md", "flask-bnpl-gateway") in where
    assert ("README.md", "flask-bnpl-gateway") in where
    assert ("docs/operations.md", "flask-bnpl-gateway[metrics]") in where
    assert ("docs/operations.md", "flask-bnpl-gateway[tasks]") in where
    assert ("flask_gateway/operations/metrics.py", "flask-bnpl-gateway[metrics]") in where
    assert ("flask_gateway/operations/tasks.py", "flask-bnpl-gateway[tasks]") in where
    assert ("Makefile", ".[dev]") in where
    # an f-string's {DISTRIBUTION}
    assert ("flask_gateway/operations/doctor/package.py", "flask-bnpl-gateway") in where
    assert {requirement.split("[")[0] for _, requirement in where} >= {"flask-bnpl-gateway", "flask-migrate"}


@pytest.mark.parametrize(
    ("line", "complaint"),
    [
        (
            "$ pip install flask-gateway",
            "'flask-gateway' is neither flask-bnpl-gateway nor a listed third party",
        ),
        ('pip install "flask-bnpl-gateway[prometheus]"', "no extra ['prometheus']"),
        ("pip install -e '.[nonsense,dev]'", "no extra ['nonsense']"),
        ("pip install --upgrade flask-bnpl-gateway requests", "'requests' is neither"),
        ("pip install --break-everything flask-bnpl-gateway", "an option this test does not know"),
        ("pip install -r nowhere/requirements.txt", "no such file in the repository"),
        ("pip install -q", "names nothing to install"),
    ],
)
def test_the_check_refuses(line: str, complaint: str):
    (install,) = parse("page.md", line)
    wrong = check(install)
    assert len(wrong) == 1 and complaint in wrong[0], wrong


@pytest.mark.parametrize(
    ("line", "requirements"),
    [
        ("$ pip install flask-bnpl-gateway", ("flask-bnpl-gateway",)),
        (
            'pip install --upgrade "flask-bnpl-gateway[metrics,tasks]>=0.1"',
            ("flask-bnpl-gateway[metrics,tasks]>=0.1",),
        ),
        ("python -m pip install --quiet -e '.[dev]'", (".[dev]",)),
        (
            'pip install "flask-bnpl-gateway[tasks]" (Celery with the Redis client).',
            ("flask-bnpl-gateway[tasks]",),
        ),
        ("pip install flask-migrate  # and then", ("flask-migrate",)),
        ("pip install flask-migrate && flask db init", ("flask-migrate",)),
    ],
)
def test_the_check_accepts(line: str, requirements: tuple[str, ...]):
    (install,) = parse("page.md", line)
    assert install.requirements == requirements
    assert check(install) == []


def test_markdown_commands_are_read_from_blocks_and_inline_code_and_prose_is_caught():
    page = (
        "Install it:\n\n```sh\npip install \\\n    flask-gateway\n```\n\n"
        "or `pip install flask-bnpl-gateway[nope]`, or just pip install flask-bnpl-gateway.\n"
    )
    installs, in_prose = markdown_installs("page.md", page)
    assert [install.requirements for install in installs] == [
        ("flask-gateway",),
        ("flask-bnpl-gateway[nope]",),
    ]
    assert in_prose == ["page.md: or , or just pip install flask-bnpl-gateway."]
    assert python_installs("m.py", "X = 'needs ``pip install \"flask-gateway[tasks]\"`` (Celery)'\n")[
        0
    ].requirements == ("flask-gateway[tasks]",)
