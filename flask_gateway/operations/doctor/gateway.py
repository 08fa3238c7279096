"""The network checks, as the gateway sees the shop: ``settings`` (the gateway's settings are the shop's)
and ``callback`` (an unsigned POST to the callback's public URL reaches the extension, judged by its
answer), each for every merchant account installed (named in its findings when there are several).
Skipped with ``--no-network``.
"""

from __future__ import annotations

import re
import time
from dataclasses import replace

import requests

from flask_gateway.core.errors import AuthenticationError, GatewayError
from flask_gateway.core.hosts import local_host_kind
from flask_gateway.errors import (
    CallbackRateLimited,
    CallbackUnauthorized,
    NotInstalledError,
    SecretUnreadable,
)
from flask_gateway.inbound import PROBE_HEADER, doctor_probe_mark
from flask_gateway.operations.doctor.report import Finding, Level, Options
from flask_gateway.operations.doctor.wording import (
    _DOCS_401,
    _DOCS_CSRF,
    _DOCS_DRIFT,
    _DOCS_MISSED,
    _DOCS_UNREADABLE,
    USER_AGENT,
    _admin,
    _first_line,
)
from flask_gateway.operations.drift import check_settings
from flask_gateway.state import GatewayState, get_state
from flask_gateway.urls import callback_url, external_url

# --- the gateway's settings (network) -----------------------------------------------------------------


def check_gateway_settings(_options: Options) -> list[Finding]:
    """The gateway's settings against the shop's, for every merchant account installed (open and retired:
    a retired account's callbacks still come), each finding naming its account when there are several."""
    name = "settings"
    state = get_state()
    accounts = [row.merchant_account_id for row in state.installations()]
    state.session.commit()  # no transaction while the gateway answers
    if not accounts:
        return [Finding(name, "unknown", "not installed: nothing to compare", _install(state))]
    several = len(accounts) > 1
    findings: list[Finding] = []
    for account in accounts:
        findings += _settings_of(state, account, named=several)
        state.session.rollback()  # one account's failure leaves nothing for the next
    return findings


def _settings_of(state: GatewayState, account: str, *, named: bool) -> list[Finding]:
    name = "settings"
    whose = f"merchant account {account}: " if named else ""
    try:
        report = check_settings(account)
    except NotInstalledError:
        return [Finding(name, "unknown", f"{whose}not installed: nothing to compare", _install(state))]
    except SecretUnreadable:
        return [
            Finding(
                name,
                "unknown",
                f"{whose}the stored API key and signing key cannot be decrypted: nothing to compare.",
                f"put the old SECRET_KEY or GATEWAY_ENCRYPTION_KEY back, or enter the keys again on "
                f"{_admin(state, 'install')} (the installation finding; {_DOCS_UNREADABLE})",
            )
        ]
    except AuthenticationError as error:
        return [
            Finding(
                name,
                "problem",
                f"{whose}the gateway refused the shop's signed request with 401 ({error.message}): it holds "
                "another signing key for this account, or this is another environment than the one "
                "installed.",
                f"check GATEWAY_ENVIRONMENT and the gateway URLs, then enter the current signing key on "
                f"{_admin(state, 'install')} ({_DOCS_401})",
            )
        ]
    except GatewayError as error:
        return [
            Finding(
                name,
                "problem",
                f"{whose}the gateway at {state.config.base_url} could not be asked for its settings: "
                f"{_first_line(error)}. Checkouts, polling and refunds fail the same way.",
                "check GATEWAY_ENVIRONMENT and the three gateway URLs (GATEWAY_BASE_URL, "
                "GATEWAY_INSTALL_URL, GATEWAY_V1_BASE_URL), and that this machine reaches them",
            )
        ]
    except ValueError as error:
        return [
            Finding(name, "problem", f"{whose}the gateway's settings cannot be read: {error}", _DOCS_DRIFT)
        ]
    if report.ok:
        return [
            Finding(
                name,
                "ok",
                f"{whose}the gateway's callback URL, e-mail, limits and signing key are the shop's",
            )
        ]
    differences = "; ".join(
        f"{d.setting}: the shop has {d.shop}, the gateway {d.gateway}" for d in report.differences
    )
    return [
        Finding(
            name,
            "problem",
            f"{whose}the gateway's settings differ from the shop's: {differences}.",
            f"if nobody here changed them, someone else signed a settings update: save the settings "
            f"screen ({_admin(state, 'settings')}{'' if not named else f', account {account}'}) to put the "
            "shop's back, ask the gateway's account "
            f"manager about the account, and look at the callback log ({_DOCS_DRIFT})",
        )
    ]


def _install(state: GatewayState) -> str:
    return (
        f"an administrator opens {_admin(state, 'install')} and enters the merchant account id and API key "
        "(docs/extension.md#installing-the-gateway)"
    )


