"""The shop's orders, and how they follow the gateway: the extension's signals move an order's status.

An order is created when the shopper submits the checkout form (status ``processing``) and changes only
through the functions here, each a conditional update, so a repeated or late event never changes an order
twice:

================================  ===========================================================================
``payment_confirmed``             ``paid`` and fulfilled, once (whatever the order's status was: money taken)
``checkout_cancelled``            ``cancelled``, only while the order is still ``processing``
``checkout_expired``              ``expired``, only while the order is still ``processing``
``refund_succeeded``              ``partially-refunded`` or ``refunded``, with the refunded amount
================================  ===========================================================================

The extension delivers each event at least once, through its outbox: a receiver that raised is called again
later (``flask gateway deliver``), with the same ``event_id``; the conditional updates make a repeat
harmless. Events may then arrive out of order (a refund before the payment it refunds, when the payment's
delivery failed first): the payment's receiver also takes the refunded total from the checkout it is
given. :func:`sync_with_gateway` is the safety net beside that: pages that show an order bring it up to
date from the checkout record, whatever the deliveries did.
"""

from __future__ import annotations

import enum
import logging
import re
import secrets
from datetime import datetime
from typing import Any, Final

from flask import Flask
from sqlalchemy import JSON, BigInteger, ForeignKey, Integer, String, Text, select, update
from sqlalchemy.orm import Mapped, mapped_column, relationship

from example_shop.extensions import db
from flask_gateway import (
    CheckoutStatus,
    GatewayCheckout,
    UTCDateTime,
    checkout_cancelled,
    checkout_expired,
    format_money,
    payment_confirmed,
    refund_succeeded,
    status_label,
    utcnow,
)

__all__ = [
    "EXTENSION_KEY",
    "Order",
    "OrderEvent",
    "OrderStatus",
    "connect_signals",
    "is_reference",
    "latest_checkout",
    "mark_closed",
    "mark_paid",
    "mark_refunded",
    "new_reference",
    "record",
    "sync_with_gateway",
    "utcnow",
]

log = logging.getLogger("example_shop.orders")

#: ``app.extensions`` key marking an app as this shop: the receivers ignore signals from other apps.
EXTENSION_KEY: Final = "example_shop"
_REFERENCE_ALPHABET: Final = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"  # Crockford: no I, L, O, U


class OrderStatus(enum.StrEnum):
    """What the shopper and the owner see (also the value of ``data-payment-status``)."""

    PROCESSING = "processing"
    PAID = "paid"
    CANCELLED = "cancelled"
    EXPIRED = "expired"
    PARTIALLY_REFUNDED = "partially-refunded"
    REFUNDED = "refunded"

    @property
    def label(self) -> str:
        return _LABELS[self]


_LABELS: Final = {
    OrderStatus.PROCESSING: "Processing",
    OrderStatus.PAID: "Paid",
    OrderStatus.CANCELLED: "Cancelled",
    OrderStatus.EXPIRED: "Expired",
    OrderStatus.PARTIALLY_REFUNDED: "Partly refunded",
    OrderStatus.REFUNDED: "Refunded",
}


_REFERENCE: Final = re.compile(r"STP-[0-9A-Z]{8}")


def is_reference(text: str) -> bool:
    """Whether ``text`` has the shape of an order reference (checked before it reaches a query)."""
    return _REFERENCE.fullmatch(text) is not None


