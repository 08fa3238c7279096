"""Over 10,000 mutated callbacks against ``POST /gateway/callback``: every one refused, nothing written.

The corpus starts from two bodies: the gateway's real, signed callback of a paid checkout (A), and a
forgery that says a still pending checkout (B) is PAID. It mutates the bytes (bits flipped, bytes and
characters inserted, removed or replaced, truncations, spans cut or doubled, amounts and statuses edited,
duplicate JSON keys, wrappers), the encoding (UTF-16/32, latin-1, cp1252, a UTF-8 BOM), the signature
(missing, empty, edited, truncated, another key, another hash, hex, urlsafe base64, ...), the account
header (missing, empty, another account, another case, a prefix), the content type, and the size (over
64 KiB).

Which mutations are still valid callbacks is decided by an oracle written here, independently of the
code under test: the account header is exactly the installed account, the body is UTF-8, and
``X-Signature`` is base64 HMAC-SHA256 of the body with JavaScript's ``\\s`` characters removed. So a
mutation that only adds such whitespace (a space, U+00A0, U+2028, U+FEFF as a BOM...) keeps the signed
content: it is an authentic callback, not a forgery. Those are set apart and checked separately (they
are answered, never pay twice). Characters Python calls whitespace but JavaScript does not (U+0085,
U+001C-U+001F, U+180E, U+200B) do change the signed content, and are refused like any other edit.

The 10,000 are sent in ``SHARDS`` tests of their own (each with its own seed, shop and emulator), so that
the suite's parallel workers share them; every check below holds for each.

Every other mutation must be refused with a 4xx (401, or 413 for the oversize ones), and the database
must be unchanged but for new rows in ``gateway_callback_log`` (each one unverified, with the answer's
status): every table's rows are compared before and after.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import random
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from flask_gateway.inbound import MAX_CALLBACK_BYTES
from tests.extension.conftest import ACCOUNT, Harness
from tests.extension.inbound.inbound_support import (
    callback_logs,
    create_v2_checkout,
    gateway_status,
    record_signals,
    signing_key,
    snapshot,
)
from tests.security.conftest import table_contents

received = pytest.fixture(record_signals)

#: The refused mutations the shards send (at least), in all.
REFUSED_TARGET = 10_000
#: Tests the corpus is split into: shard ``n`` draws from ``random.Random(SEED + n)``.
SHARDS = 4
SEED = 20261122

#: JavaScript's ``\s``, spelled out independently of flask_gateway.core.signing.
_JS_SPACE = re.compile("[\t\n\v\f\r \u00a0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000\ufeff]")
JS_SPACES = "\t\n\v\f\r \u00a0\u1680\u2000\u2005\u200a\u2028\u2029\u202f\u205f\u3000\ufeff"
#: What Python's str.isspace (or a careless implementation) would strip, but JavaScript's \s keeps.
NOT_JS_SPACES = "\x85\x1c\x1d\x1e\x1f\u180e\u200b\u200c\u200d\u2060"
OTHER_CHARACTERS = 'é€😀\x00"\\{}[],:0-Az\ud7ff\x7f\x01'


def oracle_signature(body: bytes, key: str) -> str | None:
    """The signature the gateway would send for ``body``; None when ``body`` is not UTF-8."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        return None
    digest = hmac.new(key.encode(), _JS_SPACE.sub("", text).encode("utf-8"), hashlib.sha256).digest()
    return base64.b64encode(digest).decode()


@dataclass(frozen=True)
class Mutant:
    kind: str
    body: bytes
    headers: tuple[tuple[str, str], ...]

    def header(self, name: str) -> str | None:
        return next((value for key, value in self.headers if key.lower() == name.lower()), None)

    def authentic(self, key: str) -> bool:
        """A callback the gateway itself could have sent: a valid signature, and the exact account when the
        account header is there (without it the signature alone decides: docs/decisions.md)."""
        account = self.header("X-Merchant-Account-ID")
        if account is not None and account != ACCOUNT:
            return False
        signature = self.header("X-Signature")
        return signature is not None and signature == oracle_signature(self.body, key)

    @property
    def oversize(self) -> bool:
        return len(self.body) > MAX_CALLBACK_BYTES