# --- the callback at its public URL (network) ---------------------------------------------------------


def check_callback_reachable(options: Options) -> list[Finding]:
    """POST an unsigned, empty JSON object to ``GATEWAY_PUBLIC_URL`` + the callback route, as the gateway
    would reach it: the extension's own 401 ``{"message": ...}`` proves the path leads to it. With several
    merchant accounts, each callback URL the accounts were given (the shared path, an account's own
    ``/callback/<account>``) is probed once, its findings naming the accounts that use it."""
    name = "callback"
    state = get_state()
    config = state.config
    if config.public_url is None:
        return [
            Finding(
                name,
                "unknown",
                "GATEWAY_PUBLIC_URL is not set: the callback's public address is unknown",
                "to have the callback probed, set GATEWAY_PUBLIC_URL to the shop's public address, e.g. "
                'GATEWAY_PUBLIC_URL = "https://shop.example" (docs/configuration.md#keys); for local '
                "development with the emulator it may stay unset",
            )
        ]
    # Plain values, read before the commit: an attribute of a row read after it would begin a transaction
    # again (on SQLite, the writer's lock), and the shop, recording the probe, would wait for it.
    given_urls = [(row.merchant_account_id, row.callback_url) for row in state.installations()]
    state.session.commit()  # no transaction while the shop answers
    if len(given_urls) <= 1:
        return _probe(options, state, callback_url())
    shared = callback_url()
    by_url: dict[str, list[str]] = {}
    findings: list[Finding] = []
    for account, callback in given_urls:
        own = external_url("gateway.callback", account=account)
        given = (callback or shared).rstrip("/")
        ours = {shared.rstrip("/"): shared, own.rstrip("/"): own}
        if given not in ours:
            findings.append(
                Finding(
                    name,
                    "unknown",
                    f"merchant account {account}: its callback URL {callback} is not this shop's, not probed",
                    f"save the settings screen ({_admin(state, 'settings')}, account {account}): it gives "
                    f"the gateway this shop's callback URL, {own} (the public-url finding; {_DOCS_MISSED})",
                )
            )
            continue
        by_url.setdefault(ours[given], []).append(account)
    for url, accounts in by_url.items():
        whose = f"merchant account{'s' if len(accounts) > 1 else ''} {', '.join(accounts)}: "
        findings += [replace(f, message=whose + f.message) for f in _probe(options, state, url)]
    return findings


def _probe(options: Options, state: GatewayState, url: str) -> list[Finding]:
    """One probe of the callback ``url`` and what its answer says."""
    name = "callback"
    config = state.config
    local_dev = config.environment in ("emulator", "embedded") and local_host_kind(url) is not None
    http = options.http or requests.Session()
    body = b"{}"
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT}
    mark = doctor_probe_mark(body)  # the shop records it as the doctor's probe, not a refused callback
    if mark is not None:
        headers[PROBE_HEADER] = mark
    sent = time.monotonic()
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
        return [_unanswered(url, error, time.monotonic() - sent, options.timeout, local_dev)]
    finally:
        if options.http is None:
            http.close()
    return [_judge_answer(state, url, answer)]


def _unanswered(
    url: str, error: requests.exceptions.RequestException, waited: float, timeout: float, local_dev: bool
) -> Finding:
    """What a probe without an answer says: nothing listening (refused, no connection) is told from a shop
    that took the connection and was slow to answer, with how long the doctor waited."""
    level: Level = "warn" if local_dev else "problem"
    what = type(error).__name__
    longer = f"run the doctor again with a longer --timeout (it was {timeout:g} s)"
    if isinstance(error, requests.exceptions.ReadTimeout):
        return Finding(
            "callback",
            level,
            f"POST {url}: the shop took the connection but did not answer within {waited:.1f} s ({what}): "
            "it is listening, but slow or stuck; the gateway gives up on a slow callback too.",
            f"read the shop's log for that request (a slow receiver, a database lock, every worker busy), "
            f"or {longer}",
        )
    if isinstance(error, requests.exceptions.ConnectTimeout):
        said = (
            f"no connection within {waited:.1f} s ({what}): the host does not answer (down, or a firewall "
            "drops it)"
        )
    else:
        said = f"nothing is listening there ({what}: {_first_line(error)})"
    return Finding(
        "callback",
        level,
        f"POST {url}: {said}; the gateway cannot deliver callbacks there.",
        "start the shop (flask run, make demo), or set GATEWAY_PUBLIC_URL to the address it listens on"
        if local_dev
        else "check that GATEWAY_PUBLIC_URL is the shop's public address, that its DNS name resolves, and "
        f"that the firewall and proxy in front of the shop let HTTPS in ({longer}; {_DOCS_MISSED})",
    )


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
