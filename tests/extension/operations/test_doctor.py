"""``flask gateway doctor`` finds each broken setup of a table, says how to fix it and exits 1 (issue 15);
a healthy setup exits 0.

Each row is a shop that starts but is broken in one way, wired to an in-process emulator
(``flask_gateway.testing.GatewayEmulator``) and installed. The shop's public URL is reached through
``responses``: by default a "proxy" that hands the request to the shop's app (the extension's real answer);
a row may replace it with a proxy that answers 404 or 502, or with nothing at all (unreachable). Nothing
leaves the process.
"""

from __future__ import annotations

import json
import re
import socket
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

import pytest
import requests
import responses
from flask import Flask, redirect, request
from flask_sqlalchemy import SQLAlchemy
from flask_wtf.csrf import CSRFProtect
from sqlalchemy import select, text, update

from flask_gateway import Gateway, create_checkout, models
from flask_gateway.core.timestamps import utcnow
from flask_gateway.models import CallbackLog, GatewayCheckout
from flask_gateway.operations.doctor import gateway as doctor_gateway
from flask_gateway.operations.doctor import run_checks, schedules
from flask_gateway.operations.health import callback_health
from flask_gateway.secrets import SecretBox
from flask_gateway.state import get_state
from flask_gateway.testing import DEMO_ACCOUNT, GatewayEmulator, GatewayKitWarning, gateway_config
from tests.conftest import Databases
from tests.extension.conftest import sample_order
from tests.extension.operations.cli_support import run_gateway

SHOP = "https://shop.example"
LOCAL_SHOP = "http://127.0.0.1:5000"
LOCAL_EMULATOR = "http://127.0.0.1:5050"
ATTACKER_URL = "https://attacker.example/steal"
HAS_OUTBOX = hasattr(models, "OutboxEvent")


def build_shop(database_url: str, *, csrf: str = "before", **config: Any) -> Flask:
    """A shop with the extension; ``csrf``: how it sets up Flask-WTF's CSRFProtect (before the gateway,
    after it, twice, or with its own hook calling ``csrf.protect()`` for every request)."""
    app = Flask("doctor_shop")
    app.config.update(
        TESTING=True,
        SECRET_KEY="shop-secret-key-for-tests",
        SQLALCHEMY_DATABASE_URI=database_url,
        GATEWAY_MAX_RETRIES=0,
        GATEWAY_ORDER_ENDPOINT="order_page",
        **gateway_config(),
    )
    app.config.update(config)
    db = SQLAlchemy()
    db.init_app(app)
    if csrf == "before":
        CSRFProtect(app)
        Gateway(app, db=db)
    elif csrf == "after":
        Gateway(app, db=db)
        CSRFProtect(app)
    elif csrf == "twice":  # e.g. once in a module, once in the app factory
        CSRFProtect(app)
        CSRFProtect(app)
        Gateway(app, db=db)
    elif csrf == "manual":  # Flask-WTF's "selective protection" recipe, without apply_exemptions
        app.config["WTF_CSRF_CHECK_DEFAULT"] = False
        protection = CSRFProtect(app)
        Gateway(app, db=db)

        @app.before_request
        def check_csrf() -> None:
            protection.protect()
    else:
        raise AssertionError(csrf)

    @app.get("/orders/<reference>")
    def order_page(reference: str) -> str:
        return f"order {reference}"

    with app.app_context():
        db.create_all()
    return app


def proxy_to(shop: Flask, origin: str, mock: responses.RequestsMock) -> None:
    """The shop's public ``origin`` reached through a proxy that hands every request to the shop's app
    (an error in the app is its 500 page, as a real server answers)."""
    client = shop.test_client()

    def forward(sent: Any) -> tuple[int, dict[str, str], bytes]:
        url = urlsplit(sent.url)
        try:
            answer = client.open(
                url.path,
                method=sent.method,
                base_url=origin,
                data=sent.body,
                headers={k: v for k, v in sent.headers.items() if k.lower() != "content-length"},
            )
        except Exception:  # TESTING propagates the app's errors: answer as a server does
            return 500, {"Content-Type": "text/html"}, b"<h1>Internal Server Error</h1>"
        kept = {k: v for k, v in answer.headers.items() if k.lower() in ("content-type", "location")}
        return answer.status_code, kept, answer.get_data()

    mock.add_callback(responses.POST, re.compile(re.escape(origin) + "/.*"), callback=forward)


