"""The extension's configuration: every ``GATEWAY_*`` key, its default, read once in ``init_app``.

docs/configuration.md documents each key; keep the two in step (a test compares them).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any, Final, Literal
from urllib.parse import urlsplit
from zoneinfo import ZoneInfo

from flask_gateway.clock import DEFAULT_ZONE
from flask_gateway.clock import zone as _zone
from flask_gateway.core.wire.names import OPERATOR, WireNames, wire_names
from flask_gateway.errors import ConfigurationError

__all__ = ["DEFAULTS", "EMBEDDED_ORIGIN", "ENVIRONMENT_URLS", "MAX_PAID_WINDOW_HOURS", "GatewayConfig"]

Environment = Literal["sandbox", "production", "emulator", "embedded"]
ApiVersion = Literal["v2", "v1"]
Waf = Literal["strict", "allow-local"]


#: The gateway's addresses per environment, used when the three URL keys are not set.
#:
#: - ``sandbox``: the addresses the gateway's developer documentation gives (developers.payjustnow.com:
#:   the create, installation and v1 checkout pages).
#: - ``emulator``: the emulator running locally as in the demo (``flask --app flask_gateway.emulator run
#:   --port 5050``).
#: - ``embedded``: none here; the emulator is mounted in the shop's own app, so its addresses are the shop's
#:   ``GATEWAY_PUBLIC_URL`` (or ``http://localhost``, reached in-process) plus ``GATEWAY_EMBEDDED_PREFIX``.
#: - ``production``: none; the documentation states no production address (it sends merchants to their
#:   account manager), so the three keys must be set (``ConfigurationError`` says so).
ENVIRONMENT_URLS: Final[Mapping[str, Mapping[str, str]]] = {
    "sandbox": {
        "GATEWAY_BASE_URL": "https://sandbox-checkout.payjustnow.io",
        "GATEWAY_INSTALL_URL": "https://install.sandbox-checkout.payjustnow.io",
        "GATEWAY_V1_BASE_URL": "https://sandbox.payjustnow.com",
    },
    "emulator": {
        "GATEWAY_BASE_URL": "http://127.0.0.1:5050",
        "GATEWAY_INSTALL_URL": "http://127.0.0.1:5050/install",
        "GATEWAY_V1_BASE_URL": "http://127.0.0.1:5050",
    },
}

#: The embedded emulator's origin when ``GATEWAY_PUBLIC_URL`` is not set: the extension reaches it
#: in-process, on the address of the request being served (so ``paymentUrl`` is the one the shopper used).
EMBEDDED_ORIGIN: Final = "http://localhost"

#: ``GATEWAY_RECONCILE_PAID_WINDOW_HOURS`` at most (a year): a longer window polls a shop's whole history.
MAX_PAID_WINDOW_HOURS: Final = 8760

#: ``GATEWAY_RECONCILE_CONCURRENCY`` at most: more threads than this only wait on the database's locks.
MAX_RECONCILE_CONCURRENCY: Final = 64

#: Every key with its default (``None``: no default).
DEFAULTS: Final[Mapping[str, Any]] = {
    "GATEWAY_ENVIRONMENT": "emulator",
    "GATEWAY_BASE_URL": None,
    "GATEWAY_INSTALL_URL": None,
    "GATEWAY_V1_BASE_URL": None,
    "GATEWAY_PUBLIC_URL": None,
    "GATEWAY_API_VERSION": "v2",
    "GATEWAY_TIMEOUT": (5.0, 30.0),
    "GATEWAY_MAX_RETRIES": 2,
    "GATEWAY_URL_PREFIX": "/gateway",
    "GATEWAY_EMBEDDED_PREFIX": "/_gateway",
    "GATEWAY_ORDER_ENDPOINT": None,
    "GATEWAY_ORDER_EXPIRY_MINUTES": 60,
    "GATEWAY_V1_CANCEL_ON_FAIL": True,
    "GATEWAY_ENCRYPTION_KEY": None,
    "GATEWAY_RECONCILE_AFTER_SECONDS": 300,
    "GATEWAY_RECONCILE_PAID_WINDOW_HOURS": 72,
    "GATEWAY_RECONCILE_CONCURRENCY": 8,
    "GATEWAY_CURRENCY_SYMBOL": "R",
    "GATEWAY_WAF": "strict",
    "GATEWAY_WIRE_NAMES": OPERATOR.key,
    "GATEWAY_SQLITE_WAL": False,
    "GATEWAY_SQLITE_IN_PRODUCTION": False,
    "GATEWAY_CONFIRM_CALLBACKS": True,
    "GATEWAY_OUTBOX_DELIVER_AT_ONCE": True,
    "GATEWAY_OUTBOX_MAX_ATTEMPTS": 8,
    "GATEWAY_OUTBOX_RETRY_SECONDS": 60,
    "GATEWAY_RATELIMIT_STORAGE_URI": None,
    "GATEWAY_CALLBACK_RATE_LIMIT": "60 per minute",
    "GATEWAY_PLAN_RATE_LIMIT": "30 per minute",
    "GATEWAY_CALLBACK_SILENCE_MINUTES": 30,
    "GATEWAY_CALLBACK_SILENCE_PAYMENTS": 3,
    "GATEWAY_DELIVER_STALE_SECONDS": 300,
    "GATEWAY_RECONCILE_STALE_SECONDS": 1800,
    "GATEWAY_SETTINGS_CHECK_SECONDS": 300,
    "GATEWAY_PREVIOUS_SIGNING_KEY_HOURS": 24,
    "GATEWAY_TIMEZONE": DEFAULT_ZONE,
}


@dataclass(frozen=True)
class GatewayConfig:
    environment: Environment
    base_url: str
    install_url: str
    v1_base_url: str
    public_url: str | None
    api_version: ApiVersion
    timeout: tuple[float, float]
    max_retries: int
    url_prefix: str
    order_endpoint: str | None
    order_expiry_minutes: int
    v1_cancel_on_fail: bool
    encryption_key: str | None
    reconcile_after_seconds: int
    #: Reconciliation also asks about checkouts paid within this many hours (refunds and cancellations
    #: made at the gateway); 0: it does not.
    reconcile_paid_window_hours: float
    currency_symbol: str
    confirm_callbacks: bool
    #: Deliver an outbox event to the shop's receivers right after the commit that wrote it (else only
    #: ``flask gateway deliver`` or the task queue does).
    outbox_deliver_at_once: bool
    #: Attempts before an event is dead (a person decides).
    outbox_max_attempts: int
    #: Seconds before the first retry; each later one waits twice as long (at most 6 hours).
    outbox_retry_seconds: int
    ratelimit_storage_uri: str | None
    callback_rate_limit: str | None
    plan_rate_limit: str | None
    #: What the gateway's firewall does with redirect URLs on localhost or an IP address: "strict" refuses
    #: them (the real gateway always does); "allow-local" describes an emulator started with
    #: EMULATOR_WAF=allow-local. Only the admin screens' warnings depend on it.
    waf: Waf = "strict"
    #: How requests and the v1 replies spell the operator-named fields (answers are read in either set).
    wire_names: WireNames = OPERATOR
    #: Where ``GATEWAY_ENVIRONMENT="embedded"`` mounts the emulator in the shop's app.
    embedded_prefix: str = "/_gateway"
    #: Put a SQLite database file in WAL mode (a setting of the file: the shop's connections use it too).
    sqlite_wal: bool = False
    #: ``flask gateway`` commands run on a SQLite database while ``GATEWAY_ENVIRONMENT="production"``
    #: (a one-machine shop that means it); False: they refuse, exit status 78 (a development database).
    sqlite_in_production: bool = False
    #: Callbacks are "silent" (``flask_gateway.operations.health``) when no verified callback came for
    #: this many minutes while at least ``callback_silence_payments`` v2 payments were confirmed another way.
    callback_silence_minutes: int = 30
    callback_silence_payments: int = 3
    #: Getstatus calls a reconciliation run keeps in flight at once (worker threads); 1: one at a time.
    reconcile_concurrency: int = 8
    #: A job (``flask_gateway.payments.heartbeats``) is overdue when its last finished (or successful) run
    #: is older than this many seconds: ``flask gateway deliver`` and ``flask gateway reconcile``.
    deliver_stale_seconds: int = 300
    reconcile_stale_seconds: int = 1800
    #: The gateway's settings are compared with the shop's (and put back) at most once per this many
    #: seconds by the scheduled runs: Celery beat, ``reconcile``, ``flask gateway check-settings``
    #: (``flask_gateway.operations.drift``).
    settings_check_seconds: int = 300
    #: Hours a signing key replaced by a settings update still verifies callbacks (0: none; at most 30
    #: days). The gateway's callbacks signed before the change, and its retries of them, arrive afterwards.
    previous_signing_key_hours: int = 24
    #: The IANA zone every time a person reads is shown in (``flask_gateway.clock``); stored times stay UTC.
    timezone: str = DEFAULT_ZONE

    @property
    def zone(self) -> ZoneInfo:
        """``timezone`` as a ``ZoneInfo``."""
        return _zone(self.timezone)

    def __repr__(self) -> str:  # the encryption key never appears in a repr or a log line
        return (
            f"GatewayConfig(environment={self.environment!r}, base_url={self.base_url!r}, "
            f"api_version={self.api_version!r}, public_url={self.public_url!r})"
        )

    @classmethod
    def from_mapping(cls, config: MutableMapping[str, Any]) -> GatewayConfig:
        """Fill in defaults (``setdefault``, so the app sees them) and validate every key."""
        waf_given = "GATEWAY_WAF" in config
        for key, default in DEFAULTS.items():
            config.setdefault(key, default)
        environment = config["GATEWAY_ENVIRONMENT"]
        if environment not in ("sandbox", "production", "emulator", "embedded"):
            raise ConfigurationError(
                f"GATEWAY_ENVIRONMENT={environment!r}: use 'sandbox', 'production', 'emulator' or 'embedded'."
            )
        embedded_prefix = str(config["GATEWAY_EMBEDDED_PREFIX"]).rstrip("/")
        if not embedded_prefix.startswith("/"):
            raise ConfigurationError(
                f"GATEWAY_EMBEDDED_PREFIX={config['GATEWAY_EMBEDDED_PREFIX']!r} must be a path such as "
                "'/_gateway'."
            )
        urls = dict(ENVIRONMENT_URLS.get(environment, {}))
        if environment == "embedded":
            embedded = f"{str(config['GATEWAY_PUBLIC_URL'] or EMBEDDED_ORIGIN).rstrip('/')}{embedded_prefix}"
            urls = {
                "GATEWAY_BASE_URL": embedded,
                "GATEWAY_INSTALL_URL": f"{embedded}/install",
                "GATEWAY_V1_BASE_URL": embedded,
            }
        for key in ("GATEWAY_BASE_URL", "GATEWAY_INSTALL_URL", "GATEWAY_V1_BASE_URL"):
            if config[key] and environment == "embedded":
                raise ConfigurationError(
                    f"{key} is set with GATEWAY_ENVIRONMENT='embedded': the embedded emulator answers in "
                    "this app (GATEWAY_EMBEDDED_PREFIX), so remove it; for an emulator of its own "
                    "elsewhere use GATEWAY_ENVIRONMENT='emulator'."
                )
            if config[key]:
                urls[key] = str(config[key])
            if key not in urls:
                raise ConfigurationError(
                    f"{key} is not set. The gateway's documentation gives no {environment} address (your "
                    f"account manager issues it with the merchant account): set {key} in the app config "
                    "(see docs/configuration.md)."
                )
            _check_url(key, urls[key])
            if environment == "production" and urlsplit(urls[key]).scheme != "https":
                raise ConfigurationError(
                    f"{key}={urls[key]!r} must be https:// in production: the signed requests, the API "
                    "key and the answers must not cross the network in the clear."
                )
        public_url = config["GATEWAY_PUBLIC_URL"]
        if environment == "production" and not public_url:
            raise ConfigurationError(
                "GATEWAY_PUBLIC_URL is not set: in production the callback and return URLs must come from "
                "the shop's configured https:// address, never from a request's Host header. Set it to "
                "the shop's external address, e.g. https://shop.example."
            )
        if public_url:
            _check_url("GATEWAY_PUBLIC_URL", public_url)
            if environment == "production" and urlsplit(public_url).scheme != "https":
                raise ConfigurationError(
                    "GATEWAY_PUBLIC_URL must be https:// in production: the gateway posts callbacks and "
                    "sends shoppers there."
                )
        api_version = config["GATEWAY_API_VERSION"]
        if api_version not in ("v2", "v1"):
            raise ConfigurationError(f"GATEWAY_API_VERSION={api_version!r}: use 'v2' (default) or 'v1'.")
        expiry = config["GATEWAY_ORDER_EXPIRY_MINUTES"]
        if not _whole_number(expiry, 10, 7200):
            raise ConfigurationError(
                f"GATEWAY_ORDER_EXPIRY_MINUTES={expiry!r}: a whole number from 10 to 7200."
            )
        silence_minutes = config["GATEWAY_CALLBACK_SILENCE_MINUTES"]
        if not _whole_number(silence_minutes, 1, 10_080):
            raise ConfigurationError(
                f"GATEWAY_CALLBACK_SILENCE_MINUTES={silence_minutes!r}: a whole number of minutes from 1 to "
                "10080 (a week)."
            )
        silence_payments = config["GATEWAY_CALLBACK_SILENCE_PAYMENTS"]
        if not _whole_number(silence_payments, 1, 10_000):
            raise ConfigurationError(
                f"GATEWAY_CALLBACK_SILENCE_PAYMENTS={silence_payments!r}: a whole number from 1 to 10000."
            )
        retries = config["GATEWAY_MAX_RETRIES"]
        if not _whole_number(retries, 0, 10):
            raise ConfigurationError(f"GATEWAY_MAX_RETRIES={retries!r}: a whole number from 0 to 10.")
        paid_window = config["GATEWAY_RECONCILE_PAID_WINDOW_HOURS"]
        if (
            not isinstance(paid_window, int | float)
            or isinstance(paid_window, bool)
            or not 0 <= paid_window <= MAX_PAID_WINDOW_HOURS
        ):
            raise ConfigurationError(
                f"GATEWAY_RECONCILE_PAID_WINDOW_HOURS={paid_window!r}: a number of hours from 0 to "
                f"{MAX_PAID_WINDOW_HOURS} (a year), such as 72: reconciliation asks about the checkouts paid "
                "within that many hours, to learn of refunds made at the gateway; 0 turns it off."
            )
        try:
            names = wire_names(str(config["GATEWAY_WIRE_NAMES"]))
        except ValueError as exc:
            raise ConfigurationError(
                f"GATEWAY_WIRE_NAMES={config['GATEWAY_WIRE_NAMES']!r}: use 'operator' (the real gateway's "
                "names, the default) or 'spec' (the spec's neutral words)."
            ) from exc
        prefix = str(config["GATEWAY_URL_PREFIX"]).rstrip("/")
        if not prefix.startswith("/"):
            raise ConfigurationError(f"GATEWAY_URL_PREFIX={prefix!r} must start with '/', e.g. '/gateway'.")
        waf = config["GATEWAY_WAF"]
        if environment == "embedded" and not waf_given:
            waf = config["GATEWAY_WAF"] = "allow-local"  # the embedded emulator allows local addresses
        if waf not in ("strict", "allow-local"):
            raise ConfigurationError(f"GATEWAY_WAF={waf!r}: use 'strict' (default) or 'allow-local'.")
        if waf == "allow-local" and environment not in ("emulator", "embedded"):
            raise ConfigurationError(
                f"GATEWAY_WAF='allow-local' with GATEWAY_ENVIRONMENT={environment!r}: the real gateway's "
                "firewall always refuses redirect URLs on localhost or an IP address. Remove GATEWAY_WAF "
                "(only an emulator started with EMULATOR_WAF=allow-local accepts them)."
            )
        timezone = config["GATEWAY_TIMEZONE"]
        _zone(timezone)  # the ConfigurationError that names the key, at init_app
        return cls(
            environment=environment,
            base_url=urls["GATEWAY_BASE_URL"].rstrip("/"),
            install_url=urls["GATEWAY_INSTALL_URL"].rstrip("/"),
            v1_base_url=urls["GATEWAY_V1_BASE_URL"].rstrip("/"),
            public_url=public_url.rstrip("/") if public_url else None,
            api_version=api_version,
            timeout=_timeout(config["GATEWAY_TIMEOUT"]),
            max_retries=retries,
            url_prefix=prefix,
            embedded_prefix=embedded_prefix,
            order_endpoint=config["GATEWAY_ORDER_ENDPOINT"],
            order_expiry_minutes=expiry,
            v1_cancel_on_fail=bool(config["GATEWAY_V1_CANCEL_ON_FAIL"]),
            encryption_key=config["GATEWAY_ENCRYPTION_KEY"],
            reconcile_after_seconds=int(config["GATEWAY_RECONCILE_AFTER_SECONDS"]),
            reconcile_paid_window_hours=float(paid_window),
            currency_symbol=str(config["GATEWAY_CURRENCY_SYMBOL"]),
            waf=waf,
            wire_names=names,
            sqlite_wal=_flag("GATEWAY_SQLITE_WAL", config["GATEWAY_SQLITE_WAL"]),
            sqlite_in_production=_flag(
                "GATEWAY_SQLITE_IN_PRODUCTION", config["GATEWAY_SQLITE_IN_PRODUCTION"]
            ),
            confirm_callbacks=_flag("GATEWAY_CONFIRM_CALLBACKS", config["GATEWAY_CONFIRM_CALLBACKS"]),
            outbox_deliver_at_once=_flag(
                "GATEWAY_OUTBOX_DELIVER_AT_ONCE", config["GATEWAY_OUTBOX_DELIVER_AT_ONCE"]
            ),
            outbox_max_attempts=_whole(
                "GATEWAY_OUTBOX_MAX_ATTEMPTS", config["GATEWAY_OUTBOX_MAX_ATTEMPTS"], 1, 100
            ),
            outbox_retry_seconds=_whole(
                "GATEWAY_OUTBOX_RETRY_SECONDS", config["GATEWAY_OUTBOX_RETRY_SECONDS"], 1, 86_400
            ),
            ratelimit_storage_uri=config["GATEWAY_RATELIMIT_STORAGE_URI"] or None,
            callback_rate_limit=config["GATEWAY_CALLBACK_RATE_LIMIT"] or None,
            plan_rate_limit=config["GATEWAY_PLAN_RATE_LIMIT"] or None,
            callback_silence_minutes=silence_minutes,
            callback_silence_payments=silence_payments,
            reconcile_concurrency=_whole(
                "GATEWAY_RECONCILE_CONCURRENCY",
                config["GATEWAY_RECONCILE_CONCURRENCY"],
                1,
                MAX_RECONCILE_CONCURRENCY,
            ),
            deliver_stale_seconds=_whole(
                "GATEWAY_DELIVER_STALE_SECONDS", config["GATEWAY_DELIVER_STALE_SECONDS"], 10, 604_800
            ),
            reconcile_stale_seconds=_whole(
                "GATEWAY_RECONCILE_STALE_SECONDS", config["GATEWAY_RECONCILE_STALE_SECONDS"], 10, 604_800
            ),
            settings_check_seconds=_whole(
                "GATEWAY_SETTINGS_CHECK_SECONDS", config["GATEWAY_SETTINGS_CHECK_SECONDS"], 60, 86_400
            ),
            previous_signing_key_hours=_whole(
                "GATEWAY_PREVIOUS_SIGNING_KEY_HOURS", config["GATEWAY_PREVIOUS_SIGNING_KEY_HOURS"], 0, 720
            ),
            timezone=timezone,
        )


def _flag(key: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigurationError(f"{key}={value!r}: True or False.")


def _whole_number(value: object, low: int, high: int) -> bool:
    """An int (not a bool) from ``low`` to ``high``."""
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high


def _whole(key: str, value: object, low: int, high: int) -> int:
    """``value`` when it is a whole number from ``low`` to ``high``, else the error that says so."""
    if not _whole_number(value, low, high):
        raise ConfigurationError(f"{key}={value!r}: a whole number from {low} to {high}.")
    return value  # type: ignore[return-value]  # an int: checked above


def _check_url(key: str, value: object) -> None:
    parts = urlsplit(str(value))
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigurationError(f"{key}={value!r} is not an absolute http(s) URL such as https://host/path.")


def _timeout(value: object) -> tuple[float, float]:
    if isinstance(value, int | float) and not isinstance(value, bool) and value > 0:
        return (float(value), float(value))
    if (
        isinstance(value, tuple | list)
        and len(value) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in value)
    ):
        return (float(value[0]), float(value[1]))
    raise ConfigurationError(
        f"GATEWAY_TIMEOUT={value!r}: seconds (e.g. 10) or a (connect, read) pair (e.g. (5, 30))."
    )
