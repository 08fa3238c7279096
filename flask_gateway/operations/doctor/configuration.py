"""The checks of the app's configuration, read where the app runs (no network): ``configuration`` (the
environment, ``GATEWAY_PUBLIC_URL``, ``SECRET_KEY``, the encryption key, the API version), ``public-url``
(against the gateway's firewall) and ``csrf`` (an unsigned callback gets through the app's own hooks).
"""

from __future__ import annotations

import re
from typing import Any, Final

from flask import current_app, url_for
from flask_wtf.csrf import CSRFError
from werkzeug.exceptions import HTTPException

from flask_gateway.core.hosts import local_host_kind
from flask_gateway.operations.checks import SetupWarning, setup_warnings
from flask_gateway.operations.doctor.report import Finding, Options
from flask_gateway.operations.doctor.wording import (
    _DOCS_CSRF,
    _DOCS_FIREWALL,
    _DOCS_MISSED,
    _DOCS_ROTATION,
    _DOCS_SECRET,
    USER_AGENT,
    _admin,
    _environment_label,
    _live,
)
from flask_gateway.secrets import secret_key_fallbacks
from flask_gateway.state import GatewayState, get_state

#: ``SECRET_KEY`` values copied from examples and tutorials (compared lower-cased, without the edges).
_PLACEHOLDER: Final = re.compile(
    r"change[\s_.:-]*(me|it|this)|replace[\s_.:-]*(me|this)|your[\s_.-]*secret|not[\s_.-]*(a[\s_.-]*)?secret"
    r"|insecure|^(dev|development|test|testing|secret|default|key|password|flask|demo|example)"
    r"([\s_.-]*(secret|key|secret[\s_.-]*key))?$",
)
#: Shorter than this, a ``SECRET_KEY`` is guessable whatever it says.
_MIN_SECRET_LENGTH: Final = 16
#: The fix of a check that needs the shop's public address.
_SET_PUBLIC_URL: Final = (
    "set GATEWAY_PUBLIC_URL to the address the gateway and shoppers reach the shop at, e.g. "
    'GATEWAY_PUBLIC_URL = "https://shop.example" (a tunnel\'s address while developing against the sandbox; '
    "docs/configuration.md#keys); for local development with the emulator it may stay unset"
)


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
    fallbacks = secret_key_fallbacks(app_config)  # init_app checked it: a list of keys
    if fallbacks:
        stored = "" if config.encryption_key else ", and decrypt the stored secrets encrypted under them"
        findings.append(
            Finding(
                name,
                "ok",
                f"SECRET_KEY_FALLBACKS holds {len(fallbacks)} older key{'s' if len(fallbacks) != 1 else ''}: "
                f"the return links and v1 outcome URLs signed with them are still accepted{stored} (a "
                f"rotation: {_DOCS_ROTATION})",
            )
        )

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
        f"set SECRET_KEY to a long random value ({generate}), kept out of the repository, with the old "
        "value in SECRET_KEY_FALLBACKS until flask gateway rotate-secrets has run and the links signed "
        f"with it have expired ({_DOCS_ROTATION}; {_DOCS_SECRET})"
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
    """The same warnings as the admin screens (:func:`flask_gateway.operations.checks.setup_warnings`): each
    one a problem here, with its fix."""
    state = get_state()
    config = state.config
    name = "public-url"
    settings_screen = _admin(state, "settings")
    findings: list[Finding] = []
    rows = state.installations()
    for warning in _every_accounts_warnings([row.merchant_account_id for row in rows]):
        whose = f"merchant account {warning.account}: " if warning.account else ""
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
                    f"{whose}{warning.summary} Payments are only found by polling and reconciliation.",
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
                    f"{whose}{warning.summary} (a copied database, or a changed address).",
                    f"save the settings screen ({settings_screen}): it sends this shop's callback URL, "
                    f"{warning.detail}, to the gateway ({_DOCS_FIREWALL})",
                )
            )
    if findings:
        return findings
    public = config.public_url
    if public is None:
        return [
            Finding(
                name,
                "unknown",
                "GATEWAY_PUBLIC_URL is not set: nothing to compare with the gateway's firewall and the "
                "installed callback URL.",
                _SET_PUBLIC_URL,
            )
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
    if len(rows) > 1:
        callback = "; every account's installed callback URL is this shop's (" + ", ".join(
            f"{row.merchant_account_id}: {row.callback_url}" for row in rows
        )
        return [Finding(name, "ok", f"{public} has a host name the gateway's firewall accepts{callback})")]
    installed = state.installation()
    callback = f"; the installed callback URL is this shop's ({installed.callback_url})" if installed else ""
    return [Finding(name, "ok", f"{public} has a host name the gateway's firewall accepts{callback}")]


def _every_accounts_warnings(accounts: list[str]) -> list[SetupWarning]:
    """:func:`setup_warnings` as the admin screens show them; with several merchant accounts, about each
    account's callback URL (each warning names its account; the firewall's, the same for all, once)."""
    if len(accounts) <= 1:
        return setup_warnings()
    warnings: list[SetupWarning] = []
    for account in accounts:
        for warning in setup_warnings(account=account):
            if warning.kind == "firewall" and any(w.kind == "firewall" for w in warnings):
                continue
            warnings.append(warning)  # a callback URL's warning names its account
    return warnings


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
