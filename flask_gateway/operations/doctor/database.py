"""The checks of what the database holds: ``database`` (every gateway table and column), ``installation``
(installed for this environment, each merchant account's stored keys decrypt, the retired ones with what
is left open on them) and ``readiness`` (what ``GET /gateway/readyz``
would answer, and the probe URLs).
"""

from __future__ import annotations

from flask import current_app
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from flask_gateway.clock import local_time
from flask_gateway.errors import (
    SecretUnreadable,
)
from flask_gateway.models import GatewayBase, Installation
from flask_gateway.operations.doctor.report import Finding, Level, Options
from flask_gateway.operations.doctor.wording import (
    _DOCS_PROBES,
    _DOCS_ROTATION,
    _DOCS_UNREADABLE,
    _admin,
    _environment_label,
    _first_line,
)
from flask_gateway.operations.readiness import missing_schema, readiness
from flask_gateway.operations.rotation import COMMAND as ROTATION_COMMAND
from flask_gateway.operations.rotation import survey_stored_secrets
from flask_gateway.payments.accounts import open_checkouts
from flask_gateway.state import GatewayState, get_state
from flask_gateway.urls import external_url

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
    if missing_tables and len(missing_tables) == len(tables):
        return [
            Finding(
                name,
                "problem",
                f"the database has none of the gateway's {len(tables)} tables: neither flask gateway init-db "
                "nor the migrations have run on it, so every payment request fails ('no such table') and "
                "readiness answers 503.",
                "run flask gateway init-db, or your migrations: flask db upgrade (after flask db migrate "
                "wrote their script: docs/migrations.md#setting-it-up); one or the other, not both "
                "(docs/extension.md#database-tables-and-flask-migrate)",
            )
        ]
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
                "('no such table', 'no such column') and readiness answers 503.",
                "run your migrations (flask db migrate, read the script, flask db upgrade: "
                "docs/migrations.md#upgrading-flask-gateway); without Flask-Migrate, flask gateway init-db "
                "creates missing tables (not missing columns)",
            )
        ]
    return [Finding(name, "ok", f"all {len(tables)} gateway tables and their columns exist")]


# --- the installation and its secrets -------------------------------------------------------------------


def check_installation(_options: Options) -> list[Finding]:
    """Installed for this environment, each account's stored keys decrypt; with several merchant accounts,
    one finding per account (named), a retired one with the checkouts still open on it, and a problem when
    every account is retired (no new checkout can be made)."""
    name = "installation"
    state = get_state()
    install_screen = _admin(state, "install")
    rows = state.installations()
    if not rows:
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
            ),
            *_older_key_findings(state),
        ]
    several = len(rows) > 1
    default = state.installation()
    findings: list[Finding] = []
    for installation in rows:
        findings += _account_findings(
            state, installation, named=several, default=default is not None and default.id == installation.id
        )
    if default is None:
        retired = ", ".join(row.merchant_account_id for row in rows)
        findings.append(
            Finding(
                name,
                "problem",
                f"every merchant account installed here is retired ({retired}): no new checkout can be "
                "made; the open ones' callbacks, refunds and reconciliation go on.",
                f"reopen an account (flask gateway accounts; the status screen) or install another on "
                f"{install_screen}",
            )
        )
    return findings + _older_key_findings(state)


def _older_key_findings(state: GatewayState) -> list[Finding]:
    """With older keys configured (``SECRET_KEY_FALLBACKS``, or ``GATEWAY_ENCRYPTION_KEY``'s later keys):
    how many stored secrets, of every environment's installations, still need one (``warn``: the command
    that re-encrypts them), or none (``ok``: the key can go, for the stored secrets). Those no key decrypts
    are the per-account findings' problem; here they are only counted."""
    box = state.box
    if not box.older_keys:
        return []
    source = box.older_keys_in
    survey = survey_stored_secrets(state)
    unreadable = (
        f" ({len(survey.unreadable)} cannot be decrypted with any key: {ROTATION_COMMAND} refuses until "
        "they are entered again or their key is back)"
        if survey.unreadable
        else ""
    )
    count = len(survey.older)
    if count:
        noun = "stored secret still needs" if count == 1 else "stored secrets still need"
        return [
            Finding(
                "installation",
                "warn",
                f"{count} {noun} an older key: run {ROTATION_COMMAND}, then drop it from "
                f"{source}{unreadable}.",
                f"{ROTATION_COMMAND} re-encrypts them under the current key; drop the older key only after "
                f"it, then restart every process ({_DOCS_ROTATION})",
            )
        ]
    level: Level = "warn" if survey.unreadable else "ok"
    return [
        Finding(
            "installation",
            level,
            f"no stored secret needs an older key of {source} any more{unreadable}",
            f"{_DOCS_ROTATION}" if survey.unreadable else "",
        )
    ]


def _account_findings(
    state: GatewayState, installation: Installation, *, named: bool, default: bool
) -> list[Finding]:
    """One account's findings; ``named``: the shop has several, each finding names its account."""
    name = "installation"
    install_screen = _admin(state, "install")
    account = installation.merchant_account_id
    whose = f"merchant account {account}: " if named else ""
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
                f"{whose}the stored {' and '.join(unreadable)} cannot be decrypted: SECRET_KEY or "
                "GATEWAY_ENCRYPTION_KEY changed since they were stored. Every call to the gateway fails, "
                "and so does every callback.",
                "put the old key back (SECRET_KEY's in SECRET_KEY_FALLBACKS, or list it after the new one in "
                "GATEWAY_ENCRYPTION_KEY), or enter "
                f"the API key and signing key again on {install_screen} ('Installed this merchant account "
                f"before?'): {_DOCS_UNREADABLE}",
            )
        ]
    if installation.retired:
        left = open_checkouts(account)
        since = (
            local_time(installation.retired_at, get_state().config.zone).date().isoformat()
            if installation.retired_at
            else "?"
        )
        findings = [
            Finding(
                name,
                "ok",
                f"merchant account {account} is retired (closed for new checkouts since {since}): "
                f"{left} open checkout(s) left on it, whose callbacks, refunds and reconciliation go on "
                "with its keys; the stored API key and signing key decrypt",
            )
        ]
    else:
        role = " (the default for new checkouts)" if named and default else ""
        findings = [
            Finding(
                name,
                "ok",
                f"installed: merchant account {account}{role}, callback URL "
                f"{installation.callback_url}, limits {state.money(installation.minimum_cents)} to "
                f"{state.money(installation.maximum_cents)}; the stored API key and signing key decrypt",
            )
        ]
    return findings


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
