"""``flask gateway doctor``: check what breaks integrations in practice, and say how to fix each.

Every check is a small function that returns :class:`Finding` objects (the check's name, ``ok``, ``warn``,
``problem`` or ``unknown``, what is true or wrong, and how to fix it, naming the config key or the docs
page). :func:`run_checks` runs them all, one after the other, and never stops at one that fails.

==================  =======================================================================================
``configuration``   the environment and its URLs, ``GATEWAY_PUBLIC_URL`` (set, https), ``SECRET_KEY`` (set,
                    not a development placeholder), ``GATEWAY_ENCRYPTION_KEY``, the API version, the
                    embedded emulator (development only)
``public-url``      the public URL and the installed callback URL against the gateway's firewall
                    (:func:`flask_gateway.checks.setup_warnings`, the same warnings as the admin screens)
``csrf``            an unsigned POST to the callback, without a CSRF token, gets through the app's own
                    ``before_request`` hooks (Flask-WTF's ``CSRFProtect``, a login wall) to the extension
``database``        every ``gateway_*`` table and column exists (migrations run)
``installation``    installed for this environment; the stored API key and signing key decrypt
``settings``        (network) the gateway's settings are the shop's (``drift.check_settings``)
``callback``        (network) the callback answers at its public URL with the extension's own refusal of an
                    unsigned request (401 ``{"message": ...}``), not a proxy's 404, 502 or login page; the
                    probe is marked (``X-Gateway-Doctor-Probe``, an HMAC with a key derived from
                    ``SECRET_KEY``) so the shop records it as ``doctor-probe``, not as a refused callback
``reconcile``       no checkout due for reconciliation has waited more than an hour: something runs
                    ``flask gateway reconcile``
``outbox``          no outbox event overdue by more than 15 minutes (something runs ``flask gateway
                    deliver``) and none dead; ``unknown`` in a version without the outbox
``background-work`` each job's heartbeat (:mod:`flask_gateway.heartbeats`): how long ago ``deliver`` and
                    ``reconcile`` last ran, what they said, and whether that is past
                    ``GATEWAY_DELIVER_STALE_SECONDS`` / ``GATEWAY_RECONCILE_STALE_SECONDS``
``broker``          the Celery broker (``CELERY["broker_url"]``) answers within 5 seconds (password masked)
``readiness``       ``GET /gateway/readyz`` would answer 200 (database, schema, installation:
                    :mod:`flask_gateway.readiness`), else a load balancer keeps the shop out; names the
                    liveness and readiness probe URLs either way
``package``         ``flask-bnpl-gateway`` is the only installed distribution that provides ``flask_gateway``
                    (not also the index's unrelated ``flask-gateway``), at the version that runs
==================  =======================================================================================

Side effects, all harmless: the ``csrf`` check runs the app's ``before_request`` hooks for a test request
(the callback's view is not called). ``settings`` sends the same settings update that changes nothing as
``flask gateway check-settings`` and records its result. ``callback`` leaves one row in the callback log,
``doctor-probe`` (User-Agent ``flask-gateway-doctor``): no refused callback, no ``callback_rejected``. A shop
whose ``SECRET_KEY`` differs from the doctor's (another environment) records it as ``rejected-signature``.
"""

from __future__ import annotations

import importlib.metadata
import re
import textwrap
from collections.abc import Callable
from contextlib import nullcontext, suppress
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Final, Literal

import requests
from flask import current_app, url_for
from flask_wtf.csrf import CSRFError
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from werkzeug.exceptions import HTTPException

from flask_gateway import models
from flask_gateway._version import DISTRIBUTION, __version__
from flask_gateway.checks import setup_warnings
from flask_gateway.core.errors import AuthenticationError, GatewayError
from flask_gateway.core.hosts import local_host_kind
from flask_gateway.core.sql import sqlite_read_transactions
from flask_gateway.core.timestamps import utcnow
from flask_gateway.drift import check_settings
from flask_gateway.errors import (
    CallbackRateLimited,
    CallbackUnauthorized,
    NotInstalledError,
    SecretUnreadable,
)
from flask_gateway.heartbeats import JobStatus, broker_unreachable, job_status, mask_url
from flask_gateway.inbound import PROBE_HEADER, doctor_probe_mark
from flask_gateway.models import GatewayBase, GatewayCheckout, Installation
from flask_gateway.readiness import missing_schema, readiness
from flask_gateway.reconciliation import CLAIM_LEASE_SECONDS, _due
from flask_gateway.secrets import SecretBox
from flask_gateway.state import GatewayState, get_state
from flask_gateway.urls import callback_url, external_url

__all__ = [
    "CHECKS",
    "DEFAULT_TIMEOUT",
    "Check",
    "DoctorReport",
    "Finding",
    "Level",
    "Options",
    "probe_urls",
    "run_checks",
]

Level = Literal["ok", "warn", "problem", "unknown"]

#: A checkout due for reconciliation for longer than this means nothing runs ``flask gateway reconcile``.
RECONCILE_MARGIN: Final = timedelta(hours=1)
#: An outbox event still pending this long after it was due means nothing runs ``flask gateway deliver``.
OUTBOX_MARGIN: Final = timedelta(minutes=15)
#: Seconds to wait for the shop's public URL (``--timeout``).
DEFAULT_TIMEOUT: Final = 10.0
#: The callback check's User-Agent: its row in the callback log says where it came from.
USER_AGENT: Final = f"flask-gateway-doctor/{__version__}"

_MARKS: Final[dict[Level, str]] = {
    "ok": "[ok]",
    "warn": "[warn]",
    "problem": "[PROBLEM]",
    "unknown": "[unknown]",
}

