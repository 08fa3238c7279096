"""The emulator's tables (prefixed ``emulator_``, so they can share a database with a shop)."""

from __future__ import annotations

import enum
from datetime import datetime
from typing import Any, ClassVar

from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import JSON, BigInteger, Boolean, ForeignKey, Index, Integer, String, Text, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

from flask_gateway.core.sql import UTCDateTime

__all__ = [
    "Account",
    "ApiVersion",
    "Checkout",
    "CheckoutEvent",
    "ClockState",
    "Delivery",
    "DeliveryAttempt",
    "DeliveryKind",
    "DeliveryState",
    "Email",
    "EmulatorBase",
    "FaultRule",
    "IdempotencyKey",
    "Refund",
    "db",
]


class EmulatorBase(DeclarativeBase):
    type_annotation_map: ClassVar[dict[Any, Any]] = {datetime: UTCDateTime(), dict[str, Any]: JSON()}


# Models are plain SQLAlchemy 2 classes (fully typed); Flask-SQLAlchemy provides the session and engine.
db = SQLAlchemy(metadata=EmulatorBase.metadata)


class ApiVersion(enum.IntEnum):
    V1 = 1
    V2 = 2


class Account(EmulatorBase):
    """A merchant account "issued by the account manager", and its installation."""

    __tablename__ = "emulator_accounts"

    merchant_account_id: Mapped[str] = mapped_column(String(255), primary_key=True)
    api_key: Mapped[str] = mapped_column(String(255))
    cancel_callbacks: Mapped[bool] = mapped_column(Boolean, default=False)
    installed_at: Mapped[datetime | None]
    signing_key: Mapped[str | None] = mapped_column(String(255))
    callback_url: Mapped[str | None] = mapped_column(String(2048))
    callback_failures_email: Mapped[str | None] = mapped_column(String(254))
    minimum_cents: Mapped[int] = mapped_column(BigInteger, default=0)
    maximum_cents: Mapped[int] = mapped_column(BigInteger, default=10**12)

    @property
    def installed(self) -> bool:
        return self.installed_at is not None


