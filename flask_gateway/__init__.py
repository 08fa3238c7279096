"""Flask-Gateway: a merchant-side integration of a hosted buy-now-pay-later checkout gateway.

The front door: everything a shop uses is importable from here (``from flask_gateway import Gateway,
OrderDraft, start_checkout, payment_confirmed``). The layers behind it (docs/architecture.md):

- ``flask_gateway.core``: signing, wire models, timestamps, errors and the HTTP clients; no Flask.
- the extension (``Gateway``): its state, services (checkouts, refunds, polling, reconciliation, the
  callback endpoint...), views and CLI.
- ``flask_gateway.emulator``: the gateway emulator, built on the core.

The core's names are imported at once; the extension's (and the SQL helpers) are loaded on first use, so
that importing the core (or this package for a client or a signature) never imports Flask or SQLAlchemy.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

from flask_gateway._version import __version__
from flask_gateway.core import GatewayClient, V1Client, sign, verify
from flask_gateway.core.errors import (
    AlreadyInstalledError,
    AuthenticationError,
    CheckoutExpiredError,
    ConflictError,
    FirewallRejectedError,
    FlaskGatewayError,
    ForbiddenError,
    GatewayConnectionError,
    GatewayError,
    GatewayServerError,
    GatewayTimeoutError,
    IdempotencyError,
    InvalidRequestError,
    InvalidResponseError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    V1RefundFailedError,
)
from flask_gateway.core.money import format_money, format_plain
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import (
    CHANGEABLE_STATUSES,
    OPEN_STATUSES,
    PAID_STATUSES,
    PAYMENT_STATUSES,
    REFUNDABLE_STATUSES,
    CheckoutStatus,
)

if TYPE_CHECKING:
    from flask_gateway.clock import format_time
    from flask_gateway.core.sql import (
        UTCDateTime,
        alembic_include_name,
        alembic_render_item,
        configure_sqlite,
        create_all_safely,
    )
    from flask_gateway.errors import (
        EX_CONFIG,
        CallbackRejected,
        CheckoutStateError,
        CheckoutUnavailableError,
        ConfigurationError,
        DatabaseUnavailable,
        GatewayExtensionError,
        InvalidOrderError,
        InvalidReturnLink,
        NotInstalledError,
        RefundDeclinedError,
        RefundNotAllowedError,
        SecretUnreadable,
        UnknownAccountError,
        V1OutcomeRejected,
    )
    from flask_gateway.extension import Gateway
    from flask_gateway.labels import (
        Label,
        api_label,
        callback_outcome_label,
        describe_detail,
        refund_state_label,
        source_label,
        status_label,
    )
    from flask_gateway.models import GatewayCheckout, LocalStatus, RefundRecord, RefundState, SettingsIncident
    from flask_gateway.operations.checks import SetupWarning, setup_warnings
    from flask_gateway.operations.drift import ScheduledCheck, scheduled_check
    from flask_gateway.operations.health import CallbackHealth, callback_health, check_callback_health
    from flask_gateway.operations.metrics import register_metrics
    from flask_gateway.operations.outages import (
        DATABASE_ERRORS,
        SCHEMA_ERRORS,
        database_unavailable,
        is_database_outage,
        is_missing_schema,
        tables_missing,
    )
    from flask_gateway.operations.ratelimit import DatabaseStorage
    from flask_gateway.operations.reconciliation import ReconcileReport, reconcile
    from flask_gateway.payments.accounts import open_checkouts, reopen_account, retire_account
    from flask_gateway.payments.availability import PaymentLimits, is_available, payment_limits
    from flask_gateway.payments.checkouts import (
        cancel_checkout,
        create_checkout,
        start_checkout,
        update_checkout,
    )
    from flask_gateway.payments.installation import InstallSettings, install
    from flask_gateway.payments.orders import Address, Customer, OrderDraft, OrderLine
    from flask_gateway.payments.outbox import DeliveryReport, deliver_due, redeliver
    from flask_gateway.payments.plans import (
        PaymentPlan,
        clear_payment_plan_cache,
        format_instalment_hint,
        payment_plan,
    )
    from flask_gateway.payments.polling import refresh
    from flask_gateway.payments.refunds import refund, retry_refund
    from flask_gateway.signals import (
        callback_rejected,
        callbacks_silent,
        checkout_cancelled,
        checkout_created,
        checkout_expired,
        checkout_flagged,
        fulfilment_failed,
        payment_after_close,
        payment_confirmed,
        refund_succeeded,
        settings_drift_repaired,
        settings_under_attack,
    )
    from flask_gateway.state import GatewayState, get_state
    from flask_gateway.web.admin.blueprint import viewed_account

#: The extension's names, by module: loaded on first use (they import Flask).
_LAZY: dict[str, tuple[str, ...]] = {
    "flask_gateway.core.sql": (
        "UTCDateTime",
        "alembic_include_name",
        "alembic_render_item",
        "configure_sqlite",
        "create_all_safely",
    ),
    "flask_gateway.extension": ("Gateway",),
    "flask_gateway.payments.orders": ("Address", "Customer", "OrderDraft", "OrderLine"),
    "flask_gateway.models": (
        "GatewayCheckout",
        "LocalStatus",
        "RefundRecord",
        "RefundState",
        "SettingsIncident",
    ),
    "flask_gateway.payments.checkouts": (
        "cancel_checkout",
        "create_checkout",
        "start_checkout",
        "update_checkout",
    ),
    "flask_gateway.payments.availability": ("PaymentLimits", "is_available", "payment_limits"),
    "flask_gateway.payments.accounts": ("open_checkouts", "reopen_account", "retire_account"),
    "flask_gateway.web.admin.blueprint": ("viewed_account",),
    "flask_gateway.payments.plans": (
        "PaymentPlan",
        "clear_payment_plan_cache",
        "format_instalment_hint",
        "payment_plan",
    ),
    "flask_gateway.payments.refunds": ("refund", "retry_refund"),
    "flask_gateway.payments.polling": ("refresh",),
    "flask_gateway.operations.reconciliation": ("ReconcileReport", "reconcile"),
    "flask_gateway.payments.installation": ("InstallSettings", "install"),
    "flask_gateway.operations.checks": ("SetupWarning", "setup_warnings"),
    "flask_gateway.operations.drift": ("ScheduledCheck", "scheduled_check"),
    "flask_gateway.operations.health": ("CallbackHealth", "callback_health", "check_callback_health"),
    "flask_gateway.operations.metrics": ("register_metrics",),
    "flask_gateway.labels": (
        "Label",
        "api_label",
        "callback_outcome_label",
        "describe_detail",
        "refund_state_label",
        "source_label",
        "status_label",
    ),
    "flask_gateway.clock": ("format_time",),
    "flask_gateway.operations.ratelimit": ("DatabaseStorage",),
    "flask_gateway.state": ("GatewayState", "get_state"),
    "flask_gateway.signals": (
        "callback_rejected",
        "callbacks_silent",
        "checkout_cancelled",
        "checkout_created",
        "checkout_expired",
        "checkout_flagged",
        "fulfilment_failed",
        "payment_after_close",
        "payment_confirmed",
        "refund_succeeded",
        "settings_drift_repaired",
        "settings_under_attack",
    ),
    "flask_gateway.payments.outbox": ("DeliveryReport", "deliver_due", "redeliver"),
    "flask_gateway.operations.outages": (
        "DATABASE_ERRORS",
        "SCHEMA_ERRORS",
        "database_unavailable",
        "is_database_outage",
        "is_missing_schema",
        "tables_missing",
    ),
    "flask_gateway.errors": (
        "EX_CONFIG",
        "CallbackRejected",
        "CheckoutStateError",
        "CheckoutUnavailableError",
        "ConfigurationError",
        "DatabaseUnavailable",
        "GatewayExtensionError",
        "InvalidOrderError",
        "InvalidReturnLink",
        "NotInstalledError",
        "RefundDeclinedError",
        "RefundNotAllowedError",
        "SecretUnreadable",
        "UnknownAccountError",
        "V1OutcomeRejected",
    ),
}
_MODULE_OF: dict[str, str] = {name: module for module, names in _LAZY.items() for name in names}

__all__ = [
    "CHANGEABLE_STATUSES",
    "DATABASE_ERRORS",
    "EX_CONFIG",
    "OPEN_STATUSES",
    "PAID_STATUSES",
    "PAYMENT_STATUSES",
    "REFUNDABLE_STATUSES",
    "SCHEMA_ERRORS",
    "Address",
    "AlreadyInstalledError",
    "AuthenticationError",
    "CallbackHealth",
    "CallbackRejected",
    "CheckoutExpiredError",
    "CheckoutStateError",
    "CheckoutStatus",
    "CheckoutUnavailableError",
    "ConfigurationError",
    "ConflictError",
    "Customer",
    "DatabaseStorage",
    "DatabaseUnavailable",
    "DeliveryReport",
    "FirewallRejectedError",
    "FlaskGatewayError",
    "ForbiddenError",
    "Gateway",
    "GatewayCheckout",
    "GatewayClient",
    "GatewayConnectionError",
    "GatewayError",
    "GatewayExtensionError",
    "GatewayServerError",
    "GatewayState",
    "GatewayTimeoutError",
    "IdempotencyError",
    "InstallSettings",
    "InvalidOrderError",
    "InvalidRequestError",
    "InvalidResponseError",
    "InvalidReturnLink",
    "Label",
    "LocalStatus",
    "NotFoundError",
    "NotInstalledError",
    "OrderDraft",
    "OrderLine",
    "PayloadTooLargeError",
    "PaymentLimits",
    "PaymentPlan",
    "RateLimitError",
    "ReconcileReport",
    "RefundDeclinedError",
    "RefundNotAllowedError",
    "RefundRecord",
    "RefundState",
    "ScheduledCheck",
    "SecretUnreadable",
    "SettingsIncident",
    "SetupWarning",
    "UTCDateTime",
    "UnknownAccountError",
    "V1Client",
    "V1OutcomeRejected",
    "V1RefundFailedError",
    "__version__",
    "alembic_include_name",
    "alembic_render_item",
    "api_label",
    "callback_health",
    "callback_outcome_label",
    "callback_rejected",
    "callbacks_silent",
    "cancel_checkout",
    "check_callback_health",
    "checkout_cancelled",
    "checkout_created",
    "checkout_expired",
    "checkout_flagged",
    "clear_payment_plan_cache",
    "configure_sqlite",
    "create_all_safely",
    "create_checkout",
    "database_unavailable",
    "deliver_due",
    "describe_detail",
    "format_instalment_hint",
    "format_money",
    "format_plain",
    "format_time",
    "fulfilment_failed",
    "get_state",
    "install",
    "is_available",
    "is_database_outage",
    "is_missing_schema",
    "open_checkouts",
    "payment_after_close",
    "payment_confirmed",
    "payment_limits",
    "payment_plan",
    "reconcile",
    "redeliver",
    "refresh",
    "refund",
    "refund_state_label",
    "refund_succeeded",
    "register_metrics",
    "reopen_account",
    "retire_account",
    "retry_refund",
    "scheduled_check",
    "settings_drift_repaired",
    "settings_under_attack",
    "setup_warnings",
    "sign",
    "source_label",
    "start_checkout",
    "status_label",
    "tables_missing",
    "update_checkout",
    "utcnow",
    "verify",
    "viewed_account",
]


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'flask_gateway' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # loaded once
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
