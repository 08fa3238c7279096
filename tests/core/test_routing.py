"""``SharedBuilderRule``: Werkzeug's URL rules with their compiled builders shared across apps."""

from __future__ import annotations

from typing import Any

import pytest
from flask import Flask, url_for
from werkzeug.routing import Map, Rule

from flask_gateway.core.routing import SharedBuilderRule

#: (rule, endpoint, defaults, values to build with): static text, converters, several variables, a default
#: that is not in the path, a default for one of the path's own variables (not shared), text to quote.
RULES: list[tuple[str, str, dict[str, Any] | None, dict[str, Any]]] = [
    ("/", "root", None, {}),
    ("/static/<path:filename>", "static", None, {"filename": "a/b c.css"}),
    ("/v2/checkouts/<token>", "checkout", None, {"token": "t k/é"}),
    ("/orders/<int:number>/lines/<int:line>", "line", None, {"number": 7, "line": 3}),
    (
        "/pages/<float:at>/<uuid:key>",
        "page",
        None,
        {"at": 1.5, "key": "12345678-1234-5678-1234-567812345678"},
    ),
    ("/list", "listing", {"page": 1}, {"page": 2}),
    ("/list/<int:page>", "listing", None, {"page": 3}),
    ("/feed/<int:page>", "feed", {"page": 1}, {"page": 1}),
    ("/a b;c@d", "odd", None, {}),
    ("/any/<any(en, fr):lang>", "lang", None, {"lang": "fr"}),
]


def _map(rule_class: type[Rule]) -> Map:
    return Map(
        [rule_class(rule, endpoint=endpoint, defaults=defaults) for rule, endpoint, defaults, _ in RULES]
    )


def _built(url_map: Map) -> list[str]:
    adapter = url_map.bind("shop.example", url_scheme="https")
    built = []
    for _rule, endpoint, _defaults, values in RULES:
        for extra in ({}, {"q": "a b&c", "n": 2}):
            built.append(adapter.build(endpoint, {**values, **extra}))
            built.append(adapter.build(endpoint, {**values, **extra}, force_external=True))
    return built


def test_it_builds_every_url_as_werkzeugs_rule_does():
    expected = _built(_map(Rule))
    assert _built(_map(SharedBuilderRule)) == expected
    assert _built(_map(SharedBuilderRule)) == expected  # the second map takes the builders from the cache


def test_two_maps_share_the_compiled_builders_and_keep_their_own_converters():
    first, second = _map(SharedBuilderRule), _map(SharedBuilderRule)
    for one, other in zip(first.iter_rules(), second.iter_rules(), strict=True):
        assert one is not other and one.map is first and other.map is second
        shared = one.endpoint != "feed"  # its default is written into the code: compiled for itself
        assert (one._build.__func__ is other._build.__func__) is shared  # type: ignore[attr-defined]
        assert (one._build_unknown.__func__ is other._build_unknown.__func__) is shared  # type: ignore[attr-defined]
        assert one._build.__self__ is one and other._build.__self__ is other  # type: ignore[attr-defined]
        for name, converter in one._converters.items():
            assert converter is not other._converters[name]


@pytest.mark.parametrize("strict_slashes", [True, False])
def test_a_flask_app_with_it_routes_and_builds_as_before(strict_slashes: bool):
    def app_with(rule_class: type[Rule]) -> Flask:
        app = Flask("routing_test")
        app.url_rule_class = rule_class
        app.url_map.strict_slashes = strict_slashes
        app.add_url_rule("/orders/<reference>/", "order", lambda reference: f"order {reference}")
        app.add_url_rule("/callback/<path:account>", "callback", lambda account: account, methods=["POST"])
        return app

    answers = []
    for app in (app_with(Rule), app_with(SharedBuilderRule), app_with(SharedBuilderRule)):
        client = app.test_client()
        with app.test_request_context():
            urls = [
                url_for("order", reference="ORD 1", x="y"),
                url_for("callback", account="a/b", _external=True),
            ]
        answers.append(
            (
                urls,
                client.get("/orders/ORD-1/").get_data(as_text=True),
                client.get("/orders/ORD-1").status_code,
                client.post("/callback/a/b").get_data(as_text=True),
            )
        )
    assert answers[0] == answers[1] == answers[2]