class Corpus:
    """Deterministic mutations of the two base bodies (``random.Random(seed)``)."""

    def __init__(self, paid_body: bytes, forged_body: bytes, key: str, seed: int = SEED) -> None:
        self.rng = random.Random(seed)
        self.key = key
        self.bases = {"paid": paid_body, "forged": forged_body}
        self.other_key = "other-" + key[::-1]

    # --- headers --------------------------------------------------------------------------------

    def headers(
        self,
        signature: str | None,
        *,
        account: str | None = ACCOUNT,
        content_type: str | None = "application/json",
    ) -> tuple[tuple[str, str], ...]:
        found: list[tuple[str, str]] = [("User-Agent", "fuzz/1.0")]
        if content_type is not None:
            found.append(("Content-Type", content_type))
        if account is not None:
            found.append(("X-Merchant-Account-ID", account))
        if signature is not None:
            found.append(("X-Signature", signature))
        return tuple(found)

    def sign(self, body: bytes, key: str | None = None) -> str:
        """The gateway's signature with ``key``; for a body that is not UTF-8, HMAC of the bytes."""
        signature = oracle_signature(body, key or self.key)
        if signature is None:
            digest = hmac.new((key or self.key).encode(), body, hashlib.sha256).digest()
            return base64.b64encode(digest).decode()
        return signature

    # --- body mutations -------------------------------------------------------------------------

    def mutate_body(self, body: bytes) -> tuple[str, bytes]:
        rng = self.rng
        n = len(body)
        at = rng.randrange(n)
        choice = rng.randrange(17)
        if choice == 0:
            return "bit-flip", body[:at] + bytes([body[at] ^ (1 << rng.randrange(8))]) + body[at + 1 :]
        if choice == 1:
            return "byte-replaced", body[:at] + bytes([rng.randrange(256)]) + body[at + 1 :]
        if choice == 2:
            return "byte-inserted", body[:at] + bytes([rng.randrange(256)]) + body[at:]
        if choice == 3:
            return "byte-removed", body[:at] + body[at + 1 :]
        if choice == 4:
            end = min(n, at + rng.randint(2, 40))
            return "span-removed", body[:at] + body[end:]
        if choice == 5:
            end = min(n, at + rng.randint(2, 40))
            return "span-doubled", body[:end] + body[at:]
        if choice == 6:
            return "truncated", body[: rng.randrange(n)]
        if choice == 7:
            char = rng.choice(OTHER_CHARACTERS)
            return "character-inserted", body[:at] + char.encode("utf-8", "surrogatepass") + body[at:]
        if choice == 8:
            char = rng.choice(NOT_JS_SPACES)
            return "python-only-whitespace", body[:at] + char.encode("utf-8") + body[at:]
        if choice == 9:
            char = rng.choice(JS_SPACES)
            return "js-whitespace", body[:at] + char.encode("utf-8") + body[at:]
        if choice == 10:
            letters = [i for i, b in enumerate(body) if chr(b).isalpha()]
            i = rng.choice(letters)
            return "case-changed", body[:i] + chr(body[i]).swapcase().encode() + body[i + 1 :]
        if choice == 11:
            return "amount-edited", self._edit_json(
                body, "checkoutTotalCents", rng.choice([0, 1, 79799, 79801])
            )
        if choice == 12:
            status = rng.choice(["PAID", "CANCELLED_BY_CONSUMER", "PAID_PENDING_CALLBACK", "paid", ""])
            return "status-edited", self._edit_json(body, "checkoutPaymentStatus", status)
        if choice == 13:
            key = rng.choice(["checkoutPaymentStatus", "checkoutTotalCents", "checkoutToken"])
            value = json.dumps(rng.choice(["PAID", 1, "v2.x.y", None]))
            return "duplicate-key", body[:-1] + f',"{key}":{value}'.encode() + b"}"
        if choice == 14:
            wrapper = rng.choice([b"[%s]", b"%s%s", b'{"a":%s}', b"%s\x00", b"\x00%s", b"%s,"])
            return "wrapped", wrapper.replace(b"%s", body)
        if choice == 15:
            return "encoded", self._encoded(body)
        return "token-edited", self._edit_json(body, "checkoutToken", rng.choice(["", "v2.x", "x" * 300]))

    def _edit_json(self, body: bytes, key: str, value: Any) -> bytes:
        try:
            data = json.loads(body)
            data[key] = value
        except (ValueError, TypeError):  # an earlier edit broke the JSON: edit the bytes instead
            return body.replace(f'"{key}":'.encode(), f'"{key}":{json.dumps(value)},"_":'.encode(), 1)
        return json.dumps(data, separators=(",", ":")).encode()

    def _encoded(self, body: bytes) -> bytes:
        encoding = self.rng.choice(["utf-16", "utf-16-le", "utf-16-be", "utf-32", "latin-1", "cp1252"])
        text = body.decode("utf-8", "replace")
        if encoding in ("latin-1", "cp1252"):  # ASCII is the same bytes: give it a character that differs
            text = text.replace('"ORD-', '"ORDÉ-', 1)
        return text.encode(encoding, "replace")

    # --- the whole request ----------------------------------------------------------------------

    def mutant(self) -> Mutant:
        rng = self.rng
        base_name = rng.choice(["paid", "paid", "forged"])
        base = self.bases[base_name]
        # The forgery carries the signature of the real callback: the best an attacker can replay.
        original_signature = self.sign(self.bases["paid"])
        strategy = rng.randrange(10)
        if strategy < 5:  # an edited body with the original's signature (a replay-and-edit)
            kind, body = self.mutate_body(base)
            if rng.random() < 0.3:  # and a second edit
                kind2, body = self.mutate_body(body)
                kind = f"{kind}+{kind2}"
            return Mutant(f"body:{kind}", body, self.headers(original_signature))
        if strategy == 5:
            kind, signature = self.mutate_signature(base, original_signature)
            return Mutant(f"signature:{kind}", base, self.headers(signature))
        if strategy == 6:
            kind, account = self.mutate_account()
            return Mutant(f"account:{kind}", base, self.headers(original_signature, account=account))
        if strategy == 7:
            content_type = rng.choice(
                [
                    None,
                    "text/plain",
                    "application/x-www-form-urlencoded",
                    "multipart/form-data; boundary=xyz",
                    "application/json; charset=utf-16",
                    "application/xml",
                    "application/json",
                ]
            )
            kind, body = self.mutate_body(base)
            headers = self.headers(original_signature, content_type=content_type)
            return Mutant(f"content-type:{content_type}:{kind}", body, headers)
        if strategy == 8:
            # The forgery signed as well as an attacker can: with a key that is not the installed one.
            kind, body = self.mutate_body(self.bases["forged"])
            return Mutant(f"other-key:{kind}", body, self.headers(self.sign(body, self.other_key)))
        return self.oversize_mutant(base, original_signature)

    def mutate_signature(self, body: bytes, signature: str) -> tuple[str, str | None]:
        rng = self.rng
        digest = base64.b64decode(signature)
        key = self.key.encode()
        choice = rng.randrange(14)
        if choice == 0:
            return "missing", None
        if choice == 1:
            return "empty", ""
        if choice == 2:
            i = rng.randrange(len(signature) - 1)
            replacement = rng.choice([c for c in "ABCabc019+/" if c != signature[i]])
            return "character-edited", signature[:i] + replacement + signature[i + 1 :]
        if choice == 3:
            return "truncated", signature[: rng.randrange(len(signature))]
        if choice == 4:
            return "extended", signature + rng.choice(["=", "A", "AAAA", "=="])
        if choice == 5:
            return "hex", digest.hex()
        if choice == 6:
            return "urlsafe", base64.urlsafe_b64encode(digest).decode().rstrip("=") + "_-"
        if choice == 7:
            return "unpadded", signature.rstrip("=")
        if choice == 8:
            return "sha1", base64.b64encode(hmac.new(key, body, hashlib.sha1).digest()).decode()
        if choice == 9:
            return "sha512", base64.b64encode(hmac.new(key, body, hashlib.sha512).digest()).decode()
        if choice == 10:
            return "swapped-hmac", base64.b64encode(hmac.new(body, key, hashlib.sha256).digest()).decode()
        if choice == 11:
            return "other-key", self.sign(body, self.other_key)
        if choice == 12:
            return "plain-sha256", base64.b64encode(hashlib.sha256(body).digest()).decode()
        return "scheme-prefixed", rng.choice(["sha256=", "Bearer ", "HMAC "]) + signature

    def mutate_account(self) -> tuple[str, str | None]:
        choice = self.rng.randrange(7)
        return [
            ("missing", None),
            ("empty", ""),
            ("upper-case", ACCOUNT.upper()),
            ("capitalised", ACCOUNT.capitalize()),
            ("other", "other-merchant"),
            ("prefix", ACCOUNT + "2"),
            ("latin-1", "demo-merchänt"),
        ][choice]

    def oversize_mutant(self, base: bytes, signature: str) -> Mutant:
        rng = self.rng
        # Padding with spaces keeps the signed content: refused for its size alone, before it is read.
        padding = rng.choice([b" ", b"x", b"\n", b"0"]) * (MAX_CALLBACK_BYTES + rng.randint(1, 4096))
        body = base[:-1] + padding + base[-1:]
        return Mutant("oversize", body, self.headers(signature))

    def __iter__(self) -> Iterator[Mutant]:
        while True:
            yield self.mutant()


