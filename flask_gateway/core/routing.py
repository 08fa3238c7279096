"""URL rules whose URL builders are compiled once per process, not once per app (no Flask here).

Werkzeug compiles two small Python functions for every URL rule an app registers (the builders
``url_for`` calls): it writes their syntax tree and runs ``compile`` on it, a millisecond or two a rule,
which is most of what registering a blueprint costs. An app factory called many times in one process (a
test suite builds an app per test) compiles the same functions again for each app. :class:`SharedBuilderRule`
keeps each compiled builder, keyed on everything its code is made from, and hands the same function to
every rule with that key; each rule still binds it to itself, so a rule's converters, defaults and map are
its own, exactly as with ``werkzeug.routing.Rule``.

``app.url_rule_class = SharedBuilderRule`` before the app's rules are added (the emulator's ``create_app``
does).
"""

from __future__ import annotations

from collections.abc import Callable

from werkzeug.routing import Rule

__all__ = ["SharedBuilderRule"]

_BuilderKey = tuple[bool, str, tuple[tuple[bool, str], ...], tuple[str, ...]]
#: (append_unknown, rule, trace, default names) -> the builder Werkzeug compiled for them.
_BUILDERS: dict[_BuilderKey, Callable[..., tuple[str, str]]] = {}


class SharedBuilderRule(Rule):
    """A ``werkzeug.routing.Rule`` that takes its compiled URL builders from a per-process cache.

    The code Werkzeug generates for a builder depends on the rule's parsed parts (``_trace``: the static
    text and the variables' names, in order), the names of its defaults and the rule's text (the function's
    name); the builder reaches the rule's converters through the rule it is bound to. A rule with a
    default for one of its own variables (whose converted value is written into the code) is compiled as
    Werkzeug does, without the cache.
    """

    def _compile_builder(self, append_unknown: bool = True) -> Callable[..., tuple[str, str]]:
        defaults = self.defaults or {}
        trace = tuple(self._trace)
        if any(is_dynamic and name in defaults for is_dynamic, name in trace):
            return super()._compile_builder(append_unknown)
        key = (append_unknown, self.rule, trace, tuple(defaults))
        builder = _BUILDERS.get(key)
        if builder is None:
            builder = _BUILDERS[key] = super()._compile_builder(append_unknown)
        return builder
