"""Which merchant account a new checkout uses, and closing an account for new checkouts.

A shop with one account never meets this module: its only account is the default. With several
(docs/extension.md, "Several merchant accounts"), a new checkout's account is, in this order: the
``account`` argument; the shop's resolver (``@gateway.account_resolver``, given the order draft, or None
where there is none yet, such as a cart total's availability); the default account, the newest one still
open. The account is recorded on the checkout and never changes: everything after the payment (callbacks,
polling, reconcile, refunds) uses the checkout's own account, even once it is retired.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import func, select

from flask_gateway.core.sql import commit_keeping_loaded
from flask_gateway.core.timestamps import utcnow
from flask_gateway.core.wire import OPEN_STATUSES
from flask_gateway.errors import CheckoutUnavailableError, ConfigurationError
from flask_gateway.models import GatewayCheckout, Installation, LocalStatus
from flask_gateway.state import get_state, leaves_no_transaction

__all__ = ["choose_account", "open_checkouts", "reopen_account", "retire_account"]


def choose_account(draft: Any = None, account: str | None = None) -> Installation:
    """The open installation a new checkout (or a total's availability, limits and plan) uses.

    Raises ``UnknownAccountError`` for an account (given, or answered by the resolver) that is not
    installed, ``CheckoutUnavailableError`` for one that is retired, ``NotInstalledError`` when no account
    is open, ``ConfigurationError`` when the resolver answers something other than an id or None.
    """
    state = get_state()
    chosen = account
    resolver = state.account_choice.resolver
    if chosen is None and resolver is not None:
        answer = resolver(draft)
        if answer is not None and not isinstance(answer, str):
            raise ConfigurationError(
                f"The account resolver answered {type(answer).__name__}: it must answer a merchant "
                "account id (str), or None for the default account."
            )
        chosen = answer or None
    installation = state.require_installation(chosen)
    if installation.retired:
        raise CheckoutUnavailableError(
            f"The merchant account {installation.merchant_account_id!r} is retired: it takes no new "
            "checkouts (its open checkouts, refunds and callbacks go on). Choose an open account."
        )
    return installation


def _set_retired(account: str, retired: bool) -> Installation:
    state = get_state()
    installation = state.require_installation(account)
    if installation.retired != retired:
        now = utcnow()
        installation.retired_at = now if retired else None
        installation.updated_at = now
    # Keeping what the session holds loaded: the checkouts the shop was handed before stay readable.
    commit_keeping_loaded(state.session)
    return installation


@leaves_no_transaction
def retire_account(account: str) -> Installation:
    """Close ``account`` for new checkouts. Its open checkouts, refunds and callbacks go on, with its keys,
    until they are settled (:func:`open_checkouts` says how many are left). Retiring one already retired
    changes nothing; ``UnknownAccountError`` for an account not installed."""
    return _set_retired(account, True)


@leaves_no_transaction
def reopen_account(account: str) -> Installation:
    """Take new checkouts on a retired ``account`` again."""
    return _set_retired(account, False)


@leaves_no_transaction
def open_checkouts(account: str) -> int:
    """How many of ``account``'s checkouts are still open (not paid, cancelled or expired yet)."""
    return (
        get_state().session.scalar(
            select(func.count(GatewayCheckout.id)).where(
                GatewayCheckout.merchant_account_id == account,
                GatewayCheckout.status.in_([*OPEN_STATUSES, LocalStatus.CREATING]),
            )
        )
        or 0
    )
