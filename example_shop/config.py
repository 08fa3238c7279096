"""The shop's configuration: defaults, then the environment (``SHOP_*``, ``GATEWAY_*``), then the caller's.

Everything is resolved once, in :func:`resolve`, into plain Flask config keys; a wrong value stops the app
with a :class:`ShopConfigError` that names the variable and the fix (see docs/example-shop.md).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Final

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from werkzeug.security import generate_password_hash

from flask_gateway import DatabaseStorage

__all__ = [
    "METRICS_TOKEN_MIN_LENGTH",
    "ORDER_ENDPOINT",
    "SHOP_ZONE",
    "ShopConfigError",
    "gateway_from_env",
    "instance_secret",
    "resolve",
]

#: The shop's order page for ``GATEWAY_ORDER_ENDPOINT``: it takes the plain ``reference=`` the extension
#: passes after the return page and sends the shopper on to the signed order link.
ORDER_ENDPOINT: Final = "orders.by_reference"
#: The shop sells in South Africa: its ``GATEWAY_TIMEZONE``, and the demo's emulator's ``EMULATOR_TIMEZONE``.
SHOP_ZONE: Final = "Africa/Johannesburg"

log = logging.getLogger("example_shop.config")

_ENVIRONMENTS: Final = ("development", "production")
#: Names other recipes give the database URL; the shop reads ``SHOP_DATABASE_URL`` only.
_OTHER_DATABASE_NAMES: Final = ("SQLALCHEMY_DATABASE_URI", "DATABASE_URL")
_LOG_FORMATS: Final = ("text", "json")
#: The shortest ``SHOP_METRICS_TOKEN`` taken (``secrets.token_urlsafe(32)`` gives 43 characters).
METRICS_TOKEN_MIN_LENGTH: Final = 16
_TRUE: Final = frozenset({"1", "true", "yes", "on"})
_FALSE: Final = frozenset({"0", "false", "no", "off", ""})
#: Werkzeug's hash formats (``generate_password_hash``): ``method$salt$hash``.
_HASH_METHODS: Final = ("scrypt:", "pbkdf2:")


class ShopConfigError(RuntimeError):
    """A configuration value the shop cannot start with; the message names the variable and the fix."""


def _flag(name: str, value: str) -> bool:
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ShopConfigError(f"{name}={value!r} is not a yes/no value: use 1 or 0 (true/false also work).")


def _whole(name: str, value: str) -> int:
    try:
        return int(value.strip())
    except ValueError:
        raise ShopConfigError(f"{name}={value!r} is not a whole number (e.g. {name}=2).") from None


def _seconds(name: str, value: str) -> float | tuple[float, float]:
    """``5`` or ``5,30`` (connect, read)."""
    parts = [part.strip() for part in value.split(",")]
    try:
        numbers = [float(part) for part in parts]
    except ValueError:
        numbers = []
    if len(numbers) == 1:
        return numbers[0]
    if len(numbers) == 2:
        return numbers[0], numbers[1]
    raise ShopConfigError(f"{name}={value!r}: give seconds as one number (10) or a connect,read pair (5,30).")


def _number(name: str, value: str) -> float:
    try:
        return float(value.strip())
    except ValueError:
        raise ShopConfigError(f"{name}={value!r} is not a number (e.g. {name}=24).") from None


#: ``GATEWAY_*`` variables that are not text; every other one is copied as it is (a test checks that every
#: key whose default is a number or a flag is here).
_GATEWAY_PARSERS: Final[dict[str, Callable[[str, str], Any]]] = {
    "GATEWAY_MAX_RETRIES": _whole,
    "GATEWAY_ORDER_EXPIRY_MINUTES": _whole,
    "GATEWAY_RECONCILE_AFTER_SECONDS": _whole,
    "GATEWAY_RECONCILE_PAID_WINDOW_HOURS": _number,
    "GATEWAY_OUTBOX_MAX_ATTEMPTS": _whole,
    "GATEWAY_RECONCILE_CONCURRENCY": _whole,
    "GATEWAY_OUTBOX_RETRY_SECONDS": _whole,
    "GATEWAY_CALLBACK_SILENCE_MINUTES": _whole,
    "GATEWAY_CALLBACK_SILENCE_PAYMENTS": _whole,
    "GATEWAY_DELIVER_STALE_SECONDS": _whole,
    "GATEWAY_RECONCILE_STALE_SECONDS": _whole,
    "GATEWAY_SETTINGS_CHECK_SECONDS": _whole,
    "GATEWAY_PREVIOUS_SIGNING_KEY_HOURS": _whole,
    "GATEWAY_V1_CANCEL_ON_FAIL": _flag,
    "GATEWAY_CONFIRM_CALLBACKS": _flag,
    "GATEWAY_OUTBOX_DELIVER_AT_ONCE": _flag,
    "GATEWAY_SQLITE_WAL": _flag,
    "GATEWAY_SQLITE_IN_PRODUCTION": _flag,
    "GATEWAY_TIMEOUT": _seconds,
}


def gateway_from_env(environ: Mapping[str, str]) -> dict[str, Any]:
    """Every ``GATEWAY_*`` environment variable as a config value (numbers and flags parsed)."""
    values: dict[str, Any] = {}
    for name, raw in environ.items():
        if not name.startswith("GATEWAY_"):
            continue
        parser = _GATEWAY_PARSERS.get(name)
        values[name] = parser(name, raw) if parser else raw
    return values


def instance_secret(instance: Path, name: str = "shop-secret-key") -> str:
    """A random key created once in the instance folder and reused by every process and restart."""
    instance.mkdir(parents=True, exist_ok=True)
    path = instance / name
    try:
        with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as handle:
            handle.write(secrets.token_hex(32))
    except FileExistsError:
        pass
    return path.read_text().strip()


def _cents(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ShopConfigError(f"{name} must be whole cents, not {value!r}.")
    cents = _whole(name, value) if isinstance(value, str) else value
    if not isinstance(cents, int) or cents < 0:
        raise ShopConfigError(f"{name}={value!r}: give whole cents, 0 or more (R 50.00 is 5000).")
    return cents


def _password_hash(config: dict[str, Any]) -> str | None:
    """The owner's password hash; a plain ``SHOP_ADMIN_PASSWORD`` is hashed here, in development only."""
    env = config["SHOP_ENV"]
    stored = (config.get("SHOP_ADMIN_PASSWORD_HASH") or "").strip() or None
    plain = config.pop("SHOP_ADMIN_PASSWORD", None) or None
    if stored is not None and not stored.startswith(_HASH_METHODS):
        raise ShopConfigError(
            "SHOP_ADMIN_PASSWORD_HASH is not a werkzeug password hash (it starts with 'scrypt:' or "
            "'pbkdf2:'). Make one with: flask --app example_shop shop hash-password"
        )
    if env == "production":
        if plain is not None:
            raise ShopConfigError(
                "SHOP_ADMIN_PASSWORD is for development only: in production (SHOP_ENV=production) set "
                "SHOP_ADMIN_PASSWORD_HASH instead (flask --app example_shop shop hash-password)."
            )
        if stored is None:
            raise ShopConfigError(
                "SHOP_ENV=production needs SHOP_ADMIN_PASSWORD_HASH, the owner's password hash; there is no "
                "default password. Make one with: flask --app example_shop shop hash-password"
            )
        return stored
    if stored is not None:
        return stored
    return generate_password_hash(plain) if plain is not None else None