def new_reference() -> str:
    """``STP-7K3M9QX2``: short, unambiguous when read aloud, and not guessable."""
    return "STP-" + "".join(secrets.choice(_REFERENCE_ALPHABET) for _ in range(8))


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "shop_orders"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    reference: Mapped[str] = mapped_column(String(20), unique=True)
    status: Mapped[str] = mapped_column(String(20), default=OrderStatus.PROCESSING.value)
    #: The API version of the checkout (``GATEWAY_API_VERSION`` when the order was placed).
    api_version: Mapped[str] = mapped_column(String(2))
    #: ``[{slug, sku, name, quantity, unit_price_cents, image}]``: the cart as it was bought.
    lines: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    subtotal_cents: Mapped[int] = mapped_column(BigInteger)
    shipping_cents: Mapped[int] = mapped_column(BigInteger, default=0)
    total_cents: Mapped[int] = mapped_column(BigInteger)
    refunded_cents: Mapped[int] = mapped_column(BigInteger, default=0)
    first_name: Mapped[str] = mapped_column(String(60))
    last_name: Mapped[str] = mapped_column(String(60))
    email: Mapped[str] = mapped_column(String(254))
    #: E.164, e.g. ``+27821234567``.
    phone: Mapped[str] = mapped_column(String(20))
    #: ``{line1, line2, city, province, postal_code}``
    billing_address: Mapped[dict[str, str]] = mapped_column(JSON)
    shipping_address: Mapped[dict[str, str]] = mapped_column(JSON)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime())
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime())
    paid_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    #: Set together with ``paid_at``, exactly once: the order goes to packing.
    fulfilled_at: Mapped[datetime | None] = mapped_column(UTCDateTime())
    closed_at: Mapped[datetime | None] = mapped_column(UTCDateTime())

    events: Mapped[list[OrderEvent]] = relationship(
        back_populates="order", order_by="OrderEvent.id", cascade="all, delete-orphan"
    )

    @property
    def state(self) -> OrderStatus:
        return OrderStatus(self.status)

    @property
    def customer_name(self) -> str:
        return f"{self.first_name} {self.last_name}"

    @property
    def item_count(self) -> int:
        return sum(int(line["quantity"]) for line in self.lines)

    @property
    def refundable_cents(self) -> int:
        return self.total_cents - self.refunded_cents if self.paid_at is not None else 0


class OrderEvent(db.Model):  # type: ignore[name-defined,misc]
    """The order's history, shown to the owner: placed, checkout started, paid, refunded, ..."""

    __tablename__ = "shop_order_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("shop_orders.id", ondelete="CASCADE"), index=True)
    at: Mapped[datetime] = mapped_column(UTCDateTime())
    #: placed, checkout, paid, cancelled, expired, refund, note
    kind: Mapped[str] = mapped_column(String(20))
    detail: Mapped[str] = mapped_column(Text, default="")

    order: Mapped[Order] = relationship(back_populates="events")


def record(order_id: int, kind: str, detail: str = "") -> None:
    db.session.add(OrderEvent(order_id=order_id, at=utcnow(), kind=kind, detail=detail))


def _order_id(reference: str) -> int | None:
    found: int | None = db.session.scalar(select(Order.id).where(Order.reference == reference))
    return found


def mark_paid(reference: str, source: str) -> bool:
    """Mark the order paid and fulfil it, once; True only for the call that did it."""
    order_id = _order_id(reference)
    if order_id is None:
        return False
    now = utcnow()
    changed = db.session.execute(
        update(Order)
        .where(Order.id == order_id, Order.paid_at.is_(None))
        .values(status=OrderStatus.PAID.value, paid_at=now, fulfilled_at=now, closed_at=None, updated_at=now)
        .execution_options(synchronize_session="fetch")
    )
    if changed.rowcount != 1:  # type: ignore[attr-defined]
        db.session.commit()
        return False
    record(order_id, "paid", f"payment confirmed ({source}); sent to packing")
    db.session.commit()
    log.info("order %s paid (%s): fulfilled", reference, source)
    return True


def mark_closed(reference: str, status: OrderStatus, detail: str) -> bool:
    """``cancelled`` or ``expired``, only while the order is still waiting for its payment."""
    order_id = _order_id(reference)
    if order_id is None:
        return False
    now = utcnow()
    changed = db.session.execute(
        update(Order)
        .where(
            Order.id == order_id,
            Order.status == OrderStatus.PROCESSING.value,
            Order.paid_at.is_(None),
        )
        .values(status=status.value, closed_at=now, updated_at=now)
        .execution_options(synchronize_session="fetch")
    )
    if changed.rowcount == 1:  # type: ignore[attr-defined]
        record(order_id, status.value, detail)
    db.session.commit()
    return bool(changed.rowcount == 1)  # type: ignore[attr-defined]


def mark_refunded(reference: str, refunded_cents: int, detail: str) -> bool:
    """Mirror the refunded total (it only grows): ``partially-refunded`` or ``refunded``."""
    order = db.session.scalar(select(Order).where(Order.reference == reference))
    if order is None or order.paid_at is None or refunded_cents <= order.refunded_cents:
        db.session.commit()
        return False
    order.refunded_cents = refunded_cents
    order.status = (
        OrderStatus.REFUNDED.value
        if refunded_cents >= order.total_cents
        else OrderStatus.PARTIALLY_REFUNDED.value
    )
    order.updated_at = utcnow()
    record(order.id, "refund", detail)
    db.session.commit()
    return True


