"""``keep_whole``: an order reference in a raw payload stays on one line, and nothing else changes."""

from __future__ import annotations

from markupsafe import Markup

from flask_gateway.core.references import keep_whole


def test_the_reference_is_wrapped_and_everything_is_escaped():
    body = '{"merchantOrderReference": "STP-7K3M9QX2", "note": "<b>STP-7K3M9QX2</b> & co"}'
    shown = keep_whole(body, "STP-7K3M9QX2")
    assert isinstance(shown, Markup)
    assert shown.count('<span class="ref">STP-7K3M9QX2</span>') == 2
    assert "<b>" not in shown and "&lt;b&gt;" in shown and "&amp; co" in shown
    assert shown.striptags() == Markup.escape(body).striptags()  # the same text, only the span added


def test_a_reference_that_needs_escaping_is_found_escaped_and_none_wraps_nothing():
    assert keep_whole("order A&B-1 paid", "A&B-1") == 'order <span class="ref">A&amp;B-1</span> paid'
    assert keep_whole("<i>x</i>", None) == "&lt;i&gt;x&lt;/i&gt;"
    assert keep_whole(None, "STP-1") == ""
    assert keep_whole("no reference here", "STP-00000000") == "no reference here"
