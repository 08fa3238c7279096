"""Which checkout a command was given, and how it shows the checkout to a person.

Every command that takes a checkout (``status``, ``callbacks --checkout``) takes an order reference or a
token alike, found in the shop's own records: a token first, then an order reference in any case when that
names one order (its most recent checkout, saying so when the order has several); ``--account`` narrows
the search to that account. What matches nothing here is one line and exit status 1: the gateway is not
asked about a guess.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from urllib.parse import urlsplit

import click
from sqlalchemy import select

from flask_gateway.core.references import AmbiguousReference, stored_reference
from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.timestamps import format_timestamp, utcnow
from flask_gateway.models import GatewayCheckout
from flask_gateway.state import get_state

__all__ = ["CheckoutNotFound", "Found", "age", "end_reading", "find_checkout", "iso_utc", "payment_page"]


class CheckoutNotFound(click.ClickException):
    """No local checkout has the token or order reference a command was given (exit status 1)."""


@dataclass(frozen=True)
class Found:
    """The checkout a command was given, and what a person should know about the choice."""

    checkout: GatewayCheckout
    #: ``token`` or ``order reference``: what the text given matched.
    matched: str
    #: The order's other checkouts (newest first) when an order reference matched several.
    others: tuple[GatewayCheckout, ...] = ()

    def note(self) -> str | None:
        """One line saying which checkout of an order with several was taken (None: only one)."""
        if not self.others:
            return None
        checkout = self.checkout
        others = ", ".join(other.token or f"#{other.id} (no token)" for other in self.others)
        this = checkout.token or f"#{checkout.id}"
        return (
            f"Order {checkout.order_reference} has {len(self.others) + 1} checkouts: this is the most recent "
            f"({this}); the others: {others} (give a token for one of them)."
        )


def find_checkout(given: str, account: str | None = None) -> Found:
    """The local checkout ``given`` names: its token, else its order reference (the most recent checkout
    of that order); with ``account``, only that account's checkouts. Nothing found: a ``ClickException``
    (one line, exit status 1) naming what was given."""
    session = get_state().session
    text = given.strip()
    # Text no row can hold (U+0000, which PostgreSQL refuses even as a parameter; over a column's length)
    # names nothing: not looked up.
    if text and "\x00" not in text and len(text) <= 255:
        by_token = session.scalars(select(GatewayCheckout).where(GatewayCheckout.token == text)).first()
        if by_token is not None:
            if account is not None and by_token.merchant_account_id != account:
                raise click.ClickException(
                    f"checkout {text} belongs to the merchant account {by_token.merchant_account_id}, not "
                    f"{account}: a checkout is asked about with its own account (leave --account out)."
                )
            return Found(by_token, "token")
        of_account = () if account is None else (GatewayCheckout.merchant_account_id == account,)
        try:
            reference = stored_reference(session, GatewayCheckout.order_reference, text, *of_account)
        except AmbiguousReference as error:
            session.rollback()
            raise CheckoutNotFound(str(error)) from None
        if reference is not None:
            rows = session.scalars(
                select(GatewayCheckout)
                .where(GatewayCheckout.order_reference == reference, *of_account)
                .order_by(GatewayCheckout.created_at.desc(), GatewayCheckout.id.desc())
            ).all()
            return Found(rows[0], "order reference", tuple(rows[1:]))
    shown = given.replace("\x00", "\ufffd")
    shown = shown if len(shown) <= 80 else shown[:77] + "..."
    on = f" of the merchant account {account}" if account is not None else ""
    session.rollback()
    raise CheckoutNotFound(
        f"no checkout{on} has the token or order reference {shown!r} in this shop's database (`flask "
        "gateway checkouts` lists the recent ones); the gateway was not asked."
    )


def end_reading() -> None:
    """End what a command read before it talks to the gateway or waits for a person: no transaction is
    held across either. On SQLite a transaction holds the database's write lock, and an embedded emulator
    answers from the same database in this same process: it would wait for the lock until its busy timeout,
    then answer 503 (and a prompt left open would stop the shop's own writes)."""
    session = get_state().session
    if session.in_transaction():
        commit_keeping_loaded(session)


def payment_page(url: str | None) -> str:
    """The payment page's URL as a person can open it. The real gateway's (and a separate emulator's) is
    its own address, shown as it is. The emulator embedded in the shop answers on the shop's address:
    ``GATEWAY_PUBLIC_URL``'s when it is set; without it the URL is shown as the path it is on the shop,
    never with the ``http://localhost`` a command (outside any request) reaches it at."""
    if not url:
        return "-"
    config = get_state().config
    if config.environment != "embedded":
        return url
    parts = urlsplit(url)
    path = parts.path + (f"?{parts.query}" if parts.query else "")
    if config.public_url:
        public = urlsplit(config.public_url)
        return f"{public.scheme}://{public.netloc}{path}"
    return f"{path} (on the shop's own address: GATEWAY_PUBLIC_URL is not set)"


def iso_utc(value: datetime | None) -> str | None:
    """A stored time for ``--json``: ISO 8601 in UTC (``2026-11-27T11:51:09Z``); a naive one is UTC."""
    if value is None:
        return None
    return format_timestamp(value if value.tzinfo is not None else value.replace(tzinfo=UTC), "s")


def age(value: datetime | None, now: datetime | None = None) -> str:
    """How long ago ``value`` was, as a person says it: ``just now``, ``12 min``, ``3 h 5 min``, ``2 d``."""
    if value is None:
        return "-"
    moment = value if value.tzinfo is not None else value.replace(tzinfo=UTC)
    seconds = int(((now or utcnow()) - moment).total_seconds())
    if seconds < 60:
        return "just now"
    minutes = seconds // 60
    if minutes < 60:
        return f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours and days < 7 else f"{days} d"