#: ``SECRET_KEY`` values copied from examples and tutorials (compared lower-cased, without the edges).
_PLACEHOLDER: Final = re.compile(
    r"change[\s_.:-]*(me|it|this)|replace[\s_.:-]*(me|this)|your[\s_.-]*secret|not[\s_.-]*(a[\s_.-]*)?secret"
    r"|insecure|^(dev|development|test|testing|secret|default|key|password|flask|demo|example)"
    r"([\s_.-]*(secret|key|secret[\s_.-]*key))?$",
)
#: Shorter than this, a ``SECRET_KEY`` is guessable whatever it says.
_MIN_SECRET_LENGTH: Final = 16

_DOCS_SECRET: Final = "docs/configuration.md#secret_key"  # noqa: S105  (a docs page, no password)
_DOCS_UNREADABLE: Final = "docs/troubleshooting.md#secretunreadable-after-changing-secret_key"
_DOCS_FIREWALL: Final = "docs/troubleshooting.md#403-forbidden-for-localhost-or-ip-addresses"
_DOCS_CSRF: Final = "docs/troubleshooting.md#callbacks-refused-with-400-the-csrf-token-is-missing"
_DOCS_DRIFT: Final = "docs/troubleshooting.md#the-gateways-settings-differ-from-the-shops"
_DOCS_401: Final = "docs/troubleshooting.md#401-from-the-gateway-comparing-with-expectedsignature"
_DOCS_MISSED: Final = "docs/troubleshooting.md#missed-callbacks"
_DOCS_PROBES: Final = "docs/operations.md#health-checks-and-database-outages"


@dataclass(frozen=True)
class Finding:
    """One thing a check found: ``ok`` (true and fine), ``warn`` (works, but should change), ``problem``
    (breaks payments or callbacks: the command exits 1) or ``unknown`` (could not tell, or skipped)."""

    check: str
    level: Level
    #: What is true, or what is wrong and what it breaks.
    message: str
    #: How to fix it (a ``warn`` or ``problem``): the config key, the screen, the docs page.
    fix: str = ""

    @property
    def mark(self) -> str:
        return _MARKS[self.level]

    def lines(self, width: int = 100) -> list[str]:
        """The finding for a terminal: a marked line (wrapped), then its fix, indented under it."""
        indent = " " * 10
        wrap = textwrap.TextWrapper(
            width=width,
            subsequent_indent=indent,
            break_long_words=False,
            break_on_hyphens=False,
        )
        lines = wrap.wrap(f"{self.mark:<10}{self.check}: {self.message}")
        if self.fix and self.level != "ok":
            wrap.initial_indent = indent
            lines += wrap.wrap(f"fix: {self.fix}")
        return lines


@dataclass
class DoctorReport:
    #: Every finding of every check, in the order of :data:`CHECKS`.
    findings: list[Finding] = field(default_factory=list)

    @property
    def shown(self) -> list[Finding]:
        """What the command prints: per check, its findings that are not ``ok``; or, when all are, one
        ``ok`` line that says what was found fine."""
        shown: list[Finding] = []
        checks = list(dict.fromkeys(finding.check for finding in self.findings))
        for check in checks:
            mine = [finding for finding in self.findings if finding.check == check]
            trouble = [finding for finding in mine if finding.level != "ok"]
            shown += trouble or [Finding(check, "ok", "; ".join(finding.message for finding in mine))]
        return shown

    def count(self, level: Level) -> int:
        """How many of the printed lines (:attr:`shown`) have ``level``."""
        return sum(1 for finding in self.shown if finding.level == level)

    @property
    def ok(self) -> bool:
        """No problem (warnings and unknowns allowed)."""
        return not self.problems

    @property
    def problems(self) -> list[Finding]:
        return [finding for finding in self.findings if finding.level == "problem"]

    def summary(self) -> str:
        words: tuple[tuple[Level, str, str], ...] = (
            ("problem", "problem", "problems"),
            ("warn", "warning", "warnings"),
            ("ok", "ok", "ok"),
            ("unknown", "unknown", "unknown"),
        )
        counts = ", ".join(
            f"{n} {one if n == 1 else many}" for level, one, many in words if (n := self.count(level))
        )
        if self.ok:
            return f"No problem found ({counts})."
        return f"{counts}: fix the problems above, then run flask gateway doctor again."


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[Options], list[Finding]]
    #: Calls the gateway or the shop's public URL: skipped with ``--no-network``.
    network: bool = False
    #: Only reads the database (SQLite: read transactions, no write lock).
    reads: bool = True


@dataclass(frozen=True)
class Options:
    #: Seconds to wait for the shop's public URL.
    timeout: float = DEFAULT_TIMEOUT
    #: The HTTP session for the callback check (default: a new ``requests.Session``).
    http: requests.Session | None = None


def run_checks(
    *, network: bool = True, timeout: float = DEFAULT_TIMEOUT, http: requests.Session | None = None
) -> DoctorReport:
    """Run every check in :data:`CHECKS` (in an app context) and report; ``network=False`` skips those that
    call the gateway or the shop's public URL (``unknown``). One check that fails does not stop the rest."""
    options = Options(timeout=timeout, http=http)
    report = DoctorReport()
    state = get_state()
    for check in CHECKS:
        if check.network and not network:
            report.findings.append(
                Finding(check.name, "unknown", "skipped (--no-network): run without it to check")
            )
            continue
        try:
            with sqlite_read_transactions() if check.reads else nullcontext():
                found = check.run(options)
        except Exception as error:  # one check that breaks must not hide the others' findings
            found = [
                Finding(
                    check.name,
                    "unknown",
                    f"the check could not run: {type(error).__name__}: {_first_line(error)}",
                    "read the message; if it names nothing of your setup, report it as a bug",
                )
            ]
        finally:
            _end_transaction(state)
        report.findings.extend(found)
    return report


def _end_transaction(state: GatewayState) -> None:
    """No transaction of the doctor's stays open between checks (SQLite: no lock while HTTP is sent)."""
    with suppress(SQLAlchemyError):
        state.session.rollback()


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else type(error).__name__


def _environment_label(state: GatewayState) -> str:
    return f"GATEWAY_ENVIRONMENT={state.config.environment!r}"


