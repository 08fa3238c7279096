"""The checks of what the database holds: ``database`` (every gateway table and column), ``installation``
(installed for this environment, the stored keys decrypt) and ``readiness`` (what ``GET /gateway/readyz``
would answer, and the probe URLs).
"""

from __future__ import annotations

from flask import current_app
from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError

from flask_gateway.errors import (
    SecretUnreadable,
)
from flask_gateway.models import GatewayBase, Installation
from flask_gateway.operations.doctor.report import Finding, Options
from flask_gateway.operations.doctor.wording import (
    _DOCS_PROBES,
    _DOCS_UNREADABLE,
    _admin,
    _environment_label,
    _first_line,
)
from flask_gateway.operations.readiness import missing_schema, readiness
from flask_gateway.secrets import SecretBox
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