def _send(h: Harness, client: Any, mutant: Mutant) -> Any:
    # Header names as sent; the test client builds the body from the bytes as they are.
    return client.post("/gateway/callback", data=mutant.body, headers=list(mutant.headers))


@pytest.mark.parametrize("shard", range(SHARDS), ids=[f"shard-{n + 1}-of-{SHARDS}" for n in range(SHARDS)])
def test_ten_thousand_mutated_callbacks_are_refused_and_change_nothing(
    sqlite_harness: Harness, sqlite_databases, received, capsys, shard: int
) -> None:
    target = REFUSED_TARGET // SHARDS
    h = sqlite_harness
    h.install()
    paid_id, paid_token = create_v2_checkout(h, "ORD-A")
    pending_id, pending_token = create_v2_checkout(h, "ORD-B")
    assert h.emulator.pay(paid_token).status_code == 200
    assert h.emulator.control("deliver").status_code == 200
    [delivered] = callback_logs(h)
    assert delivered["outcome"] == "accepted"
    paid_body = delivered["body"].encode()
    forged = gateway_status(h, pending_token) | {"checkoutPaymentStatus": "PAID"}
    forged_body = json.dumps(forged, separators=(",", ":")).encode()
    key = signing_key(h)
    assert len(received["payment_confirmed"]) == 1

    url = sqlite_databases.url("main")
    before = table_contents(url)
    before_logs = len(before["gateway_callback_log"])
    client = h.client

    refused: Counter[str] = Counter()
    authentic: list[Mutant] = []
    statuses: list[int] = []
    for mutant in Corpus(paid_body, forged_body, key, seed=SEED + shard):
        if sum(refused.values()) >= target:
            break
        if mutant.authentic(key) and not mutant.oversize:
            authentic.append(mutant)
            continue
        response = _send(h, client, mutant)
        expected = 413 if mutant.oversize else 401
        assert response.status_code == expected, (mutant.kind, mutant.body[:200], mutant.headers)
        statuses.append(response.status_code)
        refused[mutant.kind.split(":")[0]] += 1

    after = table_contents(url)
    new_logs = after.pop("gateway_callback_log")
    old_logs = before.pop("gateway_callback_log")
    assert after == before, "a refused callback changed a table other than gateway_callback_log"
    assert new_logs[: len(old_logs)] == old_logs, "a refused callback changed an earlier log row"
    added = callback_logs(h)[before_logs:]
    assert len(added) == len(statuses)
    assert [row["http_status"] for row in added] == statuses
    assert all(row["verified"] is False for row in added)
    assert {row["outcome"] for row in added} <= {"rejected-signature", "too-large"}
    assert all(row["checkout_id"] is None for row in added)
    assert len(received["payment_confirmed"]) == 1
    assert len(received["callback_rejected"]) == len(statuses)
    assert snapshot(h, pending_id)["status"] == "PENDING_ORDER"

    # The mutations that kept the signed content are the gateway's own callback, as it might be sent:
    # answered (200, or 400 when the whitespace broke the JSON, 404 when it edited the token), never
    # paying twice, never touching the pending checkout.
    answers: Counter[int] = Counter()
    for mutant in authentic:
        response = _send(h, client, mutant)
        assert response.status_code in (200, 400, 404), (mutant.kind, mutant.body[:200])
        answers[response.status_code] += 1
    assert len(received["payment_confirmed"]) == 1
    assert snapshot(h, pending_id)["status"] == "PENDING_ORDER"
    assert snapshot(h, paid_id)["status"] == "PAID"  # as the delivered callback left it

    with capsys.disabled():
        total = sum(refused.values())
        print(  # noqa: T201 - the brief asks for the count in the output
            f"\nshard {shard + 1} of {SHARDS}: {total} mutated callbacks refused ({dict(sorted(refused.items()))}, "
            f"{statuses.count(413)} of them 413 for their size); "
            f"{len(authentic)} mutations kept the signed content and were answered {dict(answers)}"
        )
    assert total >= target
    assert authentic, "the corpus should include whitespace-only (still valid) mutations"