def _live(state: GatewayState) -> bool:
    """The sandbox or production: the shop is on the internet, the gateway is a real one."""
    return state.config.environment in ("sandbox", "production")


def _admin(state: GatewayState, screen: str) -> str:
    return f"{state.config.url_prefix}/admin/{screen}"


# --- configuration ------------------------------------------------------------------------------------


def check_configuration(_options: Options) -> list[Finding]:
    state = get_state()
    config = state.config
    app_config = current_app.config
    name = "configuration"
    findings: list[Finding] = []
    live = _live(state)

    if config.environment == "embedded":
        public_host = config.public_url and local_host_kind(config.public_url) is None
        if public_host:
            findings.append(
                Finding(
                    name,
                    "warn",
                    f"{_environment_label(state)}: the gateway's emulator, mounted in this app, takes the "
                    f"payments at {config.public_url}, a public address: no money moves, whatever shoppers "
                    "see.",
                    "the embedded emulator is for development (it refuses to be mounted beside the sandbox "
                    "or production): for a shop that takes real orders set GATEWAY_ENVIRONMENT='sandbox' "
                    "or 'production' (docs/extension.md#from-the-emulator-to-the-sandbox)",
                )
            )
        else:
            findings.append(
                Finding(
                    name,
                    "ok",
                    f"{_environment_label(state)}: the gateway's emulator mounted in this app at "
                    f"{config.embedded_prefix} (development only: never beside the sandbox or production)",
                )
            )
    else:
        findings.append(Finding(name, "ok", f"{_environment_label(state)}: the gateway at {config.base_url}"))

    public = config.public_url
    if public is None:
        if live:
            findings.append(
                Finding(
                    name,
                    "warn",
                    "GATEWAY_PUBLIC_URL is not set: the callback and return URLs are built from each "
                    "request's Host header (behind a proxy without ProxyFix, the internal address), and "
                    "the callback cannot be checked from here.",
                    "set GATEWAY_PUBLIC_URL to the shop's external https address, e.g. https://shop.example "
                    "(docs/configuration.md)",
                )
            )
        else:
            findings.append(
                Finding(
                    name,
                    "ok",
                    "GATEWAY_PUBLIC_URL is not set: URLs are built on each request's address (fine for "
                    "local development)",
                )
            )
    elif live and not public.startswith("https://"):
        findings.append(
            Finding(
                name,
                "warn",
                f"GATEWAY_PUBLIC_URL={public!r} is http: the gateway posts callbacks and sends shoppers "
                "there in the clear (production refuses to start so).",
                "serve the shop over https and set GATEWAY_PUBLIC_URL to the https:// address",
            )
        )
    else:
        findings.append(Finding(name, "ok", f"GATEWAY_PUBLIC_URL={public!r}"))

    findings.append(_secret_key_finding(state, app_config.get("SECRET_KEY")))

    keys = [k for k in (config.encryption_key or "").split(",") if k.strip()]
    if keys:
        more = f" ({len(keys)} keys: the first encrypts, all decrypt)" if len(keys) > 1 else ""
        findings.append(Finding(name, "ok", f"GATEWAY_ENCRYPTION_KEY is set{more}"))
    else:
        findings.append(
            Finding(
                name,
                "ok",
                "GATEWAY_ENCRYPTION_KEY is not set (the stored keys' key is derived from SECRET_KEY)",
            )
        )

    if config.api_version == "v1":
        findings.append(
            Finding(
                name,
                "ok",
                "GATEWAY_API_VERSION='v1': the v1 API has no status query, so reconciliation cannot find "
                "a v1 outcome the shop missed",
            )
        )
    else:
        findings.append(Finding(name, "ok", f"GATEWAY_API_VERSION={config.api_version!r}"))
    return findings


def _secret_key_finding(state: GatewayState, secret: object) -> Finding:
    name = "configuration"
    generate = 'python -c "import secrets; print(secrets.token_hex(32))"'
    if not secret:
        return Finding(
            name,
            "problem",
            "SECRET_KEY is not set: the return links, the v1 outcome URLs and the admin screens' CSRF "
            "tokens are signed with it, so they fail.",
            f"set SECRET_KEY to a long random value that stays the same ({generate}; {_DOCS_SECRET})",
        )
    text = secret.decode("utf-8", "replace") if isinstance(secret, bytes) else str(secret)
    normalised = text.strip().lower()
    placeholder = bool(_PLACEHOLDER.search(normalised))
    if not placeholder and len(text) >= _MIN_SECRET_LENGTH:
        return Finding(name, "ok", f"SECRET_KEY is set ({len(text)} characters)")
    what = "a development placeholder" if placeholder else f"only {len(text)} characters long"
    derived = (
        ""
        if state.config.encryption_key
        else ", and the stored API key and signing key are encrypted with a key derived from it"
    )
    fix = (
        f"set SECRET_KEY to a long random value ({generate}), kept out of the repository; changing it makes "
        "stored secrets unreadable unless GATEWAY_ENCRYPTION_KEY is set, so read "
        f"{_DOCS_UNREADABLE} first ({_DOCS_SECRET})"
    )
    if _live(state):
        return Finding(
            name,
            "problem",
            f"SECRET_KEY is {what}: whoever guesses it can forge the admin's sessions and CSRF tokens and "
            f"the shop's return links{derived}.",
            fix,
        )
    return Finding(name, "warn", f"SECRET_KEY is {what}: fine here, never in the sandbox or production.", fix)


# --- the public URL and the firewall --------------------------------------------------------------------


