"""The extension's tables, all prefixed ``gateway_``.

They live on their own ``MetaData`` (``GatewayBase.metadata``). ``Gateway.init_app`` adds them to the app's
Flask-SQLAlchemy metadata, so ``db.create_all()`` and Flask-Migrate's autogenerate see them like the app's
own tables; ``flask gateway init-db`` creates just these. Free text that came from outside (a callback's
body, the gateway's error, a status as reported) is in ``StoredText`` columns: stored, and held by the
objects, as every backend can keep it (``flask_gateway.core.sql``).
"""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, ClassVar, Final

from sqlalchemy import JSON, BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from flask_gateway.core.sql import StoredText, UTCDateTime, hold_as_stored

__all__ = [
    "REFERENCE_LENGTH",
    "STATUS_LENGTH",
    "CallbackLog",
    "CheckoutEvent",
    "GatewayBase",
    "GatewayCheckout",
    "Installation",
    "JobRun",
    "LocalStatus",
    "OutboxEvent",
    "OutboxState",
    "RateLimitCounter",
    "RefundRecord",
    "RefundState",
    "SettingsIncident",
    "VerifyingKey",
]


#: The status columns (``GatewayCheckout.status``, ``CheckoutEvent.from_status`` / ``to_status``).
STATUS_LENGTH: Final = 40
#: ``GatewayCheckout.order_reference``: the gateway's limit for the order reference too.
REFERENCE_LENGTH: Final = 255