@dataclass
class Setup:
    shop: Flask
    gateway: GatewayEmulator
    databases: Databases
    mock: responses.RequestsMock


@dataclass(frozen=True)
class Broken:
    """One row: a broken setup, and what the doctor must say about it.

    ``expected``: check name -> (words of the problem, words of its fix). Exactly these checks report a
    problem (a setup broken in one way can show in two checks: CSRF in the app and at the public URL)."""

    id: str
    expected: dict[str, tuple[str, str]]
    config: dict[str, Any] = field(default_factory=dict)
    csrf: str = "before"
    install: bool = True
    #: ``proxy``: the public URL leads to the shop; ``none``: nothing answers; else (status, body) a proxy
    #: answers with instead.
    public: str | tuple[int, str] = "proxy"
    breaks: Callable[[Setup], None] | None = None
    needs_outbox: bool = False
    #: The test kit warns that the emulator's firewall will refuse the shop's checkouts (the row's point).
    kit_warns: bool = False


def _change_secret_key(setup: Setup) -> None:
    """A restart with another SECRET_KEY (no GATEWAY_ENCRYPTION_KEY): the stored keys were encrypted with a
    key derived from the old one."""
    setup.shop.config["SECRET_KEY"] = "a-new-secret-key-after-a-redeploy"
    get_state(setup.shop).box = SecretBox(None, setup.shop.config["SECRET_KEY"])


def _move_callback_at_the_gateway(setup: Setup) -> None:
    """Someone signs a settings update through the sandbox's 401 answer (``expectedSignature``)."""
    raw = json.dumps({"checkoutStatusCallbackUrl": ATTACKER_URL}).encode()
    headers = {"Content-Type": "application/json", "X-Merchant-Account-ID": DEMO_ACCOUNT}
    client = setup.gateway.client
    refused = client.patch("/install/v2", data=raw, headers={**headers, "X-Signature": "junk"})
    signed = {**headers, "X-Signature": refused.json["expectedSignature"]}
    assert client.patch("/install/v2", data=raw, headers=signed).status_code == 200


def _checkout_waiting(setup: Setup, age: timedelta) -> int:
    with setup.shop.app_context():
        checkout = create_checkout(sample_order())
        state = get_state()
        state.session.execute(
            update(GatewayCheckout)
            .where(GatewayCheckout.id == checkout.id)
            .values(created_at=utcnow() - age, updated_at=utcnow() - age)
        )
        state.session.commit()
        return checkout.id


def _schedule_stopped(setup: Setup, job: str) -> None:
    """A schedule ran ``job`` and stopped: its last run finished (fine) two hours ago."""
    with setup.shop.app_context():
        session = get_state().session
        long_ago = utcnow() - timedelta(hours=2)
        session.add(
            models.JobRun(
                job=job,
                last_started_at=long_ago,
                last_finished_at=long_ago,
                last_succeeded_at=long_ago,
                last_outcome="ok",
                runs=1,
            )
        )
        session.commit()


def _checkouts_pile_up(setup: Setup) -> None:
    _checkout_waiting(setup, timedelta(hours=2))
    _schedule_stopped(setup, "reconcile")


def _outbox_event_waits(setup: Setup) -> None:
    _outbox_event(setup, state="pending")
    _schedule_stopped(setup, "deliver")


def _drop_refunds_table(setup: Setup) -> None:
    with setup.shop.app_context():
        get_state().db.session.execute(text("DROP TABLE gateway_refunds"))
        get_state().db.session.commit()


def _outbox_event(setup: Setup, **values: Any) -> None:
    checkout_id = _checkout_waiting(setup, timedelta(0))
    with setup.shop.app_context():
        session = get_state().session
        now = utcnow()
        session.add(
            models.OutboxEvent(  # type: ignore[attr-defined]
                checkout_id=checkout_id,
                kind="payment_confirmed",
                payload={},
                created_at=now - timedelta(hours=1),
                next_attempt_at=now - timedelta(hours=1),
                **values,
            )
        )
        session.commit()


def _a_login_wall(setup: Setup) -> None:
    @setup.shop.before_request
    def login_wall() -> Any:
        if not request.path.startswith("/login"):
            return redirect("/login")
        return None