def check_public_url(_options: Options) -> list[Finding]:
    """The same warnings as the admin screens (:func:`flask_gateway.checks.setup_warnings`): each one a
    problem here, with its fix."""
    state = get_state()
    config = state.config
    name = "public-url"
    settings_screen = _admin(state, "settings")
    findings: list[Finding] = []
    for warning in setup_warnings():
        if warning.kind == "firewall":
            findings.append(
                Finding(
                    name,
                    "problem",
                    f"{warning.summary} GATEWAY_WAF={config.waf!r}: the gateway's firewall answers every "
                    "checkout with 403 Forbidden (FirewallRejectedError).",
                    "set GATEWAY_PUBLIC_URL to the shop's public address with a host name "
                    "(https://shop.example; while developing against the sandbox, a tunnel's address). "
                    "Against a local emulator started with EMULATOR_WAF=allow-local, set "
                    f"GATEWAY_WAF='allow-local' ({_DOCS_FIREWALL})",
                )
            )
        elif warning.kind == "unreachable-callback":
            findings.append(
                Finding(
                    name,
                    "problem",
                    f"{warning.summary} Payments are only found by polling and reconciliation.",
                    "set GATEWAY_PUBLIC_URL to an address the gateway reaches, then save the settings "
                    f"screen ({settings_screen}) so that the gateway gets the new callback URL "
                    f"({_DOCS_FIREWALL})",
                )
            )
        else:
            findings.append(
                Finding(
                    name,
                    "problem",
                    f"{warning.summary} (a copied database, or a changed address).",
                    f"save the settings screen ({settings_screen}): it sends this shop's callback URL, "
                    f"{warning.detail}, to the gateway ({_DOCS_FIREWALL})",
                )
            )
    if findings:
        return findings
    public = config.public_url
    if public is None:
        return [
            Finding(name, "unknown", "GATEWAY_PUBLIC_URL is not set: nothing to compare (see configuration)")
        ]
    kind = local_host_kind(public)
    if kind:
        return [
            Finding(
                name,
                "ok",
                f"{public} is on {kind}, which GATEWAY_WAF='allow-local' accepts (an emulator started with "
                "EMULATOR_WAF=allow-local)",
            )
        ]
    installed = state.installation()
    callback = f"; the installed callback URL is this shop's ({installed.callback_url})" if installed else ""
    return [Finding(name, "ok", f"{public} has a host name the gateway's firewall accepts{callback}")]


# --- CSRF: does the callback get through the app's own hooks? ----------------------------------------


def check_csrf(_options: Options) -> list[Finding]:
    """Run the app's ``before_request`` hooks for an unsigned POST to the callback without a CSRF token,
    as Flask would before the view: they must let it through (the view itself is not called)."""
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    name = "csrf"
    findings: list[Finding] = []
    csrf = app.extensions.get("csrf")
    enabled = app.config.get("WTF_CSRF_ENABLED", True)
    if not enabled:
        findings.append(
            Finding(
                name,
                "problem" if _live(get_state()) else "warn",
                "WTF_CSRF_ENABLED is False: the admin screens' forms (install, settings, refund, cancel) "
                "are not protected against cross-site requests.",
                "remove WTF_CSRF_ENABLED=False outside tests (docs/security.md)",
            )
        )
    protect_hooks = [f for f in app.before_request_funcs.get(None, []) if f.__name__ == "csrf_protect"]
    with app.test_request_context():
        path = url_for("gateway.callback")
    with app.test_request_context(
        path,
        method="POST",
        data=b"{}",
        headers={"Content-Type": "application/json", "User-Agent": USER_AGENT},
    ):
        try:
            answer = app.preprocess_request()
        except CSRFError as error:
            findings.append(_csrf_refuses(path, str(error.description), app.config, len(protect_hooks)))
            return findings
        except HTTPException as error:
            findings.append(
                Finding(
                    name,
                    "problem",
                    f"the app's before_request hooks answer a POST to {path} with {error.code} "
                    f"({error.description}) before the extension sees it: every callback is refused.",
                    f"let {path} through (its signature is its authentication): skip it in the hook "
                    f"that refuses it ({_DOCS_MISSED})",
                )
            )
            return findings
    if answer is not None:
        response = app.make_response(answer)
        where = response.headers.get("Location")
        to = f" to {where}" if where else ""
        findings.append(
            Finding(
                name,
                "problem",
                f"the app's before_request hooks answer a POST to {path} with {response.status_code}{to} "
                "before the extension sees it (a login wall?): every callback is refused.",
                f"let {path} through your login wall or filter (its signature is its authentication; "
                f"{_DOCS_MISSED})",
            )
        )
        return findings
    how = (
        "CSRFProtect is used and exempts the gateway's callback"
        if csrf is not None
        else "CSRFProtect is not used (the admin screens check their own CSRF tokens)"
    )
    findings.append(
        Finding(name, "ok", f"{how}: an unsigned POST to {path} without a token reaches the extension")
    )
    return findings


def _csrf_refuses(path: str, reason: str, config: Any, hooks: int) -> Finding:
    message = (
        f"CSRFProtect refuses the gateway's callbacks: a POST to {path} is answered 400 ({reason!r}). "
        "Every callback fails; the gateway gives up after 3 attempts."
    )
    if hooks > 1:
        fix = (
            f"CSRFProtect is initialised {hooks} times on this app, and the gateway can exempt its callback "
            "only from the last one: initialise it once, before the gateway"
        )
    elif not config.get("WTF_CSRF_CHECK_DEFAULT", True):
        fix = (
            "WTF_CSRF_CHECK_DEFAULT is False and a hook of yours calls csrf.protect() for every request: "
            "call csrf.protect(apply_exemptions=True) (Flask-WTF 1.3+), or skip requests whose "
            "request.blueprint == 'gateway'"
        )
    else:
        fix = "initialise CSRFProtect before the gateway (csrf.init_app(app), then gateway.init_app(app))"
    return Finding("csrf", "problem", message, f"{fix} ({_DOCS_CSRF})")


# --- the database -------------------------------------------------------------------------------------


