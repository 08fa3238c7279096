"""``SharedTemplateCode``: Jinja templates compiled once per process, for every environment that would
compile them the same way."""

from __future__ import annotations

from typing import Any

import pytest
from jinja2 import DictLoader, Environment, select_autoescape

from flask_gateway.core.templates import SharedTemplateCode

TEMPLATES = {
    "page.html": "<p>{{ name }}</p>{% for x in items %}[{{ x|double }}]{% endfor %}{{ 'a'|double }}",
    "page.txt": "{{ name }} {{ 3|double }}",
}


def _double(value: Any) -> Any:
    return value * 2


def _triple(value: Any) -> Any:
    return value * 3


def _environment(cache: SharedTemplateCode | None, templates: dict[str, str] = TEMPLATES, **options: Any):
    environment = Environment(
        loader=DictLoader(templates),
        bytecode_cache=cache,
        autoescape=options.pop("autoescape", select_autoescape(["html"])),
        **options,
    )
    environment.filters["double"] = options.pop("double", _double)
    return environment


def _render(environment: Environment) -> list[str]:
    values = {"name": "<Thandi & co>", "items": [1, "b"]}
    return [environment.get_template(name).render(values) for name in sorted(TEMPLATES)]


@pytest.fixture
def compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the templates Jinja compiles from here on (every environment)."""
    names: list[str] = []
    original = Environment.compile

    def counting(self: Environment, source: Any, name: str | None = None, *args: Any, **kwargs: Any) -> Any:
        names.append(str(name))
        return original(self, source, name, *args, **kwargs)

    monkeypatch.setattr(Environment, "compile", counting)
    return names


def test_a_second_environment_takes_the_compiled_code_and_renders_the_same(compiles: list[str]):
    expected = _render(_environment(None))
    cache = SharedTemplateCode()
    compiles.clear()
    assert _render(_environment(cache)) == expected
    assert sorted(compiles) == sorted(TEMPLATES) and len(cache) == 2
    compiles.clear()
    assert _render(_environment(cache)) == expected
    assert _render(_environment(cache)) == expected
    assert compiles == []


def test_a_changed_source_is_compiled_again(compiles: list[str]):
    cache = SharedTemplateCode()
    _render(_environment(cache))
    changed = {**TEMPLATES, "page.txt": "changed {{ name }}"}
    compiles.clear()
    environment = _environment(cache, changed)
    assert environment.get_template("page.txt").render(name="x") == "changed x"
    assert environment.get_template("page.html").render(name="x", items=[]) == "<p>x</p>aa"
    assert compiles == ["page.txt"]


@pytest.mark.parametrize(
    "options",
    [
        {"autoescape": False},  # the HTML page then does not escape
        {"trim_blocks": True},
        {"comment_start_string": "<#", "comment_end_string": "#>"},
        {"finalize": lambda value: "" if value is None else value},
        {"optimized": False},
    ],
    ids=["autoescape", "trim_blocks", "delimiters", "finalize", "optimized"],
)
def test_an_environment_that_compiles_differently_compiles_for_itself(compiles: list[str], options):
    cache = SharedTemplateCode()
    _render(_environment(cache))
    compiles.clear()
    own = _environment(cache, **options)
    assert _render(own) == _render(_environment(None, **options))
    assert sorted(set(compiles)) == sorted(TEMPLATES)


def test_a_filter_of_the_same_name_doing_something_else_is_not_shared(compiles: list[str]):
    """The optimizer runs filters on constants while compiling (``'a'|double`` is folded to ``'aa'``)."""
    cache = SharedTemplateCode()
    _render(_environment(cache))
    other = _environment(cache)
    other.filters["double"] = _triple
    compiles.clear()
    assert other.get_template("page.txt").render(name="x") == "x 9"
    assert compiles == ["page.txt"]


def test_an_environment_with_extensions_is_never_served_from_the_cache(compiles: list[str]):
    cache = SharedTemplateCode()
    for _ in range(2):
        _render(_environment(cache, extensions=["jinja2.ext.loopcontrols"]))
    assert len(cache) == 0
    assert sorted(compiles) == sorted([*TEMPLATES, *TEMPLATES])
