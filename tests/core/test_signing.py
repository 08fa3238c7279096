"""The signature rule: HMAC-SHA256 over the body without JavaScript's ``\\s`` characters, base64."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flask_gateway import signing
from flask_gateway.core.signing import JS_WHITESPACE, canonicalize, sign, verify

#: Hypothesis fails an example that takes over 200 ms by default: a time bound, that a loaded
#: machine can break. None here.
NO_DEADLINE = settings(deadline=None)

PUBLISHED_KEY = "b9d9d345-2f99-4db9-86c7-ef52509dc29c"
PUBLISHED_BODY = '{"json":"body payload of the request"}'
PUBLISHED_SIGNATURE = "60brkjy0NWMql+ljwLE5pq4c+eXbzD8C+uMyzgcoIcA="
KEY = "test-signing-key"


def reference(stripped: str, key: str = KEY) -> str:
    digest = hmac.new(key.encode(), stripped.encode("utf-8"), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


def test_published_vector():
    assert sign(PUBLISHED_BODY, PUBLISHED_KEY) == PUBLISHED_SIGNATURE
    assert sign(PUBLISHED_BODY.encode(), PUBLISHED_KEY) == PUBLISHED_SIGNATURE
    assert verify(PUBLISHED_BODY, PUBLISHED_KEY, PUBLISHED_SIGNATURE)


def test_pinned_public_module_is_the_core():
    assert signing.sign is sign
    assert signing.verify is verify


@pytest.mark.parametrize(
    "body",
    [
        '{"json": "body payload of the request"}',
        '{\n\t"json":\r\n "body\tpayload\nof the request"\n}',
        '\v\f{"json":"body payload of the request"}  ',
    ],
)
def test_whitespace_anywhere_is_removed_including_inside_strings(body):
    assert sign(body, PUBLISHED_KEY) == PUBLISHED_SIGNATURE


@pytest.mark.parametrize(
    "char",
    ["\u00a0", "\u2028", "\u2029", "\ufeff", "\u1680", "\u2000", "\u200a", "\u202f", "\u205f", "\u3000"],
)
def test_javascript_unicode_whitespace_is_removed(char):
    body = f'{{"name":"a{char}b"}}'
    assert canonicalize(body) == b'{"name":"ab"}'
    assert sign(body, KEY) == reference('{"name":"ab"}')


@pytest.mark.parametrize("char", ["\u0085", "\u001c", "\u001d", "\u001e", "\u001f", "\u200b", "\u180e"])
def test_characters_python_or_others_call_space_are_kept(char):
    body = f'{{"name":"a{char}b"}}'
    assert canonicalize(body) == body.encode("utf-8")
    assert sign(body, KEY) == reference(body)
    assert sign(body, KEY) != reference('{"name":"ab"}')


def test_js_whitespace_set_is_exactly_ecmascript():
    expected = {
        0x09,
        0x0A,
        0x0B,
        0x0C,
        0x0D,
        0x20,
        0xA0,
        0x1680,
        0x2028,
        0x2029,
        0x202F,
        0x205F,
        0x3000,
        0xFEFF,
    }
    expected |= set(range(0x2000, 0x200B))
    assert {ord(c) for c in JS_WHITESPACE} == expected


def test_bytes_and_text_sign_the_same():
    body = '{"name":"Zoë\u00a0Smith"}'
    assert sign(body, KEY) == sign(body.encode("utf-8"), KEY) == reference('{"name":"ZoëSmith"}')


def test_verify_accepts_exact_and_rejects_changed():
    body = '{"amount":1000}'
    signature = sign(body, KEY)
    assert verify(body, KEY, signature)
    assert verify(body.encode(), KEY, signature.encode())
    assert not verify('{"amount":1001}', KEY, signature)
    assert not verify(body, "other-key", signature)


@pytest.mark.parametrize(
    ("body", "key", "signature"),
    [
        ('{"a":1}', KEY, None),
        ('{"a":1}', KEY, ""),
        ('{"a":1}', KEY, "not base64!!"),
        ('{"a":1}', KEY, "YWJj"),  # valid base64, wrong length
        ('{"a":1}', KEY, "é" * 44),
        ('{"a":1}', KEY, b"\xff\xfe"),
        ('{"a":1}', KEY, 12345),
        ('{"a":1}', "", sign('{"a":1}', "")),
        ('{"a":1}', None, "x"),
        (None, KEY, sign("", KEY)),
        (b"\xff\xfe not utf-8", KEY, sign("x", KEY)),
        (12, KEY, sign("12", KEY)),
    ],
)
def test_verify_returns_false_for_junk_and_never_raises(body, key, signature):
    assert verify(body, key, signature) is False


def test_verify_rejects_non_canonical_base64_of_the_right_digest():
    good = sign('{"a":1}', KEY)
    assert not verify('{"a":1}', KEY, good.rstrip("="))
    assert not verify('{"a":1}', KEY, " " + good)


@NO_DEADLINE
@given(st.text(), st.text(min_size=1))
def test_sign_verify_round_trip(body, key):
    signature = sign(body, key)
    assert verify(body, key, signature)
    assert verify(body.encode("utf-8"), key, signature)
    assert not verify(body + "x", key, signature)


@NO_DEADLINE
@given(st.text())
def test_canonical_form_is_idempotent_and_has_no_js_whitespace(body):
    once = canonicalize(body).decode("utf-8", "surrogatepass")
    assert not JS_WHITESPACE & set(once)
    assert canonicalize(once).decode("utf-8", "surrogatepass") == once


@NO_DEADLINE
@given(st.dictionaries(st.text(), st.text()))
def test_json_reformatting_does_not_change_the_signature_when_values_have_no_whitespace(data):
    cleaned = {k.translate({ord(c): None for c in JS_WHITESPACE}): v for k, v in data.items()}
    compact = json.dumps(cleaned, separators=(",", ":"))
    pretty = json.dumps(cleaned, indent=4)
    assert sign(compact, KEY) == sign(pretty, KEY)