def check_database(_options: Options) -> list[Finding]:
    name = "database"
    state = get_state()
    tables = GatewayBase.metadata.sorted_tables
    try:
        missing = missing_schema(state.db.engine)
    except SQLAlchemyError as error:
        return [
            Finding(
                name,
                "problem",
                f"the database cannot be read: {type(error).__name__}: {_first_line(error)}",
                "check SQLALCHEMY_DATABASE_URI, and that the database server runs and lets this user in",
            )
        ]
    missing_tables = [name for name in missing if "." not in name]
    missing_columns = [name for name in missing if "." in name]
    if missing:
        what = []
        if missing_tables:
            what.append(f"table(s) {', '.join(missing_tables)}")
        if missing_columns:
            what.append(f"column(s) {', '.join(missing_columns)}")
        return [
            Finding(
                name,
                "problem",
                f"the database lacks the gateway's {' and '.join(what)}: the requests that use them fail "
                "('no such table', 'no such column').",
                "run your migrations (flask db migrate, read the script, flask db upgrade: "
                "docs/migrations.md#upgrading-flask-gateway); without Flask-Migrate, flask gateway init-db "
                "creates missing tables (not missing columns)",
            )
        ]
    return [Finding(name, "ok", f"all {len(tables)} gateway tables and their columns exist")]


# --- the installation and its secrets -------------------------------------------------------------------


def check_installation(_options: Options) -> list[Finding]:
    name = "installation"
    state = get_state()
    install_screen = _admin(state, "install")
    installation = state.installation()
    if installation is None:
        others = sorted(
            set(state.session.scalars(select(Installation.environment))) - {state.config.environment}
        )
        elsewhere = (
            f" (installed for {', '.join(repr(e) for e in others)} only: installations are kept per "
            "environment)"
            if others
            else ""
        )
        return [
            Finding(
                name,
                "problem",
                f"the gateway is not installed for {_environment_label(state)}{elsewhere}: the payment "
                "option is never offered and callbacks are refused.",
                f"an administrator opens {install_screen} and enters the merchant account id and API key "
                "(docs/extension.md#installing-the-gateway)",
            )
        ]
    unreadable = []
    for label, token in (
        ("API key", installation.api_key_encrypted),
        ("signing key", installation.signing_key_encrypted),
    ):
        try:
            state.box.decrypt(token)
        except SecretUnreadable:
            unreadable.append(label)
    if unreadable:
        return [
            Finding(
                name,
                "problem",
                f"the stored {' and '.join(unreadable)} cannot be decrypted: SECRET_KEY or "
                "GATEWAY_ENCRYPTION_KEY changed since they were stored. Every call to the gateway fails, "
                "and so does every callback.",
                "put the old key back (or list it after the new one in GATEWAY_ENCRYPTION_KEY), or enter "
                f"the API key and signing key again on {install_screen} ('Installed this merchant account "
                f"before?'): {_DOCS_UNREADABLE}",
            )
        ]
    findings = [
        Finding(
            name,
            "ok",
            f"installed: merchant account {installation.merchant_account_id}, callback URL "
            f"{installation.callback_url}, limits {state.money(installation.minimum_cents)} to "
            f"{state.money(installation.maximum_cents)}; the stored API key and signing key decrypt",
        )
    ]
    keys = [k.strip() for k in (state.config.encryption_key or "").split(",") if k.strip()]
    if len(keys) > 1:
        current = SecretBox(keys[0], None)
        old = []
        for label, token in (
            ("API key", installation.api_key_encrypted),
            ("signing key", installation.signing_key_encrypted),
        ):
            try:
                current.decrypt(token)
            except SecretUnreadable:
                old.append(label)
        if old:
            findings.append(
                Finding(
                    name,
                    "warn",
                    f"the stored {' and '.join(old)} are still encrypted with an older key of "
                    "GATEWAY_ENCRYPTION_KEY: dropping it would make them unreadable.",
                    f"enter them again on {install_screen} ('Installed this merchant account before?') "
                    f"before dropping the old key ({_DOCS_UNREADABLE})",
                )
            )
    return findings


# --- the gateway's settings (network) -----------------------------------------------------------------


def check_gateway_settings(_options: Options) -> list[Finding]:
    name = "settings"
    state = get_state()
    try:
        report = check_settings()
    except NotInstalledError:
        return [Finding(name, "unknown", "not installed: nothing to compare (see installation)")]
    except SecretUnreadable:
        return [Finding(name, "unknown", "the stored secrets cannot be decrypted (see installation)")]
    except AuthenticationError as error:
        return [
            Finding(
                name,
                "problem",
                f"the gateway refused the shop's signed request with 401 ({error.message}): it holds another "
                "signing key for this account, or this is another environment than the one installed.",
                f"check GATEWAY_ENVIRONMENT and the gateway URLs, then enter the current signing key on "
                f"{_admin(state, 'install')} ({_DOCS_401})",
            )
        ]
    except GatewayError as error:
        return [
            Finding(
                name,
                "problem",
                f"the gateway at {state.config.base_url} could not be asked for its settings: "
                f"{_first_line(error)}. Checkouts, polling and refunds fail the same way.",
                "check GATEWAY_ENVIRONMENT and the three gateway URLs (GATEWAY_BASE_URL, "
                "GATEWAY_INSTALL_URL, GATEWAY_V1_BASE_URL), and that this machine reaches them",
            )
        ]
    except ValueError as error:
        return [Finding(name, "problem", f"the gateway's settings cannot be read: {error}", _DOCS_DRIFT)]
    if report.ok:
        return [
            Finding(name, "ok", "the gateway's callback URL, e-mail, limits and signing key are the shop's")
        ]
    differences = "; ".join(
        f"{d.setting}: the shop has {d.shop}, the gateway {d.gateway}" for d in report.differences
    )
    return [
        Finding(
            name,
            "problem",
            f"the gateway's settings differ from the shop's: {differences}.",
            f"if nobody here changed them, someone else signed a settings update: save the settings "
            f"screen ({_admin(state, 'settings')}) to put the shop's back, ask the gateway's account "
            f"manager about the account, and look at the callback log ({_DOCS_DRIFT})",
        )
    ]


# --- the callback at its public URL (network) ---------------------------------------------------------