def resolve(
    overrides: Mapping[str, Any] | None, *, environ: Mapping[str, str], instance_path: Path
) -> dict[str, Any]:
    """The app config: defaults, the environment, then ``overrides`` (tests), checked and derived."""
    config: dict[str, Any] = {
        "SHOP_NAME": "Stoep",
        "SHOP_ENV": "development",
        "SHOP_AUTO_INSTALL": False,
        "SHOP_GATEWAY_ACCOUNT": "demo-merchant",
        "SHOP_GATEWAY_API_KEY": "demo-api-key",
        #: The second brand's merchant account, ``id:apikey`` (empty: one account sells everything).
        "SHOP_SECOND_ACCOUNT": "",
        #: The shop sells in South Africa: every time on its pages and the gateway's screens is in SAST.
        "GATEWAY_TIMEZONE": SHOP_ZONE,
        "SHOP_MIN_CENTS": 5000,
        "SHOP_MAX_CENTS": 5000000,
        #: Seconds to wait between auto-install attempts while the gateway is unreachable.
        "SHOP_AUTO_INSTALL_DELAYS": (0.5, 1.0, 2.0, 4.0),
        "SQLALCHEMY_ENGINE_OPTIONS": {"pool_pre_ping": True},
        # The CSRF token lives as long as the session: a product page left open stays usable.
        "WTF_CSRF_TIME_LIMIT": None,
        # Its own cookie name: on 127.0.0.1 cookies are shared across ports, and the gateway emulator's
        # "session" cookie would otherwise replace the shop's (cart and orders lost on the way back).
        "SESSION_COOKIE_NAME": "stoep_session",
        "SESSION_COOKIE_SAMESITE": "Lax",
        "SESSION_COOKIE_HTTPONLY": True,
        # Every form here is a few KiB; the gateway's callback needs 64 KiB (it checks that itself).
        "MAX_CONTENT_LENGTH": 1024 * 1024,
        # Flask-Limiter (the login form): counters in the shop's database, shared by every worker.
        "RATELIMIT_STORAGE_URI": DatabaseStorage.URI,
        "SHOP_LOGIN_RATE_LIMIT": "30 per minute",
    }
    env_values: dict[str, Any] = gateway_from_env(environ)
    for name in (
        "SHOP_NAME",
        "SHOP_ENV",
        "SHOP_ADMIN_PASSWORD",
        "SHOP_ADMIN_PASSWORD_HASH",
        "SHOP_GATEWAY_ACCOUNT",
        "SHOP_GATEWAY_API_KEY",
        "SHOP_SECOND_ACCOUNT",
        "SHOP_MIN_CENTS",
        "SHOP_MAX_CENTS",
        "SHOP_SECRET_KEY",
        "SHOP_DATABASE_URL",
        "SHOP_LOGIN_RATE_LIMIT",
        "SHOP_DB_POOL_SIZE",
        "SHOP_DB_MAX_OVERFLOW",
        "SHOP_CELERY_BROKER_URL",
        "SHOP_METRICS_TOKEN",
        "SHOP_TRUSTED_PROXIES",
        "SHOP_LOG_FORMAT",
    ):
        if environ.get(name):
            env_values[name] = environ[name]
    if environ.get("SHOP_RATELIMIT_STORAGE_URI"):
        env_values["RATELIMIT_STORAGE_URI"] = environ["SHOP_RATELIMIT_STORAGE_URI"]
    if "SHOP_AUTO_INSTALL" in environ:
        env_values["SHOP_AUTO_INSTALL"] = _flag("SHOP_AUTO_INSTALL", environ["SHOP_AUTO_INSTALL"])
    config.update(env_values)
    config.update(overrides or {})

    env = str(config["SHOP_ENV"]).strip().lower()
    if env not in _ENVIRONMENTS:
        raise ShopConfigError(f"SHOP_ENV={config['SHOP_ENV']!r}: use 'development' or 'production'.")
    config["SHOP_ENV"] = env
    given_hash = (config.get("SHOP_ADMIN_PASSWORD_HASH") or "").strip()
    credential = given_hash or config.get("SHOP_ADMIN_PASSWORD") or ""
    config["SHOP_ADMIN_PASSWORD_HASH"] = _password_hash(config)
    config["SHOP_MIN_CENTS"] = _cents("SHOP_MIN_CENTS", config["SHOP_MIN_CENTS"])
    config["SHOP_MAX_CENTS"] = _cents("SHOP_MAX_CENTS", config["SHOP_MAX_CENTS"])
    if config["SHOP_MIN_CENTS"] > config["SHOP_MAX_CENTS"]:
        raise ShopConfigError(
            "SHOP_MIN_CENTS is above SHOP_MAX_CENTS: the minimum must not exceed the maximum."
        )

    _second_account(config)

    if not config.get("SECRET_KEY"):
        if config.get("SHOP_SECRET_KEY"):
            config["SECRET_KEY"] = config["SHOP_SECRET_KEY"]
        elif env == "production":
            raise ShopConfigError(
                "SHOP_ENV=production needs SHOP_SECRET_KEY (a long random value that stays the same: "
                'python -c "import secrets; print(secrets.token_hex(32))"). It signs sessions and order '
                "links and protects the gateway keys stored in the database."
            )
        else:
            config["SECRET_KEY"] = instance_secret(instance_path)
    config.pop("SHOP_SECRET_KEY", None)
    # The owner's sessions carry this: a new password ends the sessions of the old one. The same in every
    # worker process (a plain development password is hashed with a new salt in each), and useless without
    # SECRET_KEY (the session cookie is readable).
    secret = str(config["SECRET_KEY"]).encode()
    config["SHOP_OWNER_CREDENTIAL_KEY"] = (
        hmac.new(secret, b"owner-credential:" + str(credential).encode(), hashlib.sha256).hexdigest()[:32]
        if credential
        else ""
    )

    _database(config, environ, instance_path)
    _deployment(config)

    # A limiter on Redis or memcached that fails lets the login through (its attempt counters, in the
    # database, still guard it). On the database, its failure is a database outage: raised, so the login
    # answers the outage page (503) with one log line, not a swallowed traceback per attempt.
    config.setdefault("RATELIMIT_SWALLOW_ERRORS", config["RATELIMIT_STORAGE_URI"] != DatabaseStorage.URI)
    # While that storage is down, each process counts the login attempts in memory instead: Flask-Limiter
    # logs one WARNING when it falls back and one INFO line when the storage is back, not a traceback per
    # request ("Failed to rate limit. Swallowing error").
    config.setdefault(
        "RATELIMIT_IN_MEMORY_FALLBACK_ENABLED", config["RATELIMIT_STORAGE_URI"] != DatabaseStorage.URI
    )

    # Shoppers come back from the gateway to the shop's own order page (see views/orders.py).
    config["GATEWAY_ORDER_ENDPOINT"] = ORDER_ENDPOINT
    # The shop's SQLite file in WAL mode (asked of the extension, which owns no other setting of the shop's
    # engine): the shop's connections and the extension's read while the other writes.
    config.setdefault("GATEWAY_SQLITE_WAL", True)
    if env == "production":
        config.setdefault("SESSION_COOKIE_SECURE", True)
    return config