class Checkout(EmulatorBase):
    """A v2 or v1 checkout. ``id`` doubles as the gateway's own order number (status payload)."""

    __tablename__ = "emulator_checkouts"
    __table_args__ = (Index("ix_emulator_checkouts_due", "status", "expires_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    token: Mapped[str] = mapped_column(String(255), unique=True)
    account_id: Mapped[str] = mapped_column(ForeignKey("emulator_accounts.merchant_account_id"), index=True)
    api_version: Mapped[int] = mapped_column(Integer, default=ApiVersion.V2)
    status: Mapped[str] = mapped_column(String(40))
    request_id: Mapped[str | None] = mapped_column(String(255))
    total_cents: Mapped[int] = mapped_column(BigInteger)
    merchant_order_reference: Mapped[str] = mapped_column(String(255))
    click_trace_id: Mapped[str | None] = mapped_column(String(255))
    #: The stored order details: the v2 order details object, or the v1 ``{customer, order}`` body.
    details: Mapped[dict[str, Any]]
    created_at: Mapped[datetime]
    updated_at: Mapped[datetime]
    expires_at: Mapped[datetime]
    cancelled_at: Mapped[datetime | None]
    paid_at: Mapped[datetime | None]
    payment_reference: Mapped[int | None] = mapped_column(BigInteger)
    refunded_cents: Mapped[int] = mapped_column(BigInteger, default=0)
    last_callback_attempted_at: Mapped[datetime | None]
    last_callback_status_message: Mapped[str | None] = mapped_column(String(255))

    events: Mapped[list[CheckoutEvent]] = relationship(
        back_populates="checkout", order_by="CheckoutEvent.id", cascade="all, delete-orphan"
    )
    refunds: Mapped[list[Refund]] = relationship(
        back_populates="checkout", order_by="Refund.id", cascade="all, delete-orphan"
    )


class CheckoutEvent(EmulatorBase):
    """The timeline of a checkout, for the dashboard."""

    __tablename__ = "emulator_checkout_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    checkout_id: Mapped[int] = mapped_column(
        ForeignKey("emulator_checkouts.id", ondelete="CASCADE"), index=True
    )
    at: Mapped[datetime]
    kind: Mapped[str] = mapped_column(String(40))
    detail: Mapped[str] = mapped_column(Text, default="")

    checkout: Mapped[Checkout] = relationship(back_populates="events")


class Refund(EmulatorBase):
    __tablename__ = "emulator_refunds"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    checkout_id: Mapped[int] = mapped_column(
        ForeignKey("emulator_checkouts.id", ondelete="CASCADE"), index=True
    )
    request_id: Mapped[str | None] = mapped_column(String(255))
    amount_cents: Mapped[int] = mapped_column(BigInteger)
    reference: Mapped[str] = mapped_column(String(255))
    description: Mapped[str] = mapped_column(Text, default="")
    at: Mapped[datetime]

    checkout: Mapped[Checkout] = relationship(back_populates="refunds")


class IdempotencyKey(EmulatorBase):
    """(account, operation, requestId) -> the stored answer. The unique constraint is the lock."""

    __tablename__ = "emulator_idempotency_keys"
    __table_args__ = (UniqueConstraint("account_id", "operation", "request_id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    account_id: Mapped[str] = mapped_column(String(255))
    operation: Mapped[str] = mapped_column(String(40))
    request_id: Mapped[str] = mapped_column(String(255))
    body_hash: Mapped[str] = mapped_column(String(64))
    completed: Mapped[bool] = mapped_column(Boolean, default=False)
    status_code: Mapped[int | None]
    response_body: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime]


class DeliveryKind(enum.StrEnum):
    #: The signed v2 status callback (POST).
    CALLBACK = "callback"
    #: The v1 fail URL called with ``reason=ABANDONED`` when a v1 order expires (GET).
    V1_ABANDONED = "v1_abandoned"


class DeliveryState(enum.StrEnum):
    PENDING = "pending"
    DELIVERED = "delivered"
    DEAD = "dead"


class Delivery(EmulatorBase):
    """The outbox: one row per message to the merchant, with its attempts."""

    __tablename__ = "emulator_deliveries"
    __table_args__ = (Index("ix_emulator_deliveries_due", "state", "next_attempt_at"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    checkout_id: Mapped[int] = mapped_column(
        ForeignKey("emulator_checkouts.id", ondelete="CASCADE"), index=True
    )
    kind: Mapped[str] = mapped_column(String(20), default=DeliveryKind.CALLBACK)
    url: Mapped[str] = mapped_column(String(2048))
    state: Mapped[str] = mapped_column(String(20), default=DeliveryState.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime]
    #: Set while a worker holds the row (between claiming it and recording the attempt).
    claimed_until: Mapped[datetime | None]
    created_at: Mapped[datetime]
    last_status_message: Mapped[str | None] = mapped_column(String(255))

    attempt_log: Mapped[list[DeliveryAttempt]] = relationship(
        back_populates="delivery", order_by="DeliveryAttempt.id", cascade="all, delete-orphan"
    )
    checkout: Mapped[Checkout] = relationship()


class DeliveryAttempt(EmulatorBase):
    __tablename__ = "emulator_delivery_attempts"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    delivery_id: Mapped[int] = mapped_column(
        ForeignKey("emulator_deliveries.id", ondelete="CASCADE"), index=True
    )
    number: Mapped[int]
    at: Mapped[datetime]
    #: The URL as called: a v1 notice adds its query to the order's fail URL (up to 2048 characters itself).
    url: Mapped[str] = mapped_column(Text)
    request_body: Mapped[str] = mapped_column(Text)
    http_status: Mapped[int | None]
    message: Mapped[str] = mapped_column(String(255))
    ok: Mapped[bool] = mapped_column(Boolean)
    duration_ms: Mapped[int] = mapped_column(Integer, default=0)

    delivery: Mapped[Delivery] = relationship(back_populates="attempt_log")


class Email(EmulatorBase):
    """The e-mail outbox (callback failure notices); also sent over SMTP when configured."""

    __tablename__ = "emulator_emails"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[datetime]
    account_id: Mapped[str] = mapped_column(String(255))
    to: Mapped[str] = mapped_column(String(254))
    subject: Mapped[str] = mapped_column(String(255))
    body: Mapped[str] = mapped_column(Text)
    smtp_result: Mapped[str | None] = mapped_column(String(255))


class FaultRule(EmulatorBase):
    """An injected fault; ``remaining`` counts down (None: until removed)."""

    __tablename__ = "emulator_faults"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    operation: Mapped[str] = mapped_column(String(40))
    kind: Mapped[str] = mapped_column(String(40))
    status: Mapped[int | None]
    retry_after: Mapped[int | None]
    delay_ms: Mapped[int | None]
    remaining: Mapped[int | None]
    created_at: Mapped[datetime]


class ClockState(EmulatorBase):
    """The test clock: one row holding how far the emulator's time is ahead of the real time."""

    __tablename__ = "emulator_clock"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    offset_seconds: Mapped[float] = mapped_column(default=0.0)