def latest_checkout(reference: str) -> GatewayCheckout | None:
    """The gateway checkout of an order (the newest, should the order have several)."""
    checkout: GatewayCheckout | None = db.session.scalars(
        select(GatewayCheckout)
        .where(GatewayCheckout.order_reference == reference)
        .order_by(GatewayCheckout.id.desc())
        .limit(1)
    ).first()
    return checkout


_CANCELLED: Final = frozenset({CheckoutStatus.CANCELLED_BY_CONSUMER, CheckoutStatus.CANCELLED_BY_MERCHANT})
_REFUNDED_UNPAID: Final = (
    "refunded in full at the gateway before the payment was confirmed here: not fulfilled; the gateway "
    "record is flagged for review"
)


def sync_with_gateway(order: Order) -> Order:
    """Catch up with what the extension recorded, should a signal receiver have failed.

    Reads the extension's checkout record only (no request to the gateway). Returns the order as stored.
    """
    checkout = latest_checkout(order.reference)
    if checkout is None:
        return order
    reference = order.reference
    if checkout.payment_confirmed_at is not None and order.paid_at is None:
        mark_paid(reference, "caught up from the gateway record")
    if checkout.refunded_cents > order.refunded_cents:
        mark_refunded(reference, checkout.refunded_cents, "refund caught up from the gateway record")
    if order.state is OrderStatus.PROCESSING and order.paid_at is None:
        if checkout.status == CheckoutStatus.FULLY_REFUNDED and checkout.payment_confirmed_at is None:
            mark_closed(reference, OrderStatus.REFUNDED, _REFUNDED_UNPAID)
        elif checkout.status in _CANCELLED:
            said = status_label(checkout.status)
            mark_closed(
                reference, OrderStatus.CANCELLED, f"the gateway says {said.text.lower()} ({said.code})"
            )
        elif checkout.status == CheckoutStatus.EXPIRED:
            mark_closed(reference, OrderStatus.EXPIRED, "checkout expired")
    current: Order = db.session.get_one(Order, order.id, populate_existing=True)
    return current


# --- the extension's signals -----------------------------------------------------------------------------


def _ours(sender: object) -> bool:
    """Signals are global: act only on those sent by an app running this shop."""
    return isinstance(sender, Flask) and EXTENSION_KEY in sender.extensions


def on_payment_confirmed(sender: object, checkout: GatewayCheckout, source: str, **extra: object) -> None:
    if _ours(sender):
        mark_paid(checkout.order_reference, source)
        if checkout.refunded_cents > 0:  # a refund whose event came first, while the order was not paid
            mark_refunded(
                checkout.order_reference,
                checkout.refunded_cents,
                f"refunded {format_money(checkout.refunded_cents)} in all (caught up with the payment)",
            )


def on_checkout_cancelled(
    sender: object, checkout: GatewayCheckout, status: str, source: str, **extra: object
) -> None:
    if _ours(sender):
        who = "the shopper" if status == CheckoutStatus.CANCELLED_BY_CONSUMER else "the shop"
        mark_closed(checkout.order_reference, OrderStatus.CANCELLED, f"cancelled by {who} ({source})")


def on_checkout_expired(sender: object, checkout: GatewayCheckout, source: str, **extra: object) -> None:
    if _ours(sender):
        mark_closed(checkout.order_reference, OrderStatus.EXPIRED, f"checkout expired unpaid ({source})")


def on_refund_succeeded(
    sender: object, checkout: GatewayCheckout, refund: Any, amount_cents: int, **extra: object
) -> None:
    if _ours(sender):
        reason = getattr(refund, "reason", "") or ""
        detail = f"refunded {format_money(amount_cents)}" + (f": {reason}" if reason else "")
        if not mark_refunded(checkout.order_reference, checkout.refunded_cents, detail) and (
            checkout.payment_confirmed_at is None and checkout.refunded_cents >= checkout.total_cents
        ):
            mark_closed(checkout.order_reference, OrderStatus.REFUNDED, _REFUNDED_UNPAID)


def connect_signals() -> None:
    """Connect the receivers (idempotent: blinker keeps one connection per receiver)."""
    payment_confirmed.connect(on_payment_confirmed)
    checkout_cancelled.connect(on_checkout_cancelled)
    checkout_expired.connect(on_checkout_expired)
    refund_succeeded.connect(on_refund_succeeded)