def check_callback_reachable(options: Options) -> list[Finding]:
    """POST an unsigned, empty JSON object to ``GATEWAY_PUBLIC_URL`` + the callback route, as the gateway
    would reach it: the extension's own 401 ``{"message": ...}`` proves the path leads to it."""
    name = "callback"
    state = get_state()
    config = state.config
    if config.public_url is None:
        return [
            Finding(
                name, "unknown", "GATEWAY_PUBLIC_URL is not set: the callback's public address is unknown"
            )
        ]
    url = callback_url()
    local_dev = config.environment in ("emulator", "embedded") and local_host_kind(url) is not None
    http = options.http or requests.Session()
    body = b"{}"
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    mark = doctor_probe_mark(body)  # the shop records it as the doctor's probe, not a refused callback
    if mark is not None:
        headers[PROBE_HEADER] = mark
    try:
        answer = http.post(
            url,
            data=body,
            headers=headers,
            timeout=options.timeout,
            allow_redirects=False,
        )
    except requests.exceptions.SSLError as error:
        return [
            Finding(
                name,
                "problem",
                f"POST {url}: the TLS certificate is not valid for this host ({_first_line(error)}); the "
                "gateway refuses it too.",
                "install a certificate for the host of GATEWAY_PUBLIC_URL (with its intermediate chain)",
            )
        ]
    except requests.exceptions.RequestException as error:
        kind = "timed out" if isinstance(error, requests.exceptions.Timeout) else "could not connect"
        return [
            Finding(
                name,
                "warn" if local_dev else "problem",
                f"POST {url} {kind} ({type(error).__name__}): the gateway cannot deliver callbacks there.",
                "is the shop running?"
                if local_dev
                else "check that GATEWAY_PUBLIC_URL is the shop's public address, that its DNS name "
                "resolves, and that the firewall and proxy in front of the shop let HTTPS in "
                f"(--timeout {options.timeout:g}; {_DOCS_MISSED})",
            )
        ]
    finally:
        if options.http is None:
            http.close()
    return [_judge_answer(state, url, answer)]


def _message_of(answer: requests.Response) -> str | None:
    if "json" not in answer.headers.get("Content-Type", ""):
        return None
    try:
        body = answer.json()
    except ValueError:
        return None
    message = body.get("message") if isinstance(body, dict) else None
    return message if isinstance(message, str) else None


def _excerpt(answer: requests.Response) -> str:
    kind = answer.headers.get("Content-Type", "no Content-Type").split(";")[0]
    body = answer.text
    if "html" in kind:
        body = re.sub(r"<[^>]*>", " ", re.sub(r"(?is)<(script|style)\b.*?</\1>", " ", body))
    text = " ".join(body.split())[:80]
    return f"{kind}: {text!r}" if text else kind


def _judge_answer(state: GatewayState, url: str, answer: requests.Response) -> Finding:
    name = "callback"
    status = answer.status_code
    message = _message_of(answer)
    said = f"POST {url} answered {status}"
    if status == CallbackUnauthorized.code and message == CallbackUnauthorized.description:
        return Finding(
            name,
            "ok",
            f"{said}, the extension's own refusal of an unsigned request: the gateway's callbacks reach it",
        )
    if status == CallbackRateLimited.code and message == CallbackRateLimited.description:
        return Finding(
            name,
            "warn",
            f"{said}, the extension's own 'too many refused callbacks' answer: the callbacks reach it, but "
            "this address used up its refusals.",
            "behind a proxy, wrap the app in werkzeug's ProxyFix, or every caller (the gateway too) shares "
            "the proxy's allowance (GATEWAY_CALLBACK_RATE_LIMIT; docs/operations.md#rate-limits)",
        )
    excerpt = _excerpt(answer)
    if status == 400 and "csrf" in answer.text.lower():
        return Finding(
            name,
            "problem",
            f"{said} ({excerpt}): CSRF protection refuses the gateway's callbacks.",
            f"initialise CSRFProtect before the gateway, once ({_DOCS_CSRF})",
        )
    if status in (301, 302, 303, 307, 308):
        where = answer.headers.get("Location", "?")
        return Finding(
            name,
            "problem",
            f"{said}, a redirect to {where}: the gateway does not follow it with its callback.",
            "set GATEWAY_PUBLIC_URL to the final address (https, the host name shoppers use) and save the "
            f"settings screen ({_admin(state, 'settings')}); if it is a login page, let the callback "
            f"through ({_DOCS_MISSED})",
        )
    if status == 404:
        fix = (
            "check that GATEWAY_PUBLIC_URL is this shop's address and that the proxy in front of it forwards "
            f"{state.config.url_prefix}/ (GATEWAY_URL_PREFIX) to the app"
        )
    elif status in (502, 503, 504):
        fix = "the proxy in front of the shop got no answer from the app: check that the app server runs"
    elif status in (401, 403):
        fix = (
            "a login wall, basic auth or bot filter in front of the shop refuses it: let the callback path "
            f"through (its signature is its authentication; {_DOCS_MISSED})"
        )
    elif status >= 500:
        fix = (
            "the shop failed on the request: read its log (a SecretUnreadable, for example: see installation)"
        )
    else:
        fix = (
            f"something other than the extension answers at {url}: check the proxy's routes ({_DOCS_MISSED})"
        )
    return Finding(
        name,
        "problem",
        f"{said} ({excerpt}), not the extension's refusal of an unsigned request: the gateway's callbacks "
        "do not reach it.",
        fix,
    )


# --- the schedules ------------------------------------------------------------------------------------


def _when(value: datetime | None) -> str:
    return value.isoformat(timespec="minutes") if value is not None else "never"