def _second_account(config: dict[str, Any]) -> None:
    """``SHOP_SECOND_ACCOUNT=id:apikey``: the second brand's merchant account, as ``SHOP_SECOND_ACCOUNT_ID``
    and ``SHOP_SECOND_ACCOUNT_API_KEY`` (both None when it is not set: the shop has one account)."""
    raw = str(config.pop("SHOP_SECOND_ACCOUNT", "") or "").strip()
    config["SHOP_SECOND_ACCOUNT_ID"] = config["SHOP_SECOND_ACCOUNT_API_KEY"] = None
    if not raw:
        return
    account, sep, api_key = (part.strip() for part in raw.partition(":"))
    if not sep or not account or not api_key or ":" in api_key or "," in raw:
        # The value is never repeated: it holds an API key.
        raise ShopConfigError(
            "SHOP_SECOND_ACCOUNT is not 'id:apikey': give the second brand's merchant account id and its API "
            "key, separated by a colon (e.g. SHOP_SECOND_ACCOUNT=demo-vuurhout:demo-vuurhout-key), or leave "
            "it empty for one account."
        )
    if len(account) > 255 or not all(c.isalnum() or c in "-_." for c in account):
        raise ShopConfigError(
            f"SHOP_SECOND_ACCOUNT: the account id {account[:40]!r} may hold letters, digits, '-', '_' and "
            "'.' only (at most 255): it is part of the account's callback path."
        )
    if account == str(config["SHOP_GATEWAY_ACCOUNT"]).strip():
        raise ShopConfigError(
            f"SHOP_SECOND_ACCOUNT names {account!r}, the account of SHOP_GATEWAY_ACCOUNT: the second brand "
            "needs a merchant account of its own (or leave SHOP_SECOND_ACCOUNT empty for one account)."
        )
    config["SHOP_SECOND_ACCOUNT_ID"] = account
    config["SHOP_SECOND_ACCOUNT_API_KEY"] = api_key