BROKEN = [
    Broken(
        "an http public URL on an IP address, the gateway's firewall strict",
        {"public-url": ("http://127.0.0.1:5000 is on an IP address", "GATEWAY_WAF='allow-local'")},
        config={
            "GATEWAY_PUBLIC_URL": LOCAL_SHOP,
            "GATEWAY_BASE_URL": LOCAL_EMULATOR,
            "GATEWAY_INSTALL_URL": f"{LOCAL_EMULATOR}/install",
            "GATEWAY_V1_BASE_URL": LOCAL_EMULATOR,
        },
        kit_warns=True,
    ),
    Broken(
        "CSRFProtect initialised twice",
        {
            "csrf": ("CSRFProtect refuses the gateway's callbacks", "initialised 2 times"),
            "callback": ("CSRF protection refuses", "before the gateway, once"),
        },
        csrf="twice",
    ),
    Broken(
        "a hook of the shop's calls csrf.protect() for every request",
        {
            "csrf": ("'The CSRF token is missing.'", "csrf.protect(apply_exemptions=True)"),
            "callback": ("CSRF protection refuses", "before the gateway, once"),
        },
        csrf="manual",
    ),
    Broken(
        "a login wall in front of every page",
        {
            "csrf": ("with 302 to /login", "let /gateway/callback through your login wall"),
            "callback": ("a redirect to /login", "let the callback through"),
        },
        breaks=_a_login_wall,
    ),
    Broken(
        "SECRET_KEY changed after the install: the stored keys cannot be decrypted",
        {
            "installation": ("API key and signing key cannot be decrypted", "put the old key back"),
            "callback": ("answered 500", "SecretUnreadable"),
        },
        breaks=_change_secret_key,
    ),
    Broken(
        "the callback URL changed at the gateway",
        {
            "settings": (
                f"callback URL: the shop has '{SHOP}/gateway/callback', the gateway '{ATTACKER_URL}'",
                "save the settings screen (/gateway/admin/settings)",
            )
        },
        breaks=_move_callback_at_the_gateway,
    ),
    Broken(
        "nothing answers at the public URL",
        {"callback": ("nothing is listening there (ConnectionError", "resolves")},
        public="none",
    ),
    Broken(
        "the proxy answers 502",
        {"callback": ("answered 502 (text/html: 'Bad Gateway')", "check that the app server runs")},
        public=(502, "<h1>Bad Gateway</h1>"),
    ),
    Broken(
        "the proxy does not forward /gateway/",
        {"callback": ("answered 404", "forwards /gateway/ (GATEWAY_URL_PREFIX)")},
        public=(404, "<h1>Not Found</h1>"),
    ),
    Broken(
        "CSRF protection switched off in the sandbox",
        {"csrf": ("WTF_CSRF_ENABLED is False", "remove WTF_CSRF_ENABLED=False")},
        config={"GATEWAY_ENVIRONMENT": "sandbox", "WTF_CSRF_ENABLED": False},
    ),
    Broken(
        "due checkouts pile up: the schedule of flask gateway reconcile stopped",
        {
            "reconcile": (
                "1 open checkout(s) have been due for reconciliation",
                "schedule it every 5 minutes",
            ),
            "background-work": ("reconcile: last run finished", "schedule flask gateway reconcile"),
        },
        breaks=_checkouts_pile_up,
    ),
    Broken(
        "not installed",
        {
            "installation": ("not installed for GATEWAY_ENVIRONMENT='emulator'", "/gateway/admin/install"),
            "readiness": (
                "/readyz answers 503 (not ready: installation (not installed for the emulator environment))",
                "the database and installation findings above",
            ),
        },
        install=False,
    ),
    Broken(
        "a table missing after an upgrade",
        {
            # one finding: the checks that read the tables (readiness among them) wait for them
            "database": ("table(s) gateway_refunds", "flask db upgrade"),
        },
        breaks=_drop_refunds_table,
    ),
    Broken(
        "a development SECRET_KEY in the sandbox",
        {"configuration": ("SECRET_KEY is a development placeholder", "secrets.token_hex(32)")},
        config={"GATEWAY_ENVIRONMENT": "sandbox", "SECRET_KEY": "dev only: change me"},
    ),
    Broken(
        "outbox events overdue: the schedule of flask gateway deliver stopped",
        {
            "outbox": ("1 outbox event(s) are overdue", "flask gateway deliver"),
            "background-work": ("deliver: last run finished", "schedule flask gateway deliver"),
        },
        breaks=_outbox_event_waits,
        needs_outbox=True,
    ),
    Broken(
        "a dead outbox event",
        {"outbox": ("1 outbox event(s) are dead", "/gateway/admin/outbox")},
        breaks=lambda setup: _outbox_event(setup, state="dead", attempts=8, last_error="RuntimeError: boom"),
        needs_outbox=True,
    ),
]