class GatewayBase(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


#: Free text from outside (``StoredText`` columns) is held as stored from assignment on.
hold_as_stored(GatewayBase)


class LocalStatus(enum.StrEnum):
    """Statuses only the merchant side has (the rest are the gateway's ``CheckoutStatus`` values)."""

    #: Saved with its requestId, before the create request was sent (or while its outcome is unknown).
    CREATING = "CREATING"
    #: The create request failed for good (the gateway refused it); nothing exists on the gateway.
    FAILED = "FAILED"


class Installation(GatewayBase):
    """One merchant account installed in this shop for one environment (docs/extension.md, "Several
    merchant accounts").

    A shop with one account has one row. Each account keeps its own keys, callback URL, e-mail and limits;
    a checkout records its account and is always handled with that account's keys, retired or not.
    """

    __tablename__ = "gateway_installations"
    __table_args__ = (
        # One row per account and environment: installing an account again updates its row.
        Index("ux_gateway_installations_account", "environment", "merchant_account_id", unique=True),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    environment: Mapped[str] = mapped_column(String(20))
    merchant_account_id: Mapped[str] = mapped_column(String(255))
    #: Fernet tokens (flask_gateway.secrets): never the plain secrets.
    api_key_encrypted: Mapped[str] = mapped_column(Text)
    signing_key_encrypted: Mapped[str] = mapped_column(Text)
    #: The signing key the current one replaced (a settings update answered a new one), encrypted, and
    #: when: it still verifies callbacks for ``GATEWAY_PREVIOUS_SIGNING_KEY_HOURS`` after that (callbacks
    #: the gateway signed before the change, and their retries). None: no change since installation.
    previous_signing_key_encrypted: Mapped[str | None] = mapped_column(Text)
    signing_key_replaced_at: Mapped[datetime | None]
    callback_url: Mapped[str] = mapped_column(String(2048))
    callback_failures_email: Mapped[str | None] = mapped_column(String(254))
    minimum_cents: Mapped[int] = mapped_column(BigInteger)
    maximum_cents: Mapped[int] = mapped_column(BigInteger)
    installed_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    #: The last comparison of the gateway's settings with these (``flask_gateway.operations.drift``):
    #: when, and what differed (a list of ``{"setting", "shop", "gateway"}``; empty when they agreed).
    settings_checked_at: Mapped[datetime | None]
    settings_drift: Mapped[list[dict[str, Any]] | None] = mapped_column(JSON)
    #: Closed for new checkouts since then (None: open). Its open checkouts, refunds and callbacks go on.
    retired_at: Mapped[datetime | None]

    @property
    def retired(self) -> bool:
        return self.retired_at is not None


class GatewayCheckout(GatewayBase):
    """The local, truthful record of one checkout (v2 or v1) for one shop order."""

    __tablename__ = "gateway_checkouts"
    __table_args__ = (
        Index("ix_gateway_checkouts_status_updated", "status", "updated_at"),
        Index("ix_gateway_checkouts_reference", "order_reference"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    api_version: Mapped[str] = mapped_column(String(2), default="v2")
    order_reference: Mapped[str] = mapped_column(String(REFERENCE_LENGTH))
    #: The idempotency key of the create request, saved before the first attempt.
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    #: v2 checkoutToken or v1 token; unknown until the gateway answered.
    token: Mapped[str | None] = mapped_column(String(255), unique=True)
    merchant_account_id: Mapped[str] = mapped_column(String(255))
    status: Mapped[str] = mapped_column(String(STATUS_LENGTH), default=LocalStatus.CREATING)
    total_cents: Mapped[int] = mapped_column(BigInteger)
    paid_cents: Mapped[int] = mapped_column(BigInteger, default=0)
    refunded_cents: Mapped[int] = mapped_column(BigInteger, default=0)
    payment_url: Mapped[str | None] = mapped_column(String(2048))
    #: What was sent: the order (items, customer, addresses), for updates and for the admin.
    order: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    expires_at: Mapped[datetime | None]
    paid_at: Mapped[datetime | None]
    #: Set once, when the payment-confirmed signal fired: the shop fulfils exactly once.
    payment_confirmed_at: Mapped[datetime | None]
    last_callback_at: Mapped[datetime | None]
    last_polled_at: Mapped[datetime | None]
    #: Something did not add up (amount or account mismatch): never paid automatically.
    flagged: Mapped[bool] = mapped_column(Boolean, default=False)
    flag_reason: Mapped[str | None] = mapped_column(Text)
    #: v1: how the consumer left (CANCELLED or ABANDONED), recorded distinctly.
    fail_reason: Mapped[str | None] = mapped_column(String(20))

    events: Mapped[list[CheckoutEvent]] = relationship(
        back_populates="checkout", order_by="CheckoutEvent.id", cascade="all, delete-orphan"
    )

    @property
    def failed(self) -> bool:
        """The gateway refused to create this checkout: nothing exists there, the order needs a new one."""
        return self.status == LocalStatus.FAILED

    refunds: Mapped[list[RefundRecord]] = relationship(
        back_populates="checkout", order_by="RefundRecord.id", cascade="all, delete-orphan"
    )


class CheckoutEvent(GatewayBase):
    """One line of a checkout's timeline: what was learnt, from where, and what it changed."""

    __tablename__ = "gateway_checkout_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    checkout_id: Mapped[int] = mapped_column(
        ForeignKey("gateway_checkouts.id", ondelete="CASCADE"), index=True
    )
    at: Mapped[datetime]
    #: callback, return, v1, poll, reconcile, admin, create, update, cancel, refund
    source: Mapped[str] = mapped_column(String(20))
    from_status: Mapped[str | None] = mapped_column(String(STATUS_LENGTH))
    #: As reported (a status this version does not know is recorded too, as the column holds it).
    to_status: Mapped[str | None] = mapped_column(StoredText(STATUS_LENGTH))
    applied: Mapped[bool] = mapped_column(Boolean, default=True)
    detail: Mapped[str] = mapped_column(StoredText(), default="")

    checkout: Mapped[GatewayCheckout] = relationship(back_populates="events")


class RefundState(enum.StrEnum):
    PENDING = "PENDING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


class RefundRecord(GatewayBase):
    """A refund, saved with its requestId before the first request (reused on every retry)."""

    __tablename__ = "gateway_refunds"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    checkout_id: Mapped[int] = mapped_column(
        ForeignKey("gateway_checkouts.id", ondelete="CASCADE"), index=True
    )
    request_id: Mapped[str] = mapped_column(String(64), unique=True)
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    reason: Mapped[str] = mapped_column(Text, default="")
    state: Mapped[str] = mapped_column(String(20), default=RefundState.PENDING)
    #: The gateway's error text, or why no answer came.
    error: Mapped[str | None] = mapped_column(StoredText())
    created_at: Mapped[datetime]
    completed_at: Mapped[datetime | None]

    checkout: Mapped[GatewayCheckout] = relationship(back_populates="refunds")


class CallbackOutcome(enum.StrEnum):
    """``CallbackLog.outcome`` values."""

    #: Stored, not processed yet (a row left so means the processing died).
    RECEIVED = "received"
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    IGNORED = "ignored"
    MISMATCH = "mismatch"
    #: Correctly signed, but getstatus does not say the same: a claim the gateway does not back (HTTP 200).
    UNCONFIRMED = "unconfirmed"
    #: Correctly signed, but the gateway could not be asked to confirm it (HTTP 503: the gateway retries).
    CONFIRM_FAILED = "confirm-failed"
    REJECTED_SIGNATURE = "rejected-signature"
    UNKNOWN_CHECKOUT = "unknown-checkout"
    INVALID_BODY = "invalid-body"
    TOO_LARGE = "too-large"
    ERROR = "error"
    #: ``flask gateway doctor``'s own probe (unsigned, marked with a key derived from ``SECRET_KEY``):
    #: answered 401 as any unsigned request, never counted as a refused callback.
    DOCTOR_PROBE = "doctor-probe"


class VerifyingKey(enum.StrEnum):
    """``CallbackLog.verified_with`` values: which of the account's signing keys verified a callback."""

    CURRENT = "current"
    #: The key a settings update replaced, inside ``GATEWAY_PREVIOUS_SIGNING_KEY_HOURS`` of the change.
    PREVIOUS = "previous"


class CallbackLog(GatewayBase):
    """Every callback received: a verified one in full (headers without secrets, raw body), stored before
    it is processed; a refused one as a bounded excerpt (``flask_gateway.inbound``)."""

    __tablename__ = "gateway_callback_log"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    received_at: Mapped[datetime] = mapped_column(index=True)
    checkout_id: Mapped[int | None] = mapped_column(ForeignKey("gateway_checkouts.id", ondelete="SET NULL"))
    merchant_account_id: Mapped[str | None] = mapped_column(String(255))
    headers: Mapped[dict[str, Any]]
    body: Mapped[str] = mapped_column(StoredText())
    verified: Mapped[bool] = mapped_column(Boolean, default=False)
    #: A ``CallbackOutcome`` value.
    outcome: Mapped[str] = mapped_column(String(40))
    http_status: Mapped[int]
    detail: Mapped[str] = mapped_column(StoredText(), default="")
    #: The address the request came from (``request.remote_addr``: put ProxyFix in front behind a proxy).
    client_address: Mapped[str | None] = mapped_column(String(64))
    #: Which of the account's signing keys verified it (a ``VerifyingKey`` value). None: not verified.
    verified_with: Mapped[str | None] = mapped_column(String(20))


class RateLimitCounter(GatewayBase):
    """One fixed-window counter of ``flask_gateway.operations.ratelimit.DatabaseStorage`` (shared by every
    process)."""

    __tablename__ = "gateway_rate_limits"

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    count: Mapped[int] = mapped_column(BigInteger)
    #: Seconds since the epoch (``time.time()``) when this window ends.
    expires_at: Mapped[float] = mapped_column(Float, index=True)


class OutboxState(enum.StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    #: Every attempt failed (``GATEWAY_OUTBOX_MAX_ATTEMPTS``): a person decides (``/gateway/admin/outbox``).
    DEAD = "dead"


class OutboxEvent(GatewayBase):
    """An event for the shop's code (a signal), written in the same transaction as the change it reports
    and delivered at least once (``flask_gateway.payments.outbox``)."""

    __tablename__ = "gateway_outbox"
    __table_args__ = (Index("ix_gateway_outbox_due", "state", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    checkout_id: Mapped[int] = mapped_column(
        ForeignKey("gateway_checkouts.id", ondelete="CASCADE"), index=True
    )
    #: The signal's name in ``flask_gateway.signals`` (``payment_confirmed``, ``refund_succeeded``, ...).
    kind: Mapped[str] = mapped_column(String(40))
    #: The signal's keyword arguments besides ``checkout`` (a refund as its id), as JSON.
    payload: Mapped[dict[str, Any]]
    #: An ``OutboxState`` value.
    state: Mapped[str] = mapped_column(String(20), default=OutboxState.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[datetime]
    next_attempt_at: Mapped[datetime]
    #: Taken by a delivery until then (real time): no other process delivers it meanwhile.
    claimed_until: Mapped[datetime | None]
    delivered_at: Mapped[datetime | None]
    #: What the last failed attempt raised (type and message).
    last_error: Mapped[str | None] = mapped_column(StoredText())

    checkout: Mapped[GatewayCheckout] = relationship()


class JobRun(GatewayBase):
    """The heartbeat of one background job (``flask_gateway.payments.heartbeats``): one row per job
    (``deliver``, ``reconcile``), updated in place by every run of any process on any machine."""

    __tablename__ = "gateway_job_runs"

    job: Mapped[str] = mapped_column(String(40), primary_key=True)
    #: When the last run began (a run still going, or one that died, began after the last finish).
    last_started_at: Mapped[datetime | None]
    last_finished_at: Mapped[datetime | None]
    last_succeeded_at: Mapped[datetime | None]
    #: ``ok`` or ``failed`` (it raised, or its report has errors); None before the first run finished.
    last_outcome: Mapped[str | None] = mapped_column(String(20))
    #: What the last finished run said, in one line.
    last_summary: Mapped[str | None] = mapped_column(StoredText())
    #: The machine and process of the last run (started or finished).
    host: Mapped[str | None] = mapped_column(String(255))
    pid: Mapped[int | None] = mapped_column(Integer)
    #: Finished runs, and those of them that failed, since the row was written.
    runs: Mapped[int] = mapped_column(BigInteger, default=0)
    failures: Mapped[int] = mapped_column(BigInteger, default=0)


class SettingsIncident(GatewayBase):
    """One setting of a merchant account found changed at the gateway behind the shop's back
    (``flask_gateway.operations.drift``): what the gateway had, what the shop has, when it was found, whether
    the shop put its own back, and whether a person has acknowledged it (until then every admin page shows
    it)."""

    __tablename__ = "gateway_settings_incidents"
    __table_args__ = (
        Index("ix_gateway_settings_incidents_open", "environment", "acknowledged_at"),
        Index("ix_gateway_settings_incidents_setting", "merchant_account_id", "setting", "found_at"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    environment: Mapped[str] = mapped_column(String(20))
    merchant_account_id: Mapped[str] = mapped_column(String(255))
    #: Which setting: ``callback URL``, ``failure e-mail``, ``minimum amount (cents)``, ``maximum amount
    #: (cents)``.
    setting: Mapped[str] = mapped_column(String(40))
    #: The gateway's value when found (someone else's: shown escaped, never trusted), and the shop's.
    foreign_value: Mapped[str | None] = mapped_column(StoredText())
    our_value: Mapped[str | None] = mapped_column(StoredText())
    #: ``repaired`` (the shop's value put back), ``repair-failed`` (the gateway refused or could not be
    #: reached: tried again at the next check), ``attack`` (diverted again after a repair: not repaired
    #: until a person acknowledges).
    outcome: Mapped[str] = mapped_column(String(20))
    found_at: Mapped[datetime]
    #: The last check that still found the foreign value (an attack is not repaired: it stays diverted).
    last_seen_at: Mapped[datetime]
    repaired_at: Mapped[datetime | None]
    #: Why the repair failed (the gateway's error, one line).
    detail: Mapped[str | None] = mapped_column(StoredText())
    acknowledged_at: Mapped[datetime | None]
    acknowledged_by: Mapped[str | None] = mapped_column(StoredText(255))
