"""The front door's names, each with the module that defines it: the one table of what a shop imports from
``flask_gateway``. Type checkers read it as the package's interface; ``__init__.py`` builds the lazy loading,
``__all__`` and ``dir()`` from it at run time (lazy_loader's ``attach_stub``). A name is public when it is
imported here (``from .module import Name as Name``: the ``as`` marks it re-exported)."""

__all__: list[str]  # built from this table at run time

from ._version import __version__ as __version__
from .clock import format_time as format_time
from .core import GatewayClient as GatewayClient, V1Client as V1Client, sign as sign, verify as verify
from .core.errors import (
    AlreadyInstalledError as AlreadyInstalledError,
    AuthenticationError as AuthenticationError,
    CheckoutExpiredError as CheckoutExpiredError,
    ConflictError as ConflictError,
    FirewallRejectedError as FirewallRejectedError,
    FlaskGatewayError as FlaskGatewayError,
    ForbiddenError as ForbiddenError,
    GatewayConnectionError as GatewayConnectionError,
    GatewayError as GatewayError,
    GatewayServerError as GatewayServerError,
    GatewayTimeoutError as GatewayTimeoutError,
    IdempotencyError as IdempotencyError,
    InvalidRequestError as InvalidRequestError,
    InvalidResponseError as InvalidResponseError,
    NotFoundError as NotFoundError,
    PayloadTooLargeError as PayloadTooLargeError,
    RateLimitError as RateLimitError,
    V1RefundFailedError as V1RefundFailedError,
)
from .core.money import format_money as format_money, format_plain as format_plain
from .core.sql import (
    UTCDateTime as UTCDateTime,
    alembic_include_name as alembic_include_name,
    alembic_render_item as alembic_render_item,
    configure_sqlite as configure_sqlite,
    create_all_safely as create_all_safely,
)
from .core.timestamps import utcnow as utcnow
from .core.wire import (
    CHANGEABLE_STATUSES as CHANGEABLE_STATUSES,
    OPEN_STATUSES as OPEN_STATUSES,
    PAID_STATUSES as PAID_STATUSES,
    PAYMENT_STATUSES as PAYMENT_STATUSES,
    REFUNDABLE_STATUSES as REFUNDABLE_STATUSES,
    CheckoutStatus as CheckoutStatus,
)
from .errors import (
    EX_CONFIG as EX_CONFIG,
    CallbackRejected as CallbackRejected,
    CheckoutStateError as CheckoutStateError,
    CheckoutUnavailableError as CheckoutUnavailableError,
    ConfigurationError as ConfigurationError,
    DatabaseUnavailable as DatabaseUnavailable,
    GatewayExtensionError as GatewayExtensionError,
    InvalidOrderError as InvalidOrderError,
    InvalidReturnLink as InvalidReturnLink,
    NotInstalledError as NotInstalledError,
    RefundDeclinedError as RefundDeclinedError,
    RefundNotAllowedError as RefundNotAllowedError,
    SecretUnreadable as SecretUnreadable,
    UnknownAccountError as UnknownAccountError,
    V1OutcomeRejected as V1OutcomeRejected,
)
from .extension import Gateway as Gateway
from .labels import (
    Label as Label,
    api_label as api_label,
    callback_outcome_label as callback_outcome_label,
    describe_detail as describe_detail,
    refund_state_label as refund_state_label,
    source_label as source_label,
    status_label as status_label,
)
from .models import (
    GatewayCheckout as GatewayCheckout,
    LocalStatus as LocalStatus,
    RefundRecord as RefundRecord,
    RefundState as RefundState,
    SettingsIncident as SettingsIncident,
)
from .operations.checks import SetupWarning as SetupWarning, setup_warnings as setup_warnings
from .operations.drift import ScheduledCheck as ScheduledCheck, scheduled_check as scheduled_check
from .operations.health import (
    CallbackHealth as CallbackHealth,
    callback_health as callback_health,
    check_callback_health as check_callback_health,
)
from .operations.metrics import register_metrics as register_metrics
from .operations.outages import (
    DATABASE_ERRORS as DATABASE_ERRORS,
    SCHEMA_ERRORS as SCHEMA_ERRORS,
    database_unavailable as database_unavailable,
    is_database_outage as is_database_outage,
    is_missing_schema as is_missing_schema,
    tables_missing as tables_missing,
)
from .operations.ratelimit import DatabaseStorage as DatabaseStorage
from .operations.reconciliation import ReconcileReport as ReconcileReport, reconcile as reconcile
from .payments.accounts import (
    open_checkouts as open_checkouts,
    reopen_account as reopen_account,
    retire_account as retire_account,
)
from .payments.availability import (
    PaymentLimits as PaymentLimits,
    is_available as is_available,
    payment_limits as payment_limits,
)
from .payments.checkouts import (
    cancel_checkout as cancel_checkout,
    create_checkout as create_checkout,
    start_checkout as start_checkout,
    update_checkout as update_checkout,
)
from .payments.installation import InstallSettings as InstallSettings, install as install
from .payments.orders import (
    Address as Address,
    Customer as Customer,
    OrderDraft as OrderDraft,
    OrderLine as OrderLine,
)
from .payments.outbox import (
    DeliveryReport as DeliveryReport,
    deliver_due as deliver_due,
    redeliver as redeliver,
)
from .payments.plans import (
    PaymentPlan as PaymentPlan,
    clear_payment_plan_cache as clear_payment_plan_cache,
    format_instalment_hint as format_instalment_hint,
    payment_plan as payment_plan,
)
from .payments.polling import refresh as refresh
from .payments.refunds import refund as refund, retry_refund as retry_refund
from .signals import (
    callback_rejected as callback_rejected,
    callbacks_silent as callbacks_silent,
    checkout_cancelled as checkout_cancelled,
    checkout_created as checkout_created,
    checkout_expired as checkout_expired,
    checkout_flagged as checkout_flagged,
    fulfilment_failed as fulfilment_failed,
    payment_after_close as payment_after_close,
    payment_confirmed as payment_confirmed,
    refund_succeeded as refund_succeeded,
    settings_drift_repaired as settings_drift_repaired,
    settings_under_attack as settings_under_attack,
)
from .state import GatewayState as GatewayState, get_state as get_state
from .web.admin.blueprint import viewed_account as viewed_account