@pytest.fixture
def setups(databases: Databases) -> Iterator[Callable[..., Setup]]:
    made: list[Setup] = []
    mock = responses.RequestsMock(assert_all_requests_are_fired=False)
    mock.start()

    def make(
        *,
        config: dict[str, Any] | None = None,
        csrf: str = "before",
        install: bool = True,
        public: Any = "proxy",
    ) -> Setup:
        shop = build_shop(databases.url("main"), csrf=csrf, **(config or {}))
        gateway = GatewayEmulator.start(shop, database_url=databases.url("emulator"), install=install)
        setup = Setup(shop=shop, gateway=gateway, databases=databases, mock=mock)
        made.append(setup)
        origin = get_state(shop).config.public_url or ""
        if public == "proxy":
            proxy_to(shop, origin, mock)
        elif public != "none":
            status, body = public
            mock.add(
                responses.POST,
                re.compile(re.escape(origin) + "/.*"),
                status=status,
                body=body,
                content_type="text/html",
            )
        return setup

    yield make
    mock.stop()
    mock.reset()
    for setup in made:
        setup.gateway.close()


def doctor(shop: Flask, *args: str) -> Any:
    return run_gateway(shop, "doctor", "--timeout", "2", *args)  # stdout: the findings only


def findings(output: str) -> dict[str, list[tuple[str, str]]]:
    """check name -> [(level mark, the finding's text, lines joined)] from the command's output."""
    found: dict[str, list[tuple[str, str]]] = {}
    body = output.strip().rsplit("\n", 1)[0]  # the last line is the summary
    blocks = re.split(r"\n(?=\[(?:ok|info|warn|PROBLEM|unknown)\])", body)
    for block in blocks:
        match = re.match(r"\[(ok|info|warn|PROBLEM|unknown)\]\s+([a-z-]+): (.*)", " ".join(block.split()))
        assert match, block
        found.setdefault(match.group(2), []).append((match.group(1), match.group(3)))
    return found


def problems(output: str) -> dict[str, str]:
    return {
        check: text for check, items in findings(output).items() for mark, text in items if mark == "PROBLEM"
    }


@pytest.mark.backends  # the tables, the schedules' queries
@pytest.mark.parametrize("row", [pytest.param(row, id=row.id) for row in BROKEN])
def test_doctor_finds_each_broken_setup(setups: Callable[..., Setup], row: Broken) -> None:
    if row.needs_outbox and not HAS_OUTBOX:
        pytest.skip("this version has no outbox (flask_gateway.models.OutboxEvent)")
    with pytest.warns(GatewayKitWarning) if row.kit_warns else nullcontext():
        setup = setups(config=row.config, csrf=row.csrf, install=row.install, public=row.public)
    if row.breaks is not None:
        row.breaks(setup)

    result = doctor(setup.shop)

    assert result.exit_code == 1, result.output
    found = problems(result.stdout)
    assert sorted(found) == sorted(row.expected), result.output
    for check, (problem, fix) in row.expected.items():
        said, _, how = found[check].partition(" fix: ")
        assert problem in said, result.output
        assert fix in how, result.output
    assert "fix the problems above" in result.output.strip().splitlines()[-1]