def test_whitespace_the_signature_ignores_keeps_a_callback_valid(sqlite_harness: Harness) -> None:
    """The oracle's claim, checked on the endpoint: a body re-spaced with JavaScript whitespace still
    verifies; a body with a character only Python calls whitespace does not."""
    h = sqlite_harness
    h.install()
    _, token = create_v2_checkout(h, "ORD-A")
    assert h.emulator.pay(token).status_code == 200
    body = json.dumps(gateway_status(h, token), separators=(",", ":")).encode()
    key = signing_key(h)
    signature = oracle_signature(body, key)
    assert signature is not None
    headers = {"X-Merchant-Account-ID": ACCOUNT, "X-Signature": signature, "Content-Type": "application/json"}

    spaced = json.dumps(json.loads(body), indent="\t").replace(",", ",\r\n ").encode()
    assert h.client.post("/gateway/callback", data=spaced, headers=headers).status_code == 200
    # Authentic, but U+2028 is not JSON whitespace: verified, then refused as a body (400), not a forgery.
    odd = body.replace(b",", ",\u2028".encode(), 1)
    answer = h.client.post("/gateway/callback", data=odd, headers=headers)
    assert (answer.status_code, answer.json["message"][:0]) == (400, "")
    assert callback_logs(h)[-1]["outcome"] == "invalid-body"
    lower_names = {name.lower(): value for name, value in headers.items()}
    assert h.client.post("/gateway/callback", data=body, headers=lower_names).status_code == 200
    for char in NOT_JS_SPACES:
        edited = body.replace(b",", f",{char}".encode(), 1)
        response = h.client.post("/gateway/callback", data=edited, headers=headers)
        assert response.status_code == 401, repr(char)