def _database(config: dict[str, Any], environ: Mapping[str, str], instance_path: Path) -> None:
    """``SQLALCHEMY_DATABASE_URI`` from ``SHOP_DATABASE_URL`` (the one name the shop reads), and the pool
    settings ``SHOP_DB_POOL_SIZE`` and ``SHOP_DB_MAX_OVERFLOW`` in ``SQLALCHEMY_ENGINE_OPTIONS``."""
    if not config.get("SQLALCHEMY_DATABASE_URI"):
        if config.get("SHOP_DATABASE_URL"):
            config["SQLALCHEMY_DATABASE_URI"] = str(config["SHOP_DATABASE_URL"]).strip()
        else:
            others = [name for name in _OTHER_DATABASE_NAMES if environ.get(name)]
            ignored = (
                f" The environment has {' and '.join(others)}, which the shop does not read: name the URL "
                "SHOP_DATABASE_URL instead."
                if others
                else ""
            )
            if config["SHOP_ENV"] == "production":
                raise ShopConfigError(
                    "SHOP_ENV=production needs SHOP_DATABASE_URL, the shop's database (e.g. "
                    "postgresql+psycopg://shop:PASSWORD@db:5432/shop, or "
                    "sqlite:////var/lib/shop/shop.sqlite3 for a one-machine shop): production never falls "
                    f"back to the development file instance/example_shop.sqlite3.{ignored}"
                )
            instance_path.mkdir(parents=True, exist_ok=True)
            config["SQLALCHEMY_DATABASE_URI"] = f"sqlite:///{instance_path / 'example_shop.sqlite3'}"
            if others:
                log.warning(
                    "the shop uses its development database %s:%s",
                    config["SQLALCHEMY_DATABASE_URI"],
                    ignored,
                )
    try:
        url = make_url(str(config["SQLALCHEMY_DATABASE_URI"]))
    except ArgumentError:
        # The URL itself is never repeated: it may hold a password.
        raise ShopConfigError(
            "SHOP_DATABASE_URL is not a database URL: give a SQLAlchemy URL such as "
            "postgresql+psycopg://shop:PASSWORD@db:5432/shop or sqlite:////var/lib/shop/shop.sqlite3."
        ) from None
    in_memory = url.get_backend_name() == "sqlite" and (
        url.database in (None, "", ":memory:") or url.query.get("mode") == "memory"
    )
    options = dict(config.get("SQLALCHEMY_ENGINE_OPTIONS") or {})
    for name, option, minimum in (
        ("SHOP_DB_POOL_SIZE", "pool_size", 1),
        ("SHOP_DB_MAX_OVERFLOW", "max_overflow", 0),
    ):
        raw = config.get(name)
        if raw is None or raw == "":
            continue
        number = _at_least(name, raw, minimum)
        if in_memory:
            raise ShopConfigError(
                f"{name} means nothing for an in-memory SQLite database (one connection shared by every "
                f"thread): remove {name}, or use a database file or PostgreSQL in SHOP_DATABASE_URL."
            )
        config[name] = options[option] = number
    config["SQLALCHEMY_ENGINE_OPTIONS"] = options