def check_reconcile_schedule(_options: Options) -> list[Finding]:
    """Checkouts due for reconciliation (as ``flask gateway reconcile`` counts them) an hour ago and still
    not polled: nothing runs it."""
    name = "reconcile"
    state = get_state()
    session = state.session
    installation = state.installation()
    if installation is None:
        return [Finding(name, "unknown", "not installed: nothing to reconcile (see installation)")]
    now = utcnow()
    older_than = timedelta(seconds=state.config.reconcile_after_seconds)
    # reconciliation's own definition of "due" (its private ``_due``, reused so that the two never
    # disagree), an hour back: due for more than an hour and still not polled.
    overdue = _due(
        installation.merchant_account_id,
        now - older_than - RECONCILE_MARGIN,
        now - max(older_than, timedelta(seconds=CLAIM_LEASE_SECONDS)) - RECONCILE_MARGIN,
    )
    count, oldest = session.execute(
        select(func.count(), func.min(GatewayCheckout.updated_at)).where(overdue)
    ).one()
    last_poll = session.scalar(select(func.max(GatewayCheckout.last_polled_at)))
    if count:
        return [
            Finding(
                name,
                "problem",
                f"{count} open checkout(s) have been due for reconciliation (unchanged and unpolled for "
                f"GATEWAY_RECONCILE_AFTER_SECONDS={state.config.reconcile_after_seconds}) for over "
                f"{_duration(RECONCILE_MARGIN)}, the oldest unchanged since {_when(oldest)}; the last "
                f"poll of any checkout: {_when(last_poll)}. Nothing runs flask gateway reconcile, so "
                "payments whose callback was lost stay unpaid in the shop.",
                "run flask gateway reconcile now, and schedule it every 5 minutes (cron: */5 * * * * cd "
                "/srv/shop && flask --app shop gateway reconcile --quiet; "
                "docs/operations.md#scheduling-reconciliation)",
            )
        ]
    return [
        Finding(
            name,
            "ok",
            f"no checkout has waited for reconciliation longer than {_duration(RECONCILE_MARGIN)} "
            f"(last poll: {_when(last_poll)})",
        )
    ]