@pytest.mark.backends  # the schedules' queries
def test_a_development_shop_with_nothing_scheduled_yet_is_told_not_alarmed(
    setups: Callable[..., Setup],
) -> None:
    """Nothing ever ran deliver or reconcile on this shop (development: no cron): what waits is information
    with its command, and the doctor exits 0. The same shop once production says so is a problem."""
    setup = setups()
    _outbox_event(setup, state="pending")
    _checkout_waiting(setup, timedelta(hours=2))  # the same order (sample_order): its checkout, aged

    result = doctor(setup.shop)

    assert result.exit_code == 0, result.output
    found = findings(result.stdout)
    (reconcile,) = found["reconcile"]
    assert reconcile[0] == "info", result.output
    assert "nothing has run flask gateway reconcile on this shop yet" in reconcile[1]
    assert "fix: run flask gateway reconcile" in reconcile[1] and "every 5 minutes" in reconcile[1]
    outbox = [item for item in found["outbox"] if item[0] == "info"]
    assert outbox and "nothing has run flask gateway deliver on this shop yet" in outbox[0][1], result.output
    assert "PROBLEM" not in result.stdout
    assert "note" in result.output.strip().splitlines()[-1]

    # The same records where the app says production (installations are per environment: the seam is the
    # doctor's own question, not the configuration).
    with setup.shop.app_context(), pytest.MonkeyPatch.context() as patch:
        patch.setattr(schedules, "_in_production", lambda: True)
        found_live = run_checks(network=False).findings
    levels = {f.check: f.level for f in found_live if f.check in ("reconcile", "outbox")}
    assert levels == {"reconcile": "problem", "outbox": "problem"}