def _at_least(name: str, value: Any, minimum: int) -> int:
    """A whole number of at least ``minimum`` (from the environment as text, or a test's int)."""
    number = _whole(name, value) if isinstance(value, str) else value
    if isinstance(number, bool) or not isinstance(number, int) or number < minimum:
        raise ShopConfigError(f"{name}={value!r}: give a whole number, {minimum} or more.")
    return number


def log_format(value: str | None) -> str:
    """``SHOP_LOG_FORMAT``: ``text`` (the default) or ``json``."""
    text = (value or "text").strip().lower()
    if text not in _LOG_FORMATS:
        raise ShopConfigError(
            f"SHOP_LOG_FORMAT={value!r}: use 'text' (time, level, logger, message on one line) or 'json' "
            "(one JSON object a line; needs python-json-logger)."
        )
    return text


def _deployment(config: dict[str, Any]) -> None:
    """The deployment knobs: the Celery broker, the metrics token, the trusted proxies, the log format."""
    broker = str(config.get("SHOP_CELERY_BROKER_URL") or "").strip()
    if broker:
        if "://" not in broker:
            raise ShopConfigError(
                "SHOP_CELERY_BROKER_URL is not a broker URL: give e.g. redis://localhost:6379/0."
            )
        celery = dict(config.get("CELERY") or {})
        celery.setdefault("broker_url", broker)  # a test's own CELERY mapping wins
        config["CELERY"] = celery
    config["SHOP_CELERY_BROKER_URL"] = broker or None

    token = str(config.get("SHOP_METRICS_TOKEN") or "").strip()
    if token and (len(token) < METRICS_TOKEN_MIN_LENGTH or any(ch.isspace() for ch in token)):
        raise ShopConfigError(
            f"SHOP_METRICS_TOKEN is too short or holds spaces: give at least {METRICS_TOKEN_MIN_LENGTH} "
            'characters without spaces, e.g. python -c "import secrets; print(secrets.token_urlsafe(32))".'
        )
    config["SHOP_METRICS_TOKEN"] = token or None

    proxies = config.get("SHOP_TRUSTED_PROXIES")
    config["SHOP_TRUSTED_PROXIES"] = (
        0 if proxies is None or proxies == "" else _at_least("SHOP_TRUSTED_PROXIES", proxies, 0)
    )
    config["SHOP_LOG_FORMAT"] = log_format(config.get("SHOP_LOG_FORMAT"))
