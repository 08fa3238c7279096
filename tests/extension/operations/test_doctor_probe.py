"""``flask gateway doctor``'s callback probe is not a refused callback.

The probe carries ``X-Gateway-Doctor-Probe`` (a time and an HMAC of it and the body, with a key derived from
the app's ``SECRET_KEY``): the shop answers it exactly as any unsigned callback (401, the same body), and
records it as ``doctor-probe``: out of the refused figure (the status page, ``flask_gateway_callbacks_recent``'s
refused outcomes, the GatewayCallbacksRefused alert), no ``callback_rejected``, not counted against the
client's rate limit. A mark that is copied onto another body, made with another key, too old, or absent
(a copied User-Agent) leaves the request what it is: a refused callback.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest
from sqlalchemy import select

from flask_gateway import callback_rejected
from flask_gateway.inbound import PROBE_HEADER, PROBE_WINDOW_SECONDS, doctor_probe_mark
from flask_gateway.inbound import probe as probe_module
from flask_gateway.models import CallbackLog
from flask_gateway.operations.doctor import USER_AGENT
from flask_gateway.operations.health import callback_health
from flask_gateway.state import get_state
from tests.conftest import Databases
from tests.extension.conftest import Harness, build_harness
from tests.extension.operations.cli_support import run_gateway
from tests.extension.operations.operations_support import recording

BODY = b"{}"
CALLBACK = "/gateway/callback"
CLIENT = {"REMOTE_ADDR": "198.51.100.20"}


@pytest.fixture
def installed(databases: Databases, monkeypatch: pytest.MonkeyPatch) -> Harness:
    harness = build_harness(databases, monkeypatch, GATEWAY_CALLBACK_RATE_LIMIT="2 per minute")
    harness.install()
    return harness


def mark(harness: Harness, body: bytes = BODY, *, now: float | None = None, secret: str | None = None) -> str:
    app = harness.shop
    if secret is not None:
        app.config["SECRET_KEY"], kept = secret, app.config["SECRET_KEY"]
    try:
        with app.app_context():
            made = doctor_probe_mark(body, now=now)
    finally:
        if secret is not None:
            app.config["SECRET_KEY"] = kept
    assert made is not None
    return made


def altered(made: str) -> str:
    """The mark with its last hex digit changed."""
    return made[:-1] + ("1" if made.endswith("0") else "0")


def post(harness: Harness, body: bytes = BODY, probe: str | None = None):  # type: ignore[no-untyped-def]
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    if probe is not None:
        headers[PROBE_HEADER] = probe
    return harness.client.post(CALLBACK, data=body, headers=headers, environ_base=CLIENT)


def outcomes(harness: Harness) -> list[tuple[str, int]]:
    with harness.shop.app_context():
        rows = get_state().session.scalars(select(CallbackLog).order_by(CallbackLog.id)).all()
        return [(row.outcome, row.http_status) for row in rows]


@pytest.mark.backends
def test_the_probe_is_answered_as_an_unsigned_callback_and_recorded_as_the_doctors(
    installed: Harness,
) -> None:
    with recording(callback_rejected) as rejected:
        probes = [post(installed, probe=mark(installed)) for _ in range(3)]
        unsigned = post(installed)

    # The same answer as an unsigned callback (what the doctor's check judges).
    assert [(p.status_code, p.get_json()) for p in probes] == [
        (unsigned.status_code, unsigned.get_json())
    ] * 3
    assert unsigned.status_code == 401
    # Three probes with a limit of 2 refusals a minute: none counted against the address (no 429).
    assert outcomes(installed) == [("doctor-probe", 401)] * 3 + [("rejected-signature", 401)]
    assert len(rejected) == 1  # the unsigned one only
    with installed.shop.app_context():
        health = callback_health()
    assert health.refused == 1
    assert health.callbacks == {"doctor-probe": 3, "rejected-signature": 1}


@pytest.mark.parametrize(
    "forged",
    [
        pytest.param(lambda h: None, id="a copied User-Agent, no mark"),
        pytest.param(lambda h: mark(h, b'{"other": 1}'), id="a mark of another body"),
        pytest.param(lambda h: mark(h, secret="another-apps-secret-key-0123456789"), id="another SECRET_KEY"),
        pytest.param(lambda h: mark(h, now=time.time() - PROBE_WINDOW_SECONDS - 5), id="too old"),
        pytest.param(lambda h: altered(mark(h)), id="altered"),
        pytest.param(lambda h: "t=1,v1=zz", id="malformed"),
    ],
)
def test_a_request_without_a_valid_mark_stays_a_refused_callback(installed: Harness, forged) -> None:  # type: ignore[no-untyped-def]
    probe = forged(installed)
    with recording(callback_rejected) as rejected:
        answer = post(installed, probe=probe)
    assert answer.status_code == 401
    assert outcomes(installed) == [("rejected-signature", 401)]
    assert len(rejected) == 1
    with installed.shop.app_context():
        assert callback_health().refused == 1


def test_the_window_is_counted_either_way_on_the_receivers_clock(
    installed: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A mark is the doctor's up to PROBE_WINDOW_SECONDS from the receiving process's clock, behind it or
    ahead of it, and a refused callback one second further (the clock is the test's)."""
    made_at = 1_900_000_000
    clock = [float(made_at)]
    monkeypatch.setattr(probe_module, "time", SimpleNamespace(time=lambda: clock[0]))
    made = mark(installed)
    assert made.startswith(f"t={made_at},v1=")
    for moved in (
        PROBE_WINDOW_SECONDS,
        -PROBE_WINDOW_SECONDS,
        PROBE_WINDOW_SECONDS + 1,
        -PROBE_WINDOW_SECONDS - 1,
    ):
        clock[0] = made_at + moved
        assert post(installed, probe=made).status_code == 401
    assert outcomes(installed) == [("doctor-probe", 401)] * 2 + [("rejected-signature", 401)] * 2


def test_no_mark_without_a_secret_key(installed: Harness) -> None:
    installed.shop.config["SECRET_KEY"] = None
    with installed.shop.app_context():
        assert doctor_probe_mark(BODY) is None


def test_the_refused_lists_leave_the_probe_out(installed: Harness) -> None:
    """The admin's "refused or unanswered" filter and ``flask gateway callbacks --refused`` use the same
    predicate as the refused figure: the doctor's probe is in the whole log, not in the refused lists."""
    post(installed, probe=mark(installed))
    post(installed)
    installed.gateway.admin_guard(lambda: True)

    everything = installed.client.get("/gateway/admin/callbacks").get_data(as_text=True)
    assert 'data-callback-outcome="doctor-probe"' in everything
    refused = installed.client.get("/gateway/admin/callbacks?refused=1").get_data(as_text=True)
    assert 'data-callback-outcome="rejected-signature"' in refused
    assert 'data-callback-outcome="doctor-probe"' not in refused

    listed = run_gateway(installed.shop, "callbacks", "--refused")
    assert listed.exit_code == 0, listed.output
    lines = listed.stdout.strip().splitlines()
    assert len(lines) == 1 and "rejected-signature" in lines[0]
    assert "doctor-probe" in run_gateway(installed.shop, "callbacks").stdout
