"""The emulator's settings, read from ``EMULATOR_*`` environment variables (docs/emulator.md)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from flask_gateway.core.wire.names import OPERATOR, WireNames, wire_names

__all__ = ["DEFAULT_ACCOUNTS", "EmulatorSettings", "SettingsError", "timezone_name"]

DEFAULT_ACCOUNTS: Final = "demo-merchant:demo-api-key"


class SettingsError(ValueError):
    """An ``EMULATOR_*`` variable has a value the emulator cannot use; the message says which and why."""


@dataclass(frozen=True)
class EmulatorSettings:
    """The emulator's settings; ``EmulatorSettings.from_env()`` reads the ``EMULATOR_*`` variables."""

    #: Accounts "issued by the account manager": merchant account id -> API key.
    accounts: Mapping[str, str] = field(default_factory=lambda: {"demo-merchant": "demo-api-key"})
    #: The name a shopper reads on the payment page, per account id (``id:apikey:Name``); an account
    #: without one is headed with its id.
    account_names: Mapping[str, str] = field(default_factory=dict)
    #: The IANA zone the payment pages show times in (``EMULATOR_TIMEZONE``); stored and sent times stay UTC.
    timezone: str = "UTC"
    #: Strict: redirect URLs on localhost, ``*.localhost`` or an IP literal are refused (403).
    waf_strict: bool = True
    #: Sandbox: 401 bodies carry ``expectedSignature``.
    sandbox: bool = True
    database_url: str | None = None
    #: Seconds between callback attempts (attempts = len + 1).
    callback_retry_delays: tuple[float, ...] = (2.0, 10.0)
    smtp_url: str | None = None
    #: Run the background delivery worker in the server process.
    worker: bool = True
    #: Base URL for ``paymentUrl``/``redirect_to``; defaults to the URL the request came in on.
    public_url: str | None = None
    #: How answers and callbacks spell the operator-named fields (requests are read in either set).
    wire_names: WireNames = OPERATOR
    #: When set, the dashboard and the control API need it (``Authorization: Bearer``, or the dashboard's
    #: sign-in form); unset, they are open (tests, the demo), and the v1 outcome URLs are still masked.
    control_token: str | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> EmulatorSettings:
        env = os.environ if environ is None else environ
        accounts = _parse_accounts(env.get("EMULATOR_ACCOUNTS", DEFAULT_ACCOUNTS))
        return cls(
            accounts={account_id: key for account_id, (key, _) in accounts.items()},
            account_names={account_id: name for account_id, (_, name) in accounts.items() if name},
            timezone=timezone_name(env.get("EMULATOR_TIMEZONE", "UTC")),
            waf_strict=_choice(env, "EMULATOR_WAF", {"strict": True, "allow-local": False}, "strict"),
            sandbox=_choice(env, "EMULATOR_SANDBOX", {"1": True, "0": False}, "1"),
            database_url=env.get("EMULATOR_DATABASE_URL") or None,
            callback_retry_delays=_parse_delays(env.get("EMULATOR_CALLBACK_RETRY_DELAYS", "2,10")),
            smtp_url=env.get("EMULATOR_SMTP_URL") or None,
            worker=_choice(env, "EMULATOR_WORKER", {"1": True, "0": False}, "1"),
            public_url=(env.get("EMULATOR_PUBLIC_URL") or "").rstrip("/") or None,
            wire_names=_wire_names(env.get("EMULATOR_WIRE_NAMES", OPERATOR.key)),
            control_token=_token(env.get("EMULATOR_CONTROL_TOKEN", "")),
        )

    @property
    def max_callback_attempts(self) -> int:
        return len(self.callback_retry_delays) + 1

    @property
    def zone(self) -> ZoneInfo:
        """:attr:`timezone` as a ``ZoneInfo``."""
        return ZoneInfo(self.timezone)

    def account_name(self, account_id: str) -> str:
        """What the payment page of ``account_id``'s checkouts is headed with: its name, else its id."""
        return self.account_names.get(account_id) or account_id


def _token(value: str) -> str | None:
    token = value.strip()
    if not token:
        return None
    if len(token) < 16:
        raise SettingsError(
            "EMULATOR_CONTROL_TOKEN is too short to keep anyone out: use at least 16 random characters "
            '(python -c "import secrets; print(secrets.token_urlsafe(24))").'
        )
    return token


def _parse_accounts(value: str) -> dict[str, tuple[str, str]]:
    """``id:apikey[:Name][,...]`` -> ``{id: (apikey, name)}`` (name ``""`` when not given)."""
    accounts: dict[str, tuple[str, str]] = {}
    for entry in filter(None, (part.strip() for part in value.split(","))):
        account_id, sep, rest = entry.partition(":")
        api_key, _, name = rest.partition(":")
        if not sep or not account_id or not api_key:
            raise SettingsError(
                f"EMULATOR_ACCOUNTS entry {entry.split(':')[0]!r}... is not 'id:apikey' or 'id:apikey:Name' "
                "(expected EMULATOR_ACCOUNTS=id:apikey[:Name][,id:apikey[:Name]...])"
            )
        accounts[account_id] = (api_key, name.strip())
    if not accounts:
        raise SettingsError("EMULATOR_ACCOUNTS names no account (expected id:apikey[:Name][,id:apikey...])")
    return accounts


def timezone_name(value: str) -> str:
    """``EMULATOR_TIMEZONE``'s value checked: an IANA zone name (blank: ``UTC``), or ``SettingsError``."""
    name = value.strip() or "UTC"
    try:
        ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise SettingsError(
            f"EMULATOR_TIMEZONE={value!r} is not an IANA time zone name: write one such as "
            "'Africa/Johannesburg', 'Europe/Amsterdam' or 'UTC'"
        ) from None
    return name


def _parse_delays(value: str) -> tuple[float, ...]:
    try:
        delays = tuple(float(part) for part in value.split(",") if part.strip())
    except ValueError:
        raise SettingsError(
            f"EMULATOR_CALLBACK_RETRY_DELAYS={value!r} is not a comma-separated list of seconds (e.g. 2,10)"
        ) from None
    if any(d < 0 for d in delays):
        raise SettingsError("EMULATOR_CALLBACK_RETRY_DELAYS must not be negative")
    return delays


def _wire_names(value: str) -> WireNames:
    try:
        return wire_names(value or OPERATOR.key)
    except ValueError as exc:
        raise SettingsError(f"EMULATOR_WIRE_NAMES: {exc}") from None


def _choice(env: Mapping[str, str], name: str, choices: Mapping[str, bool], default: str) -> bool:
    value = env.get(name, default).strip().lower() or default
    if value not in choices:
        raise SettingsError(f"{name}={value!r}: expected one of {', '.join(choices)}")
    return choices[value]