def test_the_probe_tells_nothing_listening_from_slow_to_answer() -> None:
    """Real sockets: a port nobody listens on refuses at once; a listener that takes the connection and
    never answers is slow (the doctor says which, and how long it waited)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused_url = f"http://127.0.0.1:{closed.getsockname()[1]}/gateway/callback"
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen()  # the kernel accepts the connection; nothing ever answers
        slow_url = f"http://127.0.0.1:{silent.getsockname()[1]}/gateway/callback"
        said = {}
        for url in (refused_url, slow_url):
            try:
                requests.post(url, data=b"{}", timeout=0.5)
            except requests.exceptions.RequestException as error:
                said[url] = doctor_gateway._unanswered(url, error, 0.5, 0.5, local_dev=True)
    refused, slow = said[refused_url], said[slow_url]
    assert "nothing is listening there (ConnectionError" in refused.message, refused
    assert "start the shop" in refused.fix
    assert "took the connection but did not answer within 0.5 s (ReadTimeout)" in slow.message, slow
    assert "slow or stuck" in slow.message
    assert "the shop's log" in slow.fix and "longer --timeout (it was 0.5 s)" in slow.fix
    assert refused.level == slow.level == "warn"  # local development; a problem elsewhere


def test_a_healthy_setup_passes(setups: Callable[..., Setup]) -> None:
    setup = setups()
    _checkout_waiting(setup, timedelta(minutes=1))  # an open checkout, not due yet

    result = doctor(setup.shop)

    assert result.exit_code == 0, result.output
    found = findings(result.stdout)
    checks = ["configuration", "public-url", "csrf", "database", "installation", "settings", "callback"]
    assert list(found)[: len(checks)] == checks
    assert {mark for items in found.values() for mark, _text in items} <= {"ok", "unknown"}, result.output
    assert [text for mark, text in found["outbox"]] and (HAS_OUTBOX or found["outbox"][0][0] == "unknown")
    assert "answered 401, the extension's own refusal" in found["callback"][0][1]
    assert found["readiness"] == [
        (
            "ok",
            f"{SHOP}/gateway/readyz answers 200 (database, schema, installation); probe liveness at "
            f"{SHOP}/gateway/livez and readiness at {SHOP}/gateway/readyz "
            "(docs/operations.md#health-checks-and-database-outages)",
        )
    ]
    assert result.output.strip().splitlines()[-1].startswith("No problem found (")
    # Its footprint (docs/operations.md): the csrf check never calls the view, the callback check leaves one
    # row that names the doctor, recorded as its probe (marked with a key derived from SECRET_KEY): answered
    # 401 as an unsigned callback, but no refused callback and no callback_rejected.
    with setup.shop.app_context():
        rows = get_state().session.scalars(select(CallbackLog)).all()
        assert callback_health().refused == 0
    assert [(row.outcome, row.http_status) for row in rows] == [("doctor-probe", 401)]
    assert rows[0].headers["User-Agent"].startswith("flask-gateway-doctor/")
    assert "X-Gateway-Doctor-Probe" not in rows[0].headers  # the mark is not kept
    assert [s.signal for s in setup.gateway.signals] == []


def test_csrfprotect_after_the_gateway_still_lets_callbacks_through(setups: Callable[..., Setup]) -> None:
    """The extension exempts its callback from a CSRFProtect set up after it, too (a late hook)."""
    setup = setups(csrf="after")
    result = doctor(setup.shop)
    assert result.exit_code == 0, result.output
    assert findings(result.stdout)["csrf"] == [
        (
            "ok",
            "CSRFProtect is used and exempts the gateway's callback: an unsigned POST to "
            "/gateway/callback without a token reaches the extension",
        )
    ]


def test_no_network_skips_the_gateway_and_the_public_url(setups: Callable[..., Setup]) -> None:
    setup = setups(public="none")  # would be a problem, were it asked
    _move_callback_at_the_gateway(setup)  # so would this

    result = doctor(setup.shop, "--no-network")

    assert result.exit_code == 0, result.output
    found = findings(result.stdout)
    for check in ("settings", "callback"):
        ((mark, said),) = found[check]
        assert mark == "unknown"
        assert said.startswith(
            "skipped (--no-network): run without it to check fix: run flask gateway doctor"
        )


def test_the_outbox_check_is_unknown_without_an_outbox(
    setups: Callable[..., Setup], monkeypatch: pytest.MonkeyPatch
) -> None:
    setup = setups()
    monkeypatch.delattr(models, "OutboxEvent", raising=False)
    result = doctor(setup.shop, "--no-network")
    assert result.exit_code == 0, result.output
    ((mark, said),) = findings(result.stdout)["outbox"]
    assert mark == "unknown"
    assert said.startswith("this version of Flask-Gateway has no outbox: nothing to check fix: ")


def test_a_proxy_that_rate_limits_is_a_warning(setups: Callable[..., Setup]) -> None:
    setup = setups(public="none")
    setup.mock.add(
        responses.POST,
        re.compile(re.escape(SHOP) + "/.*"),
        status=429,
        json={"message": "Too many refused callbacks from this address; try again later."},
    )
    result = doctor(setup.shop)
    assert result.exit_code == 0, result.output
    ((mark, said),) = findings(result.stdout)["callback"]
    assert mark == "warn"
    assert "ProxyFix" in said


def test_production_configuration(databases: Databases) -> None:
    """A production shop (never wired in a test: its configuration only) with a placeholder SECRET_KEY."""
    shop = build_shop(
        databases.url("main"),
        GATEWAY_ENVIRONMENT="production",
        GATEWAY_BASE_URL="https://gateway.example",
        GATEWAY_INSTALL_URL="https://install.gateway.example",
        GATEWAY_V1_BASE_URL="https://v1.gateway.example",
        SECRET_KEY="change-me",
    )
    with shop.app_context():
        report = run_checks(network=False)
    problem = {f.check: f for f in report.problems}
    assert sorted(problem) == ["configuration", "installation", "readiness"]
    assert "whoever guesses it can forge" in problem["configuration"].message
    assert "encrypted with a key derived from it" in problem["configuration"].message
    assert "secrets.token_hex(32)" in problem["configuration"].fix


def test_the_quickstarts_embedded_shop_passes_with_a_warning(setups: Callable[..., Setup]) -> None:
    """The quickstart's setup (docs/extension.md): the emulator embedded, no public URL, a development
    SECRET_KEY. Nothing is broken for development: a warning, no problem."""
    setup = setups(
        config={
            "GATEWAY_ENVIRONMENT": "embedded",
            "GATEWAY_BASE_URL": None,
            "GATEWAY_INSTALL_URL": None,
            "GATEWAY_V1_BASE_URL": None,
            "GATEWAY_PUBLIC_URL": None,
            "SECRET_KEY": "dev only: change me",
        },
        public="none",
    )

    result = doctor(setup.shop)

    assert result.exit_code == 0, result.output
    found = findings(result.stdout)
    ((mark, said),) = found["configuration"]
    assert mark == "warn"
    assert "SECRET_KEY is a development placeholder: fine here, never in the sandbox or production." in said
    ((mark, said),) = found["callback"]
    assert mark == "unknown"
    assert said.startswith("GATEWAY_PUBLIC_URL is not set: the callback's public address is unknown fix: ")
    assert found["settings"][0][0] == "ok"
