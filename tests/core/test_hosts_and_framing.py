"""The two rules the extension and the emulator share: which hosts are local, and the no-framing headers."""

from __future__ import annotations

import pytest
from werkzeug.datastructures import Headers

from flask_gateway.core.framing import never_framed
from flask_gateway.core.hosts import is_local_host, local_host_kind


@pytest.mark.parametrize(
    ("url", "kind"),
    [
        ("http://localhost:5000/shop", "localhost"),
        ("https://LOCALHOST./x", "localhost"),
        ("http://shop.localhost/x", "localhost"),
        ("http://127.0.0.1:8000/", "an IP address"),
        ("http://[::1]/", "an IP address"),
        ("https://10.0.0.7/return", "an IP address"),
        ("https://shop.example/return", None),
        ("https://localhost.shop.example/", None),
        ("https://shop.example[", None),  # not a URL: no crash, not local
        ("", None),
        (None, None),
    ],
)
def test_local_host_kind(url, kind):
    assert local_host_kind(url) == kind
    assert is_local_host(url) is (kind is not None)


def test_never_framed_sets_the_given_policy_when_there_is_none():
    headers = Headers()
    never_framed(headers, policy="default-src 'self'; frame-ancestors 'none'", no_referrer=True)
    assert headers["X-Frame-Options"] == "DENY"
    assert headers["Content-Security-Policy"] == "default-src 'self'; frame-ancestors 'none'"
    assert headers["X-Content-Type-Options"] == "nosniff"
    assert headers["Referrer-Policy"] == "no-referrer"


def test_never_framed_keeps_the_apps_policy_but_forbids_framing():
    headers = Headers({"Content-Security-Policy": "img-src *; frame-ancestors https://evil.example"})
    never_framed(headers)
    policy = headers["Content-Security-Policy"]
    assert "evil.example" not in policy
    assert policy.endswith("frame-ancestors 'none'")
    assert "img-src *" in policy
    assert "script-src 'self'" in policy  # the app's policy restricted scripts nowhere
    assert "Referrer-Policy" not in headers


def test_never_framed_leaves_the_apps_script_rule_alone():
    headers = Headers({"Content-Security-Policy": "default-src 'self' cdn.example"})
    never_framed(headers)
    assert headers["Content-Security-Policy"] == "default-src 'self' cdn.example; frame-ancestors 'none'"