def _duration(delta: timedelta) -> str:
    minutes = int(delta.total_seconds() // 60)
    if minutes % 60:
        return f"{minutes} minutes"
    return "an hour" if minutes == 60 else f"{minutes // 60} hours"


def check_outbox_schedule(_options: Options) -> list[Finding]:
    """Pending outbox events long past their attempt time (nothing runs ``flask gateway deliver``), and
    dead ones; ``unknown`` in a version without the outbox."""
    name = "outbox"
    state = get_state()
    event = getattr(models, "OutboxEvent", None)
    if event is None:
        return [Finding(name, "unknown", "this version of Flask-Gateway has no outbox: nothing to check")]
    session = state.session
    now = utcnow()
    try:
        pending, oldest = session.execute(
            select(func.count(), func.min(event.next_attempt_at)).where(
                event.state == "pending", event.next_attempt_at < now - OUTBOX_MARGIN
            )
        ).one()
        dead = session.scalar(select(func.count()).select_from(event).where(event.state == "dead")) or 0
    except SQLAlchemyError as error:
        return [Finding(name, "unknown", f"the outbox cannot be read ({type(error).__name__}; see database)")]
    outbox_screen = _admin(state, "outbox")
    findings = []
    if pending:
        findings.append(
            Finding(
                name,
                "problem",
                f"{pending} outbox event(s) are overdue by more than {_duration(OUTBOX_MARGIN)} (the oldest "
                f"due since {_when(oldest)}): nothing runs flask gateway deliver, so the shop's receivers "
                "(payment_confirmed: fulfilment) wait.",
                "run flask gateway deliver now, and schedule it every minute (docs/operations.md)",
            )
        )
    if dead:
        findings.append(
            Finding(
                name,
                "problem",
                f"{dead} outbox event(s) are dead: every delivery to the shop's receivers failed, so their "
                "work (a fulfilment, say) was never done.",
                f"read their last error on {outbox_screen}, fix the receiver, then deliver them again there",
            )
        )
    return findings or [
        Finding(name, "ok", f"no outbox event overdue by more than {_duration(OUTBOX_MARGIN)}, none dead")
    ]


# --- the background work's heartbeats ------------------------------------------------------------------

_DOCS_BACKGROUND: Final = "docs/operations.md#is-the-background-work-running"
#: How to get each job running again.
_JOB_FIX: Final = {
    "deliver": "schedule flask gateway deliver every minute (cron, with the same environment as the web "
    "workers) or run flask gateway deliver --every 5 as a service; with Celery, start the worker and beat "
    "(the task flask_gateway.deliver_outbox) and check their broker",
    "reconcile": "schedule flask gateway reconcile every 5 minutes (cron, with the same environment as the "
    "web workers); with Celery, start the worker and beat (the task flask_gateway.reconcile) and check "
    "their broker",
}
#: The longest wait for the broker (whatever ``--timeout`` says).
BROKER_TIMEOUT: Final = 5.0


def check_background_work(_options: Options) -> list[Finding]:
    """Each job's heartbeat (:mod:`flask_gateway.heartbeats`): how long ago it ran, what it said, whether
    that is past its bound."""
    name = "background-work"
    try:
        statuses = job_status()
    except SQLAlchemyError as error:
        return [
            Finding(
                name,
                "unknown",
                f"the heartbeats cannot be read ({type(error).__name__}): see the database finding",
                f"run the migrations or flask gateway init-db ({_DOCS_BACKGROUND})",
            )
        ]
    return [_background_finding(name, status) for status in statuses]


def _background_finding(name: str, status: JobStatus) -> Finding:
    schedule = f"{_JOB_FIX[status.job]} ({_DOCS_BACKGROUND})"
    read_it = f"read the summary and the log of the run, and fix its cause ({_DOCS_BACKGROUND})"
    runs_but_fails = status.age is not None and status.age <= status.bound and status.last_outcome != "ok"
    if status.overdue:
        return Finding(
            name,
            "problem",
            f"{status.describe()}: "
            + (
                "it runs but has not succeeded lately"
                if runs_but_fails
                else "nothing runs it (or its runs cannot record themselves)"
            ),
            read_it if runs_but_fails else schedule,
        )
    if status.last_finished_at is None:  # not overdue yet: too soon to tell whether anything runs it
        why = "the gateway is not installed" if status.installed_at is None else "too soon to tell"
        return Finding(name, "unknown", f"{status.describe()} ({why})", schedule)
    if status.last_outcome != "ok":
        return Finding(name, "warn", status.describe(), read_it)
    return Finding(name, "ok", status.describe())


def check_broker(options: Options) -> list[Finding]:
    """The Celery broker (``app.config["CELERY"]["broker_url"]``) answers; nothing to check without one."""
    name = "broker"
    url = (current_app.config.get("CELERY") or {}).get("broker_url")
    if not url:
        return [Finding(name, "ok", "no Celery broker configured (CELERY broker_url): nothing to check")]
    shown = mask_url(str(url))
    why = broker_unreachable(str(url), timeout=min(options.timeout, BROKER_TIMEOUT))
    if why is None:
        return [Finding(name, "ok", f"the Celery broker at {shown} answers")]
    return [
        Finding(
            name,
            "problem",
            f"the Celery broker at {shown} does not answer ({why}): beat sends no task and the worker "
            "runs none, so nothing delivers the outbox or reconciles",
            f"start the broker (e.g. systemctl start redis-server) or fix CELERY broker_url; the worker and "
            f"beat reconnect by themselves once it answers ({_DOCS_BACKGROUND})",
        )
    ]


# --- the health probes -----------------------------------------------------------------------------------


def probe_urls(state: GatewayState) -> tuple[str, str]:
    """The liveness and readiness probe URLs: absolute under ``GATEWAY_PUBLIC_URL``, else their paths."""
    if state.config.public_url:
        return external_url("gateway.livez"), external_url("gateway.readyz")
    return f"{state.config.url_prefix}/livez", f"{state.config.url_prefix}/readyz"


def check_readiness(_options: Options) -> list[Finding]:
    """What ``GET /gateway/readyz`` would answer now (asked afresh, not counted as an outage)."""
    name = "readiness"
    state = get_state()
    live, ready = probe_urls(state)
    probes = f"probe liveness at {live} and readiness at {ready} ({_DOCS_PROBES})"
    app = current_app._get_current_object()  # type: ignore[attr-defined]
    answer = readiness(app, state, record=False, cache=False)
    if answer.ready:
        return [Finding(name, "ok", f"{ready} answers 200 (database, schema, installation); {probes}")]
    return [
        Finding(
            name,
            "problem",
            f"{ready} answers 503 ({answer.summary()}): a load balancer or Kubernetes that probes it "
            f"sends this shop no traffic; {probes}",
            "the database and installation findings above say what to fix; the probe answers 200 as "
            "soon as they are fixed",
        )
    ]


# --- the installed distribution ---------------------------------------------------------------------------

_DOCS_TWO: Final = "docs/packaging.md#two-distributions-one-flask_gateway"


def _normalised(name: str) -> str:
    """A distribution's name as the index compares names (PEP 503): ``Flask_Gateway`` is ``flask-gateway``."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _providers(package: str = "flask_gateway") -> dict[str, importlib.metadata.Distribution]:
    """The installed distributions that put ``package`` on ``sys.path``, by normalised name (their
    ``top_level.txt``, or the files of their ``RECORD``)."""
    found = {}
    for name in importlib.metadata.packages_distributions().get(package, []):
        with suppress(importlib.metadata.PackageNotFoundError):
            distribution = importlib.metadata.distribution(name)
            found[_normalised(distribution.name)] = distribution
    return found


def check_package(_options: Options) -> list[Finding]:
    """No other installed distribution provides ``flask_gateway`` (the index's ``flask-gateway`` is an
    unrelated project whose wheel does), and the installed metadata is the version that runs."""
    name = "package"
    providers = _providers()
    findings = []
    for other, distribution in sorted(providers.items()):
        if other == DISTRIBUTION:
            continue
        summary = next(iter(distribution.metadata.get_all("Summary") or []), "no summary")
        findings.append(
            Finding(
                name,
                "problem",
                f"{distribution.name} {distribution.version} ({summary!r}) is installed too and puts its own "
                f"flask_gateway package in the same place as {DISTRIBUTION}: the files of one overwrite the "
                "other's, and uninstalling either deletes files the other needs",
                f"pip uninstall {other} {DISTRIBUTION}, then pip install {DISTRIBUTION} ({_DOCS_TWO})",
            )
        )
    ours = providers.get(DISTRIBUTION)
    if ours is None:
        findings.append(
            Finding(
                name,
                "unknown",
                f"flask_gateway {__version__} runs, but no installed {DISTRIBUTION} provides it (a copy on "
                "sys.path?): which release this is cannot be told",
                f"pip install {DISTRIBUTION} ({_DOCS_TWO})",
            )
        )
    elif ours.version != __version__:
        findings.append(
            Finding(
                name,
                "problem",
                f"the installed {DISTRIBUTION} says {ours.version}, but the flask_gateway that runs is "
                f"{__version__}: the files of two installs are mixed",
                f"pip install --force-reinstall {DISTRIBUTION}=={ours.version} ({_DOCS_TWO})",
            )
        )
    elif not findings:
        findings.append(
            Finding(
                name, "ok", f"{DISTRIBUTION} {__version__}, the only installed distribution of flask_gateway"
            )
        )
    return findings


#: Every check, in the order the command prints them.
CHECKS: Final[tuple[Check, ...]] = (
    Check("configuration", check_configuration),
    Check("public-url", check_public_url),
    Check("csrf", check_csrf, reads=False),
    Check("database", check_database),
    Check("installation", check_installation),
    Check("settings", check_gateway_settings, network=True, reads=False),
    Check("callback", check_callback_reachable, network=True, reads=False),
    Check("reconcile", check_reconcile_schedule),
    Check("outbox", check_outbox_schedule),
    Check("background-work", check_background_work),
    Check("broker", check_broker, reads=False),
    Check("readiness", check_readiness),
    Check("package", check_package, reads=False),
)
