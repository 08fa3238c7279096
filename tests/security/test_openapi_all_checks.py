"""Schemathesis with every check it has, on every operation of the emulator's OpenAPI document.

tests/emulator/test_openapi.py runs the conformance checks (status code, content type, headers, schema,
negative data rejection, no 5xx) on both backends. Here every check schemathesis registers runs
(``CHECKS.get_all()``: also positive data acceptance, missing required header, unsupported method,
``Allow`` header conformance, ignored authentication, use after free, resource availability, object
level authorization) plus a 10 s response time limit, on SQLite, with the schema loaded from the
emulator itself (``from_wsgi``) so that every probe the checks send reaches it in-process.

Credentials: valid ones are set explicitly on each case (the signature over the exact bytes is put in
by the wrapper), so ``ignored_auth`` probes each operation without them and with wrong ones (401
expected). Cases whose headers are the generated (invalid) part are sent as generated.

Configured, with the reason:

- ``positive_data_acceptance`` accepts 400/401/403/404/409 besides 2xx: each is a rule the document
  states in words and JSON Schema cannot express (``ACCEPTED_POSITIVE``); it still fails on anything
  else (a 5xx, a 422, a 413 for a valid body). Positive cases have U+0000 removed from text and the
  minimum/maximum put in order (both refused by documented rules). The v1 refund answers every refusal
  with 400 ``FAILED`` (the real gateway's behaviour), so that check is off for it.
- A blank v1 configuration body is no body (documented leniency, as in test_openapi.py).

These checks found no problem of their own in the emulator or the document (their failures on the way
were all about the rules above); the hostile-input walks in this package did find some.
"""

from __future__ import annotations

from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import CHECKS, load_all_checks

from flask_gateway.emulator.models import db
from flask_gateway.emulator.openapi import OPERATIONS
from tests.emulator.support import ACCOUNT, API_KEY
from tests.emulator.test_openapi import (
    REJECTIONS,
    Seeded,
    SigningWrapper,
    _basic,
    _blank,
    _borrow,
    _headers_are_the_invalid_part,
)

#: The signature here is a placeholder: ProbeAwareWrapper signs the exact bytes in "valid" mode.
EXPLICIT_AUTH = {
    "X-Merchant-Account-ID": ACCOUNT,
    "X-Signature": "c2lnbmVkLWJ5LXRoZS13cmFwcGVyLXNpZ25lZC1ieS13cmE=",
    **_basic(ACCOUNT, API_KEY),
}

load_all_checks()
ALL_CHECKS = CHECKS.get_all()
MAX_EXAMPLES = 10  # per operation and mode: the whole file stays around 15 s


class ProbeAwareWrapper(SigningWrapper):
    """Signs the generated case as ``mode`` says; the checks' own probes (a request without auth,
    another method, a header left out...) are sent while ``mode`` is ``as-generated``: they reach the
    emulator exactly as the check built them (they copy the case's headers, ``X-Fuzz-Auth`` included,
    so the header cannot tell them apart)."""

    mode = "as-generated"

    def __call__(self, environ: dict[str, Any], start_response: Any) -> Any:
        environ["HTTP_X_FUZZ_AUTH"] = self.mode
        return super().__call__(environ, start_response)


#: Schema-valid requests the emulator may still refuse, each for a rule the document states in words
#: but JSON Schema cannot express: 400 (the account's amount limits, a minimum above the maximum, an
#: expiry in the past), 401 (installing an account the account manager never issued), 403 (the
#: firewall; an account already installed), 404 (no such checkout), 409 (the checkout's state).
ACCEPTED_POSITIVE = ["2XX", "400", "401", "403", "404", "409"]
CONFIG = schemathesis.Config.from_dict(
    {
        "checks": {
            "negative_data_rejection": {"expected-statuses": REJECTIONS},
            "positive_data_acceptance": {"expected-statuses": ACCEPTED_POSITIVE},
            "max_response_time": 10.0,
        }
    }
)


def _without_nul(value: Any) -> Any:
    if isinstance(value, str):
        return value.replace("\x00", "")
    if isinstance(value, dict):
        return {_without_nul(key): _without_nul(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_without_nul(item) for item in value]
    return value


def _within_the_rules_the_schema_cannot_say(case: Any, path: str) -> None:
    """Positive cases only: the rules JSON Schema cannot express, and the document states in words:
    no U+0000 in any text (PostgreSQL cannot store it), and the minimum not above the maximum."""
    if not isinstance(case.body, dict):
        return
    case.body = body = _without_nul(case.body)
    low, high = body.get("minimumCheckoutAmountCents"), body.get("maximumCheckoutAmountCents")
    if path == "/install/v2" and isinstance(low, int) and isinstance(high, int) and low > high:
        body["minimumCheckoutAmountCents"], body["maximumCheckoutAmountCents"] = high, low


def _checks_for(path: str, body: object) -> list[Any]:
    if path == "/api/v1/merchant/configuration" and _blank(body):
        # Documented leniency (as in test_openapi.py): a blank body is no body, not malformed JSON.
        return [check for check in ALL_CHECKS if check.__name__ != "negative_data_rejection"]
    if path == "/api/v1/merchant/refund":
        # v1 answers every refusal of a refund (unknown order, more than what is left) with 400 and
        # ``status: FAILED``, as the real gateway does (DESIGN section 2): not a rejection of valid data.
        return [check for check in ALL_CHECKS if check.__name__ != "positive_data_acceptance"]
    return ALL_CHECKS


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE], ids=str)
@pytest.mark.parametrize(("method", "path"), [(op.method.upper(), op.path) for op in OPERATIONS])
def test_emulator_passes_every_schemathesis_check(tmp_path, method, path, mode):
    seeded = Seeded(f"sqlite:///{tmp_path / 'emulator.sqlite3'}")  # SQLite: test_openapi.py runs both
    wsgi = ProbeAwareWrapper(seeded.app, seeded.key)
    # Loaded from the emulator itself, so every probe of every check reaches it in-process too.
    schema = schemathesis.openapi.from_wsgi("/_emulator/openapi.json", wsgi, config=CONFIG)
    operation = schema[path][method]

    @settings(
        max_examples=MAX_EXAMPLES, deadline=None, database=None, suppress_health_check=list(HealthCheck)
    )
    @given(case=operation.as_strategy(generation_mode=mode), data=st.data())
    def run(case: Any, data: st.DataObject) -> None:
        generated_headers = _headers_are_the_invalid_part(case)
        _borrow(case, data, seeded)
        if mode is GenerationMode.POSITIVE:
            _within_the_rules_the_schema_cannot_say(case, path)
        # Valid credentials, set explicitly (so the ignored-auth check knows they are meant to be
        # valid and probes without them); the wrapper computes the signature over the bytes sent.
        explicit = {} if generated_headers else dict(EXPLICIT_AUTH)
        # How schemathesis's own auth providers mark it: explicit credentials are meant to be valid,
        # so ignored_auth probes the operation without them, and with wrong ones.
        case._has_explicit_auth = not generated_headers
        wsgi.mode = "as-generated" if generated_headers else "valid"
        try:
            response = case.call(headers=explicit)
        finally:
            wsgi.mode = "as-generated"
        case.validate_response(response, checks=_checks_for(path, case.body))

    try:
        run()
    finally:
        with seeded.app.app_context():
            db.engine.dispose()
